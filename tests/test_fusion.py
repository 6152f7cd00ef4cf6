"""Fused eager mode (backend/fusion.py): results equal plain eager (and CPU), flush points, program
cache, Python scalars as inputs, RNG, errors at the recorded line with earlier state intact."""
import re
import signal
import sys

import jax
import pytest
import torch
from helpers import assert_same, fused_runs

import tpu_interactive
from tpu_interactive.backend import fast_path, fusion, recorded_step, segment_program, storage, unrecorded
from tpu_interactive.backend.config import config


@pytest.fixture(autouse=True)
def _plain_eager_by_default(monkeypatch):
    """These tests switch fused mode on themselves and compare with plain eager; segments donate what
    they overwrite, as on a TPU (off by default on XLA:CPU)."""
    monkeypatch.setattr(config, "fuse_donate", True)
    with tpu_interactive.fuse(False):
        yield


@pytest.fixture
def compiled_segments():
    """For tests that patch SegmentProgram.executable or raise SIGINT: a segment whose op sequence other
    tests ran with other shapes runs op by op, never calling it; and Ctrl-C must meet Python's own
    handler, whatever an earlier test in this worker left installed (failed in full xdist runs only)."""
    fusion.reset()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _mixed(x, w, idx):
    """Every kind of op fused mode records: elementwise with scalars, matmul, reductions, views,
    in-place writes through views, norms/softmax, indexing with valid indices, cat, where, casts."""
    y = (x @ w).relu() * 0.5 + 1.25
    y[:, 1:3].mul_(2.0)  # in-place through a view
    y.t()[0].add_(1.0)  # through a transposed view
    z = torch.softmax(y, dim=-1) + torch.nn.functional.layer_norm(y, y.shape[-1:])
    g = z.gather(1, idx) + z.index_select(0, idx[:, 0])[:, :2]
    c = torch.cat([z.sum(0, keepdim=True), z.amax(0, keepdim=True)])
    return torch.where(z > 0.3, z, -z).to(torch.float64).mean(1), g, c, y


def test_fused_results_equal_eager_and_cpu_and_the_program_is_cached():
    torch.manual_seed(0)
    x, w = torch.randn(5, 6), torch.randn(6, 4)
    idx = torch.tensor([[0, 3], [1, 1], [2, 0], [3, 2], [0, 1]])
    expected = _mixed(x, w, idx)
    eager = _mixed(x.to("tpu"), w.to("tpu"), idx.to("tpu"))
    before = tpu_interactive.stats()
    for _ in range(2):
        with tpu_interactive.fuse():
            got = _mixed(x.to("tpu"), w.to("tpu"), idx.to("tpu"))
            assert any(type(storage.buffer_of(t).array) is fusion.Lazy for t in got)  # recorded, not run
        for g, e, c in zip(got, eager, expected):
            # float32 arithmetic throughout (the float64 output is a cast at the end): float32 limits
            assert_same(g, c, rtol=1.3e-6, atol=1e-5)
            assert torch.equal(g.cpu(), e.cpu()) or torch.allclose(g.cpu(), e.cpu(), rtol=1e-6, atol=1e-6)
    runs = fused_runs(before)
    assert [r["mode"] for r in runs] == ["compiled", "cached"], runs
    assert runs[0]["ops"] > 15 and runs[0]["reason"] == "fused mode switched off"
    assert runs[0]["where"].endswith(f"test_fusion.py:{_mixed.__code__.co_firstlineno + 3}")


def test_broadcast_operand_dot_reduce_is_not_miscompiled():
    """jaxlib 0.10's XLA:CPU YNNPACK fusion computed sum(ones @ ones.T) at (64, 31) as inf/1e37; a fused
    segment holds exactly that program (compile_log.NO_YNN_FUSION_FLAG switches the fusion off)."""
    with tpu_interactive.fuse():
        x = torch.ones(64, 31, device="tpu")
        total = (x @ x.T).sum()
    assert total.item() == 64 * 64 * 31
    compiled = tpu_interactive.compile(lambda a: (a @ a.T).sum())
    assert compiled(torch.ones(64, 31, device="tpu")).item() == 64 * 64 * 31


