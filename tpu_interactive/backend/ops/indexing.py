"""Indexing: advanced indexing, index_put, gather/scatter, index_* ops, masks, unique, search.

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

from .. import dtypes, graph_checks
from ..dispatch import current_spec
from ..registry import lower

_aten = torch.ops.aten


def _jit(*static: str):
    """jax.jit with static (python) arguments: one fused program instead of many eager jnp calls
    (eager advanced indexing costs milliseconds of Python per call; jitted, microseconds)."""
    return functools.partial(jax.jit, static_argnames=static)


# ---------------------------------------------------------------- shared helpers
def _out_shape() -> tuple[int, ...]:
    """Torch's output shape (from the meta kernel) of the op being lowered."""
    out = current_spec().outputs
    return (out[0] if isinstance(out, tuple) else out).shape


def _norm_dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1) if ndim else 0


@jax.jit
def _first_out_of_range(index, lo, hi):
    flat = index.reshape(-1)
    bad = (flat < lo) | (flat >= hi)
    return jnp.any(bad), flat[jnp.argmax(bad)]


def _check_range(index, size: int, message, *, negative: bool, error=IndexError) -> None:
    """Raise ``error(message(bad_index))`` if some index is outside [-size or 0, size)."""
    if index is None or index.size == 0:
        return
    lo = -size if negative else 0
    any_bad, first = _first_out_of_range(index, lo, size)
    if graph_checks.is_traced(any_bad):  # inside a compiled graph: raised when the graph runs
        graph_checks.check_in_graph(any_bad, first, error, message)
        return
    any_bad, first = jax.device_get((any_bad, first))
    if any_bad:
        raise error(message(int(first)))


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
            _check_range(idx, shape[dim], _oob(dim, shape[dim]), negative=True)


def _split_key(indices):
    """(index arrays, static pattern of which positions hold one) for the jitted kernels."""
    return [i for i in indices if i is not None], tuple(i is not None for i in indices)


def _key(arrays, pattern) -> tuple:
    it = iter(arrays)
    return tuple(next(it) if p else slice(None) for p in pattern)


@_jit("pattern")
def _take_key(self, arrays, pattern):
    return self[_key(arrays, pattern)]


def _accumulate(ref, values, dtype):
    """``ref.add(values)``; for bool, torch's add is logical or (jax has no bool add)."""
    return ref.max(values) if dtype == jnp.bool_ else ref.add(values)


@_jit("pattern", "accumulate")
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


@_jit("start", "accumulate")
def _where_put(self, mask, values, start, accumulate):
    prefix, trailing = self.shape[:start], self.shape[start + mask.ndim:]
    value = jnp.broadcast_to(values, prefix + (1,) + trailing).reshape(prefix + (1,) * mask.ndim + trailing)
    where = mask.astype(bool).reshape((1,) * start + mask.shape + (1,) * len(trailing))
    added = (jnp.logical_or(self, value) if self.dtype == jnp.bool_ else self + value) if accumulate else value
    return jnp.where(where, added, self)


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
    indices = _expand_masks(self.shape, indices)
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
    _check_range(index, size, _oob(dim, size), negative=False, error=RuntimeError)


@lower("gather")
def gather(self, dim, index, sparse_grad=False):
    if self.ndim == 0:
        self = self.reshape(1)
    if index.size == 0:  # torch allows an empty index of any rank
        return jnp.zeros(index.shape, self.dtype)
    index2 = index.reshape(1) if index.ndim == 0 else index
    dim = _norm_dim(dim, self.ndim)
    _check_gather_index(self, dim, index2)
    return _gather(self, index2, dim).reshape(index.shape)


@_jit("dim")
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
    dim = _norm_dim(dim, self.ndim)
    if index.ndim == 0:
        index = index.reshape((1,) * self.ndim)
    _check_gather_index(self, dim, index)
    if reduce is not None and reduce not in _AT_REDUCE:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _scatter_core(self, index, jnp.asarray(src), dim, reduce, include_self)


