"""Turn registry entries into PrivateUse1 kernels; derive in-place/out variants; the fallback.

Every kernel does the same few steps, in this order:
1. output metadata from torch's meta kernel (cached per argument signature): torch's own shape
   checks, broadcasting and dtype promotion, so errors and result dtypes match CPU PyTorch;
2. read the inputs as jax.Arrays (device checks: a cpu tensor of dim > 0 is an error, 0-dim cpu
   tensors are scalars, as on CUDA);
3. call the JAX lowering; wrap its results in fresh tpu tensors (or write them into ``self``/``out``);
4. in synchronous mode, block on the result (and check it for NaN/Inf if asked), so a failure is
   raised here, at the user's line.
Any exception is re-raised with the aten op, the inputs and the user's source line attached.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import compile_ahead, dtypes, fast_path, fusion, op_jit, planned, storage, unrecorded
from .config import config
from .errors import DeviceMismatchError, NonFiniteError, annotate
from .registry import UNCHANGED, Lowering, Promote, op_key, pallas_path, resolve
from .specs import OpSpec, Spec, fit_result, output_signature
from .replay import cpu_error as _cpu_error, has_internal_overlap, lowering_bug, pytorch_error, shares_storage
from .stats import STATS, record_transfer


# The concrete eager array type: isinstance(x, jax.Array) goes through ABC machinery (~1 us).
_ARRAY = type(jnp.zeros(()))


class TPUFallbackWarning(UserWarning):
    """An op ran on the CPU because it has no tpu lowering."""


_META_CACHE: dict = {}
_META_CACHE_LIMIT = 50_000


# ---------------------------------------------------------------- metadata via meta kernels
def _sig(value, scalars_by_type: bool):
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype)
    if value is None or type(value) is int or type(value) is bool:
        return value
    if isinstance(value, (list, tuple)):
        return tuple([_sig(v, scalars_by_type) for v in value])
    if isinstance(value, (float, complex)):
        # floats never change an elementwise op's output metadata, only its dtype category
        return type(value) if scalars_by_type else (type(value), value)
    return value  # ints (dims, sizes) always by value


_META_DEVICE = torch.device("meta")


def to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if type(value) is torch.device:  # _to_copy(device=tpu): the meta kernel's result stays on meta
        return _META_DEVICE
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta(v) for v in value)
    return value


def _spec_of(value):
    if isinstance(value, torch.Tensor):
        return Spec(value.shape, value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_spec_of(v) for v in value)
    return value


def common_dtype(args) -> torch.dtype | None:
    operands = [a for a in args if isinstance(a, (torch.Tensor, bool, int, float, complex))][:2]
    if not operands or not any(isinstance(a, torch.Tensor) for a in operands):
        return None
    if len(operands) == 1:
        return operands[0].dtype
    return torch.result_type(*operands)


def _nansum_meta(x, dim=None, keepdim=False, *, dtype=None):
    return torch.ops.aten.nansum(x, None if dim is not None and len(dim) == 0 else dim, keepdim, dtype=dtype)


def _roll_meta(x, shifts, dims=()):
    if x.numel() == 0:  # CPU and CUDA clone an empty tensor before wrapping any dim; the ref wraps first
        return torch.ops.aten.roll(torch.empty(x.shape, dtype=x.dtype), shifts, dims).to(_META_DEVICE)
    return torch.ops.aten.roll(x, shifts, dims)


def unbatched_target(x, target):
    """CPU's nll_loss forward takes a 1-element 1-d target of a 1-d input as its class (no batch)."""
    return target.reshape(()) if x.ndim == 1 and target.ndim == 1 and target.shape[0] == 1 else target


def _nll_loss_meta(x, target, *rest):
    return torch.ops.aten.nll_loss_forward(x, unbatched_target(x, target), *rest)


# torch Python meta kernels whose output metadata or errors differ from what CPU's kernels give, each with
# a call that gives CPU's: nansum's takes an empty dim list as "no dims" (CPU: every dim; a [1] input kept
# its shape); roll's checks the dims of an empty tensor, which CPU never reads; nll_loss's forward refuses
# a 1-d input's 1-element target (its backward refuses it on CPU too)
_META_FIXES = {torch.ops.aten.nansum.default: _nansum_meta, torch.ops.aten.roll.default: _roll_meta,
               torch.ops.aten.nll_loss_forward.default: _nll_loss_meta}


