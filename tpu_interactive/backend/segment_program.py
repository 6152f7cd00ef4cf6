"""A fused segment's program (fusion.py): its recorded steps as one jitted function, and the cache
of those programs by op sequence.

Every step is a jitted program of its own (inlined, so the segment's program is one flat function);
the segment's external inputs are its arrays and its Python floats, which come packed in one float64
array (one host-to-device transfer instead of one per float: an AdamW step has ~95 of them, and each
is a transfer on a TPU) and are unpacked as weak-typed scalars, the type jit gives a Python float.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
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


class SegmentProgram:
    """A segment's steps ``recorded`` ((step, key refs, input refs, op name, site) each) as one program
    returning the results at positions ``kept``, compiled per *variant*: which input arrays it donates
    and the order of its results. Donated are arrays that nothing outside the segment holds any more,
    such as a parameter's or a moment's old value that the segment rewrites: the results take their
    memory, so no second copy of a model exists while the program runs (as with CUDA's in-place
    kernels). A program with value checks (index ranges) is re-run op by op if a check fails, which
    needs its inputs: a variant of it that donates runs the checks alone first (a program returning
    only their outcome: XLA drops what they do not depend on, such as a step's matmuls and update)."""

    __slots__ = ("steps", "is_float", "kept", "kept_avals", "kept_index", "checked", "array_avals", "name",
                 "variants", "undonated", "_checked_jit", "_checks_jit")

    def __init__(self, recorded: list, ext_avals: list, kept: tuple[int, ...], kept_avals: list):
        self.steps = [(step.program, key_refs, refs) for step, key_refs, refs, _, _ in recorded]
        self.is_float = [aval is float for aval in ext_avals]
        self.kept, self.kept_avals = kept, kept_avals
        self.kept_index = {pos: j for j, pos in enumerate(kept)}
        self.checked = any(step.checks for step, *_ in recorded)
        self.array_avals = [(aval[0], aval[1]) for aval in ext_avals if aval is not float]
        # variant -> (its program, the positions of its results in order, the arrays not donated in order)
        self.variants: dict[tuple, tuple[op_jit.Program, tuple[int, ...], tuple[int, ...]]] = {}
        self.undonated = ((), tuple(range(len(kept))))  # the variant donating nothing, results as kept
        self._checked_jit = jax.jit(_checkified(self._body(self.undonated))) if self.checked else None
        self._checks_jit = None  # the checks alone, made when a variant first donates
        try:  # its name for program_store: each step's program and static arguments, how steps read each other
            self.name = program_store.stable(
                [(program_store.function_name(step.fn), step.arg_key, step.kw_names, step.kw_key, step.out_sig,
                  key_refs, refs) for step, key_refs, refs, _, _ in recorded] + [self.is_float, kept])
        except program_store.Unstable:
            self.name = None  # compiled through jax as before, not stored

    def _others(self, donated: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.array_avals)) if i not in donated)

    def _body(self, variant: tuple) -> Callable:
        """The segment as a function of (the donated arrays, the packed floats, the other arrays)."""
        steps, is_float, kept = self.steps, self.is_float, self.kept
        donated, results = variant
        n_arrays = len(self.array_avals)
        order = donated + self._others(donated)

        def run_segment(*inputs):
            given, arrays = inputs[:len(donated)] + inputs[len(donated) + 1:], [None] * n_arrays
            for position, value in zip(order, given):
                arrays[position] = value
            scalars, others = iter(_weak_scalars(inputs[len(donated)])), iter(arrays)
            ext = [next(scalars) if f else next(others) for f in is_float]
            env: list = []
            for program, key_refs, refs in steps:
                keys = tuple([ext[-1 - r] for r in key_refs])
                env.extend(tree_leaves(program(keys, *[env[r] if r >= 0 else ext[-1 - r] for r in refs])))
            return [env[kept[j]] for j in results]

        return run_segment

    def donation(self, replaced: dict[int, int]) -> tuple[tuple, bool]:
        """(the variant to run, whether it is still to compile) given the arrays to donate: {position of
        an input array the segment overwrote and nothing else holds: position of the value replacing
        it}. jax gives a donated input's memory to the first free result of its shape and dtype, so the
        donated inputs come first in the order of their new values, which come first in the results:
        a parameter's new value takes its old one's memory (an update in place, as CUDA's). Once
        ``_DONATION_VARIANTS`` variants are compiled, the one donating the most of these serves: a
        reference that comes and goes never compiles program after program."""
        donated, firsts = [], []
        for i, successor in replaced.items():
            j = self.kept_index.get(successor)
            if j is not None and j not in firsts and self.kept_avals[j] == self.array_avals[i]:
                donated.append(i)
                firsts.append(j)
        taken = set(firsts)
        variant = (tuple(donated), tuple(firsts) + tuple(j for j in range(len(self.kept)) if j not in taken))
        variants = self.variants
        if variant in variants or len(variants) < _DONATION_VARIANTS:
            return variant, self._to_compile(variant)
        fits = [v for v in variants if set(donated).issuperset(v[0])]  # any pairing keeps the values
        if fits:
            return max(fits, key=lambda v: len(v[0])), False
        return self.undonated, self._to_compile(self.undonated)

    def _to_compile(self, variant: tuple) -> bool:
        # a checked program donating nothing is _checked_jit, compiled on its first run
        return variant not in self.variants and not (self.checked and not variant[0])

    def executable(self, floats: np.ndarray, arrays: list, variant: tuple) -> tuple[Callable, list, tuple]:
        """(the program, loaded or compiled now; its inputs; the positions of its results in order):
        calling it runs the segment, or raises if a value check failed (then it is re-run op by op)."""
        donated = variant[0]
        if self.checked and not donated:
            return self._run_checked, [floats, *arrays], self.kept
        found = self.variants.get(variant)
        if found is None:
            body = self._body(variant)
            if self.checked:  # its checks' outcome is dropped: they ran first (_checks_first)
                checkified = _checkified(body)
                body = lambda *inputs: checkified(*inputs)[1]  # noqa: E731
            program = op_jit.Program(body, body)
            program.name = None if self.name is None else f"segment:{self.name}:{variant}"
            found = self.variants[variant] = (program, tuple([self.kept[j] for j in variant[1]]),
                                              self._others(variant[0]))
        program, positions, others = found
        inputs = [arrays[i] for i in donated] + [floats] + [arrays[i] for i in others]
        run = program.executable(inputs, len(donated))
        if self.checked:
            run = self._checks_first(run, [floats, *arrays])
        return run, inputs, positions

    def _run_checked(self, *inputs) -> list:
        error, outs = self._checked_jit(*inputs)
        _raise_if_failed(error)
        return outs

    def _checks_first(self, run: Callable, inputs: list) -> Callable:
        """``run`` (a donating variant) once the segment's checks pass on ``inputs`` (undonated order)."""
        if self._checks_jit is None:
            checkified = _checkified(self._body(self.undonated))
            self._checks_jit = jax.jit(lambda *given: checkified(*given)[0])

        def checked_then_run(*donating_inputs):
            _raise_if_failed(self._checks_jit(*inputs))  # the donated inputs are still whole if one fails
            return run(*donating_inputs)

        return checked_then_run


