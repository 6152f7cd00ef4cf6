"""Convolution (ops/conv.py) vs CPU PyTorch: values, grads, layouts, errors."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import TPU, assert_same, check, grad_check, module_grad_check, raises_like_cpu, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


# ---------------------------------------------------------------- convolution
@pytest.mark.parametrize("kwargs", [
    {}, {"stride": 2}, {"padding": 1}, {"padding": (1, 2), "stride": (2, 1)}, {"dilation": 2, "padding": 2},
    {"groups": 2}, {"stride": 3, "padding": 1, "dilation": (1, 2)},
])
def test_conv2d_forward_and_grad(kwargs):
    x, w, b = rand(2, 4, 9, 8), rand(6, 4 // kwargs.get("groups", 1), 3, 3, seed=1), rand(6, seed=2)
    grad_check(lambda x, w, b: F.conv2d(x, w, b, **kwargs), x, w, b, tol="loose")


def test_conv2d_no_bias_noncontiguous_input():
    x = rand(2, 9, 8, 3).permute(0, 3, 1, 2)  # channels-last view
    w = rand(4, 3, 3, 3, seed=1)
    check(lambda x, w: F.conv2d(x, w), x, w, tol="loose")


def test_conv_padding_same_even_kernel():
    # even kernel + 'same' pads asymmetrically before aten::convolution
    x, w = rand(1, 2, 7, 7), rand(3, 2, 4, 4, seed=1)
    check(lambda x, w: F.conv2d(x, w, padding="same"), x, w, tol="loose")
    check(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w, tol="loose")


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
    module_grad_check(module, rand(*shape), tol="loose")


def test_conv_unbatched_input():
    x, w = rand(3, 10), rand(2, 3, 3, seed=1)
    check(lambda x, w: F.conv1d(x, w, padding=1), x, w, tol="loose")


def test_conv_bfloat16():
    x, w = rand(1, 3, 8, 8, dtype=torch.bfloat16), rand(4, 3, 3, 3, seed=1, dtype=torch.bfloat16)
    # 27-term sums of bfloat16 products, accumulated in float32 in another order and rounded once: results
    # up to ~5 where one bfloat16 ulp is 3e-2
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
    assert "expected input[1, 3, 5, 5] to have 2 channels" in raises_like_cpu(F.conv2d, x, w)


def test_channels_last_model_trains_like_cpu():
    # GPU code's `model.to(memory_format=torch.channels_last)` + channels-last batches: accepted, and the
    # values are CPU's (tpu's own layout is contiguous: docs/device_parity.md#memory-formats)
    def train(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(8, 4)).to(device).to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = rand(4, 3, 16, 16).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.tensor([0, 3, 1, 2], device=device)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses), [p.detach() for p in model.parameters()]

    expected_losses, expected_params = train("cpu")
    losses, params = train(TPU)
    assert_same(losses, expected_losses, tol="loose")
    assert_same(params, expected_params, tol="loose")


def test_channels_last_tensor_round_trip_keeps_strides_and_values():
    x = rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    on_tpu = x.to(TPU)
    assert on_tpu.stride() == x.stride()  # a dense CPU layout is preserved, as for CUDA
    back = on_tpu.cpu()
    assert back.stride() == x.stride() and torch.equal(back, x)
    assert_same(F.conv2d(on_tpu, rand(4, 3, 3, 3, seed=1).to(TPU)), F.conv2d(x, rand(4, 3, 3, 3, seed=1)), tol="loose")


@pytest.mark.parametrize("make", [
    lambda d: torch.empty(2, 3, 4, memory_format=torch.channels_last, device=d),
    lambda d: torch.ones(2, 3, 4, device=d).contiguous(memory_format=torch.channels_last),
    lambda d: torch.ones(2, 3, 4, 5, device=d).to(memory_format=torch.channels_last_3d),
    lambda d: torch.empty_like(torch.ones(2, 3, device=d), memory_format=torch.channels_last),
    lambda d: torch.empty(2, 3, memory_format=torch.preserve_format, device=d),
])
def test_a_memory_format_torch_refuses_is_refused_as_on_cpu(make):
    with pytest.raises(RuntimeError) as on_cpu:
        make("cpu")
    with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value).splitlines()[0])):
        make(TPU)
