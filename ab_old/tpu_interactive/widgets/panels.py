"""ipywidgets dashboards over the backend's public stats API (built-in widgets only, so Colab and
JupyterLab need no custom widget manager).

Panels refresh when ``refresh(ns)`` is called: from the extension's post_run_cell hook and from the
Refresh button; never from a thread or a loop. Each panel also has a plain-text ``text(ns)`` (the
same text the %tpu line magic prints), used as the text/plain fallback of the displayed dashboard.
"""
from __future__ import annotations

import html
import time
from typing import Any, Mapping, Sequence

import ipywidgets as W

from tpu_interactive import backend
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.session import namespace, pictures, summary
from tpu_interactive.session.fmt import fmt_bytes, fmt_seconds, fmt_shape, short_op
from tpu_interactive.session.tracker import TRACKER

WARN_AT, DANGER_AT = 0.75, 0.90  # fraction of the memory limit
_CELL = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
_MIXED = "background:#fde2e2"


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], styles: Sequence[str] | None = None,
               empty: str = "none") -> str:
    if not rows:
        return f"<i>{html.escape(empty)}</i>"
    head = "".join(f"<th style='{_CELL}'>{html.escape(str(h))}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        style = styles[i] if styles else ""
        cells = "".join(f"<td style='{_CELL}'>{html.escape(str(c))}</td>" for c in row)
        body.append(f"<tr style='{style}'>{cells}</tr>")
    return (f"<table style='border-collapse:collapse;font-size:12px;font-family:monospace'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _title(text: str) -> W.HTML:
    return W.HTML(f"<b style='font-size:13px'>{html.escape(text)}</b>")


def memory_level(used: int, limit: int | None) -> str:
    """'' / 'warning' / 'danger': the IntProgress bar style for this fill level."""
    if not limit:
        return "info"
    ratio = used / limit
    return "danger" if ratio >= DANGER_AT else ("warning" if ratio >= WARN_AT else "success")


class MemoryPanel(W.VBox):
    """Bytes in use / peak / limit as a bar, the last cell's delta and peak, the largest live tensors."""

    def __init__(self, top: int = 8):
        self.top = top
        self.bar = W.IntProgress(min=0, max=1, value=0, layout=W.Layout(width="100%"))
        self.numbers = W.HTML()
        self.last_cell = W.HTML()
        self.tensors = W.HTML()
        super().__init__([_title("TPU memory"), self.bar, self.numbers, self.last_cell, self.tensors],
                         layout=W.Layout(width="50%", padding="4px"))

    def refresh(self, ns: Mapping[str, Any]) -> None:
        mem = backend.memory_stats()
        used, limit = mem["bytes_in_use"], mem["bytes_limit"]
        peak = summary.session_peak(mem)
        self.bar.max = max(limit or peak, used, 1)
        self.bar.value = used
        self.bar.bar_style = memory_level(used, limit)
        share = f" ({100 * used / limit:.0f}%)" if limit else ""
        colour = {"danger": "#c62828", "warning": "#ef6c00"}.get(self.bar.bar_style, "inherit")
        self.numbers.value = (f"<span style='color:{colour}'><b>bytes in use</b> {fmt_bytes(used)}{share}</span>"
                              f" &middot; <b>peak</b> {fmt_bytes(peak)} &middot; <b>limit</b> "
                              f"{fmt_bytes(limit) if limit else 'not reported'} &middot; {mem['tracked_buffers']} "
                              f"buffers <small>({html.escape(mem['source'])})</small>")
        last = TRACKER.last
        self.last_cell.value = ("<b>last cell</b> " + (f"{fmt_bytes(last.memory_delta, signed=True)}, peak "
                                                        f"{fmt_bytes(last.peak)}" if last else "-"))
        live = namespace.live_tensors(ns)
        rows = [(", ".join(t.names), fmt_shape(t.shape), t.dtype, fmt_bytes(t.nbytes)) for t in live[: self.top]]
        more = f"<br><small>... {len(live) - self.top} more</small>" if len(live) > self.top else ""
        self.tensors.value = ("<b>largest live tensors</b><br>" + html_table(("variable", "shape", "dtype", "bytes"),
                                                                          rows, empty="no tpu tensors") + more)

    def text(self, ns: Mapping[str, Any]) -> str:
        return summary.memory_text(ns)


class CompilePanel(W.VBox):
    """Compile cache: hits, misses, hit rate, compile time, recent compiles with cause; clear button."""

    def __init__(self, top: int = 8):
        self.top = top
        self.numbers = W.HTML()
        self.recent = W.HTML()
        self.clear_button = W.Button(description="Clear cache", icon="trash", tooltip="clear the compile cache")
        self.message = W.HTML()
        self.clear_button.on_click(self._clear)
        super().__init__([_title("Compile cache"), self.numbers, self.recent,
                          W.HBox([self.clear_button, self.message])], layout=W.Layout(width="50%", padding="4px"))

    def _clear(self, _button=None) -> None:
        self.message.value = html.escape(summary.clear_compile_cache())
        self.refresh({})

    def refresh(self, ns: Mapping[str, Any]) -> None:
        s = backend_stats.snapshot()
        hits, misses = s["compile_hits"], s["compile_misses"]
        rate = f"{100 * hits / (hits + misses):.0f}%" if hits + misses else "-"
        self.numbers.value = (f"<b>XLA programs</b> {s['xla_compiles']} ({fmt_seconds(s['xla_compile_seconds'])}, "
                              f"{s['xla_disk_hits']} from disk) &middot; <b>torch.compile graphs</b> "
                              f"hits {hits} &middot; misses {misses} &middot; <b>hit rate</b> {rate}"
                              f" &middot; <b>graph compile time</b> {fmt_seconds(s['compile_seconds'])}"
                              + (f"<br><b>fused eager segments</b> {s['fused_cached']} cached &middot; "
                                 f"{s['fused_compiled']} compiled &middot; {s['fused_op_by_op']} op by op"
                                 f" &middot; {s['fused_in_pieces']} in pieces"
                                 f" &middot; {s['fused_not_recorded']} not recorded"
                                 if s["fused_segments"] else ""))
        now = time.time()
        events = list(reversed(s["recent_compiles"]))[: self.top]
        rows = [(e["name"], "hit" if e["hit"] else "miss", e["cause"], fmt_seconds(e["seconds"]),
                 f"{now - e['when']:.0f} s ago") for e in events]
        xla = list(reversed(s["recent_xla_compiles"]))[: self.top]
        xla_rows = [(short_op(e["op"]), e["shapes"], "disk" if e["from_disk"] else "compiled",
                     fmt_seconds(e["seconds"]), e["where"]) for e in xla]
        fused = [(e["ops"], e["mode"], e["cause"], e["reason"], fmt_seconds(e["seconds"]), e["where"])
                 for e in list(reversed(s["recent_fused"]))[: self.top]]
        self.recent.value = ("<b>recent compiles</b><br>" + html_table(("graph", "", "cause", "time", "when"), rows)
                             + ("<b>recent fused segments</b><br>"
                                + html_table(("ops", "", "cause", "flushed by", "time", "first op at"), fused)
                                if fused else "")
                             + "<b>recent XLA programs</b><br>"
                             + html_table(("op or graph", "inputs", "", "time", "at"), xla_rows))

    def text(self, ns: Mapping[str, Any]) -> str:
        return summary.cache_text()


class PlacementPanel(W.VBox):
    """Where the namespace's tensors and modules live; modules with mixed placement highlighted."""

    def __init__(self):
        self.table = W.HTML()
        self.note = W.HTML()
        super().__init__([_title("Tensor placement"), self.table, self.note], layout=W.Layout(padding="4px"))

    def refresh(self, ns: Mapping[str, Any]) -> None:
        items = namespace.placements(ns)
        rows = [(p.name, p.device, p.shape, p.dtype, fmt_bytes(p.nbytes), "yes" if p.requires_grad else "no")
                for p in items]
        styles = [_MIXED if p.mixed else "" for p in items]
        self.table.value = html_table(("variable", "device", "shape", "dtype", "bytes", "requires_grad"), rows,
                                      styles, empty="no tensors or nn.Modules in the namespace")
        mixed = [p.name for p in items if p.mixed]
        self.note.value = (f"<span style='color:#c62828'>mixed placement: {html.escape(', '.join(mixed))} "
                           "(parameters on several devices)</span>" if mixed else "")

    def text(self, ns: Mapping[str, Any]) -> str:
        return summary.placement_text(ns)


class SwitchPanel(W.VBox):
    """Toggles bound to the backend switches; refresh() shows changes made elsewhere (%tpu sync on)."""

    SWITCHES = (("sync", "sync mode", backend.sync_mode),
                ("nan_check", "NaN check", backend.nan_check),
                ("pallas", "Pallas kernels", backend.pallas),
                ("fuse", "fused eager", backend.fusion.switch))

    def __init__(self):
        self.toggles: dict[str, W.ToggleButton] = {}
        for field, label, switch in self.SWITCHES:
            toggle = W.ToggleButton(description=label, value=bool(switch()), layout=W.Layout(width="auto"),
                                    tooltip=f"tpu_interactive.{field}: click to toggle")
            toggle.observe(self._setter(switch), names="value")
            self.toggles[field] = toggle
        self.state = W.HTML()
        super().__init__([W.HBox(list(self.toggles.values())), self.state])
        self.refresh({})

    def _setter(self, switch):
        def on_change(change):
            switch(bool(change["new"]))
            self._show_state()

        return on_change

    def _show_state(self) -> None:
        cfg = backend.config
        for field, toggle in self.toggles.items():
            toggle.icon = "check" if toggle.value else ""
        self.state.value = ("<small>" + ", ".join(f"{label}: <b>{'on' if getattr(cfg, field) else 'off'}</b>"
                                                 for field, label, _ in self.SWITCHES) + "</small>")

    def refresh(self, ns: Mapping[str, Any]) -> None:
        cfg = backend.config
        for field, toggle in self.toggles.items():
            if toggle.value != getattr(cfg, field):
                toggle.value = getattr(cfg, field)
        self._show_state()

    def text(self, ns: Mapping[str, Any]) -> str:
        cfg = backend.config
        return ", ".join(f"{label} {'on' if getattr(cfg, field) else 'off'}" for field, label, _ in self.SWITCHES)


class PlotsPanel(W.VBox):
    """Pictures over the session's cells: memory in use / peak with the limit line, and each cell's time
    split into compiling, running, transfers and the rest. Plain SVG in ipywidgets.HTML, so a saved
    notebook keeps them as a static picture."""

    def __init__(self):
        self.memory = W.HTML()
        self.time = W.HTML()
        super().__init__([_title("Per cell"), self.memory, self.time], layout=W.Layout(padding="4px"))

    def refresh(self, ns: Mapping[str, Any]) -> None:
        memory_svg, time_svg = pictures.cells_svgs()
        wrap = "<div style='max-width:100%;overflow-x:auto'>{}</div>"
        self.memory.value, self.time.value = wrap.format(memory_svg), wrap.format(time_svg)

    def text(self, ns: Mapping[str, Any]) -> str:
        return pictures.cells_text()


class Dashboard(W.VBox):
    """Memory, compile cache, placement and switches together, with a Refresh button."""

    def __init__(self, ns: Mapping[str, Any] | None = None):
        self.ns = ns if ns is not None else {}
        info = backend.backend_info()
        warnings = "".join(f"<div style='color:#c62828'><b>warning:</b> {html.escape(w)}</div>" for w in info.warnings)
        self.header = W.HTML(f"<b>tpu_interactive</b> &middot; {html.escape(info.summary)}{warnings}")
        self.switches = SwitchPanel()
        self.memory = MemoryPanel()
        self.compile = CompilePanel()
        self.placement = PlacementPanel()
        self.plots = PlotsPanel()
        self.refresh_button = W.Button(description="Refresh", icon="refresh", tooltip="refresh now",
                                       layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.updated = W.HTML()
        self._handle = None
        super().__init__([self.header, W.HBox([W.VBox([self.refresh_button, self.updated]), self.switches]),
                          W.HBox([self.memory, self.compile]), self.plots, self.placement],
                         layout=W.Layout(border="1px solid #ccc", padding="6px"))
        self.refresh()

    @property
    def panels(self):
        return (self.switches, self.memory, self.compile, self.plots, self.placement)

    def refresh(self, ns: Mapping[str, Any] | None = None) -> None:
        if ns is not None:
            self.ns = ns
        for panel in self.panels:
            panel.refresh(self.ns)
        self.updated.value = f"<small>updated {time.strftime('%H:%M:%S')}</small>"
        if self._handle is not None:
            self._handle.update(self)  # keeps the saved notebook's text/plain fallback current

    def close(self) -> None:
        TRACKER.remove_refresher(self)  # a closed dashboard stops refreshing after each cell
        super().close()

    def text(self) -> str:
        return "\n".join([summary.status_text(), "", self.memory.text(self.ns), "", self.compile.text(self.ns), "",
                          "per cell:", self.plots.text(self.ns), "", self.placement.text(self.ns)])

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return {"text/plain": self.text()}
        bundle["text/plain"] = self.text()
        return bundle
