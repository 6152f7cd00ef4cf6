"""Counters the backend keeps about itself: the public stats API that magics and widgets read.

Everything here is plain Python data (no IPython), cheap to update on the hot path, and exact:
live bytes go up when a device buffer is attached to a storage and down when that storage dies.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import threading
import time
from typing import Any, Callable


@dataclasses.dataclass
class CompileEvent:
    name: str
    cause: str
    seconds: float
    hit: bool
    when: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class XlaCompile:
    """One XLA compilation (or load from the persistent cache) and what caused it."""
    op: str  # "aten::mm.default", "torch.compile graph forward_0", "compile_train_step train_step0"
    shapes: str  # the inputs of that op or graph: "(8, 24, 64) float32, (64, 64) float32"
    seconds: float  # tracing + lowering + compiling (or reading from disk)
    from_disk: bool  # loaded from JAX's persistent compilation cache
    where: str  # the user's file:line ("" if none)
    source: str  # that line's text
    when: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class FusedRun:
    """One flushed segment of fused eager mode."""
    ops: int  # ops recorded in it
    # "cached" (program reused), "compiled" (new program), "op by op" (shapes keep changing), "in pieces"
    # (its steps whose shapes stay as fused programs, the others op by op), "not recorded"
    mode: str
    cause: str  # why a new program was compiled / why it ran op by op ("" when cached)
    reason: str  # what flushed it: "a value was needed", "op-count limit", "fused mode switched off", ...
    seconds: float  # host time of the flush (compiling included, the device's work not waited for)
    where: str  # file:line of its first recorded op
    when: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class Transfers:
    """Copies in one direction; ``snapshot()`` lists them as ``h2d_count``, ``d2h_bytes``, ..."""
    count: int = 0
    bytes: int = 0
    seconds: float = 0.0  # host time spent copying (a device->host copy also waits for the device)


@dataclasses.dataclass
class Stats:
    op_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    op_seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    fallback_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    decomposition_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # op name -> {"pallas": n, "xla": n}: which path each Pallas-capable op took.
    kernel_paths: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    # "h2d" (host->device) and "d2h" (device->host) copies
    transfers: dict = dataclasses.field(default_factory=lambda: {"h2d": Transfers(), "d2h": Transfers()})
    live_bytes: int = 0
    peak_bytes: int = 0
    live_buffers: int = 0
    peak_buffers: int = 0
    # cumulative since start / reset_accumulated (torch.cuda's "allocated"/"freed" totals)
    allocated_bytes_total: int = 0
    freed_bytes_total: int = 0
    allocations: int = 0
    frees: int = 0
    compile_hits: int = 0
    compile_misses: int = 0
    compile_seconds: float = 0.0
    recent_compiles: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=20))
    # every XLA program the backend compiled (eager ops and compiled graphs alike), see compile_log.py
    xla_compiles: int = 0
    xla_compile_seconds: float = 0.0
    xla_disk_hits: int = 0
    xla_compile_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    xla_compile_op_seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    recent_xla_compiles: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=500))
    # compile ahead (compile_ahead.py): op calls deferred while their programs compiled in the
    # background, and those compiles' seconds (on background threads, overlapping the caller's work)
    compile_ahead_calls: int = 0
    compile_ahead_seconds: float = 0.0
    errors: int = 0
    # fused eager mode (fusion.py): segments run, by how
    fused_segments: int = 0
    fused_ops: int = 0
    fused_cached: int = 0
    fused_compiled: int = 0
    fused_op_by_op: int = 0
    fused_in_pieces: int = 0  # past its variants, the steps whose shapes stay as fused pieces (segment_pieces.py)
    fused_not_recorded: int = 0  # stretches run as plain eager (unrecorded.py)
    recent_fused: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=50))


_lock = threading.Lock()
STATS = Stats()
# Sizes of freed buffers not yet subtracted. record_free runs from DeviceBuffer.__del__, i.e. from the
# garbage collector at *any* allocation, possibly while this thread holds _lock (a lock there would
# deadlock) or is half-way through updating live_bytes (an update there would be lost). deque.append
# is atomic and takes no lock; the frees are folded in under _lock before the counters are read.
_pending_frees: collections.deque = collections.deque()


def _fold_memory() -> None:
    """The frees queued here and the C++ counters' allocations and frees, into STATS. Caller holds _lock."""
    while _pending_frees:
        try:
            nbytes = _pending_frees.popleft()
        except IndexError:  # emptied by another thread between the test and the pop
            return
        STATS.live_bytes -= nbytes
        STATS.live_buffers -= 1
        STATS.freed_bytes_total += nbytes
        STATS.frees += 1
    if _native_take is not None:
        net, top, net_buffers, top_buffers, allocated, allocations, freed, frees = _native_take()
        STATS.peak_bytes = max(STATS.peak_bytes, STATS.live_bytes + top)
        STATS.peak_buffers = max(STATS.peak_buffers, STATS.live_buffers + top_buffers)
        STATS.live_bytes += net
        STATS.live_buffers += net_buffers
        STATS.allocated_bytes_total += allocated
        STATS.allocations += allocations
        STATS.freed_bytes_total += freed
        STATS.frees += frees


