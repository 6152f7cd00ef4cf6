"""``_foreach_*`` ops as one program per call (backend/foreach.py): values, written tensors, errors and
aliasing as CPU PyTorch's per-tensor loop gives them, the C++ plan of a repeated call, donation."""
from __future__ import annotations

import pytest
import torch
from helpers import TPU, assert_same, raises_like_cpu

import tpu_interactive as tt
from tpu_interactive.backend import fast_path, native

SHAPES = [(3,), (4, 5), (2, 2, 2), ()]


def _lists(device, dtype=torch.float32, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(s, generator=g) * 2).to(dtype).to(device) for s in SHAPES] for _ in range(n)]


# (name, call on (a, b, c) lists): in-place ones write a
CASES = [
    ("mul_.Scalar", lambda a, b, c: torch._foreach_mul_(a, 0.5)),
    ("mul_.Tensor", lambda a, b, c: torch._foreach_mul_(a, c[3])),
    ("mul_.ScalarList", lambda a, b, c: torch._foreach_mul_(a, [1.5, -2.0, 3, 0.25])),
    ("add_.List alpha", lambda a, b, c: torch._foreach_add_(a, b, alpha=0.3)),
    ("add_.Scalar int", lambda a, b, c: torch._foreach_add_(a, 1)),
    ("sub_.List", lambda a, b, c: torch._foreach_sub_(a, b)),
    ("div_.ScalarList", lambda a, b, c: torch._foreach_div_(a, [1.0, 2.0, 3.0, 4.0])),
    ("addcmul_.Scalar", lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.1)),
    ("addcdiv_.ScalarList", lambda a, b, c: torch._foreach_addcdiv_(a, b, [x.abs() + 1 for x in c], [0.5, -1, 2, 3])),
    ("lerp_.Scalar", lambda a, b, c: torch._foreach_lerp_(a, b, 0.1)),
    ("lerp_.List", lambda a, b, c: torch._foreach_lerp_(a, b, [x.sigmoid() for x in c])),
    ("maximum_.List", lambda a, b, c: torch._foreach_maximum_(a, b)),
    ("clamp_min_.Scalar", lambda a, b, c: torch._foreach_clamp_min_(a, 0.2)),
    ("sqrt_", lambda a, b, c: torch._foreach_sqrt_([x.abs() for x in a])),
    ("zero_", lambda a, b, c: torch._foreach_zero_(a)),
    ("pow_.Scalar", lambda a, b, c: torch._foreach_pow_([x.abs() for x in a], 1.5)),
    ("add.List", lambda a, b, c: torch._foreach_add(a, b)),
    ("mul.Scalar", lambda a, b, c: torch._foreach_mul(a, 3)),
    ("sqrt", lambda a, b, c: torch._foreach_sqrt([x.abs() for x in a])),
    ("exp", lambda a, b, c: torch._foreach_exp(a)),
    ("neg", lambda a, b, c: torch._foreach_neg(a)),
    ("norm", lambda a, b, c: torch._foreach_norm(a)),
    ("norm ord 3", lambda a, b, c: torch._foreach_norm(a, 3)),
    ("max", lambda a, b, c: torch._foreach_max([x for x in a if x.numel()])),
    ("pow.ScalarAndTensor", lambda a, b, c: torch._foreach_pow(2.0, a)),
    ("sign", lambda a, b, c: torch._foreach_sign(a)),
]


def _run(fn, device, dtype, repeats):
    a, b, c = _lists(device, dtype)
    results = []
    for _ in range(repeats):  # the later calls run from the C++ plan of the first
        out = fn(a, b, c)
        results.append([t.clone() for t in (out if out is not None else a)])
    return results, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_foreach_matches_cpu_call_after_call(name, fn, dtype, no_fallback):
    expected, cpu_out = _run(fn, "cpu", dtype, 3)
    actual, tpu_out = _run(fn, TPU, dtype, 3)
    assert type(tpu_out) is type(cpu_out)  # None for an in-place op, a list of new tensors otherwise
    assert_same(actual, expected, tol="ulps")


MIXED = [
    ("add.Scalar float to ints", lambda i, h: torch._foreach_add(i, 2.5)),
    ("mul.List ints by halves", lambda i, h: torch._foreach_mul(i, h)),
    ("div.Scalar ints", lambda i, h: torch._foreach_div(i, 2)),
    ("add_.List halves += ints", lambda i, h: torch._foreach_add_(h, i, alpha=2)),
]


