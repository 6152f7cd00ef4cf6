"""``torch.tpu.memory``: PyTorch's memory-history API (``_record_memory_history``, ``_snapshot``,
``_dump_snapshot``) in the snapshot format of ``torch.cuda.memory``, so PyTorch's own tools
(``python -m torch.cuda._memory_viz trace_plot|segment_plot|stats|trace``, pytorch.org/memory_viz)
read it unchanged.

Model: there is no caching allocator behind a tpu storage (XLA owns device memory), so every device
buffer is its own segment holding one block: an allocation is ``segment_alloc`` + ``alloc``, a free is
``free_requested`` + ``free_completed`` + ``segment_free``; reserved == allocated. Zero-byte storages
are not recorded (CUDA does not allocate them either).

Addresses are the storage's ``data_ptr()`` minus the base of the backend's fake address space
(:func:`base_address`): the raw pointers are above 2**62 and the JavaScript viewer reads integers as
doubles, which would merge neighbouring blocks.

Cost: off by default; then the allocation and free paths test one module flag (:data:`RECORDING`).
Recording keeps the Python stack of each event as a flat tuple of (code, line) pairs; dicts in
PyTorch's ``Frame`` format are built only when a snapshot is taken. Frees arrive from
``DeviceBuffer.__del__`` (the garbage collector, at any time), so the hot path only appends to a
bounded deque and sets/pops dict items (atomic under the GIL, no lock).
"""
from __future__ import annotations

import collections
import gc
import os
import pickle
import sys
import time
from typing import Any, Iterable, Literal

__all__ = ["_record_memory_history", "_snapshot", "_dump_snapshot", "is_recording", "DEFAULT_MAX_ENTRIES"]

# Unlike CUDA (unbounded by default), a recording left on in a notebook must not grow without bound.
DEFAULT_MAX_ENTRIES = 100_000
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot")
_LARGE_SEGMENT = 1 << 20  # CUDA calls segments above 1 MiB "large"
_BACKEND_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

RECORDING = False  # read on every allocation and free: the only cost while recording is off
_recorder: "_Recorder | None" = None  # the current recording, or the last one after it was stopped


class _Recorder:
    def __init__(self, enabled: str, context: str | None, stacks: str, max_entries: int, skip: Iterable[str]):
        self.keep_trace = enabled == "all"
        self.stack_for_blocks = context is not None
        self.stack_in_alloc_events = context in ("alloc", "all")
        self.stack_in_free_events = context == "all"
        self.python_only = stacks == "python"
        self.skip = frozenset(skip)
        # (action, addr, size, stack, time_us, extra) in order; oldest dropped first
        self.trace: collections.deque = collections.deque(maxlen=max_entries)
        self.block_stacks: dict[int, tuple] = {}  # addr -> stack of its allocation, while it lives

    def stack(self) -> tuple:
        """The caller's Python stack, innermost first, as (code, line, code, line, ...)."""
        frame = sys._getframe(2)  # skip stack() and on_alloc/on_free/on_oom
        out: list = []
        python_only = self.python_only
        while frame is not None:
            code = frame.f_code
            if not (python_only and code.co_filename.startswith(_BACKEND_DIR)):
                out.append(code)
                out.append(frame.f_lineno)
            frame = frame.f_back
        return tuple(out)

    def event(self, action: str, addr: int, size: int, stack: tuple, now: int, extra: int = 0) -> None:
        if action not in self.skip:
            self.trace.append((action, addr, size, stack, now, extra))


def _now_us() -> int:
    return time.time_ns() // 1000


# on_alloc/on_free/on_oom are called by storage.py only while RECORDING is set.
def on_alloc(address: int, nbytes: int) -> None:
    rec = _recorder
    if rec is None or not nbytes:
        return
    stack = rec.stack() if rec.stack_for_blocks else ()
    rec.block_stacks[address] = stack
    if rec.keep_trace:
        now, events_stack = _now_us(), stack if rec.stack_in_alloc_events else ()
        rec.event("segment_alloc", address, nbytes, events_stack, now)
        rec.event("alloc", address, nbytes, events_stack, now)


def on_free(address: int, nbytes: int) -> None:
    rec = _recorder
    if rec is None or not nbytes:
        return
    rec.block_stacks.pop(address, None)
    if rec.keep_trace:
        now, stack = _now_us(), rec.stack() if rec.stack_in_free_events else ()
        for action in ("free_requested", "free_completed", "segment_free"):
            rec.event(action, address, nbytes, stack, now)


def on_oom(nbytes: int, device_free: int) -> None:
    rec = _recorder
    if rec is not None and rec.keep_trace:
        stack = rec.stack() if rec.stack_in_alloc_events else ()
        rec.event("oom", base_address(), nbytes, stack, _now_us(), device_free)


# The start of the backend's fake address space (storage.py allocates from here): non-canonical, so
# any dereference faults. It lives here so that the recorder needs nothing from storage.
ADDRESS_BASE = 0x5450_0000_0000_0000

# storage.DeviceBuffer, set by storage.py when it defines it (storage imports this module, not back)
BUFFER_TYPE: type | None = None


def base_address() -> int:
    """Snapshot addresses are data_ptr() minus this (the start of the backend's fake address space)."""
    return ADDRESS_BASE


