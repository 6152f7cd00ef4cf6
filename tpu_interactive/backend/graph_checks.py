"""Value checks inside compiled graphs: the same errors as eager, raised after the graph runs.

Eager lowerings check index ranges on concrete values (one small host sync) and raise torch's
error. Under ``jax.jit`` the values are tracers, and XLA would clamp or drop a bad index silently,
so the check is traced into the graph with ``jax.experimental.checkify`` instead. compiler/graph.py wraps
each graph with :func:`checkified`; after a call of a graph that traced any check it calls
:func:`raise_if_failed` (one sync, before mutated inputs are written back, so no state changes).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import torch
from jax.experimental import checkify

from . import op_jit

_ERRORS: dict[str, type[Exception]] = {"IndexError": IndexError, "RuntimeError": RuntimeError,
                                        "ValueError": ValueError, torch.linalg.LinAlgError.__name__: torch.linalg.LinAlgError}
_SUFFIX = " (`check` failed)"
traced_checks = [0]  # checks emitted while tracing; compiler/graph.py compares before/after to know a graph has some


def is_traced(value) -> bool:
    """True inside a compiled graph (the check is traced in). Inside a per-op program (op_jit) the
    lowering needs the concrete value instead, so that op runs eagerly; inside a fused segment's
    program (``op_jit.tracing[0] == "fused"``) the check is traced in, as in a compiled graph."""
    if not isinstance(value, jax.core.Tracer):
        return False
    if op_jit.tracing[0] is True:
        raise op_jit.NeedsEager("checks input values")
    return True


def check_in_graph(bad, value, error: type[Exception], message: Callable[..., str], position=None) -> None:
    """Fail the graph call with ``error(message(value))`` (``message(value, position)`` when a
    ``position`` is given) when ``bad`` is true at run time."""
    if error.__name__ not in _ERRORS:
        raise TypeError(f"unsupported graph check error type {error.__name__}")
    traced_checks[0] += 1
    values = {"value": value} if position is None else {"value": value, "position": position}
    text = message(*[f"{{{name}}}" for name in values]).replace("{", "{{").replace("}", "}}")
    for name in values:
        text = text.replace(f"{{{{{name}}}}}", f"{{{name}}}")
    checkify.check(jnp.logical_not(bad), f"{error.__name__}|{text}", **values)


def checkified(fn: Callable) -> Callable:
    """``fn`` returning ``(error, result)``; jit the result."""
    return checkify.checkify(fn, errors=checkify.user_checks)


def raise_if_failed(error) -> None:
    text = error.get()
    if text is None:
        return
    name, _, message = text.partition("|")
    raise _ERRORS.get(name, RuntimeError)(message.removesuffix(_SUFFIX))
