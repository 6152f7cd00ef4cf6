"""Memory history in PyTorch's snapshot format, profiling a cell, and the offline SVG plots."""
import base64
import gc
import inspect
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

import tpu_interactive
from tpu_interactive.backend import memory_history

memory = torch.tpu.memory
BASE = memory_history.base_address()


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


def _addr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() - BASE


@pytest.fixture
def recording():
    memory._record_memory_history("all", max_entries=10_000, clear_history=True)
    yield
    memory._record_memory_history(None)


def _events(snap, addrs):
    """(action, size, first user frame line) of the events on ``addrs``, in order."""
    out = []
    for e in snap["device_traces"][0]:
        if e["addr"] in addrs and e["action"] in ("alloc", "free_completed"):
            mine = [f["line"] for f in e["frames"] if f["filename"] == __file__]
            out.append((e["action"], addrs[e["addr"]], e["size"], mine[0] if mine else None))
    return out


def test_trace_matches_a_scripted_sequence(recording):
    x = torch.empty(1000, device="tpu"); line_x = _line()  # noqa: E702
    y = torch.empty(64, 32, dtype=torch.float64, device="tpu"); line_y = _line()  # noqa: E702
    names = {_addr(x): "x", _addr(y): "y"}
    del x; line_del = _line()  # noqa: E702
    z = y[:8].clone(); line_z = _line()  # noqa: E702
    names[_addr(z)] = "z"
    snap = memory._snapshot()
    assert _events(snap, names) == [("alloc", "x", 4000, line_x), ("alloc", "y", 16384, line_y),
                                    ("free_completed", "x", 4000, line_del), ("alloc", "z", 2048, line_z)]
    # every action of one lifetime, in CUDA's order
    x_actions = [e["action"] for e in snap["device_traces"][0] if names.get(e["addr"]) == "x"]
    assert x_actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]
    # live blocks: y and z with their allocating lines, x gone; one segment per live buffer
    blocks = {names.get(s["address"]): s["blocks"][0] for s in snap["segments"]}
    assert "x" not in blocks and blocks["y"]["size"] == 16384 and blocks["z"]["requested_size"] == 2048
    assert [f["line"] for f in blocks["y"]["frames"] if f["filename"] == __file__][0] == line_y
    assert blocks["y"]["state"] == "active_allocated"
    gc.collect()
    snap = memory._snapshot()
    assert sum(s["total_size"] for s in snap["segments"]) == tpu_interactive.memory_stats()["tracked_bytes_in_use"]
    del y, z


def test_pytorch_memory_viz_reads_the_snapshot(recording, tmp_path):
    a = torch.ones(3000, device="tpu")
    b = torch.ones(5 * 1024 * 1024 // 4 + 7, device="tpu")  # over 1 MiB: a "large" segment
    del a
    path = tmp_path / "snap.pickle"
    memory._dump_snapshot(str(path))
    data = pickle.loads(path.read_bytes())
    text = _memory_viz.trace(data)
    assert "11.7KiB" in text and "del " in text  # the 12000-byte alloc and its free
    stats = _memory_viz.segsum(data)
    assert f"total_allocated: {_memory_viz.Bytes(sum(s['total_size'] for s in data['segments']))}" in stats
    stacks = _memory_viz.segments(data, format_flamegraph=lambda lines: lines)  # flamegraph.pl input
    assert "test_memory_profiling.py" in stacks and " 12000" not in stacks  # a freed no more
    out = tmp_path / "trace.html"  # PyTorch's command line, as a user runs it
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    for html in (out.read_text(), _memory_viz.segment_plot(data)):
        embedded = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))[0]["base64"]
        shown = pickle.loads(base64.b64decode(embedded))
        sizes = {e["size"] for e in shown["device_traces"][0]}
        assert {12000, b.untyped_storage().nbytes()} <= sizes
    del b


