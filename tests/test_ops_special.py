"""Special functions on tpu vs CPU PyTorch: wide input ranges (negatives, poles, 0, large, NaN/inf),
float32 and float64 (where precision differences show), integer inputs, gradients."""

import pytest
import torch

from helpers import TPU, assert_same, check, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")

NAN, INF = float("nan"), float("inf")
TOL = {torch.float32: dict(rtol=2e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-14)}
FLOATS = [torch.float32, torch.float64]
# negatives (incl. near and at poles), zeros of both signs, tiny, large, specials
WIDE = [-8.4784, -7.9506, -8.0676, -2.5, -2.0, -1.0, -0.5, -1e-30, -0.0, 0.0, 1e-30, 0.3, 0.5, 1.0,
        2.0, 3.7, 9.0, 10.0, 25.5, 100.0, 1e5, 1e10, INF, -INF, NAN]


def wide(dtype=torch.float32):
    return torch.tensor(WIDE, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------- regressions: silent wrong results
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
def test_polygamma_matches_cpu_on_negatives_and_poles(n, dtype):
    # lax.zeta was wrong for negative non-integer x (e.g. polygamma(2, -8.4784): 38.5 instead of 4.22)
    check(lambda x: torch.polygamma(n, x), wide(dtype), **TOL[dtype])


def test_polygamma_opinfo_sample_value():
    x = torch.tensor([-8.4784, -1.7658, 3.0])
    actual = torch.polygamma(2, x.to(TPU)).cpu()
    assert abs(actual[0].item() - 4.2216) < 1e-3, actual


@pytest.mark.parametrize("n", [1, 2])
def test_polygamma_int_input_and_noncontiguous(n):
    check(lambda x: torch.polygamma(n, x), torch.arange(-3, 9).reshape(3, 4).t())
    check(lambda x: torch.special.polygamma(n, x), torch.linspace(-9.7, 9.3, 24).reshape(4, 6)[:, ::2])


def test_polygamma_negative_n_raises():
    with pytest.raises(RuntimeError):
        torch.polygamma(-1, torch.ones(3, device=TPU))


def test_digamma_gradient_is_cpu_trigamma():
    # digamma's backward is polygamma(1, x): wrong at negative x; at poles CPU's sin(pi x) rounding
    # gives a huge finite value, not inf
    x = torch.tensor([-8.4784, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 4.0, 30.0], requires_grad=True)
    xt = to_tpu(x)
    (g,) = torch.autograd.grad(torch.digamma(x).sum(), x)
    (gt,) = torch.autograd.grad(torch.digamma(xt).sum(), xt)
    assert_same(gt, g, rtol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_logcumsumexp_gradient_with_large_values(dim):
    # CPU accumulates float32 in float64; the backward's `logcumsumexp(log|g| - result) + self`
    # cancels at |x| ~ 1e4, so a float32 scan was off by 3e-3 in 4 of 125 elements
    x = torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(0)) * 3
    x[0] = 1e4
    x[2, 1] = -INF
    x = x.requires_grad_()
    xt = to_tpu(x)
    cot = torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(1))
    (g,) = torch.autograd.grad(torch.logcumsumexp(x, dim), x, cot)
    (gt,) = torch.autograd.grad(torch.logcumsumexp(xt, dim), xt, cot.to(TPU))
    assert_same(gt, g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logcumsumexp_forward_matches_cpu_rounding(dtype):
    # float32 is exact (both correctly rounded from a float64 accumulation); float64 to rounding
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3 - 1e4).to(dtype)
    tol = dict(rtol=1e-14, atol=0) if dtype == torch.float64 else dict(rtol=0, atol=0)
    check(lambda v: torch.logcumsumexp(v, 0), x, **tol)
