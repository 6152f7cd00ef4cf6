"""One XLA program per eager aten op call, instead of one per jax primitive the lowering uses.

A lowering such as layer_norm calls a dozen ``jax.numpy`` functions; run eagerly, each is its own
jitted primitive, so an op's first call at a new shape compiles a dozen small programs and a warm
call pays a dozen dispatches. Here the whole lowering is ``jax.jit``-ed once per *static signature*:
arrays (and Python floats, so a learning rate that changes every step is an input, not a cache key)
are the program's inputs; everything else (ints, bools, dims, dtypes, None) is baked in. The key also
holds torch's output shapes/dtypes for the call, which some lowerings read while tracing.

Lowerings that need concrete values while running (data-dependent shapes, value checks such as
index bounds, host reads, drawing from the RNG) cannot be traced; the first such call is detected by
JAX's tracer errors and calls of that lowering with that static signature and those input dtypes
are run eagerly from then on, exactly as before. A lowering that branches on a float's value gets
floats baked in instead.
"""
from __future__ import annotations

import math
import time
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import core

from . import compile_log, ir_context, program_store

ARRAY = type(jnp.zeros(()))  # the concrete eager array type
DYNAMIC_TYPES = {ARRAY}  # values that are program inputs (fusion.py adds its Lazy values)
class _Input:
    """The mark of an input position in a static signature."""

    __slots__ = ()

    def __stable__(self) -> str:  # program_store's key text
        return ""


_DYN = _Input()


class _Seq:
    """A list/tuple argument in a static signature (hashable; rebuilt with its own type)."""

    __slots__ = ("kind", "items", "_hash")

    def __init__(self, kind: type, items: tuple):
        self.kind, self.items, self._hash = kind, items, hash((kind, items))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return type(other) is _Seq and self.kind is other.kind and self.items == other.items

    def __stable__(self) -> str:  # program_store's key text
        return f"{self.kind.__name__}: {program_store.stable(self.items)}"


DYNAMIC_FLOATS, STATIC_FLOATS, EAGER = 0, 1, 2  # how a call runs; a failing call moves to the next
# Errors that mean "this lowering needs concrete values": retry with floats baked in, then eagerly.
TRACE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                 jax.errors.TracerIntegerConversionError, jax.errors.UnexpectedTracerError)
_programs: dict[tuple, Callable] = {}
_PROGRAMS_LIMIT = 20_000
# True while a lowering is traced here (rng refuses to draw, value checks ask for eager);
# recorded_step.FUSED while traced as a step of a fused segment (keys are inputs, checks are traced in)
tracing: list = [False]


class NeedsEager(Exception):
    """Raised inside a trace by code that must run eagerly (drawing from the device generator)."""


def split(values, dynamic_floats: bool, inputs: list) -> tuple:
    key = []
    for v in values:
        t = type(v)
        if t in DYNAMIC_TYPES or (t is float and dynamic_floats):
            inputs.append(v)
            key.append(_DYN)
        elif t is list or t is tuple:
            items = []
            for item in v:
                # a Python float in a list (a foreach op's per-tensor scalars, AdamW's bias corrections
                # that change every step) is an input as a float argument is
                if type(item) in DYNAMIC_TYPES or (type(item) is float and dynamic_floats):
                    inputs.append(item)
                    items.append(_DYN)
                elif type(item) is list or type(item) is tuple:
                    items.append(_Seq(type(item), tuple(item)))
                else:
                    items.append(item)
            key.append(_Seq(t, tuple(items)))
        else:
            key.append(v)
    return tuple(key)


def split_call(args, kwargs: dict, dynamic_floats: bool) -> tuple[list, tuple, tuple, tuple]:
    """(inputs, arg_key, kw_names, kw_key) of a call: its program inputs and static signature."""
    inputs: list = []
    arg_key = split(args, dynamic_floats, inputs)
    if not kwargs:
        return inputs, arg_key, (), ()
    return inputs, arg_key, tuple(kwargs), split(kwargs.values(), dynamic_floats, inputs)