def test_snapshot_pickle_uses_only_what_the_javascript_viewer_reads(recording, tmp_path):
    """pytorch.org/memory_viz unpickles in JavaScript: protocol 2-4, a fixed opcode set, and integers
    that a double holds exactly."""
    keep = [torch.ones(n, device="tpu") for n in (10, 2000, 70000)]
    path = tmp_path / "s.pickle"
    memory._dump_snapshot(str(path))
    supported = {"APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
                 "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2",
                 "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE",
                 "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}
    used = set()
    for op, arg, _ in pickletools.genops(path.read_bytes()):
        used.add(op.name)
        if op.name == "PROTO":
            assert 2 <= arg <= 4
        if op.name in ("LONG1", "BININT", "BININT1", "BININT2"):  # integer values (not memo indexes)
            assert abs(arg) < 2 ** 53
    assert used <= supported, used - supported
    # the fields the viewer's three views read (annotate_snapshot, process_alloc_data, MemoryView),
    # with the types its comparisons need (device numbers compared with ===, sizes summed)
    snap = pickle.loads(path.read_bytes())
    frame_keys = {"filename", "line", "name"}
    assert isinstance(snap["device_traces"], list) and snap["segments"]
    for seg in snap["segments"]:
        assert type(seg["device"]) is int and type(seg["address"]) is int and type(seg["total_size"]) is int
        assert "stream" in seg and seg["blocks"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for block in seg["blocks"]:
            assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert block["requested_size"] <= block["size"] and all(set(f) >= frame_keys for f in block["frames"])
    actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"}
    for event in snap["device_traces"][0]:
        assert event["action"] in actions and type(event["addr"]) is int and type(event["size"]) is int
        assert "stream" in event and all(set(f) >= frame_keys for f in event["frames"])
    del keep


def test_max_entries_bounds_the_trace(recording):
    memory._record_memory_history("all", max_entries=7, clear_history=True)
    for _ in range(20):
        t = torch.ones(16, device="tpu")
    last = _addr(t)
    trace = memory._snapshot()["device_traces"][0]
    assert len(trace) == 7
    # the newest events are kept: the last alloc, then the free of the tensor it replaced
    assert [e["action"] for e in trace[-4:]] == ["alloc", "free_requested", "free_completed", "segment_free"]
    assert trace[-4]["addr"] == last
    assert len(memory_history._recorder.trace) == 7


def test_state_mode_and_context_none_and_stop(recording):
    memory._record_memory_history("state", clear_history=True)
    t = torch.ones(8, device="tpu"); line = _line()  # noqa: E702
    snap = memory._snapshot()
    assert snap["device_traces"] == [[]]
    block = next(s for s in snap["segments"] if s["address"] == _addr(t))["blocks"][0]
    assert [f["line"] for f in block["frames"] if f["filename"] == __file__] == [line]
    memory._record_memory_history("all", context=None, clear_history=True)
    u = torch.ones(8, device="tpu")
    events = [e for e in memory._snapshot()["device_traces"][0] if e["addr"] == _addr(u)]
    assert [e["action"] for e in events] == ["segment_alloc", "alloc"] and all(e["frames"] == [] for e in events)
    memory._record_memory_history(None)
    assert not memory_history.is_recording()
    v = torch.ones(8, device="tpu")
    trace = memory._snapshot()["device_traces"][0]
    assert any(e["addr"] == _addr(u) for e in trace)  # kept after stopping
    assert not any(e["addr"] == _addr(v) for e in trace)  # nothing recorded after stopping
    del t, u, v


def test_python_stacks_leave_out_the_backend(recording):
    memory._record_memory_history("all", stacks="python", clear_history=True)
    t = torch.ones(8, device="tpu")
    frames = next(e for e in memory._snapshot()["device_traces"][0] if e["addr"] == _addr(t))["frames"]
    assert frames[0]["filename"] == __file__
    memory._record_memory_history("all", stacks="all", clear_history=True)
    u = torch.ones(8, device="tpu")
    frames = next(e for e in memory._snapshot()["device_traces"][0] if e["addr"] == _addr(u))["frames"]
    assert frames[0]["filename"].endswith(os.path.join("backend", "storage.py"))
    del t, u


def test_oom_is_recorded(recording):
    keep = torch.ones(1024, device="tpu")
    used = tpu_interactive.memory_stats()["tracked_bytes_in_use"]  # what the limit counts
    tpu_interactive.config.memory_limit_bytes = used + 100
    with pytest.raises(torch.OutOfMemoryError):
        torch.ones(1000, device="tpu")
    oom = [e for e in memory._snapshot()["device_traces"][0] if e["action"] == "oom"]
    assert oom[-1]["size"] == 4000 and oom[-1]["device_free"] == 100
    assert "raise OutOfMemoryError # 3.9KiB requested, 100.0B free" in _memory_viz.trace(memory._snapshot())
    del keep


def test_unwritable_path_names_it_and_keeps_recording(recording, tmp_path):
    t = torch.ones(8, device="tpu")
    bad = str(tmp_path / "missing-dir" / "snap.pickle")
    with pytest.raises(FileNotFoundError, match=re.escape(bad)):
        memory._dump_snapshot(bad)
    assert memory_history.is_recording()
    u = torch.ones(8, device="tpu")
    addrs = {e["addr"] for e in memory._snapshot()["device_traces"][0]}
    assert {_addr(t), _addr(u)} <= addrs
    del t, u


def test_bad_arguments_raise_like_torch():
    with pytest.raises(ValueError, match="expected enabled"):
        memory._record_memory_history("everything")
    with pytest.raises(ValueError, match="skip_actions"):
        memory._record_memory_history("all", skip_actions=["allocate"])
    with pytest.raises(ValueError, match="Expected a tpu device"):
        memory._snapshot(device="cpu")
    assert not memory_history.is_recording()


def test_skip_actions(recording):
    memory._record_memory_history("all", skip_actions=["segment_alloc", "segment_free", "free_requested"],
                                  clear_history=True)
    t = torch.ones(8, device="tpu")
    addr = _addr(t)
    del t
    actions = [e["action"] for e in memory._snapshot()["device_traces"][0] if e["addr"] == addr]
    assert actions == ["alloc", "free_completed"]


# ---------------------------------------------------------------- profiling a block or a cell
def _aten_events(path):
    from tpu_interactive.session.profiling import trace_events

    return [e for e in trace_events(path) if e.get("name", "").startswith("aten::")]


def test_profile_writes_a_chrome_trace_and_counts_equal_stats(tmp_path, capsys):
    x = torch.randn(32, 16)
    before = tpu_interactive.stats()
    with tpu_interactive.profile(tmp_path / "p", jax_trace=False) as prof:
        a = x.to("tpu")
        b = torch.relu(a @ a.T)
        total = b.sum().item()
    after = tpu_interactive.stats()
    assert total == pytest.approx(torch.relu(x @ x.T).sum().item(), rel=1e-5)
    diff = tpu_interactive.stats_diff(before, after)
    d = prof.delta.diff
    for key in ("op_counts", "h2d_count", "h2d_bytes", "d2h_count", "d2h_bytes", "xla_compiles"):
        assert d[key] == diff[key], key
    assert d["h2d_bytes"] == 32 * 16 * 4 and d["d2h_count"] == 1
    events = _aten_events(prof.trace_path)
    names = {e["name"] for e in events}
    assert {"aten::mm", "aten::relu", "aten::sum"} <= names
    mm = next(e for e in events if e["name"] == "aten::mm")
    assert mm["args"]["Input Dims"] == [[32, 16], [16, 32]]  # shapes recorded
    out = capsys.readouterr().out
    table = out.split("top ops by device time")[1]
    assert re.search(rf"\bmm +{d['op_counts']['aten::mm.default']} ", table)
    assert f"host->device {d['h2d_count']} (2.00 KiB)" in out and f"device->host {d['d2h_count']}" in out
    assert f"peak {tpu_interactive.session.fmt.fmt_bytes(prof.delta.peak)}" in out
    assert prof.trace_path in out and not tpu_interactive.config.sync  # sync restored


def test_profile_of_a_block_that_raises_writes_and_reraises(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="size of tensor a"):
        with tpu_interactive.profile(tmp_path, jax_trace=False) as prof:
            a = torch.ones(3, device="tpu")
            torch.ones(4, device="tpu") + a
    assert "aten::add" in {e["name"] for e in _aten_events(prof.trace_path)}
    assert "raised RuntimeError" in capsys.readouterr().out


def test_profile_unwritable_directory_names_it_and_runs_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    ran = []
    with pytest.raises(OSError, match=re.escape(str(blocker / "sub"))):
        with tpu_interactive.profile(blocker / "sub", jax_trace=False):
            ran.append(1)
    assert ran == [] and not tpu_interactive.config.sync


@pytest.mark.slow
def test_profile_writes_a_jax_trace_directory(tmp_path):
    with tpu_interactive.profile(tmp_path, show=False) as prof:
        torch.ones(8, device="tpu").add_(1)
    files = [f for _, _, fs in os.walk(prof.jax_trace_dir) for f in fs]
    assert any(f.endswith(".xplane.pb") for f in files)


@pytest.fixture(scope="module")
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()  # shared with other test modules: leave no variables behind
    before = set(shell.user_ns)
    shell.run_cell("%load_ext tpu_interactive")
    shell.run_cell("import torch, tpu_interactive")
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    gc.collect()


def _run(ip, capsys, code):
    capsys.readouterr()
    result = ip.run_cell(code)
    return result, capsys.readouterr().out


def test_cell_profile_trace(ip, capsys, tmp_path, monkeypatch):
    import tpu_interactive.session.profiling as profiling

    jax_trace = profiling._jax_trace  # the jax trace has its own (slow) test
    monkeypatch.setattr(profiling, "_jax_trace", lambda prof, enabled: jax_trace(prof, False))
    result, out = _run(ip, capsys, f"%%tpu --profile-trace {tmp_path}\nq = torch.ones(8, 8)\nr = (q @ q).relu()")
    assert result.success
    path = str(tmp_path / "torch_trace.json")
    assert f"trace      {path}" in out and "per-op device time" in out and "sync on" in out
    assert {"aten::mm", "aten::relu"} <= {e["name"] for e in _aten_events(path)}
    bad = tmp_path / "torch_trace.json" / "x"
    result, out = _run(ip, capsys, f"%%tpu --profile-trace {bad}\nnever = 1")
    assert isinstance(result.error_in_exec, OSError) and str(bad) in str(result.error_in_exec)
    assert "never" not in ip.user_ns
    result, out = _run(ip, capsys, f"%%tpu --profile-trace {tmp_path}\nkept = 5\nraise ValueError('mine')")
    assert isinstance(result.error_in_exec, ValueError) and ip.user_ns["kept"] == 5
    assert "error      ValueError" in out and os.path.exists(path)


# ---------------------------------------------------------------- pictures
def _svg(text):
    import xml.etree.ElementTree as ET

    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def _find(root, tag, cls):
    return [e for e in root.iter("{http://www.w3.org/2000/svg}" + tag) if e.get("class") == cls]


def test_per_cell_history_and_its_plots_carry_the_numbers(ip, capsys):
    from tpu_interactive.session.tracker import TRACKER

    ip.run_cell("%tpu reset")
    tpu_interactive.config.memory_limit_bytes = 1 << 20
    ip.run_cell("p1 = torch.ones(1000, device='tpu')")  # +4000 bytes
    ip.run_cell("p2 = torch.ones(2000, device='tpu') * 2\np1 = None")  # peak holds p1, p2 and the ones
    ip.run_cell("p3 = torch.ones(64, device='tpu').cpu()")
    records = list(TRACKER.history)[-3:]
    assert [r.live_after - records[0].live_after for r in records] == [0, 8000 - 4000, 8000 - 4000]
    assert records[1].peak >= records[1].live_after + 4000 + 8000  # p1 still alive with both 8000-byte buffers
    assert records[2].transfer_seconds > 0 and all(r.limit == 1 << 20 for r in records)
    memory_svg, time_svg = tpu_interactive.session.pictures.cells_svgs()
    cells = _find(_svg(memory_svg), "g", "cell")[-3:]
    assert [int(c.get("data-peak")) for c in cells] == [r.peak for r in records]
    assert [int(c.get("data-live")) for c in cells] == [r.live_after for r in records]
    assert [c.get("data-cell") for c in cells] == [r.label for r in records]
    limit = _find(_svg(memory_svg), "g", "limit")
    assert len(limit) == 1 and int(limit[0].get("data-bytes")) == 1 << 20
    # bar heights are proportional to the numbers
    rects = [c.find("{http://www.w3.org/2000/svg}rect") for c in cells]
    heights = [float(r.get("height")) for r in rects]
    per_byte = heights[1] / records[1].peak
    assert heights == pytest.approx([per_byte * r.peak for r in records], abs=0.1)  # 0.1 px: rounding
    bars = _find(_svg(time_svg), "g", "cell")[-3:]
    for bar, r in zip(bars, records):
        parts = {e.get("class"): float(e.get("data-seconds")) for e in bar}
        assert parts["compile"] == pytest.approx(r.compile_seconds, rel=1e-4, abs=1e-9)
        assert parts["transfer"] == pytest.approx(r.transfer_seconds, rel=1e-4, abs=1e-9)
        assert sum(parts.values()) == pytest.approx(r.wall_seconds, rel=1e-3)
    _, out = _run(ip, capsys, "%tpu cells")
    assert records[-1].label in out and "compiling" in out


def test_time_parts_of_a_cell_never_exceed_its_wall_time():
    """Background compiles run side by side: 0.42 s of compiles in a 0.31 s cell (seen in CI) is drawn
    as a cell that compiled all along, not as a bar taller than the cell."""
    from tpu_interactive.session.tracker import CellDelta, CellRecord

    diff = {"xla_compile_seconds": 0.42, "h2d_seconds": 0.05, "op_seconds": {"aten::mm": 0.3},
            "xla_compile_op_seconds": {}}
    record = CellRecord.of("[3]", CellDelta(0.31, diff, 0, 0, 0), None)
    parts = [record.compile_seconds, record.run_seconds, record.transfer_seconds, record.other_seconds]
    assert parts == [0.31, 0.0, 0.0, 0.0]
    record = CellRecord.of("[4]", CellDelta(1.0, diff, 0, 0, 0), None)
    assert record.compile_seconds == 0.42 and record.transfer_seconds == 0.05
    assert sum([record.compile_seconds, record.run_seconds, record.transfer_seconds, record.other_seconds]) == \
        pytest.approx(1.0)


def test_memory_plot_magic_names_the_largest_tensors(ip, capsys, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    code = ("%%tpu --memory-trace\nbig = torch.zeros(256, 256)\nsmall = torch.zeros(10)\n"
            "tmp = torch.zeros(512, 512)\ndel tmp")
    result, out = _run(ip, capsys, code)
    assert result.success and "[tpu] cell" in out
    result, out = _run(ip, capsys, "%tpu memory --plot")
    assert len(shown) == 2
    for bundle in shown:
        svgs = re.findall(r"<svg.*?</svg>", bundle["text/html"])
        timeline = next(_svg(s) for s in svgs if "data-plot='memory-timeline'" in s)
        peak = _find(timeline, "g", "peak-marker")[0]
        rows = [(int(g.get("data-bytes")), g.get("data-name"), g.get("data-line")) for g in
                _find(timeline, "g", "allocation")]
        assert rows[0][0] == 512 * 512 * 4 and rows[0][1] == "(freed)"
        assert rows[0][2].endswith(":4 in <module>")  # the cell's own line 4 (tmp = ...)
        assert (256 * 256 * 4, "big") in [(b, n) for b, n, _ in rows]
        assert int(peak.get("data-bytes")) - sum(b for b, _, _ in rows) >= 0
        assert int(peak.get("data-bytes")) >= (512 * 512 + 256 * 256 + 10) * 4
        assert "largest allocations live at the peak" in bundle["text/plain"]
    assert not memory_history.is_recording()


def test_plots_are_valid_when_empty():
    from tpu_interactive import plots

    for svg in (plots.memory_per_cell([]), plots.time_per_cell([]),
                plots.memory_timeline({"segments": [], "device_traces": [[]]})):
        texts = [t.text for t in _svg(svg).iter("{http://www.w3.org/2000/svg}text")]
        assert texts[1].startswith("no ")


def test_dashboard_shows_the_plots(ip):
    from tpu_interactive.widgets.panels import Dashboard

    ip.run_cell("d1 = torch.ones(100, device='tpu')")
    board = Dashboard(ip.user_ns)
    assert "data-plot='memory-per-cell'" in board.plots.memory.value
    assert "data-plot='time-per-cell'" in board.plots.time.value
    assert "per cell:" in board.text()
    board.close()
