"""The C++ warm eager path (backend/fast_path.py, csrc/fast_dispatch.cpp): a repeated op call runs
from its recorded plan. Every result is checked against CPU PyTorch and against the Python path."""
from __future__ import annotations

import gc

import pytest
import torch
from helpers import TPU, assert_same

import tpu_interactive
from tpu_interactive.backend import dispatch, fast_path, native, op_jit, stats, storage

pytestmark = [
    pytest.mark.eager_only,  # fused mode switches the fast path off
    pytest.mark.skipif(not native.available(), reason="needs the C++ extension (built on import with g++)"),
]


class PythonKernelRuns:
    """Counts how often the Python kernel path (dispatch._run_lowering) runs."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = dispatch._run_lowering

        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(dispatch, "_run_lowering", counted)


def _repeat(fn, *args, times=3):
    return [fn(*args) for _ in range(times)]


CASES = {
    "add": (lambda a, b: a + b, [(5, 7), (5, 7)], torch.float32),
    "add broadcast, alpha": (lambda a, b: torch.add(a, b, alpha=2.5), [(5, 7), (7,)], torch.float32),
    "sub int scalar": (lambda a: a - 3, [(4, 4)], torch.int64),
    "mul python float bf16": (lambda a: a * 1.1, [(64,)], torch.bfloat16),
    "mul bool scalar": (lambda a: a * True, [(3, 3)], torch.float32),
    "int * 0.5": (lambda a: a * 0.5, [(6,)], torch.int32),
    "div rounding_mode": (lambda a, b: torch.div(a, b, rounding_mode="floor"), [(8,), (8,)], torch.float32),
    "matmul": (lambda a, b: a @ b, [(16, 8), (8, 4)], torch.float32),
    "sum dim keepdim": (lambda a: a.sum(1, keepdim=True), [(6, 5)], torch.float32),
    "sum dtype": (lambda a: a.sum(dtype=torch.float64), [(6, 5)], torch.float32),
    "softmax": (lambda a: torch.softmax(a, -1), [(4, 9)], torch.float32),
    "layer_norm (3 outputs)": (lambda a: torch.nn.functional.layer_norm(a, (9,)), [(4, 9)], torch.float32),
    "comparison": (lambda a, b: a < b, [(10,), (10,)], torch.float32),
    "where": (lambda a, b: torch.where(a > 0, a, b), [(10,), (10,)], torch.float32),
    "topk (2 outputs)": (lambda a: torch.topk(a, 3), [(5, 8)], torch.float32),
    "cat (a tensor list)": (lambda a, b: torch.cat([a, b, a], 1), [(3, 2), (3, 4)], torch.float32),
    "clamp float bounds": (lambda a: torch.clamp(a, -0.25, 0.5), [(32,)], torch.float16),
    "gelu tanh (a string)": (lambda a: torch.nn.functional.gelu(a, approximate="tanh"), [(20,)], torch.float32),
    # copies within the device: one program each, no empty_like + copy_ through Python
    ".contiguous() of a transpose": (lambda a: a.t().contiguous(), [(5, 7)], torch.float32),
    "clone": (lambda a: a.clone(), [(5, 7)], torch.float32),
    ".to(dtype) (a device argument)": (lambda a: a.to(torch.bfloat16), [(5, 7)], torch.float32),
    ".to(dtype) of a slice, float to int": (lambda a: a[1:].to(torch.int32), [(5, 7)], torch.float32),
    # torch's composite reaches the fused op, whose nine results hold undefined tensors and ints
    "scaled_dot_product_attention": (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                     [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], torch.float32),
}
MATH_FUNCTIONS = {"softmax", "layer_norm (3 outputs)", "gelu tanh (a string)",  # XLA's exp/tanh: "ulps"
                  "scaled_dot_product_attention"}


@pytest.mark.parametrize("name", CASES)
def test_warm_calls_run_from_the_plan_and_equal_cpu(name, monkeypatch):
    fn, shapes, dtype = CASES[name]
    torch.manual_seed(0)
    cpu = [(torch.randn(s) * 4).to(dtype) for s in shapes]
    dev = [t.to(TPU) for t in cpu]
    want = fn(*cpu)
    first = fn(*dev)  # the Python path, offering its plan (once it has run: compile ahead defers it)
    torch.tpu.synchronize()
    runs = PythonKernelRuns(monkeypatch)
    warm = _repeat(fn, *dev)
    assert runs.count == 0, f"{name}: warm calls ran the Python kernel {runs.count} times"
    for got in [first, *warm]:
        assert_same(got, want, tol="ulps" if name in MATH_FUNCTIONS else None)


def test_a_lowering_run_eagerly_for_integers_still_plans_floats(monkeypatch):
    """An integer floor division checks for zero divisors (values: it runs eagerly); that must not
    take the float32 calls of the same lowering off their programs and plans."""
    ints = torch.tensor([3, -4, 5]).to(TPU)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(ints, torch.zeros(3, dtype=torch.int64).to(TPU), rounding_mode="floor")
    assert_same(torch.div(ints, torch.tensor([2, 3, 2]).to(TPU), rounding_mode="floor"), torch.tensor([1, -2, 2]))
    cpu = [torch.randn(11) * 4 for _ in range(2)]
    dev = [t.to(TPU) for t in cpu]
    want = torch.div(*cpu, rounding_mode="floor")
    assert_same(torch.div(*dev, rounding_mode="floor"), want)
    runs = PythonKernelRuns(monkeypatch)
    for _ in range(3):
        assert_same(torch.div(*dev, rounding_mode="floor"), want)
    assert runs.count == 0


def test_views_run_from_plans_that_read_the_buffer(monkeypatch):
    """A view argument (offset, transposed, broadcast, a dtype view, lazy conj) is keyed by its
    geometry and read from its buffer inside the program; a write to the base is seen."""
    cpu = torch.randn(6, 6)
    t = cpu.to(TPU)
    c = torch.randn(4, dtype=torch.complex64)
    tc = c.to(TPU)
    views = [lambda x: x.T, lambda x: x[1:, 2:], lambda x: x[0].expand(6, 6), lambda x: x.view(torch.int32)]
    runs = PythonKernelRuns(monkeypatch)
    for view in views:
        for _ in range(3):
            assert_same(view(t) * 2, view(cpu) * 2)
            assert_same(tc.conj() + tc, c.conj() + c)
    # each view's first call, and the conj's two: torch's conj fallback resolves tc.conj() (a clone), the add
    assert runs.count == len(views) + 2
    t.add_(1)
    cpu.add_(1)
    for view in views:
        assert_same(view(t) * 2, view(cpu) * 2)


def test_views_in_a_tensor_list_run_from_plans_and_cpu_tensors_never_do(monkeypatch):
    """A view inside a tensor list (cat's, stack's) is keyed by its geometry and read from its buffer
    inside the plan's program: a repeat runs from the plan, sees writes through other views, and
    another geometry gets its own plan. Cpu tensors of dim > 0 are never run from a plan."""
    cpu = torch.randn(6, 6)
    t = cpu.to(TPU)
    runs = PythonKernelRuns(monkeypatch)
    for _ in range(3):
        assert_same(torch.cat([t.T, t]), torch.cat([cpu.T, cpu]))
        torch.tpu.synchronize()  # the first call has run (compile ahead defers it): its plan exists
    assert runs.count == 1
    t[0].add_(1)  # a write through another view: the plan reads the buffer's new array
    cpu[0].add_(1)
    torch.tpu.synchronize()  # (a deferred add_ would make the next cat resolve it in Python)
    runs.count = 0
    assert_same(torch.cat([t.T, t]), torch.cat([cpu.T, cpu]))
    assert runs.count == 0
    first = None
    for _ in range(3):  # other geometries (offsets, strides, a dtype cast among the items)
        assert_same(torch.cat([t[1:, ::2].T, t[:3, 1:4].double()], dim=1),
                    torch.cat([cpu[1:, ::2].T, cpu[:3, 1:4].double()], dim=1))
        assert_same(torch.stack([t[2], t[:, 3], t.view(-1)[5:11]]), torch.stack([cpu[2], cpu[:, 3], cpu.view(-1)[5:11]]))
        torch.tpu.synchronize()
        first = runs.count if first is None else first
    assert first >= 2 and runs.count == first  # the first calls of cat and stack only
    with pytest.raises(RuntimeError, match="same device"):
        t + cpu
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([t, cpu])


def test_a_plan_reads_the_current_value_of_its_inputs():
    """Plans hold no values: an in-place write, a copy_ or a resize between calls is seen."""
    cpu = torch.arange(8.0)
    t = cpu.to(TPU)
    for _ in range(3):
        assert_same(t * 2, cpu * 2)
    t.add_(1)
    cpu.add_(1)
    assert_same(t * 2, cpu * 2)
    t.copy_(torch.full((8,), 5.0))
    assert_same(t * 2, torch.full((8,), 10.0))


def test_python_numbers_in_tensor_positions_are_inputs_not_constants():
    """``t + 0`` adds a zero (-0.0 + 0 is +0.0, as on CPU); a baked-in 0 would be folded away by XLA.
    Different scalars never share a plan's constant; cached device scalars are distinct by type and sign."""
    x = torch.tensor([-0.0, 1.0, -2.5])
    t = x.to(TPU)
    for _ in range(3):
        assert torch.equal(torch.signbit((t + 0).cpu()), torch.signbit(x + 0))
    for k in (0, 1, 2, 1, 0):
        assert_same(t + k, x + k)
        assert_same(t * float(k), x * float(k))
    numbers = (0.0, -0.0, 1.0, 1, True, 0, False)
    values = [op_jit._device_scalar(v) for v in numbers]
    assert len({id(v) for v in values}) == len(numbers)  # 0.0 == -0.0 == 0 == False: none shared
    assert [v.dtype.kind for v in values] == ["f", "f", "f", "i", "b", "i", "b"]
    assert [float(v) for v in values] == [float(n) for n in numbers]


