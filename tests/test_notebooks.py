"""Execute the example notebooks with nbclient and check what they print and display."""
import math
import os
import re

import nbformat
import pytest
from helpers import NOTEBOOKS, execute_notebook, stored_notebook

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def cell_with(book, text: str):
    matches = [c for c in book.cells if c.cell_type == "code" and text in c.source]
    assert len(matches) == 1, text
    return matches[0]


def test_notebooks_are_stored_without_outputs():
    for name in ("quickstart.ipynb", "debugging.ipynb"):
        assert "widgets" not in stored_notebook(name).metadata


@pytest.fixture(scope="module")
def quickstart():
    return execute_notebook("quickstart.ipynb")


@pytest.fixture(scope="module")
def debugging():
    return execute_notebook("debugging.ipynb")


def test_quickstart_runs_without_errors(quickstart):
    errors = [o for c in quickstart.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    banner = stdout(cell_with(quickstart, "%load_ext tpu_interactive"))
    assert "tpu_interactive" in banner and "tpu:0" in banner


def test_quickstart_trains_on_tpu(quickstart):
    out = stdout(cell_with(quickstart, "opt.step()"))
    losses = [float(v) for v in re.findall(r"step \d+: loss (\S+)", out)]
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses)
    assert losses[1] < losses[0]  # AdamW on a fixed batch must reduce the loss
    assert "grad device: tpu:0" in out
    assert re.search(r"\[tpu\] cell: .* wall", out) and "ops " in out and "fallbacks" in out and "cell peak" in out


def test_quickstart_compiled_train_step(quickstart):
    out = stdout(cell_with(quickstart, "compile_train_step"))
    losses = [float(v) for v in re.findall(r"compiled step \d+: loss (\S+)", out)]
    assert len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:]))  # training goes on
    assert "torch.compile graphs: 1 compiled, 2 cached" in out  # 1 eager step, 1 compile, 2 hits


def test_quickstart_shape_error_names_op_and_user_line(quickstart):
    out = stdout(cell_with(quickstart, "bad_batch = torch.randn(64, 100)"))
    assert "mat1 and mat2 shapes cannot be multiplied (64x100 and 784x256)" in out
    assert "aten::addmm" in out
    assert re.search(r"at: \S+:4 in <module>\n +model\(bad_batch\)", out)  # the cell's own line 4
    assert "sync on" in out


def test_quickstart_nan_check_reports_first_nan(quickstart):
    out = stdout(cell_with(quickstart, "--nan-check"))
    assert re.search(r"aten::log\.default produced NaN/Inf: \d+ of 640 elements", out)
    assert re.search(r"at: \S+:4 in <module>\n +log_probs = torch.log\(logits\)", out)


def test_quickstart_dashboard_widgets(quickstart):
    cell = cell_with(quickstart, "torch_tpu.dashboard()")
    shown = [o for o in cell.outputs if o.output_type == "display_data"]
    assert len(shown) == 1 and WIDGET_VIEW in shown[0].data
    text = shown[0].data["text/plain"]  # the saved-notebook fallback
    assert "bytes in use" in text and "model.0.weight" in text and "compile cache" in text
    state = quickstart.metadata["widgets"][WIDGET_STATE]["state"]
    assert shown[0].data[WIDGET_VIEW]["model_id"] in state
    models = list(state.values())
    names = [m["model_name"] for m in models]
    assert "IntProgressModel" in names and names.count("ToggleButtonModel") == 4
    html = " ".join(m["state"].get("value", "") for m in models if m["model_name"] == "HTMLModel")
    assert "bytes in use" in html and "largest live tensors" in html and "model.0.weight" in html
    assert "hit rate" in html and "requires_grad" in html
    status = stdout(cell_with(quickstart, "%tpu status"))
    assert "sync off" in status and "nan_check off" in status  # the cells' switches were restored


