"""Memory, copies and views: the ops that define what a tpu tensor *is* (raw lowerings)."""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import torch

from .. import dtypes, fills, fusion, storage, transfers
from ..dispatch import cpu_to_jax, host_array, to_host
from ..registry import UNCHANGED, lower
from ..stats import record_transfer

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_aten = torch.ops.aten


def _default_dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


@lower("empty.memory_format", raw=True)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = _default_dtype(dtype)
    dtypes.to_jax(dtype)
    if memory_format is not None and memory_format != torch.contiguous_format:
        # torch's refusals (channels_last of a rank-3 size...); the tensor itself stays contiguous
        # (docs/device_parity.md#memory-formats)
        torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format)
    return storage.new_tensor(None, size, dtype)


@lower("empty_strided", raw=True)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _default_dtype(dtype)
    size, stride = tuple(size), tuple(stride)
    if stride == storage.contiguous_strides(size):
        return storage.new_tensor(None, size, dtype)
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    base = storage.new_tensor(None, (span,), dtype)
    return _aten.as_strided.default(base, size, stride, 0)


# --- views: torch's own metadata kernels (they never touch data), shared storage = real aliasing
@lower("as_strided", raw=True, cpu_view=True)
def as_strided(self, size, stride, storage_offset=None):
    return _aten.as_strided.default.redispatch(_CPU, self, size, stride, storage_offset)


@lower("view", raw=True, cpu_view=True)
def view(self, size):
    return _aten.view.default.redispatch(_CPU, self, size)


@lower("_reshape_alias", raw=True, cpu_view=True)
def reshape_alias(self, size, stride):
    return _aten._reshape_alias.default.redispatch(_CPU, self, size, stride)


@lower("unfold", raw=True, cpu_view=True)
def unfold(self, dimension, size, step):
    return _aten.unfold.default.redispatch(_CPU, self, dimension, size, step)


@lower("set_.source_Storage_storage_offset", raw=True)
def set_storage(self, source, storage_offset=0, size=(), stride=()):
    return _aten.set_.source_Storage_storage_offset.redispatch(_CPU, self, source, storage_offset, size, stride)


@lower("set_.source_Storage", raw=True)
def set_storage_whole(self, source):
    numel = source.nbytes() // self.dtype.itemsize
    return set_storage(self, source, 0, (numel,), (1,))


@lower("set_.source_Tensor", raw=True)
def set_tensor(self, source):
    return set_storage(self, source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


@lower("set_", raw=True)
def set_empty(self):
    fresh = storage.new_tensor(None, (0,), self.dtype)
    return set_storage(self, fresh.untyped_storage(), 0, (0,), (1,))


@lower("resize_", raw=True)
def resize_(self, size, memory_format=None):
    size = tuple(size)
    if tuple(self.shape) == size:
        return self
    needed = math.prod(size) + self.storage_offset()
    have = self.untyped_storage().nbytes() // self.dtype.itemsize
    if needed <= have:
        return set_storage(self, self.untyped_storage(), self.storage_offset(), size, storage.contiguous_strides(size))
    old = storage.read(self).reshape(-1) if self.numel() else None
    array = None
    if old is not None:
        array = jnp.zeros(math.prod(size), old.dtype).at[: old.size].set(old[: math.prod(size)]).reshape(size)
    storage.replace_storage(self, array, size)
    return self


# --- copies and transfers
def _copy(self, src, non_blocking=False):
    if self.device.type == "tpu":
        if src.is_complex() and not self.is_complex():  # CPU's copy_ warns (a copy to CPU: torch's own)
            warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=3)
        if src.device.type == "tpu":
            storage.check_no_partial_overlap(self, src)
            storage.copy_into(self, src)
        else:
            host = src.to(self.dtype) if src.dtype != self.dtype else src
            # as on CUDA, only a copy from pinned memory may return before the source is read
            if non_blocking and src.is_pinned() and tuple(host.shape) == tuple(self.shape):
                array = host_array(host)
                record_transfer("h2d", array.nbytes)  # time: it overlaps with compute
                pending = transfers.start(array)
                if isinstance(pending, jax.Array):
                    storage.write(self, pending)
                elif not storage.write_pending(self, pending):
                    storage.write(self, pending.result())
            else:
                storage.write(self, cpu_to_jax(host))
        return self
    # tpu -> cpu (or another host device): bring the value home, let torch handle dtype/broadcast
    host = dtypes.numpy_to_torch(to_host(src), src.dtype)
    return self.copy_(host)


@lower("copy_", raw=True)
def copy_(self, src, non_blocking=False):
    return _copy(self, src, non_blocking)


@lower("_copy_from", raw=True)
def copy_from(self, dst, non_blocking=False):
    return _copy(dst, self, non_blocking)


@lower("_copy_from_and_resize", raw=True)
def copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return _copy(dst, self)


