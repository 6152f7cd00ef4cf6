"""Convolution, pooling, upsampling, im2col/col2im and SDPA vs CPU PyTorch (values, indices, grads)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import TPU, assert_same, check

pytestmark = pytest.mark.usefixtures("no_fallback")


def grad_check(fn, *inputs, rtol=1e-5, atol=1e-5, seed=0):
    """fn's output and the grads of every floating input agree between CPU and tpu autograd."""
    cpu = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
           for x in inputs]
    dev = [x.detach().to(TPU).requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
           for x in inputs]
    expected = fn(*cpu)
    actual = fn(*dev)
    assert_same(actual, expected.detach(), rtol, atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=expected.dtype)
    expected.backward(g)
    actual.backward(g.to(TPU))
    for c, d in zip(cpu, dev):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            assert d.grad is not None, "no gradient reached a tpu input"
            assert_same(d.grad, c.grad, rtol, atol)


def module_grad_check(module, x, rtol=1e-5, atol=1e-5):
    """A module's output, input grad and parameter grads agree between CPU and tpu."""
    dev_module = copy.deepcopy(module).to(TPU)
    xc = x.clone().requires_grad_(True)
    xd = x.to(TPU).requires_grad_(True)
    expected, actual = module(xc), dev_module(xd)
    assert_same(actual, expected.detach(), rtol, atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected.backward(g)
    actual.backward(g.to(TPU))
    assert_same(xd.grad, xc.grad, rtol, atol)
    for (name, pc), (_, pd) in zip(module.named_parameters(), dev_module.named_parameters()):
        assert pd.grad is not None, f"no grad for {name}"
        assert_same(pd.grad, pc.grad, rtol, atol)


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------- convolution
@pytest.mark.parametrize("kwargs", [
    {}, {"stride": 2}, {"padding": 1}, {"padding": (1, 2), "stride": (2, 1)}, {"dilation": 2, "padding": 2},
    {"groups": 2}, {"stride": 3, "padding": 1, "dilation": (1, 2)},
])
def test_conv2d_forward_and_grad(kwargs):
    x, w, b = rand(2, 4, 9, 8), rand(6, 4 // kwargs.get("groups", 1), 3, 3, seed=1), rand(6, seed=2)
    grad_check(lambda x, w, b: F.conv2d(x, w, b, **kwargs), x, w, b, rtol=1e-4, atol=1e-4)


def test_conv2d_no_bias_noncontiguous_input():
    x = rand(2, 9, 8, 3).permute(0, 3, 1, 2)  # channels-last view
    w = rand(4, 3, 3, 3, seed=1)
    check(lambda x, w: F.conv2d(x, w), x, w, rtol=1e-4, atol=1e-4)


def test_conv_padding_same_even_kernel():
    # even kernel + 'same' pads asymmetrically before aten::convolution
    x, w = rand(1, 2, 7, 7), rand(3, 2, 4, 4, seed=1)
    check(lambda x, w: F.conv2d(x, w, padding="same"), x, w, rtol=1e-4, atol=1e-4)
    check(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("module,shape", [
    (nn.Conv1d(3, 5, 3, stride=2, padding=1), (2, 3, 11)),
    (nn.Conv1d(4, 4, 3, groups=4, dilation=2), (2, 4, 12)),
    (nn.Conv2d(3, 4, (3, 2), padding=(1, 0), bias=False), (2, 3, 7, 6)),
    (nn.Conv3d(2, 3, 3, stride=(1, 2, 2), padding=1), (1, 2, 5, 6, 6)),
    (nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1), (2, 3, 6)),
    (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 4, 5, 5)),
    (nn.ConvTranspose2d(3, 2, (3, 4), stride=(2, 3), dilation=(2, 1), padding=(2, 1)), (1, 3, 4, 5)),
    (nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 3, 3, 3)),
])
def test_conv_modules_grad(module, shape):
    torch.manual_seed(0)
    module.reset_parameters()
    module_grad_check(module, rand(*shape), rtol=1e-4, atol=1e-4)


def test_conv_unbatched_input():
    x, w = rand(3, 10), rand(2, 3, 3, seed=1)
    check(lambda x, w: F.conv1d(x, w, padding=1), x, w, rtol=1e-4, atol=1e-4)


