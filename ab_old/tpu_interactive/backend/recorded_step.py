"""One recorded step of a fused segment (fusion.py): what is known about an op's static signature and
input shapes: its jitted program (inlined into a segment's program), its outputs' shapes, how many
random keys it draws, whether it has value checks, and how plain eager runs it (a segment run op by op).
"""
from __future__ import annotations

from typing import Callable

import jax

from . import compile_log, graph_checks, op_jit, rng

FUSED = "fused"  # op_jit.tracing[0] while a step of a fused segment is traced


class Step:
    """What is known about one static signature + input shapes: its program and its outputs."""

    __slots__ = ("program", "treedef", "single", "avals", "n_keys", "checks", "fn", "arg_key", "kw_names", "kw_key",
                 "out_sig", "eager", "id")

    def run_eager(self, keys: list, inputs: list):
        it = iter(inputs)
        args = op_jit.rebuild(self.arg_key, it)
        kwargs = dict(zip(self.kw_names, op_jit.rebuild(self.kw_key, it)))
        if not keys:  # as plain eager runs the call, sharing its compiled programs
            if self.eager is not None:
                return self.eager(*args, **kwargs)
            return op_jit.call(self.fn, args, kwargs, self.out_sig)
        saved, rng.forced = rng.forced, list(keys)  # the keys drawn when the op was recorded
        try:
            return self.fn(*args, **kwargs)
        finally:
            rng.forced = saved


def _step_program(fn: Callable, arg_key: tuple, kw_names: tuple, kw_key: tuple) -> Callable:
    def run(keys, *inputs):
        saved = op_jit.tracing[0], rng.forced
        op_jit.tracing[0] = FUSED
        if keys:
            rng.forced = list(keys)
        try:
            it = iter(inputs)
            args = op_jit.rebuild(arg_key, it)
            return fn(*args, **dict(zip(kw_names, op_jit.rebuild(kw_key, it))))
        finally:
            op_jit.tracing[0], rng.forced = saved

    # inline: a segment's program is one flat function, not ~200 nested ones; lowering it (needed even
    # to find it in the persistent cache) took 0.36 s of a 0.56 s warm-disk first step, now ~0.19 s
    return jax.jit(run, inline=True)


class _KeyCounter:
    """Stands in for the keys while a step is first traced: counts the draws."""

    def __init__(self):
        self.count = 0

    def pop(self, _index: int = 0) -> jax.Array:
        self.count += 1
        return jax.random.key(0)


def learn(fn, mode, arg_key, kw_names, kw_key, out_sig, inputs, eager: Callable | None) -> Step | None:
    """Trace the step abstractly once: its outputs, key draws and checks; None if it needs values."""
    step = Step()
    step.program = _step_program(fn, arg_key, kw_names, kw_key)
    abstract = [v if type(v) is float else jax.ShapeDtypeStruct(v.shape, v.dtype, weak_type=v.weak_type)
                for v in inputs]
    counter, checks_before = _KeyCounter(), graph_checks.traced_checks[0]
    saved, rng.forced = rng.forced, counter
    try:
        with compile_log.tracing_only():
            out = jax.eval_shape(step.program, (), *abstract)
    except op_jit.TRACE_ERRORS + (op_jit.NeedsEager,):
        return None
    except ValueError as exc:  # a float handed on as a static argument of an inner jax.jit
        if "Non-hashable static arguments" not in str(exc):
            raise
        return None
    finally:
        rng.forced = saved
    leaves, step.treedef = jax.tree_util.tree_flatten(out)
    step.single = step.treedef == LEAF  # one array: no tree to rebuild around it
    step.avals = [(tuple(a.shape), a.dtype, bool(getattr(a, "weak_type", False))) for a in leaves]
    step.n_keys, step.checks = counter.count, graph_checks.traced_checks[0] != checks_before
    step.fn, step.arg_key, step.kw_names, step.kw_key, step.out_sig = fn, arg_key, kw_names, kw_key, out_sig
    step.eager = eager
    return step


LEAF = jax.tree_util.tree_structure(0)
