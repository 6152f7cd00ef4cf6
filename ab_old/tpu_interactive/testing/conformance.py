"""Differential conformance of the `tpu` device against PyTorch's OpInfo suite.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db`` and every tested
dtype the OpInfo supports on CPU, the same sample inputs run on CPU and on tpu and the results are
compared (values, shapes, dtypes; NaN == NaN). Each (op, dtype) gets one outcome:

- ``pass``      every sample agreed and no aten op took the CPU fallback;
- ``fallback``  every sample agreed, but at least one aten op ran via the CPU fallback;
- ``fail``      a silent wrong result: wrong values, shape, dtype or device (a bug);
- ``error``     tpu raised where CPU succeeded (or raised a different exception type);
- ``skip``      no usable sample (all too large, or the OpInfo has none for this dtype).

When CPU raises for a sample, tpu must raise the same exception type (counted as agreement).
Random / uninitialised-memory ops are tagged ``nondeterministic``: only shapes and dtypes are compared.
Gradients (``grad=True``) are checked in float32: the same random cotangent is back-propagated on
both devices and every input's ``.grad`` is compared.

    python -m tpu_interactive.conformance --report [--ops add,mul] [--dtypes float32,int64]
           [--json conformance_report.json] [--subset ci|full] [--grad] [--max-samples 5]
    python -m tpu_interactive.conformance --errors [--ops ...]     # error_inputs / out= misuse
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
import warnings
from typing import Any, Iterable, Iterator

import torch

import tpu_interactive.backend  # noqa: F401  (registers the tpu device)
from tpu_interactive.backend.stats import STATS

from .compare import (GRAD_TOLERANCES, Mismatch, at_least_as_accurate, compare, first_line, sample_numel,
                      sample_to_tpu, tensors_in, tolerances_for, with_cuda_dtypes)
from .tables import EXCLUDED, EXCLUDED_PREFIXES, INDEX_TIES, NONDETERMINISTIC, random_sample

OUTCOMES = ("pass", "fallback", "fail", "error", "skip")
# the worst sample decides the (op, dtype) outcome
_SEVERITY = {"skip": 0, "pass": 1, "fallback": 2, "error": 3, "fail": 4}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
MAX_NUMEL = 1_000_000
DEFAULT_TIMEOUT_S = 60.0


# ---------------------------------------------------------------- results
@dataclasses.dataclass
class Result:
    op: str
    dtype: str
    kind: str  # "forward" | "grad"
    outcome: str
    samples: int = 0
    sample_outcomes: dict = dataclasses.field(default_factory=dict)
    fallback_ops: dict = dataclasses.field(default_factory=dict)
    detail: str = ""
    repro: str = ""
    tags: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """SIGALRM guard (main thread only; elsewhere the sample runs unguarded)."""
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SampleTimeout(f"sample exceeded {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- op_db access
_OP_DB: list | None = None


def op_db() -> list:
    global _OP_DB
    if _OP_DB is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db as db
        _OP_DB = list(db)
    return _OP_DB


def op_key(opinfo) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def find_ops(names: Iterable[str] | None = None) -> list:
    by_key = {op_key(o): o for o in op_db()}
    if names is None:
        return list(by_key.values())
    missing = [n for n in names if n not in by_key]
    if missing:
        raise KeyError(f"no OpInfo named {missing}")
    return [by_key[n] for n in names]


def exclusion_reason(key: str) -> str | None:
    if key in EXCLUDED:
        return EXCLUDED[key]
    for prefix, reason in EXCLUDED_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    return None


def tested_dtypes(opinfo, wanted: Iterable[str] = DTYPES) -> list[str]:
    supported = opinfo.supported_dtypes("cpu")
    return [name for name in wanted if DTYPES[name] in supported]


def supports_grad(opinfo) -> bool:
    return bool(opinfo.supports_autograd) and torch.float32 in opinfo.supported_backward_dtypes("cpu")


# ---------------------------------------------------------------- running samples
def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        extra = "" if value.is_contiguous() else f", stride={tuple(value.stride())}"
        return f"T({list(value.shape)}, {str(value.dtype).replace('torch.', '')}{extra})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe_value(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_describe_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def repro_line(opinfo, sample) -> str:
    """A one-line description of the failing call (shapes, dtypes, non-tensor arguments)."""
    args = ", ".join([_describe_value(sample.input)] + [_describe_value(a) for a in sample.args]
                     + [f"{k}={_describe_value(v)}" for k, v in sample.kwargs.items()])
    return f"{op_key(opinfo)}({args})"


class _FallbackWatch:
    """Which aten ops took the CPU fallback inside the block (fallback_counts delta)."""

    def __enter__(self):
        self.before = dict(STATS.fallback_counts)
        self.ops: dict[str, int] = {}
        return self

    def __exit__(self, *exc):
        after = STATS.fallback_counts
        self.ops = {k: v - self.before.get(k, 0) for k, v in after.items() if v - self.before.get(k, 0)}
        return False


def _call(opinfo, sample):
    return opinfo(sample.input, *sample.args, **sample.kwargs)


# (op, dtype) pairs whose CPU kernel is itself wrong: the reference is the op on float32 copies of the
# inputs, rounded to the dtype (what a correct kernel computing in float32 returns).
FLOAT32_REFERENCE = {
    ("matrix_exp", torch.bfloat16): "CPU's bfloat16 matrix_exp returns inf/NaN even for small-norm inputs",
}


def _call_upcast(opinfo, sample, dtype: torch.dtype, wider: torch.dtype):
    """The op on copies of the sample in which every ``dtype`` tensor is ``wider``."""
    up = lambda v: v.to(wider) if isinstance(v, torch.Tensor) and v.dtype == dtype else v  # noqa: E731
    return opinfo(up(sample.input), *map(up, sample.args), **{k: up(v) for k, v in sample.kwargs.items()})


def _reference(opinfo, sample):
    dtype = sample.input.dtype if isinstance(sample.input, torch.Tensor) else None
    if (op_key(opinfo), dtype) not in FLOAT32_REFERENCE:
        return _call(opinfo, sample)
    out = _call_upcast(opinfo, sample, dtype, torch.float32)
    return out.to(dtype) if isinstance(out, torch.Tensor) else out


def _names_tpu(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "tpu"
    if isinstance(value, torch.device) or (isinstance(value, str) and value == "tpu"):
        return str(value).startswith("tpu")
    if isinstance(value, (list, tuple)):
        return any(_names_tpu(v) for v in value)
    if isinstance(value, dict):
        return any(_names_tpu(v) for v in value.values())
    return False


def _forward_sample(opinfo, sample, shapes_only: bool) -> tuple[str, str, dict]:
    """(outcome, detail, fallback ops) of one forward sample."""
    torch.manual_seed(0)
    try:
        expected = _reference(opinfo, sample)
        cpu_exc = None
    except Exception as exc:  # noqa: BLE001 - CPU's own error is the expected behaviour
        expected, cpu_exc = None, exc
    inp, args, kwargs = sample_to_tpu(op_key(opinfo), sample)
    with _FallbackWatch() as watch:
        try:
            torch.manual_seed(0)
            actual = opinfo(inp, *args, **kwargs)
            tpu_exc = None
        except SampleTimeout:
            raise
        except Exception as exc:  # noqa: BLE001
            actual, tpu_exc = None, exc
    fallbacks = watch.ops
    if cpu_exc is not None:
        if tpu_exc is None:
            return "fail", f"CPU raised {first_line(cpu_exc)} but tpu returned a result", fallbacks
        if not isinstance(tpu_exc, type(cpu_exc)):
            return "error", f"CPU raised {type(cpu_exc).__name__}, tpu raised {first_line(tpu_exc)}", fallbacks
        return ("fallback" if fallbacks else "pass"), "", fallbacks
    if tpu_exc is not None:
        return "error", first_line(tpu_exc), fallbacks
    key = op_key(opinfo)
    actual = with_cuda_dtypes(key, actual, expected)
    try:
        compare(_align_signs(key, actual, expected), expected, shapes_only=shapes_only,
                tolerances=tolerances_for(key, expected), on_tpu=_names_tpu([inp, args, kwargs]))
    except Mismatch as exc:
        if _equivalent_ties(key, sample, actual, expected):
            pass
        elif not shapes_only and _accurate_where_cpu_differs(opinfo, sample, actual, expected):
            return ("fallback" if fallbacks else "pass"), ACCURACY_RULE, fallbacks
        else:
            return "fail", str(exc), fallbacks
    except Exception as exc:  # noqa: BLE001 - reading the tpu result back failed
        return "error", f"reading the result: {first_line(exc)}", fallbacks
    return ("fallback" if fallbacks else "pass"), "", fallbacks


# A sample's detail when it passed by compare.at_least_as_accurate (counted per op, see run_op)
ACCURACY_RULE = "closer to float64 than CPU"


def _accurate_where_cpu_differs(opinfo, sample, actual, expected) -> bool:
    """For reduced-precision and float32 samples: tpu differs from CPU, but is within tolerance of the
    float64 result or at least as close to it as CPU (see compare.at_least_as_accurate)."""
    dtype = sample.input.dtype if isinstance(sample.input, torch.Tensor) else None
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    try:
        torch.manual_seed(0)
        exact = _call_upcast(opinfo, sample, dtype, torch.float64)
    except Exception:  # noqa: BLE001 - no float64 reference: not provably accurate
        return False
    return at_least_as_accurate(actual, expected, exact)


# Ops whose vector outputs are unique only up to a per-vector sign (a unit phase if complex):
# op -> (output index of the vectors, [output index of the partner vectors flipped with them],
# whether the partner stores its vectors as rows (Vh) rather than columns (V)).
SIGN_AMBIGUOUS = {
    "linalg.eigh": (1, None, False),
    "linalg.svd": (0, 2, True),
    "svd": (0, 2, False),
}


def _align_signs(key: str, actual: Any, expected: Any) -> Any:
    """tpu's eigen/singular vectors with each column's sign (phase) chosen to match CPU's, applied
    jointly to U and V for an SVD; values are then compared as usual. The extra columns of a
    full_matrices SVD (a basis of the null space, any rotation of it is valid) are replaced by CPU's
    when they span the same subspace. Anything odd: unchanged (compared as-is)."""
    spec = SIGN_AMBIGUOUS.get(key)
    if spec is None or not isinstance(actual, (list, tuple)) or not isinstance(expected, (list, tuple)):
        return actual
    vec, partner, rows = spec
    try:
        got, want = actual[vec].detach().cpu(), expected[vec].detach()
        if got.shape != want.shape or got.numel() == 0 or got.dtype != want.dtype:
            return actual
        n = got.shape[-1] if partner is None else expected[partner].shape[-1 if rows else -2]
        k = min(got.shape[-2], got.shape[-1], n)  # vectors paired with a value
        inner = (want[..., :k].conj() * got[..., :k]).sum(-2)
        phase = torch.where(inner.abs() > 0, inner / inner.abs(), torch.ones_like(inner)).conj()
        fixed = list(actual)
        fixed[vec] = _fix_columns(got, want, phase, k).to(actual[vec].device)
        if partner is not None and expected[partner].numel():
            # U c and V c (i.e. Vh's rows times conj(c)) leave U S V^H unchanged
            other, ref = actual[partner].detach().cpu(), expected[partner].detach()
            if rows:
                other, ref = other.mT, ref.mT
            cols = _fix_columns(other, ref, phase.conj() if rows else phase, k)
            fixed[partner] = (cols.mT if rows else cols).to(actual[partner].device)
        return type(actual)(fixed) if not hasattr(actual, "_fields") else type(actual)(*fixed)
    except Exception:  # noqa: BLE001 - not provably equivalent: compare as-is
        return actual


def _fix_columns(got: torch.Tensor, want: torch.Tensor, phase: torch.Tensor, k: int) -> torch.Tensor:
    """got's first k columns times ``phase``; its other columns CPU's if they span the same space."""
    head = got[..., :k] * phase.unsqueeze(-2)
    tail, ref = got[..., k:], want[..., k:]
    if tail.shape[-1] and torch.allclose(tail @ tail.mH, ref @ ref.mH, rtol=1e-4, atol=1e-4):
        tail = ref
    return torch.cat([head, tail], -1)


def _equivalent_ties(key: str, sample, actual, expected) -> bool:
    """True if tpu's index output (the last output) differs from CPU's only by the order of ties."""
    if key not in INDEX_TIES or not isinstance(sample.input, torch.Tensor):
        return False
    pos, default = INDEX_TIES[key]
    dim = sample.kwargs.get("dim", sample.args[pos] if pos is not None and len(sample.args) > pos else default)
    got = [t.detach().cpu() for t in tensors_in(actual)]
    want = list(tensors_in(expected))
    if len(got) != len(want) or any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got, want)):
        return False
    x = sample.input.detach()
    try:
        for n, (g, w) in enumerate(zip(got, want)):
            if n < len(got) - 1:  # a values output must match exactly (up to NaN)
                torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
                continue
            if dim is None:  # an index into the flattened input
                picked_g, picked_w = x.reshape(-1)[g.reshape(-1)], x.reshape(-1)[w.reshape(-1)]
            else:
                src = x if x.dim() else x.reshape(1)
                gi, wi = (g, w) if g.dim() == src.dim() else (g.unsqueeze(dim), w.unsqueeze(dim))
                picked_g, picked_w = src.gather(dim, gi.reshape(gi.shape or (1,))), src.gather(dim, wi.reshape(wi.shape or (1,)))
            torch.testing.assert_close(picked_g, picked_w, rtol=0, atol=0, equal_nan=True)
    except Exception:  # noqa: BLE001 - anything odd: not provably equivalent
        return False
    return True


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _grad_inputs(values: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(values) if t.requires_grad]


def _backward(opinfo, sample_input, args, kwargs, process, cotangent_seed: int, cotangents=None):
    out = process(opinfo(sample_input, *args, **kwargs))
    outputs = _grad_outputs(out)
    leaves = _grad_inputs([sample_input, args, kwargs])
    if not outputs or not leaves:
        return None, None, None
    if cotangents is None:
        gen = torch.Generator().manual_seed(cotangent_seed)
        cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outputs]
    device_cot = [c.to(o.device) for c, o in zip(cotangents, outputs)]
    grads = torch.autograd.grad(outputs, leaves, device_cot, allow_unused=True)
    return grads, cotangents, len(leaves)


def _grad_sample(opinfo, sample, shapes_only: bool = False) -> tuple[str, str, dict]:
    process = sample.output_process_fn_grad or (lambda x: x)
    torch.manual_seed(0)
    try:
        expected, cotangents, _ = _backward(opinfo, sample.input, sample.args, sample.kwargs, process, 1234)
    except Exception as exc:  # noqa: BLE001
        return "skip", f"CPU backward raised {first_line(exc)}", {}
    if expected is None:
        return "skip", "no differentiable output/input", {}
    inp, args, kwargs = sample_to_tpu(op_key(opinfo), sample, keep_grad=True)
    with _FallbackWatch() as watch:
        try:
            torch.manual_seed(0)
            actual, _, _ = _backward(opinfo, inp, args, kwargs, process, 1234, cotangents)
            exc = None
        except SampleTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            actual, exc = None, e
    if exc is not None:
        return "error", first_line(exc), watch.ops
    if actual is None:
        return "fail", "tpu forward has no differentiable output (CPU has one)", watch.ops
    try:
        for i, (a, e) in enumerate(zip(actual, expected)):
            if (a is None) != (e is None):
                # an unused input: tpu None where CPU has zeros (or vice versa) is equivalent only if zero
                value = a if e is None else e
                if not bool((value.detach().cpu() == 0).all()):
                    raise Mismatch(f"grad[{i}]: {'None' if a is None else 'tensor'} vs CPU "
                                   f"{'None' if e is None else 'tensor'}")
                continue
            if a is not None:
                compare(a, e, tolerances=GRAD_TOLERANCES, shapes_only=shapes_only, where=f"grad[{i}]")
    except Mismatch as mismatch:
        return "fail", str(mismatch), watch.ops
    except Exception as exc:  # noqa: BLE001 - reading the tpu gradient back failed
        return "error", f"reading the gradient: {first_line(exc)}", watch.ops
    return ("fallback" if watch.ops else "pass"), "", watch.ops


def run_op(opinfo, dtype: str = "float32", *, grad: bool = False, max_samples: int | None = 5,
           timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Result:
    """Run the OpInfo's CPU samples for one dtype on CPU and tpu; the worst sample is the outcome."""
    key = op_key(opinfo)
    kind = "grad" if grad else "forward"
    start = time.perf_counter()
    result = Result(key, dtype, kind, "skip")
    reason = exclusion_reason(key)
    if reason:
        result.detail, result.tags = f"excluded: {reason}", ["excluded"]
        return result
    shapes_only = key in NONDETERMINISTIC
    if shapes_only:
        result.tags.append("nondeterministic")
    if grad and not supports_grad(opinfo):
        result.detail = "no autograd support"
        return result
    torch_dtype = DTYPES[dtype]
    counts: dict[str, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            samples = opinfo.sample_inputs("cpu", torch_dtype, requires_grad=grad)
            samples = iter(samples)
        except Exception as exc:  # noqa: BLE001
            result.detail = f"sample_inputs raised {first_line(exc)}"
            return result
        taken = 0
        while max_samples is None or taken < max_samples:
            try:
                with time_limit(timeout_s):
                    sample = next(samples, None)
            except Exception as exc:  # noqa: BLE001
                result.detail = result.detail or f"sample generation raised {first_line(exc)}"
                break
            if sample is None:
                break
            if sample_numel(sample) > MAX_NUMEL:
                counts["skip"] = counts.get("skip", 0) + 1
                continue
            taken += 1
            try:
                with time_limit(timeout_s):
                    loose = shapes_only or random_sample(key, sample)
                    outcome, detail, fallbacks = (_grad_sample(opinfo, sample, loose) if grad
                                                  else _forward_sample(opinfo, sample, loose))
            except SampleTimeout as exc:
                outcome, detail, fallbacks = "error", f"timeout: {exc}", {}
            except Exception as exc:  # noqa: BLE001 - the harness itself must never stop a sweep
                outcome, detail, fallbacks = "error", f"harness: {first_line(exc)}", {}
            counts[outcome] = counts.get(outcome, 0) + 1
            if detail == ACCURACY_RULE:  # visible in the report: passed against float64, not CPU
                counts[ACCURACY_RULE] = counts.get(ACCURACY_RULE, 0) + 1
            for name, n in fallbacks.items():
                result.fallback_ops[name] = result.fallback_ops.get(name, 0) + n
            if outcome != "skip":
                result.samples += 1
            if _SEVERITY[outcome] > _SEVERITY[result.outcome]:
                result.outcome, result.detail = outcome, ("" if detail == ACCURACY_RULE else detail)
                result.repro = repro_line(opinfo, sample) if outcome in ("fail", "error") else ""
    result.sample_outcomes = counts
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def run(ops: Iterable, dtypes: Iterable[str] = ("float32",), *, grad: bool = False, max_samples: int | None = 5,
        timeout_s: float | None = DEFAULT_TIMEOUT_S, forward: bool = True) -> Iterator[Result]:
    """Results for every (op, dtype) in forward, then (float32) gradients if ``grad``."""
    dtypes = list(dtypes)
    for opinfo in ops:
        if forward:
            for dtype in tested_dtypes(opinfo, dtypes) or ["float32"]:
                if DTYPES[dtype] not in opinfo.supported_dtypes("cpu"):
                    yield Result(op_key(opinfo), dtype, "forward", "skip",
                                 detail="none of the tested dtypes is supported on CPU")
                    continue
                yield run_op(opinfo, dtype, max_samples=max_samples, timeout_s=timeout_s)
        if grad and "float32" in dtypes:
            yield run_op(opinfo, "float32", grad=True, max_samples=max_samples, timeout_s=timeout_s)


# ---------------------------------------------------------------- summaries
def summarize(results: list[Result]) -> dict:
    def pct(n, d):
        return round(100.0 * n / d, 1) if d else 0.0

    def tally(rows):
        counts = {o: 0 for o in OUTCOMES}
        for r in rows:
            counts[r.outcome] += 1
        tested = sum(counts[o] for o in OUTCOMES if o != "skip")
        return {"counts": counts, "tested": tested,
                "percent": {o: pct(counts[o], tested) for o in OUTCOMES if o != "skip"}}

    by_kind: dict = {}
    for kind in ("forward", "grad"):
        rows = [r for r in results if r.kind == kind]
        if not rows:
            continue
        entry = {"all_dtypes": tally(rows)}
        for dtype in DTYPES:
            sub = [r for r in rows if r.dtype == dtype]
            if sub:
                entry[dtype] = tally(sub)
        by_kind[kind] = entry
    fallback_ops: dict[str, int] = {}
    fallback_op_users: dict[str, int] = {}
    for r in results:
        for name, n in r.fallback_ops.items():
            fallback_ops[name] = fallback_ops.get(name, 0) + n
            fallback_op_users[name] = fallback_op_users.get(name, 0) + 1
    fails = [r for r in results if r.outcome == "fail"]
    errors = [r for r in results if r.outcome == "error"]
    return {
        "totals": by_kind,
        "opinfos": len({r.op for r in results}),
        "fallback_ops": dict(sorted(fallback_op_users.items(), key=lambda kv: -kv[1])),
        "fallback_calls": dict(sorted(fallback_ops.items(), key=lambda kv: -kv[1])),
        "silent_wrong_results": [{"op": r.op, "dtype": r.dtype, "kind": r.kind, "detail": r.detail,
                                  "repro": r.repro} for r in fails],
        "errors": [{"op": r.op, "dtype": r.dtype, "kind": r.kind, "detail": r.detail, "repro": r.repro}
                   for r in errors],
        "excluded": {r.op: r.detail for r in results if "excluded" in r.tags},
        "nondeterministic": sorted({r.op for r in results if "nondeterministic" in r.tags}),
    }


def format_table(results: list[Result], summary: dict) -> str:
    lines = []
    width = max([len(r.op) for r in results] + [10])
    header = f"{'op':<{width}}  {'dtype':<9} {'kind':<7} {'outcome':<8} {'n':>3}  detail"
    lines += [header, "-" * len(header)]
    for r in results:
        detail = r.detail or (", ".join(sorted(r.fallback_ops)) if r.fallback_ops else "")
        lines.append(f"{r.op:<{width}}  {r.dtype:<9} {r.kind:<7} {r.outcome:<8} {r.samples:>3}  {detail[:110]}")
    lines.append("")
    for kind, entry in summary["totals"].items():
        for scope, t in entry.items():
            c, p = t["counts"], t["percent"]
            lines.append(f"{kind:<7} {scope:<9} tested={t['tested']:<4} "
                         + "  ".join(f"{o}={c[o]} ({p[o]}%)" for o in OUTCOMES if o != "skip")
                         + f"  skip={c['skip']}")
    if summary["fallback_ops"]:
        top = list(summary["fallback_ops"].items())[:25]
        lines.append("\nmost common CPU-fallback aten ops (number of op/dtype entries using them):")
        lines.append("  " + ", ".join(f"{k} ({v})" for k, v in top))
    if summary["silent_wrong_results"]:
        lines.append("\nSILENT WRONG RESULTS (bugs):")
        for f in summary["silent_wrong_results"]:
            lines.append(f"  {f['op']} [{f['dtype']} {f['kind']}]: {f['detail'][:160]}")
            lines.append(f"      repro: {f['repro'][:200]}")
    return "\n".join(lines)