@pytest.mark.parametrize("name,fn", MIXED, ids=[m[0] for m in MIXED])
def test_integer_lists_and_mixed_dtypes_promote_as_cpu(name, fn, no_fallback):
    def run(device):
        ints = [torch.arange(6, device=device).reshape(2, 3), torch.arange(3, device=device) - 1]
        halves = [torch.full((2, 3), 1.5, dtype=torch.bfloat16, device=device),
                  torch.full((3,), -0.5, dtype=torch.float16, device=device)]
        outs = [fn(ints, halves) for _ in range(2)]
        return outs if outs[0] is not None else halves

    assert_same(run(TPU), run("cpu"))


@pytest.mark.eager_only  # fused mode compiles the segment holding the calls: test_fused_mode_records...
def test_a_foreach_call_is_one_op_and_one_program_not_one_per_tensor():
    params = [torch.randn(8, 8, device=TPU) for _ in range(12)]
    grads = [torch.randn(8, 8, device=TPU) for _ in range(12)]
    torch._foreach_addcmul_(params, grads, grads, value=0.1)  # compiles its program
    before = tt.stats()
    torch._foreach_addcmul_(params, grads, grads, value=0.2)
    torch._foreach_addcmul_(params, grads, grads, value=0.3)  # a new float value: a program input
    torch.tpu.synchronize()
    after = tt.stats()
    counts = {k: after["op_counts"].get(k, 0) - before["op_counts"].get(k, 0) for k in after["op_counts"]}
    assert counts.get("aten::_foreach_addcmul_.Scalar") == 2
    assert counts.get("aten::addcmul_.default", 0) == 0  # no per-tensor dispatch
    assert after["xla_compiles"] == before["xla_compiles"]


@pytest.mark.eager_only
@pytest.mark.skipif(not native.available(), reason="the C++ extension is not built here")
def test_repeated_in_place_foreach_runs_its_plan_and_updates_unshared_tensors_in_place():
    params = [torch.randn(64, device=TPU) for _ in range(4)]
    moments = [torch.zeros(64, device=TPU) for _ in range(4)]
    kept = params[1].clone()  # shares params[1]'s array until params[1] is written
    original = kept.cpu()
    expected, expected_moments = [p.cpu() for p in params], [torch.zeros(64) for _ in range(4)]
    for _ in range(4):
        torch._foreach_mul_(moments, 0.9)
        torch._foreach_add_(moments, params, alpha=0.1)
        torch._foreach_add_(params, moments, alpha=-0.01)
        expected_moments = [m * 0.9 + p * 0.1 for m, p in zip(expected_moments, expected)]
        expected = [p - 0.01 * m for p, m in zip(expected, expected_moments)]
    torch.tpu.synchronize()  # the loop's calls have run (compile ahead defers those whose programs compile)
    before = fast_path.donations()
    torch._foreach_mul_(moments, 1.0)
    assert fast_path.donations() == before + 1  # nothing else held the moments: updated in place
    assert_same(params, expected)
    assert_same(moments, expected_moments)
    assert torch.equal(kept.cpu(), original)  # the clone never saw the writes


def _view_lists(device):
    """Plain selves, and gradients-like lists of views: transposed, offset, a reshape of a keepdim
    sum's buffer (a linear layer's bias gradient), broadcast."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 5, generator=g).to(device)
    selves = [torch.randn(s, generator=g).to(device) for s in ((5, 6), (5, 5), (5,), (4, 5))]
    views = [base.T, base[1:], base.sum(0, keepdim=True).view(5), base[0].expand(4, 5)]
    return base, selves, views


@pytest.mark.skipif(not native.available(), reason="the C++ extension is not built here")
def test_views_in_lists_run_from_the_plan_and_read_their_buffers(monkeypatch):
    """AdamW's bias gradients are views (a keepdim sum reshaped): a foreach call reading views runs
    from its C++ plan, which hands the program the buffers and the views' geometry."""
    import tpu_interactive.backend.foreach as foreach

    python_runs = []
    original = foreach.run
    monkeypatch.setattr(foreach, "run", lambda *a, **k: python_runs.append(1) or original(*a, **k))
    results = {}
    for device in ("cpu", TPU):
        base, selves, views = _view_lists(device)
        out = []
        for step in range(4):
            if step == 1:  # the first calls' programs have compiled (compile ahead defers them until then)
                torch.tpu.synchronize() if device == TPU else None
                python_runs.clear()
            torch._foreach_lerp_(selves, views, 0.1 * (step + 1))
            torch._foreach_addcmul_(selves, views, views, value=0.5)
            out.append([t.clone() for t in (*selves, *torch._foreach_mul(views, 2.0))])
            base.mul_(1.5)  # the views' next reads see the write
        results[device] = out
    assert python_runs == []  # the repeats run (or are recorded) from C++ plans
    assert_same(results[TPU], results["cpu"], tol="ulps")