def _train(fused: bool, opt_factory, dropout: float, steps: int = 5):
    torch.manual_seed(0)
    # no biases: a key bias's gradient is exactly zero in math, rounding noise in practice, which
    # Adam scales up to +-lr in any two runs that round differently
    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=True, bias=False)
    x, y = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    model, x, y = model.to("tpu"), x.to("tpu"), y.to("tpu")
    opt = opt_factory(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)  # a new Python-float lr every step
    losses = []
    with tpu_interactive.fuse(fused):
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("opt", ["adamw_foreach", "adamw_fused", "sgd_momentum"])
def test_training_steps_equal_plain_eager_and_stop_compiling(opt):
    factory = {"adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
               "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
               "sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)}[opt]
    eager_losses, eager_params = _train(False, factory, dropout=0.1)
    before = tpu_interactive.stats()
    losses, params = _train(True, factory, dropout=0.1)  # dropout: keys drawn as in plain eager
    assert losses == pytest.approx(eager_losses, rel=1e-5, abs=1e-6)
    for p, q in zip(params, eager_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    runs = fused_runs(before)
    # backward() runs what was recorded before it: the first forward alone, then the first step's
    # backward and update (which create the optimizer state) with the second forward, then the steady
    # program, which later steps reuse although the learning rate changes every step (a program
    # input, not a cache key); leaving fuse() runs the last backward and update
    assert [r["mode"] for r in runs[3:-1]] == ["cached"] * (len(runs) - 4), runs
    assert len(runs) == 6 and [r["reason"] for r in runs] == ["backward began"] * 5 + ["fused mode switched off"]


def _memory(t: torch.Tensor) -> int:
    return storage.buffer_of(t).value().unsafe_buffer_pointer()


@pytest.mark.parametrize("opt", ["adamw_foreach", "sgd_momentum", "adamw_embedding"])
def test_a_segment_updates_what_it_overwrites_in_place(opt):
    """The update's segment donates the parameters' and moments' old values (nothing else holds them):
    each new value takes its own old one's memory, as CUDA's in-place kernels, not a second copy of the
    model. A tensor sharing a parameter's array (copy_ made it share) keeps its value: that parameter
    alone moves to new memory. Values equal plain eager's. With an embedding, the segment checks its
    indices (traced in): it donates too, its checks run first (a failing one leaves the inputs whole:
    test_value_check_error_at_the_flush...)."""
    make = {"sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)}.get(
        opt, lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True))
    results = {}
    for fused in (False, True):
        torch.manual_seed(0)
        first = [torch.nn.Embedding(10, 8)] if opt == "adamw_embedding" else []
        model = torch.nn.Sequential(*first, torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
        x = torch.randint(0, 10, (5,), device="tpu") if first else torch.randn(5, 8, device="tpu")
        y = torch.randn(5, 4, device="tpu")
        opt_ = make(model.parameters())
        params = list(model.parameters())
        snapshot = torch.empty_like(params[0]).requires_grad_(False)
        moved, losses, last = [], [], []
        with tpu_interactive.fuse(fused):
            for step in range(6):
                if step == 3:
                    with tpu_interactive.fuse(False):
                        snapshot.copy_(params[0].detach())  # shares the parameter's array
                    first = snapshot.cpu()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()  # runs the last update with this forward (an embedding's checks among them)
                state = [t for p in params for t in opt_.state[p].values() if t.dim()]
                where = [_memory(t) for t in params + state]  # (runs this backward)
                if step >= 2:
                    moved.append([a != b for a, b in zip(last, where)])
                last = where
                losses.append(loss.item())
                opt_.step()
                opt_.zero_grad()
        if fused:  # (the first update may move a parameter: on XLA:CPU `.to()` can alias host memory)
            n = len(moved[0])  # the snapshot was taken before step 3's update ran (in step 4's segment)
            assert moved == [[False] * n, [False] * n, [True] + [False] * (n - 1), [False] * n], moved
        assert torch.equal(snapshot.cpu(), first)
        results[fused] = losses, [p.detach().cpu() for p in params]
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-6)
    for p, q in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_by_default_segments_donate_arrays_from_1_mib_and_not_on_xla_cpu(monkeypatch):
    monkeypatch.setattr(config, "fuse_donate", None)
    on_cpu = jax.devices()[0].platform == "cpu"
    assert segment_program.donation_floor() == (None if on_cpu else segment_program.DONATE_MIN_BYTES)
    small, large = torch.zeros(64, device="tpu"), torch.zeros(512, 512, device="tpu")  # 1 MiB
    where = {}
    with tpu_interactive.fuse():
        for step in range(3):
            small.add_(1)
            large.add_(1)
            small.sum().item()
            if step >= 1:  # (the first write's old value may be a shared zeros array)
                where.setdefault("small", set()).add(_memory(small))
                where.setdefault("large", set()).add(_memory(large))
    assert len(where["small"]) == 2  # a small array gets new memory every step
    assert len(where["large"]) == (2 if on_cpu else 1)
    assert torch.equal(large.cpu(), torch.full((512, 512), 3.0)) and torch.equal(small.cpu(), torch.full((64,), 3.0))


def _runs_wrapped(wrap):
    """SegmentProgram.executable, its program's run replaced by ``wrap(run)``."""
    original = segment_program.SegmentProgram.executable

    def executable(self, *args):
        run, inputs, positions = original(self, *args)
        return wrap(run), inputs, positions

    return executable


def _interrupted_as_it_starts(run):
    def call(*inputs):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C just as it starts
        return run(*inputs)

    return call


def _failing_after_it_ran(exc: BaseException):
    def wrap(run):
        def call(*inputs):
            run(*inputs)
            raise exc

        return call

    return wrap


def test_ctrl_c_while_a_donating_program_starts_raises_after_its_results_are_kept(monkeypatch, compiled_segments):
    """Its donated inputs are gone once it starts, so the segment could not run again: the interrupt
    is raised after the results are handed out, and every tensor has its new value."""
    x = torch.zeros(16, device="tpu")
    with tpu_interactive.fuse():
        x.add_(1)
        x.sum().item()  # x's array now held by x alone: the next segment donates it
        monkeypatch.setattr(segment_program.SegmentProgram, "executable", _runs_wrapped(_interrupted_as_it_starts))
        x.add_(1)
        y = x * 3
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        monkeypatch.undo()
        assert fusion.current() is None  # not kept pending: it ran
        assert torch.equal(x.cpu(), torch.full((16,), 2.0)) and torch.equal(y.cpu(), torch.full((16,), 6.0))


def test_a_program_that_fails_after_taking_its_inputs_says_so(monkeypatch, compiled_segments):
    """A device error after the program started (its donated inputs are gone): no op-by-op re-run
    from deleted arrays, but an error that says what happened."""
    x = torch.zeros(16, device="tpu")
    keep = torch.ones(4, device="tpu")
    with tpu_interactive.fuse():
        x.add_(1)
        x.sum().item()
        monkeypatch.setattr(segment_program.SegmentProgram, "executable",
                            _runs_wrapped(_failing_after_it_ran(RuntimeError("RESOURCE_EXHAUSTED: simulated"))))
        x.add_(1)
        with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED: simulated.*values it was overwriting are lost"):
            x.sum().item()
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match="never computed: the fused segment .* failed earlier"):
            x.cpu()  # its donated value is gone: said so, not "Array has been deleted"
    assert torch.equal(keep.cpu(), torch.ones(4))


