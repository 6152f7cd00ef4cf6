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

import argparse
import contextlib
import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Iterable, Iterator

import torch

import tpu_interactive
from tpu_interactive.backend.stats import STATS

TPU = torch.device("tpu", 0)
OUTCOMES = ("pass", "fallback", "fail", "error", "skip")
# the worst sample decides the (op, dtype) outcome
_SEVERITY = {"skip": 0, "pass": 1, "fallback": 2, "error": 3, "fail": 4}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
MAX_NUMEL = 1_000_000
DEFAULT_TIMEOUT_S = 60.0

# (rtol, atol) per dtype. XLA's float32 transcendentals and reduction orders differ from ATen's by a
# few ulps, so float32 is a little looser than assert_close's default; integers/bools are exact.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
    torch.complex64: (1e-4, 1e-5),
}
GRAD_TOLERANCES = {torch.float32: (1e-4, 1e-4)}
# Ops whose float32 accuracy is normwise, not elementwise: the matrix exponential (scaling and
# squaring) is accurate to a few ulps of its largest entry, so a small entry next to a huge one
# differs between two correct algorithms (ATen's Taylor vs XLA's Pade) by far more than 1e-5 of
# itself. Their float32 atol is this factor times the largest |CPU value|.
NORMWISE_ATOL = {"matrix_exp": 1e-5}


def _tolerances(key: str, expected: Any) -> dict:
    factor = NORMWISE_ATOL.get(key)
    if factor is None or not isinstance(expected, torch.Tensor) or expected.numel() == 0:
        return TOLERANCES
    rtol, atol = TOLERANCES[torch.float32]
    scale = float(expected.detach().abs().nan_to_num(0, 0, 0).max())
    return {**TOLERANCES, torch.float32: (rtol, max(atol, factor * scale))}

# Ops whose outputs are random or uninitialised memory: only shapes/dtypes are compared.
NONDETERMINISTIC = {
    "bernoulli": "random",
    "multinomial": "random",
    "normal": "random",
    "normal.number_mean": "random",
    "normal.in_place": "random",
    "uniform": "random",
    "rand_like": "random",
    "randn_like": "random",
    "randint_like": "random",
    "randint": "random",
    "randn": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.rrelu": "random (training-mode slopes)",
    # the pooling regions come from torch.rand on the input's device inside F.fractional_max_pool*d
    "nn.functional.fractional_max_pool2d": "random (pooling regions drawn inside the op)",
    "nn.functional.fractional_max_pool3d": "random (pooling regions drawn inside the op)",
    "svd_lowrank": "random (random projection)",
    "pca_lowrank": "random (random projection)",
    "empty": "uninitialised memory",
    "empty_like": "uninitialised memory",
    "empty_strided": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
    "new_empty": "uninitialised memory",
    "new_empty_strided": "uninitialised memory",
}

# Samples that are random although the op is not (dropout inside the op): shapes/dtypes only.
def _mha_dropout(sample) -> bool:
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias,
    #     bias_k, bias_v, add_zero_attn, dropout_p, ..., training=True): dropout only when training
    dropout_p = sample.kwargs.get("dropout_p", sample.args[9] if len(sample.args) > 9 else 0.0)
    training = sample.kwargs.get("training", sample.args[12] if len(sample.args) > 12 else True)
    return bool(dropout_p) and bool(training)


_RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: bool(s.kwargs.get("dropout_p", 0.0)),
    "nn.functional.multi_head_attention_forward": _mha_dropout,
}


def _random_sample(key: str, sample) -> bool:
    test = _RANDOM_SAMPLES.get(key)
    return bool(test and test(sample))


# Ops returning indices of equal elements (ties) in an unspecified order: an index output that differs
# from CPU's still passes if it selects the same values. op -> (position of `dim` in args, default dim).
INDEX_TIES = {
    "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1),
    "mode": (0, -1), "median": (0, None), "nanmedian": (0, None), "max.reduction_with_dim": (0, None),
    "min.reduction_with_dim": (0, None), "argmax": (0, None), "argmin": (0, None),
}

