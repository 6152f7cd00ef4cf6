"""Device memory model: a tpu tensor is a real torch TensorImpl whose storage holds a jax.Array.

Design (why not a wrapper subclass or a Python attribute on the tensor):
- Every tpu storage is a torch StorageImpl made with ``_construct_storage_from_data_pointer`` over a
  *fake, unique, non-overlapping* address range of the right byte size. Torch's own view machinery
  (as_strided bounds checks, ``_base``, version counters, overlap checks) therefore works unchanged,
  and every alias of a tensor (views, ``detach``, ``nn.Parameter``, C++-made aliases) shares that
  storage, like on CUDA. The addresses are non-canonical on x86-64, so an accidental dereference
  faults loudly instead of reading garbage.
- The device buffer lives in a ``DeviceBuffer`` attached as an attribute of the storage's Python
  object. Torch preserves storage PyObjects, so the buffer lives exactly as long as the storage:
  memory accounting is exact and nothing leaks through views or autograd graphs.
- A buffer keeps the array in the *natural* shape of the tensor that created it; a tensor whose
  geometry is that shape reads the array as-is (no reshape, sharding kept). Other views read through
  dense fast paths (offset slice, permutation, broadcast) or, in general, a gather; writes through a
  view are functional updates of the buffer, which every alias then sees.
"""
from __future__ import annotations

import functools
import math
import sys
import threading
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import dtypes, fills, fusion, op_jit, stats
from . import memory_history as _history
from .config import config

DEVICE = torch.device("tpu", 0)
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset
_construct_storage = torch._C._construct_storage_from_data_pointer
_create_empty = torch._C._acc.create_empty_tensor

_ARRAY = type(jnp.zeros(()))  # concrete eager jax.Array type (isinstance on jax.Array is slow)
_ADDRESS_BASE = _history.ADDRESS_BASE  # non-canonical: any dereference faults
_ALIGN = 256
_next_address = _ADDRESS_BASE
_address_lock = threading.Lock()


def _reserve_in_python(nbytes: int) -> int:
    global _next_address
    with _address_lock:
        address = _next_address
        _next_address += max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        return address


_reserve = _reserve_in_python


def reserve(nbytes: int) -> int:
    """A fresh fake address range of ``nbytes`` (the next free address, for ``nbytes=0``)."""
    return _reserve(nbytes)


def set_reserve(reserve_fn) -> None:
    """Hand out addresses with ``reserve_fn`` from now on (the C++ fast path's counter, which
    continues this one), so storages made by either half never overlap."""
    global _reserve
    _reserve = reserve_fn


class DeviceOutOfMemoryError(torch.OutOfMemoryError):
    pass


class DeviceBuffer:
    """The device data behind one storage. ``array is None`` means never written (reads as zeros),
    or, with ``pending`` set, a non_blocking host-to-device copy still in flight (transfers.py)."""

    __slots__ = ("array", "pending", "shape", "dtype", "nbytes", "address", "__weakref__")

    def __del__(self):
        # The buffer is referenced only by its storage's PyObject, so this runs when the storage dies.
        stats.record_free(self.nbytes)
        if _history.RECORDING:
            _history.on_free(self.address, self.nbytes)

    def __init__(self, array: jax.Array | None, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int,
                 address: int = 0):
        # csrc/fast_dispatch.cpp's new_buffer writes these same slots directly: keep them in step
        self.array = array
        self.pending = None
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes
        self.address = address  # the storage's data_ptr()

    def value(self) -> jax.Array:
        if type(self.array) is fusion.Lazy:  # recorded in fused mode: run its segment if needed
            self.array = fusion.resolve(self.array)
        if self.array is None:
            if self.pending is not None:
                self.array, self.pending = self.pending.result(), None
            else:
                self.array = fills.zeros(self.shape, self.dtype)
        return self.array

    def flat(self) -> jax.Array:
        return self.value().reshape(-1)


_history.BUFFER_TYPE = DeviceBuffer  # the recorder finds live blocks by this type


