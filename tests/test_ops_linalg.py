"""Matrix products and linear algebra vs CPU PyTorch: values, dtypes, broadcasting, errors, grads."""
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import TPU, assert_same, both, check, grad_check, needs_aten, raises_like_cpu, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


# ---------------------------------------------------------------- products
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 2e-2),
                                       (torch.int64, 0)])
def test_mm_dtypes(dtype, tol):
    check(torch.mm, rand(5, 7, dtype=dtype), rand(7, 3, seed=1, dtype=dtype), rtol=tol, atol=tol)


def test_mm_int64_exact_large_values():
    a = torch.tensor([[2**40, 3], [1, -(2**35)]])
    b = torch.tensor([[5, 2**20], [7, 1]])
    check(torch.mm, a, b)  # integers: exact


def test_integer_products_without_an_integer_dot_are_exact(monkeypatch):
    """A TPU has no 64-bit integer dot: there integer mm/bmm/mv/dot/addmm/addbmm are exact products summed
    over k. The same path is forced here (shapes no other test uses, so no program is reused)."""
    from tpu_interactive.backend.ops import linalg

    monkeypatch.setattr(linalg, "_no_integer_dot", lambda: True)
    g = torch.Generator().manual_seed(3)
    big = lambda *s: torch.randint(-(2**40), 2**40, s, generator=g)  # noqa: E731 - products beyond 2^53
    a, b, bb, v = big(5, 11), torch.randint(-9, 9, (11, 6), generator=g), big(3, 5, 11), big(11)
    cases = [(torch.mm, a, b), (torch.bmm, bb, torch.randint(-9, 9, (3, 11, 2), generator=g)), (torch.mv, a, v),
             (torch.dot, v, v % 1000), (torch.matmul, v % 1000, b)]
    for fn, x, y in cases:
        assert_same(fn(x.to(TPU), y.to(TPU)), fn(x, y))
    bias = big(5, 6)
    assert_same(torch.addmm(bias.to(TPU), a.to(TPU), b.to(TPU), beta=2, alpha=3), torch.addmm(bias, a, b, beta=2, alpha=3))
    # addbmm's einsum was an s64 dot the chip refused (session 30's chip run of test_sweep_regressions)
    einsum = linalg.jnp.einsum

    def no_integer_einsum(spec, *operands, **kwargs):
        assert not any(jnp.issubdtype(o.dtype, jnp.integer) for o in operands), "an integer dot the chip lacks"
        return einsum(spec, *operands, **kwargs)

    monkeypatch.setattr(linalg.jnp, "einsum", no_integer_einsum)
    x, y = torch.randint(-9, 9, (3, 5, 11), generator=g), torch.randint(-9, 9, (3, 11, 6), generator=g)
    assert_same(torch.addbmm(bias.to(TPU), x.to(TPU), y.to(TPU), beta=2, alpha=3), torch.addbmm(bias, x, y, beta=2,
                                                                                              alpha=3))


def test_mm_noncontiguous_and_empty():
    a, b = rand(7, 5), rand(3, 7, seed=1)
    check(lambda a, b: a.t() @ b.t(), a, b)
    check(lambda a, b: a[::2, 1:] @ b.t()[1:5, :], a, b)
    check(torch.mm, torch.empty(3, 0), torch.empty(0, 4))
    check(torch.mm, torch.empty(0, 3), rand(3, 2))


def test_mm_shape_mismatch_message():
    msg = raises_like_cpu(torch.mm, rand(3, 4), rand(5, 6))
    assert "mat1 and mat2 shapes cannot be multiplied (3x4 and 5x6)" in msg
    raises_like_cpu(torch.bmm, rand(2, 3, 4), rand(2, 5, 6))
    raises_like_cpu(torch.matmul, rand(3, 4), rand(5))
    raises_like_cpu(torch.dot, rand(3), rand(4))
    raises_like_cpu(lambda a, b: F.linear(a, b), rand(2, 4), rand(3, 5))


def test_mm_bool_not_implemented_like_cpu():
    raises_like_cpu(torch.mm, torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_bmm(dtype):
    check(torch.bmm, rand(4, 3, 5, dtype=dtype), rand(4, 5, 2, seed=1, dtype=dtype), tol="ulps")
    check(lambda a, b: torch.bmm(a.transpose(1, 2), b), rand(4, 5, 3, dtype=dtype), rand(4, 5, 2, seed=1, dtype=dtype),
          tol="ulps")


@pytest.mark.parametrize("shapes", [
    ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)), ((2, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 5)),
])
def test_matmul_broadcasting_and_grad(shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], seed=1)
    grad_check(torch.matmul, a, b)


