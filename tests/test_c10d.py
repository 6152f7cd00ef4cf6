"""torch.distributed on tpu tensors: the ``tpu`` c10d backend on 2 (and 4, slow) processes.

One launch of 2 worker processes runs every check of ``c10d_checks`` (each compares the tpu group's
result with gloo's on CPU copies of the same tensors); the tests below read its report. Each launch
has a timeout, and ``tpu_interactive.launch`` stops every worker when it returns or fails.
"""
from __future__ import annotations

import io
import os
import pickle
import time

import c10d_checks
import pytest
import torch.distributed as dist

import tpu_interactive
from tpu_interactive.backend import jax_runtime

LAUNCH_TIMEOUT_S = 400


def _launch_checks(nprocs: int, names: list[str] = c10d_checks.NAMES) -> dict:
    return tpu_interactive.launch(c10d_checks.run_all, names, nprocs=nprocs, timeout_s=LAUNCH_TIMEOUT_S)


@pytest.fixture(scope="module")
def report2():
    return _launch_checks(2)


def _assert_ok(report: dict, name: str, nprocs: int) -> None:
    assert sorted(report) == list(range(nprocs))
    failures = {rank: res[name] for rank, res in report.items() if res[name] != "ok"}
    assert not failures, failures


@pytest.mark.parametrize("name", c10d_checks.NAMES)
def test_collective_vs_gloo(report2, name):
    _assert_ok(report2, name, 2)


def test_backend_name(report2):
    assert {res["__backend__"] for res in report2.values()} == {"tpu"}


@pytest.mark.slow
def test_fsdp2_dtensor_tp_checkpoint_hf_vs_cpu():
    report = _launch_checks(2, c10d_checks.SLOW)
    for name in c10d_checks.SLOW:
        _assert_ok(report, name, 2)


@pytest.mark.slow
def test_collectives_vs_gloo_4_processes():
    names = [*c10d_checks.NAMES, "fsdp2_mlp"]
    report = _launch_checks(4, names)
    for name in names:
        _assert_ok(report, name, 4)


def _fails_on_rank_1() -> None:
    import torch

    print(f"hello from rank {os.environ['RANK']}")
    dist.init_process_group()  # no backend name: the tpu accelerator's default, as nccl for cuda
    x = torch.ones(4, device="tpu")
    dist.all_reduce(x)
    assert x.cpu().tolist() == [2.0] * 4
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.all_reduce(x)  # rank 0 waits here for a rank that is gone


def test_failing_rank_stops_every_rank():
    """The launcher streams each rank's output, names the failing rank and stops the one left waiting."""
    start, out = time.monotonic(), io.StringIO()
    with pytest.raises(tpu_interactive.LaunchError, match=r"rank 1 failed \(ValueError: boom on purpose\)") as info:
        tpu_interactive.launch(_fails_on_rank_1, nprocs=2, grace_s=3, timeout_s=LAUNCH_TIMEOUT_S, out=out)
    assert info.value.rank == 1
    assert "Traceback" in info.value.output
    lines = out.getvalue().splitlines()
    assert "[rank 0] hello from rank 0" in lines and "[rank 1] hello from rank 1" in lines
    assert any(line.startswith("[rank 1] ValueError: boom on purpose") for line in lines)
    assert time.monotonic() - start < LAUNCH_TIMEOUT_S


def test_launch_ports_are_outside_the_range_outgoing_connections_take():
    """A port from bind(0) can be handed to another process's outgoing connection before rank 0's
    TCPStore listens on it (EADDRINUSE, seen in CI); the launcher draws from below that range."""
    from tpu_interactive import launcher

    low, _ = launcher._ephemeral_port_range()
    ports = {launcher._free_port_pair() for _ in range(20)}
    assert all(1024 <= p and p + 1 < low for p in ports), (sorted(ports), low)
    assert len(ports) > 1  # drawn at random: two launches at once rarely meet


def test_init_without_torchrun_env_or_arguments(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="environment variable RANK expected, but not set"):
        dist.init_process_group("tpu")
    assert not dist.is_initialized()


def test_group_larger_than_runtime_is_refused():
    # this test process never joined JAX's runtime: a 2-process group cannot run here
    with pytest.raises(RuntimeError, match="not part of JAX's multi-process runtime"):
        dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=2)
    assert not dist.is_initialized()


def test_world_size_larger_than_devices_is_refused(monkeypatch):
    monkeypatch.setenv("TPU_INTERACTIVE_HOST_DEVICES", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for var, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(jax_runtime, "_refused", [])
    assert jax_runtime.join_from_env() is False  # refused before contacting any coordinator
    with pytest.raises(RuntimeError, match="2 processes on this host but it has 1 device.*--nproc-per-node 1"):
        dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=2)
    assert not dist.is_initialized()


def test_compiled_collectives_in_a_one_process_group():
    """A notebook's one-process group: a compiled graph with collectives runs (a mesh of one device)
    and equals the same function on CPU over gloo."""
    import torch
    import torch.distributed._functional_collectives as funcol

    def fn(x, group):
        return funcol.all_reduce(x * 2, "max", group) + funcol.broadcast(x.sin(), 0, group)

    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.randn(3, 4)
        want = fn(x, dist.new_group(backend="gloo"))
        got = torch.compile(fn, backend="tpu")(x.to("tpu"), dist.group.WORLD)
        torch.testing.assert_close(got.cpu(), want)
    finally:
        dist.destroy_process_group()


def test_storage_resize_matches_cpu():
    """UntypedStorage.resize_ (FSDP2 frees/re-allocates parameters with it) keeps the prefix, like CPU."""
    import torch

    for device in ("cpu", "tpu"):
        t = torch.arange(6.0, device=device)
        s = t.untyped_storage()
        s.resize_(8)
        kept = torch.empty(0, device=device).set_(s, 0, (2,), (1,))
        assert s.nbytes() == 8 and kept.cpu().tolist() == [0.0, 1.0]
        s.resize_(0)
        assert s.nbytes() == 0 and t.untyped_storage().nbytes() == 0
        s.resize_(24)
        t.copy_(torch.arange(6.0) + 1)  # FSDP2's all-gather writes into the re-grown storage
        assert torch.empty(0, device=device).set_(s, 0, (6,), (1,)).cpu().tolist() == [1.0, 2, 3, 4, 5, 6]


def test_launch_pickles_notebook_functions_by_value():
    """A function defined in __main__ (a notebook cell) travels by value with the globals it uses."""
    from tpu_interactive import launcher

    cell = {"__name__": "__main__"}
    exec("import math\nSCALE = 3\ndef helper(x):\n    return SCALE * x\n"  # noqa: S102  (a notebook cell)
         "def fn(x, k=1):\n    return [math.sqrt(x) + helper(x) * k for _ in range(2)]\n", cell)
    buf = io.BytesIO()
    launcher._MainByValue.dump((cell["fn"], (4.0,)), buf)
    fn, args = pickle.loads(buf.getvalue())
    assert fn is not cell["fn"] and fn(*args) == cell["fn"](4.0) == [14.0, 14.0]
    assert fn(4.0, k=0) == [2.0, 2.0]
