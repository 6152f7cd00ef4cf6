"""Offline pictures as plain SVG strings: memory per cell, time per cell, a memory-history timeline.

Plain SVG made here (no plotting library, no JavaScript, no CDN): it renders in JupyterLab, classic
Notebook, Colab, VS Code and on GitHub, keeps working offline, and stays in a saved notebook as a
static image (``image/svg+xml`` output, or the value of an ``ipywidgets.HTML``). Every drawn mark
carries its numbers as ``data-*`` attributes and a ``<title>`` tooltip, so tests and browsers can read
what is drawn. No IPython here.
"""
from __future__ import annotations

import html
from typing import Any, Iterable, Mapping, Sequence

from .fmt import fmt_bytes, fmt_seconds

WIDTH, HEIGHT = 640, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 110, 24, 30  # margins: y labels left, legend right
COLOURS = {"live": "#4e79a7", "peak": "#a0cbe8", "limit": "#c62828", "compile": "#f28e2c", "run": "#4e79a7",
           "transfer": "#59a14f", "other": "#bab0ab", "line": "#4e79a7"}
_FONT = "font-family='monospace' font-size='10'"


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _svg(title: str, body: Sequence[str], kind: str, height: int = HEIGHT) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='tpu-plot' data-plot='{kind}' width='{WIDTH}' "
            f"height='{height}' viewBox='0 0 {WIDTH} {height}'>"
            f"<rect width='{WIDTH}' height='{height}' fill='white'/>"
            f"<text x='{_LEFT}' y='14' font-family='sans-serif' font-size='12' font-weight='bold'>{_esc(title)}</text>"
            + "".join(body) + "</svg>")


def _empty(title: str, kind: str, message: str) -> str:
    return _svg(title, [f"<text x='{_LEFT}' y='{HEIGHT // 2}' {_FONT}>{_esc(message)}</text>"], kind)


