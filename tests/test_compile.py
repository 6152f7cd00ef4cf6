"""torch.compile(backend="tpu"): compiled vs eager tpu vs CPU, training steps, compile cache/causes."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import TPU, assert_same, to_tpu

import tpu_interactive as tt
from tpu_interactive.backend import compiler as tcompile
from tpu_interactive.backend import stats as tstats



@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    tcompile.clear_cache()
    yield
    torch._dynamo.reset()


def _compiles(name_part=None):
    events = tt.stats()["recent_compiles"]
    return [e for e in events if name_part is None or name_part in e["name"]]


# ---------------------------------------------------------------- models
def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def convnet():
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 3 * 3, 5))


class Block(nn.Module):
    """embedding + pre-LN causal self-attention (SDPA) + MLP + vocabulary head."""

    def __init__(self, vocab=13, dim=16, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.heads = heads

    def forward(self, idx):
        x = self.emb(idx)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return self.head(x + self.mlp(self.ln2(x)))


def _pair(factory, seed=0):
    torch.manual_seed(seed)
    cpu = factory()
    dev = copy.deepcopy(cpu).to(TPU)
    return cpu, dev


def _inputs(kind):
    torch.manual_seed(1)
    if kind == "mlp":
        return torch.randn(4, 6), torch.randn(4, 3)
    if kind == "conv":
        return torch.randn(3, 2, 6, 6), torch.randint(0, 5, (3,))
    idx = torch.randint(0, 13, (2, 7))
    return idx, torch.randint(0, 13, (2, 7))


def _loss(kind, out, target):
    if kind == "mlp":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


FACTORIES = {"mlp": mlp, "conv": convnet, "block": Block}


# ---------------------------------------------------------------- correctness
@pytest.mark.parametrize("kind", ["mlp", "conv", "block"])
def test_forward_compiled_matches_eager_and_cpu(kind):
    cpu, dev = _pair(FACTORIES[kind])
    cpu.eval(), dev.eval()
    x, _ = _inputs(kind)
    with torch.no_grad():
        expected = cpu(x)
        eager = dev(to_tpu(x))
        compiled = tt.compile(dev)(to_tpu(x))
    assert_same(eager, expected, tol="ulps")
    assert_same(compiled, expected, tol="ulps")
    assert [e for e in _compiles() if not e["hit"]], "nothing was compiled by the tpu backend"


@pytest.mark.parametrize("kind", ["mlp", "conv", "block"])
def test_training_step_matches_cpu(kind):
    cpu, dev = _pair(FACTORIES[kind])
    x, target = _inputs(kind)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, target):
        opt.zero_grad()
        loss = _loss(kind, model(x), target)
        loss.backward()
        opt.step()
        return loss

    compiled = tt.compile(dev)
    for _ in range(2):  # the second step reuses both compiled graphs
        loss_cpu = step(cpu, opt_cpu, x, target)
        loss_dev = step(compiled, opt_dev, to_tpu(x), to_tpu(target))
        assert_same(loss_dev.detach(), loss_cpu.detach(), tol="ulps")
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        assert_same(p_dev.detach(), p_cpu.detach(), tol="accumulated"), name
    for b_cpu, b_dev in zip(cpu.buffers(), dev.buffers()):  # BatchNorm running stats
        assert_same(b_dev, b_cpu, tol="ulps")
    kinds = {e["name"].rsplit(".", 1)[-1] for e in _compiles() if not e["hit"]}
    assert {"fw", "bw"} <= kinds
    assert any(e["hit"] for e in _compiles(".bw"))


def test_backend_by_name_and_shortcut():
    assert "tpu" in torch._dynamo.list_backends()
    fn = lambda a, b: torch.relu(a @ b + 1)  # noqa: E731
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    expected = fn(a, b)
    assert_same(torch.compile(fn, backend="tpu")(to_tpu(a), to_tpu(b)), expected)
    assert_same(tt.compile(fn)(to_tpu(a), to_tpu(b)), expected)


def test_dtypes_promotion_and_views():
    def fn(x, i):
        y = x.t().reshape(-1)[2:9:2] * 2 + i  # float * int -> float, views in the graph
        z = (i > 1).sum() + x.to(torch.bfloat16).float().mean()
        return y, z, x.unsqueeze(0).expand(2, 4, 3).permute(2, 0, 1).contiguous(), i.double() / 3

    x = torch.randn(4, 3)
    i = torch.arange(4)
    expected = fn(x, i)
    actual = tt.compile(fn)(to_tpu(x), to_tpu(i))
    assert_same(actual, expected, 1e-2, 1e-2)  # bfloat16 round trip in z
    assert [a.dtype for a in actual] == [e.dtype for e in expected]


# ---------------------------------------------------------------- cache, causes
def test_recompile_cause_and_hits():
    cpu, dev = _pair(mlp)
    compiled = tt.compile(dev)
    tstats.reset()
    with torch.no_grad():
        compiled(torch.randn(4, 6, device=TPU))
        compiled(torch.randn(4, 6, device=TPU))
        out = compiled(torch.randn(9, 6, device=TPU))
    assert out.shape == (9, 3)
    events = _compiles()
    assert [e["hit"] for e in events] == [False, True, False]
    assert events[0]["cause"] == "first compile"
    cause = events[2]["cause"]
    assert "(4, 6) float32 -> (9, 6) float32" in cause and "shape" in cause, cause
    snap = tt.stats()
    assert snap["compile_hits"] == 1 and snap["compile_misses"] == 2 and snap["compile_seconds"] > 0


def test_dtype_change_cause_and_clear_cache():
    fn = tt.compile(lambda x: x * 2 + 1)
    tstats.reset()
    fn(torch.ones(3, device=TPU))
    fn(torch.ones(3, device=TPU, dtype=torch.float64))
    assert "dtype (3,) float32 -> (3,) float64" in _compiles()[-1]["cause"]
    tcompile.clear_cache()
    fn(torch.ones(3, device=TPU))
    assert _compiles()[-1]["hit"] is False and _compiles()[-1]["cause"] == "first compile"


def test_pallas_flag_is_part_of_the_key():
    fn = tt.compile(lambda a, b: a @ b)
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    tstats.reset()
    assert_same(fn(to_tpu(a), to_tpu(b)), a @ b)
    with tt.pallas(True):
        assert_same(fn(to_tpu(a), to_tpu(b)), a @ b)
    assert "pallas flag False -> True" in _compiles()[-1]["cause"]
    paths = tt.stats()["kernel_paths"]["aten::mm.default"]
    assert paths.get("pallas") == 1 and paths.get("xla") == 1


# ---------------------------------------------------------------- randomness
def test_dropout_reproducible_under_manual_seed():
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5)).to(TPU)
    compiled = tt.compile(model)
    x = torch.ones(4, 8, device=TPU)
    torch.manual_seed(3)
    a = compiled(x).cpu()
    torch.manual_seed(3)
    b = compiled(x).cpu()
    c = compiled(x).cpu()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    zeros = (a == 0).float().mean().item()
    assert 0.3 < zeros < 0.7
    kept = model[0](x).detach().cpu() * 2
    assert torch.allclose(a[a != 0], kept[a != 0], atol=1e-5)


def test_random_factories_in_graph():
    fn = tt.compile(lambda x: (x + torch.rand_like(x), torch.randn(1000, device=x.device)))
    torch.manual_seed(0)
    u, n = fn(torch.zeros(2000, device=TPU))
    u, n = u.cpu(), n.cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.05
    assert abs(n.mean()) < 0.15 and abs(n.std() - 1) < 0.15


# ---------------------------------------------------------------- errors, persistent cache
def test_unsupported_op_names_the_op():
    lib = torch.library.Library("tpucompiletest", "FRAGMENT")  # noqa: F841 - keeps the op alive
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
    fn = tt.compile(lambda x: torch.ops.tpucompiletest.twice(x) + 1)
    with pytest.raises(Exception, match=r"tpucompiletest::twice"):
        fn(torch.ones(3, device=TPU))


def test_persistent_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tt.config, "persistent_cache_dir", str(tmp_path))
    try:
        fn = tt.compile(lambda x: torch.sin(x) * 3 + x.sum())
        assert_same(fn(torch.ones(17, device=TPU)), torch.sin(torch.ones(17)) * 3 + 17)
        assert any(tmp_path.iterdir()), "JAX wrote nothing to the persistent cache directory"
    finally:
        monkeypatch.undo()
        tcompile.follow_persistent_cache_config()  # back to the session's cache


# ---------------------------------------------------------------- value checks inside compiled graphs
def test_out_of_range_index_in_compiled_graph_raises_like_eager_and_changes_nothing():
    def write(cache, pos, new):  # a static KV-cache update (transformers' generate)
        cache.index_copy_(0, pos, new)
        return cache.sum()

    def gather(x, idx):
        return x[idx] * 2

    torch._dynamo.reset()
    cache_cpu, new = torch.zeros(4, 3), torch.arange(3.0).view(1, 3)
    cache = cache_cpu.to(TPU)
    compiled_write = tt.compile(write)
    assert_same(compiled_write(cache, torch.tensor([1]).to(TPU), new.to(TPU)),
                write(cache_cpu, torch.tensor([1]), new))
    assert_same(cache, cache_cpu)
    with pytest.raises(IndexError, match=r"^index_copy_\(\): index 7 is out of bounds for dimension 0 with size 4$"):
        compiled_write(cache, torch.tensor([7]).to(TPU), (new + 5).to(TPU))
    assert_same(cache, cache_cpu)  # the failed call wrote nothing back

    x = torch.randn(4, 3)
    compiled_gather = tt.compile(gather)
    assert_same(compiled_gather(x.to(TPU), torch.tensor([3, -4]).to(TPU)), gather(x, torch.tensor([3, -4])))
    with pytest.raises(IndexError, match=r"^index -9 is out of bounds for dimension 0 with size 4$"):
        compiled_gather(x.to(TPU), torch.tensor([1, -9]).to(TPU))
    assert_same(compiled_gather(x.to(TPU), torch.tensor([0, 2]).to(TPU)), gather(x, torch.tensor([0, 2])))
    torch._dynamo.reset()


# ---------------------------------------------------------------- compiled optimizer steps (_foreach_* ops)
@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5),
], ids=["adamw", "adam-amsgrad", "sgd-nesterov", "rmsprop"])
def test_compiled_optimizer_step_matches_cpu(make_opt, no_fallback):
    torch._dynamo.reset()
    cpu, dev = _pair(mlp)
    opt_cpu, opt_dev = make_opt(cpu.parameters()), make_opt(dev.parameters())
    step_dev = tt.compile(opt_dev.step)
    x, target = _inputs("mlp")
    before = tt.stats()["compile_misses"]
    for _ in range(3):
        for model, opt, step, xs, ts in ((cpu, opt_cpu, opt_cpu.step, x, target),
                                         (dev, opt_dev, step_dev, to_tpu(x), to_tpu(target))):
            opt.zero_grad()
            F.mse_loss(model(xs), ts).backward()
            step()
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        assert_same(p_dev.detach(), p_cpu.detach(), tol="ulps")
    for s_cpu, s_dev in zip(opt_cpu.state.values(), opt_dev.state.values()):
        for key, value in s_cpu.items():
            if isinstance(value, torch.Tensor) and value.dim():
                assert_same(s_dev[key], value, tol="ulps")
    assert tt.stats()["compile_misses"] > before, "the optimizer step was not compiled by the tpu backend"
    torch._dynamo.reset()
