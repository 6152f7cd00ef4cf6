"""torch.accelerator, pinned memory, device generators, torch.tpu streams/events/properties, complex
random numbers: each checked against torch's own behaviour (CPU, or CUDA's documented semantics)."""
import gc
import os
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

import tpu_interactive
from tpu_interactive.backend import native
from tpu_interactive.backend.storage import _fmt_bytes

TPU = torch.device("tpu")

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C++ hooks unavailable: {native._error}")


def _all_device_work_done() -> bool:
    return all(a.is_ready() for a in jax.live_arrays())


def _matmul_chain(n=6, size=384):
    w = torch.randn(size, size, device="tpu") / size**0.5
    y = w
    for _ in range(n):
        y = y @ w
    return y


# ---------------------------------------------------------------- A. torch.accelerator
def test_tpu_is_the_current_accelerator():
    assert torch.accelerator.current_accelerator() == TPU
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 1


def test_accelerator_memory_calls_are_torch_tpu_numbers_and_exact():
    gc.collect()
    torch.accelerator.reset_peak_memory_stats()
    before = torch.accelerator.memory_allocated()
    assert before == torch.tpu.memory_allocated()
    x = torch.empty(1000, 250, device="tpu")  # 1,000,000 bytes
    assert torch.accelerator.memory_allocated() - before == 1_000_000
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        assert getattr(torch.accelerator, name)() == getattr(torch.tpu, name)(), name
    assert torch.accelerator.max_memory_allocated() == before + 1_000_000
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    acc_stats, tpu_stats = torch.accelerator.memory_stats(), torch.tpu.memory_stats()
    assert acc_stats and {k: tpu_stats.get(k) for k in acc_stats} == dict(acc_stats)
    assert acc_stats["allocated_bytes.all.current"] == before + 1_000_000
    free, total = torch.accelerator.get_memory_info()
    assert (free, total) == torch.tpu.mem_get_info() and free == total - torch.tpu.memory_reserved()
    del x
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.memory_allocated() == before


def test_accelerator_accumulated_stats_count_allocations_and_frees():
    gc.collect()
    torch.accelerator.reset_accumulated_memory_stats()
    x = torch.empty(4096, dtype=torch.uint8, device="tpu")
    del x
    gc.collect()
    s = torch.accelerator.memory_stats()
    assert s["allocated_bytes.all.allocated"] == 4096 and s["allocated_bytes.all.freed"] == 4096
    assert s["allocation.all.allocated"] == 1 and s["num_device_free"] == 1


def test_accelerator_empty_cache_frees_unreachable_device_memory():
    gc.collect()
    before = torch.tpu.memory_allocated()
    cycle = [torch.empty(250_000, device="tpu")]
    cycle.append(cycle)  # only the cycle collector frees it
    del cycle
    assert torch.accelerator.memory_allocated() == before + 1_000_000
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() == before


def test_accelerator_synchronize_waits_for_the_device():
    y = _matmul_chain()
    torch.accelerator.synchronize()
    assert _all_device_work_done()
    del y


