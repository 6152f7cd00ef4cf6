"""The plots as the magics and the dashboard show them: SVG from session.plots over the cell
tracker's history and the last recorded memory history, with a text fallback. No IPython here."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from tpu_interactive import backend
from tpu_interactive.backend import memory_history

from . import namespace, plots
from .fmt import fmt_bytes, fmt_seconds, text_table
from .tracker import TRACKER


def variable_names(ns: Mapping[str, Any]) -> dict[int, str]:
    """Snapshot address -> the namespace names of the tpu tensor living there."""
    base = memory_history.base_address()
    return {t.data_ptr - base: ", ".join(t.names) for t in namespace.live_tensors(ns)}


def recorded_snapshot() -> dict[str, Any] | None:
    """The current or last memory-history recording, or None if there never was one."""
    return torch.tpu.memory._snapshot() if memory_history._recorder is not None else None


def timeline_svg(ns: Mapping[str, Any]) -> str | None:
    snap = recorded_snapshot()
    return plots.memory_timeline(snap, variable_names(ns)) if snap is not None else None


def timeline_text(ns: Mapping[str, Any]) -> str:
    snap = recorded_snapshot()
    if snap is None:
        return ("no memory history recorded: torch.tpu.memory._record_memory_history() (or %%tpu --memory-trace) "
                "records one")
    data = plots.timeline_data(snap, variable_names(ns))
    rows = [(fmt_bytes(r["size"]), r["name"] or "-", r["line"] or "-") for r in data["largest"]]
    return (f"memory history: {len(data['series']) - 1} alloc/free events, peak {fmt_bytes(data['peak'])} "
            f"after event {data['peak_index']}; largest allocations live at the peak:\n"
            + text_table(("bytes", "variable", "allocated at"), rows))


def cells_text(last: int = 20) -> str:
    records = list(TRACKER.history)[-last:]
    if not records:
        return "no cells recorded yet"
    rows = [(r.label, fmt_bytes(r.live_after), fmt_bytes(r.peak), fmt_seconds(r.wall_seconds),
             fmt_seconds(r.compile_seconds), fmt_seconds(r.run_seconds), fmt_seconds(r.transfer_seconds))
            for r in records]
    return text_table(("cell", "in use after", "peak", "wall", "compiling", "running", "transfers"), rows)


def cells_svgs() -> tuple[str, str]:
    records = list(TRACKER.history)
    limit = backend.memory_stats()["bytes_limit"]
    return plots.memory_per_cell(records, limit), plots.time_per_cell(records)


def svg_bundle(svgs: list[str], text: str) -> dict[str, str]:
    """A display bundle: the pictures as one SVG-in-HTML output, the text for terminals."""
    return {"text/html": "<div class='tpu-plots'>" + "".join(svgs) + "</div>", "text/plain": text}
