"""Constant arrays made eagerly: a never-written buffer's zeros, ``torch.zeros``/``ones``/``full``.

Small ones are copied from the host (``device_put``), which compiles nothing: a first training step
would otherwise compile a program per shape for its optimizer's moments and autograd's
``ones_like(loss)``. Larger zeros come from one stored program per shape and dtype.
"""
from __future__ import annotations

import functools
import math
import struct
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import dtypes, op_jit


def make_zeros(shape: tuple, dtype: torch.dtype) -> jax.Array:
    return jnp.zeros(shape, dtypes.to_jax(dtype))


@functools.lru_cache(maxsize=1024)
def _zeros_program(shape: tuple, dtype: torch.dtype) -> op_jit.Program:
    """A never-written buffer's zeros, made on the device (one stored program per shape and dtype)."""
    run = functools.partial(make_zeros, shape, dtype)
    return op_jit.Program(run, run)


_HOST_ZEROS_BYTES = 4 << 20  # above this a host copy costs more than a program (~0.4 ms on a TPU v5e)


def zeros(shape: tuple, dtype: torch.dtype) -> jax.Array:
    """Zeros made eagerly (a never-written buffer's, ``torch.zeros``). Small ones are copied from the
    host, which compiles nothing: most are one-off state of a new shape (an optimizer's moments were
    7 of the 79 programs of a transformer block's first AdamW step), and the copy costs no more than
    running a program would. Larger ones come from one stored program per shape and dtype (eager
    ``jnp.zeros`` would compile primitives of its own), and so do zeros over 64 KiB of a shape and
    dtype made before: buffers a loop makes every step (FSDP2's all-gather and reduce-scatter
    buffers: 19 per step, 2-4 MiB each, 16 ms of host fills and copies per step on XLA:CPU) cost a
    device memset once their program exists, not a host fill and a transfer each time."""
    shape = tuple(shape)
    jax_dtype = dtypes.to_jax(dtype)
    repeated = False
    if math.prod(shape) * np.dtype(jax_dtype).itemsize > _SHARED_FULL_BYTES:
        key = (shape, dtype)
        repeated = key in _zeros_seen
        if not repeated:
            if len(_zeros_seen) >= _ZEROS_SEEN_LIMIT:
                _zeros_seen.clear()
            _zeros_seen.add(key)
    array = None if repeated else host_full(shape, 0, jax_dtype)
    if array is None:
        return _zeros_program(shape, dtype)()
    _fresh_zeros[0] = weakref.ref(array)
    return array


_zeros_seen: set = set()  # (shape, dtype) of zeros over 64 KiB made before
_ZEROS_SEEN_LIMIT = 4096


_fresh_zeros: list = [None]  # the zeros zeros() last copied from the host (weakly)


def host_full(shape: tuple, value, jax_dtype, shared: bool = False) -> jax.Array | None:
    """``value`` everywhere, copied from the host where small (compiles nothing, as :func:`zeros`);
    None where a program should make it. ``shared``: up to 64 KiB, made once per shape, dtype and
    value bits and shared (a copy costs ~35 us; autograd's ``ones_like(loss)`` is one every step).
    Arrays are immutable and a shared one is never donated (its other holders are seen)."""
    nbytes = math.prod(shape) * np.dtype(jax_dtype).itemsize
    if nbytes > _HOST_ZEROS_BYTES:
        return None
    if not shared or nbytes > _SHARED_FULL_BYTES:
        return jax.device_put(np.full(shape, value, jax_dtype))
    return shared_full(shape, value, jax_dtype)


def shared_full(shape: tuple, value, jax_dtype) -> jax.Array | None:
    """:func:`host_full`'s shared array (None over 64 KiB: no host copy where a fused program could
    make it)."""
    if math.prod(shape) * np.dtype(jax_dtype).itemsize > _SHARED_FULL_BYTES:
        return None
    key = (shape, jax_dtype, type(value), _bits(value), jax.config.jax_default_device)
    array = _shared_full.get(key)
    if array is None:
        if len(_shared_full) >= _SHARED_FULL_LIMIT:
            _shared_full.clear()
        array = _shared_full[key] = jax.device_put(np.full(shape, value, jax_dtype))
    return array


_SHARED_FULL_BYTES, _SHARED_FULL_LIMIT = 64 << 10, 256  # at most 16 MiB of device memory
_shared_full: dict = {}


def _bits(value):  # a float by its bits: -0.0 == 0.0 as a dict key
    if isinstance(value, (float, np.floating)):
        return struct.pack("<d", value)
    if isinstance(value, complex):
        return struct.pack("<dd", value.real, value.imag)
    return value


def is_fresh_zeros(array) -> bool:
    """``array`` is the zeros :func:`zeros` last copied from the host: ``zero_`` of a never-written
    buffer (``torch.zeros``) reads them and can keep them instead of making zeros again."""
    ref = _fresh_zeros[0]
    return ref is not None and ref() is array
