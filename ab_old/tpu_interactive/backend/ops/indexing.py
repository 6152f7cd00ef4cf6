"""Indexing: advanced indexing, index_put, gather/scatter, index_* ops, masks (unique, counting,
searching and histograms are in searching.py).

Index tensors are bounds-checked before JAX sees them (one small host sync per op): XLA would clamp
or drop an out-of-range index silently, torch raises, and so do we with torch's message. In a
compiled graph the check is traced in (graph_checks) and raised after the graph runs. The
``_unsafe_*`` variants (used by torch's own decompositions with computed indices) skip the check.
Ops whose output shape depends on the data (nonzero, masked_select, unique, bincount, boolean-mask
indexing) sync once to learn that shape, as on CUDA.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes
from ..registry import lower
from ._common import check_range, jit_static, norm_dim, range_checked

_aten = torch.ops.aten


# ---------------------------------------------------------------- shared helpers
def _oob(dim: int, size: int, prefix: str = ""):
    return lambda i: f"{prefix}index {i} is out of bounds for dimension {dim} with size {size}"


def _in_self(_):
    return "index out of range in self"


def _is_mask(a) -> bool:
    return a is not None and a.dtype in (jnp.bool_, jnp.uint8)


# ---------------------------------------------------------------- advanced indexing
def _check_mask_shape(shape, mask, start: int) -> None:
    for k, size in enumerate(mask.shape):
        if start + k >= len(shape) or shape[start + k] != size:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {k} does not match the shape of the "
                f"indexed tensor {list(shape)} at index {start + k}")


def _expand_masks(shape, indices) -> list:
    """Boolean masks -> one int64 index array per masked dim (torch does the same via nonzero)."""
    out, dim = [], 0
    for idx in indices:
        if _is_mask(idx):
            if idx.ndim == 0:
                raise NotImplementedError("indexing a tpu tensor with a 0-dim boolean tensor is not supported; "
                                          "use x[None] or x[:0]")
            _check_mask_shape(shape, idx, dim)
            out.extend(jnp.nonzero(idx))
            dim += idx.ndim
        else:
            out.append(idx)
            dim += 1
    return out


def _check_indices(shape, indices) -> None:
    for dim, idx in enumerate(indices):
        if idx is not None and dim < len(shape):
            check_range(idx, shape[dim], _oob(dim, shape[dim]), negative=True)


def _split_key(indices):
    """(index arrays, static pattern of which positions hold one) for the jitted kernels."""
    return [i for i in indices if i is not None], tuple(i is not None for i in indices)


def _key(arrays, pattern) -> tuple:
    it = iter(arrays)
    return tuple(next(it) if p else slice(None) for p in pattern)


@jit_static("pattern")
def _take_key(self, arrays, pattern):
    return self[_key(arrays, pattern)]


def _accumulate(ref, values, dtype):
    """``ref.add(values)``; for bool, torch's add is logical or (jax has no bool add)."""
    return ref.max(values) if dtype == jnp.bool_ else ref.add(values)


@jit_static("pattern", "accumulate")
def _put_key(self, arrays, values, pattern, accumulate):
    ref = self.at[_key(arrays, pattern)]
    return _accumulate(ref, values, self.dtype) if accumulate else ref.set(values)


def _signature(a):
    return tuple(a.shape), a.dtype


@functools.lru_cache(maxsize=1024)
def _index_meta_shape(self_sig, index_sigs) -> tuple:
    """torch's own validation (too many indices, index dtypes, broadcasting) and result shape;
    CPU raises these as IndexError, the meta kernel as RuntimeError."""
    def meta(sig):
        return torch.empty(sig[0], dtype=dtypes.to_torch(sig[1]), device="meta")

    try:
        return tuple(_aten.index.Tensor(meta(self_sig), [None if s is None else meta(s) for s in index_sigs]).shape)
    except RuntimeError as exc:
        raise IndexError(str(exc).split("\n")[0]) from None