# Ops not run at all: CPU-specific / layout-specific / not meaningful on a device.
EXCLUDED = {
    "to_sparse": "sparse layouts are not supported on tpu (dense device only)",
    "sparse.sampled_addmm": "sparse layouts are not supported on tpu",
    "sparse.mm.reduce": "sparse layouts are not supported on tpu",
    "nn.functional.ctc_loss": "CPU/CUDA-specific kernel with no device-generic semantics to compare",
    "_segment_reduce.lengths": "experimental CPU/CUDA-only op",
    "_segment_reduce.offsets": "experimental CPU/CUDA-only op",
}
# any OpInfo whose name starts with one of these is excluded with the given reason
EXCLUDED_PREFIXES = {
    "jiterator_": "CUDA-only jiterator kernels",
    "sparse.": "sparse layouts are not supported on tpu",
    "_refs.": "python references, not ops",
}

# The fixed CI subset: representative ops of every family (elementwise, reductions, matmul, conv,
# norms, softmax, losses, indexing, shape ops). Chosen to run in a few minutes on 2 CPU cores.
CI_SUBSET = (
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "neg", "abs", "exp", "log",
    "sqrt", "sin", "tanh", "sigmoid", "pow", "maximum", "minimum", "clamp", "where", "eq",
    "lt", "logical_and", "bitwise_and", "remainder", "floor", "sign", "erf", "isnan", "nan_to_num",
    "addcmul",
    # reductions
    "sum", "mean", "amax", "argmax", "max.reduction_with_dim", "prod", "var", "std", "cumsum",
    "logsumexp", "all", "any",
    # linalg / matmul / conv / attention
    "mm", "bmm", "matmul", "addmm", "linalg.vector_norm", "nn.functional.linear",
    "nn.functional.conv2d", "nn.functional.conv1d", "nn.functional.scaled_dot_product_attention",
    # norms / activations / softmax
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "softmax", "log_softmax",
    "nn.functional.embedding",
    # losses
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.l1_loss",
    # indexing
    "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "masked_fill",
    "take_along_dim", "__getitem__", "nonzero", "masked_select",
    # shape ops
    "cat", "stack", "reshape", "view", "permute", "transpose", "expand", "squeeze", "unsqueeze",
    "flatten", "split", "flip", "roll", "repeat", "t", "contiguous", "tril",
    "zeros_like", "arange", "sort", "topk",
)


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
def _time_limit(seconds: float | None) -> Iterator[None]:
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


