"""``_foreach_*`` ops (optimizers' default path on tpu, as on CUDA) as ONE program per call.

``_foreach_<op>`` applies ``<op>`` to each element of its list arguments. Torch's own kernel for
devices without a fused one loops in C++ and dispatches ``<op>`` once per tensor: AdamW's step over
12 parameters made 108 op calls, each its own program launch (and, in fused mode, its own recorded
step: half the host time of recording a training step). Here the call's elements run as one program
(op_jit; one recorded step in fused mode): each element is the registry lowering of its element op,
with eager's promotion and result casting, exactly what the per-tensor dispatch computed. An in-place
call writes every element of its first list; when nothing else holds those arrays they are donated,
so XLA updates them in place, as the per-tensor in-place programs did.

Torch's meta kernel of the foreach op runs first: list-length, device and cast errors are torch's
own. A call whose element op has no lowering for the argument kinds given runs torch's per-tensor
kernel (CompositeExplicitAutograd), as before. The compiler (compiler/lowerings.py) evaluates
``_foreach_*`` graph nodes with the same element binding.
"""
from __future__ import annotations

import itertools
from typing import Callable

import jax.numpy as jnp
import torch

from . import compile_ahead, dispatch, fast_path, fusion, op_jit, planned, storage
from .config import config
from .dtypes import to_jax
from .errors import DeviceMismatchError
from .registry import LOWERINGS, Promote, op_key
from .specs import Spec, fit_result

_aten = torch.ops.aten
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd

# Element ops whose name is not the foreach op's stem: the ops to try, in order.
BASE_NAMES: dict[str, tuple[str, ...]] = {
    "maximum": ("maximum", "clamp_min"), "minimum": ("minimum", "clamp_max"),
    "norm": ("linalg_vector_norm",), "copy": ("copy",), "zero": ("zero", "zeros_like"),
}


def bases(name: str, supported: Callable[[torch._ops.OpOverload], bool]) -> list:
    """The element overloads of foreach op ``name`` ("_foreach_add.List") that ``supported`` accepts."""
    stem = name[len("_foreach_"):].split(".")[0].rstrip("_")
    packets = [getattr(_aten, base, None) for base in BASE_NAMES.get(stem, (stem,))]
    return [getattr(p, o) for p in packets if p is not None for o in p.overloads()
            if "out" not in o and supported(getattr(p, o))]


def binding(schema, args: list, kwargs: dict, is_tensor: Callable) -> tuple[int, tuple] | None:
    """How the element op takes an element's arguments: (how many stay positional, the keyword-only
    parameters the others go to, in order: ``_foreach_addcmul``'s value); None if it does not."""
    bound = bind(schema, args, kwargs, is_tensor)
    if bound is None:
        return None
    n = len([p for p in schema.arguments if not p.kwarg_only])
    kwonly = [p.name for p in schema.arguments if p.kwarg_only and p.name not in kwargs]
    return n, tuple(kwonly[:max(len(args) - n, 0)])


def bind(schema, args: list, kwargs: dict, is_tensor: Callable) -> tuple[list, dict] | None:
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
        if value is not None and isinstance(kind, torch.TensorType) != is_tensor(value):
            return None
    return args, kwargs


def elements(op: torch._ops.OpOverload, args: list, kwargs: dict) -> list[list]:
    """Element i's positional arguments: item i of every list argument, the others as they are
    (trailing Nones, optional arguments left at their defaults, dropped)."""
    lists = [isinstance(p.type, torch.ListType) for p in op._schema.arguments if not p.kwarg_only]
    length = next(len(a) for a, is_list in zip(args, lists) if is_list)
    out = []
    for i in range(length):
        element = [a[i] if is_list else a for a, is_list in zip(args, lists)]
        while element and element[-1] is None:
            element.pop()
        out.append(element)
    return out


