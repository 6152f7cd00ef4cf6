"""Issue 7: a long-lived kernel survives faults; memory accounting is exact; bad input never lies."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tpu_interactive as torch_tpu
from tpu_interactive.backend.detect import device_warnings
from helpers import both, cpu_only_scale
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.backend.storage import DeviceOutOfMemoryError


def _bytes_in_use() -> int:
    torch.tpu.synchronize()  # deferred work (compile ahead, a fused segment) holds its inputs until it runs
    gc.collect()
    return torch_tpu.memory_stats()["tracked_bytes_in_use"]  # exact; a device's own figure includes jax's buffers


@pytest.fixture
def survivors():
    """Tensors made before a fault, with CPU copies to prove they still hold their values after."""
    cpu = {"a": torch.randn(64, 32), "b": torch.arange(10), "c": torch.randn(8, 8).t()}
    dev = {k: v.to("tpu") for k, v in cpu.items()}
    view = dev["a"][:, 3]
    yield dev, view
    for k, v in cpu.items():
        assert torch.equal(dev[k].cpu(), v), f"tensor {k} changed after a fault"
    assert torch.equal(view.cpu(), cpu["a"][:, 3])
    assert torch.equal((dev["a"] * 2).cpu(), cpu["a"] * 2), "device no longer computes correctly"


@pytest.mark.parametrize("fault", ["shape", "dtype", "no_lowering", "index", "oom", "nan"])
def test_faults_leave_state_intact(fault, survivors):
    dev, _ = survivors
    before = torch_tpu.stats()
    live_before = _bytes_in_use()
    a = dev["a"]
    if fault == "shape":
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            a @ a
    elif fault == "dtype":
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            dev["b"].add_(0.5)
    elif fault == "no_lowering":
        with torch_tpu.cpu_fallback(False):
            with pytest.raises(NotImplementedError, match="no tpu lowering"):
                cpu_only_scale(a, 2.0)
        assert torch_tpu.config.cpu_fallback
    elif fault == "index":
        with pytest.raises(IndexError):
            a[100]
    elif fault == "oom":
        torch_tpu.config.memory_limit_bytes = live_before + 4096
        with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory") as err:
            torch.empty(1024, 1024, device="tpu")
        assert "memory_limit_bytes" in str(err.value)
        torch_tpu.config.memory_limit_bytes = None
        assert isinstance(err.value, DeviceOutOfMemoryError)
    elif fault == "nan":
        with torch_tpu.nan_check(True):
            with pytest.raises(FloatingPointError, match="NaN/Inf"):
                torch.log(a - 100)
        assert not torch_tpu.config.nan_check
    after = torch_tpu.stats()
    if fault != "index":  # torch rejects a bad index in C++ before any tpu kernel runs
        assert after["errors"] > before["errors"]
    assert _bytes_in_use() == live_before, "a failed op leaked or lost device memory"


def test_keyboard_interrupt_during_long_eager_loop(survivors):
    x = torch.zeros(256, device="tpu")
    live_before = _bytes_in_use()
    # Ctrl-C reaches a kernel as SIGINT, which Python's handler raises as KeyboardInterrupt in the main
    # thread (where pytest-xdist runs tests). Pressed again every 0.3 s until the loop stops: a press
    # landing in a finaliser (a buffer freed, say) is dropped by Python itself, as a real one would be.
    assert threading.current_thread() is threading.main_thread()
    looping, pressed = [True], threading.Event()

    def on_sigint(signum, frame):
        if looping[0]:
            raise KeyboardInterrupt

    def press():
        while not pressed.wait(0.3):
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    steps = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                for steps in range(1_000_000):
                    x.add_(1)
                    time.sleep(0)
            except KeyboardInterrupt:
                looping[0] = False
                raise
    finally:
        looping[0] = False
        pressed.set()
        presser.join()
        signal.signal(signal.SIGINT, previous)
    values = x.cpu()
    # every element saw the same number of complete updates: no torn write
    assert torch.all(values == values[0]) and values[0].item() in (steps, steps + 1)
    assert _bytes_in_use() == live_before
    x.add_(1)
    assert x.cpu()[0].item() == values[0].item() + 1


def test_sync_mode_restored_after_exception():
    assert not torch_tpu.config.sync
    with pytest.raises(RuntimeError):
        with torch_tpu.sync_mode(True):
            torch.randn(2, 3, device="tpu") @ torch.randn(2, 3, device="tpu")
    assert not torch_tpu.config.sync


def test_memory_flat_over_200_training_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 4, (16,), device="tpu")
    samples = []
    for step in range(200):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step in (20, 100, 199):
            del loss
            samples.append(_bytes_in_use())
    assert samples[0] == samples[1] == samples[2], f"device memory grew during training: {samples}"


def test_memory_returns_after_views_and_autograd_graphs():
    base = _bytes_in_use()
    w = torch.randn(128, 128, device="tpu", requires_grad=True)
    loss = (w.t()[:, :64].relu() * 3).sum()
    loss.backward()
    del w, loss
    assert _bytes_in_use() == base


def test_buffer_freed_inside_a_locked_stats_section_neither_deadlocks_nor_loses_the_free():
    # The garbage collector can free a tpu buffer at any allocation, e.g. inside stats.snapshot()
    # while it holds the stats lock (this hung a whole CI run). Free one right there, in a thread
    # so a deadlock fails the test instead of hanging it.
    x = torch.ones(1000, device="tpu")
    gc.collect()  # earlier tests' garbage must not be freed (and counted) inside the measured window
    base = backend_stats.memory()
    expected = base.live_bytes - 4000

    def free_under_lock():
        nonlocal x
        with backend_stats._lock:
            del x  # last reference: storage dies -> DeviceBuffer.__del__ -> record_free
        backend_stats.snapshot()

    worker = threading.Thread(target=free_under_lock, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "freeing a buffer while the stats lock was held deadlocked"
    now = backend_stats.memory()
    assert (now.live_bytes, now.live_buffers) == (expected, base.live_buffers - 1)
    assert torch_tpu.memory_stats()["tracked_bytes_in_use"] == expected


# ---------------------------------------------------------------- bad-input sweep (hypothesis)
_DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.int32]
_OPS = {
    "add": lambda a, b: torch.add(a, b),
    "mul": lambda a, b: a * b,
    "sub": lambda a, b: a - b,
    "div": lambda a, b: a / b,
    "mm": lambda a, b: torch.mm(a, b),
    "matmul": lambda a, b: a @ b,
    "cat": lambda a, b: torch.cat([a, b], dim=0),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "maximum": lambda a, b: torch.maximum(a, b),
    "eq": lambda a, b: a == b,
    "add_": lambda a, b: a.clone().add_(b),
    "sum": lambda a, b: a.sum(dim=b.dim() - 1 if b.dim() else 0),
    "view": lambda a, b: a.view(b.shape),
}

_shape = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


# derandomized like tests/test_property.py: CI sees the same examples every run (a random search
# that finds a new case turns CI red for a change that did not cause it)
@settings(max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(op=st.sampled_from(sorted(_OPS)), sa=_shape, sb=_shape, da=st.sampled_from(_DTYPES),
       db=st.sampled_from(_DTYPES), seed=st.integers(0, 2**16))
def test_bad_input_sweep_matches_cpu_or_raises_same_type(op, sa, sb, da, db, seed):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(sa, generator=gen) * 4).to(da)
    b = (torch.randn(sb, generator=gen) * 4).to(db)
    # a bfloat16 operand: its float32 math rounds to bfloat16 (one ulp, 2^-8 relative) wherever it lands
    both(_OPS[op], a, b, tol=dict(rtol=2e-2, atol=1e-2) if torch.bfloat16 in (da, db) else "ulps")


# ---------------------------------------------------------------- honest device detection
def test_no_warning_without_tpu_hardware():
    assert device_warnings("cpu", device_files=[]) == []
    assert device_warnings("tpu", device_files=["/dev/accel0"]) == []


def test_tpu_present_but_held_names_the_holder(tmp_path):
    fake_device = tmp_path / "accel0"
    fake_device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(fake_device)!r}); import time; time.sleep(60)"])
    try:
        deadline = time.time() + 30
        warnings = []
        while time.time() < deadline:
            warnings = device_warnings("cpu", device_files=[str(fake_device)])
            if f"PID {holder.pid}" in " ".join(warnings):
                break
            time.sleep(0.2)
        assert len(warnings) == 1
        text = warnings[0]
        assert "NOT using the TPU" in text and f"PID {holder.pid}" in text and f"kill {holder.pid}" in text
    finally:
        holder.kill()
        holder.wait()


def test_tpu_present_not_held_suggests_fix(tmp_path):
    fake_device = tmp_path / "accel0"
    fake_device.write_text("")
    lock = tmp_path / "libtpu_lockfile"
    [text] = device_warnings("cpu", device_files=[str(fake_device)], lockfile=str(lock))
    assert "Install libtpu" in text
    lock.write_text("")
    [text] = device_warnings("cpu", device_files=[str(fake_device)], lockfile=str(lock))
    assert "lock file exists" in text


def test_startup_only_settings_are_reported(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    info = torch_tpu.backend_info()
    assert info.startup_env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
