import json
import os
import shutil
import sys
import tempfile

import jax
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import tpu_interactive  # noqa: E402,F401  (registers the device)
from tpu_interactive.backend import compile_log  # noqa: E402


@pytest.fixture
def no_fallback():
    """Fail the test if any op silently took the CPU fallback."""
    before = dict(tpu_interactive.stats()["fallback_counts"])
    yield
    after = tpu_interactive.stats()["fallback_counts"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"


@pytest.fixture(autouse=True)
def _restore_flags():
    cfg = tpu_interactive.config
    saved = (cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes)
    yield
    cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes = saved


# The default run is CI's bounded, fixed subset. These heavier parametrizations (other dtypes of
# the same checks, extra shapes) run with `-m slow` together with the full OpInfo sweep; the
# README records the full-run numbers. Patterns are patterns on the test node id (only '*' is a wildcard).
SLOW_IN_CI: tuple[str, ...] = (
    # OpInfo CI subset: float32 forward and float32 gradients run by default
    "tests/test_opinfo.py::test_opinfo_ci_subset[*-bfloat16]",
    "tests/test_opinfo.py::test_opinfo_ci_subset[*-bool]",
    "tests/test_opinfo.py::test_opinfo_ci_subset[*-int64]",
    "tests/test_ops_elementwise.py::*bfloat16*",
    # 1-d/3-d twins of the 2-d pooling/upsampling checks
    "tests/test_ops_conv.py::test_max_pool1d_3d_and_unbatched",
    "tests/test_ops_conv.py::test_adaptive_max_pool_1d_3d",
    "tests/test_ops_conv.py::test_avg_pool1d_3d",
    "tests/test_ops_conv.py::test_upsample_1d_3d",
    "tests/test_ops_reductions.py::test_cummax_cummin[cummin]",
    "tests/test_ops_linalg.py::test_lu_solve_lu_unpack_linalg_lu",
    # Pallas kernels in interpret mode (slow on CPU): two of the four attention-kernel shapes (the
    # eager SDPA routing tests cover non-causal and lq != lk) and the larger matmul shape
    "tests/test_pallas.py::test_attention_kernel_forward_and_vjp[False-5-40-16]",
    "tests/test_pallas.py::test_attention_kernel_forward_and_vjp[False-19-23-8]",
    "tests/test_pallas.py::test_eager_mm_addmm_bmm_paths[33-17-40]",
    # Transformers: Llama training and Llama generation (eager and compiled) run by default
    "tests/test_transformers.py::test_forward_backward_adamw_match_cpu[gpt2]",
    "tests/test_transformers.py::test_forward_backward_adamw_match_cpu[bert]",
    "tests/test_transformers.py::test_forward_backward_adamw_match_cpu[t5]",
    "tests/test_transformers.py::test_greedy_generate_matches_cpu[gpt2-*]",
    "tests/test_transformers.py::test_greedy_generate_matches_cpu[t5-*]",
    # compile_train_step vs CPU: every model with SGD-momentum and the MLP with Adam run by default
    # (Adam's and AdamW's capturable paths are also covered by the other train-step tests)
    "tests/test_train_step.py::test_matches_cpu_training[conv-adam*]",
    "tests/test_train_step.py::test_matches_cpu_training[block-adam*]",
    "tests/test_train_step.py::test_matches_cpu_training[mlp-adamw]",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    import fnmatch

    patterns = [p.replace("[", "[[]") for p in SLOW_IN_CI]  # '[' is literal here; only '*' is a wildcard
    for item in items:
        if any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in patterns):
            item.add_marker(pytest.mark.slow)


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