class LearnedModes:
    """How each lowering's calls run: floats as inputs, floats baked in, or eagerly. Learned per
    static signature and input dtypes, not per lowering: an integer division's zero check needs
    values, a float one's does not. A lowering that never needed more (nearly all) costs one lookup."""

    def __init__(self, limit: int):
        self._by_fn: dict[Callable, dict[tuple, int]] = {}
        self._limit = limit

    def lookup(self, fn: Callable, dynamic: tuple) -> tuple[int, tuple | None]:
        """(mode, signature) for a call split with dynamic floats; the signature is None (not
        computed) while ``fn`` has learned nothing. TypeError for an unhashable argument."""
        learned = self._by_fn.get(fn)
        if not learned:
            return DYNAMIC_FLOATS, None
        signature = self.signature(dynamic)
        return learned.get(signature, DYNAMIC_FLOATS), signature

    @staticmethod
    def signature(dynamic: tuple) -> tuple:
        inputs, arg_key, kw_names, kw_key = dynamic
        return arg_key, kw_names, kw_key, tuple([getattr(v, "dtype", float) for v in inputs])

    def escalate(self, fn: Callable, signature: tuple, mode: int) -> int:
        """The call failed in ``mode``: its signature runs in the next mode from now on."""
        learned = self._by_fn.setdefault(fn, {})
        if len(learned) > self._limit:
            learned.clear()
        learned[signature] = mode + 1
        return mode + 1

    def clear(self) -> None:
        self._by_fn.clear()


_modes = LearnedModes(_PROGRAMS_LIMIT)


def rebuild(key: tuple, inputs) -> list:
    out = []
    for k in key:
        if k is _DYN:
            out.append(next(inputs))
        elif type(k) is _Seq:
            out.append(k.kind(next(inputs) if i is _DYN else (i.kind(i.items) if type(i) is _Seq else i)
                              for i in k.items))
        else:
            out.append(k)
    return out


def _program(fn: Callable, arg_key: tuple, kw_names: tuple, kw_key: tuple) -> Callable:
    def run(*inputs):
        tracing[0] = True
        try:
            it = iter(inputs)
            args = rebuild(arg_key, it)
            kwargs = dict(zip(kw_names, rebuild(kw_key, it)))
            return fn(*args, **kwargs)
        finally:
            tracing[0] = False

    return run


class Program:
    """A program (one lowering at one static signature, or a storage read/write) and its compiled
    executables by input signature (avals, shardings) and donation. A first call at a new signature
    loads the executable a previous process stored (program_store: no trace, no lowering) or traces,
    lowers and compiles it (JAX's persistent cache answering the compile) and stores it. Calling the
    executable itself also skips jit's own dispatch (~8 µs against ~13 µs on XLA:CPU)."""

    __slots__ = ("run", "name", "static", "executables", "jits", "pending", "last")

    def __init__(self, run: Callable, name_of: Callable, static: tuple = ()):
        self.run = run
        try:
            self.name = program_store.function_name(name_of)
        except program_store.Unstable:
            self.name = None  # compiled as before, never stored
        self.static = static
        self.executables: dict = {}
        self.jits: dict = {}  # by donation: for inputs that are not concrete arrays (fusion's Lazy)
        self.pending: dict = {}  # (donate, signature) -> Future of a background compile (compile_ahead)
        self.last: tuple = (None, (), None)  # (donate, signature, executable) of the last call

    def __call__(self, *inputs):
        return self.executable(inputs, 0)(*inputs)

    def executable(self, inputs, donate: int = 0) -> Callable:
        """The compiled executable for these inputs (the first ``donate`` donated); a jit where an
        input is not a concrete array."""
        signature = _signature(inputs)
        if signature is None:
            return self._jit(donate)
        last_donate, last_signature, last = self.last
        if last_donate == donate and _same_objects(signature, last_signature):
            return last  # a loop's call: its inputs come from the same outputs as last time (a fused
            # segment's 50-100 inputs: hashing the signature and comparing equal shardings in Python
            # cost ~90 us a call)
        found = self.executables.get((donate, signature))
        if found is None:
            if len(self.executables) > _EXECUTABLES_LIMIT:
                self.executables.clear()
            future = self.pending.pop((donate, signature), None)
            if future is not None:  # compiling in the background (compile_ahead): wait for it (a failed
                found = future.result()  # compile raises here once; the next call compiles again)
            else:
                found = self._load_or_compile(inputs, donate, signature)
            self.executables[(donate, signature)] = found
        self.last = (donate, signature, found)
        return found

    def _jit(self, donate: int) -> Callable:
        jitted = self.jits.get(donate)
        if jitted is None:
            jitted = self.jits[donate] = jax.jit(self.run, donate_argnums=tuple(range(donate)))
        return jitted

    def load_stored(self, signature: tuple, donate: int) -> tuple[bool, str | None]:
        """Look for the executable in program_store: (found, where it is stored or None when it cannot
        be); a found one is kept for this signature."""
        start = time.perf_counter()
        stored, path = program_store.load(self.name, self.static, signature, donate)
        if stored is None:
            return False, path
        compile_log.record_load(time.perf_counter() - start, f"jit({_function_label(self.run)})")
        self.executables[(donate, signature)] = stored
        return True, path

    def _load_or_compile(self, inputs, donate: int, signature: tuple) -> Callable:
        found, path = self.load_stored(signature, donate)
        if found:
            return self.executables[(donate, signature)]
        with ir_context.reused():
            lowered = self._jit(donate).lower(*inputs)
        return program_store.compile_and_store(lowered, path)


