"""Issue 2: the tpu device as a PyTorch user sees it, every check against CPU PyTorch."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_interactive as torch_tpu
from helpers import assert_same, check, run_result_script, to_tpu


# ---------------------------------------------------------------- device identity and transfers
def test_device_identity_and_transfers():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    assert t.device == torch.device("tpu", 0) == torch_tpu.device()
    assert t.is_tpu and not x.is_tpu
    assert torch.equal(t.cpu(), x) and torch.equal(t.to("cpu"), x)
    np.testing.assert_array_equal(t.cpu().numpy(), x.numpy())
    assert t.tolist() == x.tolist()
    assert t[1, 2].item() == x[1, 2].item()
    assert "device='tpu:0'" in repr(t)
    assert repr(t).replace(", device='tpu:0'", "") == repr(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_roundtrip_keeps_dtype_and_bits(dtype):
    x = (torch.randn(5, 7) * 1000).to(dtype)
    t = x.to("tpu")
    assert t.dtype == dtype
    assert torch.equal(t.cpu(), x)


def test_int64_and_float64_are_not_truncated():
    big = torch.tensor([2**40 + 3, -(2**50) - 1], dtype=torch.int64)
    assert torch.equal((big.to("tpu") + 1).cpu(), big + 1)
    precise = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    assert (precise.to("tpu") - 1.0).cpu().item() == pytest.approx(1e-12, rel=1e-6)


def test_cpu_scalar_tensor_allowed_like_cuda():
    x = torch.randn(4)
    assert_same(x.to("tpu") * torch.tensor(3.0), x * torch.tensor(3.0))


def test_mixing_cpu_and_tpu_tensors_is_a_familiar_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*tpu:0 and cpu") as err:
        torch.randn(3, device="tpu") + torch.randn(3)
    assert "aten::add" in str(err.value)
    assert "test_backend_core.py" in str(err.value)  # the user's line
    assert ".to('tpu')" in str(err.value)


# ---------------------------------------------------------------- factories
@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(2, 3, dtype=torch.int64, device=d),
    lambda d: torch.full((2, 2), 7.5, device=d),
    lambda d: torch.arange(10, device=d),
    lambda d: torch.arange(1.0, 4.0, 0.5, device=d),
    lambda d: torch.linspace(-1, 1, 9, device=d),
    lambda d: torch.eye(4, device=d),
    lambda d: torch.eye(3, 5, dtype=torch.int64, device=d),
    lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    lambda d: torch.tensor([1.5, float("nan")], dtype=torch.bfloat16, device=d),
    lambda d: torch.zeros_like(torch.empty(2, 5, device=d)),
    lambda d: torch.ones_like(torch.empty(3, device=d), dtype=torch.bool),
    lambda d: torch.full_like(torch.empty(2, device=d), -1),
    lambda d: torch.arange(-3, 7, 2, device=d),
    lambda d: torch.arange(0, 1, 0.1, device=d, dtype=torch.float64),
    lambda d: torch.arange(0, 10, 3, device=d, dtype=torch.bfloat16),
    lambda d: torch.linspace(0, 10, 7, device=d, dtype=torch.int64),
    lambda d: torch.logspace(0, 3, 4, base=2, device=d),
    lambda d: torch.tril_indices(4, 3, -1, device=d),
    lambda d: torch.triu_indices(3, 5, 1, device=d),
    lambda d: torch.scalar_tensor(3.5, device=d),
], ids=lambda f: "")
def test_factories_match_cpu(make, no_fallback):
    assert_same(make("tpu"), make("cpu"))


def test_arange_program_matches_cpu_at_every_overload_and_refuses_like_it(no_fallback):
    """Aranges of Python numbers (a decode step's positions, a timestep embedding's frequencies) take
    one cached program per length: values, dtype and size as on CPU for every functional overload and
    out=, in fused mode too, and torch's own errors where its checks refuse."""
    import tpu_interactive as tt

    cases = [(7,), (0,), (0, 10), (5, -7, -3), (3, 3), (0, 10, 4), (-5, 5, 2), (2**40, 2**40 + 5), (9, 2, -7)]
    for fused in (False, True):
        with tt.fuse(fused):
            for args in cases:
                for dtype in (None, torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8, torch.float32):
                    assert_same(torch.arange(*args, dtype=dtype, device="tpu"), torch.arange(*args, dtype=dtype))
                out = torch.empty(0, dtype=torch.int32, device="tpu")
                assert torch.arange(*args, out=out) is out
                assert_same(out, torch.arange(*args, out=torch.empty(0, dtype=torch.int32)))
    float_cases = [(0.5, 5.0, 0.3), (5.0, 6.0), (-1.5, 2.25, 0.25), (0, 64), (10.0, -3.0, -0.7), (2.0,)]
    for fused in (False, True):
        with tt.fuse(fused):
            for args in float_cases:
                for dtype in (None, torch.float32, torch.bfloat16, torch.float16):
                    assert_same(torch.arange(*args, dtype=dtype, device="tpu"), torch.arange(*args, dtype=dtype))
    from tpu_interactive.backend.ops import factories

    assert {(7, torch.int64), (5, torch.int32), (0, torch.uint8), (15, torch.float32), (15, torch.bfloat16),
            (19, torch.float32)} <= set(factories._aranges)  # they took the program
    for args, words in [((0, 10, 0), "step must be nonzero"), ((0, 10, -1), "inconsistent with step sign"),
                        ((10, 0, 1), "inconsistent with step sign"), ((0.0, 1.0, 0.0), "step must be nonzero"),
                        ((0.0, float("inf")), "unsupported range"), ((0.0, float("nan")), "unsupported range")]:
        with pytest.raises(RuntimeError, match=words) as on_cpu:
            torch.arange(*args)
        with pytest.raises(RuntimeError, match=words) as on_tpu:
            torch.arange(*args, device="tpu")
        assert str(on_tpu.value).startswith(str(on_cpu.value).splitlines()[0])  # CPU's words, values too
        out = torch.empty(0, dtype=torch.int64 if type(args[0]) is int else torch.float32, device="tpu")
        with pytest.raises(RuntimeError, match=words):
            torch.arange(*args, device="tpu", out=out)


