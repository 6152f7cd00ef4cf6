"""Sequence factories (arange, linspace, logspace, eye, tril/triu_indices) computed on the device.

They reach the backend as ``out=`` ops on a freshly made tensor; sizes come from torch's meta
kernels, values are computed in float64 the way torch's CPU kernels do, then cast.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes, fills, storage
from ..dispatch import _COMPOSITE
from ..registry import lower
from .core import _keeps_strides


def _fill_out(out, value):
    if tuple(out.shape) != tuple(value.shape):
        if not out.untyped_storage().nbytes() and value.dtype == dtypes.to_jax(out.dtype):
            # the factory's own empty `out` (torch.arange makes one): point it at the value, as resize_
            # would at a new buffer, without resize_'s dispatch and a write after it (~35 us)
            storage.replace_storage(out, value, value.shape)
            return out
        out.resize_(value.shape)
    storage.write(out, value)
    return out


def _scalar(v):
    return v.item() if isinstance(v, torch.Tensor) else v


_INTEGER_OUT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# float64 keeps the composite path: its values come from float64 arithmetic whose rounding a fused
# program may change; for these the float64 value is rounded to the type, as the composite does
_FLOAT_OUT = (torch.float32, torch.bfloat16, torch.float16)
_aranges: dict = {}  # (length, dtype) -> jitted program of (start, step)
_EXACT = float(1 << 53)


def _arange_value(start, end, step, dtype: torch.dtype) -> jax.Array | None:
    """``arange`` of Python numbers (a decode step's positions, a model's position ids, a timestep
    embedding's frequencies) by one cached program of (start, step): the meta kernel's size check and
    four jax.numpy calls cost ~190 us a call on XLA:CPU (~500 us for floats). Integer results: Python
    ints only, as torch's int64 arithmetic. Float32/16 results: float64 arithmetic, as the composite
    path. None where torch's own check must run (a zero step, a bound inconsistent with the step's
    sign, a non-finite or huge bound) or another type is asked for."""
    kinds = (type(start), type(end), type(step))
    if dtype in _INTEGER_OUT and kinds == (int, int, int):
        span = end - start
        if abs(span) >= 1 << 53 or not -(1 << 62) <= start < 1 << 62 or not -(1 << 62) <= step < 1 << 62:
            return None
        host = np.int64
    elif dtype in _FLOAT_OUT and all(k is int or k is float for k in kinds):
        if step != 0 and not (math.isfinite(start) and math.isfinite(end)):  # ATen's words (its doubles
            raise RuntimeError(f"unsupported range: {start:g} -> {end:g}")  # printed as C++ does); the
        if not all(-_EXACT < v < _EXACT for v in (start, end, step)):  # meta kernel's say "0.0 -> inf"
            return None
        span, host = end - start, np.float64
    else:
        return None
    if not ((step > 0 and span >= 0) or (step < 0 and span <= 0)):
        return None
    # torch's ceil((end - start) / step) in double; exact for ints here
    n = -(-span // step) if host is np.int64 else math.ceil(span / step)
    key = (n, dtype)
    program = _aranges.get(key)
    if program is None:
        if len(_aranges) > 256:
            _aranges.clear()
        jt, wide = dtypes.to_jax(dtype), jnp.int64 if host is np.int64 else jnp.float64
        program = _aranges[key] = jax.jit(
            lambda start_step: (start_step[0] + jnp.arange(n, dtype=wide) * start_step[1]).astype(jt))
    return program(np.array([start, step], dtype=host))  # one transfer for both


def _arange(op: torch._ops.OpOverload, start_first: bool):
    """The functional ``arange`` overload ``op``: a tensor made from :func:`_arange_value`'s program
    where it applies; else torch's composite (an ``empty`` and ``arange.start_out``)."""

    def kernel(*args, dtype=None, layout=None, device=None, pin_memory=None):
        start, end, step = (*args, 1)[:3] if start_first else (0, args[0], 1)
        if layout in (None, torch.strided):
            made = dtype
            if made is None:  # torch's type: int64 for Python ints, else the default float type
                ints = type(start) is int and type(end) is int and type(step) is int
                made = torch.int64 if ints else torch.get_default_dtype()
            value = _arange_value(start, end, step, made)
            if value is not None:
                return storage.new_tensor(value, value.shape, made)
        return op.redispatch(_COMPOSITE, *args, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)

    return kernel


for _name, _start_first in (("arange", False), ("arange.start", True), ("arange.start_step", True)):
    _overload = getattr(torch.ops.aten.arange, _name.partition(".")[2] or "default")
    lower(_name, raw=True)(_arange(_overload, _start_first))