def record_alloc(nbytes: int) -> None:
    with _lock:
        _fold_memory()
        STATS.live_bytes += nbytes
        STATS.live_buffers += 1
        STATS.allocated_bytes_total += nbytes
        STATS.allocations += 1
        if STATS.live_bytes > STATS.peak_bytes:
            STATS.peak_bytes = STATS.live_bytes
        if STATS.live_buffers > STATS.peak_buffers:
            STATS.peak_buffers = STATS.live_buffers


def record_free(nbytes: int) -> None:
    _pending_frees.append(nbytes)


# The C++ extension's counters (csrc/memory_counters.cpp), once :func:`count_natively` switched to them:
# the fast path counts each output there without Python, and every other allocation and free goes
# there too, so that their order (which the peak depends on) is kept.
_native_take: Callable[[], tuple] | None = None


def count_natively(module: Any) -> None:
    """From now on allocations and frees are counted by ``module``'s C++ counters (``memory_alloc``,
    ``memory_free``), folded into STATS with the pending frees before any counter is read."""
    global record_alloc, record_free, _native_take
    with _lock:
        _fold_memory()
        record_alloc, record_free, _native_take = module.memory_alloc, module.memory_free, module.memory_take


@dataclasses.dataclass(frozen=True)
class MemoryCounters:
    live_bytes: int
    peak_bytes: int
    live_buffers: int


def memory() -> MemoryCounters:
    """Live and peak bytes of tpu buffers, with every free so far accounted for."""
    with _lock:
        _fold_memory()
        return MemoryCounters(STATS.live_bytes, STATS.peak_bytes, STATS.live_buffers)


@dataclasses.dataclass(frozen=True)
class MemoryTotals:
    live_bytes: int
    peak_bytes: int
    allocated_bytes: int
    freed_bytes: int
    live_buffers: int
    peak_buffers: int
    allocations: int
    frees: int


def memory_totals() -> MemoryTotals:
    """Current, peak and cumulative bytes and buffers (what torch.cuda.memory_stats() reports)."""
    with _lock:
        _fold_memory()
        return MemoryTotals(STATS.live_bytes, STATS.peak_bytes, STATS.allocated_bytes_total,
                            STATS.freed_bytes_total, STATS.live_buffers, STATS.peak_buffers,
                            STATS.allocations, STATS.frees)


def reset_accumulated() -> None:
    with _lock:
        _fold_memory()
        STATS.allocated_bytes_total = STATS.freed_bytes_total = STATS.allocations = STATS.frees = 0


def record_transfer(direction: str, nbytes: int, seconds: float = 0.0) -> None:
    """Count one copy; ``direction`` is "h2d" (host->device) or "d2h" (device->host)."""
    record = STATS.transfers[direction]
    record.count += 1
    record.bytes += nbytes
    record.seconds += seconds


def record_compile(name: str, cause: str, seconds: float, hit: bool) -> None:
    with _lock:
        if hit:
            STATS.compile_hits += 1
        else:
            STATS.compile_misses += 1
            STATS.compile_seconds += seconds
        STATS.recent_compiles.append(CompileEvent(name, cause, seconds, hit))


