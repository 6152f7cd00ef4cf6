"""Softmax, normalization layers, losses, embedding: forward and gradients vs CPU PyTorch."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import helpers
from helpers import TPU, assert_same, both, check, floats, grad_check, raises_like_cpu, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")

def check_grad(fn, *inputs, tol="ulps"):
    """Forward values and .grad of every input that requires grad agree with CPU autograd."""
    cpu = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
           for x in inputs]
    dev = [to_tpu(x) for x in cpu]
    expected, actual = fn(*cpu), fn(*dev)
    assert_same(actual, expected, tol=tol)
    expected.sum().backward() if expected.dim() else expected.backward()
    actual.sum().backward() if actual.dim() else actual.backward()
    for c, d in zip(cpu, dev):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            assert_same(d.grad, c.grad, tol=tol)


def module_pair(module):
    return module, copy.deepcopy(module).to(TPU)


def rand(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


# ---------------------------------------------------------------- softmax
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_forward_and_grad(dim):
    x, w = rand(4, 5, 6), torch.arange(6.0)  # weights make the gradient non-trivial
    check_grad(lambda a: F.softmax(a, dim) * w.to(a.device), x)
    check_grad(lambda a: F.log_softmax(a, dim) * w.to(a.device), x)


def test_softmax_edges():
    check(lambda a: F.softmax(a, 1), torch.randn(3, 7).bfloat16(), tol="ulps")
    check(lambda a: F.log_softmax(a, 0), torch.randn(3, 7).bfloat16(), tol="ulps")
    check(lambda a: F.softmax(a, 0), torch.tensor(2.0))
    check(lambda a: F.log_softmax(a, -1), torch.tensor(2.0))
    check(lambda a: F.softmax(a, 1), torch.empty(0, 4))
    x = torch.tensor([[-math.inf, 0.0, 1.0], [math.inf, 1.0, 0.0], [-math.inf] * 3])
    check(lambda a: F.softmax(a, 1), x)
    check(lambda a: F.log_softmax(a, 1), x)
    check(lambda a: F.softmax(a.t(), 1), torch.randn(5, 3), tol="ulps")  # non-contiguous
    check(lambda a: torch.softmax(a, 1, dtype=torch.float64), torch.randn(3, 4))
    check(lambda a: F.softmax(a, 1), torch.randn(2, 3, dtype=torch.float64))


# ---------------------------------------------------------------- layer norm
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_module(affine):
    cpu, dev = module_pair(nn.LayerNorm([5, 6], elementwise_affine=affine))
    if affine:
        with torch.no_grad():
            cpu.weight.normal_(), cpu.bias.normal_()
        cpu, dev = module_pair(cpu)
    x = rand(3, 4, 5, 6)
    xd = to_tpu(x)
    assert_same(dev(xd), cpu(x), tol="ulps")
    w = torch.randn(3, 4, 5, 6)
    (cpu(x) * w).sum().backward()
    (dev(xd) * w.to(TPU)).sum().backward()
    assert_same(xd.grad, x.grad, tol="ulps")
    if affine:
        assert_same(dev.weight.grad, cpu.weight.grad, tol="ulps")
        assert_same(dev.bias.grad, cpu.bias.grad, tol="ulps")


def test_layer_norm_functional():
    x, w, b = rand(4, 8), rand(8), rand(8)
    check_grad(lambda a, ww, bb: F.layer_norm(a, (8,), ww, bb, 1e-3) ** 2, x, w, b)
    check_grad(lambda a, ww: F.layer_norm(a, (8,), ww), x, w)  # weight without bias
    check(lambda a: F.layer_norm(a, (6,)), torch.randn(2, 6).bfloat16(), tol="ulps")
    check(lambda a: torch.native_layer_norm(a, (6,), None, None, 1e-5), torch.randn(2, 3, 6), tol="ulps")
    check(lambda a: F.layer_norm(a.transpose(0, 1), (4,)), torch.randn(4, 3), tol="ulps")


# ---------------------------------------------------------------- batch norm
def test_batch_norm2d_train_two_steps_and_eval():
    cpu, dev = module_pair(nn.BatchNorm2d(3, momentum=0.3))
    with torch.no_grad():
        cpu.weight.uniform_(0.5, 1.5), cpu.bias.normal_()
    cpu, dev = module_pair(cpu)
    for step in range(2):
        x = rand(4, 3, 5, 5) * (step + 1) + step
        xd = to_tpu(x)
        g = torch.randn(4, 3, 5, 5)
        yc, yd = cpu(x), dev(xd)
        assert_same(yd, yc, tol="ulps")
        (yc * g).sum().backward()
        (yd * g.to(TPU)).sum().backward()
        assert_same(xd.grad, x.grad, tol="accumulated")
        assert_same(dev.running_mean, cpu.running_mean, tol="ulps")
        assert_same(dev.running_var, cpu.running_var, tol="ulps")
        assert int(dev.num_batches_tracked.cpu()) == step + 1
    assert_same(dev.weight.grad, cpu.weight.grad, tol="loose")
    assert_same(dev.bias.grad, cpu.bias.grad, tol="loose")
    cpu.eval(), dev.eval()
    x = rand(2, 3, 4, 4)
    xd = to_tpu(x)
    assert_same(dev(xd), cpu(x), tol="ulps")
    cpu(x).sum().backward()
    dev(xd).sum().backward()
    assert_same(xd.grad, x.grad, tol="ulps")
    assert_same(dev.running_mean, cpu.running_mean, tol="ulps")  # eval leaves stats alone


def test_batch_norm_variants():
    # BatchNorm1d on (N, C), cumulative moving average (momentum=None), no running stats, no affine
    for make in (lambda: nn.BatchNorm1d(4), lambda: nn.BatchNorm1d(4, momentum=None),
                 lambda: nn.BatchNorm1d(4, track_running_stats=False), lambda: nn.BatchNorm1d(4, affine=False)):
        cpu, dev = module_pair(make())
        for _ in range(2):
            x = rand(6, 4)
            xd = to_tpu(x)
            assert_same(dev(xd), cpu(x), tol="ulps")
            cpu(x).pow(2).sum().backward()
            dev(xd).pow(2).sum().backward()
            assert_same(xd.grad, x.grad, tol="loose")
        if cpu.running_mean is not None:
            assert_same(dev.running_mean, cpu.running_mean, tol="ulps")
            assert_same(dev.running_var, cpu.running_var, tol="ulps")


def test_batch_norm_bf16_and_functional():
    x = torch.randn(4, 3, 6).bfloat16()
    rm, rv = torch.zeros(3), torch.ones(3)
    rmd, rvd = rm.to(TPU), rv.to(TPU)
    assert_same(F.batch_norm(x.to(TPU), rmd, rvd, training=True), F.batch_norm(x, rm, rv, training=True), tol="ulps")
    assert_same(rmd, rm, tol="ulps")
    assert_same(rvd, rv, tol="ulps")
    check(lambda a, m, v: torch.ops.aten._native_batch_norm_legit_no_training(a, None, None, m, v, 0.1, 1e-5),
          torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5, tol="ulps")


# ---------------------------------------------------------------- group norm
@pytest.mark.parametrize("groups,affine", [(1, True), (3, True), (6, False)])
def test_group_norm_module(groups, affine):
    cpu, dev = module_pair(nn.GroupNorm(groups, 6, affine=affine))
    if affine:
        with torch.no_grad():
            cpu.weight.normal_(), cpu.bias.normal_()
        cpu, dev = module_pair(cpu)
    x = rand(2, 6, 4, 5)
    xd = to_tpu(x)
    g = torch.randn(2, 6, 4, 5)
    assert_same(dev(xd), cpu(x), tol="ulps")
    (cpu(x) * g).sum().backward()
    (dev(xd) * g.to(TPU)).sum().backward()
    assert_same(xd.grad, x.grad, tol="accumulated")
    if affine:
        assert_same(dev.weight.grad, cpu.weight.grad, tol="loose")
        assert_same(dev.bias.grad, cpu.bias.grad, tol="loose")


def test_group_norm_3d_and_bf16():
    check_grad(lambda a: F.group_norm(a, 2) ** 2, rand(3, 4, 7))
    check(lambda a: F.group_norm(a, 2), torch.randn(2, 4, 5).bfloat16(), tol="ulps")


# ---------------------------------------------------------------- nll / cross entropy
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    x = F.log_softmax(torch.randn(8, 5), 1).requires_grad_()
    t = torch.randint(0, 5, (8,))
    t[2] = 1
    w = torch.rand(5) + 0.5
    check_grad(lambda a: F.nll_loss(a, t.to(a.device), reduction=reduction), x)
    check_grad(lambda a: F.nll_loss(a, t.to(a.device), weight=w.to(a.device), reduction=reduction), x)
    check_grad(lambda a: F.nll_loss(a, t.to(a.device), ignore_index=1, reduction=reduction), x)
    check_grad(lambda a: F.nll_loss(a, t.to(a.device), w.to(a.device), ignore_index=1, reduction=reduction), x)
    # 1-D input (no batch) and the 2-D (N, C, H, W) path
    check_grad(lambda a: F.nll_loss(a[0], t[0].to(a.device), reduction=reduction), x)
    img = rand(2, 5, 3, 4)
    timg = torch.randint(0, 5, (2, 3, 4))
    check_grad(lambda a: F.nll_loss(a, timg.to(a.device), w.to(a.device), ignore_index=2, reduction=reduction), img)


def test_nll_loss_all_ignored_and_bad_target():
    x = rand(3, 4)
    t = torch.full((3,), -100)
    check(lambda a: F.nll_loss(a, t.to(a.device)), x)  # 0/0 -> nan, like torch
    check(lambda a: F.nll_loss(a, t.to(a.device), reduction="sum"), x)
    # an out-of-range target: CPU's error (a NaN loss before: nothing named the op or the line)
    for target in (torch.tensor([0, 7, 1]), torch.tensor([0, -2, 1])):
        raises_like_cpu(lambda a, b: F.nll_loss(a, b), x, target, expected=IndexError)
        raises_like_cpu(lambda a, b: F.cross_entropy(a, b, ignore_index=7), x, target.clamp(max=4),
                        expected=IndexError)
    raises_like_cpu(lambda a, b: F.cross_entropy(a, b), rand(2, 4, 3, 3), torch.full((2, 3, 3), 4),
                    expected=IndexError)  # the 2-d path
    raises_like_cpu(lambda a, b: F.multi_margin_loss(a, b), x, torch.tensor([0, 4, 1]))
    check(lambda a: F.nll_loss(a, torch.tensor([0, 7, 1], device=a.device), ignore_index=7), x)


@pytest.mark.parametrize("kwargs", [{}, {"label_smoothing": 0.2}, {"ignore_index": 2},
                                    {"reduction": "sum"}, {"reduction": "none"},
                                    {"label_smoothing": 0.1, "ignore_index": 0, "reduction": "sum"}])
def test_cross_entropy(kwargs):
    x, t = rand(6, 4), torch.tensor([0, 1, 2, 3, 2, 1])
    check_grad(lambda a: F.cross_entropy(a, t.to(a.device), **kwargs), x)
    w = torch.tensor([0.5, 1.0, 2.0, 1.5])
    check_grad(lambda a: F.cross_entropy(a, t.to(a.device), weight=w.to(a.device), **kwargs), x)
    img, timg = rand(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3))
    check_grad(lambda a: F.cross_entropy(a, timg.to(a.device), **kwargs), img)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_unbatched_input_with_a_one_element_target_as_cpu(reduction):
    """CPU's nll_loss forward takes a 1-d input's 1-element 1-d target as its class (torch's Python meta
    kernel refused it); its backward refuses it, on CPU too: same values, same error."""
    x, w = helpers.rand(3, seed=3), torch.rand(3, generator=torch.Generator().manual_seed(4))
    for target in (torch.tensor([1]), torch.tensor([-100]), torch.tensor([1, 2]), torch.tensor([7])):
        both(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction), x, target, w, message=True)
        both(lambda x, t: F.nll_loss(x.log_softmax(0), t, reduction=reduction), x, target, message=True)
    raises_like_cpu(lambda x, t: F.cross_entropy(x.requires_grad_(), t, reduction=reduction).backward(), x.clone(),
                    torch.tensor([1]))


def test_cross_entropy_probability_targets():
    x, p = rand(5, 4), F.softmax(torch.randn(5, 4), 1)
    check_grad(lambda a: F.cross_entropy(a, p.to(a.device)), x)
    check_grad(lambda a: F.cross_entropy(a, p.to(a.device), label_smoothing=0.3), x)


# ---------------------------------------------------------------- regression / binary losses
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    x, y = rand(4, 5), torch.randn(4, 5)
    for loss in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss):
        check_grad(lambda a: loss(a, y.to(a.device), reduction=reduction), x)
    for beta in (0.0, 0.5, 2.0):
        check_grad(lambda a: F.smooth_l1_loss(a, y.to(a.device), reduction=reduction, beta=beta), x)
    for delta in (0.3, 3.0):
        check_grad(lambda a: F.huber_loss(a, y.to(a.device), reduction=reduction, delta=delta), x)
    # gradient w.r.t. the target too
    check_grad(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, rand(4, 5))
    check(lambda a, b: F.mse_loss(a, b), torch.randn(3, 4).bfloat16(), torch.randn(3, 4).bfloat16(), tol="ulps")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    p = torch.rand(4, 5).clamp(0.05, 0.95).requires_grad_()
    t, w = torch.rand(4, 5), torch.rand(4, 5)
    check_grad(lambda a: F.binary_cross_entropy(a, t.to(a.device), reduction=reduction), p)
    check_grad(lambda a: F.binary_cross_entropy(a, t.to(a.device), w.to(a.device), reduction=reduction), p)
    edge = torch.tensor([0.0, 1.0, 0.5, 1.0])
    check(lambda a: F.binary_cross_entropy(a, torch.tensor([1.0, 0.0, 1.0, 1.0]).to(a.device),
                                           reduction=reduction), edge)  # log clamped at -100


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits(reduction):
    x, t = rand(4, 5) * 5, torch.rand(4, 5)
    w, pw = torch.rand(5), torch.rand(5) * 3
    check_grad(lambda a: F.binary_cross_entropy_with_logits(a, t.to(a.device), reduction=reduction), x)
    check_grad(lambda a: F.binary_cross_entropy_with_logits(
        a, t.to(a.device), w.to(a.device), pos_weight=pw.to(a.device), reduction=reduction), x)
    big = torch.tensor([-200.0, -30.0, 0.0, 30.0, 200.0])
    check(lambda a: F.binary_cross_entropy_with_logits(a, torch.tensor([1.0, 0, 1, 0, 1]).to(a.device),
                                                       reduction=reduction), big)


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(log_target):
    x = F.log_softmax(torch.randn(4, 5), 1).requires_grad_()
    t = F.softmax(torch.randn(4, 5), 1)
    t = t.log() if log_target else t
    for reduction in ("batchmean", "sum", "none"):
        check_grad(lambda a: F.kl_div(a, t.to(a.device), reduction=reduction, log_target=log_target), x)


# ---------------------------------------------------------------- embedding
@pytest.mark.parametrize("padding_idx,scale", [(None, False), (0, False), (None, True), (2, True)])
def test_embedding_module(padding_idx, scale):
    cpu, dev = module_pair(nn.Embedding(10, 4, padding_idx=padding_idx, scale_grad_by_freq=scale))
    idx = torch.tensor([[1, 2, 0, 2], [9, 2, 5, 0]])
    g = torch.randn(2, 4, 4)
    yc, yd = cpu(idx), dev(idx.to(TPU))
    assert_same(yd, yc)
    (yc * g).sum().backward()
    (yd * g.to(TPU)).sum().backward()
    assert_same(dev.weight.grad, cpu.weight.grad, tol="ulps")


def test_embedding_functional():
    w = rand(6, 3)
    check_grad(lambda ww: F.embedding(torch.tensor([5, 0, 5]).to(ww.device), ww), w)
    check_grad(lambda ww: F.embedding(torch.tensor(3).to(ww.device), ww), w)  # 0-dim index
    check(lambda ww, i: F.embedding(i, ww), torch.randn(6, 3).bfloat16(), torch.tensor([[1, 2]]).int())
    check(lambda ww: F.embedding(torch.empty(0, dtype=torch.long).to(ww.device), ww), torch.randn(6, 3))


_BAD_INDICES = {
    "embedding": lambda w, i: F.embedding(i, w),
    "embedding_padding": lambda w, i: F.embedding(i, w, padding_idx=0),
    "embedding_int_table": lambda w, i: F.embedding(i, (w * 10).long()),
    # one bag: CPU's sum/mean kernel names the index's position in its chunk of bags (the flat position
    # here; with several bags it may say "Expected i < index_size" instead), its max kernel no position
    "bag_sum": lambda w, i: F.embedding_bag(i, w, torch.tensor([0]).to(i.device)),
    "bag_mean": lambda w, i: F.embedding_bag(i, w, torch.tensor([0]).to(i.device), mode="mean"),
    "bag_max": lambda w, i: F.embedding_bag(i, w, torch.tensor([0, 2]).to(i.device), mode="max"),
}


@pytest.mark.parametrize("case", list(_BAD_INDICES))
@pytest.mark.parametrize("index", [[1, 2, 10, 3], [1, -1, 2, 3]], ids=["past_the_end", "negative"])
def test_embedding_index_errors_like_cpu(case, index):
    """An out-of-range index raises CPU's error (type and message: embedding_bag names the position) in
    plain eager, in fused mode and in a compiled graph; it was a NaN row (a 0 in an integer table)."""
    import tpu_interactive as tt

    fn, w, idx = _BAD_INDICES[case], torch.randn(10, 3), torch.tensor(index)
    with pytest.raises((IndexError, RuntimeError)) as cpu:
        fn(w, idx)
    wd, idxd = w.to(TPU), idx.to(TPU)
    for run in (lambda: fn(wd, idxd).cpu(), lambda: _fused(lambda: fn(wd, idxd).cpu()),
                lambda: tt.compile(fn)(wd, idxd).cpu()):
        with pytest.raises(type(cpu.value)) as got:
            run()
        assert str(got.value).splitlines()[0] == str(cpu.value), (case, str(got.value))
    good = torch.tensor([1, 2, 9, 3])
    assert_same(fn(wd, good.to(TPU)), fn(w, good))  # the device keeps working, the table unchanged
    torch._dynamo.reset()


def _fused(run):
    import tpu_interactive as tt

    with tt.fuse():
        return run()


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(mode, include_last_offset):
    w = torch.randn(10, 3)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7])
    offsets = torch.tensor([0, 4, 4, 7])  # bag 1 is empty
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([len(idx)])])  # documented: the last offset == len
    for padding_idx in (None, 4):
        cpu, dev = module_pair(nn.EmbeddingBag(10, 3, mode=mode, include_last_offset=include_last_offset,
                                               padding_idx=padding_idx, _weight=w.clone()))
        yc, yd = cpu(idx, offsets), dev(idx.to(TPU), offsets.to(TPU))
        assert_same(yd, yc, tol="ulps")
        g = torch.randn(yc.shape)
        (yc * g).sum().backward()
        (yd * g.to(TPU)).sum().backward()
        assert_same(dev.weight.grad, cpu.weight.grad, tol="ulps")
    # 2-D input (fixed-size bags) goes through the same ops
    check_grad(lambda ww: F.embedding_bag(torch.tensor([[1, 2], [3, 1]]).to(ww.device), ww, mode=mode), rand(5, 2))


def test_embedding_bag_per_sample_weights_and_freq():
    w, psw = rand(8, 3), rand(6)
    idx, offsets = torch.tensor([1, 2, 2, 5, 7, 1]), torch.tensor([0, 2, 3])
    check_grad(lambda ww, p: F.embedding_bag(idx.to(ww.device), ww, offsets.to(ww.device), mode="sum",
                                             per_sample_weights=p), w, psw)
    # scale_grad_by_freq: CPU 2.13 divides by the wrong count for some rows (pytorch#190063);
    # expected values by hand: bags {1,2},{2},{5,7,1}; counts 1:2, 2:2, 5:1, 7:1
    ones = torch.ones(8, 1).to(TPU).requires_grad_()
    F.embedding_bag(idx.to(TPU), ones, offsets.to(TPU), mode="mean", scale_grad_by_freq=True).sum().backward()
    expected = torch.tensor([0, (1 / 2 + 1 / 3) / 2, (1 / 2 + 1) / 2, 0, 0, 1 / 3, 0, 1 / 3])[:, None]
    assert_same(ones.grad, expected, tol="ulps")
    same_counts = torch.tensor([1, 2, 2, 1, 3, 3])  # every count equal: CPU is right here
    check_grad(lambda ww: F.embedding_bag(same_counts.to(ww.device), ww, offsets.to(ww.device), mode="sum",
                                          scale_grad_by_freq=True), w)


# ---------------------------------------------------------------- fused RNN cells
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("module", ["LSTMCell", "GRUCell", "LSTM", "GRU"])
def test_rnn_cells_forward_and_grads_match_cpu(module, bias):
    """nn.LSTMCell/GRUCell reach _thnn_fused_{lstm,gru}_cell (+ backward) on every non-CPU device;
    CPU runs its unfused composite, so agreement checks the fused kernels' gate layout."""
    torch.manual_seed(0)
    cpu_module = getattr(nn, module)(4, 3, bias=bias)
    tpu_module = copy.deepcopy(cpu_module).to(TPU)
    x = torch.randn(5, 2, 4) if module in ("LSTM", "GRU") else torch.randn(2, 4)
    x_cpu, x_tpu = x.clone().requires_grad_(), to_tpu(x).requires_grad_()
    expected, actual = floats(cpu_module(x_cpu)), floats(tpu_module(x_tpu))
    assert_same(actual, expected, tol="ulps")
    # weigh outputs differently so a swapped h/c gradient cannot cancel out
    sum(((i + 1) * t.sin()).sum() for i, t in enumerate(expected)).backward()
    sum(((i + 1) * t.sin()).sum() for i, t in enumerate(actual)).backward()
    assert_same(x_tpu.grad, x_cpu.grad, tol="ulps")
    for p_tpu, p_cpu in zip(tpu_module.parameters(), cpu_module.parameters()):
        assert_same(p_tpu.grad, p_cpu.grad, tol="ulps")


# ---------------------------------------------------------------- margin losses
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss_and_grad(reduction, p):
    x, y, w = helpers.rand(4, 5), torch.tensor([0, 4, 2, 2]), torch.rand(5, generator=torch.Generator().manual_seed(1))
    grad_check(lambda a: F.multi_margin_loss(a, y.to(a.device), p=p, margin=0.7, reduction=reduction), x)
    grad_check(lambda a: F.multi_margin_loss(a, y.to(a.device), p=p, weight=w.to(a.device), reduction=reduction), x)
    grad_check(lambda a: F.multi_margin_loss(a, y[1].to(a.device), p=p, reduction=reduction), x[0])  # 1-D input


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_and_grad(reduction):
    x = helpers.rand(4, 5)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, 2, 0], [-1, 2, 3, 0, 0], [4, 2, 0, -1, 1]])  # stops at -1
    grad_check(lambda a: F.multilabel_margin_loss(a, t.to(a.device), reduction=reduction), x)
    grad_check(lambda a: F.multilabel_margin_loss(a, t[0].to(a.device), reduction=reduction), x[0])