@_jit("dim", "reduce", "include_self")
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


def _along(self, dim, index, source=None):
    """Normalised (self, dim, 1-d index, source) for the index_* family (0-dim self acts as 1-d)."""
    self1 = self.reshape(1) if self.ndim == 0 else self
    dim = _norm_dim(dim, self1.ndim)
    index = index.reshape(-1)
    if source is not None and jnp.ndim(source):
        shape = list(self1.shape)
        shape[dim] = index.shape[0]
        source = jnp.reshape(source, shape)
    return self1, dim, index, source


@_jit("dim")
def _take_along(self, index, dim):
    return jnp.take(self, index, axis=dim)


@_jit("dim", "kind", "include_self")
def _update_along(self, index, source, dim, kind, include_self=True):
    """self with ``source`` put/added/reduced at positions ``index`` of dimension ``dim``."""
    key = _dim_key(self.ndim, dim, index)
    if kind == "set":
        return self.at[key].set(jnp.asarray(source).astype(self.dtype))
    if kind == "add":
        return _accumulate(self.at[key], source.astype(self.dtype), self.dtype)
    return _reduce_into(self, key, source, kind, include_self)


@lower("index_select")
def index_select(self, dim, index):
    self1, dim, index1, _ = _along(self, dim, index)
    if self.ndim > 1 and index1.size and self.size == 0:  # CPU's checks (and words) for an empty self
        if self1.shape[dim] == 0:
            raise RuntimeError("index_select(): self indexing axis dim should be positive")
        ids = np.asarray(index1).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self1.shape[dim])]
        if bad.size:
            raise RuntimeError(f"INDICES element is out of DATA bounds, id={bad[0]} axis_dim={self1.shape[dim]}")
    _check_range(index1, self1.shape[dim], _in_self, negative=False)
    return _take_along(self1, index1, dim).reshape(_out_shape())


@lower("index_add")
def index_add(self, dim, index, source, *, alpha=1):
    self1, dim, index, source = _along(self, dim, index, source)
    _check_range(index, self1.shape[dim], _in_self, negative=False)
    if alpha != 1:
        source = source.astype(self.dtype) * jnp.asarray(alpha, self.dtype)
    return _update_along(self1, index, source, dim, "add").reshape(self.shape)


@lower("index_copy")
def index_copy(self, dim, index, source):
    self1, dim, index, source = _along(self, dim, index, source)
    size = self1.shape[dim]
    _check_range(index, size, _oob(dim, size, "index_copy_(): "), negative=False)
    return _update_along(self1, index, source, dim, "set").reshape(self.shape)


@lower("index_fill.int_Scalar", "index_fill.int_Tensor")
def index_fill(self, dim, index, value):
    self1, dim, index, _ = _along(self, dim, index)
    size = self1.shape[dim]
    _check_range(index, size, _oob(dim, size, "index_fill_(): "), negative=True)
    return _update_along(self1, index, jnp.asarray(value).astype(self.dtype), dim, "set").reshape(self.shape)


@lower("index_reduce")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    self1, dim, index, source = _along(self, dim, index, source)
    _check_range(index, self1.shape[dim], _in_self, negative=False)
    return _update_along(self1, index, source, dim, reduce, include_self).reshape(self.shape)


@lower("take")
def take(self, index):
    flat = self.reshape(-1)
    _check_range(index, flat.shape[0],
                 lambda i: f"out of range: tried to access index {i} on a tensor of {flat.shape[0]} elements.",
                 negative=True)
    return _take_flat(flat, index)


@jax.jit
def _take_flat(flat, index):
    return flat[index]


@_jit("accumulate")
def _put_flat(self, index, source, accumulate):
    ref = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (_accumulate(ref, source, self.dtype) if accumulate else ref.set(source)).reshape(self.shape)