def test_without_a_compiler_import_works_and_says_why(tmp_path):
    code = textwrap.dedent("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, tpu_interactive
        assert any("no C++ compiler found" in str(w.message) for w in caught), [str(w.message) for w in caught]
        x = torch.ones(100, device="tpu")
        assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() >= 400
        torch.accelerator.synchronize(); torch.accelerator.empty_cache()
        try:
            torch.tpu.Event(enable_timing=True).elapsed_time(torch.tpu.Event(enable_timing=True))
        except RuntimeError as e:
            assert "no C++ compiler found" in str(e), e
        else:
            raise AssertionError("elapsed_time without the hooks must raise")
        print("OK")
    """)
    env = dict(os.environ, CXX="/nonexistent/g++", TORCH_EXTENSIONS_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(tpu_interactive.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


# ---------------------------------------------------------------- B. pinned memory
def test_pin_memory_tensor_and_factories():
    x = torch.randn(5, 3)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned() and torch.equal(p, x)
    assert p[1:].is_pinned() and p.t().is_pinned()  # views of pinned memory are pinned, as on CUDA
    assert p.pin_memory() is p
    assert torch.empty(4, pin_memory=True).is_pinned()
    z = torch.zeros(3, 2, pin_memory=True)
    assert z.is_pinned() and torch.equal(z, torch.zeros(3, 2))
    torch.manual_seed(3)
    r = torch.randn(6, pin_memory=True)
    torch.manual_seed(3)
    assert r.is_pinned() and torch.equal(r, torch.randn(6))  # CPU numbers, in pinned memory
    assert not torch.ones(2, device="tpu").is_pinned()


@pytest.mark.parametrize("pin_kwargs", [{}, {"pin_memory_device": "tpu"}], ids=["default", "tpu_device"])
def test_dataloader_pin_memory(pin_kwargs):
    ds = TensorDataset(torch.arange(40.).reshape(20, 2), torch.arange(20))
    plain = list(DataLoader(ds, batch_size=6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pinned = list(DataLoader(ds, batch_size=6, pin_memory=True, **pin_kwargs))
    messages = [str(w.message) for w in caught]
    # torch deprecates pin_memory_device (it pins for the current accelerator, tpu); nothing else warns
    assert all("pin_memory_device is deprecated" in m for m in messages) and bool(messages) == bool(pin_kwargs)
    assert len(pinned) == len(plain)
    for (a, b), (c, d) in zip(pinned, plain):
        assert a.is_pinned() and b.is_pinned() and torch.equal(a, c) and torch.equal(b, d)


def test_non_blocking_copies_from_pinned_memory_have_the_values():
    src = torch.randn(64, 33).pin_memory()
    whole = src.to("tpu", non_blocking=True)
    cast = src.to("tpu", dtype=torch.float64, non_blocking=True)
    strided = src.t().to("tpu", non_blocking=True)
    into_view = torch.zeros(65, 33, device="tpu")
    into_view[1:].copy_(src, non_blocking=True)
    used = whole * 2  # an op on a tensor whose copy may be in flight
    torch.tpu.synchronize()
    expected = src.clone()
    src.fill_(7)  # after synchronize the device copies no longer depend on the pinned memory
    assert torch.equal(whole.cpu(), expected) and torch.equal(used.cpu(), expected * 2)
    assert torch.equal(cast.cpu(), expected.double()) and torch.equal(strided.cpu(), expected.t())
    assert torch.equal(into_view.cpu()[1:], expected) and not into_view.cpu()[0].any()


@pytest.mark.parametrize("n", [10, 4_000_000], ids=["small", "large"])
def test_blocking_copy_does_not_see_later_changes_of_the_source(n):
    src = torch.zeros(n)
    dev = src.to("tpu")
    src.fill_(1)  # the transfer reads host memory asynchronously: a blocking copy must be done first
    assert float(dev.sum()) == 0.0


def test_pin_memory_of_a_device_tensor_is_refused_like_cuda():
    with pytest.raises(RuntimeError, match=r"cannot pin '.*' only dense CPU tensors can be pinned"):
        torch.ones(3, device="tpu").pin_memory()


# ---------------------------------------------------------------- C. device generators
def test_generator_seed_state_and_reproducibility():
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0)
    assert g.manual_seed(1234) is g and g.initial_seed() == 1234
    a = torch.randn(8, device="tpu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    b = torch.randn(8, device="tpu", generator=g)
    assert not torch.equal(a.cpu(), b.cpu())
    g.set_state(state)
    assert torch.equal(torch.randn(8, device="tpu", generator=g).cpu(), b.cpu())
    g.manual_seed(1234)
    assert torch.equal(torch.randn(8, device="tpu", generator=g).cpu(), a.cpu())
    new_seed = g.seed()
    assert new_seed == g.initial_seed() and new_seed != 1234
    clone = g.clone_state()
    assert torch.equal(torch.rand(4, device="tpu", generator=g).cpu(),
                       torch.rand(4, device="tpu", generator=clone).cpu())


def test_rng_state_all_round_trips_the_default_generator():
    torch.manual_seed(8)
    states = torch.tpu.get_rng_state_all()
    a = torch.rand(4, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    assert len(states) == torch.tpu.device_count() and torch.equal(torch.rand(4, device="tpu").cpu(), a)


def test_generators_are_independent_of_each_other_and_of_the_default():
    torch.manual_seed(0)
    expected_default = torch.randn(5, device="tpu").cpu()
    g1, g2 = torch.Generator(device="tpu").manual_seed(7), torch.Generator(device="tpu").manual_seed(7)
    torch.manual_seed(0)
    first = torch.randn(5, device="tpu", generator=g1).cpu()
    second = torch.randn(5, device="tpu", generator=g1).cpu()
    assert torch.equal(torch.randn(5, device="tpu").cpu(), expected_default)  # default not advanced
    assert torch.equal(torch.randn(5, device="tpu", generator=g2).cpu(), first)  # g2 not advanced by g1
    assert not torch.equal(first, second)


_OPS = {  # (device, generator) -> a draw; the same call on CPU gives the reference distribution
    "randn": lambda d, g: torch.randn(3000, device=d, generator=g),
    "rand": lambda d, g: torch.rand(3000, device=d, generator=g),
    "randint": lambda d, g: torch.randint(2, 9, (3000,), device=d, generator=g),
    "randperm": lambda d, g: torch.randperm(50, device=d, generator=g),
    "normal_": lambda d, g: torch.empty(3000, device=d).normal_(2.0, 0.5, generator=g),
    "uniform_": lambda d, g: torch.empty(3000, device=d).uniform_(-3, -1, generator=g),
    "normal": lambda d, g: torch.normal(torch.full((3000,), 5.0, device=d), 0.1, generator=g),
    "bernoulli": lambda d, g: torch.bernoulli(torch.full((3000,), 0.25, device=d), generator=g),
    "multinomial": lambda d, g: torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device=d), 3000, True, generator=g),
    "exponential_": lambda d, g: torch.empty(3000, device=d).exponential_(2.0, generator=g),
    "random_": lambda d, g: torch.empty(3000, dtype=torch.int64, device=d).random_(0, 5, generator=g),
}


@pytest.mark.parametrize("name", sorted(_OPS))
def test_generator_in_random_ops_reproducible_and_distributed_like_cpu(name):
    make = _OPS[name]
    g = torch.Generator(device="tpu").manual_seed(42)
    a = make("tpu", g).cpu()
    b = make("tpu", g).cpu()
    g.manual_seed(42)
    assert torch.equal(make("tpu", g).cpu(), a)
    assert not torch.equal(a, b)
    ref = make("cpu", torch.Generator().manual_seed(42))
    assert a.shape == ref.shape and a.dtype == ref.dtype
    if a.dtype.is_floating_point:
        scale = max(1.0, float(ref.std()))
        assert abs(a.mean() - ref.mean()) < 0.1 * scale and abs(a.std() - ref.std()) < 0.1 * scale
    elif name == "randperm":
        assert sorted(a.tolist()) == list(range(50))
    else:
        assert set(a.unique().tolist()) == set(ref.unique().tolist())
        assert abs(a.double().mean() - ref.double().mean()) < 0.15


def test_cpu_generator_on_tpu_ops_still_gives_cpu_numbers():
    probs = torch.tensor([0.2, 0.3, 0.5])
    dev = torch.multinomial(probs.to("tpu"), 10, True, generator=torch.Generator().manual_seed(3))
    assert torch.equal(dev.cpu(), torch.multinomial(probs, 10, True, generator=torch.Generator().manual_seed(3)))
    dev = torch.randn(2, 3, dtype=torch.complex64, device="tpu", generator=torch.Generator().manual_seed(4))
    assert torch.equal(dev.cpu(), torch.randn(2, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(4)))


def test_tpu_generator_in_cpu_ops_and_samplers_is_refused_like_cuda():
    # torch's CPU kernels refuse a device generator ("Expected a 'cpu' device type for generator but
    # found 'cuda'" on CUDA); samplers and DataLoader draw on the CPU, so they refuse it too
    g = torch.Generator(device="tpu")
    msg = "Expected a 'cpu' device type for generator but found 'tpu'"
    with pytest.raises(RuntimeError, match=msg):
        torch.randn(3, generator=g)
    with pytest.raises(RuntimeError, match=msg):
        list(RandomSampler(range(10), generator=g))
    with pytest.raises(RuntimeError, match=msg):
        list(DataLoader(TensorDataset(torch.arange(10.)), shuffle=True, generator=g))


def test_dataloader_with_a_seeded_cpu_generator_and_pinned_batches_is_reproducible():
    ds = TensorDataset(torch.arange(30.))

    def order():
        loader = DataLoader(ds, batch_size=5, shuffle=True, pin_memory=True, generator=torch.Generator().manual_seed(11))
        return [b[0].to("tpu", non_blocking=True).cpu().tolist() for b in loader]

    first = order()
    assert first == order() and sorted(v for batch in first for v in batch) == list(range(30))


def test_generator_bad_state_is_refused_like_cuda():
    g = torch.Generator(device="tpu")
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        g.set_state(torch.zeros(16))
    with pytest.raises(RuntimeError, match="RNG state is wrong size"):
        g.set_state(torch.zeros(3, dtype=torch.uint8))


# ---------------------------------------------------------------- D. torch.tpu at torch.cuda parity
def test_streams_are_the_one_device_stream():
    s = torch.tpu.Stream(priority=-1)
    cur, default = torch.tpu.current_stream(), torch.tpu.default_stream()
    assert isinstance(s, torch.Stream) and s == cur == default == torch.Stream(device="tpu")
    assert s.device == torch.device("tpu", 0)
    s.wait_stream(cur)
    with torch.tpu.stream(s) as entered:
        assert entered is s and torch.tpu.current_stream() == s
        y = torch.ones(3, device="tpu") * 2
    torch.tpu.set_stream(s)
    y.record_stream(s)
    event = s.record_event()
    cur.wait_event(event)
    z = _matmul_chain()
    assert s.query() and _all_device_work_done()  # query answers by waiting: True is exact
    del z
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))
    assert torch.get_device_module("tpu") is torch.tpu


def test_event_timing_is_device_inclusive():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    _matmul_chain(n=1)  # compile first
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    start.record()
    y = _matmul_chain()
    end.record()
    wall_ms = (time.perf_counter() - t0) * 1e3
    assert _all_device_work_done()  # the end timestamp is taken after the work finished
    end.synchronize()
    assert end.query()
    del y
    elapsed = start.elapsed_time(end)
    assert 0 < elapsed <= wall_ms + 1.0
    # the generic torch.Event (torch.accelerator's) is the same object kind
    a, b = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
    a.record()
    b.record()
    assert b.elapsed_time(a) <= 0 <= a.elapsed_time(b)
    event = torch.tpu.Event()
    event.record()
    event.wait()
    with pytest.raises(ValueError, match="Both events must be created with argument 'enable_timing=True'"):
        event.elapsed_time(torch.tpu.Event())
    with pytest.raises(ValueError, match="Both events must be recorded before calculating elapsed time"):
        torch.tpu.Event(enable_timing=True).elapsed_time(torch.tpu.Event(enable_timing=True))


def test_device_name_properties_and_memory_info():
    info = tpu_interactive.backend_info()
    props = torch.tpu.get_device_properties()
    assert props.name == torch.tpu.get_device_name() and info.device_kind in props.name
    assert props.total_memory == torch.tpu.mem_get_info()[1] > 0
    assert props.emulated == info.emulated and props.multi_processor_count >= 1
    assert torch.tpu.is_bf16_supported()
    free, total = torch.tpu.mem_get_info()
    assert 0 <= free <= total
    tpu_interactive.config.memory_limit_bytes = 10**9
    assert torch.tpu.mem_get_info() == (10**9 - torch.tpu.memory_reserved(), 10**9)


def test_memory_summary_table_shows_the_counters():
    gc.collect()
    x = torch.empty(12345, dtype=torch.uint8, device="tpu")
    text = torch.tpu.memory_summary()
    s = torch.tpu.memory_stats()
    allocated = next(line for line in text.splitlines() if line.startswith("Allocated memory"))
    cells = [c.strip() for c in allocated.split("|")[1:]]
    assert cells == [_fmt_bytes(s[f"allocated_bytes.all.{f}"]) for f in ("current", "peak", "allocated", "freed")]
    buffers = next(line for line in text.splitlines() if line.startswith("Allocations"))
    assert buffers.split("|")[1].strip() == str(s["allocation.all.current"])
    del x


# ---------------------------------------------------------------- E. complex random numbers
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_randn_and_rand_like_cpu(dtype):
    n = torch.randn(20000, dtype=dtype, device="tpu")
    u = torch.rand(20000, dtype=dtype, device="tpu")
    ref = torch.randn(20000, dtype=dtype)
    assert n.dtype == u.dtype == dtype and n.device.type == "tpu"
    n, u = n.cpu(), u.cpu()
    # CPU: real and imaginary parts independent N(0, 1/2) (total variance 1); rand: both U[0, 1)
    for part, ref_part in ((n.real, ref.real), (n.imag, ref.imag)):
        assert abs(part.mean()) < 0.02 and abs(part.var() - ref_part.var()) < 0.03
    assert abs((n.abs() ** 2).mean() - 1) < 0.03 and abs(torch.corrcoef(torch.stack([n.real, n.imag]))[0, 1]) < 0.03
    for part in (u.real, u.imag):
        assert 0 <= part.min() and part.max() < 1 and abs(part.mean() - 0.5) < 0.02
    g = torch.Generator(device="tpu").manual_seed(5)
    a = torch.empty(10, dtype=dtype, device="tpu").normal_(1.0, 2.0, generator=g)
    g.manual_seed(5)
    b = torch.empty(10, dtype=dtype, device="tpu").normal_(1.0, 2.0, generator=g)
    assert torch.equal(a.cpu(), b.cpu())


def test_a_torch_build_lock_left_by_a_killed_import_is_removed_not_waited_on(tmp_path):
    """torch waits forever on its build lock file; a process killed holding it (a launcher stopping a
    rank mid-import) left every later import hanging. Under this package's own lock, the only import in
    torch's ``load``, a lock file found was left by a dead process: it is removed, without a warning."""
    left = tmp_path / "lock"
    left.touch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with native.build_lock(str(tmp_path)):
            assert not left.exists()
        with native.build_lock(str(tmp_path / "new")):  # a first build: the folder is made
            assert (tmp_path / "new").is_dir()


_HOLD_BUILD_LOCK = """
import sys, time
from tpu_interactive.backend import native
with native.build_lock(sys.argv[1]):
    open(sys.argv[2], "w").close()
    time.sleep(600)
"""


def test_an_import_waits_while_another_holds_the_build_lock_and_goes_on_when_it_dies(tmp_path):
    """A second import waits for the one building (with a warning saying so); the kernel releases the
    lock of a process killed while holding it, so the wait ends then, not after a timeout."""
    import threading

    from helpers import ROOT

    ready = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_BUILD_LOCK, str(tmp_path), str(ready)], cwd=ROOT,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.05)
        killed_at: list = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            holder.kill()

        threading.Timer(0.8, kill).start()
        with pytest.warns(native.TPUNativeUnavailableWarning, match="waiting for another process building"):
            with native.build_lock(str(tmp_path), quiet_s=0.3):  # a wait this long is told
                got_it = time.monotonic()
        assert killed_at and killed_at[0] <= got_it < killed_at[0] + 10
    finally:
        holder.kill()
        holder.wait()