def meta_spec(op: torch._ops.OpOverload, args: tuple, kwargs: dict, scalars_by_type: bool,
              want_common: bool = False) -> OpSpec:
    key = (op, _sig(args, scalars_by_type), _sig(tuple(kwargs.items()), scalars_by_type) if kwargs else ())
    spec = _META_CACHE.get(key)
    if spec is None:
        meta_args = to_meta(args)
        meta_kwargs = {k: to_meta(v) for k, v in kwargs.items()}
        try:
            out = _META_FIXES.get(op, op)(*meta_args, **meta_kwargs)
        except Exception as meta_error:  # noqa: BLE001 - any meta failure: CPU's error for the call, if any
            raise _cpu_error(op, args, kwargs) or meta_error
        common = common_dtype(meta_args) if want_common else None
        spec = OpSpec(_spec_of(out), common)
        if len(_META_CACHE) > _META_CACHE_LIMIT:
            _META_CACHE.clear()
        _META_CACHE[key] = spec
    return spec


# ---------------------------------------------------------------- reading arguments
def to_host(t: torch.Tensor) -> np.ndarray:
    unrecorded.end("host read")  # a flush point: it ends an unrecorded stretch of fused mode
    value = storage.read(t)  # in fused mode this runs the recorded segment (compiles are not transfer time)
    start = time.perf_counter()
    array = np.asarray(value)
    record_transfer("d2h", array.nbytes, time.perf_counter() - start)
    return array


def host_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view (or copy) of cpu tensor t's logical value."""
    return dtypes.torch_to_numpy(t.detach().resolve_conj().resolve_neg().contiguous())


def cpu_to_jax(t: torch.Tensor) -> jax.Array:
    """``t``'s value on the device. The transfer may read t's memory asynchronously, and the caller
    may change t next: small values are copied first, large ones waited for (non_blocking copies
    from pinned memory use transfers.start instead)."""
    start = time.perf_counter()
    host = host_array(t)
    if host.nbytes <= _COPY_BELOW:  # a private copy: device_put compiles nothing (jnp.asarray: a program per shape)
        array = jax.device_put(host.copy())
    else:
        array = jnp.asarray(host)
        array.block_until_ready()
    record_transfer("h2d", host.nbytes, time.perf_counter() - start)
    return array


_COPY_BELOW = 1 << 16


def _unwrap(value, allow_cpu: bool, lazy: bool = False, buffers: bool = False):
    """A tensor argument's value (a recorded fusion.Lazy where ``lazy``, in fused mode; its buffer's
    whole array where ``buffers``: a planned program reads views itself, planned.py)."""
    if isinstance(value, torch.Tensor):
        if not value.is_cpu:  # is_cpu is a cheap flag; .device builds an object
            if buffers:
                buf = storage.buffer_of(value)
                return storage.stored(buf) if lazy else buf.value()
            if lazy:  # fused mode records; else compile_ahead.call takes deferred values
                return storage.read_lazy(value) if fusion.active() else storage.read_deferred(value)
            return storage.read(value)
        if value.dim() == 0 or allow_cpu:
            return cpu_to_jax(value)
        raise DeviceMismatchError("cpu tensor")  # rewritten with the argument name by _device_error
    if isinstance(value, (list, tuple)) and value and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_unwrap(v, allow_cpu, lazy, buffers) if v is not None else None for v in value)
    return value


def _device_error(op_name: str, schema, args, kwargs) -> DeviceMismatchError:
    names = [a.name for a in schema.arguments]
    pairs = list(zip(names, args)) + list(kwargs.items())
    for name, value in pairs:
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor) and v.device.type != "tpu" and v.dim() > 0:
                return DeviceMismatchError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:0 and {v.device}! (when checking argument for argument {name} in {op_name})"
                )
    return DeviceMismatchError(f"Expected all tensors to be on the same device ({op_name})")


def promote_args(jargs: list, jkwargs: dict, target: torch.dtype | None):
    if target is None:
        return jargs, jkwargs
    jt = dtypes.to_jax(target)

    def cast(v):
        if (type(v) is _ARRAY or type(v) is fusion.Lazy) and v.dtype != jt:
            return v.astype(jt)
        return v

    return [cast(v) for v in jargs], {k: cast(v) for k, v in jkwargs.items()}


