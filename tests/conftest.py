import json
import os
import shutil
import tempfile

import jax
import pytest

import tpu_interactive  # noqa: F401  (registers the device)
from tpu_interactive.backend import compile_log, fusion, native

# On an accelerator this process holds the chip, and a second process cannot open it (a TPU v5e run
# failed the tests that start a Python child): children run on the CPU. This process's backend is
# already up, so the variable only reaches the children.
if jax.default_backend() != "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"

# Every call the C++ front on torch's IValues keys must be keyed as the Python front keys the arguments a
# Python kernel gets (csrc/boxed_front.cpp): checked on each such call of the whole suite.
if native.available():
    native.module().fast_check_keys(True)


@pytest.fixture
def no_fallback():
    """Fail the test if any op silently took the CPU fallback."""
    before = dict(tpu_interactive.stats()["fallback_counts"])
    yield
    after = tpu_interactive.stats()["fallback_counts"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"


@pytest.fixture(autouse=True)
def _restore_flags(request):
    cfg = tpu_interactive.config
    saved = (cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes, cfg.fuse)
    if request.node.get_closest_marker("eager_only"):  # CI's fused-mode job: this test checks plain eager
        fusion.set_enabled(False)
    yield
    # fused mode (TPU_DEFER_AND_FUSE=1): what a test recorded runs within that test, as at a cell's end
    fusion.flush("end of the test")
    cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes, cfg.fuse = saved


# ---------------------------------------------------------------- where the suite's time goes
# The suite is compile-bound (every new op/shape is one XLA program), so the summary line says how
# many programs each run compiled and for how long: CI logs then show why a run got slower.
_COMPILES = {"programs": 0, "seconds": 0.0, "disk_hits": 0}


def _count_compile(event: str, duration: float, **_kwargs) -> None:
    if event == compile_log.BACKEND_COMPILE_EVENT:
        _COMPILES["programs"] += 1
        _COMPILES["seconds"] += duration


def _count_disk_hit(event: str, **_kwargs) -> None:
    if event == compile_log.DISK_HIT_EVENT:
        _COMPILES["disk_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)
jax.monitoring.register_event_listener(_count_disk_hit)


def pytest_sessionfinish(session):
    workers_dir = os.environ.get("TPU_INTERACTIVE_TEST_COMPILES_DIR")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if workers_dir and worker:  # an xdist worker: hand the counts to the controller
        with open(os.path.join(workers_dir, worker + ".json"), "w") as f:
            json.dump(_COMPILES, f)


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller: a folder the workers write into
        os.environ["TPU_INTERACTIVE_TEST_COMPILES_DIR"] = tempfile.mkdtemp(prefix="tpu-compiles-")


def pytest_terminal_summary(terminalreporter):
    totals = dict(_COMPILES)
    workers_dir = os.environ.get("TPU_INTERACTIVE_TEST_COMPILES_DIR")
    for name in os.listdir(workers_dir) if workers_dir and os.path.isdir(workers_dir) else ():
        with open(os.path.join(workers_dir, name)) as f:
            for key, value in json.load(f).items():
                totals[key] += value
    if workers_dir and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(workers_dir, ignore_errors=True)
    terminalreporter.write_line(
        f"XLA programs: {totals['programs']} ({totals['disk_hits']} of them loaded from the persistent cache), "
        f"{totals['seconds']:.0f} s compiling or loading, all workers together")