@lower("_local_scalar_dense", raw=True)
def local_scalar_dense(self):
    return to_host(self).item()


# fill_.Scalar and zero_ are derived from these (one planned in-place program each, like add_):
# torch.full/ones/zeros and the autograd engine's zeroed buffers go through them
def _value_fits(args, kwargs) -> None:
    # CPU's and CUDA's fill convert the Scalar with an overflow check ("value cannot be converted to
    # type int64_t without overflow"); so does a 2-element CPU fill (one element skips it for half types).
    # Values that passed are remembered: autograd fills ones_like(loss) every backward (~20 us a check)
    self, value = args
    key = (self.dtype, type(value), value)
    if key in _fitting:
        return
    torch.empty(2, dtype=self.dtype).fill_(value)
    if len(_fitting) < 1024:
        _fitting.add(key)


_fitting: set = set()  # (dtype, type, value) of fill values that passed _value_fits


def _fill_fresh(self: torch.Tensor, value):
    return fills.shared_full(tuple(self.shape), value, dtypes.to_jax(self.dtype))


@lower("fill.Scalar", host_check=_value_fits, fresh_value=_fill_fresh)
def fill_scalar(self, value):
    # run eagerly, not planned: a host-made array (a never-written tensor over 64 KiB, the smaller ones
    # taking _fill_fresh's shared array before any lowering runs)
    if not isinstance(self, jax.core.Tracer):
        made = fills.host_full(self.shape, value, self.dtype, shared=True)
        if made is not None:
            return made
    return jnp.full(self.shape, value, self.dtype)


@lower("fill_.Tensor", raw=True)
def fill_tensor(self, value):
    if value.dim() != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions.")
    array = storage.read(value) if value.device.type == "tpu" else cpu_to_jax(value)
    storage.write(self, array)
    return self


def _zero_fresh(self: torch.Tensor) -> object:
    return UNCHANGED  # a never-written buffer reads as zeros: torch.zeros and zeros_like make none


@lower("zero", fresh_value=_zero_fresh)
def zero(self):
    if isinstance(self, jax.core.Tracer):
        return jnp.zeros(self.shape, self.dtype)
    if fills.is_fresh_zeros(self):  # torch.zeros: the never-written buffer just read as zeros
        return self
    return fills.zeros(self.shape, dtypes.to_torch(self.dtype))


@lower("_has_compatible_shallow_copy_type", raw=True)
def has_compatible_shallow_copy_type(self, from_):
    return self.device.type == from_.device.type or from_.device.type in ("cpu", "tpu")


@lower("record_stream", raw=True)
def record_stream(self, s):
    return None


@lower("is_pinned", raw=True)
def is_pinned(self, device=None):
    return False


# --- copies within the device, eagerly: one program each, on the C++ fast path (torch's composite
# kernels run empty_like + copy_ through Python: `.to(dtype)` took 63 us, `.contiguous()` 37 us, ~11 now)
_PRESERVE = (None, torch.preserve_format)


def _keeps_strides(x, memory_format) -> bool:
    """torch's composite kernel gives a non-contiguous ``x`` copied with ``preserve_format`` x's own
    strides (empty_like); the lowerings' results are contiguous."""
    return memory_format in _PRESERVE and not x.is_contiguous()


def _recording(x, dtype=None) -> bool:
    """While fused mode records, a whole buffer's copy keeps the form torch's composite kernel gives
    it: no step at all (copy_ hands the new tensor the same recorded value). As a step of its own it
    changed the segments' op sequences: generate()'s decode segments then compiled again on a call from
    a new line where they had been known. A view's copy and a cast are one step either way: the
    lowering's (a C++ record plan), not a read and a write through two Python kernels."""
    if not fusion.active():
        return False
    buf = storage.buffer_of(x)
    return ((storage.is_plain(x, buf) and (dtype is None or dtype == x.dtype)) or x.is_conj() or x.is_neg()
            or x.dtype != buf.dtype)


@lower("clone", composite_when=lambda x, memory_format=None: _keeps_strides(x, memory_format) or _recording(x))
def clone(x, memory_format=None):
    return x  # a view's value is read from its buffer into a fresh array


def _to_copy_elsewhere(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                       memory_format=None) -> bool:
    """A ``_to_copy`` the lowering does not cover: to another device or layout, into pinned memory,
    complex to real (torch warns), keeping a non-contiguous tensor's strides, or, while fused mode
    records, what :func:`_recording` leaves to the composite kernel."""
    return ((device is not None and torch.device(device).type != x.device.type)
            or layout not in (None, torch.strided) or bool(pin_memory) or _keeps_strides(x, memory_format)
            or (x.is_complex() and dtype is not None and not dtype.is_complex)
            or _recording(x, dtype))


@lower("_to_copy", composite_when=_to_copy_elsewhere)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x  # cast to torch's result dtype by dispatch (as copy_ casts: astype)