_PLAIN_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _like(op: torch._ops.OpOverload, value: int | None):
    """``ones_like`` (every ``backward()`` makes ``ones_like(loss)``) and ``zeros_like`` as one kernel:
    torch's composite runs ``empty_like`` and a fill, two Python kernels (~13 us a call more here). The
    new tensor takes what that fill gives a never-written tensor: the shared host-made array of
    ``value`` (None: no array, a never-written buffer reads as zeros); nothing is recorded or compiled.
    The composite keeps the other calls: another device or layout, pinned memory, a memory format,
    strides kept by ``preserve_format``, an array over the shared ones' size."""

    def kernel(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        if (layout in (None, torch.strided) and not pin_memory and (device is None or torch.device(device) == x.device)
                and memory_format in _PLAIN_FORMATS and not _keeps_strides(x, memory_format)):
            made, shape = dtype if dtype is not None else x.dtype, tuple(x.shape)
            array = None if value is None else fills.shared_full(shape, value, dtypes.to_jax(made))
            if value is None or array is not None:
                return storage.new_tensor(array, shape, made)
        return op.redispatch(_COMPOSITE, x, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                             memory_format=memory_format)

    return kernel


lower("ones_like", raw=True)(_like(torch.ops.aten.ones_like.default, 1))
lower("zeros_like", raw=True)(_like(torch.ops.aten.zeros_like.default, None))


@lower("arange.start_out", raw=True)
def arange_out(start, end, step=1, *, out):
    start, end, step = _scalar(start), _scalar(end), _scalar(step)
    value = _arange_value(start, end, step, out.dtype)
    if value is not None:
        return _fill_out(out, value)
    n = torch.arange(start, end, step, dtype=out.dtype, device="meta").numel()  # torch's size check
    jt = dtypes.to_jax(out.dtype)
    if not (out.dtype.is_floating_point or out.dtype.is_complex):  # CPU: integer start/step (truncated)
        value = (int(start) + jnp.arange(n, dtype=jnp.int64) * int(step)).astype(jt)
    elif out.dtype.is_floating_point or isinstance(start, float) or isinstance(step, float):
        value = (start + jnp.arange(n, dtype=jnp.float64) * step).astype(jt)
    else:
        value = (start + jnp.arange(n, dtype=jnp.int64) * step).astype(jt)
    return _fill_out(out, value)


def _linspace(start, end, steps):
    # torch: first half counts up from start, second half down from end (symmetric rounding)
    i = jnp.arange(steps, dtype=jnp.float64)
    if steps == 1:
        return jnp.full((1,), start, jnp.float64)
    step = (end - start) / (steps - 1)
    return jnp.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)


def _as_out_dtype(value, out) -> float:
    """CPU casts start/end to the result dtype first (``Scalar.to<scalar_t>()``): ints truncate,
    bfloat16 rounds."""
    if out.dtype.is_complex:
        return value
    return float(jnp.asarray(value, jnp.float64).astype(dtypes.to_jax(out.dtype)))


@lower("linspace.out", raw=True)
def linspace_out(start, end, steps, *, out):
    start, end = _scalar(start), _scalar(end)
    torch.linspace(start, end, steps, device="meta")  # argument checks
    if not out.dtype.is_floating_point and not out.dtype.is_complex:
        # integer linspace: integer start/end, a double step, truncated (ATen's step_t = double)
        value = jnp.trunc(_linspace(_as_out_dtype(start, out), _as_out_dtype(end, out), steps))
    elif out.dtype in (torch.bfloat16, torch.float16) and steps > 1:
        # ATen computes in the half type itself: start, end, step and each product/sum rounded
        jt = dtypes.to_jax(out.dtype)
        lo, hi = jnp.asarray(start, jnp.float32).astype(jt), jnp.asarray(end, jnp.float32).astype(jt)
        step = ((hi.astype(jnp.float32) - lo.astype(jnp.float32)) / (steps - 1)).astype(jt)
        i = jnp.arange(steps)
        value = jnp.where(i < steps // 2, lo + step * i.astype(jt), hi - step * (steps - 1 - i).astype(jt))
    else:
        value = _linspace(start, end, steps)
    return _fill_out(out, value.astype(dtypes.to_jax(out.dtype)))


@lower("logspace.out", raw=True)
def logspace_out(start, end, steps, base=10.0, *, out):
    start, end = _scalar(start), _scalar(end)
    torch.logspace(start, end, steps, base, device="meta")
    # ATen: start/end cast to the result dtype, exponents and pow in double
    exponent = _linspace(_as_out_dtype(start, out) if steps > 1 else start, _as_out_dtype(end, out), steps)
    value = jnp.power(jnp.float64(base), exponent)
    return _fill_out(out, value.astype(dtypes.to_jax(out.dtype)))


@lower("eye.m_out", raw=True)
def eye_m_out(n, m, *, out):
    for name, value in (("n", n), ("m", m)):
        if value < 0:
            raise RuntimeError(f"{name} must be greater or equal to 0, got {value}")
    return _fill_out(out, jnp.eye(n, m, dtype=dtypes.to_jax(out.dtype)))


@lower("eye.out", raw=True)
def eye_out(n, *, out):
    return eye_m_out(n, n, out=out)


def _tri_indices(row, col, offset, lower_part, dtype, device):
    torch.tril_indices(row, col, offset, device="meta")  # argument checks
    r = jnp.arange(row)[:, None]
    c = jnp.arange(col)[None, :]
    mask = (c - r <= offset) if lower_part else (c - r >= offset)
    rows, cols = jnp.nonzero(mask)
    value = jnp.stack([rows, cols]).astype(dtypes.to_jax(dtype or torch.int64))
    return storage.from_array(value, dtype or torch.int64)


@lower("tril_indices", raw=True)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, True, dtype, device)


@lower("triu_indices", raw=True)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, False, dtype, device)


@lower("_efficientzerotensor", raw=True)
def efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # autograd makes these for known-zero gradients; a plain zero tensor has the same values
    dtype = dtype or torch.get_default_dtype()
    return storage.new_tensor(jnp.zeros(tuple(size), dtypes.to_jax(dtype)), size, dtype)
