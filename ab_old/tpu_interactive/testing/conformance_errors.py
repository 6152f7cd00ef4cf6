"""Error conformance: every error PyTorch's OpInfos promise must also be raised on tpu.

Three sources of promised errors, all built on CPU and moved to tpu as a user would:

- ``error_inputs``: each OpInfo ``ErrorInput`` (sample, error_type, error_regex). tpu must raise
  ``error_type`` (or a subclass) with a message matching ``error_regex``;
- ``out=`` misuse, as torch's ``test_ops.TestCommon.test_out`` checks it on a device: the first
  sample called with ``out=`` tensors of the right shape but dtype ``long`` where the result is
  floating/complex (``out.dtype``), and with ``out=`` tensors on the CPU (``out.device``). tpu
  must raise the exception type CPU (resp. CUDA) raises.
- shape mutations: the first float sample with one tensor argument's shape changed (a leading or
  trailing dim of 1 added, the last dim dropped or grown by one, the first shrunk by one). Where CPU
  refuses the changed sample, tpu must raise CPU's exception type and words; where CPU computes it,
  the case is ``n/a``. torch's Python meta kernels, which dispatch runs for output metadata, lack
  checks its C++ ones make: this found addmm's bias, conv's bias, sort's dim, the *_scatter ops' src,
  cross_entropy's targets and others accepted silently.

Each case gets one outcome: ``matched`` (type and message), ``message`` (right type, message does
not match), ``other-type`` (a different exception type), ``silent`` (no exception: a result where
PyTorch refuses to compute one), ``exempt`` (listed in EXEMPT with the reason) or ``n/a`` (CPU
itself does not raise the promised error, so the promise is not CPU/device-generic).

    python -m tpu_interactive.conformance --errors [--ops a,b] [--json errors.json]
"""
from __future__ import annotations

import dataclasses
import re
import time
import warnings
from typing import Any, Iterable, Iterator

import torch

from . import conformance as C
from .compare import TPU, first_line, sample_numel, sample_to_tpu

OUTCOMES = ("matched", "message", "other-type", "silent", "exempt", "n/a")
# cat-family ops raise TypeError for an unsafe out= cast (torch's test_out makes the same exception)
_OUT_TYPE_ERROR_OPS = {"_chunk_cat", "cat", "column_stack", "dstack", "hstack", "vstack", "stack"}

# THE exemption table: (op key, case label or "*") -> why the promised error cannot apply to a
# device whose memory is not CPU memory. Every entry is reported as ``exempt`` with this reason.
EXEMPT: dict[tuple[str, str], str] = {
    (op, f"shape: args[{i}] unsqueeze(0)"): "a [1, C] statistic: CPU's TensorAccessor refuses a 2-d one, an internal "
    "failure, not a check (F.batch_norm's own check is C elements); tpu takes its C elements, with CPU's values and "
    "the running stats updated in their shape (tests/test_sweep_regressions.py)"
    for op, args in (("native_batch_norm", (2, 3)), ("_native_batch_norm_legit", (2, 3)),
                     ("_batch_norm_with_update", (2, 3)), ("nn.functional.batch_norm", (0, 1)))
    for i in args
}


@dataclasses.dataclass
class ErrorResult:
    op: str
    case: str
    outcome: str
    expected: str = ""
    got: str = ""
    repro: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Case:
    label: str
    call: Any  # (device) -> a thunk calling the op on arguments built for "cpu" or "tpu"
    error_type: type | None  # None: CPU's exception type, whatever it is (a shape mutation's case)
    error_regex: str | None  # None: CPU's own message is the reference (first line, literally)
    repro: str


def _exemption(key: str, label: str) -> str | None:
    return EXEMPT.get((key, label)) or EXEMPT.get((key, "*"))


def _error_input_cases(opinfo) -> Iterator[_Case]:
    if opinfo.error_inputs_func is None:
        return
    key = C.op_key(opinfo)
    for i, err in enumerate(opinfo.error_inputs("cpu")):
        sample = err.sample_input

        def call(device, sample=sample):
            if device == "cpu":
                return lambda: opinfo(sample.input, *sample.args, **sample.kwargs)
            inp, args, kwargs = sample_to_tpu(key, sample)
            return lambda: opinfo(inp, *args, **kwargs)

        yield _Case(f"error_inputs[{i}]", call, err.error_type, err.error_regex, C.repro_line(opinfo, sample))


def _first_float_sample(opinfo):
    dtype = torch.float32 if torch.float32 in opinfo.supported_dtypes("cpu") else None
    if dtype is None:
        return None
    for sample in opinfo.sample_inputs("cpu", dtype):
        if sample_numel(sample) <= 100_000:
            return sample
    return None


def _out_expected_to_fail(opinfo) -> bool:
    """The OpInfo itself marks test_out as failing (or skipped) on every device: e.g. torch.lu is
    Python code that copy_()s into out=, which accepts any dtype/device, on CUDA too."""
    for d in opinfo.decorators:
        if getattr(d, "cls_name", None) == "TestCommon" and getattr(d, "test_name", None) == "test_out" \
                and getattr(d, "device_type", None) is None:
            return True
    return False


