"""JupyterLab in headless Chromium: run the quickstart notebook and check the widgets render; run the
memory-and-profiling notebook and read the numbers its SVG plots carry.

Needs Debian's chromium (``apt-get install -y chromium``) and the ``playwright`` Python package
(its own browser downloads are never used). Skips with a message when either is missing.
Saves docs/quickstart-jupyterlab.png and docs/memory-plots-jupyterlab.png.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import ROOT

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOT = os.path.join(ROOT, "docs", "quickstart-jupyterlab.png")
PLOTS_SCREENSHOT = os.path.join(ROOT, "docs", "memory-plots-jupyterlab.png")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"jupyter lab did not answer at {url}")


@pytest.fixture
def lab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} not found (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright)")
    work = tmp_path / "nb"
    work.mkdir()
    for notebook in ("quickstart.ipynb", "memory_and_profiling.ipynb"):
        shutil.copy(os.path.join(ROOT, "notebooks", notebook), work / notebook)
    # Isolated settings: no windowing, so every cell's output is in the DOM.
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    notifications = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notifications.mkdir(parents=True)
    (notifications / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.allow_root=True",
           "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={work}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(work))
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/status", proc, timeout=120)
        yield f"http://127.0.0.1:{port}", work
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def _notebook_running(url: str, notebook: str):
    """A Chromium page with the notebook open in JupyterLab, its kernel idle, all cells started."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.goto(f"{url}/lab/tree/{notebook}", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=120_000)
            page.wait_for_function("() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
                                   " return s.session && s.session.kernel && s.kernelDisplayStatus === 'idle'; }",
                                   timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            yield page
        finally:
            browser.close()


def test_quickstart_in_jupyterlab(lab):
    url, _work = lab
    with _notebook_running(url, "quickstart.ipynb") as page:
        # The last cell (%tpu status) prints the switches once everything above has run.
        page.get_by_text("nan_check off").wait_for(timeout=300_000)
        body = page.locator(".jp-Notebook").inner_text()
        assert "Traceback (most recent call last)" not in body  # no cell failed
        assert "grad device: tpu:0" in body and "aten::addmm" in body and "aten::log" in body
        dashboard = page.locator(".widget-vbox").filter(has_text="bytes in use").first
        dashboard.wait_for(timeout=60_000)
        text = dashboard.inner_text()
        for expected in ("bytes in use", "largest live tensors", "model.0.weight", "Compile cache", "hit rate",
                         "Tensor placement", "requires_grad"):
            assert expected in text, expected
        assert page.locator(".widget-toggle-button").count() == 4  # sync, NaN check, Pallas, fused eager
        assert page.locator(".progress-bar, .widget-progress").count() >= 1
        # A click round-trips through the kernel: the observer sets sync mode and rewrites the state line.
        page.locator(".widget-toggle-button", has_text="sync mode").click()
        page.get_by_text("sync mode: on").wait_for(timeout=60_000)
        page.locator(".widget-toggle-button", has_text="sync mode").click()
        page.get_by_text("sync mode: off").wait_for(timeout=60_000)
        dashboard.evaluate("el => el.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
        page.screenshot(path=SCREENSHOT)
    assert os.path.getsize(SCREENSHOT) > 10_000


def _plot(page, kind: str):
    """The newest rendered plot of a kind (earlier cells may have drawn one too)."""
    return page.locator(f"svg.tpu-plot[data-plot='{kind}']").last


def _attrs(plot, selector: str, *names: str) -> list[dict]:
    """The data-* attributes of the plot's elements matching the selector, as the browser rendered them."""
    return plot.locator(selector).evaluate_all(
        "(els, names) => els.map(e => Object.fromEntries(names.map(n => [n, e.getAttribute(n)])))", list(names))


def test_memory_plots_in_jupyterlab(lab):
    """The SVG plots render in JupyterLab and carry the numbers the notebook's cells imply."""
    url, _work = lab
    with _notebook_running(url, "memory_and_profiling.ipynb") as page:
        # every code cell has run once every prompt shows its execution count ("[3]:", not "[*]:")
        page.wait_for_function(
            "() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];"
            " return p.length > 0 && p.every(e => /\\[\\d+\\]/.test(e.textContent)); }", timeout=300_000)
        body = page.locator(".jp-Notebook").inner_text()
        assert "Traceback (most recent call last)" not in body  # no cell failed
        kinds = _attrs(page.locator("body"), "svg.tpu-plot", "data-plot")
        assert {k["data-plot"] for k in kinds} >= {"memory-timeline", "memory-per-cell", "time-per-cell"}, kinds
        # %%tpu --memory-trace: `weights = torch.zeros(1024, 1024)` is 4 MiB of float32, live at the peak
        # and named, with the line that allocated it
        timeline = _plot(page, "memory-timeline")
        rows = _attrs(timeline, "g.allocation", "data-bytes", "data-name", "data-line")
        weights = [r for r in rows if r["data-name"] == "weights"]
        assert weights and weights[0]["data-bytes"] == str(1024 * 1024 * 4), rows
        peaks = _attrs(timeline, "g.peak-marker", "data-bytes")
        # the cell's peak holds weights and scratch (4 MiB each) at once
        assert any(int(pk["data-bytes"]) >= 2 * 4 * 1024 * 1024 for pk in peaks), peaks
        # %tpu cells --plot after `config.memory_limit_bytes = 64 * 2**20`: the limit line says 64 MiB
        memory = _plot(page, "memory-per-cell")
        limits = _attrs(memory, "g.limit", "data-bytes")
        assert limits and limits[-1]["data-bytes"] == str(64 * 2**20), limits
        cells = _attrs(memory, "g.cell", "data-peak", "data-live")
        assert cells and all(int(c["data-peak"]) >= int(c["data-live"]) >= 0 for c in cells), cells
        # each cell's stacked time parts add up to its wall time
        times = _plot(page, "time-per-cell")
        walls = _attrs(times, "g.cell", "data-wall")
        parts = times.locator("g.cell").evaluate_all(
            "els => els.map(g => [...g.querySelectorAll('rect')].map(r => +r.getAttribute('data-seconds')))")
        assert len(walls) == len(parts) == len(cells) >= 5
        for wall, seconds in zip(walls, parts):
            assert abs(sum(seconds) - float(wall["data-wall"])) <= 1e-3 + 1e-3 * float(wall["data-wall"])
        # drawn, not just present: the plots have a rendered size
        box = timeline.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 150, box
        timeline.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        page.screenshot(path=PLOTS_SCREENSHOT)
    assert os.path.getsize(PLOTS_SCREENSHOT) > 10_000