def test_conv_bfloat16():
    x, w = rand(1, 3, 8, 8, dtype=torch.bfloat16), rand(4, 3, 3, 3, seed=1, dtype=torch.bfloat16)
    check(lambda x, w: F.conv2d(x, w, padding=1), x, w, rtol=2e-2, atol=5e-2)


def test_conv_backward_output_mask():
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1)
    g = rand(1, 3, 3, 3, seed=2)
    op = torch.ops.aten.convolution_backward.default
    args = ([3], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    for mask in ([True, False, False], [False, True, True], [True, True, True]):
        expected = op(g, x, w, args[0], *args[1:], mask)
        actual = op(g.to(TPU), x.to(TPU), w.to(TPU), args[0], *args[1:], mask)
        for a, e in zip(actual, expected):
            assert (a is None) == (e is None)
            if e is not None:
                assert_same(a, e, 1e-4, 1e-4)


def test_conv_shape_error_matches_cpu():
    x, w = rand(1, 3, 5, 5), rand(4, 2, 3, 3)
    with pytest.raises(RuntimeError) as cpu_err:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as dev_err:
        F.conv2d(x.to(TPU), w.to(TPU))
    assert "expected input[1, 3, 5, 5] to have 2 channels" in str(cpu_err.value)
    assert "expected input[1, 3, 5, 5] to have 2 channels" in str(dev_err.value)


# ---------------------------------------------------------------- max pooling
@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1}, {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1), "padding": (1, 1)},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "dilation": 2},
])
def test_max_pool2d_values_indices_grad(kwargs):
    x = rand(2, 3, 9, 10)
    expected = F.max_pool2d(x, return_indices=True, **kwargs)
    actual = F.max_pool2d(x.to(TPU), return_indices=True, **kwargs)
    assert_same(actual[0], expected[0])
    assert_same(actual[1], expected[1])
    grad_check(lambda x: F.max_pool2d(x, **kwargs), x)


def test_max_pool_ties_neg_inf_and_nan_like_cpu():
    x = torch.zeros(1, 1, 4, 4)  # all ties: CPU picks the first element of each window
    x[0, 0, 3, 3] = float("-inf")
    x[0, 0, 0, 1] = float("nan")
    x[0, 0, 1, 0] = float("nan")
    y = torch.full((1, 1, 4, 4), float("-inf"))
    for t in (x, y):
        expected = F.max_pool2d(t, 2, return_indices=True)
        actual = F.max_pool2d(t.to(TPU), 2, return_indices=True)
        assert_same(actual[0], expected[0])
        assert_same(actual[1], expected[1])


def test_max_pool_overlapping_windows_grad_accumulates():
    x = rand(1, 2, 6, 6)
    grad_check(lambda x: F.max_pool2d(x, 3, stride=1), x)


@pytest.mark.slow  # the 1-d/3-d twin of the 2-d check above
def test_max_pool1d_3d_and_unbatched():
    check(lambda x: F.max_pool1d(x, 3, stride=2, padding=1, return_indices=True), rand(2, 3, 11))
    check(lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), return_indices=True), rand(1, 2, 4, 6, 6))
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), rand(3, 6, 6))
    grad_check(lambda x: F.max_pool3d(x, 3, stride=2, padding=1), rand(1, 2, 5, 6, 6))
    grad_check(lambda x: F.max_pool1d(x, 2), rand(2, 3, 8))


def test_max_pool_bfloat16_and_int():
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), rand(1, 2, 6, 6, dtype=torch.bfloat16))


# ---------------------------------------------------------------- average pooling
@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": (2, 3), "divisor_override": 5},
])
def test_avg_pool2d_and_grad(kwargs):
    grad_check(lambda x: F.avg_pool2d(x, **kwargs), rand(2, 3, 9, 10))


@pytest.mark.slow  # the 1-d/3-d twin of the 2-d check above
def test_avg_pool1d_3d():
    grad_check(lambda x: F.avg_pool1d(x, 3, stride=2, padding=1, count_include_pad=False), rand(2, 3, 10))
    grad_check(lambda x: F.avg_pool3d(x, 2, stride=2, ceil_mode=True), rand(1, 2, 5, 5, 5))


