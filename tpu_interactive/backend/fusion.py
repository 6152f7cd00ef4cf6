"""Fused eager mode (opt-in): ops are recorded instead of run, and each recorded *segment* runs as
ONE jitted program at a deterministic flush point.

Recording an op costs what dispatch already does (torch's meta kernel for shapes, dtypes and errors,
so a bad call still raises at the user's line) plus a few dictionary lookups: its result tensors hold
:class:`Lazy` values (shape and dtype known, data later) in their device buffers. A segment is flushed
when a value is needed on the host (``.item()``, ``.cpu()``, ``print``, ``bool``: every concrete read
of a buffer goes through ``DeviceBuffer.value()``), at ``synchronize()``, when fusing is switched off
(``with fuse():`` ends, the end of a ``%%tpu --fuse`` cell), before an op that needs concrete values
(data-dependent shapes, a raw kernel, a collective, a CPU fallback), when sync mode or the NaN check
is on, after ``config.fuse_max_ops`` ops, after a chain of ``config.fuse_max_depth`` dependent ops, and
when autograd's backward begins (the forward runs while the backward and the update are recorded).
All of these depend on the order of operations only, never on timing: every rank cuts its segments alike.

A segment's program is cached by the op sequence: each step's static signature (the lowering, its
static arguments, torch's output metadata), where its inputs come from, the outside arrays' shapes and
dtypes, and which results are still referenced when it flushes (a program returning more of them serves
too; the collector runs before compiling a variant that differs only there). Arrays and Python floats
are *inputs*: a learning rate or step count that changes every step does not recompile. A random op's
key is drawn from its generator when recorded (plain eager's sequence) and passed in. Index checks are
traced in with checkify; if one fails, or anything else goes wrong in the fused program, the segment
re-runs op by op: plain eager's error at the failing op, named at the line that *recorded* it, every
earlier write applied and every later one undone.

Shape-changing loops (``generate()`` with a growing cache) would compile one program per iteration:
an op sequence whose shapes or arguments differ from the ``config.fuse_variants`` variants already
compiled runs in pieces instead (its steps whose shapes stay as cached programs, the others op by op
on plain eager's programs: segment_pieces.py), and the report says so; where too little of it stays,
it runs op by op, and once that keeps happening such segments are not recorded at all (unrecorded.py).
"""
from __future__ import annotations

import gc
import itertools
import sys
import time
import weakref
from typing import Any, Callable

import jax
import numpy as np
import torch
from jax.tree_util import tree_leaves, tree_unflatten

from . import op_jit, rng, segment_pieces, segment_program, unrecorded
from .recorded_step import Step, learn
from .config import config
from .errors import annotate, user_site
from .stats import record_fused

_ARRAY = op_jit.ARRAY
_DEAD_REFCOUNT = 3  # a Lazy referenced only by its segment's list (+ the loop variable and the call)