def test_an_asynchronous_interrupt_after_the_program_took_its_inputs_loses_only_its_values(
        monkeypatch, compiled_segments):
    """An interrupt that is not SIGINT (PyThreadState_SetAsyncExc, an exception from a trace function)
    is not deferred: landing after the program ran, its donated inputs and results are both gone. The
    segment must not be queued again (every later flush would fail on deleted buffers): its values say
    they are lost, other tensors and later work are unharmed."""
    x = torch.zeros(16, device="tpu")
    keep = torch.ones(4, device="tpu")
    with tpu_interactive.fuse():
        x.add_(1)
        x.sum().item()  # x's array now held by x alone: the next segment donates it
        monkeypatch.setattr(segment_program.SegmentProgram, "executable",
                            _runs_wrapped(_failing_after_it_ran(KeyboardInterrupt())))
        x.add_(1)
        with pytest.raises(KeyboardInterrupt):
            x.sum().item()
        monkeypatch.undo()
        assert fusion.current() is None
        with pytest.raises(RuntimeError, match="interrupted while running; 1 values it was overwriting are lost"):
            x.cpu()
        assert torch.equal(keep.cpu(), torch.ones(4))
        z = torch.arange(4.0, device="tpu")
        z.mul_(2)
        assert (z + keep).sum().item() == 16.0
    assert torch.equal((z * keep).cpu(), torch.tensor([0.0, 2.0, 4.0, 6.0]))


def test_python_scalars_are_inputs_not_cache_keys():
    x = torch.randn(8, device="tpu")
    before = tpu_interactive.stats()
    outs = []
    with tpu_interactive.fuse():
        for step in range(5):
            outs.append((x * (0.1 * step) + step / 7).sum().item())
    assert outs == pytest.approx([(x.cpu() * (0.1 * s) + s / 7).sum().item() for s in range(5)], rel=1e-6)
    assert [r["mode"] for r in fused_runs(before)] == ["compiled"] + ["cached"] * 4


@pytest.mark.parametrize("fused", [False, True])
def test_python_floats_keep_their_weak_type_sign_and_nan(fused):
    """Plain eager passes a Python float as a cached device scalar, fused mode packs a segment's
    floats into one array: both must keep what jit gives a Python float (a weak type: a bf16 tensor
    times 1.1 stays bf16, an int tensor times 0.5 becomes float32), -0.0's sign, NaN and inf."""
    from tpu_interactive.backend import op_jit

    cpu_b, cpu_i = torch.randn(6).bfloat16(), torch.arange(6)
    b, i = cpu_b.to("tpu"), cpu_i.to("tpu")
    cases = [lambda b, i: b * 1.1, lambda b, i: i * 0.5, lambda b, i: b.float() * -0.0,
             lambda b, i: i.float() * 0.0, lambda b, i: b + float("nan"), lambda b, i: i.float() / float("inf"),
             lambda b, i: torch.clamp(b, -0.25, 0.5) + 1e-3]
    with tpu_interactive.fuse(fused):
        got = [case(b, i) for case in cases]
        twice = b * 1.1  # the same constant again: plain eager reuses its device scalar
    for case, out in zip(cases, got):
        want = case(cpu_b, cpu_i)
        assert out.dtype == want.dtype
        assert_same(out, want, 0, 0)
        assert torch.equal(torch.signbit(out.cpu()), torch.signbit(want))  # -0.0 stays -0.0
    assert_same(twice, cases[0](cpu_b, cpu_i), 0, 0)
    if not fused:
        assert op_jit._device_scalar(1.1) is op_jit._device_scalar(1.1)
        assert op_jit._device_scalar(-0.0) is not op_jit._device_scalar(0.0)


def test_random_ops_match_plain_eager_bit_for_bit():
    def draw():
        torch.manual_seed(123)
        a = torch.rand(4, 5, device="tpu")
        b = torch.nn.functional.dropout(torch.ones(6, 6, device="tpu"), 0.4)
        c = torch.randn(3, device="tpu") * a.sum()
        return [t.cpu() for t in (a, b, c)]

    eager = draw()
    with tpu_interactive.fuse():
        fused = draw()
        again = draw()
    for e, f, g in zip(eager, fused, again):
        assert torch.equal(e, f) and torch.equal(e, g)


@pytest.mark.parametrize("point", ["item", "cpu", "repr", "bool", "synchronize", "op_limit", "sync_mode", "exit"])
def test_flush_points(point, monkeypatch):
    monkeypatch.setattr(config, "fuse_max_ops", 4 if point == "op_limit" else config.fuse_max_ops)
    x = torch.arange(6.0, device="tpu")
    with tpu_interactive.fuse():
        y = x * 2 + 1
        assert fusion.current() is not None and fusion.current().steps
        if point == "item":
            assert y.sum().item() == 36.0
        elif point == "cpu":
            assert y.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        elif point == "repr":
            assert "11." in repr(y)
        elif point == "bool":
            assert bool((y > 0).all())
        elif point == "synchronize":
            torch.tpu.synchronize()
        elif point == "op_limit":
            y = y - 1 + 1  # the 4th op reaches the limit
        elif point == "sync_mode":
            with tpu_interactive.sync_mode(True):
                z = y + 1  # sync mode records nothing: this op runs now, after the segment
                assert type(storage.buffer_of(z).array) is not fusion.Lazy
                assert z.cpu().tolist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    if point == "exit":
        assert fusion.current() is None
    else:
        assert fusion.current() is None or point == "sync_mode" or not fusion.current().steps
    assert y.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]