def _checkified(body: Callable) -> Callable:
    return checkify.checkify(body, errors=checkify.user_checks)


def _raise_if_failed(error) -> None:
    if error.get() is not None:
        raise RuntimeError("a value check failed")  # the segment re-runs op by op: plain eager's error


_DONATION_VARIANTS = 2

# ---------------------------------------------------------------- the programs compiled
# (op sequence with shapes and arguments, external inputs' avals) -> {results kept: SegmentProgram}
_programs: dict[tuple, dict[tuple, SegmentProgram]] = {}
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


def lookup(ops: tuple, live: tuple[int, ...]) -> SegmentProgram | None:
    """The program for these ops that returns the ``live`` results, or one that returns more of them
    (the extra results are dropped with their Lazy values: fewer live results need no new program)."""
    by_live = _programs.get(ops)
    if not by_live:
        return None
    entry = by_live.get(live)
    if entry is None:
        wanted = set(live)
        covering = [e for kept, e in by_live.items() if wanted.issubset(kept)]
        entry = min(covering, key=lambda e: len(e.kept)) if covering else None
    return entry


def struct_of(seg) -> tuple:
    # the same op sequence recorded from the same line: a loop whose shapes change (not the same
    # ops elsewhere in the program at other shapes). Made here, on a cache miss, not kept up per op
    return tuple([step[0].fn for step in seg.steps]), seg.steps[0][4]