def test_outputs_are_like_the_python_paths():
    """Same dispatch keys, a buffer like DeviceBuffer's own __init__ makes, fresh non-overlapping
    addresses, and exact memory accounting."""
    a = torch.randn(32, device="tpu")
    gc.collect()
    live = stats.memory().live_bytes
    outs = _repeat(lambda: a * 3.0, times=4)
    assert torch._C._dispatch_keys(outs[-1]) == torch._C._dispatch_keys(a)
    assert stats.memory().live_bytes == live + 4 * 32 * 4
    addresses = sorted(o.data_ptr() for o in outs)
    assert all(b - a_ >= 32 * 4 for a_, b in zip(addresses, addresses[1:]))
    buffer = storage.buffer_of(outs[-1])
    assert buffer.shape == (32,) and buffer.dtype == torch.float32 and buffer.nbytes == 128
    assert buffer.address == outs[-1].data_ptr() and buffer.pending is None
    # (a DeviceBuffer counts itself freed when it dies: these two are counted as allocations of 0 bytes)
    made = native.module().fast_buffer(buffer.array, (32,), torch.float32, 0, 256)
    python = storage.DeviceBuffer(buffer.array, (32,), torch.float32, 0, 256)
    stats.record_alloc(0)
    stats.record_alloc(0)
    for slot in storage.DeviceBuffer.__slots__:
        if slot != "__weakref__":
            assert getattr(made, slot) is getattr(python, slot) or getattr(made, slot) == getattr(python, slot)
    del outs, made, python, buffer
    gc.collect()
    assert stats.memory().live_bytes == live