# ---------------------------------------------------------------- moving samples to tpu
def _to_tpu_tensor(t: torch.Tensor, keep_grad: bool, memo: dict) -> torch.Tensor:
    """A tpu copy with the same geometry and storage: a non-contiguous input stays a non-contiguous
    view, a view into a larger storage keeps that storage (as_strided samples read outside it), and
    tensors sharing a CPU storage share one tpu storage (out= aliasing an input stays aliasing)."""
    d = t.detach()
    if d.layout != torch.strided:
        raise NotImplementedError(f"{d.layout} sample inputs are not supported on tpu")
    nbytes = d.untyped_storage().nbytes()
    key = ("storage", d.untyped_storage().data_ptr(), nbytes, d.dtype)
    whole = d.storage_offset() == 0 and nbytes == d.numel() * d.element_size()
    needed = d.element_size() * (d.storage_offset() + sum((n - 1) * st for n, st in zip(d.shape, d.stride())) + 1)
    if d.numel() == 0:
        out = d.to(TPU)
    elif nbytes < needed:  # a sample a failed CPU call left resized without storage: unreadable
        out = torch.zeros(d.shape, dtype=d.dtype, device=TPU)
    elif key in memo:
        out = memo[key].as_strided(d.shape, d.stride(), d.storage_offset()).detach()
    elif whole and d.is_contiguous():
        out = memo[key] = d.to(TPU)
    else:
        memo[key] = d.as_strided((nbytes // d.element_size(),), (1,), 0).to(TPU)
        out = memo[key].as_strided(d.shape, d.stride(), d.storage_offset()).detach()
    if keep_grad and t.requires_grad:
        out.requires_grad_(True)
    return out


def to_tpu(value: Any, keep_grad: bool = False, memo: dict | None = None) -> Any:
    """Deep copy of a sample's input/args/kwargs with every tensor on tpu (aliasing preserved)."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":  # e.g. a meta tensor in an error input: the wrong device on purpose
            return value
        if id(value) not in memo:
            memo[id(value)] = _to_tpu_tensor(value, keep_grad, memo)
        return memo[id(value)]
    if isinstance(value, torch.device) and value.type == "cpu":
        return TPU
    if isinstance(value, str) and value == "cpu":
        return "tpu"
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_tpu(v, keep_grad, memo) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_tpu(v, keep_grad, memo) for v in value)
    if isinstance(value, dict):
        return {k: to_tpu(v, keep_grad, memo) for k, v in value.items()}
    return value


# Tensor arguments that torch requires on CPU whatever the device (host-side metadata), by position
# in sample.args: op -> positions. They stay on CPU on the tpu side too.
CPU_ARGS = {
    "tensor_split": (0,),  # tensor_indices_or_sections: "expected ... to be on cpu" (CUDA too)
}


def sample_to_tpu(key: str, sample, keep_grad: bool = False) -> tuple[Any, tuple, dict]:
    """The sample's (input, args, kwargs) on tpu, except the arguments CPU_ARGS keeps on CPU."""
    memo: dict = {}
    keep = CPU_ARGS.get(key, ())
    inp = to_tpu(sample.input, keep_grad, memo)
    args = tuple(a if i in keep else to_tpu(a, keep_grad, memo) for i, a in enumerate(sample.args))
    return inp, args, to_tpu(sample.kwargs, keep_grad, memo)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def sample_numel(sample) -> int:
    return sum(t.numel() for t in _tensors([sample.input, sample.args, sample.kwargs]))


# ---------------------------------------------------------------- comparing results
class Mismatch(AssertionError):
    pass


def compare(actual: Any, expected: Any, *, tolerances=TOLERANCES, shapes_only: bool = False,
            where: str = "output", on_tpu: bool = True) -> None:
    """Raise Mismatch if tpu's ``actual`` differs from CPU's ``expected`` (``on_tpu=False``: the call
    named no tpu tensor or device, e.g. ``arange(2)``, so a CPU result is right)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{where}: expected a tensor, got {type(actual).__name__}")
        if on_tpu and actual.device.type != "tpu" and expected.device.type == "cpu":
            raise Mismatch(f"{where}: result is on {actual.device}, expected tpu")
        if tuple(actual.shape) != tuple(expected.shape):
            raise Mismatch(f"{where}: shape {tuple(actual.shape)} != CPU {tuple(expected.shape)}")
        if actual.dtype != expected.dtype:
            raise Mismatch(f"{where}: dtype {actual.dtype} != CPU {expected.dtype}")
        if shapes_only:
            return
        got = actual.detach().cpu()
        want = expected.detach()
        if want.is_complex() or want.is_floating_point():
            rtol, atol = tolerances.get(want.dtype, (1e-5, 1e-5))
        else:
            rtol, atol = 0, 0
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, check_device=False,
                                       check_stride=False, check_layout=False)
        except AssertionError as exc:
            raise Mismatch(f"{where}: {_short(str(exc))}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {_kind(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, tolerances=tolerances, shapes_only=shapes_only, where=f"{where}[{i}]", on_tpu=on_tpu)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise Mismatch(f"{where}: dict keys differ")
        for k in expected:
            compare(actual[k], expected[k], tolerances=tolerances, shapes_only=shapes_only, where=f"{where}[{k!r}]",
                    on_tpu=on_tpu)
        return
    if shapes_only:
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if not (math.isclose(actual, expected, rel_tol=1e-5, abs_tol=1e-6) or (actual != actual and expected != expected)):
            raise Mismatch(f"{where}: {actual!r} != CPU {expected!r}")
        return
    if actual != expected:
        raise Mismatch(f"{where}: {actual!r} != CPU {expected!r}")


def _kind(value) -> str:
    return f"{type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


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


def _reference(opinfo, sample):
    dtype = sample.input.dtype if isinstance(sample.input, torch.Tensor) else None
    if (op_key(opinfo), dtype) not in FLOAT32_REFERENCE:
        return _call(opinfo, sample)
    up = lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v  # noqa: E731
    out = opinfo(up(sample.input), *map(up, sample.args), **{k: up(v) for k, v in sample.kwargs.items()})
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
            return "fail", f"CPU raised {_first_line(cpu_exc)} but tpu returned a result", fallbacks
        if not isinstance(tpu_exc, type(cpu_exc)):
            return "error", f"CPU raised {type(cpu_exc).__name__}, tpu raised {_first_line(tpu_exc)}", fallbacks
        return ("fallback" if fallbacks else "pass"), "", fallbacks
    if tpu_exc is not None:
        return "error", _first_line(tpu_exc), fallbacks
    try:
        compare(_align_signs(op_key(opinfo), actual, expected), expected, shapes_only=shapes_only,
                tolerances=_tolerances(op_key(opinfo), expected), on_tpu=_names_tpu([inp, args, kwargs]))
    except Mismatch as exc:
        if not _equivalent_ties(op_key(opinfo), sample, actual, expected):
            return "fail", str(exc), fallbacks
    except Exception as exc:  # noqa: BLE001 - reading the tpu result back failed
        return "error", f"reading the result: {_first_line(exc)}", fallbacks
    return ("fallback" if fallbacks else "pass"), "", fallbacks


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
    got = [t.detach().cpu() for t in _tensors(actual)]
    want = list(_tensors(expected))
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
    return [t for t in _tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _grad_inputs(values: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(values) if t.requires_grad]


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
        return "skip", f"CPU backward raised {_first_line(exc)}", {}
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
        return "error", _first_line(exc), watch.ops
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
        return "error", f"reading the gradient: {_first_line(exc)}", watch.ops
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
            result.detail = f"sample_inputs raised {_first_line(exc)}"
            return result
        taken = 0
        while max_samples is None or taken < max_samples:
            try:
                with _time_limit(timeout_s):
                    sample = next(samples, None)
            except Exception as exc:  # noqa: BLE001
                result.detail = result.detail or f"sample generation raised {_first_line(exc)}"
                break
            if sample is None:
                break
            if sample_numel(sample) > MAX_NUMEL:
                counts["skip"] = counts.get("skip", 0) + 1
                continue
            taken += 1
            try:
                with _time_limit(timeout_s):
                    loose = shapes_only or _random_sample(key, sample)
                    outcome, detail, fallbacks = (_grad_sample(opinfo, sample, loose) if grad
                                                  else _forward_sample(opinfo, sample, loose))
            except SampleTimeout as exc:
                outcome, detail, fallbacks = "error", f"timeout: {exc}", {}
            except Exception as exc:  # noqa: BLE001 - the harness itself must never stop a sweep
                outcome, detail, fallbacks = "error", f"harness: {_first_line(exc)}", {}
            counts[outcome] = counts.get(outcome, 0) + 1
            for name, n in fallbacks.items():
                result.fallback_ops[name] = result.fallback_ops.get(name, 0) + n
            if outcome != "skip":
                result.samples += 1
            if _SEVERITY[outcome] > _SEVERITY[result.outcome]:
                result.outcome, result.detail = outcome, detail
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


# ---------------------------------------------------------------- CLI
def _select_ops(args) -> list:
    if args.ops:
        return find_ops([o.strip() for o in args.ops.split(",") if o.strip()])
    if args.subset == "ci":
        return find_ops(CI_SUBSET)
    return find_ops()


def _child(args) -> int:
    """Run the given ops, one JSON line per result (used by the crash-isolating parent)."""
    ops = _select_ops(args)
    with open(args.jsonl, "a") as sink:
        for opinfo in ops:
            sink.write(json.dumps({"start": op_key(opinfo)}) + "\n")
            sink.flush()
            for r in run([opinfo], args.dtypes.split(","), grad=args.grad, max_samples=args.max_samples,
                         timeout_s=args.timeout, forward=not args.grad_only):
                sink.write(json.dumps(r.to_json()) + "\n")
                sink.flush()
            sink.write(json.dumps({"done": op_key(opinfo)}) + "\n")
            sink.flush()
    return 0


def _isolated(args, keys: list[str]) -> list[Result]:
    """Run in child processes; an op that crashes the interpreter is recorded as an error."""
    jsonl = args.json + ".partial.jsonl"
    open(jsonl, "w").close()
    remaining = list(keys)
    while remaining:
        cmd = [sys.executable, "-m", "tpu_interactive.conformance", "--child", "--jsonl", jsonl,
               "--ops", ",".join(remaining), "--dtypes", args.dtypes, "--max-samples", str(args.max_samples or 0),
               "--timeout", str(args.timeout)] + (["--grad"] if args.grad else []) + \
              (["--grad-only"] if args.grad_only else [])
        proc = subprocess.run(cmd)
        done, started = set(), None
        with open(jsonl) as f:
            for line in f:
                row = json.loads(line)
                if "start" in row:
                    started = row["start"]
                elif "done" in row:
                    done.add(row["done"])
        remaining = [k for k in remaining if k not in done]
        if proc.returncode != 0 and remaining:
            crashed = started if started in remaining else remaining[0]
            with open(jsonl, "a") as f:
                f.write(json.dumps(Result(crashed, "float32", "forward", "error",
                                          detail=f"interpreter crashed (exit {proc.returncode})").to_json()) + "\n")
                f.write(json.dumps({"done": crashed}) + "\n")
            remaining.remove(crashed)
        elif proc.returncode == 0:
            break
    return _read_jsonl(jsonl)


def _read_jsonl(path: str) -> list[Result]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Result(**row) for row in rows if "outcome" in row]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_interactive.conformance", description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="print the human-readable table")
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    parser.add_argument("--dtypes", default="float32,bfloat16,int64,bool")
    parser.add_argument("--json", default="conformance_report.json")
    parser.add_argument("--subset", choices=("ci", "full"), default=None,
                        help="ops to run when --ops is not given (default: ci; full with --errors)")
    parser.add_argument("--errors", action="store_true",
                        help="check OpInfo error_inputs and out= misuse instead of values (conformance_errors)")
    parser.add_argument("--grad", action="store_true", help="also compare float32 gradients")
    parser.add_argument("--grad-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-samples", type=int, default=5, help="samples per op and dtype (0 = all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per sample")
    parser.add_argument("--isolate", action="store_true",
                        help="run in child processes so an interpreter crash only loses one op")
    parser.add_argument("--from-jsonl", help="summarize the results of an earlier (possibly unfinished) "
                        "--isolate run from its .partial.jsonl file instead of running anything")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jsonl", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.max_samples = args.max_samples or None
    args.subset = args.subset or ("full" if args.errors else "ci")
    if args.child:
        return _child(args)
    if args.errors:
        return _errors_main(args)
    start = time.perf_counter()
    if args.from_jsonl:
        results = _read_jsonl(args.from_jsonl)
    elif args.isolate:
        results = _isolated(args, [op_key(o) for o in _select_ops(args)])
    else:
        results = list(run(_select_ops(args), args.dtypes.split(","), grad=args.grad, max_samples=args.max_samples,
                           timeout_s=args.timeout, forward=not args.grad_only))
    wall = time.perf_counter() - start
    summary = summarize(results)
    summary["wall_seconds"] = round(wall, 1)
    summary["config"] = {"subset": None if args.ops else args.subset, "dtypes": args.dtypes,
                         "max_samples": args.max_samples, "grad": args.grad, "torch": torch.__version__}
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "results": [r.to_json() for r in results]}, f, indent=1)
    if args.report:
        print(format_table(results, summary))
    print(f"\n{len(results)} results in {wall:.0f}s; JSON written to {args.json}")
    return 0


def _errors_main(args) -> int:
    from tpu_interactive import conformance_errors as E

    results, wall = E.run_all(_select_ops(args))
    summary = E.summarize(results)
    summary["wall_seconds"] = round(wall, 1)
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "results": [r.to_json() for r in results]}, f, indent=1)
    print(E.format_report(summary))
    print(f"\n{len(results)} error cases in {wall:.0f}s; JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
