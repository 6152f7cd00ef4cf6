"""Graph-only lowerings: functional views, copies, factories, random ops and symbolic sizes.

Eager runs these ops as ``raw`` lowerings on torch tensors (views alias storage); inside a compiled
graph they are pure functions of jax values, registered here with ``@functional``. A random op says
so (``random=True``): a graph containing one draws a fresh key per call (graph.py).
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import torch

from .. import dtypes, storage
from ..ops._common import compute_dtype
from ..registry import op_key

_aten = torch.ops.aten
FUNCTIONAL: dict[str, Callable] = {}  # "op.overload" -> fn(ctx, *args, **kwargs): graph-only lowerings
RANDOM: set[str] = set()  # the ops of FUNCTIONAL that draw from the graph's key


def functional(*names: str, random: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn(ctx, *args, **kwargs)`` as the graph form of the aten ops ``names`` ("op" means
    "op.default"); ``random``: it draws from ``ctx.key()``."""
    def register(fn):
        for name in names:
            key = name if "." in name else name + ".default"
            FUNCTIONAL[key] = fn
            if random:
                RANDOM.add(key)
        return fn

    return register


def qualified(op) -> str:
    key = op_key(op)
    return key if "::" in key else f"aten::{key}"


class GraphContext:
    """What a lowering may need while the graph is traced: the node's torch metadata and the key."""

    def __init__(self, rng_key, pallas: bool):
        self.rng_key, self.pallas = rng_key, pallas
        self.node = None
        self.index = 0

    def key(self):
        return jax.random.fold_in(self.rng_key, self.index)

    @property
    def val(self):
        return self.node.meta.get("val")

    def dtype(self, i: int = 0) -> torch.dtype:
        val = self.val
        if isinstance(val, (list, tuple)):
            val = val[i]
        return val.dtype

    def jdtype(self, i: int = 0):
        return dtypes.to_jax(self.dtype(i))


# ---------------------------------------------------------------- functional views and copies
def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@functional("view", "_unsafe_view", "reshape", "_reshape_alias", "view_copy", "_unsafe_view_copy")
def _view(ctx, x, size, *stride):
    return jnp.reshape(x, tuple(int(s) for s in size))


@functional("t", "numpy_T", "permute_copy", "t_copy")
def _t(ctx, x, *dims):
    if dims:
        return jnp.transpose(x, [_dim(d, x.ndim) for d in dims[0]])
    return x.T if x.ndim == 2 else x


@functional("transpose.int", "transpose_copy.int")
def _transpose(ctx, x, d0, d1):
    return jnp.swapaxes(x, d0, d1) if x.ndim else x


@functional("permute")
def _permute(ctx, x, dims):
    return jnp.transpose(x, [_dim(d, x.ndim) for d in dims])


@functional("expand", "expand_copy")
def _expand(ctx, x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@functional("unsqueeze", "unsqueeze_copy")
def _unsqueeze(ctx, x, d):
    return jnp.expand_dims(x, _dim(d, x.ndim + 1))


@functional("squeeze", "squeeze.dim", "squeeze.dims", "squeeze_copy", "squeeze_copy.dim", "squeeze_copy.dims")
def _squeeze(ctx, x, dims=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(d for d in (_dim(d, x.ndim) for d in dims) if x.shape[d] == 1)
    return jnp.squeeze(x, axes) if axes else x


@functional("slice.Tensor", "slice_copy.Tensor")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    index = [slice(None)] * x.ndim
    index[_dim(dim, x.ndim)] = slice(start, end, step)
    return x[tuple(index)]


@functional("select.int", "select_copy.int")
def _select(ctx, x, dim, index):
    dim = _dim(dim, x.ndim)
    return jax.lax.index_in_dim(x, index + x.shape[dim] if index < 0 else index, dim, keepdims=False)


@functional("split.Tensor", "split_copy.Tensor")
def _split(ctx, x, split_size, dim=0):
    n = x.shape[_dim(dim, x.ndim)]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [0]
    return _split_sizes(ctx, x, sizes or [0], dim)


@functional("split_with_sizes", "split_with_sizes_copy")
def _split_sizes(ctx, x, sizes, dim=0):
    dim, out, start = _dim(dim, x.ndim), [], 0
    for size in sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + size, axis=dim))
        start += size
    return out