def _into_empty_dims(shape, indices) -> list:
    """The indices into dimensions of size 0 (any index there is out of range), others None."""
    return [i if i is not None and d < len(shape) and shape[d] == 0 else None for d, i in enumerate(indices)]


def _index(self, indices, safe: bool):
    indices = _expand_masks(self.shape, indices)
    expected = _index_meta_shape(_signature(self), tuple(None if i is None else _signature(i) for i in indices))
    if safe:  # CPU checks indices per result element; an empty result checks only size-0 dims
        _check_indices(self.shape, indices if math.prod(expected) else _into_empty_dims(self.shape, indices))
    result = _take_key(self, *_split_key(indices))
    assert result.shape == tuple(expected), (result.shape, expected)
    return result


@lower("index.Tensor", "index.Tensor_hacked_twin", meta=False, allow_cpu_tensors=True)
def index(self, indices):
    return _index(self, indices, safe=True)


@lower("_unsafe_index.Tensor", "_unsafe_index.Tensor_hacked_twin", meta=False, allow_cpu_tensors=True)
def unsafe_index(self, indices):
    return _index(self, indices, safe=False)


def _mask_put(self, indices, values, accumulate: bool):
    """``x[..., mask, ...] = v`` without a sync when v does not depend on the number of hits."""
    masks = [(p, i) for p, i in enumerate(indices) if i is not None]
    if len(masks) != 1 or not _is_mask(masks[0][1]) or masks[0][1].ndim == 0:
        return None
    start, mask = masks[0]
    _check_mask_shape(self.shape, mask, start)
    trailing = self.shape[start + mask.ndim:]
    hit_dim = values.ndim - 1 - len(trailing)  # where the "number of hits" dim of the result is
    if hit_dim >= 0 and values.shape[hit_dim] != 1:
        return None
    return _where_put(self, mask, values, start, accumulate)


@jit_static("start", "accumulate")
def _where_put(self, mask, values, start, accumulate):
    prefix, trailing = self.shape[:start], self.shape[start + mask.ndim:]
    value = jnp.broadcast_to(values, prefix + (1,) + trailing).reshape(prefix + (1,) * mask.ndim + trailing)
    where = mask.astype(bool).reshape((1,) * start + mask.shape + (1,) * len(trailing))
    added = (jnp.logical_or(self, value) if self.dtype == jnp.bool_ else self + value) if accumulate else value
    return jnp.where(where, added, self)


def _check_values_fit(values_shape: tuple, result_shape: tuple) -> None:
    """index_put's values must expand to the indexing result (CPU's words, with the real hit count)."""
    if len(values_shape) > len(result_shape) or any(v not in (1, r) for v, r in zip(values_shape[::-1],
                                                                                  result_shape[::-1])):
        raise RuntimeError(f"shape mismatch: value tensor of shape [{', '.join(map(str, values_shape))}] cannot be "
                           f"broadcast to indexing result of shape [{', '.join(map(str, result_shape))}]")


def _scalar_type_name(dtype) -> str:
    return torch.empty((), dtype=dtypes.to_torch(dtype)).type()[len("torch."):-len("Tensor")]


def _index_put(self, indices, values, accumulate, safe: bool):
    if values.dtype != self.dtype:  # torch's meta kernel does not check this, CPU does
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{_scalar_type_name(self.dtype)} for the destination and "
                           f"{_scalar_type_name(values.dtype)} for the source.")
    fast = _mask_put(self, indices, values, accumulate)
    if fast is not None:
        return fast
    masked = any(_is_mask(i) for i in indices)
    indices = _expand_masks(self.shape, indices)
    if masked:  # the hit count is known now: CPU's check (the meta kernel and a zeros replay cannot count)
        _check_values_fit(values.shape, _index_meta_shape(
            _signature(self), tuple(None if i is None else _signature(i) for i in indices)))
    if safe:  # CPU checks per written element; an empty selection checks only size-0 dims
        empty = not self.size and not math.prod(_index_meta_shape(
            _signature(self), tuple(None if i is None else _signature(i) for i in indices)))
        _check_indices(self.shape, _into_empty_dims(self.shape, indices) if empty else indices)
    arrays, pattern = _split_key(indices)
    return _put_key(self, arrays, values, pattern, accumulate)


