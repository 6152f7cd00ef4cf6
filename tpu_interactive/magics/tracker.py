"""Per-cell measurements: counters before/after a cell, its memory delta and its own peak.

The backend keeps one peak counter; to report a *cell's* peak it is reset when the cell starts
(``backend.stats.reset_peak``), after folding it into the session peak kept here. No IPython here:
the extension calls :meth:`CellTracker.begin`/:meth:`CellTracker.end` from its pre/post_run_cell hooks.
"""
from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any

import tpu_interactive
from tpu_interactive.backend import stats as backend_stats


@dataclasses.dataclass
class CellDelta:
    wall_seconds: float
    diff: dict[str, Any]  # tpu_interactive.stats_diff(before, after)
    live_before: int
    live_after: int
    peak: int  # highest live device bytes while the cell ran

    @property
    def memory_delta(self) -> int:
        return self.live_after - self.live_before


class Measurement:
    """One measured span (a cell, or the body of a %%tpu cell)."""

    def __init__(self, tracker: "CellTracker"):
        self._tracker = tracker
        tracker.fold_peak()
        backend_stats.reset_peak()
        self.before = tpu_interactive.stats()
        self.start = time.perf_counter()

    def finish(self) -> CellDelta:
        wall = time.perf_counter() - self.start
        after = tpu_interactive.stats()
        self._tracker.fold_peak(after["peak_bytes"])
        return CellDelta(wall, tpu_interactive.stats_diff(self.before, after), self.before["live_bytes"],
                         after["live_bytes"], after["peak_bytes"])


class CellTracker:
    def __init__(self):
        self.session_peak = 0
        self.last: CellDelta | None = None
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

    def end(self) -> CellDelta | None:
        if self._current is None:
            return None
        self.last, self._current = self._current.finish(), None
        return self.last

    def peak_now(self) -> int:
        """Session peak including whatever the running span reached so far."""
        return max(self.session_peak, backend_stats.memory().peak_bytes)

    def reset(self) -> None:
        self.session_peak = backend_stats.memory().live_bytes
        self.last = None

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
