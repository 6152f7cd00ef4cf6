"""Less common lowerings vs CPU PyTorch: cross/cdist/pdist, Cholesky/QR pieces, matrix_exp,
grid_sample, bicubic/nearest-exact upsampling, fractional max pooling, margin losses, histogram;
plus the conformance harness's equivalence rules (vector signs, CPU-only arguments)."""
import pytest
import torch
import torch.nn.functional as F

from helpers import TPU, assert_same, check, grad_check, needs_aten, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


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
@needs_aten("cholesky")
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    a = spd(4, (2,))
    check(lambda m: torch.cholesky(m, upper=upper), a, rtol=1e-5, atol=1e-5)
    grad_check(lambda m: torch.cholesky(m, upper=upper), a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_inverse(upper):
    factor = torch.linalg.cholesky(spd(4, (2,)), upper=upper)
    check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, rtol=1e-4, atol=1e-5)
    grad_check(lambda f: torch.cholesky_inverse(f, upper=upper), factor, rtol=1e-4, atol=1e-4)


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
    check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), b, factor, rtol=1e-4, atol=1e-5)
    grad_check(lambda bb, f: torch.cholesky_solve(bb, f, upper=upper), rand(2, 3, 2, seed=2), factor,
               rtol=1e-4, atol=1e-4)


def test_matrix_exp_values_batch_and_grad():
    a = rand(2, 4, 4) * 0.5
    check(torch.linalg.matrix_exp, a, rtol=1e-4, atol=1e-5)
    check(torch.linalg.matrix_exp, rand(3, 3).mT, rtol=1e-4, atol=1e-5)
    check(torch.linalg.matrix_exp, rand(0, 2, 2))
    grad_check(torch.linalg.matrix_exp, rand(3, 3) * 0.3, rtol=1e-4, atol=1e-5)


def test_matrix_exp_bfloat16_computes_in_float32():
    # CPU's own bfloat16 kernel returns inf/NaN here; the reference is float32 rounded once
    a = rand(2, 4, 4) * 0.3
    expected = torch.linalg.matrix_exp(a).bfloat16()
    assert_same(torch.linalg.matrix_exp(a.bfloat16().to(TPU)), torch.linalg.matrix_exp(a.bfloat16().float()).bfloat16())
    assert_same(torch.linalg.matrix_exp(a.bfloat16().to(TPU)), expected, rtol=1.6e-2, atol=1e-2)


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


# ---------------------------------------------------------------- grid_sample / upsampling
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_values_and_grads(mode, padding_mode, align_corners):
    inp = rand(2, 3, 5, 6)
    grid = torch.rand(2, 4, 3, 2, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2  # some outside
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
               rand(2, 3, 4, 5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,size", [((2, 3, 5), (8,)), ((1, 2, 3, 4, 5), (5, 3, 7))])
def test_nearest_exact_1d_3d_grad(shape, size):
    grad_check(lambda a: F.interpolate(a, size=size, mode="nearest-exact"), rand(*shape))


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


# ---------------------------------------------------------------- margin losses
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss_and_grad(reduction, p):
    x, y, w = rand(4, 5), torch.tensor([0, 4, 2, 2]), torch.rand(5, generator=torch.Generator().manual_seed(1))
    grad_check(lambda a: F.multi_margin_loss(a, y.to(a.device), p=p, margin=0.7, reduction=reduction), x)
    grad_check(lambda a: F.multi_margin_loss(a, y.to(a.device), p=p, weight=w.to(a.device), reduction=reduction), x)
    grad_check(lambda a: F.multi_margin_loss(a, y[1].to(a.device), p=p, reduction=reduction), x[0])  # 1-D input


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_and_grad(reduction):
    x = rand(4, 5)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, 2, 0], [-1, 2, 3, 0, 0], [4, 2, 0, -1, 1]])  # stops at -1
    grad_check(lambda a: F.multilabel_margin_loss(a, t.to(a.device), reduction=reduction), x)
    grad_check(lambda a: F.multilabel_margin_loss(a, t[0].to(a.device), reduction=reduction), x[0])