def _pending(array) -> bool:
    return type(array) is fusion.Lazy and array.value is None and array.error is None


def test_backward_runs_the_forward_and_records_itself():
    """backward() is a flush point: the forward (and what came before it) runs as the backward begins,
    the backward and the update are recorded, and ``loss.item()`` does not wait for them. A gradient
    penalty (a backward inside the step, create_graph=True) gives plain eager's values."""
    torch.manual_seed(0)
    w0, x0 = torch.randn(4, 3), torch.randn(5, 4)

    def step(w, x):
        loss = ((x @ w).tanh() ** 2).sum()
        (g,) = torch.autograd.grad(loss, w, create_graph=True)
        (loss + g.pow(2).sum()).backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
        return loss

    cpu_w = w0.clone().requires_grad_()
    cpu_loss = step(cpu_w, x0).item()
    eager_w = w0.to("tpu").requires_grad_()
    eager_loss = step(eager_w, x0.to("tpu")).item()
    w, x = w0.to("tpu").requires_grad_(), x0.to("tpu")
    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        loss = step(w, x)
        # ran when the first backward began (a buffer may still hold its Lazy, holding the value: an op
        # recorded from a C++ plan reads it without swapping the array in)
        assert not _pending(storage.buffer_of(loss).array)
        assert _pending(storage.buffer_of(w).array)  # the update: recorded, pending
        assert loss.item() == pytest.approx(eager_loss, rel=1e-6)
        assert _pending(storage.buffer_of(w).array)  # item() needed only the forward
    assert [r["reason"] for r in fused_runs(before)] == ["backward began"] * 2 + ["fused mode switched off"]
    torch.testing.assert_close(w.detach().cpu(), eager_w.detach().cpu(), rtol=1e-5, atol=1e-6)
    # and CPU's (a TPU's default float32 matmul precision: its w differed by 1.5e-3 relative)
    tol = {"rtol": 1e-4, "atol": 1e-5} if jax.devices()[0].platform == "cpu" else {"rtol": 1e-2, "atol": 1e-3}
    assert eager_loss == pytest.approx(cpu_loss, rel=tol["rtol"])
    torch.testing.assert_close(w.detach().cpu(), cpu_w.detach(), **tol)


def test_shape_error_raises_at_the_op_with_eager_message():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(4, 5, device="tpu")
    with pytest.raises(RuntimeError) as eager:
        a @ b
    with tpu_interactive.fuse():
        kept = a * 2
        with pytest.raises(RuntimeError) as fused:
            a @ b  # torch's meta kernel runs when the op is recorded
    assert str(fused.value).splitlines()[0] == str(eager.value).splitlines()[0]
    assert f"test_fusion.py:{sys._getframe().f_lineno - 2}" in str(fused.value)
    assert torch.equal(kept.cpu(), a.cpu() * 2)


def test_value_check_error_at_the_flush_names_the_recorded_line_and_keeps_earlier_state():
    base = torch.arange(12.0).reshape(3, 4)
    x, before_op, after_op = base.to("tpu"), base.clone().to("tpu"), base.clone().to("tpu")
    bad = torch.tensor([[0, 9]], device="tpu")
    with pytest.raises(RuntimeError) as eager:
        x.gather(1, bad).cpu()
    with tpu_interactive.fuse():
        before_op.add_(1)  # recorded before the failing op: applied, as in plain eager
        out = x.gather(1, bad)
        line = sys._getframe().f_lineno - 1
        after_op.mul_(10)  # recorded after it: plain eager never got here, so it is undone
        fresh = x + 1
        with pytest.raises(RuntimeError) as fused:
            out.cpu()
    text = str(fused.value)
    assert text.splitlines()[0] == str(eager.value).splitlines()[0]
    assert "aten::gather" in text and f"test_fusion.py:{line}" in text and "recorded in fused mode" in text
    assert torch.equal(before_op.cpu(), base + 1)
    assert torch.equal(after_op.cpu(), base)
    assert torch.equal(x.cpu(), base)
    with pytest.raises(RuntimeError, match="never computed"):
        fresh.cpu()
    assert torch.equal((x + 1).cpu(), base + 1)  # the device keeps working


def test_repeated_calls_are_recorded_from_cpp_record_plans_with_the_same_results():
    """A call whose key was recorded before is recorded again by the C++ fast path (no Python
    dispatch): views read in the op's program, an in-place write through a view, Python floats."""
    if fast_path._native is None:
        pytest.skip("the C++ extension is not built here")
    x, w, b = torch.randn(16, 8, device="tpu"), torch.randn(8, 8, device="tpu"), torch.randn(8, device="tpu")

    def step(v, scale):
        h = torch.relu(v @ w + b) * scale
        h[:, :2].mul_(2.0)
        return h.sum(1), h.t()[1:3]

    expected = [[t.cpu() for t in step(x, 0.5 + i)] for i in range(4)]
    with tpu_interactive.fuse():
        fusion.flush()
        before = fast_path.recorded()
        outs = [step(x, 0.5 + i) for i in range(4)]
        recorded = fast_path.recorded() - before
        steps = len(fusion.current().steps)
    assert recorded >= 3 * 6 and steps == 4 * 6, (recorded, steps)  # matmul add relu mul mul_ sum
    for got, want in zip(outs, expected):
        for g, e in zip(got, want):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-6, atol=1e-6)


