"""Upsampling and grid_sample (ops/resample.py) vs CPU PyTorch: values and grads."""
import pytest
import torch
import torch.nn.functional as F

from helpers import check, grad_check, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


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
    # bilinear weights sum in float32 in another order: the rounding to bfloat16 can differ by one ulp
    check(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), rand(1, 2, 4, 4, dtype=torch.bfloat16),
          rtol=1e-2, atol=1e-2)



# ---------------------------------------------------------------- grid_sample / upsampling
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_values_and_grads(mode, padding_mode, align_corners):
    inp = rand(2, 3, 5, 6)
    grid = torch.rand(2, 4, 3, 2, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2  # some outside
    # (atol 5e-5: the grid's gradient is a difference of neighbouring pixels times the cotangent, summed
    # over channels: cancellation)
    grad_check(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
               inp, grid, rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d_values_and_grads(mode, padding_mode):
    inp = rand(2, 2, 3, 4, 5)
    grid = torch.rand(2, 2, 3, 2, 3, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    for align_corners in (False, True):
        grad_check(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode,
                                              align_corners=align_corners), inp, grid, rtol=1e-4, atol=5e-5)


def test_grid_sample_noncontiguous_input():
    inp = rand(2, 3, 6, 5).transpose(-1, -2)
    grid = torch.rand(2, 3, 3, 2, generator=torch.Generator().manual_seed(2)) * 2 - 1
    check(lambda a, g: F.grid_sample(a, g, align_corners=False), inp, grid, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size,scale", [((7, 9), None), (None, 1.7), ((3, 2), None)])
def test_bicubic_upsample_and_grad(align_corners, size, scale):
    grad_check(lambda a: F.interpolate(a, size=size, scale_factor=scale, mode="bicubic", align_corners=align_corners),
               rand(2, 3, 4, 5), tol="accumulated")


@pytest.mark.parametrize("shape,size", [((2, 3, 5), (8,)), ((1, 2, 3, 4, 5), (5, 3, 7))])
def test_nearest_exact_1d_3d_grad(shape, size):
    grad_check(lambda a: F.interpolate(a, size=size, mode="nearest-exact"), rand(*shape))
