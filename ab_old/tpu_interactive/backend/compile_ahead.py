"""Compile ahead: plain eager runs ahead of its cold programs' XLA compiles, several at once.

A first training step compiles one program per (op, shape): ~70 for a small transformer block, each
~20-30 ms of XLA:CPU, one after another, while the other core idles (1.7x the same step compiled as
one program). An op call whose program is neither in memory nor on disk (program_store) is not
waited for: it is traced and lowered at once (on the calling thread, with its jax settings), its
XLA compile goes to a pool of background threads, and its results are :class:`fusion.Lazy` values
(shape and dtype known) held by ordinary tpu tensors. The next op that is cold too takes those Lazy
values as inputs (its program's input signature is predicted: default device, uncommitted, as an
executable's outputs are), so its compile starts while the first is still compiling.

Deferred calls run in the order they were issued (a FIFO), each with the executable its compile
produced: the same programs, the same donation and so the same results as calling them one by one.
They run when a value is needed: a warm op (or anything else) reading a Lazy input, ``.item()``,
``.cpu()``, ``synchronize()``, a collective, the end of a ``%%tpu`` cell. An error of a deferred call
(rare: shape and dtype errors are raised by torch's meta kernels before anything is deferred, and
programs with value checks (index ranges) are never deferred) is raised there, naming the op and the
line that issued it. Not deferred: sync mode, the NaN check, fused mode (which compiles segments),
traced code, SPMD arrays over several devices, raw kernels (random ops, attention, AMP's unscale),
programs already compiled or stored on disk. ``config.compile_ahead = False`` (or
``TPU_INTERACTIVE_COMPILE_AHEAD=0``) compiles every program on the calling thread, as before.
"""
from __future__ import annotations

import collections
import concurrent.futures
import sys
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.tree_util import tree_flatten, tree_unflatten

from . import compile_log, fusion, graph_checks, ir_context, op_jit, program_store, stats
from .config import config
from .errors import annotate, user_site
from .stats import STATS

_queue: collections.deque = collections.deque()  # deferred calls not yet run, in the order issued
_lock = threading.RLock()  # the queue (ops are issued from the main and autograd's threads)
_count_lock = threading.Lock()  # compile seconds (workers add them; never held while waiting)
_pool: list = [None]
_futures: set = set()  # background compiles not finished


def enabled() -> bool:
    return config.compile_ahead and not (config.fuse or config.sync or config.nan_check)


def has_pending() -> bool:
    """Deferred calls are waiting to run (buffers may hold their Lazy results)."""
    return bool(_queue)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    if _pool[0] is None:
        _pool[0] = concurrent.futures.ThreadPoolExecutor(max(1, config.compile_threads),
                                                         thread_name_prefix="tpu-compile")
    return _pool[0]


class _Call:
    """One deferred program call: its inputs (arrays or Lazy values of earlier calls), its results."""

    # checked: how many donated inputs were deferred values when issued (others may hold them by now)
    __slots__ = ("program", "donate", "checked", "inputs", "outs", "op_name", "site", "sink", "key")

    def resolve(self, value: fusion.Lazy) -> None:
        """Run the deferred calls up to the one that makes ``value``."""
        with _lock:
            while value.value is None and value.error is None:
                if not _queue:
                    raise RuntimeError("tpu: internal error: a deferred value has no pending call")
                _run(_queue[0])


def _execute(program: op_jit.Program, issued: list, donate: int, checked: int) -> tuple[Any, list]:
    """(outputs, inputs as run): ``program`` on ``issued`` with deferred inputs run first; of the first
    ``donate`` (donated) inputs, the first ``checked`` are copied where something else may hold them."""
    inputs = [fusion.resolve(v) if type(v) is fusion.Lazy else v for v in issued]
    _donatable_copies(issued, inputs, checked)
    return program.executable(inputs, donate)(*inputs), inputs