def test_debugging_notebook(debugging):
    errors = [o for c in debugging.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    out = stdout(cell_with(debugging, "def attention_scores"))
    assert "aten::bmm" in out
    assert re.search(r"at: \S+:3 in attention_scores\n +return \(q @ k\) \* scale", out)
    out = stdout(cell_with(debugging, "q + torch.randn(2, 8, 16)"))
    assert "aten::add.Tensor" in out and "hint:" in out and ":2 in <module>" in out
    report = stdout(cell_with(debugging, "torch.ops.demo.soft_clip"))
    assert "fallbacks  1 op call ran on CPU: demo::soft_clip x1" in report
    assert "soft_clip" in stdout(cell_with(debugging, "%tpu fallbacks"))
    memory = stdout(cell_with(debugging, "%tpu memory"))
    row = next(line for line in memory.splitlines() if "activations" in line)
    assert "first_rows" in row and "(1024, 1024)" in row and "4.00 MiB" in row
    oom = stdout(cell_with(debugging, "memory_limit_bytes ="))
    assert "out of memory" in oom and "too_big = torch.empty" in oom
    freed = stdout(cell_with(debugging, "del activations"))
    assert "memory     -4.00 MiB" in freed
    assert "activations" not in stdout(cell_with(debugging, "%tpu placement"))


# ---------------------------------------------------------------- memory_and_profiling.ipynb (stored with outputs)
PICTURES = "memory_and_profiling.ipynb"


def output_structure(book) -> list[list]:
    """Per code cell, the kinds of outputs it has (stdout, display/result mime types, errors), not their values;
    stderr (the profiler's C++ log lines) is left out and consecutive stdout chunks count once."""
    cells = []
    for cell in book.cells:
        if cell.cell_type != "code":
            continue
        kinds: list = []
        for o in cell.outputs:
            kind = "stdout" if o.output_type == "stream" and o.name == "stdout" else (
                None if o.output_type == "stream" else (o.output_type, tuple(sorted(o.get("data", {})))))
            if kind is not None and not (kind == "stdout" and kinds and kinds[-1] == "stdout"):
                kinds.append(kind)
        cells.append(kinds)
    return cells


def check_pictures_outputs(book) -> None:
    import xml.etree.ElementTree as ET

    svg_ns = "{http://www.w3.org/2000/svg}"
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors

    def svgs(cell):
        html = "".join(o.data["text/html"] for o in cell.outputs if o.output_type == "display_data")
        return {root.get("data-plot"): root for root in map(ET.fromstring, re.findall(r"<svg.*?</svg>", html))}

    out = stdout(cell_with(book, "_record_memory_history(max_entries=10_000)"))
    events = int(re.search(r"(\d+) events", out).group(1))
    assert events > 20 and "cudaMalloc(" in out  # PyTorch's _memory_viz.trace read the snapshot
    timeline = svgs(cell_with(book, "%tpu memory --plot"))["memory-timeline"]
    drawn = int(timeline.find(f"{svg_ns}polyline").get("data-events"))  # alloc and free_completed only
    assert 0 < drawn < events and "largest allocations live at the peak" in timeline_text(book)
    traced = svgs(cell_with(book, "%%tpu --memory-trace"))["memory-timeline"]
    rows = {g.get("data-name"): (int(g.get("data-bytes")), g.get("data-line"))
            for g in traced.iter(f"{svg_ns}g") if g.get("class") == "allocation"}
    assert rows["weights"][0] == 4 * 2**20 and rows["(freed)"][0] == 4 * 2**20
    assert rows["(freed)"][1].endswith(":4 in <module>")  # scratch, the cell's line 4
    profiled = stdout(cell_with(book, "%%tpu --profile-trace"))
    assert "per-op device time" in profiled and re.search(r"\baddmm +2 ", profiled)
    assert re.search(r"trace +\S+torch_trace\.json", profiled) and re.search(r"jax trace +\S+jax", profiled)
    block = stdout(cell_with(book, "tpu_interactive.profile("))
    assert "top ops by device time" in block and "accuracy" in block and "Self CPU" in block
    plots = svgs(cell_with(book, "%tpu cells --plot"))
    limit = [g for g in plots["memory-per-cell"].iter(f"{svg_ns}g") if g.get("class") == "limit"]
    assert int(limit[0].get("data-bytes")) == 64 * 2**20
    bars = [g for g in plots["time-per-cell"].iter(f"{svg_ns}g") if g.get("class") == "cell"]
    compiling = [float(r.get("data-seconds")) for g in bars for r in g if r.get("class") == "compile"]
    assert len(bars) >= 5 and max(compiling) > 0


def timeline_text(book) -> str:
    cell = cell_with(book, "%tpu memory --plot")
    return "".join(o.data["text/plain"] for o in cell.outputs if o.output_type == "display_data")


def test_pictures_notebook_is_stored_executed_with_current_outputs():
    book = nbformat.read(os.path.join(NOTEBOOKS, PICTURES), as_version=4)
    nbformat.validate(book)
    assert all(c.execution_count is not None for c in book.cells if c.cell_type == "code")
    check_pictures_outputs(book)


@pytest.mark.slow
def test_pictures_notebook_reexecutes_to_the_stored_structure():
    stored = nbformat.read(os.path.join(NOTEBOOKS, PICTURES), as_version=4)
    fresh = execute_notebook(PICTURES)
    check_pictures_outputs(fresh)
    assert output_structure(fresh) == output_structure(stored)
