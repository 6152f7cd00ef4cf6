"""``torch.compile(model, backend="tpu")``: aten FX graphs -> ONE ``jax.jit``-ed function each.

Pipeline:
1. dynamo captures a torch-level graph; ``aot_autograd`` traces it (with torch._decomp
   decompositions for every op we have no lowering for) into functional aten forward/backward
   graphs, so ``loss.backward()`` works;
2. each aten graph becomes a :class:`CompiledGraph`: a Python interpreter over the graph that calls
   the SAME lowerings as eager (``registry.LOWERINGS[op].fn``, with eager's ``promote=`` casting and
   outputs cast to torch's dtypes) on jax tracers, plus functional versions of the views, factories,
   copies and RNG ops (those are ``raw`` in eager, i.e. they work on torch tensors);
3. at call time the jax arrays of the tpu inputs (``storage.read``) go through ``jax.jit`` of that
   interpreter; results become tpu tensors again.

Randomness: every call draws one key from ``rng.default_generator`` (so ``torch.manual_seed``
reproduces compiled runs) and passes it to the jitted function as an explicit input; each random
node folds its own index into it.

Compile cache: one entry per (graph, input shapes/dtypes, non-tensor inputs, pallas flag, sync
flag). Every miss and hit is recorded with ``stats.record_compile`` (``%tpu compiles``); a miss says
why it recompiled compared with the previous compile of the same graph family (which input's shape
or dtype changed, or which flag). ``clear_cache()`` drops every entry. JAX's persistent compilation
cache (on by default; ``config.persistent_cache_dir``, env ``TPU_INTERACTIVE_CACHE_DIR``) is in compile_log.py.

Unsupported ops: an aten op with neither a (non-raw) lowering, a functional version here, nor a
torch._decomp decomposition raises ``NotImplementedError`` naming the op when the graph is compiled
(dynamo reports it as a backend failure; it does not graph-break). Data-dependent ops (``nonzero``,
``.item()``) already graph-break in dynamo and run eagerly.
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import itertools
import math
import operator
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import dtypes, graph_checks, storage
from .config import config
from .compile_log import disable_persistent_cache, follow_persistent_cache_config  # noqa: F401
from .stats import record_compile, record_kernel_path

_aten = torch.ops.aten
FUNCTIONAL: dict[str, Callable] = {}  # "op.overload" -> fn(ctx, *args, **kwargs): graph-only lowerings


def functional(*names: str) -> Callable[[Callable], Callable]:
    def register(fn):
        for name in names:
            FUNCTIONAL[name if "." in name else name + ".default"] = fn
        return fn

    return register


def op_key(op) -> str:
    """'add.Tensor' for aten ops (the registry's key), 'mylib::foo.default' for other namespaces."""
    namespace, name = op._schema.name.split("::")
    return f"{name}.{op._overloadname}" if namespace == "aten" else f"{namespace}::{name}.{op._overloadname}"


def _qualified(op) -> str:
    key = op_key(op)
    return key if "::" in key else f"aten::{key}"


class _Ctx:
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
def _float_compute(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


@functional("rand", "rand_like", "uniform")
def _rand(ctx, x_or_size, low=0.0, high=1.0, **kwargs):
    shape = x_or_size.shape if hasattr(x_or_size, "shape") else _shape(x_or_size)
    if ctx.node.target is not _aten.uniform.default:
        low, high = 0.0, 1.0
    dtype = ctx.jdtype()
    return jax.random.uniform(ctx.key(), shape, _float_compute(dtype), low, high).astype(dtype)


@functional("randn", "randn_like", "normal_functional")
def _randn(ctx, x_or_size, mean=0.0, std=1.0, **kwargs):
    shape = x_or_size.shape if hasattr(x_or_size, "shape") else _shape(x_or_size)
    if ctx.node.target is not _aten.normal_functional.default:
        mean, std = 0.0, 1.0
    dtype = ctx.jdtype()
    return (jax.random.normal(ctx.key(), shape, _float_compute(dtype)) * std + mean).astype(dtype)


@functional("randint", "randint.low", "randint_like", "randint_like.low_dtype")
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


@functional("bernoulli", "bernoulli.p", "bernoulli.Tensor")
def _bernoulli(ctx, x, p=None, **kwargs):
    probs = x if p is None else p
    u = jax.random.uniform(ctx.key(), x.shape, _float_compute(x.dtype))
    return (u < probs).astype(ctx.jdtype())


@functional("native_dropout")
def _native_dropout(ctx, x, p, train):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.uniform(ctx.key(), x.shape, _float_compute(x.dtype)) >= p
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


# ---------------------------------------------------------------- calling eager lowerings
def _normalize(op, args, kwargs):
    """Arguments as eager kernels get them: schema-positional args positionally, kwarg-only as kwargs."""
    if not kwargs:
        return list(args), {}
    kwargs = dict(kwargs)
    args = list(args)
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    for i, arg in enumerate(positional):
        if i < len(args):
            continue
        if arg.name not in kwargs:
            break
        while len(args) < i:
            schema_arg = positional[len(args)]
            args.append(schema_arg.default_value if schema_arg.has_default_value() else None)
        args.append(kwargs.pop(arg.name))
    return args, kwargs


def _meta_like(value):
    if isinstance(value, jax.Array):
        return torch.empty(value.shape, dtype=dtypes.to_torch(value.dtype), device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_like(v) for v in value)
    return value


def _spec_of_val(val):
    from .dispatch import _Spec

    if isinstance(val, torch.Tensor):
        return _Spec(tuple(int(s) if not isinstance(s, torch.SymInt) else -1 for s in val.shape), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_spec_of_val(v) for v in val)
    return val


def _cast_like(result, val, name):
    """Cast a lowering's result to torch's dtype (and 0-d/1-element shape) like eager's _wrap."""
    if isinstance(val, torch.Tensor):
        array = jnp.asarray(result)
        target = dtypes.to_jax(val.dtype)
        if array.dtype != target:
            array = array.astype(target)
        shape = tuple(val.shape)
        if array.shape != shape and all(isinstance(s, int) for s in shape):
            if array.size == math.prod(shape) and (array.ndim == 0 or not shape):
                array = array.reshape(shape)
            else:
                raise RuntimeError(f"internal error: lowering of aten::{name} returned shape "
                                   f"{tuple(array.shape)}, torch expects {shape}")
        return array
    if isinstance(val, (list, tuple)) and isinstance(result, (list, tuple)):
        return type(result)(_cast_like(r, v, name) for r, v in zip(result, val))
    return result


def _call_lowering(ctx, name, op, args, kwargs):
    from . import dispatch
    from .registry import LOWERINGS

    low = LOWERINGS[name]
    args, kwargs = _normalize(op, args, kwargs)
    spec = dispatch._OpSpec(_spec_of_val(ctx.val), None)
    if low.promote == "result":
        args, kwargs = dispatch._promote(args, kwargs, ctx.dtype())
    elif low.promote == "common":
        common = dispatch._common_dtype(_meta_like(list(args)))
        spec.common_dtype = common
        args, kwargs = dispatch._promote(args, kwargs, common)
    fn = low.fn
    if low.pallas_fn is not None:
        record_kernel_path(f"aten::{name}", "pallas" if ctx.pallas else "xla")
        if ctx.pallas:
            fn = low.pallas_fn
    dispatch._current[0] = spec
    try:
        result = fn(*args, **kwargs)
    except jax.errors.ConcretizationTypeError as exc:
        raise NotImplementedError(f"aten::{name} depends on tensor values (data-dependent), so it cannot "
                                  f"run inside the compiled tpu graph: {exc}") from None
    finally:
        dispatch._current[0] = None
    return _cast_like(result, ctx.val, name)


def handler(op) -> Callable | None:
    """How the compiler evaluates ``op`` (None: unsupported)."""
    from .registry import LOWERINGS

    if not isinstance(op, torch._ops.OpOverload):
        return None
    name = op_key(op)
    if name in FUNCTIONAL:
        return FUNCTIONAL[name]
    low = LOWERINGS.get(name)
    if low is not None and not low.raw:
        return lambda ctx, *a, **k: _call_lowering(ctx, name, op, a, k)
    if name.startswith("_foreach_") and _foreach_bases(name):
        return lambda ctx, *a, **k: _foreach(ctx, op, a, k)
    return None


# ---------------------------------------------------------------- _foreach_* ops (optimizers)
# _foreach_<op> applies <op> to each element of its list arguments (torch's own "slow path" kernels
# do exactly this loop). Element i takes item i of every Tensor[]/Scalar[] argument; its <op>
# overload is the one whose schema accepts that pattern of tensors and scalars. Where the element
# op has another name, this table says which ops to try.
_FOREACH_BASE_NAMES: dict[str, tuple[str, ...]] = {
    "maximum": ("maximum", "clamp_min"), "minimum": ("minimum", "clamp_max"),
    "norm": ("linalg_vector_norm",), "copy": ("copy",), "zero": ("zeros_like",),
}


def _foreach_bases(name: str) -> list:
    stem = name[len("_foreach_"):].split(".")[0]
    packets = [getattr(_aten, base, None) for base in _FOREACH_BASE_NAMES.get(stem, (stem,))]
    return [getattr(p, o) for p in packets if p is not None for o in p.overloads()
            if "out" not in o and _supported_overload(getattr(p, o))]


def _supported_overload(op) -> bool:
    from .registry import LOWERINGS

    name = op_key(op)
    return name in FUNCTIONAL or (name in LOWERINGS and not LOWERINGS[name].raw)


def _bind(schema, args, kwargs):
    """(args, kwargs) for the element op, or None if its schema does not take them. Positionals past
    its positional parameters go to its keyword-only ones in order (``_foreach_addcmul``'s value)."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    kwonly = [p for p in params if p.kwarg_only and p.name not in kwargs]
    extra = args[len(positional):]
    if len(extra) > len(kwonly):
        return None
    args, kwargs = args[:len(positional)], {**kwargs, **{p.name: v for p, v in zip(kwonly, extra)}}
    names = {p.name for p in params}
    given = {p.name for p in positional[:len(args)]} | set(kwargs)
    if any(k not in names for k in kwargs) or any(
            p.name not in given and not p.has_default_value() and not isinstance(p.type, torch.OptionalType)
            for p in params):
        return None
    for value, param in itertools.chain(zip(args, positional), ((kwargs[p.name], p) for p in params if p.name in kwargs)):
        kind = param.type.getElementType() if isinstance(param.type, torch.OptionalType) else param.type
        if value is not None and isinstance(kind, torch.TensorType) != isinstance(value, jax.Array):
            return None
    return args, kwargs


class _ElementCtx(_Ctx):
    """The context of one element of a _foreach_ node: its own output metadata."""

    def __init__(self, ctx: _Ctx, val):
        super().__init__(ctx.rng_key, ctx.pallas)
        self.node, self.index, self._element_val = ctx.node, ctx.index, val

    @property
    def val(self):
        return self._element_val


def _foreach(ctx, op, args, kwargs):
    args, kwargs = _normalize(op, args, kwargs)
    lists = [isinstance(p.type, torch.ListType) for p in op._schema.arguments if not p.kwarg_only]
    length = next(len(a) for a, is_list in zip(args, lists) if is_list)
    vals = ctx.val
    bases = _foreach_bases(op_key(op))
    outputs = []
    for i in range(length):
        element = [a[i] if is_list else a for a, is_list in zip(args, lists)]
        while element and element[-1] is None:  # trailing optional arguments left at their defaults
            element.pop()
        bound = next(((b, bound) for b in bases
                      if (bound := _bind(b._schema, element, kwargs)) is not None), None)
        if bound is None:
            raise NotImplementedError(f"{_qualified(op)}: no tpu lowering of its element op accepts "
                                      f"{[type(e).__name__ for e in element]}")
        base, (element_args, element_kwargs) = bound
        element_ctx = _ElementCtx(ctx, vals[i] if vals is not None else None)
        outputs.append(handler(base)(element_ctx, *element_args, **element_kwargs))
    return outputs


def _supported(op) -> bool:
    return handler(op) is not None


def decompositions() -> dict:
    """torch._decomp decompositions (aten-level, as in eager's fallback) of ops we cannot run directly."""
    from .dispatch import _decompositions

    return {op: fn for op, fn in _decompositions().items()
            if isinstance(op, torch._ops.OpOverload) and not _supported(op)}


# ---------------------------------------------------------------- graph -> jax function
def _map(value, fn):
    if isinstance(value, torch.fx.Node):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _constant(value):
    if isinstance(value, torch.Tensor):
        if value.device.type == "tpu":
            return storage.read(value)
        from .dispatch import cpu_to_jax

        return cpu_to_jax(value)
    return value


def _check_supported(gm: torch.fx.GraphModule) -> None:
    missing = sorted({_qualified(n.target) for n in gm.graph.nodes if n.op == "call_function"
                      and isinstance(n.target, torch._ops.OpOverload) and not _supported(n.target)})
    if missing:
        raise NotImplementedError(
            "the tpu compiler has no lowering (and torch._decomp no decomposition) for: "
            + ", ".join(missing)
            + ". Run this code eagerly on tpu, or add a lowering in tpu_interactive/backend/ops/.")


def interpret(gm: torch.fx.GraphModule, rng_key, inputs: list, pallas: bool):
    """Evaluate the aten graph on jax values (tracers under jit). Returns (outputs, mutated inputs)."""
    ctx = _Ctx(rng_key, pallas)
    ctx.mutated = {}
    env: dict = {}
    feed = iter(inputs)
    placeholders = []
    for index, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            env[node] = next(feed)
            placeholders.append(node)
        elif node.op == "get_attr":
            env[node] = _constant(getattr(gm, node.target))
        elif node.op == "call_function":
            args = _map(node.args, env.__getitem__)
            kwargs = _map(node.kwargs, env.__getitem__)
            if isinstance(node.target, torch._ops.OpOverload):
                ctx.node, ctx.index = node, index
                try:
                    env[node] = handler(node.target)(ctx, *args, **kwargs)
                except (NotImplementedError, RuntimeError, TypeError, ValueError) as exc:
                    if _qualified(node.target) in str(exc):
                        raise
                    raise type(exc)(f"{_qualified(node.target)} (graph node {node.name}) failed in the "
                                    f"tpu compiler: {exc}") from exc
            else:  # operator.getitem, SymInt arithmetic: plain Python on concrete values
                env[node] = node.target(*args, **kwargs)
        elif node.op == "output":
            outputs = _map(node.args[0], env.__getitem__)
            mutated = [ctx.mutated.get(p) for p in placeholders]
            return outputs, mutated
        else:
            raise NotImplementedError(f"fx node kind {node.op!r} is not supported by the tpu compiler")
    raise RuntimeError("graph has no output node")


# ---------------------------------------------------------------- runtime: cache and calls
_CACHE: dict = {}
_LAST: dict = {}  # graph family -> (signature, flags, input names) of its latest compile


def clear_cache() -> None:
    """Forget every compiled executable (the next call of each compiled graph recompiles)."""
    _CACHE.clear()
    _LAST.clear()


def _describe(sig) -> str:
    if isinstance(sig, tuple) and len(sig) == 2 and isinstance(sig[1], torch.dtype):
        return f"{tuple(sig[0])} {str(sig[1]).replace('torch.', '')}"
    return repr(sig)


def _cause(family, sig, flags, names) -> str:
    last = _LAST.get(family)
    if last is None:
        return "first compile"
    old_sig, old_flags = last
    changes = []
    for name, old, new in zip(("pallas", "sync"), old_flags, flags):
        if old != new:
            changes.append(f"{name} flag {old} -> {new}")
    if len(old_sig) != len(sig):
        changes.append(f"number of inputs {len(old_sig)} -> {len(sig)}")
    else:
        for i, (old, new) in enumerate(zip(old_sig, sig)):
            if old != new:
                what = "shape" if isinstance(old, tuple) and isinstance(new, tuple) and old[1:] == new[1:] else \
                    "dtype" if isinstance(old, tuple) and isinstance(new, tuple) and old[0] == new[0] else "value"
                changes.append(f"input {i} ({names[i]}) {what} {_describe(old)} -> {_describe(new)}")
    return "; ".join(changes) or "graph changed (same inputs)"


class _Entry:
    __slots__ = ("fn", "tensor_out", "static_out", "has_mutation", "has_checks")

    def __init__(self):
        self.fn = None
        self.tensor_out = None
        self.static_out = None
        self.has_mutation = False
        self.has_checks = False


class CompiledGraph:
    """A boxed callable (aot_autograd convention) running one aten graph as one jitted function."""

    _boxed_call = True  # also set per instance: functools.wraps (dynamo.disable) copies __dict__

    @property
    def compile_label(self) -> str:  # names this graph's XLA compiles in compile_log
        return f"torch.compile graph {self.name}"

    def __init__(self, gm: torch.fx.GraphModule, family, name: str, input_names: list[str]):
        _check_supported(gm)
        self._boxed_call = True
        self.cause_override: str | None = None  # set by callers that know why this graph was (re)built
        self.gm = gm
        self.family, self.name = family, name
        self.code = hashlib.sha1(gm.code.encode()).hexdigest()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.input_names = [input_names[i] if i < len(input_names) else n.name for i, n in enumerate(placeholders)]
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        outs = output.args[0]
        self.out_nodes = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        index = {n: i for i, n in enumerate(placeholders)}
        # outputs that ARE inputs are returned as the input tensor itself (no new buffer)
        self.passthrough = [index.get(n) if isinstance(n, torch.fx.Node) else None for n in self.out_nodes]
        self.out_vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in self.out_nodes]
        self.uses_rng = any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                            and op_key(n.target) in _RANDOM for n in gm.graph.nodes)

    # -- signature of one call
    def _split(self, args):
        """The inputs' jax arrays (None for non-tensors) and the call's cache signature."""
        arrays, sig = [], []
        read = storage.read
        for a in args:
            if isinstance(a, torch.Tensor):
                arrays.append(read(a) if a.device.type == "tpu" else _cpu_to_jax(a))
                sig.append((a.shape, a.dtype))  # torch.Size is a hashable tuple
            else:
                arrays.append(None)
                sig.append(a if not isinstance(a, torch.SymInt) else int(a))
        return arrays, tuple(sig)

    def _build(self, sig, flags) -> _Entry:
        entry = _Entry()
        pallas = flags[0]
        statics = {i: s for i, s in enumerate(sig) if not (isinstance(s, tuple) and len(s) == 2
                                                          and isinstance(s[1], torch.dtype))}
        gm = self.gm

        def run(rng_key, arrays):
            inputs = [statics[i] if i in statics else arrays[i] for i in range(len(sig))]
            checks_before = graph_checks.traced_checks[0]
            outputs, mutated = interpret(gm, rng_key, inputs, pallas)
            is_array = [isinstance(o, jax.Array) for o in outputs]
            entry.tensor_out = is_array
            entry.static_out = [None if a else o for a, o in zip(is_array, outputs)]
            entry.has_mutation = any(m is not None for m in mutated)
            entry.has_checks = graph_checks.traced_checks[0] != checks_before
            return [o for o, a in zip(outputs, is_array) if a], mutated

        entry.fn = jax.jit(graph_checks.checkified(run))
        return entry

    def __call__(self, *args):
        # boxed (one list, which we may empty) or, when dynamo wraps us (backward), unboxed
        boxed = len(args) == 1 and isinstance(args[0], list)
        args = args[0] if boxed else list(args)
        arrays, sig = self._split(args)
        flags = (bool(config.pallas), bool(config.sync))
        key = (self.code, sig, flags)
        entry = _CACHE.get(key)
        rng_key = _next_key() if self.uses_rng else _ZERO_KEY()
        if entry is None:
            cause = self.cause_override or _cause(self.family, sig, flags, self.input_names)
            self.cause_override = None
            follow_persistent_cache_config()
            entry = self._build(sig, flags)
            start = time.perf_counter()
            failed, (results, mutated) = entry.fn(rng_key, arrays)
            seconds = time.perf_counter() - start
            _CACHE[key] = entry
            _LAST[self.family] = (sig, flags)
            record_compile(self.name, cause, seconds, False)
        else:
            record_compile(self.name, "cache hit", 0.0, True)
            failed, (results, mutated) = entry.fn(rng_key, arrays)
        if entry.has_checks:  # before any mutation is written back: a failed call changes nothing
            graph_checks.raise_if_failed(failed)
        if entry.has_mutation:
            for tensor, value in zip(args, mutated):
                if value is None:
                    continue
                if tensor.device.type == "tpu":
                    storage.write(tensor, value)
                else:  # a host input the graph updates (e.g. Adam's CPU step counter)
                    tensor.copy_(dtypes.numpy_to_torch(np.asarray(value), tensor.dtype))
        outputs = self._wrap(args, results, entry)
        if flags[1]:
            jax.block_until_ready(results)
        if boxed:
            args.clear()  # boxed convention: let the inputs die as early as possible
        return outputs

    def _wrap(self, args, results, entry):
        it = iter(results)
        outputs = []
        for i, is_array in enumerate(entry.tensor_out):
            if not is_array:
                outputs.append(entry.static_out[i])
                continue
            array = next(it)
            source = self.passthrough[i]
            if source is not None and isinstance(args[source], torch.Tensor):
                outputs.append(args[source])
                continue
            val = self.out_vals[i]
            dtype = val.dtype if isinstance(val, torch.Tensor) else dtypes.to_torch(array.dtype)
            if isinstance(val, torch.Tensor) and val.device.type == "cpu":
                outputs.append(dtypes.numpy_to_torch(np.asarray(array), dtype))
            else:
                outputs.append(storage.new_tensor(array, array.shape, dtype))
        return outputs


_RANDOM = {"rand.default", "rand_like.default", "uniform.default", "randn.default", "randn_like.default",
           "normal_functional.default", "randint.default", "randint.low", "randint_like.default",
           "randint_like.low_dtype", "bernoulli.default", "bernoulli.p", "bernoulli.Tensor",
           "native_dropout.default"}
_zero_key: list = []


def _ZERO_KEY():
    if not _zero_key:
        _zero_key.append(jax.random.key(0))
    return _zero_key[0]


def _cpu_to_jax(t):
    from .dispatch import cpu_to_jax

    return cpu_to_jax(t)


def _next_key():
    from .rng import default_generator

    return default_generator.next_key()


# ---------------------------------------------------------------- the dynamo backend
_family_ids: dict = {}


def _graph_family(gm: torch.fx.GraphModule) -> tuple:
    """Identity of a captured graph that survives recompiles for new shapes (for recompile causes)."""
    ops = tuple(str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    frame = None
    try:
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
        frame = getattr(compile_id, "frame_id", None)
    except Exception:  # noqa: BLE001 - naming only
        pass
    digest = hashlib.sha1(repr(ops).encode()).hexdigest()[:12]
    family = (frame, digest)
    _family_ids.setdefault(family, len(_family_ids))
    return family


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend: ``torch.compile(model, backend="tpu")``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    # torch.compile(mode=..., options=...) are inductor tuning knobs (callers such as Transformers'
    # generate() pass them to any backend); jax.jit has no equivalent, so they are accepted and ignored
    kwargs.pop("mode", None)
    kwargs.pop("options", None)
    family = _graph_family(gm)
    label = f"graph{_family_ids[family]}"
    # dynamo's placeholder names, e.g. l_x_ / l_self_modules_fc_parameters_weight_ -> x / ..._weight
    names = [n.name.removeprefix("l_").rstrip("_") or n.name for n in gm.graph.nodes if n.op == "placeholder"]

    def compiler(kind):
        def compile_graph(aot_gm, aot_inputs):
            input_names = names if kind != "bw" else []
            return CompiledGraph(aot_gm, family + (kind,), f"{label}.{kind}", input_names)

        return compile_graph

    # Input mutations (optimizer steps, buffers) stay in the graph and are written back by
    # CompiledGraph (no copy_ dispatch per tensor); the min-cut partitioner recomputes cheap values
    # (weight transposes, views) in the backward instead of saving them: fewer outputs to wrap.
    backend = aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                           inference_compiler=compiler("inference"), decompositions=decompositions(),
                           keep_inference_input_mutations=True,
                           partition_fn=min_cut_rematerialization_partition, **kwargs)
    return backend(gm, example_inputs)


def compile(model_or_fn=None, **kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile`` with the tpu backend and static shapes (a new input shape recompiles)."""
    kwargs.setdefault("dynamic", False)
    if model_or_fn is None:
        return lambda fn: torch.compile(fn, backend=tpu_backend, **kwargs)
    return torch.compile(model_or_fn, backend=tpu_backend, **kwargs)


# ---------------------------------------------------------------- register "tpu" with dynamo lazily
_registered: list = []


def register_dynamo_backend() -> None:
    if _registered:
        return
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "tpu" not in _BACKENDS:
        register_backend(compiler_fn=tpu_backend, name="tpu")
    _registered.append(True)


class _DynamoHook(importlib.abc.MetaPathFinder):
    """Registers the backend right after torch._dynamo's backend registry is imported (importing dynamo
    ourselves would add ~1.5 s to ``import tpu_interactive``)."""

    TARGET = "torch._dynamo.backends.registry"

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DynamoHook)]
            register_after_dynamo(module)

        loader.exec_module = exec_module
        return spec


def register_after_dynamo(registry_module) -> None:
    if "tpu" not in registry_module._BACKENDS:
        registry_module.register_backend(compiler_fn=tpu_backend, name="tpu")
    _registered.append(True)


def install_dynamo_hook() -> None:
    if "torch._dynamo.backends.registry" in sys.modules:
        register_dynamo_backend()
    elif not any(isinstance(f, _DynamoHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoHook())