# ---------------------------------------------------------------- wrapping results
def _wrap(result, spec, low: Lowering, op_name: str):
    if spec is None:  # data-dependent shape: trust the lowering's shape
        if result is None:  # an undefined output (an unrequested grad)
            return None
        if isinstance(result, (list, tuple)):
            return type(result)(_wrap(r, None, low, op_name) for r in result)
        array = jnp.asarray(result)
        dtype = low.out_dtype(array) if low.out_dtype else dtypes.to_torch(array.dtype)
        if array.dtype != dtypes.to_jax(dtype):
            array = array.astype(dtypes.to_jax(dtype))
        return storage.new_tensor(array, array.shape, dtype)
    if isinstance(spec, tuple):
        if not isinstance(result, (list, tuple)) or len(result) != len(spec):
            raise RuntimeError(f"internal error: lowering of {op_name} returned {type(result).__name__}, "
                               f"torch expects {len(spec)} outputs")
        # an output torch's meta kernel leaves undefined (None, e.g. an unrequested grad) stays None
        return tuple(None if r is None and s is None else _wrap(r, s, low, op_name) for r, s in zip(result, spec))
    if not isinstance(spec, Spec):  # an int output is torch's meta value where the lowering leaves it None (max_q)
        return spec if result is None and type(spec) is int else result
    # asarray is slow on arrays (and a recorded Lazy is no array yet)
    array = result if type(result) is _ARRAY or type(result) is fusion.Lazy else jnp.asarray(result)
    return storage.new_tensor(fit_result(array, spec.shape, spec.dtype, op_name), spec.shape, spec.dtype)


def _iter_tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _iter_tensors(v)


def synchronize_outputs(outputs, op_name: str) -> None:
    arrays = [storage.buffer_of(t).value() for t in _iter_tensors(outputs) if t.device.type == "tpu"]
    jax.block_until_ready(arrays)
    if config.nan_check:
        for t, a in zip(_iter_tensors(outputs), arrays):
            if jnp.issubdtype(a.dtype, jnp.inexact) and a.size:
                bad = int(jnp.sum(~jnp.isfinite(a)))
                if bad:
                    raise NonFiniteError(f"{op_name} produced NaN/Inf: {bad} of {a.size} elements of its "
                                         f"{tuple(t.shape)} {t.dtype} result are not finite")


# ---------------------------------------------------------------- kernels
def raise_annotated(exc: BaseException, op_name: str, schema, args, kwargs) -> NoReturn:
    """Raise ``exc`` with the op, its inputs and the user's line in the message (a copy of the same
    type); an exception that is already annotated, or the one being handled unchanged, as itself."""
    new = annotate(exc, op_name, schema, args, kwargs)
    if new is exc and exc is sys.exc_info()[1]:
        raise exc
    raise new from None


def _run_lowering(low: Lowering, spec, args, kwargs, schema, op_name, token=None):
    """The lowering's result for the call (``token``: the in-place kernel's fast-path token; its
    planned program writes self's buffer and this returns WRITTEN)."""
    # fused mode records ops with torch's output metadata; data-dependent shapes run now
    if spec is None and config.fuse and unrecorded.running():
        unrecorded.end("a value was needed")  # where a recorded segment would flush: the stretch ends too
    fused = spec is not None and config.fuse and fusion.active()
    # a pending key: the call's program (recorded, in fused mode) becomes a plan of the C++ fast path
    pending = fast_path.take(low if token is None else token) if spec is not None else None
    if pending is not None and token is not None and not storage.simply_writable(args[0], storage.buffer_of(args[0])):
        pending = None  # storage.write's own checks and errors
    try:
        planned_call = pending is not None
        # a planned call may take deferred values as inputs (compile_ahead.py): it is deferred too, or
        # runs them first
        lazy = fused or planned_call and compile_ahead.has_pending()
        jargs = [_unwrap(a, low.allow_cpu_tensors, lazy, planned_call) for a in args]
        jkwargs = {k: _unwrap(v, low.allow_cpu_tensors, lazy, planned_call) for k, v in kwargs.items()} if kwargs else {}
    except DeviceMismatchError:
        raise _device_error(op_name, schema, args, kwargs) from None
    if low.dtypes is not None and spec is not None:  # CPU has no kernel for some result dtypes
        low.check_dtype(spec.dtype)
    fn, path = low.fn, None
    if low.pallas_fn is not None:
        fn, path = pallas_path(low, config.pallas, jargs, jkwargs)
    if pending is not None:  # the C++ fast path runs this call's next repeats from its plan
        return planned.run(low, fn, spec, jargs, jkwargs, (args, kwargs, pending, path, token is not None), op_name,
                           fused)
    jargs, jkwargs = promote_args(jargs, jkwargs, planned.promotion_target(low, spec))
    if low.needs_spec:
        jkwargs["spec"] = spec
    if spec is None or not (fused or config.jit_ops):  # data-dependent output shapes: never traceable
        return fn(*jargs, **jkwargs)
    jargs, jkwargs = planned.numbers_as_inputs(low, jargs, jkwargs)
    if fused:
        return fusion.record(fn, jargs, jkwargs, output_signature(spec), op_name, eager=None if config.jit_ops else fn)
    return op_jit.call(fn, jargs, jkwargs, output_signature(spec))


