"""How the graph interpreter evaluates an aten op: a graph-only lowering (functional.py), the eager
lowering from the registry with eager's promotion and result casting, or a ``_foreach_*`` op as its
element op over the lists. Ops with neither get torch._decomp decompositions (``decompositions()``)."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import torch

from .. import dispatch, dtypes, fallback, foreach
from ..registry import LOWERINGS, Promote, pallas_path
from .functional import FUNCTIONAL, GraphContext, op_key, qualified

_aten = torch.ops.aten


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
    if isinstance(val, torch.Tensor):
        return dispatch.Spec(tuple(int(s) if not isinstance(s, torch.SymInt) else -1 for s in val.shape), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_spec_of_val(v) for v in val)
    return val


def _cast_like(result, val, name):
    """Cast a lowering's result to torch's dtype (and 0-d/1-element shape) as eager dispatch does."""
    if isinstance(val, torch.Tensor):
        return dispatch.fit_result(jnp.asarray(result), tuple(val.shape), val.dtype, f"aten::{name}")
    if isinstance(val, (list, tuple)) and isinstance(result, (list, tuple)):
        return type(result)(_cast_like(r, v, name) for r, v in zip(result, val))
    return result


def _call_lowering(ctx, name, op, args, kwargs):
    low = LOWERINGS[name]
    args, kwargs = _normalize(op, args, kwargs)
    spec = dispatch.OpSpec(_spec_of_val(ctx.val), None)
    low.check_dtype(spec.dtype)
    if low.promote is Promote.RESULT:
        args, kwargs = dispatch.promote_args(args, kwargs, ctx.dtype())
    elif low.promote is Promote.COMMON:
        common = dispatch.common_dtype(_meta_like(list(args)))
        spec.common_dtype = common
        args, kwargs = dispatch.promote_args(args, kwargs, common)
    if low.needs_spec:
        kwargs = {**kwargs, "spec": spec}
    fn = low.fn if low.pallas_fn is None else pallas_path(low, ctx.pallas, args, kwargs)[0]
    try:
        result = fn(*args, **kwargs)
    except jax.errors.ConcretizationTypeError as exc:
        raise NotImplementedError(f"aten::{name} depends on tensor values (data-dependent), so it cannot "
                                  f"run inside the compiled tpu graph: {exc}") from None
    return _cast_like(result, ctx.val, name)


def handler(op) -> Callable | None:
    """How the compiler evaluates ``op`` (None: unsupported)."""
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
# _foreach_<op> applies <op> to each element of its list arguments; foreach.py binds each element to
# the <op> overload whose schema accepts its pattern of tensors and scalars (eager uses the same).
def _foreach_bases(name: str) -> list:
    return foreach.bases(name, _supported_overload)


def _supported_overload(op) -> bool:
    name = op_key(op)
    return name in FUNCTIONAL or (name in LOWERINGS and not LOWERINGS[name].raw)


def _is_array(value) -> bool:
    return isinstance(value, jax.Array)


class _ElementCtx(GraphContext):
    """The context of one element of a _foreach_ node: its own output metadata."""

    def __init__(self, ctx: GraphContext, val):
        super().__init__(ctx.rng_key, ctx.pallas)
        self.node, self.index, self._element_val = ctx.node, ctx.index, val

    @property
    def val(self):
        return self._element_val


def _foreach(ctx, op, args, kwargs):
    args, kwargs = _normalize(op, args, kwargs)
    vals = ctx.val
    bases = _foreach_bases(op_key(op))
    outputs = []
    for i, element in enumerate(foreach.elements(op, args, kwargs)):
        bound = next(((b, bound) for b in bases
                      if (bound := foreach.bind(b._schema, element, kwargs, _is_array)) is not None), None)
        if bound is None:
            raise NotImplementedError(f"{qualified(op)}: no tpu lowering of its element op accepts "
                                      f"{[type(e).__name__ for e in element]}")
        base, (element_args, element_kwargs) = bound
        element_ctx = _ElementCtx(ctx, vals[i] if vals is not None else None)
        outputs.append(handler(base)(element_ctx, *element_args, **element_kwargs))
    return outputs


def supported(op) -> bool:
    return handler(op) is not None


def decompositions() -> dict:
    """torch._decomp decompositions (aten-level, as in eager's fallback) of ops we cannot run directly."""
    return {op: fn for op, fn in fallback.decompositions().items()
            if isinstance(op, torch._ops.OpOverload) and not supported(op)}
