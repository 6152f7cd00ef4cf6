"""One jitted program per eager op call whose plan the C++ fast path can run (fast_path.py).

``run`` is what dispatch does for a call whose key is pending: the lowering, torch's promotion,
its output dtypes and, for an in-place op, the write into self's buffer, traced as one program
(op_jit) whose inputs are the buffers' arrays (a view is read from its buffer inside the program);
the program and where each of its inputs comes from are then offered to the fast path."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import torch

from . import dtypes, fast_path, fusion, op_jit, storage
from .registry import Lowering, Promote
from .specs import OpSpec, Spec, fit_result, output_signature


WRITTEN = object()  # dispatch._run_lowering's result when the program already wrote self (an in-place op)


def promotion_target(low: Lowering, spec: OpSpec | None) -> torch.dtype | None:
    if low.promote is Promote.RESULT:
        return spec.dtype
    if low.promote is Promote.COMMON:
        return spec.common_dtype
    return None


_WHOLE: dict = {}


def run(low: Lowering, fn: Callable, spec: OpSpec, jargs, jkwargs, call: tuple, op_name: str, fused: bool = False):
    """The lowering, its promotion and torch's output dtypes as one jitted program (op_jit), whose
    plan is offered to the fast path for the call's key; with ``fused``, that program recorded as one
    step of the fused segment, and the plan offered is a record plan (fast_path.offer)."""
    args, kwargs, pending, path, inplace = call
    key = (id(low), fn)
    whole = _WHOLE.get(key)
    if whole is None:
        whole = _WHOLE[key] = _whole_program(low, fn, op_name)

    self_buffer = storage.buffer_of(args[0]) if inplace else None

    def offer(program, inputs, floats_are_inputs):
        outputs = Spec(self_buffer.shape, self_buffer.dtype) if inplace else spec.outputs
        fast_path.offer(pending, (args, kwargs), (jargs, jkwargs), program, inputs, floats_are_inputs,
                        outputs, path, inplace, low.meta_by_type, recording=fused)

    # promote_args' casts, chosen here from the tensor arguments' dtypes (a Python float, a weakly typed input
    # of the program, is never cast) and done inside the program
    target = promotion_target(low, spec)
    jt = dtypes.to_jax(target) if target is not None else None
    cast = tuple(i for i, a in enumerate(args) if _needs_cast(a, jt))
    cast_kw = tuple(k for k, a in kwargs.items() if _needs_cast(a, jt))
    # jargs hold every tpu tensor's buffer array (dispatch._unwrap): views are read from it inside
    # the program, and an in-place op's program returns self's buffer's new array
    views = (_view_geometries(enumerate(args)), _view_geometries(kwargs.items()))
    write = None
    if inplace:
        write = (storage.is_plain(args[0], self_buffer), storage.geometry(args[0], self_buffer))
    static = {"_spec": spec, "_cast": (jt, cast, cast_kw), "_views": views, "_write": write}
    if fused:
        jargs, jkwargs = numbers_as_inputs(low, jargs, jkwargs)
        result = fusion.record(whole, jargs, {**jkwargs, **static}, output_signature(spec), op_name, offer)
        if inplace:
            fusion.note_write(self_buffer, self_buffer.array)
    else:
        donate = inplace and _held_only_by_the_buffer_and(self_buffer, jargs, jkwargs)  # before new lists hold it
        jargs, jkwargs = numbers_as_inputs(low, jargs, jkwargs)
        intent = inplace and self_buffer.array is jargs[0] and _uses(jargs[0], jargs, jkwargs) == 1
        result = op_jit.call(whole, jargs, {**jkwargs, **static}, output_signature(spec), offer, int(donate),
                             defer=op_name, intent=int(intent))
    if not inplace:
        return result
    self_buffer.array = result
    return WRITTEN


def _uses(array, jargs: list, jkwargs: dict) -> int:
    return sum(1 for v in (*jargs, *jkwargs.values()) if v is array)


def _held_only_by_the_buffer_and(buffer, jargs: list, jkwargs: dict) -> bool:
    """Self's buffer's array is referenced by the buffer and the program's arguments alone, and is the
    first of them only: the first call may donate it too (see fast_path.offer), so that an in-place
    op's donating program is the one compiled, not a second one on its next call."""
    array = buffer.array
    uses = _uses(array, jargs, jkwargs)
    return uses == 1 and jargs and jargs[0] is array and storage.held_only_by(buffer, extra=uses + 1)


