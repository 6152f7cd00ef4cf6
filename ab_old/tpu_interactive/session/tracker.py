"""Per-cell measurements: counters before/after a cell, its memory delta and its own peak.

The backend keeps one peak counter; to report a *cell's* peak it is reset when the cell starts
(``backend.stats.reset_peak``), after folding it into the session peak kept here. No IPython here:
the extension calls :meth:`CellTracker.begin`/:meth:`CellTracker.end` from its pre/post_run_cell hooks.
"""
from __future__ import annotations

import collections
import dataclasses
import time
import weakref
from typing import Any

from tpu_interactive import backend
from tpu_interactive.backend import stats as backend_stats


@dataclasses.dataclass
class CellDelta:
    wall_seconds: float
    diff: dict[str, Any]  # backend_stats.diff(before, after)
    live_before: int
    live_after: int
    peak: int  # highest live device bytes while the cell ran

    @property
    def memory_delta(self) -> int:
        return self.live_after - self.live_before


HISTORY_CELLS = 200  # cells kept for the per-cell plots (a bounded ring)


@dataclasses.dataclass(frozen=True)
class CellRecord:
    """One cell, as the per-cell plots show it: memory after/peak and where its wall time went."""
    label: str  # "[12]": the execution count
    wall_seconds: float
    live_after: int
    peak: int
    limit: int | None  # the device memory limit at the time (None: not reported)
    compile_seconds: float  # XLA compiles (eager ops and compiled graphs)
    transfer_seconds: float  # host<->device copies
    run_seconds: float  # op time less the compiles and copies inside ops

    @property
    def other_seconds(self) -> float:
        """Python and everything else: the rest of the wall time."""
        return max(self.wall_seconds - self.compile_seconds - self.transfer_seconds - self.run_seconds, 0.0)

    @classmethod
    def of(cls, label: str, delta: "CellDelta", limit: int | None) -> "CellRecord":
        d, wall = delta.diff, delta.wall_seconds
        # the parts are shares of the wall time: compiles on background threads (compile_ahead) run side
        # by side and can add up to more than the cell's wall time, which the text report still states
        compile_s = min(d.get("xla_compile_seconds", 0.0), wall)
        transfer_s = min(d.get("h2d_seconds", 0.0) + d.get("d2h_seconds", 0.0), wall - compile_s)
        in_ops = sum(v for k, v in d.get("xla_compile_op_seconds", {}).items() if k.startswith("aten::"))
        run = sum(d.get("op_seconds", {}).values()) - in_ops - transfer_s
        run = min(max(run, 0.0), max(wall - compile_s - transfer_s, 0.0))
        return cls(label, wall, delta.live_after, delta.peak, limit, compile_s, transfer_s, run)


class Measurement:
    """One measured span (a cell, or the body of a %%tpu cell)."""

    def __init__(self, tracker: "CellTracker"):
        self._tracker = tracker
        tracker.fold_peak()
        backend_stats.reset_peak()
        self.before = backend_stats.snapshot()
        self.start = time.perf_counter()

    def finish(self) -> CellDelta:
        wall = time.perf_counter() - self.start
        after = backend_stats.snapshot()
        self._tracker.fold_peak(after["peak_bytes"])
        return CellDelta(wall, backend_stats.diff(self.before, after), self.before["live_bytes"],
                         after["live_bytes"], after["peak_bytes"])


class CellTracker:
    def __init__(self):
        self.session_peak = 0
        self.last: CellDelta | None = None
        self.history: collections.deque[CellRecord] = collections.deque(maxlen=HISTORY_CELLS)
        self._current: Measurement | None = None
        self._refreshers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._warned: set = set()  # advice the reports already gave (each is given once per session)

    def first_warning(self, key: Any) -> bool:
        """True the first time ``key`` is asked about in this session."""
        if key in self._warned:
            return False
        self._warned.add(key)
        return True

    def fold_peak(self, peak: int | None = None) -> None:
        if peak is None:
            peak = backend_stats.memory().peak_bytes
        self.session_peak = max(self.session_peak, peak)

    def measure(self) -> Measurement:
        return Measurement(self)

    def begin(self) -> None:
        self._current = Measurement(self)

    def end(self, label: str = "") -> CellDelta | None:
        if self._current is None:
            return None
        self.last, self._current = self._current.finish(), None
        limit = backend.memory_stats()["bytes_limit"]
        self.history.append(CellRecord.of(label or f"#{len(self.history) + 1}", self.last, limit))
        return self.last

    def peak_now(self) -> int:
        """Session peak including whatever the running span reached so far."""
        return max(self.session_peak, backend_stats.memory().peak_bytes)

    def reset(self) -> None:
        self.session_peak = backend_stats.memory().live_bytes
        self.last = None
        self.history.clear()

    # Dashboards register themselves here; the post_run_cell hook refreshes them.
    def add_refresher(self, obj: Any) -> None:
        self._refreshers.add(obj)

    def remove_refresher(self, obj: Any) -> None:
        self._refreshers.discard(obj)

    def refresh_all(self, ns) -> None:
        for obj in list(self._refreshers):
            try:
                obj.refresh(ns)
            except Exception as exc:  # noqa: BLE001 - a broken view must not break the user's cell
                print(f"[tpu] dashboard refresh failed: {exc!r}")


TRACKER = CellTracker()