class Lazy:
    """A value a recorded op will produce: shape and dtype now, data after its segment runs (or, with
    a ``producer``, after that deferred call runs: compile_ahead.py)."""

    __slots__ = ("pos", "shape", "dtype", "weak_type", "value", "error", "producer")

    def __init__(self, pos: int, shape: tuple, dtype, weak_type: bool, producer=None):
        self.pos, self.shape, self.dtype, self.weak_type = pos, shape, dtype, weak_type
        self.value, self.error, self.producer = None, None, producer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def astype(self, dtype) -> Any:
        if self.value is None and self.producer is not None:
            resolve(self)
        return self.value.astype(dtype) if self.value is not None else apply(_astype, self, np.dtype(dtype))

    def reshape(self, *shape) -> Any:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if self.value is None and self.producer is not None:
            resolve(self)
        return self.value.reshape(shape) if self.value is not None else apply(_reshape, self, shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(resolve(self), dtype)

    def __repr__(self) -> str:
        state = "ready" if self.value is not None else "failed" if self.error is not None else "pending"
        return f"Lazy({self.shape}, {self.dtype}, {state})"


def _astype(x, dtype):
    return x.astype(dtype)


def _reshape(x, shape):
    return x.reshape(shape)


op_jit.DYNAMIC_TYPES.add(Lazy)


def active() -> bool:
    """Ops are being recorded (fused mode on; sync mode and the NaN check turn it off, and so does an
    unrecorded stretch until the next flush point: unrecorded.py)."""
    return config.fuse and not unrecorded.running() and not config.sync and not config.nan_check


def resolve(value: Lazy) -> jax.Array:
    """The concrete array of ``value`` (running its segment first if it has not run)."""
    if value.value is None and value.error is None:
        if value.producer is not None:
            value.producer.resolve(value)
        else:
            flush("a value was needed")
    if value.value is None:
        made_by = "deferred call that makes it" if value.pos < 0 else "fused segment that records it"
        why = type(value.error).__name__ + "".join(f": {line}" for line in str(value.error).splitlines()[:1])
        raise RuntimeError(f"tpu: this tensor's value was never computed: the {made_by} failed earlier ({why})")
    return value.value


def concrete(value):
    """``value`` with every Lazy (also inside lists/tuples) replaced by its array."""
    if type(value) is Lazy:
        return resolve(value)
    if type(value) is list or type(value) is tuple:
        return type(value)(concrete(v) for v in value)
    return value


_steps: dict[tuple, Step] = {}
_STEPS_LIMIT = 20_000
# a number per step key (static signature and input avals), never reused: a segment's key is made of
# these (hashing the signatures themselves at every flush cost ~50 us a segment)
_step_ids: dict[tuple, int] = {}
_next_step_id = itertools.count()


def _step_id(step_key: tuple) -> int:
    found = _step_ids.get(step_key)
    if found is None:
        if len(_step_ids) > _STEPS_LIMIT:
            _step_ids.clear()  # the steps seen again get new numbers (their segments compile again)
        found = _step_ids[step_key] = next(_next_step_id)
    return found


_modes = op_jit.LearnedModes(_STEPS_LIMIT)


def _aval_key(v):
    t = type(v)
    if t is float:
        return float
    return (v.shape, v.dtype, v.weak_type)


# by argument type, whether it is a generator: isinstance(v, torch.Generator) goes through the
# metaclass's Python __instancecheck__ on torch >= 2.13 (~0.2 us per argument, every recorded call)
_is_generator_type: dict[type, bool] = {}


def _generator(args, kwargs) -> torch.Generator | None:
    for v in (*args, *kwargs.values()):
        t = type(v)
        found = _is_generator_type.get(t)
        if found is None:
            found = _is_generator_type[t] = issubclass(t, torch.Generator)
        if found:
            return v
    return None


def record(fn: Callable, args: list, kwargs: dict, out_sig: Any, op_name: str, sink: Callable | None = None,
           eager: Callable | None = None):
    """Record ``fn(*args, **kwargs)`` (arrays, Lazy values, static arguments) into the current
    segment and return its results as Lazy values; ops that need concrete values run now.
    ``sink(recorder, inputs, floats_are_inputs)`` hears how a recorded call can be recorded again
    from its inputs alone (the C++ fast path's record plans, fast_path.py). ``eager``: what plain eager
    calls with the same arguments (``fn`` itself for a lowering it runs primitive by primitive, as a
    call with views in a list; a raw kernel's own jitted code; a view read's program); None: it runs
    ``fn`` as one jitted program (op_jit). Where the call runs now (a segment run op by op, the call
    starting an unrecorded stretch), it runs so too, on the programs plain eager compiled for its
    shapes (not one program more per new shape: a generate() probe compiled a cat per new length)."""
    generator = _generator(args, kwargs)
    if generator is not None and generator.device.type == "cpu":
        return _run_now(fn, args, kwargs, out_sig, fn)  # draws on the host
    if unrecorded.running() or _starts_unrecorded(fn):
        return _run_now(fn, args, kwargs, out_sig, eager)  # (also a call dispatched as recorded before the stretch began)
    dynamic = op_jit.split_call(args, kwargs, True)
    try:
        mode, signature = _modes.lookup(fn, dynamic)
    except TypeError:  # an unhashable argument: no program for this call
        return _run_now(fn, args, kwargs, out_sig, eager)
    while mode != op_jit.EAGER:
        inputs, arg_key, kw_names, kw_key = (dynamic if mode == op_jit.DYNAMIC_FLOATS
                                             else op_jit.split_call(args, kwargs, False))
        prog_key = (fn, mode, arg_key, kw_names, kw_key, out_sig)
        try:
            for v in inputs:
                if type(v) is Lazy and v.value is None and v.error is not None:
                    resolve(v)  # raises: the segment that should have made it failed
            step_key = (prog_key, tuple([_aval_key(v) for v in inputs]))
            step = _steps.get(step_key)
        except TypeError:  # an unhashable argument: no program for this call
            break
        if step is None:
            step = learn(fn, mode, arg_key, kw_names, kw_key, out_sig, inputs, eager)
            if step is None:
                mode = _modes.escalate(fn, signature or _modes.signature(dynamic), mode)
                continue
            if len(_steps) > _STEPS_LIMIT:
                _steps.clear()
            _steps[step_key] = step
            step.id = _step_id(step_key)
        out = _segment().add(step, inputs, op_name, generator)
        if sink is not None and generator is None and not step.n_keys:
            sink(Recorder(step, op_name), inputs, mode == op_jit.DYNAMIC_FLOATS)
        return out
    return _run_now(fn, args, kwargs, out_sig, eager)


class Recorder:
    """One call's recording, repeatable from its inputs alone: what a C++ record plan calls on a key
    seen before (its step, shapes and static arguments are the key's), skipping dispatch's Python."""

    __slots__ = ("step", "op_name")

    def __init__(self, step: Step, op_name: str):
        self.step, self.op_name = step, op_name

    def __call__(self, *inputs):
        if _starts_unrecorded(self.step.fn):
            return NotImplemented  # an unrecorded stretch begins: the Python kernel runs it as plain eager
        for v in inputs:
            if type(v) is Lazy and v.value is None and v.error is not None:
                return NotImplemented  # the Python kernel raises that segment's error
        return _segment().add(self.step, list(inputs), self.op_name, None)


def _run_now(fn, args, kwargs, out_sig, eager: Callable | None = None):
    # as plain eager runs it (record's ``eager``): by default one program (op_jit), as a lowering's
    # whole program (planned.py) or glue code (fusion.apply: a write)
    args, kwargs = concrete(list(args)), {k: concrete(v) for k, v in kwargs.items()}
    return op_jit.call(fn, args, kwargs, out_sig) if eager is None else eager(*args, **kwargs)


def call(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` for a raw kernel's array code (arrays from ``storage.read_lazy``):
    recorded in fused mode, run now otherwise. ``fn`` must be pure; kwargs are static."""
    if active():
        return record(fn, list(args), kwargs, None, getattr(fn, "__name__", "kernel"), eager=fn)
    return fn(*args, **kwargs)


def apply(fn: Callable, *args, eager: Callable | None = None):
    """Record a pure array function of the glue code (a view read, a write, a cast) in the segment
    (``eager``: what plain eager calls for it, see :func:`record`)."""
    return record(fn, list(args), {}, None, "tensor read/write", eager=eager)


# ---------------------------------------------------------------- segments
class Segment:
    """The ops recorded since the last flush."""

    def __init__(self):
        self.values: list[Lazy] = []  # every recorded result, by position
        self.depth: list[int] = []  # per result: the longest chain of steps that computes it
        self.steps: list[tuple] = []  # (Step, key refs, input refs, op name, user site)
        self.key: list[tuple] = []  # per step: (its step id: static signature and input avals, key refs, input refs)
        self.ext: list = []  # concrete inputs: arrays, Python floats, random keys
        self.ext_avals: list = []
        self._ext_ids: dict[int, int] = {}
        self.undo: list[tuple] = []  # (buffer ref, previous array or Lazy position, steps when written)
        self.compile_label = "fused segment"  # compile_log attributes XLA compiles to this
        self.task = -1  # autograd's graph task recording the last op (-1: none; a new one flushes)

    def _ref(self, v) -> int:
        if type(v) is Lazy:
            if v.value is None and v.producer is None:
                return v.pos
            v = resolve(v)  # recorded earlier in this segment, or a deferred call's (compile_ahead.py)
        if type(v) is float:
            self.ext.append(v)
            self.ext_avals.append(float)
            return -len(self.ext)
        index = self._ext_ids.get(id(v))
        if index is None:
            self.ext.append(v)
            self.ext_avals.append((v.shape, v.dtype, getattr(v, "weak_type", False)))  # keys have none
            index = self._ext_ids[id(v)] = len(self.ext)
        return -index

    def add(self, step: Step, inputs: list, op_name: str, generator):
        # every recorded op passes here (~2/3 of its host cost): one loop, no call for a pending input
        depth, ref, chain, refs = self.depth, self._ref, 0, []
        for v in inputs:
            if type(v) is Lazy and v.value is None and v.producer is None:  # recorded in this segment
                r = v.pos
                if depth[r] > chain:
                    chain = depth[r]  # the longest chain of steps to here
            else:
                r = ref(v)
            refs.append(r)
        refs, chain = tuple(refs), chain + 1
        keys = tuple([ref(rng.next_key(generator)) for _ in range(step.n_keys)]) if step.n_keys else ()
        values, base = self.values, len(self.values)
        if step.single:
            shape, dtype, weak = step.avals[0]
            outs = [Lazy(base, shape, dtype, weak)]
            values.append(outs[0])
            depth.append(chain)
        else:
            outs = [Lazy(base + i, shape, dtype, weak) for i, (shape, dtype, weak) in enumerate(step.avals)]
            values.extend(outs)
            depth.extend([chain] * len(outs))
        self.steps.append((step, keys, refs, op_name, user_site()))
        self.key.append((step.id, keys, refs))
        if len(self.steps) >= config.fuse_max_ops or chain >= config.fuse_max_depth:
            flush("op-count limit" if chain < config.fuse_max_depth else "dependency-chain limit")
        return outs[0] if step.single else tree_unflatten(step.treedef, outs)

    def note_write(self, buffer, previous) -> None:
        """``buffer`` is about to get a new value: remember its old one in case the segment fails."""
        if type(previous) is Lazy and previous.value is None:
            previous = previous.pos  # a position, not the object: a saved Lazy would count as live
        self.undo.append((weakref.ref(buffer), previous, len(self.steps)))

    # ------------------------------------------------------------ running
    def run(self, reason: str) -> None:
        start, self.ran, outcome = time.perf_counter(), False, ["op by op", ""]
        try:
            self._run(outcome)
        except KeyboardInterrupt:  # Ctrl-C in a compile or a run: the recorded ops stay pending,
            if not self.ran and _current[0] is None:  # unless some of them ran (a consistent prefix)
                _current[0] = self
            raise
        finally:
            record_fused(len(self.steps), *outcome, reason, time.perf_counter() - start,
                         segment_program.site_text(self.steps[0][4]))

    def _run(self, outcome: list) -> None:
        ops = (tuple(self.key), tuple(self.ext_avals))
        live = self._live()
        program, cause = segment_program.lookup(ops, live), None
        if program is None and segment_program.known(ops):  # compiled keeping other results: a result held only by a
            gc.collect()  # cycle not yet collected must not make a variant (timing-dependent): recount
            live = self._live()
            program = segment_program.lookup(ops, live)
        if program is None:
            program, cause = segment_program.plan(self, ops, live)
        pieces = segment_pieces.split(self, live) if program is None else None
        unrecorded.note_run(self.steps[0][0].fn, self.steps[0][4], program is None and pieces is None)
        if program is None:
            outcome[:] = ["op by op", cause] if pieces is None else ["in pieces", segment_pieces.cause(pieces, cause)]
            self._stepwise(pieces or ())
            return
        floats, arrays = segment_program.split_floats(self.ext)
        floor = segment_program.donation_floor()
        variant, new = program.donation({} if floor is None else segment_program.replaced(self.undo, arrays, Lazy, floor))
        if new and cause is None:
            cause = f"a variant donating {len(variant[0])} of its inputs (held elsewhere before)"
        outcome[:] = ["compiled" if cause else "cached", cause or ""]
        self._fused(program, floats, arrays, variant)

    def _live(self) -> tuple[int, ...]:
        return tuple([v.pos for v in self.values if sys.getrefcount(v) > _DEAD_REFCOUNT])

    def _fused(self, program: segment_program.SegmentProgram, floats: np.ndarray, arrays: list,
               variant: tuple) -> None:
        donated = variant[0]
        try:
            run, inputs, positions = program.executable(floats, arrays, variant)  # a compile: Ctrl-C keeps it
            with segment_program.interrupts_deferred(bool(donated)):  # once it starts, the donated inputs are gone
                outs = run(*inputs)
                self.ran, values = True, self.values
                try:
                    for pos, value in zip(positions, outs):
                        values[pos].value = value
                except KeyboardInterrupt:  # the program has run: hand out all of its results, then stop
                    for pos, value in zip(positions, outs):
                        values[pos].value = value
                    raise
        except KeyboardInterrupt:
            # Ctrl-C (SIGINT) waits for the block above; an asynchronous exception does not, and may land
            # after the program took its donated inputs but before its results were kept: never queue it again
            lost = sum(arrays[i].is_deleted() for i in donated)
            if lost and not self.ran:
                self.ran = True
                self._fail(0, [], RuntimeError(
                    f"tpu: a fused segment was interrupted while running; {lost} values it was overwriting "
                    "are lost"))
            raise
        except Exception as exc:  # noqa: BLE001 - op by op raises plain eager's error at the failing op
            lost = sum(arrays[i].is_deleted() for i in donated)
            if lost:  # it failed after taking its donated inputs (a device error): no re-run possible
                self._fail(0, [], exc)
                raise RuntimeError(
                    f"tpu: a fused segment failed while running ({type(exc).__name__}: {exc}); {lost} "
                    "values it was overwriting are lost (run the cell without fused mode to find the op)") from exc
            self._stepwise()

    def _stepwise(self, pieces: tuple | list = ()) -> None:
        env: list = []
        ext, self.ran = self.ext, True
        piece_at = {piece.start: piece for piece in pieces}  # runs of steps as one program (segment_pieces.py)
        resume = 0
        for index, (step, key_refs, refs, op_name, site) in enumerate(self.steps):
            if index < resume:
                continue
            piece = piece_at.get(index)
            if piece is not None:
                try:
                    outs = piece.run(ext, env)
                except KeyboardInterrupt as exc:
                    self._fail(index, env, exc)
                    raise
                except Exception:  # noqa: BLE001 - its steps run op by op: plain eager's error at the failing op
                    outs = None
                if outs is not None:
                    env.extend([None] * piece.size)
                    for pos, value in zip(piece.kept, outs):
                        env[pos] = value
                    resume = piece.stop
                    continue
            try:
                out = step.run_eager([ext[-1 - r] for r in key_refs],
                                     [env[r] if r >= 0 else ext[-1 - r] for r in refs])
            except BaseException as exc:  # noqa: BLE001 - re-raised, named at the recorded line
                self._fail(index, env, exc)
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise annotate(exc, op_name, None, (), {}, where=_site_frame(site),
                               note="recorded in fused mode; raised when its segment ran") from None
            env.extend(tree_leaves(out))
        for value, array in zip(self.values, env):
            value.value = array

    def _fail(self, index: int, env: list, exc: BaseException) -> None:
        """Step ``index`` failed: earlier results stand, later ones are errors, later writes undone."""
        values = self.values
        for value, array in zip(values, env):
            value.value = array
        for value in values[len(env):]:
            value.error = exc
        for ref, previous, steps_then in reversed(self.undo):
            buffer = ref()
            if buffer is not None and steps_then > index:
                if type(previous) is int:
                    buffer.array = values[previous]
                elif not _donated_away(previous):  # (if so, the buffer keeps the failed result)
                    buffer.array = previous


def _donated_away(value) -> bool:
    array = value.value if type(value) is Lazy else value
    return isinstance(array, jax.Array) and array.is_deleted()


def _site_frame(site):
    import linecache

    return None if site is None else (*site, linecache.getline(site[0], site[1]).strip())


_current: list[Segment | None] = [None]
_graph_task = torch._C._current_graph_task_id  # -1 outside autograd's backward


def _starts_unrecorded(fn: Callable) -> bool:
    """Whether a call of ``fn`` starts an unrecorded stretch (unrecorded.py): it starts a segment (none
    is recorded, or autograd's backward begins: a training step's segment starts there) that is known to
    run op by op."""
    if not unrecorded.any_known():  # the usual case (no loop changing shapes): nothing to look up
        return False
    seg = _current[0]
    if seg is not None:
        task = _graph_task()
        if task == seg.task or task < 0 or not seg.steps:
            return False
        flush("backward began")  # as _segment() would before recording the call
    return unrecorded.start_if_known(fn)


def _segment() -> Segment:
    seg = _current[0]
    task = _graph_task()
    if seg is None:
        seg = _current[0] = Segment()
    elif task != seg.task and task >= 0 and seg.steps:
        # autograd's backward begins: what led up to it (the forward) runs now, while the backward
        # and the optimizer step are recorded (and `loss.item()` needs only the forward's program)
        flush("backward began")
        seg = _current[0] = Segment()
    seg.task = task
    return seg


def current() -> Segment | None:
    return _current[0]


before_flush: list[Callable[[str], None]] = []  # compile_ahead.drain: deferred calls run at every flush point


def _before_flush(reason: str) -> None:
    for hook in before_flush:
        hook(reason)


def flush(reason: str = "flush") -> None:
    """Run the recorded segment (if any) now; an unrecorded stretch ends here too."""
    _before_flush(reason)
    unrecorded.end(reason)
    seg = _current[0]
    if seg is None:
        return
    _current[0] = None
    if seg.steps:
        seg.run(reason)


def note_write(buffer, previous) -> None:
    seg = _current[0]
    if seg is not None:
        seg.note_write(buffer, previous)


def reset() -> None:
    """Forget every fused program (and run what is recorded)."""
    flush("reset")
    segment_program.forget()
    segment_pieces.forget()
    _steps.clear()
    _modes.clear()
    unrecorded.forget()


class fuse:  # noqa: N801 - a switch used like a function, as sync_mode()
    """Fused eager mode: ``fuse(True)`` / ``fuse(False)`` switch it, ``with fuse():`` for a block.

    Leaving it (switching off, the end of the block) runs what was recorded."""

    def __init__(self, enabled: bool = True):
        self._previous = config.fuse
        set_enabled(enabled)

    def __enter__(self) -> "fuse":
        return self

    def __exit__(self, *exc) -> bool:
        set_enabled(self._previous)
        return False

    def __bool__(self) -> bool:
        return bool(config.fuse)

    def __repr__(self) -> str:
        return f"fuse={config.fuse}"


def switch(enabled: bool | None = None) -> bool:
    """The switch form for widgets and magics: ``switch()`` reads, ``switch(True/False)`` sets."""
    if enabled is not None:
        set_enabled(enabled)
    return bool(config.fuse)


def set_enabled(enabled: bool) -> None:
    if not enabled:
        flush("fused mode switched off")
    elif not config.fuse:
        _before_flush("fused mode switched on")  # deferred calls run before recording starts
    config.fuse = bool(enabled)