def _function_label(fn: Callable) -> str:
    """The name jax's compile events give a jitted function (a partial's function's name)."""
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "?")


def _signature(inputs) -> tuple | None:
    """What an executable is specialised on, per input; None when an input is not a concrete array
    (or a host numpy array, which the executable transfers itself: fused segments' packed floats)."""
    try:
        return tuple([(v.aval, v.sharding, v.committed) for v in inputs])
    except AttributeError:
        if not all(v is None or type(v) is ARRAY or type(v) is np.ndarray for v in inputs):
            return None
        return tuple([None if v is None else _host_signature(v) if type(v) is np.ndarray
                      else (v.aval, v.sharding, v.committed) for v in inputs])


def _same_objects(signature: tuple, other: tuple) -> bool:
    """Whether two signatures hold the same aval and sharding objects (equal, without comparing them)."""
    if len(signature) != len(other):
        return False
    for new, old in zip(signature, other):
        if new is None or old is None:
            if new is not old:
                return False
        elif new[0] is not old[0] or new[1] is not old[1] or new[2] != old[2]:
            return False
    return True


_host_shardings: dict = {}


def _host_signature(value: np.ndarray) -> tuple:
    """The signature of ``jax.device_put(value)`` (a canonical dtype, uncommitted, on the default
    device), without the transfer."""
    default = jax.config.jax_default_device
    sharding = _host_shardings.get(default)
    if sharding is None:
        sharding = _host_shardings[default] = jax.device_put(np.zeros(0, np.float32)).sharding
    key = (value.shape, value.dtype)
    aval = _host_avals.get(key)
    if aval is None:  # one aval object per shape and dtype: Program.executable's identity check
        if len(_host_avals) > _EXECUTABLES_LIMIT:
            _host_avals.clear()
        aval = _host_avals[key] = core.ShapedArray(value.shape, value.dtype)
    return aval, sharding, False


_host_avals: dict = {}


def op_program(fn: Callable, mode: int, arg_key: tuple, kw_names: tuple, kw_key: tuple, out_sig: Any) -> Program:
    return Program(_program(fn, arg_key, kw_names, kw_key), fn, (mode, arg_key, kw_names, kw_key, out_sig))


_EXECUTABLES_LIMIT = 256  # per Program (a lowering called at very many shapes)


def _direct(executable) -> Callable | None:
    """The C++ callable behind a compiled executable that has run (jax sets ``Compiled._call`` on its
    first call). A plan calling it has no Python frame between the program deleting a donated input
    and the C++ half storing the result in the buffer, where an interrupt (Ctrl-C) would leave the
    buffer holding a deleted array."""
    call = getattr(executable, "_call", None)
    return None if call is None or isinstance(call, types.FunctionType) else call


class _Deferred:
    """A plan's non-donating executable, loaded or compiled on its first call (it may never run)."""

    __slots__ = ("program", "found")

    def __init__(self, program: Program):
        self.program, self.found = program, None

    def __call__(self, *inputs):
        if self.found is None:
            self.found = self.program.executable(inputs)
        return self.found(*inputs)


def plan_executables(program: Program, inputs, donate: int) -> tuple[Callable, Callable | None]:
    """(executable, twin donating the first ``donate`` inputs or None) for a fast-path plan of calls
    like this one: the C++ call of an executable the call ran; else, where nothing is donated, the
    executable compiled or loaded on first use; else the donating jit (C++ too, compiled by jax)."""
    signature = _signature(inputs)

    def get(count: int) -> Callable:
        if signature is None:
            return program._jit(count)
        direct = _direct(program.executables.get((count, signature)))
        if direct is not None:
            return direct
        return program._jit(count) if count else _Deferred(program)

    return get(0), (get(donate) if donate else None)


_scalars: dict = {}
_SCALARS_LIMIT = 4096