def test_empty_has_right_metadata():
    e = torch.empty(3, 4, dtype=torch.float16, device="tpu")
    assert e.shape == (3, 4) and e.dtype == torch.float16 and e.device.type == "tpu"
    e2 = torch.empty_like(e)
    assert e2.shape == e.shape and e2.untyped_storage().data_ptr() != e.untyped_storage().data_ptr()


@pytest.mark.parametrize("make", [
    lambda d: torch.rand(1000, device=d),
    lambda d: torch.randn(1000, device=d),
    lambda d: torch.randint(0, 10, (1000,), device=d),
    lambda d: torch.normal(2.0, 3.0, (1000,), device=d),
    lambda d: torch.rand_like(torch.empty(1000, device=d)),
    lambda d: torch.randn_like(torch.empty(1000, device=d)),
    lambda d: torch.randperm(50, device=d),
], ids=lambda f: "")
def test_random_factories_reproducible_and_distributed(make):
    torch.manual_seed(123)
    a = make("tpu")
    torch.manual_seed(123)
    b = make("tpu")
    c = make("tpu")
    assert a.device.type == "tpu"
    assert torch.equal(a.cpu(), b.cpu()), "manual_seed must make device RNG reproducible"
    assert not torch.equal(b.cpu(), c.cpu()), "consecutive draws must differ"
    ref = make("cpu")
    assert a.shape == ref.shape and a.dtype == ref.dtype