@lower("index_put", "index_put.hacked_twin", allow_cpu_tensors=True)
def index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate, safe=True)


@lower("_index_put_impl", allow_cpu_tensors=True)
def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return _index_put(self, indices, values, accumulate, safe=True)


@lower("_unsafe_index_put", "_unsafe_index_put.hacked_twin", allow_cpu_tensors=True)
def unsafe_index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate, safe=False)


# ---------------------------------------------------------------- gather / scatter
def _gather_key(index, dim: int) -> tuple:
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def _prefix(src, shape) -> jax.Array:
    """The leading ``shape`` block of ``src`` (torch uses only index.shape elements of src/self)."""
    return src[tuple(slice(0, n) for n in shape)]


def _check_gather_index(self, dim, index) -> None:
    size = self.shape[dim] if self.ndim else 1
    check_range(index, size, _oob(dim, size), negative=False, error=RuntimeError)


@lower("gather")
def gather(self, dim, index, sparse_grad=False):
    if self.ndim == 0:
        self = self.reshape(1)
    if index.size == 0:  # torch allows an empty index of any rank
        return jnp.zeros(index.shape, self.dtype)
    index2 = index.reshape(1) if index.ndim == 0 else index
    dim = norm_dim(dim, self.ndim)
    _check_gather_index(self, dim, index2)
    return _gather(self, index2, dim).reshape(index.shape)


@jit_static("dim")
def _gather(self, index, dim):
    return self[_gather_key(index, dim)]


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


def _identity(reduce: str, dtype):
    if reduce in _IDENTITY:
        return jnp.asarray(_IDENTITY[reduce], dtype)
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype)
    big = jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else info.max
    small = -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else info.min
    if dtype == jnp.bool_:
        big, small = True, False
    return jnp.asarray(small if reduce == "amax" else big, dtype)


_AT_REDUCE = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "max", "amin": "min"}
_LEGACY_REDUCE = {"add": "sum", "multiply": "prod"}


def _reduce_into(self, key, src, reduce: str, include_self: bool = True):
    """self with src reduced into positions ``key`` (torch's scatter_reduce/index_reduce semantics)."""
    src = src.astype(self.dtype)
    touched = None
    base = self
    if not include_self or reduce == "mean":
        touched = jnp.zeros(self.shape, bool).at[key].set(True)
    if not include_self:
        base = jnp.where(touched, _identity(reduce, self.dtype), self)
    op = "max" if reduce in ("sum", "mean") and self.dtype == jnp.bool_ else _AT_REDUCE[reduce]
    out = getattr(base.at[key], op)(src)
    if reduce != "mean":
        return out
    counts = jnp.zeros(self.shape, jnp.int64).at[key].add(1)
    counts = jnp.where(touched, counts + int(include_self), 1)
    if jnp.issubdtype(self.dtype, jnp.integer):
        return jnp.floor_divide(out, counts.astype(self.dtype))
    return (out / counts.astype(self.dtype)).astype(self.dtype)


def _scatter(self, dim, index, src, reduce: str | None, include_self=True):
    if self.ndim == 0:
        return _scatter(self.reshape(1), 0, index.reshape(-1), jnp.reshape(src, -1)[:1] if jnp.ndim(src) else src,
                        reduce, include_self).reshape(())
    dim = norm_dim(dim, self.ndim)
    if index.ndim == 0:
        index = index.reshape((1,) * self.ndim)
    _check_gather_index(self, dim, index)
    if reduce is not None and reduce not in _AT_REDUCE:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _scatter_core(self, index, jnp.asarray(src), dim, reduce, include_self)