def test_matmul_int64_and_bfloat16():
    check(torch.matmul, rand(2, 3, 4, dtype=torch.int64), rand(4, dtype=torch.int64))
    check(torch.matmul, rand(2, 3, 4, dtype=torch.bfloat16), rand(2, 4, 5, seed=1, dtype=torch.bfloat16),
          tol="ulps")


def test_addmm_beta_alpha_and_nan_bias():
    bias, a, b = rand(3, 5), rand(3, 4, seed=1), rand(4, 5, seed=2)
    check(torch.addmm, bias, a, b)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2), bias, a, b)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2), rand(5), a, b)  # broadcast bias
    nan_bias = torch.full((3, 5), float("nan"))
    actual, _ = check(lambda c, a, b: torch.addmm(c, a, b, beta=0), nan_bias, a, b)
    assert not actual.cpu().isnan().any()
    check(lambda c, a, b: torch.addmm(c, a, b, beta=2, alpha=3), rand(3, 5, dtype=torch.int64),
          rand(3, 4, dtype=torch.int64), rand(4, 5, dtype=torch.int64))
    grad_check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), bias, a, b)


def test_addmm_out_and_inplace():
    bias, a, b = rand(3, 5), rand(3, 4, seed=1), rand(4, 5, seed=2)
    out = torch.empty(3, 5, device=TPU)
    torch.addmm(bias.to(TPU), a.to(TPU), b.to(TPU), out=out)
    assert_same(out, torch.addmm(bias, a, b))
    c = bias.to(TPU)
    c.addmm_(a.to(TPU), b.to(TPU), alpha=2)
    assert_same(c, bias.clone().addmm_(a, b, alpha=2))


def test_baddbmm_addbmm_addmv_mv_dot_vdot():
    check(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), rand(2, 3, 5), rand(2, 3, 4, seed=1),
          rand(2, 4, 5, seed=2))
    check(lambda c, a, b: torch.baddbmm(c, a, b, beta=0), torch.full((2, 3, 5), float("nan")), rand(2, 3, 4, seed=1),
          rand(2, 4, 5, seed=2))
    check(lambda c, a, b: torch.addbmm(c, a, b, beta=0.5, alpha=2), rand(3, 5), rand(2, 3, 4, seed=1),
          rand(2, 4, 5, seed=2))
    check(lambda c, a, v: torch.addmv(c, a, v, beta=2, alpha=0.5), rand(3), rand(3, 4, seed=1), rand(4, seed=2))
    check(torch.mv, rand(3, 4), rand(4, seed=1))
    check(torch.mv, rand(3, 4, dtype=torch.int64), rand(4, dtype=torch.int64))
    check(torch.dot, rand(6), rand(6, seed=1))
    check(torch.dot, rand(6, dtype=torch.int64), rand(6, seed=1, dtype=torch.int64))
    check(torch.vdot, rand(6), rand(6, seed=1))
    grad_check(lambda c, a, b: torch.baddbmm(c, a, b, alpha=2), rand(2, 3, 5), rand(2, 3, 4, seed=1),
               rand(2, 4, 5, seed=2))


def test_addr_float_int_bool():
    check(lambda c, a, b: torch.addr(c, a, b, beta=2, alpha=3), rand(3, 4), rand(3, seed=1), rand(4, seed=2))
    check(lambda c, a, b: torch.addr(c, a, b, beta=2, alpha=3), rand(3, 4, dtype=torch.int64),
          rand(3, dtype=torch.int64), rand(4, dtype=torch.int64))
    m = torch.tensor([[True, False], [False, False]])
    check(lambda c, a, b: torch.addr(c, a, b), m, torch.tensor([True, False]), torch.tensor([False, True]))
    check(lambda c, a, b: torch.addr(c, a, b, beta=False), m, torch.tensor([True, False]), torch.tensor([False, True]))


@pytest.mark.parametrize("use_gelu", [False, True])
def test_addmm_activation(use_gelu):
    check(lambda c, a, b: torch._addmm_activation(c, a, b, alpha=2, use_gelu=use_gelu), rand(5), rand(3, 4, seed=1),
          rand(4, 5, seed=2))


