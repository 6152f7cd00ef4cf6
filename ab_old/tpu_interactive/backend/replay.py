"""PyTorch's own error for a call, by replaying it on CPU zero stand-ins of the tpu arguments.

Shape, dtype and aliasing checks are where users meet PyTorch's wording; replaying the call on CPU
tensors of the same geometry (and the same aliasing: tensors sharing a tpu storage share a CPU one)
gives exactly CPU's exception type and message without moving any data. Used on error paths only:
when a meta kernel refuses a call, when an ``out=`` argument has a dtype/device/aliasing that torch
may refuse, and when a lowering hits a Python-internal error (a bug of ours, see ``lowering_bug``).
"""
from __future__ import annotations

import os
import traceback
import warnings

import torch

_ALIAS_LIMIT = 1 << 24  # bytes of CPU zeros per distinct storage; beyond: a broadcast zero (no memory)
_PYTHON_BUGS = (ZeroDivisionError, AttributeError, KeyError, NameError, AssertionError, OverflowError)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _stand_in(value, memo: dict):
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            return value
        if value.device.type == "cpu":  # a copy (values and aliasing kept): the replay may resize out=
            st = value.untyped_storage()
            base = memo.get(("cpu", st.data_ptr()))
            if base is None:
                base = memo[("cpu", st.data_ptr())] = st.clone()
            return torch.empty(0, dtype=value.dtype).set_(base, value.storage_offset(), value.shape, value.stride())
        if value.dim() == 0:  # scalars carry their value: CPU checks it (overflow, ranges)
            return value.detach().cpu()
        st = value.untyped_storage()
        if st.nbytes() > _ALIAS_LIMIT:
            return torch.zeros((), dtype=value.dtype).expand(value.shape)
        base = memo.get(st.data_ptr())
        if base is None:
            base = memo[st.data_ptr()] = torch.zeros(st.nbytes(), dtype=torch.uint8).untyped_storage()
        return torch.empty(0, dtype=value.dtype).set_(base, value.storage_offset(), value.shape, value.stride())
    if isinstance(value, (list, tuple)):
        return type(value)(_stand_in(v, memo) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    return value


def cpu_error(op, args: tuple, kwargs: dict) -> Exception | None:
    """The exception CPU PyTorch raises for ``op`` on these arguments' shapes, dtypes and aliasing
    (values are zeros), or None if CPU accepts the call."""
    memo: dict = {}
    try:
        with warnings.catch_warnings():  # the replay's own warnings (out= resized) are not the user's
            warnings.simplefilter("ignore")
            op(*_stand_in(args, memo), **{k: _stand_in(v, memo) for k, v in kwargs.items()})
    except Exception as error:  # noqa: BLE001
        return error
    return None


def has_internal_overlap(t: torch.Tensor) -> bool:
    """ATen's definite internal overlap: a dimension of size > 1 with stride 0 (an expanded tensor)."""
    return any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride()))


def shares_storage(t: torch.Tensor, values) -> bool:
    ptr = t.untyped_storage().data_ptr()
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.device == t.device and v.untyped_storage().data_ptr() == ptr:
                return True
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def lowering_bug(exc: BaseException) -> bool:
    """True for a Python-internal exception that escaped a lowering: ZeroDivisionError, KeyError, ...,
    or a TypeError/ValueError/IndexError that neither torch's Python code nor a deliberate ``raise``
    of ours produced (i.e. one from jax/numpy or from Python itself): never a PyTorch error."""
    if getattr(exc, "_tpu_annotated", False) or isinstance(exc, RuntimeError):
        return False
    if isinstance(exc, _PYTHON_BUGS):
        return True
    if isinstance(exc, (TypeError, ValueError, IndexError)):
        frames = traceback.extract_tb(exc.__traceback__)
        if not frames:
            return False
        last = frames[-1]
        deliberate = last.filename.startswith(_OUR_DIR) and (last.line or "").startswith("raise ")
        return not (deliberate or last.filename.startswith(_TORCH_DIR))
    return False


def _max_dim(values) -> int:
    stack, most = list(values), 0
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            most = max(most, v.dim())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return most


def pytorch_error(op, op_name: str, args: tuple, kwargs: dict, exc: BaseException) -> Exception:
    """For a lowering bug: CPU's error for the call if CPU refuses it too, else a RuntimeError
    naming the op (``errors.annotate`` adds the inputs and the user's line)."""
    if _max_dim((args, tuple(kwargs.values()))) > 64:  # numpy's / XLA's limit, worded as ATen's
        return RuntimeError("only tensors with up to 64 dims are supported (tpu arrays have at most 64)")
    error = cpu_error(op, args, kwargs) if op is not None else None
    if error is not None:
        return error
    return RuntimeError(f"{op_name}: the tpu lowering failed on these inputs, which CPU PyTorch accepts "
                        f"(internal {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                        "please report it")
