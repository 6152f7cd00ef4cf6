"""The dashboard widgets, checked through their models (values and children)."""
import threading

import ipywidgets as W
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import tpu_interactive
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.widgets import panels
from tpu_interactive.widgets.panels import CompilePanel, Dashboard, MemoryPanel, PlacementPanel, SwitchPanel


def test_memory_panel_numbers_bar_and_largest_tensors():
    big = torch.zeros(128, 64, device="tpu")
    ns = {"view": big[3:], "big": big, "small": torch.ones(7, dtype=torch.int64, device="tpu"),
          "host": torch.ones(1000), "_hidden": torch.ones(5000, device="tpu")}
    panel = MemoryPanel()
    panel.refresh(ns)
    mem = tpu_interactive.memory_stats()
    assert panel.bar.value == mem["bytes_in_use"] and panel.bar.max >= panel.bar.value
    assert "bytes in use" in panel.numbers.value and "peak" in panel.numbers.value
    table = panel.tensors.value
    assert table.index("view, big") < table.index("small")  # largest first, views grouped with their base
    assert "(128, 64)" in table and "32.00 KiB" in table and "int64" in table and "56 B" in table
    assert "host" not in table and "_hidden" not in table  # cpu tensors and private names are not listed


@pytest.mark.parametrize("fraction, style", [(0.5, "success"), (0.8, "warning"), (0.95, "danger")])
def test_memory_bar_warns_near_the_limit(fraction, style):
    keep = torch.zeros(4096, device="tpu")  # noqa: F841 - something in use
    used = tpu_interactive.memory_stats()["bytes_in_use"]
    tpu_interactive.config.memory_limit_bytes = int(used / fraction)
    panel = MemoryPanel()
    panel.refresh({})
    assert panel.bar.bar_style == style
    assert panel.bar.max == tpu_interactive.config.memory_limit_bytes
    assert f"{round(100 * fraction)}%" in panel.numbers.value
    if style == "danger":
        assert "#c62828" in panel.numbers.value


def test_memory_level_without_limit():
    assert panels.memory_level(10, None) == "info"


def test_compile_panel_counts_rate_and_recent_causes(monkeypatch):
    tpu_interactive.reset_stats()
    backend_stats.record_compile("mlp_fwd", "first call", 0.5, False)
    backend_stats.record_compile("mlp_fwd", "input 0 shape (8, 4) -> (16, 4)", 0.25, False)
    for _ in range(2):
        backend_stats.record_compile("mlp_fwd", "cache hit", 0.0, True)
    panel = CompilePanel()
    panel.refresh({})
    text = panel.numbers.value
    assert "hits 2" in text and "misses 2" in text and "50%" in text and "750.0 ms" in text
    recent = panel.recent.value
    assert "input 0 shape (8, 4) -&gt; (16, 4)" in recent and "first call" in recent
    assert recent.index("cache hit") < recent.index("first call")  # newest first

    import tpu_interactive.backend.compiler as compile_mod

    calls = []
    monkeypatch.setattr(compile_mod, "clear_cache", lambda: calls.append(1))
    panel.clear_button.click()
    assert calls == [1] and "cleared" in panel.message.value


def test_placement_panel_highlights_mixed_modules():
    mixed = torch.nn.Linear(4, 3).to("tpu")
    mixed.bias.data = mixed.bias.data.cpu()
    ns = {"mixed": mixed, "model": torch.nn.Linear(2, 2).to("tpu"), "w": torch.ones(2, 3, requires_grad=True),
          "frozen": torch.zeros(5, device="tpu", dtype=torch.bfloat16), "not_a_tensor": 3}
    panel = PlacementPanel()
    panel.refresh(ns)
    rows = panel.table.value.split("<tr")[2:]  # [0] is before <thead>, [1] the header row
    names = [r.split("<td")[1] for r in rows]
    assert [n[n.index(">") + 1: n.index("<")] for n in names] == ["frozen", "mixed", "model", "w"]
    mixed_row = next(r for r in rows if ">mixed<" in r)
    assert panels._MIXED in mixed_row and "cpu, tpu:0" in mixed_row and "Linear: 15 params" in mixed_row
    model_row = next(r for r in rows if ">model<" in r)
    assert panels._MIXED not in model_row and ">tpu:0<" in model_row
    w_row = next(r for r in rows if ">w<" in r)
    assert ">cpu<" in w_row and ">yes<" in w_row and "(2, 3)" in w_row
    assert "bfloat16" in next(r for r in rows if ">frozen<" in r)
    assert "mixed placement: mixed" in panel.note.value


def test_switches_are_bound_both_ways():
    panel = SwitchPanel()
    cfg = tpu_interactive.config
    panel.toggles["sync"].value = True
    assert cfg.sync is True and "sync mode: <b>on</b>" in panel.state.value
    panel.toggles["pallas"].value = True
    assert cfg.pallas is True
    panel.toggles["pallas"].value = False
    assert cfg.pallas is False
    tpu_interactive.sync_mode(False)  # changed elsewhere (e.g. %tpu sync off) ...
    panel.refresh({})  # ... shows up on the next refresh
    assert panel.toggles["sync"].value is False and "sync mode: <b>off</b>" in panel.state.value


def test_dashboard_composition_refresh_button_and_text_fallback():
    ns = {}
    threads = set(threading.enumerate())
    board = Dashboard(ns)
    assert set(threading.enumerate()) == threads  # no background refresh thread
    kinds = {type(w) for w in _walk(board)}
    assert {MemoryPanel, CompilePanel, PlacementPanel, SwitchPanel, W.Button, W.IntProgress} <= kinds
    assert all(type(w).__module__.startswith("ipywidgets") or type(w).__module__.startswith("tpu_interactive")
               for w in _walk(board))
    assert tpu_interactive.backend_info().summary in board.header.value
    assert "no tpu tensors" in board.memory.tensors.value
    ns["fresh"] = torch.zeros(10, 10, device="tpu")
    board.refresh_button.click()
    assert "fresh" in board.memory.tensors.value and "fresh" in board.placement.table.value
    bundle = board._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    assert "bytes in use" in text and "fresh" in text and "compile cache" in text and "sync off" in text


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def test_dashboard_refreshes_after_each_cell():
    ip = InteractiveShell.instance()
    ip.run_cell("import torch, tpu_interactive\nboard = tpu_interactive.dashboard(display=False)")
    board = ip.user_ns["board"]
    assert "after_cell" not in board.memory.tensors.value
    ip.run_cell("after_cell = torch.ones(300, device='tpu')")
    assert "after_cell" in board.memory.tensors.value and "after_cell" in board.placement.table.value
    assert "+1.17 KiB" in board.memory.last_cell.value
    ip.run_cell("%tpu sync on" if "tpu" in ip.magics_manager.magics["line"] else "tpu_interactive.sync_mode(True)")
    assert board.switches.toggles["sync"].value is True
    ip.run_cell("tpu_interactive.sync_mode(False)")
    board.close()
    ip.run_cell("del after_cell\nafter_close = torch.ones(3, device='tpu')")
    assert "after_close" not in board.memory.tensors.value  # closed: no longer refreshed
    ip.run_cell("del board, after_close")