def _check_memory(nbytes: int) -> None:
    limit = config.memory_limit_bytes
    if limit is None:
        return
    live = stats.memory().live_bytes
    if live + nbytes > limit:
        if _history.RECORDING:
            _history.on_oom(nbytes, max(limit - live, 0))
        raise DeviceOutOfMemoryError(
            f"tpu out of memory: tried to allocate {_fmt_bytes(nbytes)}; {_fmt_bytes(live)} "
            f"already in use of the {_fmt_bytes(limit)} limit (tpu_interactive.config.memory_limit_bytes). "
            "Free tensors (del x; gc.collect()) or use smaller batches."
        )


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def new_tensor(array: jax.Array | None, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A fresh contiguous tpu tensor owning ``array`` (which must have ``shape`` and ``dtype``)."""
    shape = tuple(shape)
    storage = _device_storage(array, shape, dtype)
    tensor = _create_empty(shape, dtype)
    _SET_STORAGE.redispatch(_CPU_KEYS, tensor, storage, 0, shape, contiguous_strides(shape))
    return tensor


def empty_storage(nbytes: int) -> torch.UntypedStorage:
    """A fresh tpu storage of ``nbytes`` bytes (reads as zeros until written), for torch code that
    allocates raw storages: ``torch.UntypedStorage(n, device="tpu")`` in deepcopy and torch.load."""
    return _device_storage(None, (nbytes,), torch.uint8)


def _device_storage(array: jax.Array | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.UntypedStorage:
    nbytes = math.prod(shape) * dtype.itemsize
    _check_memory(nbytes)
    address = _reserve(nbytes)
    raw = _construct_storage(address, DEVICE, nbytes)
    raw._tpu_buffer = DeviceBuffer(array, shape, dtype, nbytes, address)
    stats.record_alloc(nbytes)
    if _history.RECORDING:
        _history.on_alloc(address, nbytes)
    return raw


def from_array(array: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    if dtype is None:
        dtype = dtypes.to_torch(array.dtype)
    return new_tensor(array, array.shape, dtype)


def buffer_of(t: torch.Tensor) -> DeviceBuffer:
    try:
        return t.untyped_storage()._tpu_buffer
    except AttributeError:
        raise RuntimeError(
            f"tensor of shape {tuple(t.shape)} on {t.device} has no device buffer "
            "(it was not created by tpu_interactive)"
        ) from None


def _is_whole(t: torch.Tensor, buf: DeviceBuffer) -> bool:
    return t.storage_offset() == 0 and tuple(t.shape) == buf.shape and t.is_contiguous()


def _dense_plan(shape, strides, offset):
    """If the view is a permuted/broadcast window of a dense block, return (start, sizes, order).

    ``sizes`` are the dense block's dims ordered by decreasing stride; ``order[k]`` is the view dim of
    block dim k; broadcast (stride 0) and size-1 dims are re-added at the end.
    """
    dims = [(st, sz, i) for i, (sz, st) in enumerate(zip(shape, strides)) if sz != 1 and st != 0]
    dims.sort(key=lambda d: -d[0])
    expected = 1
    for st, sz, _ in reversed(dims):
        if st != expected:
            return None
        expected *= sz
    return offset, tuple(d[1] for d in dims), tuple(d[2] for d in dims)


@functools.lru_cache(maxsize=512)
def _gather_index(shape, strides, offset):
    idx = np.full((), offset, dtype=np.int64)
    for size, stride in zip(shape, strides):
        idx = np.add.outer(idx, np.arange(size, dtype=np.int64) * stride)
    return idx.reshape(shape)


def _complex_parts(flat: jax.Array) -> jax.Array:
    """complex -> its (real, imag) pairs, flattened: the same bytes as a real array."""
    return jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)


def _from_parts(flat: jax.Array, dst: torch.dtype) -> jax.Array:
    """(real, imag) pairs -> complex; an odd tail (a real buffer of odd length) is padded with 0."""
    if flat.size % 2:
        flat = jnp.pad(flat, (0, 1))
    pairs = flat.reshape(-1, 2)
    return jax.lax.complex(pairs[:, 0], pairs[:, 1]).astype(dtypes.to_jax(dst))


def _bitcast(flat: jax.Array, src: torch.dtype, dst: torch.dtype) -> jax.Array:
    """Reinterpret a 1-D array of ``src`` elements as a 1-D array of ``dst`` elements (same bytes).

    Complex goes through its real dtype (XLA's bitcast_convert_type takes no complex types); a
    narrower->wider cast of a length that does not divide evenly is zero-padded at the end."""
    if src == dst:
        return flat
    if src.is_complex:
        return _bitcast(_complex_parts(flat), src.to_real(), dst)
    if dst.is_complex:
        return _from_parts(_bitcast(flat, src, dst.to_real()), dst)
    if src == torch.bool:
        flat, src = flat.astype(jnp.uint8), torch.uint8
    target = torch.uint8 if dst == torch.bool else dst
    jt = dtypes.to_jax(target)
    if src.itemsize == target.itemsize:
        out = jax.lax.bitcast_convert_type(flat, jt)
    elif src.itemsize > target.itemsize:
        out = jax.lax.bitcast_convert_type(flat, jt).reshape(-1)
    else:
        ratio = target.itemsize // src.itemsize
        if flat.size % ratio:
            flat = jnp.pad(flat, (0, ratio - flat.size % ratio))
        out = jax.lax.bitcast_convert_type(flat.reshape(-1, ratio), jt)
    return out.astype(jnp.bool_) if dst == torch.bool else out


def _lazy_bits(value, conj: bool, neg: bool):
    """Apply a tensor's lazy conjugate / negative bits (``x.conj()``, ``x.conj().imag`` store the plain
    data). Both are involutions, so this maps stored -> logical values and logical -> stored alike."""
    if conj:
        value = jnp.conj(value)
    if neg:
        value = -value
    return value


def geometry(t: torch.Tensor, buf: DeviceBuffer) -> tuple:
    """How ``t`` lies in its buffer: the static arguments of :func:`view_value` / :func:`written`."""
    return buf.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg()


def never_written(t: torch.Tensor) -> bool:
    """``t`` is the whole of a buffer that was never written (a new ``empty``: it reads as zeros)."""
    buf = buffer_of(t)
    return buf.array is None and buf.pending is None and is_plain(t, buf)


def fill_new(t: torch.Tensor, array: jax.Array) -> None:
    """A :func:`never_written` ``t`` takes ``array`` (its exact shape and dtype, made from nothing else).
    In fused mode too it is not a recorded write with an undo entry: nothing read the buffer before, and a
    segment that fails cannot make the value wrong, so it stands (undone, it would read as zeros)."""
    buffer_of(t).array = array


def is_plain(t: torch.Tensor, buf: DeviceBuffer) -> bool:
    """``t`` is its whole buffer, same dtype, no lazy bits: its value is the buffer's array as-is."""
    return t.dtype == buf.dtype and _is_whole(t, buf) and not (t.is_conj() or t.is_neg())


def read(t: torch.Tensor) -> jax.Array:
    """The value of tpu tensor ``t`` as a jax.Array of exactly t's shape and dtype."""
    buf = buffer_of(t)
    if is_plain(t, buf):
        return buf.value()
    return _read_program(geometry(t, buf))(buf.value())


@functools.lru_cache(maxsize=4096)
def _read_program(where: tuple):
    """A view's read as one program: op by op, view_value's slice, transpose and reshape would each be
    a program of their own (several compiles for every new view shape, several dispatches each read)."""
    run = functools.partial(_read_at, where)
    return op_jit.Program(run, run)


def _read_at(where: tuple, array):
    return view_value(array, *where)


def read_lazy(t: torch.Tensor):
    """Like :func:`read`, but in fused mode the value may be a recorded ``fusion.Lazy`` (a view of
    a buffer is then recorded too): for kernels whose lowering fused mode records."""
    if not fusion.active():
        return read(t)
    buf = buffer_of(t)
    array = stored(buf)
    if is_plain(t, buf):
        return array
    return fusion.apply(view_value, array, *geometry(t, buf), eager=_read_eagerly)


def _read_eagerly(array, *where):
    return _read_program(where)(array)  # read's program: a segment run op by op compiles no other


def buffer_and_view(t: torch.Tensor, lazy: bool) -> tuple:
    """(t's buffer's whole array, t's :func:`geometry` where t is a view of it, else None): for a
    program that reads the view itself (one program, not a read program per view). ``lazy``: the
    array may be a deferred or recorded value (:func:`stored`)."""
    buf = buffer_of(t)
    return stored(buf) if lazy else buf.value(), None if is_plain(t, buf) else geometry(t, buf)


def read_deferred(t: torch.Tensor):
    """Like :func:`read`, but deferred values (compile_ahead.py) stay Lazy: a whole buffer's, and a
    view's read, deferred too while its program compiles. For program inputs that compile_ahead.call
    takes (it runs them first where it must)."""
    buf = buffer_of(t)
    array = stored(buf)
    if is_plain(t, buf):
        return array
    return _run(_read_program(geometry(t, buf)), [array])


def _run(program: op_jit.Program, inputs: list, donate: int = 0, intent: int = 0):
    """``program(*inputs)``, deferred while it compiles (compile_ahead.py) where it is cold; inputs
    may be deferred values. ``donate``/``intent``: as compile_ahead.call takes them."""
    ahead = op_jit.AHEAD[0]
    if ahead is None:
        inputs = [fusion.resolve(v) if type(v) is fusion.Lazy else v for v in inputs]
        return program.executable(inputs, donate)(*inputs)
    return ahead(program, inputs, donate, "tensor read/write", intent)[0]


def stored(buf: DeviceBuffer):
    """The buffer's array in fused mode: concrete, or a Lazy of the segment being recorded (a buffer
    never written records its zeros)."""
    array = buf.array
    if array is None:  # never written (reads as zeros), or a host-to-device copy in flight
        if buf.pending is not None or not fusion.active():
            return buf.value()
        # the zeros, recorded once and kept (as a read in eager keeps them): later reads are a plain
        # buffer's (the C++ record plans); undone with the segment's writes if it fails
        zeros = fusion.apply(fills.make_zeros, buf.shape, buf.dtype)
        fusion.note_write(buf, None)
        buf.array = zeros
        return zeros
    if type(array) is fusion.Lazy and array.value is not None:
        array = buf.array = array.value
    return array


def view_value(array: jax.Array, buf_dtype, shape, strides, offset, dtype, conj, neg) -> jax.Array:
    """A view's value from its buffer's array (pure: eager, or a step of a fused segment)."""
    if 0 in shape:
        value = jnp.zeros(shape, dtypes.to_jax(dtype))
    elif dtype == buf_dtype and array.shape == shape and offset == 0 and strides == contiguous_strides(shape):
        value = array
    else:
        flat = _bitcast(array.reshape(-1), buf_dtype, dtype)
        plan = _dense_plan(shape, strides, offset)
        if plan is not None:
            start, sizes, order = plan
            block = jax.lax.slice(flat, (start,), (start + math.prod(sizes),)).reshape(sizes)
            kept = sorted(order)
            axes = [order.index(i) for i in kept]  # block dims -> the view's dim order
            if axes != list(range(len(axes))):
                block = jnp.transpose(block, axes)
            block = block.reshape([shape[i] if i in kept else 1 for i in range(len(shape))])
            value = jnp.broadcast_to(block, shape)
        else:
            value = flat[_gather_index(shape, tuple(strides), offset)]
    return _lazy_bits(value, conj, neg) if conj or neg else value


def copy_into(t: torch.Tensor, src: torch.Tensor) -> None:
    """``t.copy_(src)`` between tpu tensors: a view ``src`` is read inside t's write program (one
    program, not a read and a write)."""
    if fusion.active():
        write(t, read_lazy(src))
        return
    src_buf = buffer_of(src)
    write(t, stored(src_buf), None if is_plain(src, src_buf) else geometry(src, src_buf))


def write(t: torch.Tensor, value, value_view: tuple | None = None) -> None:
    """Store ``value`` (broadcast to t's shape, cast to t's dtype) into t's memory, in place. With
    ``value_view`` (a :func:`geometry`), ``value`` is a buffer's array and the view of it is stored."""
    buf = buffer_of(t)
    if type(value) is not _ARRAY and type(value) is not fusion.Lazy:
        value = jnp.asarray(value)
    where = geometry(t, buf)
    shape, strides = where[1], where[2]
    whole = t.dtype == buf.dtype and _is_whole(t, buf)
    if not whole:
        if 0 in shape:
            return
        if _writes_an_element_twice(shape, strides):
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to a single "
                "memory location. Please clone() the tensor before performing the operation."
            )
    # the buffer takes the value itself: the whole buffer, its shape and dtype, no lazy conj/neg bits
    as_is = (value_view is None and whole and value.shape == shape and value.dtype == dtypes.to_jax(t.dtype)
             and not (where[5] or where[6]))
    if fusion.active():
        if value_view is not None:
            value = fusion.apply(view_value, value, *value_view)
        previous = buf.array
        if as_is:
            new = value
        else:
            new = fusion.apply(written, None if whole else stored(buf), value, *where)
        fusion.note_write(buf, previous)
        buf.array = new
        return
    if type(value) is fusion.Lazy and (value.value is not None or value.producer is None):
        value = fusion.resolve(value)  # only a deferred call's (compile_ahead.py) stays deferred
    if as_is:
        buf.array = value  # a deferred call's result (compile_ahead.py) too: the buffer holds it as it is
        return
    program = _write_program(where, value_view, whole)
    if whole:  # a cast, a broadcast or a view of the value
        buf.array = _run(program, [value])
        return
    array = stored(buf)
    # donated where nothing else holds it (the buffer and `array`): XLA then updates it in place, and
    # writing a slice of a large buffer (a DDP gradient bucket, a KV cache) costs the slice, not a copy
    donate = type(array) is _ARRAY and array is not value and held_only_by(buf, extra=1)
    intent = int(array is not value)  # a deferred array: donated when the write runs if nothing holds it then
    buf.array = _run(program, [array, value], int(donate), intent)