def _out_cases(opinfo) -> Iterator[_Case]:
    """test_out's error cases (unsafe out dtype, out on another device) for an op with out=."""
    if not opinfo.supports_out:
        return
    if _out_expected_to_fail(opinfo):
        yield _Case("out", None, RuntimeError, "", "OpInfo marks TestCommon.test_out as an expected failure")
        return
    sample = _first_float_sample(opinfo)
    if sample is None:
        return
    key = C.op_key(opinfo)
    try:
        expected = opinfo(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - no valid call to derive out= tensors from
        return
    outs = [expected] if isinstance(expected, torch.Tensor) else list(expected) \
        if isinstance(expected, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in expected) else None
    if not outs:
        return
    single = isinstance(expected, torch.Tensor)
    floating = [t.is_floating_point() or t.is_complex() for t in outs]
    factory_dtype = opinfo.is_factory_function and sample.kwargs.get("dtype") is None
    factory_device = opinfo.is_factory_function and sample.kwargs.get("device") is None
    repro = C.repro_line(opinfo, sample)

    def make_call(transform):
        def call(device):
            out = [transform(t, device) for t in outs]
            out = out[0] if single else tuple(out)
            if device == "cpu":
                return lambda: opinfo(sample.input, *sample.args, **sample.kwargs, out=out)
            inp, args, kwargs = sample_to_tpu(key, sample)
            return lambda: opinfo(inp, *args, **kwargs, out=out)
        return call

    if any(floating) and not factory_dtype:
        error = TypeError if opinfo.name in _OUT_TYPE_ERROR_OPS else RuntimeError
        yield _Case("out.dtype", make_call(lambda t, device: torch.zeros(t.shape, dtype=torch.long, device=
                                                                         "cpu" if device == "cpu" else TPU)),
                    error, None, repro + " out=long")
    if not factory_device:
        # a CPU out= for tpu inputs (on CPU itself there is no wrong device: no reference message)
        yield _Case("out.device", make_call(lambda t, device: torch.zeros(t.shape, dtype=t.dtype)),
                    RuntimeError, "", repro + " out=cpu")


# Ops whose CPU kernels trust a mutated sample's shapes: running one there corrupts CPU's heap
_MUTATION_UNSAFE = {"lu_unpack"}


def _mutations(t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    yield "unsqueeze(0)", t.unsqueeze(0)
    if t.dim() >= 1:
        yield "unsqueeze(-1)", t.unsqueeze(-1)
        if t.shape[-1] > 0:
            yield "last dim dropped", t.select(-1, 0).clone()
            yield "last dim + 1", torch.cat([t, t.narrow(-1, 0, 1)], -1)
    if t.dim() >= 2 and t.shape[0] > 1:
        yield "first dim - 1", t.narrow(0, 0, t.shape[0] - 1).clone()


def _shape_cases(opinfo) -> Iterator[_Case]:
    if opinfo.name in _MUTATION_UNSAFE:
        return
    sample = _first_float_sample(opinfo)
    if sample is None:
        return
    key = C.op_key(opinfo)
    slots = [("input", sample.input)] + [(f"args[{i}]", a) for i, a in enumerate(sample.args)]
    for slot, value in slots:
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            continue
        for how, changed in _mutations(value.detach()):
            mutated = sample.transform(lambda t, value=value, changed=changed: changed if t is value else t)

            def call(device, mutated=mutated):
                if device == "cpu":
                    return lambda: opinfo(mutated.input, *mutated.args, **mutated.kwargs)
                inp, args, kwargs = sample_to_tpu(key, mutated)
                return lambda: opinfo(inp, *args, **kwargs)

            yield _Case(f"shape: {slot} {how}", call, None, None, C.repro_line(opinfo, mutated))


def cases(opinfo) -> Iterator[_Case]:
    yield from _error_input_cases(opinfo)
    yield from _out_cases(opinfo)
    yield from _shape_cases(opinfo)


def _device_neutral(text: str) -> str:
    """PyTorch's words with the device's and the printer's own parts made alike: a tensor type as torch
    prints it for each device (CPU's "torch.FloatTensor{"/"CPUBFloat16Type{", tpu's "tpuFloatType{"), and a
    shape as its Python decompositions print it ("torch.Size([2, 3])") or its C++ kernels do ("[2, 3]")."""
    text = re.sub(r"torch\.(\w+)Tensor\{|CPU(\w+)Type\{|tpu(\w+)Type\{", lambda m: f"<{''.join(filter(None, m.groups()))}>{{",
                  text)
    return re.sub(r"torch\.Size\((\[[^\]]*\])\)", r"\1", text)


def _matches(exc: BaseException, error_type: type, regex: str | None, cpu_exc: BaseException | None) -> bool:
    if regex is None:  # CPU's message is the reference
        first = str(cpu_exc).strip().splitlines()[0] if cpu_exc is not None and str(cpu_exc).strip() else ""
        return _device_neutral(first) in _device_neutral(str(exc))
    return re.search(regex, str(exc)) is not None


def _raiser(exc: Exception):
    def run():
        raise exc
    return run


def judge(key: str, case: _Case) -> ErrorResult:
    """Run one case on CPU (to check the promise holds there) and on tpu."""
    result = ErrorResult(key, case.label, "matched", repro=case.repro)
    if case.call is None:  # a promise PyTorch itself does not keep (see _out_expected_to_fail)
        result.outcome, result.expected = "n/a", case.repro
        return result
    reason = _exemption(key, case.label)
    if reason:
        result.outcome, result.expected = "exempt", reason
        return result
    cpu_exc = None
    try:  # built first: the CPU call may mutate the sample (out= resized)
        on_tpu = case.call("tpu")
    except Exception as exc:  # noqa: BLE001 - moving the input already refuses it (> 64 dims)
        on_tpu = _raiser(exc)
    if case.label != "out.device":
        try:
            with C.time_limit(C.DEFAULT_TIMEOUT_S):
                case.call("cpu")()
        except C.SampleTimeout:
            raise
        except Exception as exc:  # noqa: BLE001 - the promised error, checked below
            cpu_exc = exc
        if cpu_exc is None or not isinstance(cpu_exc, case.error_type or Exception) or (
                case.error_regex and not re.search(case.error_regex, str(cpu_exc))):
            result.outcome = "n/a"
            result.expected = f"{(case.error_type or Exception).__name__}: {case.error_regex!r}"
            result.got = "CPU: " + (first_line(cpu_exc) if cpu_exc else "no exception")
            return result
    error_type = case.error_type or type(cpu_exc)
    result.expected = (f"{error_type.__name__}: {case.error_regex!r}" if case.error_regex is not None
                       else f"{first_line(cpu_exc)} (CPU)")
    try:
        with C.time_limit(C.DEFAULT_TIMEOUT_S):
            on_tpu()
            torch.tpu.synchronize()  # fused eager mode raises value-check errors when its segment runs
    except C.SampleTimeout as exc:
        result.outcome, result.got = "other-type", f"timeout: {exc}"
        return result
    except Exception as exc:  # noqa: BLE001 - judged below
        result.got = first_line(exc)
        if not isinstance(exc, error_type):
            result.outcome = "other-type"
        elif not _matches(exc, error_type, case.error_regex, cpu_exc):
            result.outcome = "message"
        return result
    result.outcome = "silent"
    return result


def run_errors(opinfo) -> list[ErrorResult]:
    key = C.op_key(opinfo)
    if C.exclusion_reason(key):
        return []
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            all_cases = list(cases(opinfo))
        except Exception as exc:  # noqa: BLE001 - a broken generator is reported, not fatal
            return [ErrorResult(key, "generation", "n/a", got=f"error_inputs raised {first_line(exc)}")]
        for case in all_cases:
            torch.manual_seed(0)
            try:
                results.append(judge(key, case))
            except Exception as exc:  # noqa: BLE001 - the harness itself must never stop a sweep
                results.append(ErrorResult(key, case.label, "other-type", got=f"harness: {first_line(exc)}",
                                           repro=case.repro))
    return results


def summarize(results: list[ErrorResult]) -> dict:
    counts = {o: 0 for o in OUTCOMES}
    for r in results:
        counts[r.outcome] += 1
    by_source = {}
    for source in ("error_inputs", "out", "shape"):
        rows = [r for r in results if r.case.startswith(source)]
        by_source[source] = {o: sum(r.outcome == o for r in rows) for o in OUTCOMES}
    bad = [r.to_json() for r in results if r.outcome in ("message", "other-type", "silent")]
    return {"counts": counts, "by_source": by_source, "opinfos": len({r.op for r in results}),
            "problems": bad, "exempt": [r.to_json() for r in results if r.outcome == "exempt"]}


def format_report(summary: dict) -> str:
    lines = []
    for r in summary["problems"]:
        lines.append(f"{r['outcome']:<10} {r['op']} {r['case']}: expected {r['expected'][:100]}; got {r['got'][:140]}")
        lines.append(f"           repro: {r['repro'][:220]}")
    for r in summary["exempt"]:
        lines.append(f"exempt     {r['op']} {r['case']}: {r['expected']}")
    c = summary["counts"]
    lines.append("")
    for source, counts in summary["by_source"].items():
        lines.append(f"{source:<13} " + "  ".join(f"{o}={counts[o]}" for o in OUTCOMES))
    lines.append(f"{'total':<13} " + "  ".join(f"{o}={c[o]}" for o in OUTCOMES)
                 + f"  ({summary['opinfos']} OpInfos)")
    return "\n".join(lines)


def run_all(ops: Iterable) -> tuple[list[ErrorResult], float]:
    start = time.perf_counter()
    results = [r for opinfo in ops for r in run_errors(opinfo)]
    return results, time.perf_counter() - start