def _run(call: _Call) -> None:
    try:
        outs, inputs = _execute(call.program, call.inputs, call.donate, call.checked)
    except KeyboardInterrupt:
        raise  # still queued: it runs at the next demand
    except BaseException as exc:  # noqa: BLE001 - raised once, named at the issuing line
        _queue.popleft()
        for lazy in call.outs:
            lazy.error, lazy.producer = exc, None
        call.inputs = call.outs = call.sink = None
        raise annotate(exc, call.op_name, None, (), {}, where=fusion._site_frame(call.site),
                       note="deferred while its program compiled (compile ahead); raised when its value was "
                            "needed") from None
    _queue.popleft()
    for lazy, array in zip(call.outs, tree_flatten(outs)[0]):
        lazy.value, lazy.producer = array, None
    if call.sink is not None:  # the plan of a call made of concrete inputs, now that its executable ran
        call.sink(inputs)
    # nothing of the call stays referenced: a Lazy -> call -> Lazy cycle would keep each array one
    # reference more (until the collector runs) and make the next in-place op unable to donate it
    call.inputs = call.outs = call.sink = None


def _run_ready() -> None:
    """Run the queue's head calls whose compiles have finished (so their results and plans exist
    before anything waits for them); one whose compile failed is left for whoever needs its value."""
    with _lock:
        while _queue:
            head = _queue[0]
            if head.key not in head.program.executables:
                future = head.program.pending.get(head.key)
                if future is None or not future.done() or future.exception() is not None:
                    return
            _run(head)


def _donatable_copies(issued: list, arrays: list, donate: int) -> None:
    """The first ``donate`` inputs are donated: each one something else may hold is replaced by a copy."""
    for i in range(donate):
        if not _sole(issued, arrays, i):
            arrays[i] = jax.device_put(arrays[i], may_alias=False)


def _sole(issued: list, arrays: list, i: int) -> bool:
    """The ``i``-th input is held by this call alone (so donating it cannot be seen): its array only
    by the call's lists (and its Lazy's value), its Lazy only by the call's inputs."""
    array = arrays[i]
    if sum(1 for a in arrays if a is array) != 1:
        return False
    if type(issued[i]) is fusion.Lazy:  # references: issued, getrefcount's argument / its value slot,
        return sys.getrefcount(issued[i]) == 2 and sys.getrefcount(array) == 3  # arrays, the argument
    return sys.getrefcount(array) == 3  # issued, arrays, getrefcount's argument


def drain(_reason: str = "") -> None:
    """Run every deferred call now (a synchronisation point)."""
    with _lock:
        while _queue:
            _run(_queue[0])


fusion.before_flush.append(drain)


# ---------------------------------------------------------------- deferring a call
def _predicted(v) -> tuple:
    """The signature entry an executable's output will have when it is this Lazy's value."""
    aval = jax.core.ShapedArray(v.shape, v.dtype, weak_type=v.weak_type)
    return aval, _default_sharding(), False


_sharding: list = [None]


def _default_sharding():
    if _sharding[0] is None:  # as eager's arrays have it (with its memory kind: program_store keys by its text)
        _sharding[0] = jax.device_put(np.zeros((), np.float32)).sharding
    return _sharding[0]


def _abstract(v, signature_item):
    """What the call is lowered with: a concrete input itself, a pending Lazy as its prediction."""
    if type(v) is not fusion.Lazy:
        return v
    if v.value is not None:
        return v.value
    aval = signature_item[0]
    # no sharding: one given would commit the program's outputs, unlike eager's own (uncommitted) arrays
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _signature(inputs: list) -> tuple | None:
    """The input signature, with each Lazy predicted; None where an input is neither."""
    items = []
    for v in inputs:
        t = type(v)
        if t is fusion.Lazy:
            if v.value is not None:
                v = v.value
            elif v.error is not None:
                return None
            else:
                items.append(_predicted(v))
                continue
        elif v is None:
            items.append(None)
            continue
        try:
            sharding = v.sharding
            if len(sharding.device_set) != 1:
                return None  # an SPMD array (tpu_interactive.distributed): its outputs cannot be predicted
            items.append((v.aval, sharding, v.committed))
        except AttributeError:
            return None
    return tuple(items)