def _needs_cast(value, jt) -> bool:
    """A tensor argument (on the device or a cpu scalar) whose dtype is not the promotion target."""
    return jt is not None and isinstance(value, torch.Tensor) and dtypes.to_jax(value.dtype) != jt


def _view_geometries(torch_values) -> tuple:
    """((position, index in its list or None, geometry), ...) of the tpu tensors (whole arguments or
    items of a list argument: cat's) that are views of their buffers: the program reads each view
    from the buffer's array it is given."""
    found = []
    for where, value in torch_values:
        items = enumerate(value) if type(value) in (list, tuple) else ((None, value),)
        for index, t in items:
            if isinstance(t, torch.Tensor) and not t.is_cpu:
                buf = storage.buffer_of(t)
                if not storage.is_plain(t, buf):
                    found.append((where, index, storage.geometry(t, buf)))
    return tuple(found)


def _read_views(values, views: tuple):
    """``values`` (jargs as a list, or jkwargs) with each view read from its buffer's array."""
    for where, index, geometry in views:
        if index is None:
            values[where] = storage.view_value(values[where], *geometry)
        else:
            items = values[where] = list(values[where])
            items[index] = storage.view_value(items[index], *geometry)
    return values


def numbers_as_inputs(low: Lowering, jargs, jkwargs) -> tuple[list, dict]:
    """For a traced lowering (one program, a fused segment): a Python int/bool where the schema
    takes a Tensor (``t + 0``) is a value, as a float is, so it becomes a program input (a weak
    device scalar). Baked in, XLA folds ``x + 0`` to ``x``, and -0.0 + 0 stays -0.0."""
    positions, names = _tensor_arguments(low)
    jargs = [op_jit._device_scalar(v) if i in positions and type(v) in (int, bool) else v for i, v in enumerate(jargs)]
    if jkwargs:
        jkwargs = {k: op_jit._device_scalar(v) if k in names and type(v) in (int, bool) else v
                   for k, v in jkwargs.items()}
    return jargs, jkwargs


_TENSOR_ARGUMENTS: dict = {}


def _tensor_arguments(low: Lowering) -> tuple[frozenset, frozenset]:
    """The positions and names of the arguments ``low``'s schema types as Tensor."""
    found = _TENSOR_ARGUMENTS.get(id(low))
    if found is None:
        arguments = low.overload._schema.arguments
        tensors = [(i, a.name) for i, a in enumerate(arguments) if isinstance(a.type, torch.TensorType)]
        found = _TENSOR_ARGUMENTS[id(low)] = (frozenset(i for i, _ in tensors), frozenset(n for _, n in tensors))
    return found


def _whole_program(low: Lowering, fn: Callable, op_name: str) -> Callable:
    def whole(*jargs, _spec: OpSpec, _cast: tuple, _views: tuple, _write: tuple | None, **jkwargs):
        self_buffer = jargs[0] if _write else None
        positional, named = _views
        if positional or named:
            jargs, jkwargs = _read_views(list(jargs), positional), _read_views(jkwargs, named)
        jt, cast, cast_kw = _cast
        if cast or cast_kw:
            jargs = [v.astype(jt) if i in cast else v for i, v in enumerate(jargs)]
            jkwargs = {k: v.astype(jt) if k in cast_kw else v for k, v in jkwargs.items()}
        if low.needs_spec:
            jkwargs["spec"] = _spec
        result = _fit_outputs(fn(*jargs, **jkwargs), _spec.outputs, op_name)
        if _write is None:
            return result
        whole_buffer, geometry = _write
        return storage.written(None if whole_buffer else self_buffer, result, *geometry)

    return whole


def _fit_outputs(result, spec, op_name: str):
    """Inside a program: the lowering's arrays as torch's output metadata says (see :func:`_wrap`)."""
    if isinstance(spec, tuple) and isinstance(result, (list, tuple)) and len(result) == len(spec):
        return tuple(_fit_outputs(r, s, op_name) for r, s in zip(result, spec))
    if isinstance(spec, Spec) and result is not None:
        if not isinstance(result, jax.Array):  # (an array run eagerly: asarray cost ~30 us there)
            result = jnp.asarray(result)
        return fit_result(result, spec.shape, spec.dtype, op_name)
    return result