class _Holder:
    __slots__ = ("array",)


def _refcount_of_attribute(holder) -> int:
    return sys.getrefcount(holder.array)


_probe = _Holder()
_probe.array = object()
_SOLE = _refcount_of_attribute(_probe)  # what sys.getrefcount reports for an object one slot holds
del _probe


def held_only_by(buf: DeviceBuffer, extra: int) -> bool:
    """``buf``'s array is referenced by ``buf`` and ``extra`` references the caller knows of, nothing
    else (not another buffer sharing it after a clone, a Python variable, a fused segment, a cache):
    donating it to a program cannot be seen."""
    return _refcount_of_attribute(buf) == _SOLE + extra


@functools.lru_cache(maxsize=4096)
def _write_program(where: tuple, value_view: tuple | None, whole: bool) -> op_jit.Program:
    """A write (through a view, or a cast or broadcast of the value; of a view of a buffer's array
    with ``value_view``) as one program: of the value alone where it replaces the whole buffer."""
    run = functools.partial(_write_whole if whole else _write_at, where, value_view)
    return op_jit.Program(run, run)


def _write_at(where: tuple, value_view: tuple | None, array, value):
    return written(array, value if value_view is None else view_value(value, *value_view), *where)


def _write_whole(where: tuple, value_view: tuple | None, value):
    return _write_at(where, value_view, None, value)