# ---------------------------------------------------------------- the eager kernel
def _lowered(op: torch._ops.OpOverload) -> bool:
    low = LOWERINGS.get(op_key(op))
    return low is not None and not low.raw and low.meta and low.pallas_fn is None


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def overloads() -> list[torch._ops.OpOverload]:
    """The ``_foreach_*`` overloads (functional and in-place, not out=) whose element op is lowered."""
    found = []
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::_foreach_"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        op = getattr(getattr(_aten, name), overload or "default")
        if "out" not in overload and bases(op_key(op), _lowered):
            found.append(op)
    return found


_BINDINGS: dict = {}  # (op, the element's argument kinds) -> (element op, its lowering) or None


def _element_op(op, element: list, kwargs: dict):
    kinds = (op, tuple(type(v) for v in element), tuple(kwargs))
    found = _BINDINGS.get(kinds, False)
    if found is False:
        candidates = bases(op_key(op), _lowered)
        base = next((b for b in candidates if bind(b._schema, element, kwargs, _is_tensor) is not None), None)
        found = _BINDINGS[kinds] = (base, LOWERINGS[op_key(base)]) if base is not None else None
    return found


def make_kernel(op: torch._ops.OpOverload) -> Callable:
    """The PrivateUse1 kernel of foreach overload ``op``: counted and its errors named as every
    kernel's, behind the C++ fast path (a repeated call runs its plan: one program, no Python)."""
    op_name = f"aten::{op_key(op)}"
    token = object()  # the fast path's token of this kernel
    kernel = dispatch._guarded(op_name, op._schema, lambda args, kwargs: run(op, args, kwargs, op_name, token), op)
    return fast_path.front(kernel, token, op_name, op._schema.name.endswith("_"), True, list_views=True)


_RECIPES: dict = {}  # (op, argument signature) -> _Recipe, or None: torch's per-tensor loop
_RECIPES_LIMIT = 4096


class _Recipe:
    """What a foreach call's signature decides, worked out (and checked) on its first call: the
    element op and the program's static plan (see :func:`_run_foreach`)."""

    __slots__ = ("low", "plan", "specs")


def run(op: torch._ops.OpOverload, args: tuple, kwargs: dict, op_name: str, token: object = None):
    """The kernel body of foreach op ``op``."""
    key = (op, dispatch._sig(args, True), dispatch._sig(tuple(kwargs.items()), True) if kwargs else ())
    recipe = _RECIPES.get(key, False)
    if recipe is False:
        recipe = _recipe(op, args, kwargs)  # raises torch's error for a bad call: nothing is kept
        if len(_RECIPES) > _RECIPES_LIMIT:
            _RECIPES.clear()
        _RECIPES[key] = recipe
    inplace = op._schema.name.endswith("_")
    if recipe is None:  # no lowering of an element op takes these arguments: torch's per-tensor loop
        return op._op_dk(_COMPOSITE, *args, **kwargs)
    low = recipe.low
    calls = elements(op, list(args), kwargs) if inplace or low.host_check is not None else ()
    if inplace and not _independent(calls):
        return op._op_dk(_COMPOSITE, *args, **kwargs)  # an element reads what an earlier one writes
    if low.host_check is not None:
        n, extra_names = recipe.plan[1], recipe.plan[2]
        for element in calls:
            low.host_check(element[:n], {**kwargs, **dict(zip(extra_names, element[n:]))})
    fused = config.fuse and fusion.active()
    pending = fast_path.take(token)
    lazy = fused or compile_ahead.has_pending()  # deferred values stay deferred (compile_ahead.py)
    views: list = []  # (argument, item, geometry) of the views the program reads from their buffers
    try:
        # an in-place call's written list stays plain (whole buffers, written as such)
        jargs = [_unwrap_list(a, p, views, low.allow_cpu_tensors, lazy) if type(a) in (list, tuple) and
                 not (inplace and p == 0) else dispatch._unwrap(a, low.allow_cpu_tensors, lazy)
                 for p, a in enumerate(args)]
        jkwargs = {k: dispatch._unwrap(v, low.allow_cpu_tensors, lazy) for k, v in kwargs.items()}
    except DeviceMismatchError:
        raise dispatch._device_error(op_name, op._schema, args, kwargs) from None
    static = {"_fn": low.fn, "_plan": recipe.plan, "_op_name": op_name, "_views": tuple(views)}
    selves = args[0] if inplace else ()
    offer = None
    # the C++ fast path runs (or records) this call's repeats from its plan; a host check must see
    # every call (the plan keys floats by type)
    if pending is not None and low.host_check is None:
        def offer(program, inputs, floats_are_inputs):
            outputs = tuple(Spec(tuple(t.shape), t.dtype) for t in selves) if inplace else \
                tuple(spec.outputs for spec in recipe.specs)
            fast_path.offer(pending, (args, kwargs), (jargs, jkwargs), program, inputs, floats_are_inputs,
                            outputs, None, inplace, True, len(selves), recording=fused)
    if fused:
        results = fusion.record(_run_foreach, jargs, {**jkwargs, **static}, True, op_name, offer)
    else:
        donate = len(selves) if inplace and _donatable(selves, jargs, jkwargs) else 0
        intent = len(selves) if inplace and _donatable(selves, jargs, jkwargs, deferred=True) else 0
        results = op_jit.call(_run_foreach, jargs, {**jkwargs, **static}, True, offer, donate, defer=op_name,
                              intent=intent)
    if inplace:
        for t, value in zip(args[0], results):
            storage.write(t, value)
        return None
    return [storage.new_tensor(value, spec.outputs.shape, spec.outputs.dtype)
            for value, spec in zip(results, recipe.specs)]


