"""Pooling and im2col/col2im (ops/pooling.py) vs CPU PyTorch: values, indices, grads."""
import pytest
import torch
import torch.nn.functional as F

import tpu_interactive as torch_tpu
from helpers import TPU, assert_same, check, grad_check, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


# ---------------------------------------------------------------- max unpooling
def test_max_unpool_1d_2d_3d_values_and_grads():
    """Lowered (torch's decomposition scatters without checking the indices); pool then unpool, with the
    default and a larger output size, unbatched too."""
    x2, x3, x1 = rand(2, 3, 8, 8), rand(1, 2, 4, 4, 6, seed=1), rand(2, 3, 9, seed=2)
    y2, i2 = F.max_pool2d(x2, 2, return_indices=True)
    y3, i3 = F.max_pool3d(x3, 2, return_indices=True)
    y1, i1 = F.max_pool1d(x1, 2, return_indices=True)
    grad_check(lambda y, i: F.max_unpool2d(y, i, 2), y2, i2)
    grad_check(lambda y, i: F.max_unpool2d(y, i, 2, output_size=(9, 9)), y2, i2)
    grad_check(lambda y, i: F.max_unpool2d(y, i, 2), y2[0], i2[0])
    grad_check(lambda y, i: F.max_unpool3d(y, i, 2), y3, i3)
    grad_check(lambda y, i: F.max_unpool1d(y, i, 2, output_size=(9,)), y1, i1)
    check(lambda y, i: F.max_unpool2d(y, i, 2), y2[:0], i2[:0])  # no planes: zeros of the output's shape


def test_max_unpool_bad_index_is_cpus_error_and_its_choice_of_index():
    """An index outside its plane raises CPU's RuntimeError (plain and fused eager); with several, CPU run
    serially reports the last one."""
    y, i = F.max_pool2d(rand(2, 3, 8, 8), 2, return_indices=True)
    bad = i.clone()
    bad[0, 0, 0, 1], bad[1, 1, 2, 0], bad[1, 1, 3, 3], bad[0, 2, 1, 1] = -1, 64, 99, 70
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU's planes run in parallel otherwise: which bad index it reports varies
    try:
        with pytest.raises(RuntimeError) as cpu:
            F.max_unpool2d(y, bad, 2)
    finally:
        torch.set_num_threads(threads)
    assert str(cpu.value) == "Found an invalid max index: 99 (output volumes are of size 8x8)"
    with pytest.raises(RuntimeError, match=r"Found an invalid max index: 99 \(output volumes are of size 8x8\)"):
        F.max_unpool2d(y.to(TPU), bad.to(TPU), 2)
        torch_tpu.synchronize()  # where fused mode is forced on, the check fails when the segment runs
    with torch_tpu.fuse(), pytest.raises(RuntimeError, match=r"invalid max index: 99 \("):
        F.max_unpool2d(y.to(TPU), bad.to(TPU), 2).sum().item()
    y3, i3 = F.max_pool3d(rand(1, 2, 4, 4, 4), 2, return_indices=True)
    i3[0, 1, 1, 0, 1] = -5
    with pytest.raises(RuntimeError, match=r"invalid max index: -5 \(output volumes are of size 4x4x4\)"):
        F.max_unpool3d(y3.to(TPU), i3.to(TPU), 2)
        torch_tpu.synchronize()


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
    # the float32 mean of 4 values, summed in another order, can round to the neighbouring bfloat16
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



# ---------------------------------------------------------------- fractional max pooling (explicit samples)
def test_fractional_max_pool2d_values_indices_grad():
    x = rand(2, 3, 7, 9)
    samples = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(3))
    x[0, 0, 1, 1] = float("nan")  # CPU picks the NaN (its index too)
    check(lambda a, s: F.fractional_max_pool2d(a, (2, 3), output_size=(4, 5), return_indices=True,
                                               _random_samples=s), x, samples)
    check(lambda a, s: F.fractional_max_pool2d(a, 3, output_size=(3, 3), return_indices=True, _random_samples=s),
          x[0], samples[:1])
    grad_check(lambda a: F.fractional_max_pool2d(a, (2, 3), output_size=(4, 1), _random_samples=samples.to(a.device)),
               rand(2, 3, 7, 9, seed=4))


def test_fractional_max_pool3d_values_indices_grad():
    x = rand(2, 2, 5, 6, 7)
    samples = torch.rand(2, 2, 3, generator=torch.Generator().manual_seed(5))
    check(lambda a, s: F.fractional_max_pool3d(a, (2, 2, 3), output_size=(3, 4, 3), return_indices=True,
                                               _random_samples=s), x, samples)
    grad_check(lambda a: F.fractional_max_pool3d(a, 2, output_size=(2, 3, 2), _random_samples=samples.to(a.device)),
               x)



# ---------------------------------------------------------------- unfold / fold
def test_unfold_fold():
    x = rand(2, 3, 7, 6)
    grad_check(lambda x: F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1)), x)
    cols = rand(2, 3 * 4, 16)
    grad_check(lambda c: F.fold(c, (5, 6), 2, stride=(1, 1), padding=0, dilation=(1, 2)), cols)
