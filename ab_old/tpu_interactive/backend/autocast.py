"""``torch.autocast("tpu")``: CUDA's op policy as Python kernels at the ``AutocastPrivateUse1`` key.

Torch registers autocast kernels in C++ for CUDA/CPU/XPU/MPS/..., none for PrivateUse1, and no
fallthrough either, so without this every op under ``torch.autocast("tpu")`` fails with "Could not
run ... from the 'Autocasttpu' backend". Here: a fallthrough for every op, and for each op of the
policy table (``autocast_policy.py``) a kernel that casts its floating tpu inputs as CUDA's
``WrapFunction_`` does, then runs the op with the autocast key excluded (as torch's
``ExcludeDispatchKeyGuard`` does). The default autocast dtype on tpu is bfloat16.

Differences from CUDA's C++ kernels: no cast cache (a weight used twice is cast twice; results are
identical), and the bfloat16 default is set for the thread that registers the backend (torch keeps
the autocast dtype per thread; other threads start from torch's PrivateUse1 default, float16).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from . import autocast_policy as policy

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_libraries: list[torch.library.Library] = []


def _eligible(value: Any) -> bool:
    """CUDA's ``is_eligible``: a floating tensor of this device, double excluded."""
    return (isinstance(value, torch.Tensor) and value.device.type == "tpu" and value.is_floating_point()
            and value.dtype != torch.float64)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    """CUDA's ``promote_type``: start at the autocast dtype; any float32 input makes it float32."""
    lower = torch.get_autocast_dtype("tpu")
    current = lower

    def visit(value):
        nonlocal current
        if isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif _eligible(value):
            if current == torch.float32 or value.dtype == torch.float32:
                current = torch.float32
            elif not (current == lower and value.dtype == lower):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")

    for v in (*args, *kwargs.values()):
        visit(v)
    return current


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    return _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}


def _lower_precision_fp(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype("tpu"))
    return op(*args, **kwargs)


def _fp32(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, torch.float32)
    return op(*args, **kwargs)


def _promote(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, _widest(args, kwargs))
    return op(*args, **kwargs)


def _fp32_set_opt_dtype(op, args, kwargs):
    if args and _eligible(args[0]):
        names = [a.name for a in op._schema.arguments]
        position = names.index("dtype")
        if len(args) > position:  # dtype given positionally: keep the caller's, unless None
            if args[position] is None:
                args = (*args[:position], torch.float32, *args[position + 1:])
        elif kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
    return op(*args, **kwargs)


def _fp32_append_dtype(target: torch._ops.OpOverload) -> Callable:
    def run(op, args, kwargs):
        first = args[0]
        out_type = torch.float32 if _eligible(first) else first.dtype
        # the dispatcher drops trailing arguments equal to their defaults; the target has no defaults
        given = len(args)
        args = (*args, *(a.default_value for a in op._schema.arguments[given:] if a.name not in kwargs))
        return target(*args, **kwargs, dtype=out_type)

    return run


def _banned(message: str) -> Callable:
    def run(op, args, kwargs):
        raise RuntimeError(message)

    return run


def _resolve(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


_running = threading.local()  # inside an autocast kernel on this thread


def _kernel(op: torch._ops.OpOverload, rule: Callable) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if getattr(_running, "inside", False):
                # an op the autocast kernel's op runs (a decomposition's bmm) reached autocast again:
                # torch.func transforms (grad: compile_train_step) dispatch to their inner level with
                # the key set saved when the transformed op began, which drops the guard above. Cast
                # here, the inner level would compute in another dtype than the outer one's autograd
                # recorded, and the backward fails ("expected scalar type BFloat16 but found Float")
                return op(*args, **kwargs)
            _running.inside = True
            try:
                return rule(op, args, kwargs)
            finally:
                _running.inside = False

    kernel.__name__ = f"autocast_{op.__name__.replace('.', '_')}"
    return kernel


def rules() -> dict[str, Callable]:
    """aten overload name -> the cast rule run for it under ``torch.autocast("tpu")``."""
    table: dict[str, Callable] = {}
    table.update(dict.fromkeys(policy.LOWER_PRECISION_FP, _lower_precision_fp))
    table.update(dict.fromkeys(policy.FP32, _fp32))
    table.update(dict.fromkeys(policy.FP32_SET_OPT_DTYPE, _fp32_set_opt_dtype))
    table.update({name: _fp32_append_dtype(_resolve(target)) for name, target in policy.FP32_APPEND_DTYPE.items()})
    table.update(dict.fromkeys(policy.PROMOTE, _promote))
    table.update({name: _banned(message) for name, message in policy.BANNED.items()})
    return table


def register() -> None:
    """Install the autocast kernels and the fallthrough; make bfloat16 the default autocast dtype."""
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    for name, rule in rules().items():
        lib.impl(name, _kernel(_resolve(name), rule), _KEY)
    _libraries.extend([fallthrough, lib])
    torch.set_autocast_dtype("tpu", torch.bfloat16)