def test_copies_record_one_step_from_cpp_and_a_whole_buffers_copy_none():
    """A whole buffer's copy is no step (the new tensor holds the same recorded value, as torch's
    composite kernel leaves it); a view's copy and a cast are one step, recorded from a C++ record plan
    on a repeat (not empty_like + copy_ through Python: a cast of a view was a read and a write). Each
    copy is a tensor of its own: writing the source afterwards leaves it as it was."""
    base = torch.randn(6, 5)
    copies = {"clone": lambda t: t.clone(), ".contiguous() of a transpose": lambda t: t.t().contiguous(),
              "clone of a slice": lambda t: t[1:4].clone(), ".to(dtype)": lambda t: t.to(torch.bfloat16),
              ".to(dtype) of a slice": lambda t: t[1:4].to(torch.float16),
              ".contiguous() of a column": lambda t: t[:, 2].contiguous()}
    for name, copy in copies.items():
        want = copy(base)
        x = base.to("tpu")
        with tpu_interactive.fuse():
            fusion.flush()
            before = fast_path.recorded()
            outs = [copy(x) for _ in range(3)]
            steps, recorded = len(fusion.current().steps) if fusion.current() else 0, fast_path.recorded() - before
            x.mul_(2)  # the copies keep the value they were made with
        assert steps == (0 if name == "clone" else 3), (name, steps)
        if fast_path._native is not None and name != "clone":
            assert recorded == 2, (name, recorded)  # the second and third from the first's record plan
        for out in outs:
            assert out.is_contiguous() and out.dtype == want.dtype and out.shape == want.shape, name
            assert_same(out, want, 0, 0)


def test_a_failing_segment_recorded_from_cpp_plans_keeps_earlier_state():
    """The same failure, three times: from the second on the ops are recorded by C++ record plans,
    whose in-place writes are in the segment's undo log as the Python path's are."""
    base = torch.arange(12.0).reshape(3, 4)
    bad = torch.tensor([[0, 9]], device="tpu")
    before_recorded = fast_path.recorded()
    for _ in range(3):
        x, before_op, after_op = base.to("tpu"), base.clone().to("tpu"), base.clone().to("tpu")
        with tpu_interactive.fuse():
            before_op.add_(1)
            out = x.gather(1, bad)
            line = sys._getframe().f_lineno - 1
            after_op.mul_(10)
            with pytest.raises(RuntimeError) as fused:
                out.cpu()
        assert f"test_fusion.py:{line}" in str(fused.value) and "aten::gather" in str(fused.value)
        assert torch.equal(before_op.cpu(), base + 1)
        assert torch.equal(after_op.cpu(), base)
    assert fast_path._native is None or fast_path.recorded() > before_recorded


def test_out_of_memory_raises_at_the_op_and_keeps_tensors(monkeypatch):
    x = torch.ones(1000, device="tpu")
    with tpu_interactive.fuse():
        y = x + 1
        used = tpu_interactive.memory_stats()["tracked_bytes_in_use"]  # what the limit counts
        monkeypatch.setattr(config, "memory_limit_bytes", used + 100)
        with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
            torch.empty(10_000, device="tpu").fill_(1)
        monkeypatch.setattr(config, "memory_limit_bytes", None)
    assert torch.equal(y.cpu(), torch.full((1000,), 2.0))


def test_keyboard_interrupt_during_the_compile_keeps_the_segment(monkeypatch, compiled_segments):
    original = segment_program.SegmentProgram.executable
    calls = []

    def interrupted(self, *args):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return original(self, *args)

    monkeypatch.setattr(segment_program.SegmentProgram, "executable", interrupted)
    x = torch.randn(7, device="tpu")
    with tpu_interactive.fuse():
        y = (x * 3).exp()
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        # the next flush runs the same segment (a TPU's float32 exp differs from CPU's at 2.6e-6 relative)
        torch.testing.assert_close(y.cpu(), (x.cpu() * 3).exp(), rtol=1e-5, atol=1e-5)


def test_keyboard_interrupt_inside_the_compile_loses_no_recorded_op(monkeypatch):
    """Ctrl-C while XLA compiles a new segment (before anything ran): its ops stay pending and the
    next read runs them all (the segment used to be dropped, leaving tensors never computed)."""
    original = segment_program.SegmentProgram.__init__
    calls = []

    def interrupted(self, *args):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        original(self, *args)

    monkeypatch.setattr(segment_program.SegmentProgram, "__init__", interrupted)
    x = torch.zeros(5, device="tpu")
    with tpu_interactive.fuse():
        for _ in range(7):
            x.add_(1)
        y = x * 2
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        assert x.cpu().tolist() == [7.0] * 5 and y.cpu().tolist() == [14.0] * 5
        x.add_(1)
    assert x.cpu().tolist() == [8.0] * 5


def test_keyboard_interrupt_while_running_op_by_op_leaves_a_consistent_prefix(monkeypatch):
    """Ctrl-C between the ops of a segment run op by op: the ops before it are applied, the later
    writes undone, and their results say why they have no value; the tensors keep working."""
    monkeypatch.setattr(segment_program, "plan", lambda seg, ops, live: (None, ""))  # op by op
    original, ran = recorded_step.Step.run_eager, []

    def run_eager(step, keys, inputs):
        if len(ran) == 3:
            ran.append("interrupted")
            raise KeyboardInterrupt
        ran.append(1)
        return original(step, keys, inputs)

    monkeypatch.setattr(recorded_step.Step, "run_eager", run_eager)
    x = torch.zeros(4, device="tpu")
    x.cpu()
    with tpu_interactive.fuse():
        for _ in range(6):
            x.add_(1)
        y = x + 0
        with pytest.raises(KeyboardInterrupt):
            x.cpu()
        assert x.cpu().tolist() == [3.0] * 4  # three complete updates, never a torn one
        with pytest.raises(RuntimeError, match="never computed"):
            y.cpu()
        x.add_(1)
    assert x.cpu().tolist() == [4.0] * 4