def _recipe(op, args: tuple, kwargs: dict) -> _Recipe | None:
    try:
        dispatch.meta_spec(op, args, kwargs, True)  # torch's checks: list lengths, devices
    except Exception:
        if dispatch._cpu_error(op, args, kwargs) is None:  # a meta kernel stricter than CPU's (a cpu
            return None                                    # `scalars` tensor): torch's loop takes it
        raise
    inplace = op._schema.name.endswith("_")
    calls = elements(op, list(args), kwargs)
    found = _element_op(op, calls[0], kwargs) if calls else None
    if found is None:
        return None
    base, low = found
    recipe = _Recipe()
    recipe.low = low
    n, extra_names = binding(base._schema, calls[0], kwargs, _is_tensor)
    layout, specs = [], []
    for element in calls:
        eargs, ekwargs = bind(base._schema, element, kwargs, _is_tensor)
        spec = dispatch.meta_spec(base, eargs, ekwargs, low.meta_by_type, low.promote is Promote.COMMON)
        low.check_dtype(spec.dtype)
        # torch's per-tensor loop writes self[i] with the element op's in-place form
        written = _check_writable(eargs[0], spec) if inplace else None
        # promote_args' casts, done inside the program: which tensor arguments, to what
        target = planned.promotion_target(low, spec)
        jt = to_jax(target) if target is not None else None
        cast = tuple(i for i, a in enumerate(eargs) if planned._needs_cast(a, jt))
        cast_kw = tuple(k for k, a in ekwargs.items() if planned._needs_cast(a, jt))
        layout.append(((spec.outputs.shape, spec.outputs.dtype), written, (jt, cast, cast_kw),
                       spec if low.needs_spec else None))
        specs.append(spec)
    lists = tuple(isinstance(p.type, torch.ListType) for p in op._schema.arguments if not p.kwarg_only)
    recipe.plan = (lists, n, extra_names, tuple(layout))
    recipe.specs = tuple(specs)
    return recipe


def _independent(calls: list) -> bool:
    """No element reads or writes the memory another element writes (torch's loop would let element
    i + 1 see element i's write; one program reads every input first). An element's own overlap
    with what it writes gets torch's error, as the in-place element op would raise it."""
    owners: dict[int, int] = {}
    for i, element in enumerate(calls):
        if owners.setdefault(id(storage.buffer_of(element[0])), i) != i:
            return False
    for i, element in enumerate(calls):
        for other in element[1:]:
            if isinstance(other, torch.Tensor) and other.device.type == "tpu":
                storage.check_no_partial_overlap(element[0], other)
                if owners.get(id(storage.buffer_of(other)), i) != i:
                    return False
    return True


