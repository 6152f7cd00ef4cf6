"""JupyterLab in headless Chromium: run the quickstart notebook and check the widgets render.

Needs Debian's chromium (``apt-get install -y chromium``) and the ``playwright`` Python package
(its own browser downloads are never used). Skips with a message when either is missing.
Saves docs/quickstart-jupyterlab.png.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.browser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOT = os.path.join(ROOT, "docs", "quickstart-jupyterlab.png")


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
    shutil.copy(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), work / "quickstart.ipynb")
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


def test_quickstart_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    url, _work = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.goto(f"{url}/lab/tree/quickstart.ipynb", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=120_000)
            page.wait_for_function("() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
                                   " return s.session && s.session.kernel && s.kernelDisplayStatus === 'idle'; }",
                                   timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
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
            assert page.locator(".widget-toggle-button").count() == 3
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
        finally:
            browser.close()
    assert os.path.getsize(SCREENSHOT) > 10_000