def test_avg_pool2d_bfloat16():
    check(lambda x: F.avg_pool2d(x, 2), rand(1, 2, 6, 6, dtype=torch.bfloat16), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- adaptive pooling
@pytest.mark.parametrize("out", [1, 2, (3, 4), (5, 7), (7, 3)])
def test_adaptive_avg_pool2d_and_grad(out):
    grad_check(lambda x: F.adaptive_avg_pool2d(x, out), rand(2, 3, 7, 10))


def test_adaptive_avg_pool_1d_3d_unbatched():
    grad_check(lambda x: F.adaptive_avg_pool1d(x, 4), rand(2, 3, 10))
    grad_check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), rand(1, 2, 5, 7, 4))
    check(lambda x: F.adaptive_avg_pool2d(x, 3), rand(3, 7, 7))


@pytest.mark.parametrize("out", [1, 2, (3, 4), (5, 7)])
def test_adaptive_max_pool2d_indices_and_grad(out):
    x = rand(2, 3, 7, 10)
    check(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), x)
    grad_check(lambda x: F.adaptive_max_pool2d(x, out), x)


@pytest.mark.slow  # the 1-d/3-d twin of the 2-d check above
def test_adaptive_max_pool_1d_3d():
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), rand(2, 3, 10))
    check(lambda x: F.adaptive_max_pool3d(x, 2, return_indices=True), rand(1, 2, 5, 4, 4))
    grad_check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), rand(1, 2, 5, 7, 4))


# ---------------------------------------------------------------- upsampling
@pytest.mark.parametrize("kwargs", [
    {"scale_factor": 2}, {"scale_factor": 1.7}, {"size": (7, 5)}, {"size": (3, 3)}, {"scale_factor": (0.6, 2.5)},
])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bilinear-ac"])
def test_upsample2d_and_grad(kwargs, mode):
    extra = {}
    if mode == "bilinear-ac":
        mode, extra = "bilinear", {"align_corners": True}
    grad_check(lambda x: F.interpolate(x, mode=mode, **kwargs, **extra), rand(2, 3, 5, 6))


@pytest.mark.slow  # the 1-d/3-d twin of the 2-d check above
def test_upsample_1d_3d():
    for mode in ("nearest", "linear"):
        grad_check(lambda x: F.interpolate(x, scale_factor=2.5, mode=mode), rand(2, 3, 5))
    for mode in ("nearest", "trilinear"):
        grad_check(lambda x: F.interpolate(x, size=(3, 5, 4), mode=mode), rand(1, 2, 2, 3, 3))
    grad_check(lambda x: F.interpolate(x, size=7, mode="linear", align_corners=True), rand(1, 2, 4))


def test_upsample_bfloat16():
    check(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), rand(1, 2, 4, 4, dtype=torch.bfloat16),
          rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- unfold / fold
def test_unfold_fold():
    x = rand(2, 3, 7, 6)
    grad_check(lambda x: F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1)), x)
    cols = rand(2, 3 * 4, 16)
    grad_check(lambda c: F.fold(c, (5, 6), 2, stride=(1, 1), padding=0, dilation=(1, 2)), cols)


# ---------------------------------------------------------------- scaled_dot_product_attention
def sdpa_check(q, k, v, rtol=1e-5, atol=1e-5, mask_grad=False, **kwargs):
    """F.scaled_dot_product_attention output and q/k/v (and float mask) grads match CPU."""
    mask = kwargs.pop("attn_mask", None)
    if mask_grad:
        grad_check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs), q, k, v, mask,
                   rtol=rtol, atol=atol)
        return

    def fn(q, k, v):
        m = None if mask is None else mask.to(q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)

    grad_check(fn, q, k, v, rtol=rtol, atol=atol)


def qkv(b=2, h=3, lq=5, lk=7, e=8, ev=6, hk=None, seed=0, dtype=torch.float32):
    hk = h if hk is None else hk
    return (rand(b, h, lq, e, seed=seed, dtype=dtype), rand(b, hk, lk, e, seed=seed + 1, dtype=dtype),
            rand(b, hk, lk, ev, seed=seed + 2, dtype=dtype))


def test_sdpa_no_mask_and_scale():
    import tpu_interactive
    before = tpu_interactive.stats()["op_counts"].get("aten::_scaled_dot_product_attention_math", 0)
    sdpa_check(*qkv())
    sdpa_check(*qkv(), scale=0.3)
    sdpa_check(*qkv(), scale=-0.5)
    assert tpu_interactive.stats()["op_counts"]["aten::_scaled_dot_product_attention_math"] >= before + 3