def test_a_long_chain_of_dependent_ops_is_cut_into_segments():
    """XLA:CPU compiles an elementwise chain by recursion: ~7,000 chained in-place adds in one fused
    program overflowed its compile thread's stack (a segfault that killed the kernel)."""
    before = tpu_interactive.stats()
    x, base = torch.zeros(8, device="tpu"), torch.ones(8, device="tpu")
    with tpu_interactive.fuse():
        for _ in range(3 * config.fuse_max_depth + 5):
            x.add_(1)
        assert x.cpu().tolist() == [3.0 * config.fuse_max_depth + 5] * 8
        ys = [base * i for i in range(config.fuse_max_depth + 5)]  # many ops, no chain: one segment
        assert ys[-1].cpu().tolist() == [config.fuse_max_depth + 4.0] * 8
    reasons = [r["reason"] for r in fused_runs(before)]
    assert reasons == ["dependency-chain limit"] * 3 + ["a value was needed"] * 2, reasons


def test_shape_changing_loop_runs_op_by_op_after_the_first_variants():
    before = tpu_interactive.stats()
    x = torch.randn(40, device="tpu")
    with tpu_interactive.fuse():
        sums = [(x[:n] * 2 + 1).sum().item() for n in range(5, 12)]
    assert sums == pytest.approx([(x.cpu()[:n] * 2 + 1).sum().item() for n in range(5, 12)], rel=1e-5)
    runs = fused_runs(before)
    n = config.fuse_variants
    assert [r["mode"] for r in runs[:n]] == ["compiled"] * n and runs[n]["mode"] == "op by op", runs
    assert {r["mode"] for r in runs[n:]} == {"op by op", "not recorded"}, runs  # see the next test
    assert "pad or bucket" in runs[n]["cause"]


def test_results_kept_by_a_cycle_or_fewer_results_compile_no_new_program():
    x = torch.randn(16, device="tpu")

    def run(keep: str):
        with tpu_interactive.fuse():
            y = x * 2
            z = (y + 1).relu()
            kept = y if keep == "y" else None
            if keep == "cycle":  # y is referenced only by a cycle the collector has not reached yet
                cycle: list = [y]
                cycle.append(cycle)
                del cycle
            del y
            before = tpu_interactive.stats()
        (run,) = fused_runs(before)
        assert_same(z, ((x.cpu() * 2) + 1).relu())
        if kept is not None:
            assert_same(kept, x.cpu() * 2)
        return run["mode"]

    import gc

    run("")  # torch's first calls of an op may leave cycles of their own: start the test after them
    gc.collect()
    fusion.reset()
    gc.disable()  # the test's cycle must still be there when its segment runs
    try:
        assert run("") == "compiled"
        assert run("cycle") == "cached"  # the collector runs before a new variant is compiled
        assert run("y") == "compiled"  # y really kept: one program returning both results ...
        assert run("") == "cached"  # ... which then serves the segment keeping z only
        assert run("y") == "cached"
    finally:
        gc.enable()


def test_a_segment_run_op_by_op_runs_on_the_programs_plain_eager_compiled():
    """A segment past its variants runs op by op as plain eager ran its calls, on the programs plain
    eager compiled for those shapes: a cat of a list holding a view (a KV cache's append) runs
    primitive by primitive, and the view is read by read's program. generate()'s probes compiled a
    cat and a view read for every new length."""
    x = torch.randn(1, 40, 4, generator=torch.Generator().manual_seed(0)).to("tpu")

    def step(n, x=x):
        return torch.cat([x[:, :n], x[:, n:n + 1] * 2], dim=1).sum().item()

    want = [step(n) for n in range(3, 3 + config.fuse_variants + 3)]  # plain eager: compiles these shapes
    # (a sum's order differs from CPU's: a few ulps of the largest partial sum)
    assert want == pytest.approx([step(n, x.cpu()) for n in range(3, 3 + config.fuse_variants + 3)], rel=1e-5)
    with tpu_interactive.fuse():
        for n in range(3, 3 + config.fuse_variants):  # the segment's variants (compiled: new programs)
            step(n)
    unrecorded.forget()  # so that the next ones are recorded, and run op by op
    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        got = [step(n) for n in range(3 + config.fuse_variants, 3 + config.fuse_variants + 2)]
    assert got == want[config.fuse_variants:config.fuse_variants + 2]
    assert [r["mode"] for r in fused_runs(before)] == ["op by op"] * 2
    assert tpu_interactive.stats()["xla_compiles"] == before["xla_compiles"]


def test_a_segment_that_keeps_running_op_by_op_is_not_recorded():
    """After two op-by-op runs of the same segment, the next ones starting at the same op and line
    run as plain eager (the C++ fast path included) up to the host read; after 8 of them one is
    recorded again (a probe: have the shapes come back to a compiled variant?), then after 32, ..."""

    x = torch.randn(80, device="tpu")
    want = [(x.cpu()[:n] * 2 + 1).sum().item() for n in range(5, 30)]

    def sums_of(lengths):
        return [(x[:n] * 2 + 1).sum().item() for n in lengths]

    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        sums = sums_of(range(5, 30))
        assert not unrecorded.running()  # the host read ended the last stretch
    assert sums == pytest.approx(want, rel=1e-5)
    modes = [r["mode"] for r in fused_runs(before)]
    n = config.fuse_variants
    assert modes[:n + 2] == ["compiled"] * n + ["op by op"] * 2, modes
    rest = modes[n + 2:]
    first = unrecorded.FIRST_PROBE  # unrecorded ones before the first probe (then twice as many, ...)
    assert rest == ["not recorded"] * first + ["op by op"] + ["not recorded"] * (len(sums) - n - 3 - first), modes
    ops = [r["ops"] for r in fused_runs(before)]
    # mul, add, sum when recorded, and the x[:n] read: a step of its own, or read inside mul's program
    # when the C++ fast path's record plan keyed the call (the view read from its buffer)
    recorded = 3 if fast_path._native is not None else 4
    assert ops == [recorded if mode != "not recorded" else 0 for mode in modes]
    unrecorded_runs = tpu_interactive.stats()["fused_not_recorded"] - before["fused_not_recorded"]
    assert unrecorded_runs == modes.count("not recorded")
    from tpu_interactive.session.summary import cache_text

    assert "not recorded (new shapes each time: run as plain eager)" in cache_text()

    # the shapes come back to a compiled variant: the next probe finds its program, and fusing resumes
    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        again = sums_of([5] * 40)
    assert again == pytest.approx(want[:1] * 40, rel=1e-5)
    modes = [r["mode"] for r in fused_runs(before)]
    resumed = modes.index("cached")
    assert set(modes[:resumed]) == {"not recorded"} and modes[resumed:] == ["cached"] * (40 - resumed), modes