def _guarded(op_name: str, schema, body: Callable, op=None) -> Callable:
    """Count, time, sync and attribute errors around a kernel body. A Python-internal exception from
    a lowering (a bug) becomes PyTorch's error for the call, or a RuntimeError naming the op."""
    op_counts, op_seconds = STATS.op_counts, STATS.op_seconds

    def kernel(*args, **kwargs):
        start = time.perf_counter()
        op_counts[op_name] += 1
        try:
            out = body(args, kwargs)
            if config.sync or config.nan_check:
                synchronize_outputs(out, op_name)
            return out
        except BaseException as exc:  # noqa: BLE001 - re-raised with context, same type
            STATS.errors += 1
            if lowering_bug(exc):
                exc = pytorch_error(op, op_name, args, kwargs, exc)
            raise_annotated(exc, op_name, schema, args, kwargs)
        finally:
            op_seconds[op_name] += time.perf_counter() - start

    kernel.__name__ = op_name.replace("::", "_").replace(".", "_")
    return kernel


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def make_functional(low: Lowering) -> Callable:
    op = low.overload
    op_name = f"aten::{low.name}"
    by_type = low.meta_by_type
    composite_when = low.composite_when

    if low.raw:
        return _guarded(op_name, op._schema, lambda args, kwargs: low.fn(*args, **kwargs), op)

    def body(args, kwargs):
        if composite_when is not None and composite_when(*args, **kwargs):
            fast_path.take(low)  # no plan for this call's key
            return op.redispatch(_COMPOSITE, *args, **kwargs)
        spec = meta_spec(op, args, kwargs, by_type, low.promote is Promote.COMMON) if low.meta else None
        _check_arguments(low, args, kwargs)
        result = _run_lowering(low, spec, args, kwargs, op._schema, op_name)
        return _wrap(result, spec.outputs if spec else None, low, op_name)

    kernel = _guarded(op_name, op._schema, body, op)
    return fast_path.front(kernel, low, op_name, False, by_type, list_views=True) if low.meta else kernel


def _check_arguments(low: Lowering, args, kwargs) -> None:
    """The lowering's declared checks of a call's arguments: one dtype for all (``strict_dtypes``),
    and argument values checked on the host (``host_check``)."""
    if low.strict_dtypes:
        _check_same_dtypes(low.overload, args, kwargs)
    if low.host_check is not None:
        low.host_check(args, kwargs)


def cast_refused(result: torch.dtype, out: torch.dtype) -> RuntimeError:
    """CPU's error for writing a ``result`` dtype into an ``out`` tensor that cannot hold it."""
    return RuntimeError(f"result type {dtypes.scalar_name(result)} can't be cast to the desired output type "
                        f"{dtypes.scalar_name(out)}")


def _check_same_dtypes(op, args, kwargs) -> None:
    kinds = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    if len(kinds) > 1:
        error = _cpu_error(op, args, kwargs)  # CPU's exact message for this mix, if CPU refuses it
        if error is not None:
            raise error


def make_inplace(low: Lowering, inplace: torch._ops.OpOverload) -> Callable:
    op = low.overload
    op_name = f"aten::{op_key(inplace)}"
    by_type = low.meta_by_type
    fresh_value = low.fresh_value

    def body(args, kwargs):
        meta_spec(inplace, args, kwargs, by_type)  # torch's checks: castability, broadcast to self
        for other in args[1:]:
            if isinstance(other, torch.Tensor):
                storage.check_no_partial_overlap(args[0], other)
        _check_arguments(low, args, kwargs)
        if fresh_value is not None and storage.never_written(args[0]):
            value = fresh_value(*args, **kwargs)
            if value is not None:
                fast_path.take(token)  # no plan for this call's key (self holds no array)
                if value is not UNCHANGED:
                    storage.fill_new(args[0], value)
                return args[0]
        spec = meta_spec(op, args, kwargs, by_type, low.promote is Promote.COMMON) if low.meta else None
        result = _run_lowering(low, spec, args, kwargs, op._schema, op_name, token)
        self = args[0]
        if result is not planned.WRITTEN:
            storage.write(self, result)
        return self

    token = (low, inplace)  # the fast path's token of this kernel (not the functional one's)
    kernel = _guarded(op_name, inplace._schema, body, inplace)
    return fast_path.front(kernel, token, op_name, True, by_type) if low.meta else kernel