def test_random_statistics():
    torch.manual_seed(0)
    u = torch.rand(20000, device="tpu").cpu()
    n = torch.randn(20000, device="tpu").cpu()
    r = torch.randint(3, 9, (20000,), device="tpu").cpu()
    p = torch.randperm(100, device="tpu").cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    assert r.min() == 3 and r.max() == 8
    assert sorted(p.tolist()) == list(range(100))


def test_rng_state_roundtrip_and_cpu_generator():
    torch.manual_seed(5)
    state = torch.tpu.get_rng_state()
    a = torch.randn(10, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(10, device="tpu").cpu(), a)
    # an explicit CPU generator gives exactly CPU's numbers
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    dev = torch.empty(6, device="tpu").normal_(generator=g1)
    assert torch.equal(dev.cpu(), torch.empty(6).normal_(generator=g2))


# ---------------------------------------------------------------- modules, parameters, state_dict
def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_model_to_keeps_parameters_identity_and_type():
    model = _mlp()
    weight = model[0].weight
    model.to("tpu")
    assert model[0].weight is weight, "module.to must keep the same Parameter objects (like CUDA)"
    assert isinstance(model[0].weight, torch.nn.Parameter) and model[0].weight.requires_grad
    assert all(p.device.type == "tpu" for p in model.parameters())
    p = torch.nn.Parameter(torch.randn(3, device="tpu"))
    assert isinstance(p, torch.nn.Parameter) and p.device.type == "tpu"


def test_state_dict_roundtrip_and_save(tmp_path):
    torch.manual_seed(0)
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).to("tpu")
    state = model.state_dict()
    assert all(v.device.type == "tpu" for v in state.values())
    fresh = _mlp().to("tpu")
    fresh.load_state_dict(state)
    x = torch.randn(5, 20)
    assert_same(fresh(x.to("tpu")), cpu_model(x), atol=1e-5)
    # torch.save of a tpu model after .cpu(), and directly
    buffer = io.BytesIO()
    torch.save(model.cpu().state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    for k, v in cpu_model.state_dict().items():
        assert torch.equal(loaded[k], v)
    path = tmp_path / "direct.pt"
    torch.save(fresh.state_dict(), path)
    direct = torch.load(path, map_location="cpu")
    for k, v in cpu_model.state_dict().items():
        assert torch.equal(direct[k], v)


def test_load_cpu_state_dict_into_tpu_model():
    cpu_model = _mlp()
    model = _mlp().to("tpu")
    model.load_state_dict(cpu_model.state_dict())
    for (k, v), (_, ref) in zip(model.state_dict().items(), cpu_model.state_dict().items()):
        assert v.device.type == "tpu" and torch.equal(v.cpu(), ref)


# ---------------------------------------------------------------- autograd and training
def _train(model, inputs, targets, optimizer_cls, steps=3, **opt_kwargs):
    optimizer = optimizer_cls(model.parameters(), **opt_kwargs)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer_cls,kwargs", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    # eps well above the smallest gradients: some first-layer gradients are sums that cancel to ~1e-8,
    # where Adam's m / (sqrt(v) + 1e-8) turns a 1% rounding difference (XLA's vs MKL's summation
    # order) into a 1e-2-sized step; with eps = 1e-4 the update stays proportional to such gradients
    (torch.optim.Adam, {"lr": 1e-2, "eps": 1e-4}),
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}),
])
def test_mlp_training_matches_cpu(optimizer_cls, kwargs):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    cpu_losses = _train(cpu_model, x, y, optimizer_cls, **kwargs)
    tpu_losses = _train(tpu_model, x.to("tpu"), y.to("tpu"), optimizer_cls, **kwargs)
    np.testing.assert_allclose(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for p_tpu, p_cpu in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert p_tpu.grad.device.type == "tpu"
        assert_same(p_tpu, p_cpu, tol="accumulated")


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(F.relu(self.bn(self.conv(x)))), 1))