def test_warm_ops_are_counted_and_reported():
    """A plan's calls are counted in C++ and added to the op counters at every read; a reset drops the
    calls made before it."""
    a = torch.randn(16, device="tpu")
    a - a
    before = tpu_interactive.stats()["op_counts"].get("aten::sub.Tensor", 0)
    _repeat(lambda: a - a, times=5)
    assert tpu_interactive.stats()["op_counts"]["aten::sub.Tensor"] == before + 5
    assert tpu_interactive.stats()["op_seconds"]["aten::sub.Tensor"] > 0
    assert fast_path.plans() > 0
    _repeat(lambda: a - a, times=4)
    stats.reset()
    assert "aten::sub.Tensor" not in tpu_interactive.stats()["op_counts"]
    _repeat(lambda: a - a, times=2)
    assert tpu_interactive.stats()["op_counts"]["aten::sub.Tensor"] == 2


def test_buffers_made_by_plans_are_counted_in_order_with_the_frees():
    """The fast path counts its outputs in C++ (csrc/memory_counters.cpp), every other allocation and
    free too once it is installed: live, peak and cumulative counts stay exact, and the peak is the most
    buffers that lived at once, not the sum of all allocations since the last read."""
    a = torch.randn(256, device="tpu")
    b = _repeat(lambda: a * 3.0)[-1]
    gc.collect()
    stats.reset_peak()
    before = stats.memory_totals()
    plans_before = stats.snapshot()["op_counts"]["aten::mul.Tensor"]
    for _ in range(5):
        b = a * 3.0  # the new output lives beside the one it replaces, which is freed right after
    after = stats.memory_totals()
    assert stats.snapshot()["op_counts"]["aten::mul.Tensor"] == plans_before + 5
    assert stats._native_take is not None  # counted in C++
    assert (after.live_bytes, after.live_buffers) == (before.live_bytes, before.live_buffers)
    assert (after.peak_bytes, after.peak_buffers) == (before.live_bytes + 1024, before.live_buffers + 1)
    assert after.allocations - before.allocations == 5 and after.frees - before.frees == 5
    assert after.allocated_bytes - before.allocated_bytes == 5 * 1024 == after.freed_bytes - before.freed_bytes
    keep = [a * 3.0 for _ in range(3)]  # three alive at once, then freed: the peak saw them
    del keep
    gc.collect()
    final = stats.memory_totals()
    assert final.peak_bytes == before.live_bytes + 3 * 1024 and final.live_bytes == before.live_bytes
    assert b.device.type == "tpu"