def test_lines_are_found_when_the_package_is_imported_through_a_relative_path(tmp_path):
    """Benchmarks import the package as 'benchmarks/../tpu_interactive': its frames are still ours, so
    segments and errors name the user's line, and unrecorded stretches find their start again."""
    import os
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(tpu_interactive.__file__)))
    script = tmp_path / "loop.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(repo, 'benchmarks', '..')!r})\n"
        "import torch, tpu_interactive\n"
        "assert '..' in tpu_interactive.__file__, tpu_interactive.__file__\n"
        "x = torch.randn(40, device='tpu')\n"
        "with tpu_interactive.fuse():\n"
        "    sums = [(x[:n] * 2 + 1).sum().item() for n in range(5, 20)]\n"
        "runs = tpu_interactive.stats()['recent_fused']\n"
        "print(sorted({r['where'] for r in runs}), [r['mode'] for r in runs])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"['{script}:7']" in out.stdout and "'not recorded'" in out.stdout, out.stdout


def test_a_training_loop_whose_lengths_keep_changing_runs_unrecorded_from_its_backward():
    """A training step's segment starts where autograd's backward begins (the backward and update, then
    the next forward): when it keeps running op by op (a new sequence length each step), it goes
    unrecorded from there too, and the loop runs as plain eager (it recorded every step before)."""
    torch.manual_seed(0)
    lengths = [9, 14, 11, 20, 7, 16, 12, 18, 10, 15, 13, 19, 8, 17]
    data = [(torch.randn(4, n, 8), torch.randn(4, n, 8)) for n in lengths]
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))

    def train(model, device, fused=False):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        with tpu_interactive.fuse(fused):
            for x, y in data:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, [p.detach() for p in model.parameters()]

    import copy

    expected = train(copy.deepcopy(cpu_model), "cpu")
    eager = train(copy.deepcopy(cpu_model).to("tpu"), "tpu")
    before = tpu_interactive.stats()
    fused = train(copy.deepcopy(cpu_model).to("tpu"), "tpu", fused=True)
    runs = fused_runs(before)
    assert fused[0] == pytest.approx(eager[0], rel=1e-5) and fused[0] == pytest.approx(expected[0], rel=1e-4)
    for got, want in zip(fused[1], expected[1]):
        assert_same(got, want, rtol=1e-4, atol=1e-5)
    modes = [r["mode"] for r in runs]
    # the first steps compile variants and run op by op; then the steps go unrecorded (a probe after 8)
    assert modes.count("not recorded") >= len(lengths) // 2, modes
    assert modes[-4:] == ["not recorded"] * 4, modes


def test_an_unrecorded_stretch_ends_where_a_data_dependent_op_would_flush_its_segment():
    """A stretch ends where its recorded segment would have been flushed by an op with a data-dependent
    shape (not only at host reads), so the segment after it, which fuses, is still recorded (a padded
    batch's generate(): its decode step ran in pieces only until a small segment before it went
    unrecorded and swallowed it)."""
    x, w = torch.randn(64, device="tpu"), torch.randn(8, 8, device="tpu") * 0.3

    def loop(fused: bool) -> torch.Tensor:
        h = torch.ones(1, 8, device="tpu")
        with tpu_interactive.fuse(fused):
            for n in range(4, 20):
                found = torch.nonzero((x[:n] * 2 + 1) > 100)  # new shapes each step, cut by the nonzero
                h = torch.tanh(h @ w) * 0.5 + h + found.shape[0]
                h.sum().item()
        return h

    eager = loop(False)
    before = tpu_interactive.stats()
    h = loop(True)
    expected = torch.ones(1, 8)
    for _ in range(4, 20):
        expected = torch.tanh(expected @ w.cpu()) * 0.5 + expected
    assert_same(h, eager.cpu(), rtol=1e-5, atol=1e-5)
    # and CPU's (a TPU's default float32 matmul precision: 6e-3 relative after 16 steps on a v5e)
    tol = {"rtol": 1e-5, "atol": 1e-5} if jax.devices()[0].platform == "cpu" else {"rtol": 2e-2, "atol": 1e-3}
    assert_same(h, expected, **tol)
    modes = [(r["mode"], r["ops"]) for r in fused_runs(before)]
    assert modes.count(("not recorded", 0)) >= 8, modes  # the shape-changing stretch, after its variants
    fixed = [mode for mode, ops in modes if ops == 6]  # matmul, tanh, mul, add, add, sum: fixed shapes
    assert fixed == ["compiled"] + ["cached"] * 15, modes