def plan(seg, ops: tuple, live: tuple[int, ...]) -> tuple[SegmentProgram | None, str]:
    """A program to compile for segment ``seg``'s ops or results kept (None: run op by op) and why."""
    compiled = _variants.setdefault(struct_of(seg), [])
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
        compiled = _variants.setdefault(struct_of(seg), [])
    compiled.append(key)
    kept_avals = [(seg.values[p].shape, seg.values[p].dtype) for p in live]
    entry = _programs.setdefault(ops, {})[live] = SegmentProgram(seg.steps, seg.ext_avals, live, kept_avals)
    return entry, cause


def _first_difference(old: tuple, new: tuple) -> int | None:
    for i, (a, b) in enumerate(zip(old[0][0], new[0][0])):
        if a != b:
            return i
    return None


# ---------------------------------------------------------------- donation
_ON_CPU: list[bool] = []
# By default (config.fuse_donate None) only arrays this large are donated: what a big model's parameters
# and moments are, where the second copy would cost memory; a small one saves little, and on a TPU v5e a
# d 256 block's fused step (1 MB of parameters) ran 6.0 -> 6.35 ms donating its 36 small arrays.
DONATE_MIN_BYTES = 1 << 20


def donation_floor() -> int | None:
    """The size from which segments donate what they overwrite; None: they do not
    (``config.fuse_donate``: True any size, False never, None arrays from DONATE_MIN_BYTES, not on XLA:CPU)."""
    if config.fuse_donate is not None:
        return 0 if config.fuse_donate else None
    if not _ON_CPU:
        _ON_CPU.append(jax.devices()[0].platform == "cpu")
    return None if _ON_CPU[0] else DONATE_MIN_BYTES


def replaced(undo: list, arrays: list, lazy_type: type, min_bytes: int) -> dict[int, int]:
    """{position in ``arrays``: position of its buffer's new value} for the arrays of ``min_bytes`` or
    more a segment overwrote (a parameter, a moment) that nothing outside it holds any more: only its
    undo log ``undo``, directly or through an earlier segment's Lazy (``lazy_type``) that only the log
    holds. Each array is listed once in ``arrays`` and once in the segment's inputs."""
    found, lazies = _overwritten(undo, lazy_type)
    if not found:
        return {}
    if lazies:
        held = [entry[0] for entry in lazies.values()]
        for lazy, refs in zip(held, _references_beyond(held)):
            if refs == lazies[id(lazy)][1] + 1:  # the log's entries and the dict's list: nothing else
                found[id(lazy.value)][1] += 1  # its .value is a known reference to the array
    candidates = [entry[0] for entry in found.values() if entry[2] >= 0 and entry[0].nbytes >= min_bytes]
    position = {id(a): i for i, a in enumerate(arrays)} if candidates else {}
    # known references: the segment's inputs, ``arrays`` and found's entry, besides the log's
    return {position[id(a)]: found[id(a)][2] for a, refs in zip(candidates, _references_beyond(candidates))
            if id(a) in position and refs == 3 + found[id(a)][1]}


def _overwritten(undo: list, lazy_type: type) -> tuple[dict[int, list], dict[int, list]]:
    """The concrete values an undo log holds: {id(array): [array, references the log holds, position of
    its buffer's new value or -1]}, {id(Lazy): [an earlier segment's Lazy, log entries holding it]}.
    (A function of its own: none of its local variables still holds an array afterwards.)"""
    found: dict[int, list] = {}
    lazies: dict[int, list] = {}
    for ref, previous, _ in undo:
        if type(previous) is op_jit.ARRAY:
            entry = found.setdefault(id(previous), [previous, 0, -1])
            entry[1] += 1
        elif type(previous) is lazy_type and previous.value is not None:
            lazies.setdefault(id(previous), [previous, 0])[1] += 1
            entry = found.setdefault(id(previous.value), [previous.value, 0, -1])
        else:
            continue  # a value this segment made
        buffer = ref()
        now = None if buffer is None else buffer.array
        if entry[2] < 0 and type(now) is lazy_type and now.value is None:
            entry[2] = now.pos
    return found, lazies


_LISTED = 0


def _references_beyond(objects: list) -> list[int]:
    """How many references each of ``objects`` (each listed once) has besides the list."""
    return [sys.getrefcount(o) - _LISTED for o in objects]


_LISTED = _references_beyond([object()])[0]


@contextlib.contextmanager
def interrupts_deferred(defer: bool):
    """Ctrl-C raises at the end of the block, not inside it (main thread, Python's own handler)."""
    previous = signal.getsignal(signal.SIGINT) if defer else None
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(*caught[0])