def simply_writable(t: torch.Tensor, buf: DeviceBuffer) -> bool:
    """:func:`write` would store into ``t`` without raising (no element written twice through an
    expanded dim) and there is something to write: what a planned in-place op may assume."""
    shape = tuple(t.shape)
    return 0 not in shape and not _writes_an_element_twice(shape, t.stride())


def _writes_an_element_twice(shape, strides) -> bool:
    """An expanded dim (stride 0, size > 1): several elements of the view are one memory location."""
    return any(st == 0 and sz > 1 for sz, st in zip(shape, strides))


def written(array, value, buf_dtype, shape, strides, offset, dtype, conj, neg) -> jax.Array:
    """The buffer's new array after ``value`` is written through a view (pure, like view_value);
    ``array`` is None when the view is the whole buffer."""
    jt = dtypes.to_jax(dtype)
    if value.dtype != jt:
        value = dtypes.cast(value, jt)
    if value.shape != shape:
        value = jnp.broadcast_to(value, shape)
    if conj or neg:
        value = _lazy_bits(value, conj, neg)
    if array is None:
        return value
    flat = _bitcast(array.reshape(-1), buf_dtype, dtype)
    plan = _dense_plan(shape, strides, offset)
    if plan is not None:
        start, _, order = plan
        kept = sorted(order)
        block = value.reshape([shape[i] for i in kept])
        axes = [kept.index(i) for i in order]  # the view's dim order -> block (memory) order
        if axes != list(range(len(axes))):
            block = jnp.transpose(block, axes)
        flat = jax.lax.dynamic_update_slice(flat, block.reshape(-1), (start,))
    else:
        flat = flat.at[_gather_index(shape, tuple(strides), offset).reshape(-1)].set(value.reshape(-1))
    stored = _bitcast(flat, dtype, buf_dtype)
    numel = array.size
    return (stored if stored.size == numel else stored[:numel]).reshape(array.shape)