def test_linear_module_grad():
    torch.manual_seed(0)
    lin = nn.Linear(6, 4)
    dev = nn.Linear(6, 4).to(TPU)
    dev.load_state_dict({k: v.to(TPU) for k, v in lin.state_dict().items()})
    x = rand(2, 3, 6)
    xc, xd = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    expected, actual = lin(xc), dev(xd)
    assert_same(actual, expected.detach())
    g = rand(2, 3, 4, seed=5)
    expected.backward(g)
    actual.backward(g.to(TPU))
    assert_same(xd.grad, xc.grad)
    assert_same(dev.weight.grad, lin.weight.grad)
    assert_same(dev.bias.grad, lin.bias.grad)
    check(lambda x, w: F.linear(x, w), rand(5, 6), rand(4, 6, seed=1))


# ---------------------------------------------------------------- linear algebra
def well_conditioned(*shape, seed=0):
    a = rand(*shape, seed=seed)
    return a + 3 * torch.eye(shape[-1])


def spd(n, batch=(), seed=0):
    a = rand(*batch, n, n, seed=seed)
    return a @ a.transpose(-1, -2) + n * torch.eye(n)


def test_inv_and_inv_ex():
    check(torch.linalg.inv, well_conditioned(4, 4), tol="accumulated")
    check(torch.linalg.inv, well_conditioned(2, 3, 3), tol="accumulated")
    check(torch.linalg.inv_ex, well_conditioned(3, 3), tol="accumulated")
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    _, info = check(torch.linalg.inv_ex, torch.stack([torch.eye(2), singular]), tol="accumulated")[1]
    assert info.tolist() == [0, 2]
    msg = raises_like_cpu(torch.linalg.inv, singular)
    assert "singular" in msg


def test_solve_variants():
    a = well_conditioned(4, 4)
    check(torch.linalg.solve, a, rand(4, seed=1), tol="accumulated")  # vector rhs
    check(torch.linalg.solve, a, rand(4, 2, seed=1), tol="accumulated")
    check(torch.linalg.solve, well_conditioned(3, 4, 4), rand(4, 2, seed=1), tol="accumulated")  # broadcast
    check(torch.linalg.solve, a, rand(3, 4, 2, seed=1), tol="accumulated")
    check(lambda a, b: torch.linalg.solve(a, b, left=False), a, rand(2, 4, seed=1), tol="accumulated")
    check(torch.linalg.solve_ex, a, rand(4, 2, seed=1), tol="accumulated")
    raises_like_cpu(torch.linalg.solve, torch.tensor([[1.0, 2.0], [2.0, 4.0]]), torch.ones(2))


def test_solve_grad():
    grad_check(torch.linalg.solve, well_conditioned(3, 3), rand(3, 2, seed=1), tol="accumulated")