@jit_static("dim", "reduce", "include_self")
def _scatter_core(self, index, src, dim, reduce, include_self):
    src = jnp.broadcast_to(src, index.shape) if src.ndim == 0 else _prefix(src, index.shape)
    key = _gather_key(index, dim)
    if reduce is None:
        return self.at[key].set(src.astype(self.dtype))
    return _reduce_into(self, key, src, reduce, include_self)


def _legacy(reduce: str) -> str:
    if reduce not in _LEGACY_REDUCE:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    return _LEGACY_REDUCE[reduce]


@lower("scatter.src")
def scatter_src(self, dim, index, src):
    return _scatter(self, dim, index, src, None)


@lower("scatter.value")
def scatter_value(self, dim, index, value):
    return _scatter(self, dim, index, jnp.asarray(value, self.dtype), None)


@lower("scatter.reduce")
def scatter_src_reduce(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, _legacy(reduce))


@lower("scatter.value_reduce")
def scatter_value_reduce(self, dim, index, value, *, reduce):
    return _scatter(self, dim, index, jnp.asarray(value, self.dtype), _legacy(reduce))


@lower("scatter_add")
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "sum")


@lower("scatter_reduce.two")
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    return _scatter(self, dim, index, src, reduce, include_self)


# ---------------------------------------------------------------- index_* along one dim
def _dim_key(ndim: int, dim: int, index) -> tuple:
    return (slice(None),) * dim + (index,)


def _axis(self, dim) -> tuple[int, int]:
    """The normalised dim (0-dim self acts as 1-d) and its size, from the shape alone (no array work outside a program)."""
    shape = self.shape or (1,)
    dim = norm_dim(dim, len(shape))
    return dim, shape[dim]


def _along(self, dim, index, source=None):
    """Normalised (self, dim, 1-d index, source) for the index_* family (0-dim self acts as 1-d)."""
    self1 = self.reshape(1) if self.ndim == 0 else self
    dim, _ = _axis(self, dim)
    index = index.reshape(-1)
    if source is not None and jnp.ndim(source):
        shape = list(self1.shape)
        shape[dim] = index.shape[0]
        source = jnp.reshape(source, shape)
    return self1, dim, index, source


@jit_static("dim", "kind", "include_self")
def _update_along(self, index, source, dim, kind, include_self=True):
    """self with ``source`` put/added/reduced at positions ``index`` of dimension ``dim``."""
    key = _dim_key(self.ndim, dim, index)
    if kind == "set":
        return self.at[key].set(jnp.asarray(source).astype(self.dtype))
    if kind == "add":
        return _accumulate(self.at[key], source.astype(self.dtype), self.dtype)
    return _reduce_into(self, key, source, kind, include_self)


@lower("index_select", needs_spec=True)
def index_select(self, dim, index, *, spec):
    dim, size = _axis(self, dim)
    if index.ndim > 1:  # CPU's check (torch's meta kernel takes a 2-d index's elements)
        raise IndexError("index_select(): Index is supposed to be a vector")
    if self.ndim > 1 and index.size and self.size == 0:  # CPU's checks (and words) for an empty self
        if size == 0:
            raise RuntimeError("index_select(): self indexing axis dim should be positive")
        ids = np.asarray(index).reshape(-1)
        bad = ids[(ids < 0) | (ids >= size)]
        if bad.size:
            raise RuntimeError(f"INDICES element is out of DATA bounds, id={bad[0]} axis_dim={size}")
    # plain eager: the check and the rows as one program, then one sync (were two programs)
    return range_checked(_selected, (self, index), index, size, _in_self, negative=False,
                         static=(dim, spec.shape()))


def _selected(self, index, dim, shape):
    self1, dim, index1, _ = _along(self, dim, index)
    return jnp.take(self1, index1, axis=dim).reshape(shape)


