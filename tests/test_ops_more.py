"""Less common lowerings vs CPU PyTorch: cross/cdist/pdist, Cholesky/QR pieces, matrix_exp,
grid_sample, bicubic/nearest-exact upsampling, fractional max pooling, margin losses, histogram;
plus the conformance harness's equivalence rules (vector signs, CPU-only arguments)."""
import pytest
import torch
import torch.nn.functional as F

from helpers import TPU, assert_same, check

pytestmark = pytest.mark.usefixtures("no_fallback")


def rand(*shape, seed=0, dtype=torch.float32):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.to(dtype) if dtype.is_floating_point else (t * 10).to(dtype)


def grad_check(fn, *inputs, rtol=1e-5, atol=1e-5):
    """Forward values and every input's .grad (one fixed random cotangent) agree with CPU."""
    cpu = [x.detach().clone().requires_grad_() for x in inputs]
    dev = [x.detach().to(TPU).requires_grad_() for x in inputs]
    expected, actual = fn(*cpu), fn(*dev)
    assert_same(actual, expected.detach(), rtol, atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=expected.dtype)
    expected.backward(g)
    actual.backward(g.to(TPU))
    for c, d in zip(cpu, dev):
        assert d.grad is not None
        assert_same(d.grad, c.grad, rtol, atol)


def spd(n, batch=(), seed=0):
    a = rand(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


# ---------------------------------------------------------------- cross / distances
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_cross_broadcast_and_dim(dtype):
    check(lambda a, b: torch.linalg.cross(a, b), rand(4, 3, dtype=dtype), rand(1, 3, seed=1, dtype=dtype))
    check(lambda a, b: torch.linalg.cross(a, b, dim=0), rand(3, 5, dtype=dtype), rand(3, 5, seed=1, dtype=dtype))
    check(lambda a, b: torch.cross(a, b, dim=1), rand(2, 3, 4, dtype=dtype), rand(2, 3, 4, seed=1, dtype=dtype))


def test_cross_noncontiguous_and_grad():
    check(lambda a, b: torch.linalg.cross(a.mT, b), rand(3, 6), rand(6, 3, seed=1))
    grad_check(lambda a, b: torch.linalg.cross(a, b), rand(5, 3), rand(5, 3, seed=1))


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_values_and_grad(p):
    x1, x2 = rand(2, 4, 3), rand(2, 5, 3, seed=1)
    x2[0, 0] = x1[0, 1]  # a zero distance: ATen's gradient is 0 there
    check(lambda a, b: torch.cdist(a, b, p=p), x1, x2, rtol=1e-5)
    if p not in (0.0, 0.5):  # p < 1 at a zero difference is NaN on CPU too (0 * inf)
        grad_check(lambda a, b: torch.cdist(a, b, p=p), x1, x2, rtol=1e-4, atol=1e-5)


def test_cdist_mm_mode_broadcast_and_empty():
    x1, x2 = rand(30, 4), rand(3, 1, 7, 4, seed=1)
    check(lambda a, b: torch.cdist(a, b), x1, x2, rtol=1e-4, atol=1e-4)
    check(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), rand(3, 4), rand(2, 4, seed=1),
          rtol=1e-4, atol=1e-4)
    grad_check(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), rand(1, 3, 2),
               rand(4, 2, 2, seed=1), rtol=1e-4)
    check(lambda a, b: torch.cdist(a, b), rand(0, 3), rand(4, 3))


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist_values_and_grad(p):
    x = rand(5, 3)
    check(lambda a: F.pdist(a, p=p), x, rtol=1e-5)
    if p != 0.0:
        grad_check(lambda a: F.pdist(a, p=p), x, rtol=1e-4)
    check(lambda a: F.pdist(a), rand(1, 3))


# ---------------------------------------------------------------- cholesky family / QR pieces
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_inverse(upper):
    a = spd(4, (2,))
    check(lambda m: torch.cholesky(m, upper=upper), a, rtol=1e-5, atol=1e-5)
    factor = torch.linalg.cholesky(a, upper=upper)
    check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, rtol=1e-4, atol=1e-5)
    grad_check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, rtol=1e-4, atol=1e-4)
    grad_check(lambda m: torch.cholesky(m, upper=upper), a, rtol=1e-4, atol=1e-4)


def test_cholesky_not_positive_definite_raises_like_cpu():
    a = -torch.eye(3)
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 1"):
        torch.cholesky(a)
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 1"):
        torch.cholesky(a.to(TPU))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_broadcast_and_grad(upper):
    factor = torch.linalg.cholesky(spd(3, (2,)), upper=upper)
    b = rand(1, 3, 2, seed=2)
    check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), b, factor, rtol=1e-4, atol=1e-5)
    grad_check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), rand(2, 3, 2, seed=2), factor,
               rtol=1e-4, atol=1e-4)


def test_matrix_exp_values_batch_and_grad():
    a = rand(2, 4, 4) * 0.5
    check(torch.linalg.matrix_exp, a, rtol=1e-4, atol=1e-5)
    check(torch.linalg.matrix_exp, rand(3, 3).mT, rtol=1e-4, atol=1e-5)
    check(torch.linalg.matrix_exp, rand(0, 2, 2))
    grad_check(torch.linalg.matrix_exp, rand(3, 3) * 0.3, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_geqrf_householder_ormqr(shape):
    a = rand(*shape)
    check(torch.geqrf, a, rtol=1e-4, atol=1e-5)
    h, tau = torch.geqrf(a)
    m = shape[-2]
    check(torch.linalg.householder_product, h[..., :, :min(shape[-2:])] if shape[-2] >= shape[-1] else h[..., :, :m],
          tau, rtol=1e-4, atol=1e-5)
    c = rand(*shape[:-2], m, 2, seed=3)
    for left, transpose in [(True, False), (True, True)]:
        check(lambda hh, tt, cc: torch.ormqr(hh, tt, cc, left=left, transpose=transpose), h, tau, c,
              rtol=1e-4, atol=1e-5)
    cr = rand(*shape[:-2], 2, m, seed=4)
    for transpose in (False, True):
        check(lambda hh, tt, cc: torch.ormqr(hh, tt, cc, left=False, transpose=transpose), h, tau, cr,
              rtol=1e-4, atol=1e-5)


def test_householder_product_grad():
    h, tau = torch.geqrf(rand(4, 3))
    grad_check(torch.linalg.householder_product, h, tau, rtol=1e-4, atol=1e-4)