def test_cholesky():
    check(torch.linalg.cholesky, spd(4), tol="accumulated")
    check(torch.linalg.cholesky, spd(3, (2,)), tol="accumulated")
    check(lambda a: torch.linalg.cholesky(a, upper=True), spd(4), tol="accumulated")
    bad = torch.tensor([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    _, info = torch.linalg.cholesky_ex(bad.to(TPU))
    assert info.item() == torch.linalg.cholesky_ex(bad)[1].item() == 2
    msg = raises_like_cpu(torch.linalg.cholesky, bad)
    assert "leading minor of order 2" in msg


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(shape, mode):
    a = rand(*shape)
    q, r = torch.linalg.qr(a.to(TPU), mode=mode)
    qc, rc = torch.linalg.qr(a, mode=mode)
    assert q.shape == qc.shape and r.shape == rc.shape
    # LAPACK Householder signs: compare up to a per-column sign, and the reconstruction
    signs = torch.sign(torch.diagonal(r.cpu(), dim1=-2, dim2=-1)) * torch.sign(torch.diagonal(rc, dim1=-2, dim2=-1))
    k = signs.shape[-1]
    torch.testing.assert_close(r.cpu()[..., :k, :] * signs[..., :, None], rc[..., :k, :], rtol=1e-4, atol=1e-5)
    if mode != "r":
        torch.testing.assert_close((q @ r).cpu(), a, rtol=1e-4, atol=1e-5)


def test_eigh():
    a = spd(5) - 5 * torch.eye(5)
    w, v = torch.linalg.eigh(a.to(TPU))
    wc, _ = torch.linalg.eigh(a)
    assert_same(w, wc, tol="loose")
    torch.testing.assert_close((v @ torch.diag_embed(w) @ v.transpose(-1, -2)).cpu(), a, rtol=1e-4, atol=1e-4)
    check(torch.linalg.eigvalsh, spd(3, (2,)), tol="loose")
    check(lambda a: torch.linalg.eigvalsh(a, UPLO="U"), torch.triu(spd(4)), tol="loose")


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_svd(shape):
    a = rand(*shape)
    u, s, vh = torch.linalg.svd(a.to(TPU), full_matrices=False)
    assert_same(s, torch.linalg.svdvals(a), tol="accumulated")
    torch.testing.assert_close((u * s[..., None, :] @ vh).cpu(), a, rtol=1e-4, atol=1e-5)
    check(torch.linalg.svdvals, a, tol="accumulated")
    uf, _, vhf = torch.linalg.svd(a.to(TPU), full_matrices=True)
    assert uf.shape == torch.Size(shape[:-1] + (shape[-2],)) and vhf.shape[-1] == shape[-1]


def test_det_slogdet():
    for a in (rand(4, 4), rand(3, 3, 3, seed=1), torch.tensor([[1.0, 2.0], [2.0, 4.0]]), -torch.eye(3)):
        check(torch.linalg.det, a, tol="accumulated")
        check(torch.linalg.slogdet, a, tol="accumulated")
    check(torch.det, rand(3, 3, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_det_grad():
    grad_check(torch.linalg.det, well_conditioned(3, 3), tol="accumulated")


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unitriangular", [True, False])
def test_solve_triangular(upper, left, unitriangular):
    a = well_conditioned(4, 4)
    a = torch.triu(a) if upper else torch.tril(a)
    b = rand(4, 3, seed=1) if left else rand(3, 4, seed=1)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unitriangular),
          a, b, tol="accumulated")


def test_solve_triangular_batched_and_legacy():
    a = torch.triu(well_conditioned(2, 4, 4))
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True), a, rand(4, 2, seed=1), tol="accumulated")
    check(lambda b, a: torch.triangular_solve(b, a, upper=True, transpose=True), rand(2, 4, 2, seed=1), a,
          tol="accumulated")


def test_lu_factor():
    check(torch.linalg.lu_factor, rand(4, 4), tol="accumulated")
    check(torch.linalg.lu_factor_ex, rand(2, 3, 3), tol="accumulated")
    check(torch.linalg.lu_factor_ex, torch.tensor([[1.0, 2.0], [2.0, 4.0]]))


def test_det_grad_noncontiguous_input():
    a = well_conditioned(3, 3).mT.contiguous().mT  # torch factors A, not A^T, here
    grad_check(torch.linalg.det, a, tol="accumulated")
    grad_check(lambda a: torch.linalg.slogdet(a)[1], well_conditioned(2, 3, 3), tol="accumulated")


@pytest.mark.slow  # heavier twin of the default LU factor/solve checks
def test_lu_solve_lu_unpack_linalg_lu():
    a, b = rand(2, 4, 4), rand(2, 4, 3, seed=1)
    lu, piv = torch.linalg.lu_factor(a)
    for left in (True, False):
        for adjoint in (True, False):
            rhs = b if left else b.mT
            check(lambda lu, piv, rhs: torch.linalg.lu_solve(lu, piv, rhs, left=left, adjoint=adjoint), lu, piv, rhs,
                  tol="accumulated")
    for shape in ((4, 4), (3, 5), (2, 5, 3)):
        x = rand(*shape, seed=2)
        check(torch.linalg.lu, x, rtol=1e-5, atol=1e-6)
        check(lambda lu, piv: torch.lu_unpack(lu, piv), *torch.linalg.lu_factor(x), rtol=1e-5, atol=1e-6)


def test_inv_grad():
    grad_check(torch.linalg.inv, well_conditioned(2, 3, 3), tol="accumulated")


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
    check(lambda a, b: torch.cdist(a, b, p=p), x1, x2, tol="ulps")
    if p not in (0.0, 0.5):  # p < 1 at a zero difference is NaN on CPU too (0 * inf)
        grad_check(lambda a, b: torch.cdist(a, b, p=p), x1, x2, tol="accumulated")