def _check_writable(self: torch.Tensor, spec) -> tuple:
    if not torch.can_cast(spec.dtype, self.dtype):
        raise dispatch.cast_refused(spec.dtype, self.dtype)
    if tuple(torch.broadcast_shapes(self.shape, spec.outputs.shape)) != tuple(self.shape):
        raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                           f"{list(spec.outputs.shape)}")
    return tuple(self.shape), self.dtype


def _unwrap_list(value: list | tuple, position: int, views: list, allow_cpu: bool, lazy: bool) -> list:
    """A list argument's arrays: a view's is its buffer's whole array, its geometry noted in ``views``
    (the program reads the view, as the C++ fast path's plans of ``list_views`` kernels are handed)."""
    arrays = []
    for i, t in enumerate(value):
        if isinstance(t, torch.Tensor) and not t.is_cpu:
            array, where = storage.buffer_and_view(t, lazy)
            if where is not None:
                views.append((position, i, where))
                arrays.append(array)
                continue
        arrays.append(dispatch._unwrap(t, allow_cpu, lazy) if t is not None else None)
    return arrays


def _run_foreach(*args, _fn: Callable, _plan: tuple, _op_name: str, _views: tuple = (), **kwargs) -> tuple:
    """The program of one foreach call, on its arguments as given (tensors as their arrays, in the
    fast path's slot order; ``_views``: the list items given as their buffers' arrays, read here):
    each element's lowering, its inputs promoted and its result cast as eager does (for an in-place
    call, to the written tensor's dtype and shape)."""
    if _views:
        args = [list(a) if type(a) in (list, tuple) else a for a in args]
        for position, i, where in _views:
            args[position][i] = storage.view_value(args[position][i], *where)
    lists, n, extra_names, layout = _plan
    results = []
    for i, ((shape, dtype), written, (jt, cast, cast_kw), spec) in enumerate(layout):
        element = [a[i] if is_list else a for a, is_list in zip(args, lists)]
        while element and element[-1] is None:
            element.pop()
        eargs = [a.astype(jt) if j in cast else a for j, a in enumerate(element[:n])]
        ekwargs = {**kwargs, **dict(zip(extra_names, element[n:]))}
        ekwargs = {k: a.astype(jt) if k in cast_kw else a for k, a in ekwargs.items()}
        if spec is not None:
            ekwargs["spec"] = spec
        value = fit_result(jnp.asarray(_fn(*eargs, **ekwargs)), shape, dtype, _op_name)
        if written is not None:
            value = jnp.broadcast_to(value.astype(to_jax(written[1])), written[0])
        results.append(value)
    return tuple(results)


def _donatable(selves, jargs: list, jkwargs: dict, deferred: bool = False) -> bool:
    """Every written tensor is its whole buffer, whose array nothing but the buffer and ``jargs[0]``
    holds, and no array is read twice: the program may update them all in place. ``deferred``: a
    deferred call's written inputs (concrete or Lazy), whose holders it checks when it runs
    (compile_ahead.py): the whole buffers, each read once."""
    written = jargs[0]
    ids = {id(a) for a in written}
    others = [v for a in (*jargs[1:], *jkwargs.values()) for v in (a if isinstance(a, (list, tuple)) else (a,))]
    if len(ids) != len(written) or any(id(a) in ids for a in others):
        return False
    for i, t in enumerate(selves):  # no local name for the arrays: it would hold one more reference
        buf = storage.buffer_of(t)
        if deferred:
            if buf.array is not written[i] or not storage.is_plain(t, buf):
                return False
        elif type(written[i]) is not op_jit.ARRAY or buf.array is not written[i] or not storage.is_plain(t, buf) \
                or not storage.held_only_by(buf, extra=1):
            return False
    return True