@lower("put")
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    _check_range(index, flat.shape[0],
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
        raise RuntimeError("masked_scatter: expected source to have at least as many elements as ones in mask")
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


@_jit("sizes")
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


@lower("nonzero_static")
def nonzero_static(self, *, size, fill_value=-1):
    return jnp.argwhere(self, size=size, fill_value=fill_value).astype(jnp.int64).reshape(_out_shape())


# ---------------------------------------------------------------- unique / counting / searching
def _empty_long():
    return jnp.zeros((0,), jnp.int64)


@lower("_unique2", meta=False)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    inverse = inverse.reshape(self.shape).astype(jnp.int64) if return_inverse else _empty_long()
    return values, inverse, counts.astype(jnp.int64) if return_counts else _empty_long()


@lower("_unique", meta=False)
def unique_legacy(self, sorted=True, return_inverse=False):
    values, inverse, _ = unique2(self, sorted, return_inverse, False)
    return values, inverse


@lower("unique_dim", meta=False)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    dim = _norm_dim(dim, self.ndim)
    if self.shape[dim] == 0:
        return self, _empty_long(), _empty_long()
    values, inverse, counts = jnp.unique(self, axis=dim, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1).astype(jnp.int64) if return_inverse else _empty_long()
    return values, inverse, counts.astype(jnp.int64) if return_counts else _empty_long()


def _consecutive(self, dim, return_inverse, return_counts):
    """unique_consecutive along ``dim`` (None: flattened)."""
    x = self.reshape(-1) if dim is None else jnp.moveaxis(self, _norm_dim(dim, self.ndim), 0)
    n = x.shape[0]
    if n == 0:
        return self.reshape(-1) if dim is None else self, _empty_long(), _empty_long()
    # explicit row size: reshape can't infer -1 for a single element (n - 1 == 0)
    changed = jnp.any((x[1:] != x[:-1]).reshape(n - 1, math.prod(x.shape[1:])), axis=1)
    starts = jnp.concatenate([jnp.ones((1,), bool), changed])
    first = jnp.nonzero(starts)[0]
    values = x[first]
    if dim is not None:
        values = jnp.moveaxis(values, 0, _norm_dim(dim, self.ndim))
    inverse = jnp.cumsum(starts.astype(jnp.int64)) - 1
    inverse = (inverse.reshape(self.shape) if dim is None else inverse) if return_inverse else _empty_long()
    counts = jnp.diff(jnp.append(first, n)).astype(jnp.int64) if return_counts else _empty_long()
    return values, inverse, counts


@lower("unique_consecutive", meta=False)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    return _consecutive(self, dim, return_inverse, return_counts)


@lower("unique_dim_consecutive", meta=False)
def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    return _consecutive(self, dim, return_inverse, return_counts)


@lower("bincount", meta=False)
def bincount(self, weights=None, minlength=0):
    if self.ndim != 1 or not jnp.issubdtype(self.dtype, jnp.integer):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = minlength
    if self.size:
        lo, hi = (int(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(minlength, hi + 1)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), dtype).at[self].add(weights.astype(dtype))


@_jit("side")
def _search(seq, values, side: str):
    if seq.ndim == 1:
        return jnp.searchsorted(seq, values, side=side)
    lead = seq.shape[:-1]
    seq2 = seq.reshape(-1, seq.shape[-1])
    val2 = values.reshape(seq2.shape[0], -1)
    found = jax.vmap(functools.partial(jnp.searchsorted, side=side))(seq2, val2)
    return found.reshape(lead + values.shape[len(lead):])


def _side(right: bool, side: str | None) -> str:
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    return side or ("right" if right else "left")


@lower("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    values = jnp.asarray(self)
    common = jnp.promote_types(sorted_sequence.dtype, values.dtype)
    return _search(sorted_sequence.astype(common), values.astype(common), _side(right, side))


@lower("bucketize.Tensor", "bucketize.Scalar")
def bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    values = jnp.asarray(self)
    common = jnp.promote_types(boundaries.dtype, values.dtype)
    return _search(boundaries.astype(common), values.astype(common), "right" if right else "left")


@lower("histc")
def histc(self, bins=100, min=0, max=0):
    if not jnp.issubdtype(self.dtype, jnp.floating):
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{dtypes.to_torch(self.dtype)}'")
    if bins <= 0:
        raise RuntimeError("torch.histc(): bins must be > 0, but got {bins} for dimension 0")
    lo, hi = float(min), float(max)
    if lo == hi and self.size:
        lo, hi = (float(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
    if lo > hi:
        raise RuntimeError(f"torch.histc(): max must be larger than min, but got min {lo} max {hi}")
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    return _histc(self.reshape(-1), lo, hi, bins)


@_jit("bins")
def _histc(x, lo, hi, bins):
    lo_t, hi_t = jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)
    pos = ((x - lo_t) * bins / (hi_t - lo_t)).astype(jnp.int64)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (x >= lo_t) & (x <= hi_t)
    return jnp.zeros((bins,), x.dtype).at[jnp.where(inside, pos, bins)].add(1, mode="drop")


@lower("repeat_interleave.Tensor", meta=False, out_dtype=lambda a: torch.int64)
def repeat_interleave(repeats, *, output_size=None):
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.size and int(jnp.min(repeats)) < 0:
        raise RuntimeError("repeats can not be negative")
    total = int(jnp.sum(repeats)) if output_size is None else output_size
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats, total_repeat_length=total)


# ---------------------------------------------------------------- histogram (ATen histogramdd semantics, 1-D)
def _histogram(x, edges, weight, density):
    """Counts of x in [edges[i], edges[i+1]) (the last bin closed); values outside are dropped."""
    flat = x.reshape(-1)
    n = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, flat, side="right") - 1  # ATen: upper_bound - 1
    pos = jnp.where(pos == n, n - 1, pos)
    inside = (flat >= edges[0]) & (flat <= edges[-1])  # NaN is outside
    w = jnp.ones_like(flat) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((n,), x.dtype).at[jnp.where(inside, pos, n)].add(w, mode="drop")
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist


def _check_histogram(x, weight, op="torch.histogram"):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError(f"{op}: input tensor and bins tensors should have the same dtype, but got a "
                           f"non-floating input of dtype {dtypes.to_torch(x.dtype)}")
    if weight is not None and weight.shape != x.shape:
        raise RuntimeError(f"{op}: if weight tensor is provided it should have the same shape as the input tensor")


@lower("histogram.bins_tensor", meta=False)  # no meta kernels for histogram
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    _check_histogram(self, weight)
    if bins.ndim != 1 or bins.shape[0] < 1:
        raise RuntimeError("torch.histogram: bins tensor should have one dimension and at least 1 element")
    if bins.shape[0] == 1:
        return jnp.zeros((0,), self.dtype), bins
    return _histogram(self, bins.astype(self.dtype), weight, density), bins


@lower("histogram.bin_ct", meta=False)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    _check_histogram(self, weight)
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if range is not None:
        lo, hi = float(range[0]), float(range[1])
    elif self.size:  # one host sync: the edges are shapes' worth of static values
        lo, hi = (float(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
    else:
        lo, hi = 0.0, 1.0  # ATen: an empty input without range gets [0, 1]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(f"torch.histogramdd: dimension 0's range [{lo}, {hi}] is not finite")
    if lo > hi:
        raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {lo} max {hi} for dimension 0")
    if lo == hi:  # numpy's behaviour, and no division by zero in density
        lo, hi = lo - 0.5, hi + 0.5
    # the edges are a few static values: torch's own CPU linspace gives CPU's exact roundings
    edges = torch.linspace(lo, hi, bins + 1, dtype=dtypes.to_torch(self.dtype))
    edges = jnp.asarray(edges.float().numpy() if edges.dtype == torch.bfloat16 else edges.numpy()).astype(self.dtype)
    return _histogram(self, edges, weight, density), edges