def test_sync_mode_and_nan_check_switch_it_off(monkeypatch):
    a = torch.tensor([0.0, 1.0], device="tpu")
    for _ in range(3):
        a / a
    torch.tpu.synchronize()  # the first call, deferred while it compiled (compile ahead), has run: its plan exists
    tpu_interactive.config.nan_check = True
    try:
        with pytest.raises(FloatingPointError, match="div"):
            a / a
    finally:
        tpu_interactive.config.nan_check = False
    runs = PythonKernelRuns(monkeypatch)
    with tpu_interactive.sync_mode(True):
        a / a
    assert runs.count == 1
    a / a
    assert runs.count == 1  # on again


def test_memory_limit_is_checked_on_warm_calls_with_the_ops_error():
    a = torch.randn(1024, device="tpu")
    for _ in range(3):
        a + a
    tpu_interactive.config.memory_limit_bytes = stats.memory().live_bytes + 1024
    with pytest.raises(torch.OutOfMemoryError, match=r"aten::add\.Tensor") as info:
        a + a
    assert "test_fast_path.py" in str(info.value)
    tpu_interactive.config.memory_limit_bytes = None
    assert_same(a + a, a.cpu() + a.cpu())


def test_autograd_through_warm_ops_matches_cpu():
    cpu_w = torch.randn(8, 4, requires_grad=True)
    w = cpu_w.detach().to(TPU).requires_grad_()
    x = torch.randn(5, 8) * 0.3  # tanh unsaturated: its gradient is no difference of nearly equal numbers
    for _ in range(3):
        w.grad = None
        loss = torch.tanh(x.to(TPU) @ w).sum() * 0.5
        loss.backward()
    cpu_loss = torch.tanh(x @ cpu_w).sum() * 0.5
    cpu_loss.backward()
    assert_same(loss, cpu_loss, tol="ulps")
    assert_same(w.grad, cpu_w.grad, tol="ulps")