def _device_scalar(value: float | int | bool):
    """A Python float (or int, bool) as a cached weak-typed device scalar (the type jit gives a Python
    scalar, so the program is the same). jit moves a Python scalar argument to the device on every
    call: ~5 µs on XLA:CPU, ~160 µs on a TPU v5e (`x * 2.0` vs `x + y` there); constants such as eps,
    alpha or a fixed lr then cost nothing after their first use."""
    # by type (1 == 1.0 == True) and, for floats, sign (0.0 == -0.0)
    key = (type(value), value) if value or type(value) is not float else ("zero", math.copysign(1.0, value))
    array = _scalars.get(key)
    if array is None:
        if value != value:  # NaN: no key finds it again
            return value
        if len(_scalars) >= _SCALARS_LIMIT:
            _scalars.clear()
        array = _scalars[key] = jax.device_put(value)  # weak, uncommitted; jnp.asarray would compile
    return array


# compile_ahead.call once that module is imported: (program, inputs, donate, op_name) -> (result,
# deferred, inputs made concrete); a call whose program is cold runs later, its compile in the background
AHEAD: list = [None]
CONCRETE: list = [None]  # fusion.concrete: deferred values made concrete for a lowering run eagerly


def _eager(fn: Callable, args: list, kwargs: dict, deferred_inputs: bool):
    """The lowering run eagerly (it needs values, or cannot be traced)."""
    if deferred_inputs and CONCRETE[0] is not None:
        args, kwargs = CONCRETE[0](list(args)), {k: CONCRETE[0](v) for k, v in kwargs.items()}
    return fn(*args, **kwargs)


def call(fn: Callable, args: list, kwargs: dict, out_sig: Any, sink: Callable | None = None,
         donate: int = 0, defer: str | None = None, intent: int = 0) -> Any:
    """``fn(*args, **kwargs)`` as one cached jitted program (or eagerly, for lowerings that need values).
    ``sink(program, inputs, floats_are_inputs)`` hears how a call ran as a program (fast_path.py).
    ``donate``: the first ``donate`` inputs (an in-place op's buffer arrays, held by nothing else) are
    donated: the program runs as its donating twin, so only that one compiles. ``defer``: the op's
    name, where the call may be deferred while its program compiles (compile_ahead.py; inputs may
    then be deferred values too); ``intent``: an in-place op's written inputs, which a deferred call
    donates when it runs if nothing else holds them then."""
    dynamic = split_call(args, kwargs, True)
    try:
        mode, signature = _modes.lookup(fn, dynamic)
    except TypeError:  # an unhashable argument (a numpy array, a dict): no program for this call
        return _eager(fn, args, kwargs, defer is not None)
    while mode != EAGER:
        inputs, arg_key, kw_names, kw_key = dynamic if mode == DYNAMIC_FLOATS else split_call(args, kwargs, False)
        key = (fn, mode, arg_key, kw_names, kw_key, out_sig)
        try:
            program = _programs.get(key)
        except TypeError:  # unhashable, and no learned mode hashed it first
            return _eager(fn, args, kwargs, defer is not None)
        if program is None:
            if len(_programs) > _PROGRAMS_LIMIT:
                _programs.clear()
            program = _programs[key] = op_program(fn, mode, arg_key, kw_names, kw_key, out_sig)
        try:
            inputs = [_device_scalar(v) if type(v) is float else v for v in inputs]
            donated = donate and len(inputs) >= donate and all(type(v) is ARRAY for v in inputs[:donate])
            if defer is not None and AHEAD[0] is not None:
                floats = mode == DYNAMIC_FLOATS
                offer = None if sink is None else lambda ran: sink(program, ran, floats)
                return AHEAD[0](program, inputs, donate if donated else 0, defer, intent, offer)[0]
            result = program.executable(inputs, donate if donated else 0)(*inputs)
            if sink is not None:
                sink(program, inputs, mode == DYNAMIC_FLOATS)
            return result
        except TRACE_ERRORS + (NeedsEager,):
            pass
        except ValueError as exc:  # a float handed on as a static argument of an inner jax.jit
            if "Non-hashable static arguments" not in str(exc):
                raise
        _programs.pop(key, None)
        mode = _modes.escalate(fn, signature or _modes.signature(dynamic), mode)
    return _eager(fn, args, kwargs, defer is not None)


def reset() -> None:
    """Forget every per-op program and every lowering's learned mode."""
    _modes.clear()
    _programs.clear()
    _scalars.clear()