@pytest.mark.parametrize("case", ["same tensor twice", "crosswise", "reads a later self", "own self"])
def test_elements_that_read_another_elements_write_see_it_as_on_cpu(case):
    """Torch's loop lets element i + 1 see element i's write; such calls run element by element."""
    def run(device):
        a, b = torch.arange(4.0, device=device), torch.arange(4.0, device=device) * 10
        s = torch.tensor(1.5, device=device)
        for _ in range(3):
            if case == "same tensor twice":
                torch._foreach_add_([a, a], 1.0)
            elif case == "crosswise":
                torch._foreach_add_([a, b], [b, a])
            elif case == "reads a later self":
                torch._foreach_mul_([s, a], s)
            else:
                torch._foreach_add_([a, b], [a, b])
        return [a, b, s]

    assert_same(run(TPU), run("cpu"))


@pytest.mark.parametrize("case", ["lengths", "cast", "broadcast", "device", "partial overlap"])
def test_bad_foreach_calls_raise_cpus_error(case):
    def call(device_lists):
        a, b = device_lists
        if case == "lengths":
            torch._foreach_add_(a, b[:1])
        elif case == "cast":
            torch._foreach_mul_([t.long() for t in a], 0.5)
        elif case == "broadcast":
            torch._foreach_add_(a[:1], [torch.ones(2, 3, device=a[0].device)])
        elif case == "device":
            torch._foreach_add(a, [b[0].cpu(), *b[1:]])
        else:
            base = torch.arange(6.0, device=a[0].device)
            torch._foreach_add_([base[:4]], [base[2:]])

    cpu = _lists("cpu", n=2)
    tpu = [[t.to(TPU) for t in lst] for lst in cpu]
    if case == "device":  # a cpu tensor in a tpu list: CUDA's words, naming the argument and the op
        with pytest.raises(RuntimeError, match="found at least two devices, tpu:0 and cpu!.*_foreach_add.List"):
            call(tpu)
        return
    with pytest.raises(RuntimeError) as expected:
        call(cpu)
    with pytest.raises(RuntimeError) as raised:
        call(tpu)
        torch.tpu.synchronize()
    assert str(expected.value).splitlines()[0] in str(raised.value)


def test_fused_mode_records_a_foreach_call_as_one_step():
    a, b, _ = _lists(TPU)
    expected_a = [t.cpu() * 0.5 + 0.1 * u.cpu() for t, u in zip(a, b)]
    with tt.fuse():
        tt.backend.fusion.flush()
        torch._foreach_mul_(a, 0.5)
        torch._foreach_add_(a, b, alpha=0.1)
        assert len(tt.backend.fusion.current().steps) == 2
    assert_same(a, expected_a)


def test_optimizer_foreach_step_matches_cpu_and_uses_the_foreach_kernels():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    cpu_model = model
    tpu_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(TPU)
    tpu_model.load_state_dict(cpu_model.state_dict())
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    before = tt.stats()["op_counts"].get("aten::_foreach_lerp_.Scalar", 0)
    for m, data in ((cpu_model, (x, y)), (tpu_model, (x.to(TPU), y.to(TPU)))):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(data[0]), data[1]).backward()
            opt.step()
    assert tt.stats()["op_counts"].get("aten::_foreach_lerp_.Scalar", 0) - before == 3
    assert_same(list(tpu_model.parameters()), list(cpu_model.parameters()), tol="ulps")


def test_foreach_whose_elements_no_lowering_takes_runs_torchs_loop():
    """A cpu ``scalars`` tensor (one value per element) binds to no element op: torch's own loop runs."""
    def run(device):
        a, b, c = _lists(device)
        for _ in range(2):
            torch._foreach_addcdiv_(a, b, [x.abs() + 1 for x in c], torch.tensor([0.5, -1.0, 2.0, 0.25]))
        return a

    assert_same(run(TPU), run("cpu"))


def test_raises_like_cpu_helper_agrees_for_a_foreach_cast_error():
    message = raises_like_cpu(lambda t: torch._foreach_add_([t], 0.5), torch.ones(3, dtype=torch.int32))
    assert "_foreach_add_.Scalar" in message
