"""A fused segment's program (fusion.py): its recorded steps as one jitted function, and the cache
of those programs by op sequence.

Every step is a jitted program of its own (inlined, so the segment's program is one flat function);
the segment's external inputs are its arrays and its Python floats, which come packed in one float64
array (one host-to-device transfer instead of one per float: an AdamW step has ~95 of them, and each
is a transfer on a TPU) and are unpacked as weak-typed scalars, the type jit gives a Python float.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.lax import lax as lax_internal  # _convert_element_type(weak_type=True): no public equivalent
from jax.experimental import checkify
from jax.tree_util import tree_leaves

from . import op_jit, program_store
from .config import config


def split_floats(ext: list) -> tuple[np.ndarray, list]:
    """The segment's Python floats as one float64 host array (float32 without x64, as jit would make
    it), and its other inputs. The executable transfers the host array as it starts: a
    ``jax.device_put`` of its own cost ~0.3 ms on XLA:CPU after a program ran (it waits for a worker
    thread to wake), against ~30 µs when called in a loop."""
    floats, arrays = [], []
    for v in ext:
        (floats if type(v) is float else arrays).append(v)
    return np.array(floats, dtype=np.float64 if jax.config.jax_enable_x64 else np.float32), arrays


def _weak_scalars(packed: jax.Array) -> list:
    # A Python float traces as a weak-typed scalar (it takes the other operand's dtype); unpacked
    # elements are made weak again so that every program sees the same types as in plain eager.
    return [lax_internal._convert_element_type(v, weak_type=True) for v in jnp.unstack(packed)]


def compile_segment(recorded: list, ext_avals: list, live: tuple[int, ...]) -> tuple[Callable, bool]:
    """(the program, whether it returns checkify's error first) of a segment's steps ``recorded``
    ((step, key refs, input refs, op name, site) each), returning the results at positions ``live``."""
    steps = [(step.program, key_refs, refs) for step, key_refs, refs, _, _ in recorded]
    is_float = [aval is float for aval in ext_avals]

    def run_segment(packed, *arrays):
        scalars, others = iter(_weak_scalars(packed)), iter(arrays)
        ext = [next(scalars) if f else next(others) for f in is_float]
        env: list = []
        for program, key_refs, refs in steps:
            keys = tuple([ext[-1 - r] for r in key_refs])
            env.extend(tree_leaves(program(keys, *[env[r] if r >= 0 else ext[-1 - r] for r in refs])))
        return [env[p] for p in live]

    checked = any(step.checks for step, *_ in recorded)
    if checked:
        return jax.jit(checkify.checkify(run_segment, errors=checkify.user_checks)), True
    # its name for program_store: each step's program and static arguments, how steps read each other
    program = op_jit.Program(run_segment, run_segment)
    try:
        program.name = "segment:" + program_store.stable(
            [(program_store.function_name(step.fn), step.arg_key, step.kw_names, step.kw_key, step.out_sig,
              key_refs, refs) for step, key_refs, refs, _, _ in recorded] + [is_float, live])
    except program_store.Unstable:
        program.name = None  # compiled through jax as before, not stored
    return program, False


# ---------------------------------------------------------------- the programs compiled
# (op sequence with shapes and arguments, external inputs' avals) -> {results kept: (program, checked, kept)}
_programs: dict[tuple, dict[tuple, tuple]] = {}
_variants: dict[tuple, list] = {}  # (op-sequence hash, length, first site) -> keys compiled for it
_PROGRAMS_LIMIT = 2_000


def site_text(site) -> str:
    return f"{site[0]}:{site[1]}" if site else ""


def known(ops: tuple) -> bool:
    """A program was compiled for these ops (keeping some results)."""
    return ops in _programs


def forget() -> None:
    _programs.clear()
    _variants.clear()


def lookup(ops: tuple, live: tuple[int, ...]) -> tuple | None:
    """The program for these ops that returns the ``live`` results, or one that returns more of them
    (the extra results are dropped with their Lazy values: fewer live results need no new program)."""
    by_live = _programs.get(ops)
    if not by_live:
        return None
    entry = by_live.get(live)
    if entry is None:
        wanted = set(live)
        covering = [e for kept, e in by_live.items() if wanted.issubset(kept)]
        entry = min(covering, key=lambda e: len(e[2])) if covering else None
    return entry


def _struct(seg) -> tuple:
    # the same op sequence recorded from the same line: a loop whose shapes change (not the same
    # ops elsewhere in the program at other shapes)
    return seg.struct, len(seg.steps), seg.steps[0][4]


def plan(seg, ops: tuple, live: tuple[int, ...]) -> tuple[tuple | None, str]:
    """A program to compile for segment ``seg``'s ops or results kept (None: run op by op) and why."""
    compiled = _variants.setdefault(_struct(seg), [])
    by_live = _programs.get(ops)
    if by_live:  # the same ops keeping other results: keep the union, which serves both from now on
        live = tuple(sorted(set(live).union(*by_live)))
    key = (ops, live)
    if compiled:
        first = _first_difference(compiled[-1], key)
        where = seg.steps[first] if first is not None and first < len(seg.steps) else None
        change = (f"at op {first + 1} ({where[3]}, recorded at {site_text(where[4])})" if where
                  else "in the inputs or results kept")
        if len(compiled) >= config.fuse_variants:
            return None, (f"same {len(seg.steps)} ops as a compiled segment but new shapes or arguments {change}: "
                          "run op by op (pad or bucket the shapes, use a static cache, or torch.compile)")
        cause = f"new shapes or arguments {change}"
    else:
        cause = f"new op sequence ({len(seg.steps)} ops)"
    if len(_programs) > _PROGRAMS_LIMIT:
        forget()
        compiled = _variants.setdefault(_struct(seg), [])
    compiled.append(key)
    entry = _programs.setdefault(ops, {})[live] = (*compile_segment(seg.steps, seg.ext_avals, live), live)
    return entry, cause


def _first_difference(old: tuple, new: tuple) -> int | None:
    for i, (a, b) in enumerate(zip(old[0][0], new[0][0])):
        if a != b:
            return i
    return None