def is_recording() -> bool:
    return RECORDING


def _record_memory_history(enabled: Literal["state", "all"] | None | bool = "all", context: str | None = "all",
                           stacks: str = "all", max_entries: int = DEFAULT_MAX_ENTRIES, device: Any = None,
                           clear_history: bool = False, compile_context: bool = False,
                           global_record_annotations: bool = False, skip_actions: list[str] | None = None) -> None:
    """Start (``"all"``: live blocks and a trace of alloc/free events; ``"state"``: live blocks only)
    or stop (``None``) recording, as ``torch.cuda.memory._record_memory_history``.

    ``context``: which events keep their Python stack (None, "state", "alloc", "all");
    ``stacks="python"`` leaves out this backend's own frames. The trace keeps the newest
    ``max_entries`` events (default 100000: bounded even when left on). Turning recording off keeps
    what was recorded for :func:`_snapshot`; turning it on again keeps it too unless ``clear_history``.
    ``compile_context`` and ``global_record_annotations`` have nothing to record on tpu.
    """
    global RECORDING, _recorder
    if isinstance(enabled, bool):  # the legacy boolean form
        enabled = "all" if enabled else None
    if enabled not in (None, "state", "all"):
        raise ValueError(f"expected enabled to be 'state', 'all', or None, got {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"expected context to be 'state', 'alloc', 'all', or None, got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"expected stacks to be 'python' or 'all', got {stacks!r}")
    if not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
    unknown = sorted(set(skip_actions or ()) - set(ACTIONS))
    if unknown:
        raise ValueError(f"unknown skip_actions {unknown}; valid actions: {', '.join(ACTIONS)}")
    if device is not None:
        _check_device(device)
    if enabled is None:
        RECORDING = False  # _recorder stays: _snapshot still returns what it recorded
        return
    fresh = _Recorder(enabled, context, stacks, max_entries, skip_actions or ())
    if _recorder is not None and not clear_history:
        fresh.trace.extend(_recorder.trace)
        if RECORDING:  # block stacks are only exact while frees were observed
            fresh.block_stacks.update(_recorder.block_stacks)
    _recorder, RECORDING = fresh, True


def _check_device(device: Any) -> None:
    import torch

    dev = torch.device(device) if not isinstance(device, int) else torch.device("tpu", device)
    if dev.type != "tpu" or dev.index not in (None, 0):
        raise ValueError(f"Expected a tpu device (tpu:0), but got: {dev}")


def _live_buffers() -> list:
    kind = BUFFER_TYPE
    return [o for o in gc.get_objects() if type(o) is kind and o.nbytes]


def _stable_copy(make):
    """Copy a container that the garbage collector may change under us (frees append to the trace)."""
    for _ in range(100):
        try:
            return make()
        except RuntimeError:  # "deque mutated during iteration"
            continue
    return make()


class _Frames:
    """(code, line, ...) tuples -> lists of PyTorch ``Frame`` dicts; one dict per distinct frame, so
    pickle stores each once."""

    def __init__(self):
        self._cache: dict[tuple, dict] = {}

    def __call__(self, stack: tuple) -> list[dict]:
        out = []
        for i in range(0, len(stack), 2):
            key = (stack[i], stack[i + 1])
            frame = self._cache.get(key)
            if frame is None:
                code = stack[i]
                frame = self._cache[key] = {"filename": code.co_filename, "line": stack[i + 1], "name": code.co_name}
            out.append(frame)
        return out


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The tpu memory state as ``torch.cuda.memory._snapshot()`` returns it: ``segments`` (one per live
    device buffer, with its block and the allocating stack when recorded) and ``device_traces``
    (the recorded alloc/free events of device 0, oldest first)."""
    if device is not None:
        _check_device(device)
    rec = _recorder
    base = base_address()
    frames = _Frames()
    stacks = _stable_copy(lambda: dict(rec.block_stacks)) if rec is not None else {}
    segments = []
    for buf in sorted(_live_buffers(), key=lambda b: b.address):
        addr, size = buf.address - base, buf.nbytes
        block_frames = frames(stacks.get(buf.address, ()))
        block = {"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                 "frames": block_frames}
        segments.append({"device": 0, "address": addr, "total_size": size, "allocated_size": size,
                         "active_size": size, "requested_size": size, "stream": 0,
                         "segment_type": "large" if size > _LARGE_SEGMENT else "small",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": block_frames,
                         "blocks": [block]})
    trace = []
    if rec is not None:
        for action, addr, size, stack, when, extra in _stable_copy(lambda: list(rec.trace)):
            entry = {"action": action, "addr": addr - base, "size": size, "stream": 0, "time_us": when,
                     "frames": frames(stack)}
            if action == "oom":
                entry["device_free"] = extra
            trace.append(entry)
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {},
            "external_annotations": []}


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickle :func:`_snapshot` to ``filename`` (pickle protocol 4: the JavaScript viewer reads 2-4).

    An unwritable path raises the OSError with the path named; recording goes on unchanged."""
    data = pickle.dumps(_snapshot(), protocol=4)
    path = os.fspath(filename)
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write the tpu memory snapshot to {path!r}: {exc.strerror}; "
                                   "the recording is unchanged, call _dump_snapshot again with a writable path",
                        path) from exc

