"""Ops without a tpu lowering: a torch._decomp decomposition if one exists, a generic alias for view
ops, else the CPU fallback (copy to host, run, copy back, mutations written back) with a one-time
``TPUFallbackWarning`` naming the op, or ``NotImplementedError`` when ``config.cpu_fallback = False``."""
from __future__ import annotations

import time
import warnings

import torch

from . import dtypes, storage
from .config import config
from .dispatch import (TPUFallbackWarning, check_outs_on_device, cpu_to_jax, out_names, raise_annotated, split_outs,
                       synchronize_outputs, to_host, to_meta)
from .errors import user_frame
from .replay import cpu_error
from .stats import STATS

_warned: set[str] = set()


_DECOMPS: dict | None = None
_decomposing: set = set()  # ops whose decomposition is running now (guards against cycles)


def decompositions() -> dict:
    """torch._decomp's aten-level decompositions; prims-based refs are left out (their prims call
    the same aten op back, a cycle), so those ops go to the CPU fallback instead."""
    global _DECOMPS
    if _DECOMPS is None:
        from torch._decomp import decomposition_table

        _DECOMPS = {op: fn for op, fn in decomposition_table.items()
                    if not getattr(fn, "__module__", "").startswith(("torch._refs", "torch._prims"))}
    return _DECOMPS


def _cpu_copy(value):
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        # a torch-owned copy: the CPU kernel may resize it (out= arguments)
        return dtypes.numpy_to_torch(to_host(value), value.dtype).clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    return value


def _to_tpu(value):
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return storage.from_array(cpu_to_jax(value), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tpu(v) for v in value)
    return value


def _warn_fallback(op_name: str) -> None:
    if op_name in _warned:
        return
    _warned.add(op_name)
    message = (f"{op_name} has no tpu lowering; it ran on the CPU (inputs copied to host and back). "
               "Counted in tpu_interactive.stats()['fallback_counts']; set "
               "tpu_interactive.config.cpu_fallback = False to make this an error.")
    where = user_frame(3)
    if where is not None:
        warnings.warn_explicit(message, TPUFallbackWarning, where[0], where[1])
    else:
        warnings.warn(message, TPUFallbackWarning, stacklevel=3)


def _write_back(dst: torch.Tensor, src: torch.Tensor) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        storage.replace_storage(dst, None, src.shape)
    storage.write(dst, cpu_to_jax(src))


def cpu_fallback(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    op_name = f"{op._schema.name}.{op._overloadname}"  # real namespace: custom ops aren't aten
    if not config.cpu_fallback:
        raise NotImplementedError(
            f"{op_name} has no tpu lowering and CPU fallback is disabled "
            "(tpu_interactive.config.cpu_fallback = False)"
        )
    _warn_fallback(op_name)
    STATS.fallback_counts[op_name] += 1
    schema = op._schema
    cpu_args = [_cpu_copy(a) for a in args]
    cpu_kwargs = {k: _cpu_copy(v) for k, v in kwargs.items()}
    out = op(*cpu_args, **cpu_kwargs)
    # write back whatever the op mutated (Tensor(a!) and Tensor(a!)[] alike, read from the schema's
    # alias annotations), then return the original (aliased) tpu tensors for those
    written: dict[int, torch.Tensor] = {}
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            original = args[i] if i < len(args) else kwargs.get(arg.name)
            mutated = cpu_args[i] if i < len(args) else cpu_kwargs.get(arg.name)
            pairs = zip(original, mutated) if isinstance(original, (list, tuple)) else [(original, mutated)]
            for dst, src in pairs:
                if isinstance(dst, torch.Tensor) and dst.device.type == "tpu":
                    _write_back(dst, src)
                    written[id(src)] = dst

    def back(value):
        if isinstance(value, torch.Tensor) and id(value) in written:
            return written[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(back(v) for v in value)
        return _to_tpu(value)
    return back(out)


def _is_view_op(schema) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def generic_view(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """A view op without a tpu kernel: get its geometry from meta, then alias with as_strided."""
    base = args[0]
    numel = base.untyped_storage().nbytes() // base.dtype.itemsize
    meta_base = torch.empty(max(numel, 1), dtype=base.dtype, device="meta").as_strided(
        base.shape, base.stride(), base.storage_offset())
    out = op(meta_base, *to_meta(args[1:]), **{k: to_meta(v) for k, v in kwargs.items()})

    def alias(m):
        if isinstance(m, torch.Tensor):
            if m.dtype != base.dtype:
                raise NotImplementedError(f"view op {op} changes dtype; not supported on tpu")
            return torch.ops.aten.as_strided.default(base, m.shape, m.stride(), m.storage_offset())
        if isinstance(m, (list, tuple)):
            return type(m)(alias(v) for v in m)
        return m

    return alias(out)


def fallback(op: torch._ops.OpOverload, *args, **kwargs):
    op_name = f"{op._schema.name}.{op._overloadname}"  # real namespace: custom ops aren't aten
    decomposition = decompositions().get(op)
    start = time.perf_counter()
    outs = out_names(op._schema)
    try:
        if outs:  # the CPU kernel or a decomposition would fill a CPU out= from tpu inputs silently
            check_outs_on_device(split_outs(outs, args, kwargs)[0])
        if decomposition is not None and op not in _decomposing:
            STATS.decomposition_counts[op_name] += 1
            _decomposing.add(op)
            try:
                return decomposition(*args, **kwargs)
            except RuntimeError as exc:
                # an out= misuse the decomposition words its own way ("Attempting to cast ...");
                # CPU's kernel has its own words for it (its replay on stand-ins gives them)
                if not outs:
                    raise
                raise cpu_error(op, args, kwargs) or exc from None
            finally:
                _decomposing.discard(op)
        if _is_view_op(op._schema) and args and isinstance(args[0], torch.Tensor):
            STATS.op_counts[op_name] += 1
            return generic_view(op, args, kwargs)
        out = cpu_fallback(op, args, kwargs)
        if config.sync or config.nan_check:
            synchronize_outputs(out, op_name)
        return out
    except BaseException as exc:  # noqa: BLE001
        STATS.errors += 1
        raise_annotated(exc, op_name, op._schema, args, kwargs)
    finally:
        STATS.op_seconds[op_name] += time.perf_counter() - start