def call(program: op_jit.Program, inputs: list, donate: int, op_name: str, intent: int = 0,
         sink: Callable | None = None) -> tuple[Any, bool, list]:
    """(result, deferred, the inputs as run): ``program(*inputs)`` now if its executable is at hand
    (deferred inputs run first), else deferred while it compiles in the background (Lazy results).
    ``donate``: inputs known to be donatable now; ``intent``: the in-place op's written inputs, which
    a deferred call donates if nothing else holds them when it runs (else it donates copies): the
    donating program is the one compiled, as plain eager's next call will run it. ``sink(inputs)``
    offers the call's fast-path plan; a deferred call offers it when it has run (its executables then
    exist)."""
    if _queue:
        _run_ready()
    sig = _signature(inputs) if enabled() else None
    by_intent = False  # donated inputs that were deferred values: checked for other holders when run
    if sig is not None:
        # an in-place op whose written inputs cannot be donated now (deferred values, or values queued
        # calls still read): the donating program, with copies where needed, unless the other one exists.
        # Plain eager's next calls, with nothing else holding them, run the donating one.
        if intent and not donate and (0, sig) not in program.executables and (0, sig) not in program.pending:
            donate, by_intent = intent, True
        key = (donate, sig)
        if key not in program.executables:
            pending = program.pending.get(key)
            site = user_site(3)
            if pending is None:
                found, path = program.load_stored(sig, donate)
                if not found:
                    pending = _submit(program, inputs, donate, op_name, sig, path, site)
            if pending is not None:  # compiling: queued behind it (the compile is not waited for)
                return _queue_call(program, inputs, donate if by_intent else 0, donate, op_name, key, pending.out_info,
                                   sink, site), True, inputs
    result, inputs = _execute(program, inputs, donate, donate if by_intent else 0)
    if sink is not None:
        sink(inputs)
    return result, False, inputs


def _submit(program: op_jit.Program, inputs: list, donate: int, op_name: str, sig: tuple, path: str | None,
            site: tuple | None):
    """Lower the call now and compile it in the background (its future); None where it must run now."""
    abstract = [_abstract(v, item) for v, item in zip(inputs, sig)]
    checks_before = graph_checks.traced_checks[0]
    try:
        with compile_log.lowering_elsewhere() as frontend, ir_context.reused():
            lowered = program._jit(donate).lower(*abstract)
    except op_jit.TRACE_ERRORS + (op_jit.NeedsEager,):
        return None  # op_jit.call learns this lowering's mode as for any call
    if graph_checks.traced_checks[0] != checks_before:
        return None  # its value checks raise at the op: run it now
    # named from the kernel's frame (above this module and op_jit.call): its op and tensor arguments
    attribution = (*compile_log.attribute(sys._getframe(3), op_name), f"{site[0]}:{site[1]}" if site else "",
                   fusion._site_frame(site)[3] if site else "")
    if not ir_context.movable(lowered):
        return None  # its module cannot leave this thread's MLIR context: compiled here
    out_info = tree_flatten(lowered.out_info)
    bytecode = ir_context.detach(lowered)  # for the compiling thread, which parses it into its own context
    future = program.pending[(donate, sig)] = _executor().submit(_compile, lowered, bytecode, path, attribution,
                                                                 frontend[0])
    future.out_info = out_info
    _futures.add(future)
    future.add_done_callback(_futures.discard)
    return future


def _queue_call(program, inputs: list, checked: int, donate: int, op_name: str, key: tuple, out_info: tuple, sink,
                site: tuple | None):
    leaves, out_tree = out_info
    made = _Call()
    made.key, made.checked = key, checked
    made.program, made.donate, made.inputs, made.op_name, made.sink = program, donate, list(inputs), op_name, sink
    made.site = site
    made.outs = [fusion.Lazy(-1, tuple(a.shape), a.dtype, bool(getattr(a, "weak_type", False)), made)
                 for a in leaves]
    with _lock:
        _queue.append(made)
    STATS.compile_ahead_calls += 1
    return tree_unflatten(out_tree, made.outs)


def _compile(lowered, bytecode: bytes, path: str | None, attribution: tuple, frontend_s: float):
    start = time.perf_counter()
    try:
        lowered = ir_context.attach(lowered, bytecode)
        with compile_log.attributed(attribution, frontend_s):
            return program_store.compile_and_store(lowered, path)
    finally:
        with _count_lock:
            STATS.compile_ahead_seconds += time.perf_counter() - start


def wait_for_compiles() -> None:
    """Let the background compiles finish (their counts and seconds are then in the stats)."""
    concurrent.futures.wait(list(_futures))


stats.before_snapshot.append(wait_for_compiles)


op_jit.AHEAD[0] = call
op_jit.CONCRETE[0] = fusion.concrete