def test_cdist_mm_mode_broadcast_and_empty():
    x1, x2 = rand(30, 4), rand(3, 1, 7, 4, seed=1)
    check(lambda a, b: torch.cdist(a, b), x1, x2, tol="loose")
    check(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), rand(3, 4), rand(2, 4, seed=1),
          tol="loose")
    grad_check(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), rand(1, 3, 2),
               rand(4, 2, 2, seed=1), tol="accumulated")
    check(lambda a, b: torch.cdist(a, b), rand(0, 3), rand(4, 3))


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist_values_and_grad(p):
    x = rand(5, 3)
    check(lambda a: F.pdist(a, p=p), x, tol="ulps")
    if p != 0.0:
        grad_check(lambda a: F.pdist(a, p=p), x, tol="accumulated")
    check(lambda a: F.pdist(a), rand(1, 3))


# ---------------------------------------------------------------- cholesky family / QR pieces
@needs_aten("cholesky")
@pytest.mark.parametrize("upper", [False, True])
def test_torch_cholesky(upper):  # the deprecated torch.cholesky (aten::cholesky), not torch.linalg.cholesky
    a = spd(4, (2,))
    check(lambda m: torch.cholesky(m, upper=upper), a, tol="ulps")
    grad_check(lambda m: torch.cholesky(m, upper=upper), a, tol="loose")


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_inverse(upper):
    factor = torch.linalg.cholesky(spd(4, (2,)), upper=upper)
    check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, tol="accumulated")
    grad_check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, tol="loose")


@needs_aten("cholesky")
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
    check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), b, factor, tol="accumulated")
    grad_check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), rand(2, 3, 2, seed=2), factor,
               tol="loose")


def test_matrix_exp_values_batch_and_grad():
    a = rand(2, 4, 4) * 0.5
    check(torch.linalg.matrix_exp, a, tol="accumulated")
    check(torch.linalg.matrix_exp, rand(3, 3).mT, tol="accumulated")
    check(torch.linalg.matrix_exp, rand(0, 2, 2))
    grad_check(torch.linalg.matrix_exp, rand(3, 3) * 0.3, tol="accumulated")


def test_matrix_exp_bfloat16_computes_in_float32():
    # CPU's own bfloat16 kernel returns inf/NaN here; the reference is float32 rounded once
    a = rand(2, 4, 4) * 0.3
    expected = torch.linalg.matrix_exp(a).bfloat16()
    assert_same(torch.linalg.matrix_exp(a.bfloat16().to(TPU)), torch.linalg.matrix_exp(a.bfloat16().float()).bfloat16())
    assert_same(torch.linalg.matrix_exp(a.bfloat16().to(TPU)), expected, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_geqrf_householder_ormqr(shape):
    a = rand(*shape)
    check(torch.geqrf, a, tol="accumulated")
    h, tau = torch.geqrf(a)
    m = shape[-2]
    check(torch.linalg.householder_product, h[..., :, :min(shape[-2:])] if shape[-2] >= shape[-1] else h[..., :, :m],
          tau, tol="accumulated")
    c = rand(*shape[:-2], m, 2, seed=3)
    for left, transpose in [(True, False), (True, True)]:
        check(lambda hh, tt, cc: torch.ormqr(hh, tt, cc, left=left, transpose=transpose), h, tau, c,
              tol="accumulated")
    cr = rand(*shape[:-2], 2, m, seed=4)
    for transpose in (False, True):
        check(lambda hh, tt, cc: torch.ormqr(hh, tt, cc, left=False, transpose=transpose), h, tau, cr,
              tol="accumulated")


def test_householder_product_grad():
    h, tau = torch.geqrf(rand(4, 3))
    grad_check(torch.linalg.householder_product, h, tau, tol="loose")


@pytest.mark.parametrize("op, shapes", [
    ("mm", [(1, 1), (1, 0)]), ("mm", [(2, 0), (0, 3)]), ("mm", [(2, 2), (2, 2)]), ("mv", [(2, 0), (0,)]),
    ("mv", [(2, 2), (2,)]), ("bmm", [(1, 2, 2), (1, 2, 0)]), ("bmm", [(1, 2, 2), (1, 2, 2)]),
    ("matmul", [(0,), (0,)]), ("matmul", [(3, 1, 2), (2, 0)]),
])
def test_bool_products_refused_unless_the_result_is_trivial(op, shapes):
    # CPU returns before its dtype dispatch when the result is empty or the reduced dim is 0 (found by
    # the hypothesis bad-input sweep: bool (1,) @ (1, 0)); dot refuses bool always
    both(getattr(torch, op), *[torch.ones(s, dtype=torch.bool) for s in shapes], message=True)
