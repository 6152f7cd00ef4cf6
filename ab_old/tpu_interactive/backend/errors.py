"""Error attribution: name the aten op, the inputs and the user's own source line."""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from types import CodeType
from typing import Any

import jax
import torch

# this package's folder: tpu_interactive/backend/errors.py -> tpu_interactive/
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, jax)
) + (_PACKAGE_DIR + os.sep,) + tuple(
    p + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if p
)
_INTERNAL_NAMES = ("jaxlib", os.sep + "IPython" + os.sep, os.sep + "ipykernel" + os.sep, os.sep + "_pytest" + os.sep,
                   os.sep + "pluggy" + os.sep, os.sep + "transformers" + os.sep, "<frozen ")


class DeviceMismatchError(RuntimeError):
    pass


class NonFiniteError(FloatingPointError):
    """Raised under nan_check when an op produces NaN or Inf."""


def is_internal(filename: str) -> bool:
    if os.sep + ".." + os.sep in filename:  # imported through a relative sys.path entry ("bench/../pkg")
        filename = os.path.normpath(filename)
    return filename.startswith(_INTERNAL_DIRS) or any(n in filename for n in _INTERNAL_NAMES)


def user_frame(skip: int = 1) -> tuple[str, int, str, str] | None:
    """(file, line, function, source) of the innermost frame outside torch/jax/this package."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal(filename):
            lineno = frame.f_lineno
            source = linecache.getline(filename, lineno, frame.f_globals).strip()
            return filename, lineno, frame.f_code.co_name, source
        frame = frame.f_back
    return None


# id(code) -> (code, internal): keyed by id because a code object's hash is not cached (CPython hashes
# its bytecode and constants on every call: ~0.5 us for a large torch function, per frame walked)
_code_is_internal: dict[int, tuple[CodeType, bool]] = {}


# the C++ extension's walk (csrc/tpu_native.cpp), once it is installed: ~5x faster under deep stacks
NATIVE_USER_SITE: list = [None]


def user_site(skip: int = 2) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost user frame: the cheap form of :func:`user_frame` for
    the hot path of fused mode (which frames are internal is remembered per code object)."""
    native = NATIVE_USER_SITE[0]
    if native is not None:
        return native(skip, is_internal)
    frame = sys._getframe(skip)
    cache = _code_is_internal
    while frame is not None:
        code = frame.f_code
        entry = cache.get(id(code))
        if entry is None or entry[0] is not code:  # an id reused after a code object was freed
            entry = cache[id(code)] = (code, is_internal(code.co_filename))
        if not entry[1]:
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        shape = "x".join(str(s) for s in value.shape) or "scalar"
        return f"Tensor[{shape}, {str(value.dtype).replace('torch.', '')}, {value.device}]"
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def describe_call(schema, args: tuple, kwargs: dict) -> str:
    names = [a.name for a in schema.arguments] if schema is not None else []
    parts = []
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        parts.append(f"{name}={describe(value)}")
    parts.extend(f"{k}={describe(v)}" for k, v in kwargs.items())
    return ", ".join(parts)


def hint_for(exc: BaseException, args: tuple) -> str | None:
    text = str(exc)
    if isinstance(exc, DeviceMismatchError):
        return "call .to('tpu') on the cpu tensor (or .cpu() on the tpu one) so both live on one device"
    if "can't be cast" in text or "dtype" in text.lower() and "mismatch" in text.lower():
        return "convert one input with .to(dtype) so the dtypes agree"
    if isinstance(exc, torch.OutOfMemoryError) or "RESOURCE_EXHAUSTED" in text:
        return "free tensors you no longer need (del x; gc.collect()), or use a smaller batch"
    if isinstance(exc, NonFiniteError):
        return "inspect the inputs of this op; nan_check stays on until tpu_interactive.nan_check(False)"
    return None


def annotate(exc: BaseException, op_name: str, schema, args: tuple, kwargs: dict, where=None,
             note: str = "") -> BaseException:
    """A copy of ``exc`` (same type where possible) whose message names op, inputs and user line
    (``where``: that line when it is not on the current stack, e.g. an op recorded in fused mode)."""
    if getattr(exc, "_tpu_annotated", False) or isinstance(exc, KeyboardInterrupt):
        return exc
    lines = [str(exc).rstrip(), "", f"[tpu] while running {op_name}"]
    if args or kwargs:
        try:
            lines.append(f"  inputs: {describe_call(schema, args, kwargs)}")
        except Exception:  # noqa: BLE001 - describing must never hide the real error
            pass
    if where is None:
        where = user_frame(2)
    if where is not None:
        filename, lineno, func, source = where
        lines.append(f"  at: {filename}:{lineno} in {func}" + (f" ({note})" if note else ""))
        if source:
            lines.append(f"      {source}")
    hint = hint_for(exc, args)
    if hint:
        lines.append(f"  hint: {hint}")
    message = "\n".join(lines)
    try:
        new = type(exc)(message)
    except Exception:  # noqa: BLE001 - a type that takes other arguments: a RuntimeError says it
        new = RuntimeError(message)
    new._tpu_annotated = True
    new.op = op_name
    new.user_frame = where
    new.original = exc
    return new