# ---------------------------------------------------------------- histogram
@pytest.mark.parametrize("kwargs", [dict(bins=7), dict(bins=5, range=(-1.0, 1.0)), dict(bins=4, density=True),
                                    dict(bins=torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0]))])
def test_histogram(kwargs):
    x, w = rand(3, 40), torch.rand(3, 40, generator=torch.Generator().manual_seed(1))
    check(lambda a, **kw: torch.histogram(a, **kw), x, **kwargs, rtol=1e-6, atol=0)  # density: one rounding
    check(lambda a, ww, **kw: torch.histogram(a, weight=ww, **kw), x, w, **kwargs, rtol=1e-6, atol=1e-6)


def test_histogram_edge_cases():
    check(lambda a: torch.histogram(a, bins=3), torch.ones(5), rtol=0, atol=0)  # min == max: +-0.5
    check(lambda a: torch.histogram(a, bins=3), torch.zeros(0), rtol=0, atol=0)  # empty: [0, 1]
    check(lambda a: torch.histogram(a, bins=3), torch.tensor([1.0, 9.0, 3.0, 9.0, 2.0])[::2], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histogram(torch.tensor([1.0, float("nan")], device=TPU), bins=3)


# ---------------------------------------------------------------- fixed failures from the OpInfo sweep
def test_unfold_empty_batch_and_unique_consecutive_scalar():
    check(lambda a: F.unfold(a, 2), torch.zeros(0, 1, 5, 5))
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), torch.tensor(3.0))
    check(lambda a: torch.unique_consecutive(a, return_counts=True, dim=0), rand(1, 3))


# ---------------------------------------------------------------- the conformance harness's equivalence rules
def test_harness_aligns_eigenvector_signs_but_not_wrong_vectors():
    from tpu_interactive.testing import compare as K
    from tpu_interactive.testing import conformance as C

    a = rand(2, 4, 4)
    a = a + a.mT
    expected = torch.linalg.eigh(a)
    flipped = torch.linalg.eigh(a.to(TPU))
    flipped = type(flipped)((flipped[0], flipped[1] * torch.tensor([1.0, -1.0, -1.0, 1.0], device=TPU)))
    K.compare(C._align_signs("linalg.eigh", flipped, expected), expected)
    wrong = type(flipped)((flipped[0], flipped[1].roll(1, dims=-1)))
    with pytest.raises(K.Mismatch):
        K.compare(C._align_signs("linalg.eigh", wrong, expected), expected)


def test_harness_svd_signs_move_u_and_v_together():
    from tpu_interactive.testing import compare as K
    from tpu_interactive.testing import conformance as C

    a = rand(3, 5)
    expected = torch.linalg.svd(a, full_matrices=True)
    u, s, vh = torch.linalg.svd(a.to(TPU), full_matrices=True)
    sign = torch.tensor([-1.0, 1.0, -1.0], device=TPU)
    joint = (u * sign, s, torch.cat([vh[:3] * sign[:, None], vh[3:]]))
    K.compare(C._align_signs("linalg.svd", joint, expected), expected)
    only_u = (u * sign, s, vh)  # U flipped without V: a different (wrong) factorization
    with pytest.raises(K.Mismatch):
        K.compare(C._align_signs("linalg.svd", only_u, expected), expected)


def test_harness_keeps_cpu_only_arguments_on_cpu():
    from tpu_interactive.testing import compare as K
    from tpu_interactive.testing import conformance as C

    op = C.find_ops(["tensor_split"])[0]
    sample = next(s for s in op.sample_inputs("cpu", torch.float32) if isinstance(s.args[0], torch.Tensor))
    inp, args, _ = K.sample_to_tpu("tensor_split", sample)
    assert inp.device.type == "tpu" and args[0].device.type == "cpu"
    assert C.run_op(op, "float32", max_samples=4).outcome == "pass"


def test_harness_mha_dropout_sample_is_shapes_only():
    from tpu_interactive.testing import conformance as C
    from tpu_interactive.testing import tables

    op = C.find_ops(["nn.functional.multi_head_attention_forward"])[0]
    samples = list(op.sample_inputs("cpu", torch.float32))[:3]
    assert [tables.random_sample("nn.functional.multi_head_attention_forward", s) for s in samples] == [False, True, False]