@functional("unbind.int", "unbind_copy.int")
def _unbind(ctx, x, dim=0):
    dim = _dim(dim, x.ndim)
    return [jax.lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@functional("as_strided", "as_strided_copy")
def _as_strided(ctx, x, size, stride, storage_offset=None):
    source = ctx.node.args[0].meta.get("val")
    if source is not None and (not source.is_contiguous() or source.storage_offset() != 0):
        raise NotImplementedError("aten::as_strided of a non-contiguous graph value is not supported by "
                                  "the tpu compiler; make the input .contiguous() first")
    index = storage._gather_index(tuple(int(s) for s in size), tuple(int(s) for s in stride), int(storage_offset or 0))
    return x.reshape(-1)[index] if index.size else jnp.zeros(index.shape, x.dtype)


@functional("alias", "detach", "lift_fresh", "lift_fresh_copy", "clone", "alias_copy", "detach_copy",
            "contiguous")
def _identity(ctx, x, *args, **kwargs):
    return x


@functional("_to_copy", "to.dtype", "_to_dtype", "type_as")
def _to_copy(ctx, x, *args, **kwargs):
    return x.astype(ctx.jdtype())


@functional("copy", "copy_")
def _copy(ctx, dst, src, non_blocking=False):
    value = jnp.broadcast_to(src.astype(dst.dtype), dst.shape)
    if ctx.node.target is _aten.copy_.default:
        ctx.mutated[ctx.node.args[0]] = value
    return value


@functional("fill.Scalar", "fill.Tensor")
def _fill(ctx, x, value):
    return jnp.full(x.shape, value, ctx.jdtype())


@functional("zero")
def _zero(ctx, x):
    return jnp.zeros(x.shape, x.dtype)


# ---------------------------------------------------------------- factories
def _shape(size) -> tuple:
    return tuple(int(s) for s in size)


@functional("empty.memory_format", "empty_strided", "zeros", "new_empty", "new_zeros", "new_empty_strided",
            "empty_permuted")
def _zeros(ctx, *args, **kwargs):
    size = args[1] if ctx.node.target.__name__.startswith("new_") else args[0]
    return jnp.zeros(_shape(size), ctx.jdtype())


@functional("ones", "new_ones")
def _ones(ctx, *args, **kwargs):
    size = args[1] if ctx.node.target.__name__.startswith("new_") else args[0]
    return jnp.ones(_shape(size), ctx.jdtype())


@functional("full", "new_full")
def _full(ctx, *args, **kwargs):
    size, value = args[-2:] if ctx.node.target.__name__.startswith("new_") else args[:2]
    return jnp.full(_shape(size), value, ctx.jdtype())


@functional("empty_like", "zeros_like")
def _zeros_like(ctx, x, **kwargs):
    return jnp.zeros(x.shape, ctx.jdtype())


@functional("ones_like")
def _ones_like(ctx, x, **kwargs):
    return jnp.ones(x.shape, ctx.jdtype())


@functional("full_like")
def _full_like(ctx, x, value, **kwargs):
    return jnp.full(x.shape, value, ctx.jdtype())


@functional("scalar_tensor")
def _scalar_tensor(ctx, value, **kwargs):
    return jnp.asarray(value, ctx.jdtype())


@functional("arange", "arange.start", "arange.start_step")
def _arange(ctx, *args, **kwargs):
    n = ctx.val.shape[0]  # torch's own length rule (ceil((end-start)/step))
    start, step = (0, 1) if len(args) < 2 else (args[0], args[2] if len(args) > 2 else 1)
    dtype = ctx.jdtype()
    compute = dtype if not jnp.issubdtype(dtype, jnp.floating) else jnp.float64
    return (start + jnp.arange(int(n), dtype=compute) * step).astype(dtype)


# ---------------------------------------------------------------- randomness (explicit key input)
def _draw(ctx, x_or_size, sample: Callable):
    """``sample(key, shape, compute dtype)`` at the node's shape, cast to its dtype."""
    shape = x_or_size.shape if hasattr(x_or_size, "shape") else _shape(x_or_size)
    dtype = ctx.jdtype()
    return sample(ctx.key(), shape, compute_dtype(dtype)).astype(dtype)


@functional("rand", "rand_like", "uniform", random=True)
def _rand(ctx, x_or_size, low=0.0, high=1.0, **kwargs):
    if ctx.node.target is not _aten.uniform.default:
        low, high = 0.0, 1.0
    return _draw(ctx, x_or_size, lambda key, shape, dt: jax.random.uniform(key, shape, dt, low, high))


@functional("randn", "randn_like", "normal_functional", random=True)
def _randn(ctx, x_or_size, mean=0.0, std=1.0, **kwargs):
    if ctx.node.target is not _aten.normal_functional.default:
        mean, std = 0.0, 1.0
    return _draw(ctx, x_or_size, lambda key, shape, dt: jax.random.normal(key, shape, dt) * std + mean)


@functional("randint", "randint.low", "randint_like", "randint_like.low_dtype", random=True)
def _randint(ctx, *args, **kwargs):
    target = ctx.node.target
    if target is _aten.randint.default:
        low, high = 0, args[0]
    elif target is _aten.randint_like.default:
        low, high = 0, args[1]
    elif target is _aten.randint.low:
        low, high = args[0], args[1]
    else:
        low, high = args[1], args[2]
    shape = tuple(int(s) for s in ctx.val.shape)
    return jax.random.randint(ctx.key(), shape, low, high, jnp.int64).astype(ctx.jdtype())


@functional("bernoulli", "bernoulli.p", "bernoulli.Tensor", random=True)
def _bernoulli(ctx, x, p=None, **kwargs):
    probs = x if p is None else p
    u = jax.random.uniform(ctx.key(), x.shape, compute_dtype(x.dtype))
    return (u < probs).astype(ctx.jdtype())


@functional("native_dropout", random=True)
def _native_dropout(ctx, x, p, train):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.uniform(ctx.key(), x.shape, compute_dtype(x.dtype)) >= p
    return jnp.where(keep, x * (1.0 / (1.0 - p)), 0).astype(x.dtype), keep


@functional("native_dropout_backward")
def _native_dropout_backward(ctx, grad, mask, scale):
    return (grad * mask.astype(grad.dtype) * scale).astype(grad.dtype)


# ---------------------------------------------------------------- symbolic sizes (concrete here)
@functional("sym_size.int")
def _sym_size(ctx, x, dim):
    return x.shape[dim]


@functional("sym_numel")
def _sym_numel(ctx, x):
    return math.prod(x.shape)


@functional("sym_stride.int")
def _sym_stride(ctx, x, dim):
    return storage.contiguous_strides(tuple(x.shape))[dim]


@functional("sym_storage_offset")
def _sym_storage_offset(ctx, x):
    return 0