def test_sdpa_bool_mask_broadcast():
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[..., 0] = True
    sdpa_check(*qkv(), attn_mask=mask)
    sdpa_check(*qkv(), attn_mask=mask[0, 0])


def test_sdpa_float_mask_with_grad():
    sdpa_check(*qkv(), attn_mask=rand(5, 7, seed=4), mask_grad=True)
    sdpa_check(*qkv(), attn_mask=rand(2, 3, 5, 7, seed=4), mask_grad=True)


def test_sdpa_fully_masked_row_gives_zeros_like_cpu():
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    q, k, v = qkv()
    actual = F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), attn_mask=mask.to(TPU))
    assert_same(actual, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert (actual.cpu()[:, :, 2] == 0).all()


def test_sdpa_fully_masked_row_gradients_are_zero_not_nan():
    # left padding in batched generation makes such rows; CPU's gradient there is 0
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    sdpa_check(*qkv(), attn_mask=mask)


@pytest.mark.parametrize("lq,lk", [(5, 5), (4, 7), (7, 4)])
def test_sdpa_causal(lq, lk):
    sdpa_check(*qkv(lq=lq, lk=lk), is_causal=True)


def test_sdpa_gqa_and_3d():
    sdpa_check(*qkv(h=4, hk=2), enable_gqa=True)
    sdpa_check(*qkv(h=6, hk=2), enable_gqa=True, is_causal=True)
    q, k, v = qkv()
    sdpa_check(q[0], k[0], v[0])


def test_sdpa_transposed_inputs():
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv())  # non-contiguous strides
    assert not q.is_contiguous()
    sdpa_check(q, k, v, is_causal=True)


def test_sdpa_bfloat16_computed_in_float32():
    sdpa_check(*qkv(dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)
    sdpa_check(*qkv(dtype=torch.bfloat16), attn_mask=rand(5, 7, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


def test_sdpa_dropout_mask_scaling_and_grad():
    q, k, v = (t.to(TPU).requires_grad_() for t in qkv(b=2, h=2, lq=16, lk=32))
    torch.manual_seed(0)
    out, attn = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, dropout_p=0.25)
    _, plain = torch.ops.aten._scaled_dot_product_attention_math(q.detach().cpu(), k.detach().cpu(),
                                                                 v.detach().cpu())
    attn_cpu = attn.detach().cpu()
    kept = attn_cpu != 0
    assert 0.6 < kept.float().mean().item() < 0.9  # keep prob 0.75
    torch.testing.assert_close(attn_cpu[kept], (plain / 0.75)[kept], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.detach().cpu(), attn_cpu @ v.detach().cpu(), rtol=1e-5, atol=1e-5)
    g = rand(*out.shape, seed=9)
    out.backward(g.to(TPU))
    torch.testing.assert_close(v.grad.cpu(), attn_cpu.transpose(-1, -2) @ g, rtol=1e-5, atol=1e-5)
    # same seed, same mask; the functional API applies dropout too
    torch.manual_seed(0)
    again, _ = torch.ops.aten._scaled_dot_product_attention_math(q.detach(), k.detach(), v.detach(), dropout_p=0.25)
    assert_same(again, out.detach().cpu())
    y = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), dropout_p=0.5)
    z = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert not torch.allclose(y.cpu(), z.cpu())


def test_sdpa_explicit_dropout_mask_matches_cpu():
    q, k, v = qkv()
    keep = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(5)) > 0.3

    def fn(q, k, v):
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.3, False, keep_of(q))

    def keep_of(q):
        return keep.to(q.device)

    expected = fn(q, k, v)
    actual = fn(q.to(TPU), k.to(TPU), v.to(TPU))
    assert_same(actual, expected)
    grad_check(lambda q, k, v: fn(q, k, v)[0], q, k, v)


def test_sdpa_errors_like_cpu():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q.to(TPU), k.to(TPU).double(), v.to(TPU))
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), attn_mask=torch.ones(5, 7, device=TPU),
                                       is_causal=True)


def test_sdpa_inference_mode():
    q, k, v = qkv()
    with torch.inference_mode():
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