def test_warm_calls_are_served_from_torchs_ivalues(monkeypatch):
    """A fronted op's kernel is registered in C++ (csrc/boxed_front.cpp): a warm call, from Python or from
    autograd's backward, runs its plan from the dispatcher's IValues, no Python kernel and no Python
    tensor objects in between; arguments at their defaults (left out of a Python kernel's arguments),
    keyword-only ones, dtypes, int lists, a functional foreach op's list and an in-place op's self are
    keyed as the Python front keys them (the suite checks each such key: tests/conftest.py)."""
    assert "boxed_front.cpp" in torch._C._dispatch_dump("aten::mm")
    torch.manual_seed(0)
    cpu_w, x, b = torch.randn(8, 4, requires_grad=True), torch.randn(5, 8), torch.randn(4, 3)
    w = cpu_w.detach().to(TPU).requires_grad_()

    def step(w, x, b):
        w.grad = None
        h = torch.tanh((x @ w) * 0.5)
        y = torch.add(h @ b, 1.0, alpha=2).sum(dim=[1], keepdim=True).to(torch.float64)
        parts = torch._foreach_mul([y, y], 3.0)
        parts[0].add_(parts[1]).sum().backward()
        return parts[0]

    tpu_x, tpu_b = x.to(TPU), b.to(TPU)
    _repeat(step, w, tpu_x, tpu_b)
    torch.tpu.synchronize()
    runs = PythonKernelRuns(monkeypatch)
    served = native.module().fast_boxed_hits()
    out = step(w, tpu_x, tpu_b)
    grad = w.grad
    assert runs.count == 0
    assert native.module().fast_boxed_hits() - served >= 12  # forward, backward and the writes
    with tpu_interactive.sync_mode(True):  # the C++ path off: the Python kernels run the same programs
        python_path = step(w, tpu_x, tpu_b)
    assert runs.count > 0
    assert torch.equal(out.cpu(), python_path.cpu()) and torch.equal(grad.cpu(), w.grad.cpu())
    expected = step(cpu_w, x, b)
    assert out.dtype == expected.dtype == torch.float64
    # computed in float32 (a TPU's float32 matmuls differ from CPU's in the last bits)
    assert_same(out.float(), expected.float(), rtol=1e-3, atol=1e-3)
    assert_same(grad, cpu_w.grad, rtol=1e-3, atol=1e-3)


def test_attention_forward_and_backward_run_from_plans_and_equal_cpu(monkeypatch):
    """F.scaled_dot_product_attention with a float mask that needs a gradient: torch's composite asks our
    C++ kernel choice, and the fused op and its backward (torch's C++ autograd formula) repeat from plans."""
    torch.manual_seed(0)
    cpu = [torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 4), torch.randn(2, 1, 5, 6)]
    cotangent = torch.randn(2, 3, 5, 4)

    def step(q, k, v, mask, g):
        for t in (q, k, v, mask):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.backward(g)
        return [out.detach(), q.grad, k.grad, v.grad, mask.grad]

    want = step(*[t.clone().requires_grad_() for t in cpu], cotangent)
    dev = [t.to(TPU).requires_grad_() for t in cpu]
    step(*dev, cotangent.to(TPU))
    torch.tpu.synchronize()
    runs = PythonKernelRuns(monkeypatch)
    for _ in range(2):
        got = step(*dev, cotangent.to(TPU))
    assert runs.count == 0, f"warm attention steps ran the Python kernel {runs.count} times"
    assert got[0].grad_fn is None and "ScaledDotProductFusedAttentionOverrideable" in type(
        torch.nn.functional.scaled_dot_product_attention(*dev[:3]).grad_fn).__name__
    assert_same(got, want, tol="ulps")


def test_memory_history_records_warm_allocations_with_the_users_line():
    a = torch.randn(64, device="tpu")
    for _ in range(3):
        a * a
    torch.tpu.memory._record_memory_history("all", max_entries=100, clear_history=True)
    try:
        kept = a * a  # noqa: F841 - the allocation to find
        snapshot = torch.tpu.memory._snapshot()
    finally:
        torch.tpu.memory._record_memory_history(None)
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc" and e["size"] == 256]
    assert allocs and any("test_fast_path.py" in f["filename"] for f in allocs[-1]["frames"])