def write_pending(t: torch.Tensor, pending) -> bool:
    """Make ``pending`` (a future of t's exact value) t's whole content without waiting for it; False
    (nothing done) unless t covers its whole buffer with the buffer's dtype."""
    buf = buffer_of(t)
    if t.dtype != buf.dtype or not _is_whole(t, buf) or t.is_conj() or t.is_neg():
        return False
    buf.array, buf.pending = None, pending
    return True


def replace_storage(t: torch.Tensor, array: jax.Array | None, shape: Sequence[int]) -> None:
    """Point ``t`` at a fresh buffer (resize_): aliases of the old storage keep the old data."""
    fresh = new_tensor(array, shape, t.dtype)
    _SET_STORAGE.redispatch(_CPU_KEYS, t, fresh.untyped_storage(), 0, tuple(shape), contiguous_strides(tuple(shape)))


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """ATen's is_non_overlapping_and_dense: some permutation of t is contiguous (size-1 dims aside)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def check_no_partial_overlap(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Raise like CPU PyTorch when an in-place write reads memory it partly overwrites
    (same rule as ATen's get_overlap_status: dense tensors on one storage whose ranges intersect)."""
    if dst is src or not dst.numel() or not src.numel() or src.device.type != "tpu":
        return
    if dst.untyped_storage().data_ptr() != src.untyped_storage().data_ptr():
        return
    if not (_non_overlapping_and_dense(dst) and _non_overlapping_and_dense(src)):
        return  # ATen says "too hard" and lets it through
    a0, b0 = dst.storage_offset() * dst.dtype.itemsize, src.storage_offset() * src.dtype.itemsize
    a1, b1 = a0 + dst.numel() * dst.dtype.itemsize, b0 + src.numel() * src.dtype.itemsize
    full = (a0, a1) == (b0, b1) and dst.stride() == src.stride() and dst.dtype.itemsize == src.dtype.itemsize
    if not full and a0 < b1 and b0 < a1:  # x.add_(x.T): the same memory in another order is partial
        raise RuntimeError(
            "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
            "single memory location. Please clone() the tensor before performing the operation."
        )