class _Frame:
    """The plot area and a linear y scale from 0 to ``top``."""

    def __init__(self, top: float, n: int):
        self.top = top if top > 0 else 1.0
        self.x0, self.x1 = _LEFT, WIDTH - _RIGHT
        self.y0, self.y1 = HEIGHT - _BOTTOM, _TOP
        self.step = (self.x1 - self.x0) / max(n, 1)

    def y(self, value: float) -> float:
        return self.y0 - (self.y0 - self.y1) * value / self.top

    def axes(self, fmt) -> list[str]:
        out = [f"<line x1='{self.x0}' y1='{self.y0}' x2='{self.x1}' y2='{self.y0}' stroke='#888'/>",
               f"<line x1='{self.x0}' y1='{self.y0}' x2='{self.x0}' y2='{self.y1}' stroke='#888'/>"]
        for i in range(5):
            value = self.top * i / 4
            y = self.y(value)
            out.append(f"<line x1='{self.x0 - 3}' y1='{y:.1f}' x2='{self.x1}' y2='{y:.1f}' stroke='#eee'/>"
                       f"<text x='{self.x0 - 5}' y='{y + 3:.1f}' text-anchor='end' {_FONT}>{_esc(fmt(value))}</text>")
        return out

    def x_labels(self, labels: Sequence[str]) -> list[str]:
        every = max(1, len(labels) // 12)
        return [f"<text x='{self.x0 + (i + 0.5) * self.step:.1f}' y='{self.y0 + 12}' text-anchor='middle' {_FONT}>"
                f"{_esc(label)}</text>" for i, label in enumerate(labels) if i % every == 0]


def _legend(items: Iterable[tuple[str, str]]) -> list[str]:
    out = []
    for i, (key, text) in enumerate(items):
        y = _TOP + 4 + 14 * i
        out.append(f"<rect x='{WIDTH - _RIGHT + 8}' y='{y}' width='10' height='10' fill='{COLOURS[key]}'/>"
                   f"<text x='{WIDTH - _RIGHT + 22}' y='{y + 9}' {_FONT}>{_esc(text)}</text>")
    return out


def memory_per_cell(records: Sequence[Any], limit: int | None = None) -> str:
    """Bars per cell: peak (light) and bytes in use after the cell (dark), with the limit line
    (``limit``, else the newest cell's)."""
    title = "TPU memory per cell"
    if not records:
        return _empty(title, "memory-per-cell", "no cells recorded yet")
    limit = limit or next((r.limit for r in reversed(records) if r.limit), None)
    frame = _Frame(max([r.peak for r in records] + [r.live_after for r in records] + [limit or 0]) * 1.08,
                   len(records))
    body = frame.axes(fmt_bytes)
    width = frame.step * 0.7
    for i, r in enumerate(records):
        x = frame.x0 + i * frame.step + frame.step * 0.15
        tip = f"cell {r.label}: peak {fmt_bytes(r.peak)}, in use after {fmt_bytes(r.live_after)}"
        body.append(f"<g class='cell' data-cell='{_esc(r.label)}' data-peak='{r.peak}' data-live='{r.live_after}'>"
                    f"<title>{_esc(tip)}</title>"
                    f"<rect class='peak' x='{x:.1f}' y='{frame.y(r.peak):.1f}' width='{width:.1f}' "
                    f"height='{frame.y0 - frame.y(r.peak):.1f}' fill='{COLOURS['peak']}'/>"
                    f"<rect class='live' x='{x + width * 0.2:.1f}' y='{frame.y(r.live_after):.1f}' "
                    f"width='{width * 0.6:.1f}' height='{frame.y0 - frame.y(r.live_after):.1f}' "
                    f"fill='{COLOURS['live']}'/></g>")
    if limit:
        y = frame.y(limit)
        body.append(f"<g class='limit' data-bytes='{limit}'><title>limit {_esc(fmt_bytes(limit))}</title>"
                    f"<line x1='{frame.x0}' y1='{y:.1f}' x2='{frame.x1}' y2='{y:.1f}' stroke='{COLOURS['limit']}' "
                    f"stroke-dasharray='5,3'/><text x='{frame.x1 - 2}' y='{y - 3:.1f}' text-anchor='end' "
                    f"fill='{COLOURS['limit']}' {_FONT}>limit {_esc(fmt_bytes(limit))}</text></g>")
    body += frame.x_labels([r.label for r in records])
    body += _legend([("peak", "cell peak"), ("live", "in use after")] + ([("limit", "limit")] if limit else []))
    return _svg(title, body, "memory-per-cell")


TIME_PARTS = (("compile", "compile_seconds", "compiling"), ("run", "run_seconds", "running ops"),
              ("transfer", "transfer_seconds", "host transfers"), ("other", "other_seconds", "other (Python)"))


def time_per_cell(records: Sequence[Any]) -> str:
    """Stacked bars per cell: compiling, running ops, host<->device transfers, the rest of the wall time."""
    title = "Where each cell's time went"
    if not records:
        return _empty(title, "time-per-cell", "no cells recorded yet")
    frame = _Frame(max(r.wall_seconds for r in records) * 1.08, len(records))
    body = frame.axes(fmt_seconds)
    width = frame.step * 0.7
    for i, r in enumerate(records):
        x = frame.x0 + i * frame.step + frame.step * 0.15
        parts, base = [], 0.0
        for key, attr, label in TIME_PARTS:
            seconds = getattr(r, attr)
            top = base + seconds
            parts.append(f"<rect class='{key}' data-seconds='{seconds:.6g}' x='{x:.1f}' y='{frame.y(top):.1f}' "
                         f"width='{width:.1f}' height='{frame.y(base) - frame.y(top):.1f}' fill='{COLOURS[key]}'>"
                         f"<title>{_esc(f'cell {r.label}: {label} {fmt_seconds(seconds)}')}</title></rect>")
            base = top
        body.append(f"<g class='cell' data-cell='{_esc(r.label)}' data-wall='{r.wall_seconds:.6g}'>"
                    + "".join(parts) + "</g>")
    body += frame.x_labels([r.label for r in records])
    body += _legend((key, label) for key, _, label in TIME_PARTS)
    return _svg(title, body, "time-per-cell")


# ---------------------------------------------------------------- the memory-history timeline
def timeline_data(snapshot: Mapping[str, Any], names: Mapping[int, str] | None = None, top: int = 8) -> dict:
    """From a ``torch.tpu.memory._snapshot()``: bytes in use after each recorded event, the peak, and the
    largest allocations live at the peak (size, allocating line, variable name if still named)."""
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live_now = {s["address"]: s for s in snapshot["segments"]}
    live: dict[int, dict] = {}  # what the trace shows alive before its first event: frees of earlier allocations
    level = sum(s["total_size"] for s in snapshot["segments"])
    for e in reversed(trace):
        level += e["size"] if e["action"] == "free_completed" else -e["size"]
    for e in trace:
        if e["action"] == "free_completed" and e["addr"] not in live:
            live[e["addr"]] = e
    series, peak_index, peak = [level], 0, level
    for i, e in enumerate(trace, 1):
        if e["action"] == "alloc":
            level += e["size"]
            live[e["addr"]] = e
        else:
            level -= e["size"]
            live.pop(e["addr"], None)
        series.append(level)
        if level > peak:
            peak, peak_index, at_peak = level, i, dict(live)
    if peak_index == 0:
        at_peak = dict(live)
    biggest = sorted(at_peak.values(), key=lambda e: -e["size"])[:top]
    rows = [{"addr": e["addr"], "size": e["size"], "line": allocating_line(e["frames"]),
             "name": (names or {}).get(e["addr"], "" if e["addr"] in live_now else "(freed)")} for e in biggest]
    return {"series": series, "peak": peak, "peak_index": peak_index, "largest": rows}


def allocating_line(frames: Sequence[Mapping[str, Any]]) -> str:
    """'file.py:12 in f' of the innermost frame outside torch, jax, IPython and this package."""
    from tpu_interactive.backend.errors import is_internal

    for f in frames:
        if not is_internal(f["filename"]):
            return f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} in {f['name']}"
    return ""