def test_inplace_ops_run_from_plans_and_every_alias_sees_the_write(monkeypatch):
    """In-place ops (an optimizer's add_/mul_/addcmul_/lerp_) write self's buffer from C++, through
    views too, with torch's casting; aliasing (x.add_(x)) is part of the key."""
    cpu = torch.randn(6, 6)
    half_cpu = torch.randn(6, 6).half()
    t, half = cpu.to(TPU), half_cpu.to(TPU)
    view, cpu_view = t.T, cpu.T  # an alias, read after the writes
    other = torch.randn(6, 6)
    o = other.to(TPU)

    def steps(x, h, y):
        x.mul_(0.9)
        x.T.add_(y, alpha=0.5)
        x[1:4].addcmul_(y[1:4], y[1:4], value=0.1)
        x.lerp_(y, 0.25)
        x.add_(x)
        h.add_(y)  # float16 self, float32 other: computed in float32, rounded into float16
    steps(t, half, o)
    steps(cpu, half_cpu, other)
    torch.tpu.synchronize()  # the first calls have run (compile ahead defers them): their plans exist
    runs = PythonKernelRuns(monkeypatch)
    for _ in range(3):
        steps(t, half, o)
        steps(cpu, half_cpu, other)
    assert runs.count == 0
    assert_same(t, cpu)
    assert_same(view, cpu_view)
    assert_same(half, half_cpu)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        t[0].expand(6, 6).add_(1.0)
    for write in (lambda x: x[1:].add_(x[:-1]), lambda x: x.add_(x.T), lambda x: x.copy_(x.T)):
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            write(cpu)  # partial overlap (x.T: the same memory in another order)
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            write(t)  # refused as on CPU, also with plans for t's other aliasings
    for write in (lambda x: x.T.add_(x.T), lambda x: x[:, ::2].mul_(x[:, 1::2])):
        write(cpu)
        write(t)  # full overlap, and strided views (ATen: "too hard"), are allowed as on CPU
    assert_same(t, cpu)


def test_float_arguments_are_inputs_where_they_cannot_change_the_output_shape(monkeypatch):
    """An elementwise op's Python float (a scheduler's lr) is a program input: a new value is no new
    plan. Where a float decides the output shape (interpolate's scale_factor), it is part of the key."""
    cpu = torch.randn(2, 3, 4, 4)
    t = cpu.to(TPU)
    t * 0.5
    torch.tpu.synchronize()  # the first call has run (compile ahead defers it): its plan exists
    runs = PythonKernelRuns(monkeypatch)
    for lr in (0.1, 0.2, 0.3, -0.0, float("inf")):
        assert_same(t * lr, cpu * lr)
        assert_same(t.add(t, alpha=lr), cpu.add(cpu, alpha=lr))
    assert runs.count == 1  # add's first call with alpha; every later value ran from its plan
    for scale in (1.5, 2.0, 1.5):
        got = torch.nn.functional.interpolate(t, scale_factor=scale, mode="nearest")
        assert_same(got, torch.nn.functional.interpolate(cpu, scale_factor=scale, mode="nearest"))


def test_an_op_whose_program_bakes_its_floats_in_gets_plans_keyed_by_value(monkeypatch):
    """pow(x, 3.0) compiles x * x * x: the exponent's value picks the program, so plans keyed by the
    float's type would be wrong, and such an op had no plan at all (~90 us a call through Python, a
    GELU's pow in every token of generate()). Its keys now hold the value: each exponent its own plan,
    never another's. An op whose calls take floats as inputs (mul) keeps its keys by type."""
    cpu = torch.randn(6, 5).abs()
    t = cpu.to(TPU)
    exponents = (3.0, 2.0, 0.5, 2.5, -1.0)
    for e in (*exponents, 3.0):  # the Python path, offering plans; the first call switches pow's keys
        assert_same(torch.pow(t, e), torch.pow(cpu, e))  # (and has no plan: 3.0's comes from its second)
    t * 0.1
    torch.tpu.synchronize()
    runs = PythonKernelRuns(monkeypatch)
    for _ in range(2):
        for e in exponents:
            assert_same(torch.pow(t, e), torch.pow(cpu, e))
    assert runs.count == 0
    assert_same(torch.pow(t, 1.5), torch.pow(cpu, 1.5))  # a new value: a new key, the Python path
    assert runs.count == 1
    for lr in (0.2, 0.3, 0.4):  # a float input: a new value is no new plan
        assert_same(t * lr, cpu * lr)
    assert runs.count == 1
    assert fast_path._FLOATS_BY_VALUE and not fast_path._FLOATS_BY_VALUE & fast_path._FLOAT_INPUT_OPS