class TinyAttention(torch.nn.Module):
    def __init__(self, vocab=50, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.drop = torch.nn.Dropout(0.0)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.norm(self.emb(tokens))
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(self.drop(a.transpose(1, 2).reshape(b, s, d) + h))


def _step_and_compare(cpu_model, make_inputs, loss_fn, rtol=1e-4, atol=1e-5):
    torch.manual_seed(1)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    inputs = make_inputs()
    # SGD: the update is linear in the gradient. (Adam divides by sqrt(v): for parameters whose exact
    # gradient is 0, e.g. attention key biases, it would amplify float rounding noise to +-lr.)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=0.1, momentum=0.9)
    for model, opt, args in ((cpu_model, cpu_opt, inputs), (tpu_model, tpu_opt, to_tpu(inputs))):
        loss = loss_fn(model(*args[:-1]), args[-1])
        loss.backward()
        opt.step()
        model.last_loss = loss.item()
    assert tpu_model.last_loss == pytest.approx(cpu_model.last_loss, rel=rtol, abs=atol)
    for (name, p_tpu), p_cpu in zip(tpu_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=rtol * 10, atol=atol * 10, msg=name)
        torch.testing.assert_close(p_tpu.cpu(), p_cpu, rtol=rtol, atol=atol, msg=name)
    for (name, b_tpu), b_cpu in zip(tpu_model.named_buffers(), cpu_model.buffers()):
        torch.testing.assert_close(b_tpu.cpu(), b_cpu, rtol=rtol, atol=atol, msg=name)


def test_conv_net_training_step_matches_cpu():
    torch.manual_seed(0)
    _step_and_compare(ConvNet(), lambda: (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))), F.cross_entropy)


def test_attention_model_training_step_matches_cpu():
    torch.manual_seed(0)
    model = TinyAttention()
    _step_and_compare(model, lambda: (torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 7))),
                      lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))


def test_dropout_train_and_eval():
    x = torch.ones(4000, device="tpu")
    drop = torch.nn.Dropout(0.25)
    y = drop(x).cpu()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.03
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.75))
    drop.eval()
    assert torch.equal(drop(x).cpu(), x.cpu())


def test_gradient_of_simple_expression_matches_cpu():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 2, requires_grad=True)
    ta, tb = to_tpu(a), to_tpu(b)
    ((a @ b).tanh() * 2).sum().backward()
    ((ta @ tb).tanh() * 2).sum().backward()
    assert ta.grad.device.type == "tpu"
    torch.testing.assert_close(ta.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tb.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- dtypes
@pytest.mark.parametrize("a_dtype,b", [
    (torch.int64, 2.5), (torch.int32, torch.tensor(2.0)), (torch.int64, torch.tensor([1.5], dtype=torch.float16)),
    (torch.bfloat16, 3), (torch.float16, torch.tensor(2.0, dtype=torch.float64)), (torch.bool, 1),
    (torch.uint8, -1), (torch.int8, torch.tensor([3], dtype=torch.int64)),
])
def test_dtype_promotion_matches_torch(a_dtype, b):
    a = torch.arange(4).to(a_dtype)
    check(lambda x, y: x + y, a, b)
    check(lambda x, y: x * y, a, b)


def test_unsupported_dtype_is_clear():
    with pytest.raises(TypeError, match="not supported on the tpu device"):
        torch.empty(3, dtype=torch.complex32, device="tpu")


# ---------------------------------------------------------------- errors, sync mode, NaN
def test_matmul_shape_error_names_op_and_shapes():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(4, 5, device="tpu")
    with pytest.raises(RuntimeError, match=r"2x3 and 4x5") as err:
        torch.mm(a, b)
    text = str(err.value)
    assert "aten::mm" in text and "Tensor[2x3, float32, tpu:0]" in text and "test_backend_core.py" in text
    assert torch.equal(a.cpu(), a.cpu())  # inputs intact, device usable
    assert (a @ torch.ones(3, 1, device="tpu")).shape == (2, 1)


def test_sync_mode_switch_env_and_context():
    assert torch_tpu.sync_mode() is False or torch_tpu.sync_mode() is True
    with torch_tpu.sync_mode(True):
        assert torch_tpu.config.sync
        y = torch.randn(3, device="tpu") * 2
        assert y.shape == (3,)
    torch_tpu.sync_mode(False)
    assert not torch_tpu.config.sync


def test_sync_mode_env_var_applies_at_start():
    import subprocess
    import sys

    code = "import tpu_interactive as t; print(t.config.sync)"
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "TPU_LAUNCH_BLOCKING": "1"},
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("True"), out.stderr