def record_xla_compile(op: str, shapes: str, seconds: float, from_disk: bool, where: str, source: str) -> None:
    with _lock:
        STATS.xla_compiles += 1
        STATS.xla_compile_seconds += seconds
        STATS.xla_disk_hits += from_disk
        STATS.xla_compile_counts[op] += 1
        STATS.xla_compile_op_seconds[op] += seconds
        STATS.recent_xla_compiles.append(XlaCompile(op, shapes, seconds, from_disk, where, source))


def record_fused(ops: int, mode: str, cause: str, reason: str, seconds: float, where: str) -> None:
    with _lock:
        STATS.fused_segments += 1
        STATS.fused_ops += ops
        if mode == "cached":
            STATS.fused_cached += 1
        elif mode == "compiled":
            STATS.fused_compiled += 1
        elif mode == "not recorded":
            STATS.fused_not_recorded += 1
        elif mode == "in pieces":
            STATS.fused_in_pieces += 1
        else:
            STATS.fused_op_by_op += 1
        STATS.recent_fused.append(FusedRun(ops, mode, cause, reason, seconds, where))


def record_kernel_path(op: str, path: str, calls: int = 1) -> None:
    STATS.kernel_paths[op][path] += calls


# compile_ahead.wait_for_compiles: counters include the XLA compiles running in the background
before_snapshot: list = []
# Counts kept elsewhere until a read (the C++ fast path's op calls): added to STATS under _lock before a
# snapshot or a reset
folds: list[Callable[[], None]] = []


def _fold_elsewhere() -> None:
    """Caller holds _lock."""
    for fold in folds:
        fold()


def snapshot() -> dict[str, Any]:
    """A deep copy of every counter, safe to keep and diff (see :func:`diff`)."""
    for hook in before_snapshot:
        hook()
    with _lock:
        _fold_memory()
        _fold_elsewhere()
        snap: dict[str, Any] = {}
        for field in dataclasses.fields(STATS):
            value = getattr(STATS, field.name)
            if field.name == "transfers":  # flat keys: h2d_count, h2d_bytes, h2d_seconds, d2h_count, ...
                for direction, record in value.items():
                    snap.update({f"{direction}_{k}": v for k, v in dataclasses.asdict(record).items()})
                continue
            if field.name == "kernel_paths":
                value = {k: dict(v) for k, v in value.items()}
            elif field.name in ("recent_compiles", "recent_xla_compiles", "recent_fused"):
                value = [dataclasses.asdict(e) for e in value]
            elif isinstance(value, dict):
                value = dict(value)
            snap[field.name] = value
        return copy.deepcopy(snap)


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots (counters subtracted; live/peak bytes reported as-is)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and key != "kernel_paths":
            delta = {k: v - (old or {}).get(k, 0) for k, v in value.items()}
            out[key] = {k: v for k, v in delta.items() if v}
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value - (old or 0)
        else:
            out[key] = value
    out["live_bytes_after"] = after["live_bytes"]
    out["peak_bytes_after"] = after["peak_bytes"]
    return out


def reset(keep_memory: bool = True) -> None:
    """Zero the counters. Live-byte accounting is kept (it describes buffers that still exist)."""
    with _lock:
        _fold_memory()
        _fold_elsewhere()
        live, buffers = STATS.live_bytes, STATS.live_buffers
        fresh = Stats()
        for field in dataclasses.fields(Stats):
            current = getattr(STATS, field.name)
            if field.name == "transfers":  # records no one else holds: replaced
                STATS.transfers = fresh.transfers
            elif hasattr(current, "clear"):
                current.clear()  # in place: kernels hold references to these counters (dispatch._guarded)
            else:
                setattr(STATS, field.name, getattr(fresh, field.name))
        if keep_memory:
            STATS.live_bytes, STATS.live_buffers, STATS.peak_bytes = live, buffers, live
            STATS.peak_buffers = buffers


def reset_peak() -> None:
    with _lock:
        _fold_memory()
        STATS.peak_bytes = STATS.live_bytes
        STATS.peak_buffers = STATS.live_buffers