def test_an_unrecorded_stretch_ends_at_every_flush_point(monkeypatch):
    """It runs as plain eager (warm ops from the C++ fast path's plans) until a host read,
    synchronize() or the end of fused mode."""
    from tpu_interactive.backend import dispatch, fast_path

    x = torch.randn(80, device="tpu")

    def step(n):
        return x[:n] * 2 + 1

    with tpu_interactive.fuse():
        for n in range(5, 12):
            step(n).sum().item()
        y = step(13)
        assert unrecorded.running() and type(storage.buffer_of(y).array) is not fusion.Lazy
        if fast_path._native is not None:
            python_runs = []
            original = dispatch._run_lowering
            monkeypatch.setattr(dispatch, "_run_lowering", lambda *a, **k: python_runs.append(1) or original(*a, **k))
            tripled = [x * 3 for _ in range(4)]
            assert len(python_runs) <= 1, python_runs  # the first call offers the plan, the rest run from it
            monkeypatch.undo()
            assert unrecorded.running()
            assert_same(tripled[-1], x.cpu() * 3)
            assert not unrecorded.running()  # the host read ended it
            step(14)
            assert unrecorded.running()
        torch.tpu.synchronize()
        assert not unrecorded.running()
        step(15)
        assert unrecorded.running()
    assert not unrecorded.running() and not fusion.active()  # leaving fused mode ended it


@pytest.mark.parametrize("start", ["copy_ from a slice", ".contiguous() of a slice"])
def test_the_op_that_starts_an_unrecorded_stretch_runs_as_one_program(monkeypatch, start):
    """A stretch that starts with a view's read (``copy_`` from a slice, as a decode step's cache
    update does) or an op's program (a view's copy) runs it as one program, as plain eager would,
    not primitive by primitive."""
    from jax._src import dispatch as jax_dispatch

    x = torch.randn(80, 2, device="tpu")
    outside_programs = []
    original = jax_dispatch.apply_primitive
    with tpu_interactive.fuse():
        for n in range(5, 30):
            if n == 20:  # the stretches have started by now
                monkeypatch.setattr(jax_dispatch, "apply_primitive",
                                    lambda prim, *a, **k: outside_programs.append(prim) or original(prim, *a, **k))
            if start == "copy_ from a slice":
                y = torch.empty(n, 2, device="tpu")
                y.copy_(x[1:n + 1])
            else:
                y = x[1:n + 1].t().contiguous()
            assert y.sum().item() == pytest.approx(x.cpu()[1:n + 1].sum().item(), rel=1e-5, abs=1e-5)
    assert outside_programs == []
    assert any(r["mode"] == "not recorded" for r in tpu_interactive.stats()["recent_fused"])


def test_generate_fused_equals_eager_and_does_not_compile_per_token():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval().to("tpu")
    prompt = torch.tensor([[1, 5, 9, 3]], device="tpu")
    kwargs = dict(do_sample=False, pad_token_id=0)
    with torch.no_grad():
        eager = model.generate(prompt, max_new_tokens=16, **kwargs).cpu()
        with tpu_interactive.fuse():
            first = model.generate(prompt, max_new_tokens=8, **kwargs).cpu()
            before = tpu_interactive.stats()
            fused = model.generate(prompt, max_new_tokens=16, **kwargs).cpu()
    assert torch.equal(first, eager[:, :12]) and torch.equal(fused, eager)
    runs = fused_runs(before)
    # twice the tokens, no program per token: each decode step's shapes differ, so after the first
    # variants the decode segment runs op by op instead of compiling once per token
    compiled = [r for r in runs if r["mode"] == "compiled"]
    # this call is another line, so its decode loop gets its own fuse_variants variants (a loop is
    # the same ops recorded from the same line); one more if it keeps results the first call did not
    assert len(compiled) <= config.fuse_variants + 1, runs
    assert sum(r["mode"] in ("op by op", "in pieces") for r in runs) >= 8, runs
    # past the first run op by op, the steps whose shapes stay (projections, MLPs) run as fused pieces
    assert [r["mode"] for r in runs].count("in pieces") >= 6 and "fused pieces" in runs[-1]["cause"], runs
    with torch.no_grad(), tpu_interactive.fuse():
        for _ in range(3):  # the same call again and again (one line): nothing is new, nothing compiles
            before = tpu_interactive.stats()
            again = model.generate(prompt, max_new_tokens=16, **kwargs).cpu()
    assert torch.equal(again, eager)
    assert not [r for r in fused_runs(before) if r["mode"] == "compiled"], fused_runs(before)
    assert tpu_interactive.stats()["xla_compiles"] == before["xla_compiles"]  # pieces included


def test_magics_and_switches(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext tpu_interactive")
    shell.run_cell("import torch, tpu_interactive")
    capsys.readouterr()
    result = shell.run_cell("%%tpu --fuse\nx = torch.ones(4, 4)\ny = (x @ x).relu() + 1\n")
    out = capsys.readouterr().out
    assert result.success and re.search(r"fused\s+1 segment of \d+ recorded ops: 0 from a cached program, 1 compiled", out), out
    assert config.fuse is False and fusion.current() is None  # the cell's ops ran within the cell
    assert torch.equal(shell.user_ns["y"].cpu(), torch.full((4, 4), 5.0))
    shell.run_cell("%tpu fuse on")
    assert "fused eager mode on" in capsys.readouterr().out and config.fuse
    shell.run_cell("z = shell_value = torch.ones(3, device='tpu') * 3")
    assert fusion.current() is None  # the end of a plain cell flushes too
    shell.run_cell("%tpu fuse off")
    assert "fused eager mode off" in capsys.readouterr().out and not config.fuse
    shell.run_cell("%tpu status")
    assert "fuse off" in capsys.readouterr().out