def test_nan_check_raises_at_the_op():
    x = torch.tensor([1.0, -1.0], device="tpu")
    with torch_tpu.nan_check(True):
        with pytest.raises(FloatingPointError, match=r"aten::log.*NaN/Inf: 1 of 2") as err:
            torch.log(x)
        assert "test_backend_core.py" in str(err.value)
    assert torch.log(x).cpu()[0].item() == 0.0  # off again: NaN allowed


# ---------------------------------------------------------------- fallback, info, stats
def test_fallback_is_counted_warned_or_refused():
    from tpu_interactive.backend.dispatch import TPUFallbackWarning
    from tpu_interactive.backend.fallback import _warned

    from helpers import cpu_only_scale

    x = torch.rand(5) + 0.5
    before = torch_tpu.stats()["fallback_counts"]
    _warned.discard("tpu_test::cpu_only_scale.default")
    with pytest.warns(TPUFallbackWarning, match="cpu_only_scale") as caught:
        out = cpu_only_scale(x.to("tpu"), 3.0)
    assert any("test_backend_core.py" in w.filename for w in caught), "the warning must point at the user's line"
    assert_same(out, x * 3.0)
    after = torch_tpu.stats()["fallback_counts"]
    count = lambda counts: sum(v for k, v in counts.items() if "cpu_only_scale" in k)  # noqa: E731
    assert count(after) == count(before) + 1
    with torch_tpu.cpu_fallback(False):
        with pytest.raises(NotImplementedError, match="cpu_only_scale.*no tpu lowering"):
            cpu_only_scale(x.to("tpu"), 3.0)


def test_backend_info_is_honest():
    info = torch_tpu.backend_info()
    import jax

    assert info.platform == jax.devices()[0].platform
    assert info.device_count == len(jax.devices())
    if info.platform == "cpu":
        assert info.emulated and "emulated on XLA:CPU" in info.summary


def test_memory_accounting_exact():
    import gc

    # tracked: our own count of live device buffers (bytes_in_use is the device's own figure where it
    # reports one, as a TPU does, and includes what jax holds besides tensors)
    gc.collect()
    base = torch_tpu.memory_stats()["tracked_bytes_in_use"]
    x = torch.randn(256, 256, device="tpu")
    v = x[:, 1:]
    assert torch_tpu.memory_stats()["tracked_bytes_in_use"] == base + 256 * 256 * 4
    del x
    gc.collect()
    assert torch_tpu.memory_stats()["tracked_bytes_in_use"] == base + 256 * 256 * 4  # the view keeps it alive
    del v
    gc.collect()
    assert torch_tpu.memory_stats()["tracked_bytes_in_use"] == base


def test_stats_count_ops():
    before = torch_tpu.stats()
    x = torch.ones(3, device="tpu")
    (x + x).cpu()
    delta = torch_tpu.stats_diff(before, torch_tpu.stats())
    assert delta["op_counts"].get("aten::add.Tensor") == 1
    assert delta["d2h_count"] >= 1