def _check_source_shape(self, dim: int, source) -> None:
    """torch's C++ meta check for index_add/index_reduce (its Python meta, which we run, lacks it):
    source's shape is self's but along ``dim``, both compared whole when either is 0-dim."""
    self_sizes, source_sizes = list(self.shape), list(jnp.shape(source))
    if self_sizes and source_sizes:
        del self_sizes[dim], source_sizes[dim]
    if self_sizes != source_sizes:
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(self.shape)} source.shape = {list(jnp.shape(source))}")


def _index_func_checks(name: str, self, dim: int, index, source) -> None:
    """The checks torch's C++ meta kernel of index_add/index_reduce makes on the shapes, in its words
    (index_reduce's Python meta, which we run, makes none)."""
    if index.ndim > 1:
        raise IndexError(f"{name}_(): Index is supposed to be a vector, but got dim: {index.ndim} with type: "
                         f"{dtypes.scalar_name(dtypes.to_torch(index.dtype))} and size: "
                         f"{list(index.shape)}")
    if dim != 0 and dim >= source.ndim:
        raise RuntimeError(f"{name}_(): Indexing dim {dim} is out of bounds of the source tensor with dim "
                           f"{source.ndim}")
    if index.size != (source.shape[dim] if source.ndim else 1):
        if not source.ndim:  # torch's message reads source.size(dim) of a 0-dim source: that raises instead
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        raise RuntimeError(f"{name}_(): Number of indices ({index.size}) should be equal to source.size(dim): "
                           f"({source.shape[dim]}), for dim: {dim}")
    _check_source_shape(self, dim, source)


@lower("index_add")
def index_add(self, dim, index, source, *, alpha=1):
    dim, size = _axis(self, dim)
    _index_func_checks("index_add", self, dim, index, source)
    if _index_add_scatters(self, dim, index, source, alpha):  # CPU's words for a bad index follow its kernel
        message, error = _oob(dim, size), RuntimeError
    else:
        message, error = _in_self, IndexError
    return range_checked(_updated, (self, index, source), index, size, message, negative=False, error=error,
                         static=(dim, "add", alpha))


def _index_add_scatters(self, dim: int, index, source, alpha) -> bool:
    """Whether CPU's index_add runs as scatter_add (its fast path for an outer or inner dim, alpha 1, int64
    indices and a source shaped as self but along dim), which words a bad index as scatter does."""
    shape, src_shape = list(self.shape), list(jnp.shape(source))
    if len(shape) < 2 or dim not in (0, len(shape) - 1) or alpha != 1 or index.dtype != jnp.int64:
        return False
    if len(src_shape) != len(shape) or not self.size:
        return False
    del shape[dim], src_shape[dim]
    return shape == src_shape


@lower("index_copy")
def index_copy(self, dim, index, source):
    dim, size = _axis(self, dim)
    return range_checked(_updated, (self, index, source), index, size, _oob(dim, size, "index_copy_(): "),
                         negative=False, static=(dim, "set", 1))


def _updated(self, index, source, dim, kind, alpha, include_self=True):
    """index_add/index_copy/index_reduce's result (the check aside): ``alpha * source`` added, put or
    reduced at ``index``."""
    self1, dim, index, source = _along(self, dim, index, source)
    if alpha != 1:
        source = source.astype(self.dtype) * jnp.asarray(alpha, self.dtype)
    return _update_along(self1, index, source, dim, kind, include_self).reshape(self.shape)


@lower("index_fill.int_Scalar", "index_fill.int_Tensor")
def index_fill(self, dim, index, value):
    self1, dim, index, _ = _along(self, dim, index)
    size = self1.shape[dim]
    check_range(index, size, _oob(dim, size), negative=True)
    return _update_along(self1, index, jnp.asarray(value).astype(self.dtype), dim, "set").reshape(self.shape)


@lower("index_reduce")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    dim, size = _axis(self, dim)
    _index_func_checks("index_reduce", self, dim, index, source)
    return range_checked(_updated, (self, index, source), index, size, _in_self, negative=False,
                         static=(dim, reduce, 1, include_self))


