"""Moving OpInfo samples to tpu and comparing tpu's results with CPU's (used by the conformance runs
and by the tests)."""
from __future__ import annotations

import math
from typing import Any, Iterator

import torch

TPU = torch.device("tpu", 0)

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
# itself. Their float32 atol is this factor times the largest |CPU value|. Convolutions likewise: an
# output that cancels (-0.0247 from terms whose magnitudes sum to 1307) carries the rounding error of
# its terms, ~1e-8 of that sum, whatever the summation order (CPU's and XLA's differ).
NORMWISE_ATOL = {"matrix_exp": 1e-5, **{f"nn.functional.conv{kind}{n}d": 1e-6
                                       for kind in ("", "_transpose") for n in (1, 2, 3)}}


def tolerances_for(key: str, expected: Any) -> dict:
    factor = NORMWISE_ATOL.get(key)
    if factor is None or not isinstance(expected, torch.Tensor) or expected.numel() == 0:
        return TOLERANCES
    rtol, atol = TOLERANCES[torch.float32]
    scale = float(expected.detach().abs().nan_to_num(0, 0, 0).max())
    return {**TOLERANCES, torch.float32: (rtol, max(atol, factor * scale))}


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


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def sample_numel(sample) -> int:
    return sum(t.numel() for t in tensors_in([sample.input, sample.args, sample.kwargs]))


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
            raise Mismatch(f"{where}: {shorten(str(exc))}") from None
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


def shorten(text: str, limit: int = 400) -> str:
    text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# ---------------------------------------------------------------- where CPU is not the reference
# (op, output index) whose dtype follows CUDA and torch's meta kernels, not CPU: for bfloat16/float16
# inputs the saved mean and inverse std of the norms are float32 on CUDA (accumulate type) and bfloat16
# on CPU. tpu's must be float32 then; the values are compared after rounding to CPU's dtype.
CUDA_DTYPE_OUTPUTS = {
    "native_layer_norm": (1, 2),
    "native_batch_norm": (1, 2),
    "_native_batch_norm_legit": (1, 2),
    "_batch_norm_with_update": (1, 2),
}


def with_cuda_dtypes(key: str, actual: Any, expected: Any) -> Any:
    """``actual`` with the outputs of ``CUDA_DTYPE_OUTPUTS`` cast to CPU's dtype when tpu's is float32
    and CPU's a reduced-precision float (anything else is returned unchanged, and compared as-is)."""
    indices = CUDA_DTYPE_OUTPUTS.get(key)
    if not indices or not isinstance(actual, (list, tuple)) or not isinstance(expected, (list, tuple)):
        return actual
    out = list(actual)
    for i in indices:
        if (i < len(out) and i < len(expected) and isinstance(out[i], torch.Tensor)
                and isinstance(expected[i], torch.Tensor) and out[i].dtype == torch.float32
                and expected[i].dtype in (torch.bfloat16, torch.float16)):
            out[i] = out[i].to(expected[i].dtype)
    return type(actual)(out) if isinstance(actual, tuple) else out


def at_least_as_accurate(actual: Any, expected: Any, exact: Any) -> bool:
    """True if every floating output of tpu (``actual``) that differs from CPU's (``expected``) is
    within the dtype's tolerance of the float64 result (``exact``, the op on float64 copies of the
    same inputs) or no further from it than CPU's own value. Two correct kernels in reduced precision
    (a different accumulation order, one rounding instead of several) differ by more than the
    tolerance where the result cancels; that is not a wrong result unless tpu is the inaccurate one."""
    got, want, ref = list(tensors_in(actual)), list(tensors_in(expected)), list(tensors_in(exact))
    if not (len(got) == len(want) == len(ref)) or not got:
        return False
    for g, w, r in zip(got, want, ref):
        if g.shape != w.shape or g.dtype != w.dtype or r.shape != w.shape:
            return False
        if not w.is_floating_point():
            if not torch.equal(g.detach().cpu(), w.detach()):
                return False
            continue
        rtol, atol = TOLERANCES.get(w.dtype, (1e-5, 1e-5))
        g64, w64, r64 = g.detach().cpu().double(), w.detach().double(), r.detach().double()
        nan = g64.isnan() & w64.isnan()
        err_tpu = (g64 - r64).abs().nan_to_num(nan=math.inf)
        err_cpu = (w64 - r64).abs().nan_to_num(nan=math.inf)
        same_inf = (g64 == w64) & g64.isinf()
        allowed = torch.maximum(err_cpu, atol + rtol * r64.abs())
        if not bool(((err_tpu <= allowed) | nan | same_inf).all()):
            return False
    return True