def out_names(schema) -> list[str]:
    """The schema's out= arguments (keyword-only, written to)."""
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only]


def split_outs(names: list[str], args: tuple, kwargs: dict) -> tuple[list, tuple, dict]:
    """(out= tensors, the other positional args, the other keyword args) of a call; a boxed call may
    pass the out= tensors positionally, last."""
    kwargs = dict(kwargs)
    if all(n in kwargs for n in names):
        return [kwargs.pop(n) for n in names], args, kwargs
    return list(args[len(args) - len(names):]), args[: len(args) - len(names)], kwargs


def check_outs_on_device(outs) -> None:
    """out= tensors (and Tensor[] out= lists) on another device are refused, as CUDA refuses CPU ones."""
    for out in outs:
        if isinstance(out, (list, tuple)):
            check_outs_on_device(out)
        elif isinstance(out, torch.Tensor) and out.device.type != "tpu":
            raise RuntimeError(f"Expected out tensor to have device tpu:0, but got {out.device} instead")


def make_out(low: Lowering, out_op: torch._ops.OpOverload) -> Callable:
    op = low.overload
    op_name = f"aten::{op_key(out_op)}"
    names = out_names(out_op._schema)
    by_type = low.meta_by_type

    def body(call_args, call_kwargs):
        outs, args, kwargs = split_outs(names, call_args, call_kwargs)
        spec = meta_spec(op, args, kwargs, by_type, low.promote is Promote.COMMON) if low.meta else None
        if _out_may_be_refused(outs, spec, args, kwargs):
            error = _cpu_error(out_op, call_args, call_kwargs)  # exact dtype / aliasing rules of this op
            if error is not None:
                raise error
            check_outs_on_device(outs)
        _check_arguments(low, args, kwargs)
        result = _run_lowering(low, spec, args, kwargs, op._schema, op_name)
        results = result if len(names) > 1 else (result,)
        for i, (out, value) in enumerate(zip(outs, results)):  # not outs.index(): Tensor == is elementwise
            if type(value) is not fusion.Lazy:
                value = jnp.asarray(value)
            expected = _spec_dtype(spec, len(names), i) or dtypes.to_torch(value.dtype)
            if not torch.can_cast(expected, out.dtype):
                raise _cpu_error(out_op, call_args, call_kwargs) or cast_refused(expected, out.dtype)
            if tuple(out.shape) != value.shape:
                storage.replace_storage(out, None, value.shape)
            storage.write(out, value)
        return outs[0] if len(names) == 1 else tuple(outs)

    return _guarded(op_name, out_op._schema, body, out_op)


def _out_may_be_refused(outs: list, spec, args, kwargs) -> bool:
    """out= tensors that some ops refuse (each op has its own rule, CPU replay applies it): a dtype
    other than the result's, another device, aliasing an input, or internal overlap."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    for i, out in enumerate(outs):
        # no meta kernel (spec None): the first input's dtype is the likely result dtype
        expected = _spec_dtype(spec, len(outs), i) if spec is not None else getattr(first, "dtype", None)
        if (expected is not None and out.dtype != expected) or out.device.type != "tpu" \
                or has_internal_overlap(out) or shares_storage(out, (args, tuple(kwargs.values()))):
            return True
    return False


def _spec_dtype(spec, n, i):
    if spec is None:
        return None
    outs = spec.outputs if n > 1 else (spec.outputs,)
    return outs[i].dtype if isinstance(outs[i], Spec) else None


def derived_variants(name: str) -> list[tuple[str, torch._ops.OpOverload]]:
    """(kind, overload) for the in-place and out= siblings of functional overload ``name``."""
    packet_name = name.split(".")[0]
    functional = resolve(name)
    # match by argument names AND types: overload names lie (pow_.Scalar is pow.Tensor_Scalar's in-place
    # form, not pow.Scalar's), and names alone match pow.Scalar_out to pow.Tensor_Scalar
    base_args = _arg_types(functional._schema)
    found = []
    inplace_packet = getattr(torch.ops.aten, packet_name + "_", None)
    if inplace_packet is not None:
        for ov_name in inplace_packet.overloads():
            ov = getattr(inplace_packet, ov_name)
            if _arg_types(ov._schema) == base_args:
                found.append(("inplace", ov))
                break
    packet = getattr(torch.ops.aten, packet_name)
    for ov_name in packet.overloads():
        ov = getattr(packet, ov_name)
        outs = out_names(ov._schema)
        if outs and _arg_types(ov._schema, outs) == base_args:
            found.append(("out", ov))
    return found


def _arg_types(schema, skip=()) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if a.name not in skip]
