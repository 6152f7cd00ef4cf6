"""One MLIR context per thread for the backend's own lowerings.

jax makes a fresh MLIR context for every lowering (``mlir.make_ir_context``: it loads every dialect,
~2.2 ms on XLA:CPU); a cold eager training step lowers one small program per (op, shape), and those
contexts were ~13% of its time (47 programs: 175-200 ms of 1.4 s). A lowering inside :func:`reused`
gets this thread's context instead (nested lowerings, e.g. a Pallas kernel's, still get fresh ones).

An MLIR context must not be used by two threads at once (XLA's passes may load dialects into it), so
a module lowered here and compiled on another thread (compile_ahead.py) travels as bytecode
(:func:`detach` on this thread, ~0.02 ms; :func:`attach` there parses it into that thread's own
context, ~0.1 ms, in a copy of the ``Lowered``: jax's caches keep the original). jax has no public hook for the context, so ``mlir.make_ir_context`` is wrapped:
outside :func:`reused` it is jax's own.
"""
from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any, Iterator

from jax._src.interpreters import mlir  # make_ir_context: no public way to pass a context to .lower()
from jax._src.lib.mlir import ir

_REUSES = 256  # lowerings per context: uniqued attributes (source locations, constants) accumulate in one
_local = threading.local()  # .offer: the next make_ir_context call may get .context; .uses: its lowerings
_jax_make_ir_context = getattr(mlir, "make_ir_context", None)


def _thread_context() -> ir.Context:
    context = getattr(_local, "context", None)
    if context is None or _local.uses >= _REUSES:
        context, _local.uses = _jax_make_ir_context(), 0
        _local.context = context
    _local.uses += 1
    return context


def _make_ir_context() -> ir.Context:
    if getattr(_local, "offer", False):
        _local.offer = False  # one per lowering: a lowering nested in it gets a fresh context
        return _thread_context()
    return _jax_make_ir_context()


_AVAILABLE = _jax_make_ir_context is not None
if _AVAILABLE:
    mlir.make_ir_context = _make_ir_context


@contextlib.contextmanager
def reused() -> Iterator[None]:
    """A block that lowers one program (``jitted.lower(...)``) in this thread's MLIR context. Compile
    it on this thread, or hand it to another with :func:`detach` / :func:`attach`."""
    _local.offer = _AVAILABLE
    try:
        yield
    finally:
        _local.offer = False


def movable(lowered: Any) -> bool:
    """``lowered`` keeps its module where :func:`detach` can take it (jax's MeshComputation)."""
    computation = getattr(lowered, "_lowering", None)
    return isinstance(getattr(computation, "_hlo", None), ir.Module) and hasattr(computation, "_executable")


def detach(lowered: Any) -> bytes:
    """On the thread that lowered it: ``lowered``'s module as bytecode for :func:`attach`. ``lowered``
    itself is left as it is (jax's lowering cache may hand the same object to a later ``.lower()``)."""
    return mlir.module_to_bytecode(lowered._lowering._hlo)


def attach(lowered: Any, bytecode: bytes) -> Any:
    """On the thread that compiles it: a copy of ``lowered`` whose module is parsed into this thread's
    context (what it compiles stays with the copy)."""
    moved, computation = copy.copy(lowered), copy.copy(lowered._lowering)
    computation._hlo = ir.Module.parse(bytecode, context=_thread_context())
    computation._executable = None
    moved._lowering = computation
    return moved