@pytest.mark.parametrize("write", [
    lambda x: x[1:].copy_(x[:-1]),
    lambda x: x[1:].add_(x[:-1]),
    lambda x: x.add_(x),
    lambda x: x[:3].copy_(x[3:]),
    lambda x: x[:4].mul_(x[2:]),
], ids=["copy_shifted", "add_shifted", "self", "disjoint", "mul_overlap"])
def test_partial_overlap_writes_behave_like_cpu(write):
    cpu, dev = torch.arange(6.0), torch.arange(6.0, device="tpu")
    try:
        write(cpu)
    except RuntimeError as cpu_error:
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            write(dev)
        assert "single memory location" in str(cpu_error)
        assert torch.equal(dev.cpu(), torch.arange(6.0)), "a refused write must not change the tensor"
        return
    write(dev)
    assert torch.equal(dev.cpu(), cpu)


def test_deepcopy_pickle_and_load_onto_tpu_keep_values_and_aliasing(tmp_path):
    """copy.deepcopy / pickle / torch.load allocate raw tpu storages (torch.UntypedStorage(n, device=...)),
    which a Python backend has no C++ allocator for: they must work, not crash the interpreter."""
    import pickle

    base = torch.arange(6.0).to("tpu")
    view = base[2:5]
    base_copy, view_copy = copy.deepcopy([base, view])
    assert torch.equal(base_copy.cpu(), base.cpu()) and torch.equal(view_copy.cpu(), view.cpu())
    assert view_copy.untyped_storage().data_ptr() == base_copy.untyped_storage().data_ptr()  # still aliases
    assert base_copy.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()  # a new buffer
    base_copy.add_(1)
    assert torch.equal(view_copy.cpu(), torch.tensor([3.0, 4.0, 5.0]))
    assert torch.equal(base.cpu(), torch.arange(6.0))  # the original is untouched

    model = _mlp().to("tpu")
    twin = copy.deepcopy(model)
    assert all(isinstance(p, nn.Parameter) and p.device.type == "tpu" for p in twin.parameters())
    x = torch.randn(3, 20).to("tpu")
    assert torch.equal(twin(x).cpu(), model(x).cpu())

    path = tmp_path / "on_tpu.pt"
    torch.save({"base": base, "view": view}, path)
    loaded = torch.load(path)  # no map_location: back onto tpu
    assert loaded["base"].device.type == "tpu" and torch.equal(loaded["view"].cpu(), view.cpu())
    assert torch.equal(pickle.loads(pickle.dumps(base)).cpu(), base.cpu())


def test_after_import_runs_once_the_module_is_imported(tmp_path, monkeypatch):
    import importlib
    import sys

    from tpu_interactive.backend.import_hooks import after_import

    (tmp_path / "late_module_for_hook.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("late_module_for_hook", lambda m: seen.append(m.VALUE + 1))
    assert seen == [] and "late_module_for_hook" not in sys.modules  # nothing imported for us
    importlib.import_module("late_module_for_hook")
    assert seen == [42]
    after_import("late_module_for_hook", lambda m: seen.append(m.VALUE))  # already imported: at once
    assert seen == [42, 41]
    importlib.reload(sys.modules["late_module_for_hook"])
    assert seen == [42, 41]  # one-shot
    del sys.modules["late_module_for_hook"]


_BACKWARD_THREAD = """
import json, threading, torch, tpu_interactive
x = torch.ones(3, device="tpu", requires_grad=True)
seen = []
x.register_hook(lambda g: seen.append(threading.get_ident()))
(x * 2).sum().backward()
print("RESULT " + json.dumps({"caller": seen == [threading.get_ident()], "grad": x.grad.cpu().tolist()}))
"""


@pytest.mark.parametrize("setting,on_caller", [("", True), ("device", False)])
def test_backward_runs_on_the_calling_thread_unless_asked_otherwise(setting, on_caller):
    """torch's worker thread for the device only hands nodes back and forth with the caller: the
    importing thread's backward runs on it (TPU_INTERACTIVE_BACKWARD_THREAD=device keeps torch's)."""
    env = {"TPU_INTERACTIVE_BACKWARD_THREAD": setting} if setting else {}
    result = run_result_script(_BACKWARD_THREAD, env)
    assert result == {"caller": on_caller, "grad": [2.0, 2.0, 2.0]}