@lower("take")
def take(self, index):
    flat = self.reshape(-1)
    check_range(index, flat.shape[0],
                lambda i: f"out of range: tried to access index {i} on a tensor of {flat.shape[0]} elements.",
                negative=True)
    return _take_flat(flat, index)


@jax.jit
def _take_flat(flat, index):
    return flat[index]


@jit_static("accumulate")
def _put_flat(self, index, source, accumulate):
    ref = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (_accumulate(ref, source, self.dtype) if accumulate else ref.set(source)).reshape(self.shape)


@lower("put")
def put(self, index, source, accumulate=False):
    if index.size != source.size:  # CPU's check (torch's meta kernel lacks it: a 1-element source was broadcast)
        raise IndexError(f"put_(): Expected source and index to have the same number of elements, but got "
                         f"source.numel() = {source.size}, index.numel() = {index.size}")
    flat = self.reshape(-1)
    check_range(index, flat.shape[0],
                lambda i: f"out of range: tried to access index {i} on a tensor of {flat.shape[0]} elements.",
                negative=True)
    return _put_flat(self, index, source, accumulate)


# ---------------------------------------------------------------- masks
@lower("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self, mask, value):
    return _masked_fill(self, mask, jnp.asarray(value))


@jax.jit
def _masked_fill(self, mask, value):
    return jnp.where(mask, value.astype(self.dtype), self)


def _mask_positions(mask):
    """For a flat mask: the rank of each True element among the Trues (0-based)."""
    return jnp.cumsum(mask.astype(jnp.int64)) - 1


@lower("masked_scatter")
def masked_scatter(self, mask, source):
    if mask.dtype != jnp.bool_:
        raise RuntimeError("masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{dtypes.scalar_name(dtypes.to_torch(mask.dtype))}")
    shape = jnp.broadcast_shapes(self.shape, mask.shape)  # the functional op broadcasts self and mask
    self, mask = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape).reshape(-1)
    flat_source = source.reshape(-1)
    if flat_source.shape[0] < mask.shape[0] and int(jnp.sum(mask)) > flat_source.shape[0]:
        raise RuntimeError("Number of elements of source < number of ones in mask")  # CPU's words
    if flat_source.shape[0] == 0:
        return self
    return _masked_scatter(self, mask, flat_source)


@jax.jit
def _masked_scatter(self, mask, flat_source):
    picked = flat_source[jnp.clip(_mask_positions(mask), 0, flat_source.shape[0] - 1)]
    return jnp.where(mask, picked.astype(self.dtype), self.reshape(-1)).reshape(self.shape)


@lower("masked_scatter_backward")
def masked_scatter_backward(grad_output, mask, sizes):
    return _masked_scatter_backward(grad_output, mask, tuple(sizes))


@jit_static("sizes")
def _masked_scatter_backward(grad_output, mask, sizes):
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    n = 1
    for s in sizes:
        n *= s
    slot = jnp.where(mask, _mask_positions(mask), n)  # n: dropped
    out = jnp.zeros((n,), grad_output.dtype).at[slot].add(grad_output.reshape(-1), mode="drop")
    return out.reshape(tuple(sizes))


@lower("masked_select", meta=False)
def masked_select(self, mask):
    if mask.dtype != jnp.bool_:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {dtypes.to_torch(mask.dtype)}")
    self, mask = jnp.broadcast_arrays(self, mask)
    return self[mask] if self.ndim else self.reshape(1)[mask.reshape(1)]


@lower("nonzero", meta=False, out_dtype=lambda a: torch.int64)
def nonzero(self):
    return jnp.argwhere(self).astype(jnp.int64)


@lower("nonzero_static", needs_spec=True)
def nonzero_static(self, *, size, fill_value=-1, spec):
    if not self.size:  # jnp.argwhere leaves zeros, not fill_value, when the input is empty
        return jnp.full(spec.shape(), fill_value, jnp.int64)
    return jnp.argwhere(self, size=size, fill_value=fill_value).astype(jnp.int64).reshape(spec.shape())