def memory_timeline(snapshot: Mapping[str, Any], names: Mapping[int, str] | None = None, top: int = 8) -> str:
    """Bytes in use over the recorded alloc/free events, the peak marked, and the largest allocations
    live at the peak labelled with their variable name and allocating line."""
    title = "TPU memory over the recorded history"
    data = timeline_data(snapshot, names, top)
    series = data["series"]
    if len(series) < 2:
        return _empty(title, "memory-timeline", "no alloc/free events recorded: "
                                                "torch.tpu.memory._record_memory_history() first")
    frame = _Frame(data["peak"] * 1.08, len(series) - 1)
    x_of = lambda i: frame.x0 + i * frame.step  # noqa: E731
    points = " ".join(f"{x_of(i):.1f},{frame.y(v):.1f}" for i, v in enumerate(series))
    px, py = x_of(data["peak_index"]), frame.y(data["peak"])
    body = frame.axes(fmt_bytes)
    body.append(f"<polyline class='in-use' fill='none' stroke='{COLOURS['line']}' stroke-width='1.5' "
                f"points='{points}' data-events='{len(series) - 1}'/>")
    peak = _esc(f"peak {fmt_bytes(data['peak'])} after event {data['peak_index']}")
    body.append(f"<g class='peak-marker' data-bytes='{data['peak']}' data-event='{data['peak_index']}'>"
                f"<title>{peak}</title><circle cx='{px:.1f}' cy='{py:.1f}' r='3' fill='{COLOURS['limit']}'/>"
                f"<text x='{px + 4:.1f}' y='{py - 4:.1f}' {_FONT}>{peak}</text></g>")
    body.append(f"<text x='{frame.x1}' y='{frame.y0 + 12}' text-anchor='end' {_FONT}>"
                f"{len(series) - 1} alloc/free events</text>")
    rows = data["largest"]
    body += _largest(rows)
    return _svg(title, body, "memory-timeline", HEIGHT + 20 + 13 * len(rows))


def _largest(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A table under the plot: the largest allocations live at the peak, with a bar of their size."""
    y0 = HEIGHT + 6
    heading = "largest allocations live at the peak (size, variable, allocating line)"
    out = [f"<text x='{_LEFT}' y='{y0}' {_FONT} font-weight='bold'>{heading}</text>"]
    biggest = max((r["size"] for r in rows), default=1) or 1
    for i, r in enumerate(rows):
        y = y0 + 13 * (i + 1)
        tip = f"{fmt_bytes(r['size'])} {r['name']} allocated at {r['line'] or 'an unknown line'}"
        out.append(f"<g class='allocation' data-bytes='{r['size']}' data-name='{_esc(r['name'])}' "
                   f"data-line='{_esc(r['line'])}'><title>{_esc(tip)}</title>"
                   f"<rect x='{_LEFT - 62}' y='{y - 8}' width='{56 * r['size'] / biggest:.1f}' height='9' "
                   f"fill='{COLOURS['line']}'/><text x='{_LEFT}' y='{y}' {_FONT}>{_esc(fmt_bytes(r['size'])):>10} "
                   f"{_esc(r['name'] or '-')}  {_esc(r['line'])}</text></g>")
    return out
