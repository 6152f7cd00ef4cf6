"""Special functions on tpu vs CPU PyTorch: wide input ranges (negatives, poles, 0, large, NaN/inf),
float32 and float64 (where precision differences show), integer inputs, gradients."""

import pytest
import torch

from helpers import TPU, assert_same, check, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")

NAN, INF = float("nan"), float("inf")
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
    check(lambda x: torch.polygamma(n, x), wide(dtype), tol="special")


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
    assert_same(gt, g, tol="ulps")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logcumsumexp_forward_matches_cpu_rounding(dtype):
    # float32 is exact (both correctly rounded from a float64 accumulation); float64 to rounding
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3 - 1e4).to(dtype)
    tol = dict(rtol=1e-14, atol=0) if dtype == torch.float64 else dict(rtol=0, atol=0)
    check(lambda v: torch.logcumsumexp(v, 0), x, **tol)


# ---------------------------------------------------------------- unary special functions vs CPU
S = torch.special
UNARY = {
    "i0": torch.i0, "i0e": S.i0e, "i1": S.i1, "i1e": S.i1e, "ndtri": S.ndtri, "log_ndtr": S.log_ndtr,
    "erfcx": S.erfcx, "entr": S.entr, "sinc": torch.sinc, "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1, "modified_bessel_i0": S.modified_bessel_i0,
    "modified_bessel_i1": S.modified_bessel_i1, "modified_bessel_k0": S.modified_bessel_k0,
    "modified_bessel_k1": S.modified_bessel_k1, "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1, "airy_ai": S.airy_ai,
    "spherical_bessel_j0": S.spherical_bessel_j0,
}
# absolute slack near the zeros of oscillating functions (relative error is unbounded there)
ATOL = {"bessel_y0": 1e-6, "bessel_y1": 1e-6, "bessel_j0": 1e-7, "bessel_j1": 1e-7, "airy_ai": 1e-7}


def _unary_inputs(name, dtype):
    if name == "ndtri":  # a probability: 0, 1, outside [0, 1], tails
        values = [0.0, 1e-300, 1e-30, 1e-8, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1 - 1e-7, 1.0, -0.5, 2.0, NAN,
                  INF]
        if dtype == torch.float32:
            values[1] = 1e-37  # stay out of float32 denormals (XLA flushes them to zero)
    else:
        values = [v for v in WIDE if v not in (1e-30, -1e-30)] + [-601.5, -30.0, -26.0, -6.5, -3.0, 0.05, 4.9, 5.1,
                                                               7.5, 8.4, 12.0, 49.0, 51.0, 103.0, 700.0]
    return torch.tensor(values, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_special_wide_range(name, dtype):
    fn = UNARY[name]
    tol = dict(rtol=2e-5 if dtype == torch.float32 else 1e-11,
               atol=ATOL.get(name, 1e-30) * (1 if dtype == torch.float32 else 1e-8))
    check(fn, _unary_inputs(name, dtype), **tol)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_special_int_noncontiguous_empty_and_0dim(name):
    fn = UNARY[name]
    check(fn, torch.arange(-4, 8).reshape(3, 4) if name != "ndtri" else torch.tensor([0, 1, 1, 0]), rtol=2e-5,
          atol=1e-7)  # int64 promotes to float32
    grid = torch.linspace(0.01, 0.99, 30).reshape(5, 6) if name == "ndtri" else torch.linspace(-9, 9, 30).reshape(5, 6)
    check(fn, grid.t(), rtol=2e-5, atol=1e-7)
    check(fn, grid[:, 1::2], rtol=2e-5, atol=1e-7)
    check(fn, torch.empty(0, 3))
    check(fn, torch.tensor(0.3), rtol=2e-5)


@pytest.mark.parametrize("name", ["i0", "i0e", "i1", "i1e", "ndtri", "log_ndtr", "erfcx", "entr", "sinc"])
def test_unary_special_gradients(name):
    fn = UNARY[name]
    x = torch.tensor([0.05, 0.2, 0.5, 0.8, 0.95]) if name == "ndtri" else \
        torch.tensor([-5.0, -1.5, -0.3, 0.0, 0.4, 1.0, 2.5, 7.0] if name != "entr" else [0.0, 0.1, 0.5, 1.0, 3.0])
    x.requires_grad_()
    xt = to_tpu(x)
    (g,) = torch.autograd.grad(fn(x).sum(), x)
    (gt,) = torch.autograd.grad(fn(xt).sum(), xt)
    assert_same(gt, g, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.complex64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_special_reduced_and_complex_dtypes(name, dtype):
    # CPU has half kernels only for i0/i0e/i1/i1e/entr/sinc (computed in float32, rounded once) and a
    # complex one only for sinc; elsewhere tpu must raise CPU's NotImplementedError
    fn = UNARY[name]
    x = torch.linspace(0.05, 0.95, 17).to(dtype)
    try:
        expected = fn(x)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            fn(x.to(TPU))
        return
    assert_same(fn(x.to(TPU)), expected, rtol=1.6e-2 if dtype != torch.complex64 else 1e-5, atol=1e-2)


# ---------------------------------------------------------------- polynomials
POLYNOMIALS = sorted(n for n in dir(S) if "_polynomial_" in n)
X_GRID = [-3.0, -1.0, -0.99, -0.5, -1e-3, 0.0, 0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 10.0, INF, -INF]
N_GRID = [-3.0, -1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, 20.0, 129.0, NAN, INF, 2.7]


def test_polynomial_families_found():
    assert len(POLYNOMIALS) == 12, POLYNOMIALS


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_grid(name, dtype):
    # covers n < 0 (-> 0), NaN/inf n (-> 0), fractional n (truncated), |x| == 1 and x == 0 exact values,
    # the closed trigonometric forms for large n inside (-1, 1), hermite's NaN above degree 128 (float32)
    fn = getattr(S, name)
    xs, ns = torch.tensor(X_GRID, dtype=dtype), torch.tensor(N_GRID, dtype=dtype)
    if dtype == torch.float32 and name.startswith(("shifted", "laguerre")):
        ns = ns[ns.isnan() | (ns < 50)]  # large-n float32 recurrences amplify rounding (both sides)
    x, n = torch.meshgrid(xs, ns, indexing="ij")
    # float32: the closed forms' cos((n + 1/2) acos t) carry acos's last-ulp difference times n
    check(fn, x, n, rtol=5e-5 if dtype == torch.float32 else 1e-11, atol=1e-6)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_scalar_overloads_and_ints(name):
    fn = getattr(S, name)
    check(fn, torch.linspace(-1.5, 1.5, 7), 4, rtol=1e-5, atol=1e-6)
    check(lambda n: fn(0.3, n), torch.arange(0, 10), rtol=1e-5, atol=1e-6)
    check(fn, torch.arange(-2, 3), torch.arange(0, 5), rtol=1e-5, atol=1e-6)  # int64 -> float32
    check(fn, torch.linspace(-0.9, 0.9, 6).reshape(2, 3), torch.tensor([[3], [11]]), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- igamma / igammac
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_igamma_grid(fn, dtype):
    a = torch.tensor([0.0, 1e-3, 0.5, 1.0, 2.5, 10.0, 100.0, INF, -1.0, NAN], dtype=dtype)
    x = torch.tensor([0.0, 1e-3, 0.5, 1.0, 3.0, 20.0, 150.0, INF, -1.0, NAN], dtype=dtype)
    A, X = torch.meshgrid(a, x, indexing="ij")
    check(fn, A, X, rtol=1e-4 if dtype == torch.float32 else 1e-10, atol=1e-6)


def test_igamma_gradient_wrt_x_and_int_raises():
    a = torch.tensor([0.5, 2.0, 5.0])
    x = torch.tensor([0.3, 1.5, 7.0], requires_grad=True)
    xt = to_tpu(x)
    (g,) = torch.autograd.grad(torch.igamma(a, x).sum(), x)
    (gt,) = torch.autograd.grad(torch.igamma(a.to(TPU), xt).sum(), xt)
    assert_same(gt, g, rtol=1e-5)
    with pytest.raises(NotImplementedError):
        torch.igamma(torch.ones(2, dtype=torch.int64, device=TPU), torch.ones(2, dtype=torch.int64, device=TPU))


# ---------------------------------------------------------------- misc elementwise / reductions
PAIR = torch.tensor([[1.0, NAN, INF, -INF, 0.0, -0.0, 3.5, 1e-30, 700.0, -INF],
                     [2.0, 1.0, INF, -INF, INF, -0.0, -3.5, 2.0, -700.0, INF]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.logaddexp, torch.logaddexp2, lambda a, b: torch.rsub(a, b, alpha=2),
                                lambda a, b: torch.rsub(a, 3), lambda a, b: torch.rsub(a, b)])
def test_binary_misc(fn, dtype):
    x, y = PAIR.to(dtype)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    check(fn, x, y, **tol)
    check(fn, torch.randn(3, 1).to(dtype), torch.randn(4).to(dtype), **tol)  # broadcast
    check(fn, torch.randn(4, 3).to(dtype).t(), torch.randn(3, 4).to(dtype), **tol)  # non-contiguous


def test_rsub_ints_bool_and_logaddexp_int_raises():
    check(lambda a, b: torch.rsub(a, b, alpha=3), torch.arange(6), torch.arange(6, 12))
    check(lambda a: torch.rsub(a, 2.5), torch.arange(4))
    with pytest.raises(RuntimeError):
        torch.rsub(torch.ones(2, dtype=torch.bool, device=TPU), torch.ones(2, dtype=torch.bool, device=TPU))
    with pytest.raises(NotImplementedError):
        torch.logaddexp(torch.ones(2, dtype=torch.int64, device=TPU), torch.ones(2, dtype=torch.int64, device=TPU))


@pytest.mark.parametrize("fn", [torch.logaddexp, torch.logaddexp2, lambda a, b: torch.rsub(a, b, alpha=2)])
def test_binary_misc_gradients(fn):
    x = torch.tensor([-3.0, 0.0, 1.0, 20.0], requires_grad=True)
    y = torch.tensor([1.0, 0.0, -2.0, 20.0], requires_grad=True)
    xt, yt = to_tpu(x), to_tpu(y)
    g = torch.autograd.grad(fn(x, y).sum(), (x, y))
    gt = torch.autograd.grad(fn(xt, yt).sum(), (xt, yt))
    assert_same(gt, g, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_sinc(dtype):
    x = PAIR.flatten() if dtype.is_floating_point else torch.arange(-3, 4)
    check(torch.sinc, x.to(dtype), rtol=1.6e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_frexp(dtype):
    x = torch.tensor([1.0, NAN, INF, -INF, 0.0, -0.0, 3.5, 1e-30, 700.0, -0.75, 1e-40]).to(dtype)
    if dtype in (torch.float32, torch.bfloat16):
        x = x[:-1]  # float32/bfloat16 denormals flush to zero under XLA
    check(torch.frexp, x)
    check(torch.frexp, torch.randn(3, 4).to(dtype).t())
    with pytest.raises(RuntimeError):
        torch.frexp(torch.ones(2, dtype=torch.int64, device=TPU))


def test_equal_returns_python_bool():
    x = torch.randn(3, 4)
    for a, b in [(x, x.clone()), (x, x + 1), (x, x[:2]), (x.t(), x.t().contiguous()),
                 (torch.tensor([NAN]), torch.tensor([NAN])), (torch.ones(2), torch.ones(2, dtype=torch.int64)),
                 (torch.empty(0), torch.empty(0))]:
        expected = torch.equal(a, b)
        actual = torch.equal(a.to(TPU), b.to(TPU))
        assert type(actual) is bool and actual == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.bfloat16])
def test_trace(dtype):
    check(torch.trace, torch.arange(12).reshape(3, 4).to(dtype))
    check(torch.trace, torch.arange(12).reshape(4, 3).to(dtype).t())
    check(torch.trace, torch.empty(0, 3).to(dtype))
    with pytest.raises(RuntimeError):
        torch.trace(torch.ones(2, 2, 2, device=TPU, dtype=dtype))


def test_trace_bool_raises_and_gradient():
    with pytest.raises(NotImplementedError):
        torch.trace(torch.ones(2, 2, dtype=torch.bool, device=TPU))
    x = torch.randn(3, 4, requires_grad=True)
    xt = to_tpu(x)
    assert_same(torch.autograd.grad(torch.trace(xt), xt)[0], torch.autograd.grad(torch.trace(x), x)[0])


@pytest.mark.parametrize("p", [1, 2, 3.5, INF])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_renorm(p, dim):
    x = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(2)) * 3
    check(lambda t: torch.renorm(t, p, dim, 2.0), x, rtol=1e-6)
    check(lambda t: torch.renorm(t, p, dim, 2.0), x.transpose(0, 2), rtol=1e-6)
    xg = x.clone().requires_grad_()
    xt = to_tpu(xg)
    g = torch.autograd.grad(torch.renorm(xg, p, dim, 2.0).sum(), xg)[0]
    gt = torch.autograd.grad(torch.renorm(xt, p, dim, 2.0).sum(), xt)[0]
    assert_same(gt, g, rtol=1e-5)


def test_renorm_errors():
    with pytest.raises(RuntimeError):
        torch.renorm(torch.ones(2, 2, dtype=torch.int64, device=TPU), 2, 0, 1.0)
    with pytest.raises(RuntimeError):
        torch.renorm(torch.ones(2, 2, device=TPU), -1, 0, 1.0)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_channel_shuffle(groups):
    x = torch.arange(2 * 6 * 5, dtype=torch.float32).reshape(2, 6, 5)
    check(lambda t: torch.channel_shuffle(t, groups), x)
    check(lambda t: torch.nn.functional.channel_shuffle(t, groups), x.reshape(2, 6, 5, 1).transpose(2, 3))
    out = torch.channel_shuffle(x.to(TPU), groups)
    assert out.untyped_storage().data_ptr() != x.to(TPU).untyped_storage().data_ptr()
    with pytest.raises(RuntimeError):
        torch.channel_shuffle(x.to(TPU), 4)


# ---------------------------------------------------------------- random
def test_rrelu_eval_matches_cpu_and_train_noise_semantics():
    F = torch.nn.functional
    x = torch.randn(200)
    check(lambda t: F.rrelu(t, 0.1, 0.3, training=False), x)
    torch.manual_seed(0)
    xt = x.to(TPU)
    noise = torch.empty_like(xt)
    out = torch.ops.aten.rrelu_with_noise(xt, noise, 0.1, 0.3, True).cpu()
    noise = noise.cpu()
    neg = x <= 0
    assert torch.all(noise[~neg] == 1) and torch.all((noise[neg] >= 0.1) & (noise[neg] <= 0.3))
    assert torch.allclose(out, x * noise) and noise[neg].std() > 0.01
    # autograd: d out / d x is the noise
    xg = x.to(TPU).requires_grad_()
    y = F.rrelu(xg, 0.1, 0.3, training=True)
    (g,) = torch.autograd.grad(y.sum(), xg)
    assert torch.allclose(y.detach().cpu(), x * g.cpu())



def test_rrelu_with_explicit_generators():
    """A CPU generator draws CPU's exact noise; a tpu generator's draws repeat under its seed and
    leave the default generator alone."""
    x = torch.randn(64)

    def run(device, generator_device, seed=1):
        generator = torch.Generator(device=generator_device).manual_seed(seed)
        noise = torch.empty_like(x, device=device)
        out = torch.ops.aten.rrelu_with_noise(x.to(device), noise, 0.1, 0.3, True, generator)
        return out.cpu(), noise.cpu()

    assert all(torch.equal(a, b) for a, b in zip(run(TPU, "cpu"), run("cpu", "cpu")))
    torch.manual_seed(0)
    before = torch.rand(3, device=TPU).cpu()
    torch.manual_seed(0)
    out, noise = run(TPU, TPU)
    assert torch.equal(torch.rand(3, device=TPU).cpu(), before)  # default generator not advanced
    assert all(torch.equal(a, b) for a, b in zip((out, noise), run(TPU, TPU)))
    assert not torch.equal(noise, run(TPU, TPU, seed=2)[1])
    neg = x <= 0
    assert torch.all(noise[~neg] == 1) and torch.all((noise[neg] >= 0.1) & (noise[neg] <= 0.3))
    assert torch.allclose(out, x * noise)

def test_random_distributions():
    torch.manual_seed(0)
    n = 20000
    x = torch.empty(n, device=TPU)
    c = x.cauchy_(1.0, 2.0).cpu()
    assert abs(c.median().item() - 1.0) < 0.1 and abs((c - 1).abs().median().item() - 2.0) < 0.15
    ln = torch.empty(n, device=TPU, dtype=torch.float64).log_normal_(0.5, 0.25).cpu()
    assert ln.dtype == torch.float64 and ln.min() > 0
    assert abs(ln.log().mean().item() - 0.5) < 0.01 and abs(ln.log().std().item() - 0.25) < 0.01
    for dtype in (torch.float32, torch.int64):
        g = torch.empty(n, device=TPU, dtype=dtype).geometric_(0.3).cpu()
        assert g.min() >= 1 and torch.all(g == g.round()) and abs(g.double().mean().item() - 1 / 0.3) < 0.1
    mean, std = torch.zeros(3, 1, device=TPU) + 5, torch.full((1, n), 2.0, device=TPU)
    nt = torch.normal(mean, std).cpu()
    assert nt.shape == (3, n) and abs(nt.mean().item() - 5) < 0.05 and abs(nt.std().item() - 2) < 0.05
    assert torch.normal(mean, 2.0).shape == (3, 1) and torch.normal(1.0, std).shape == (1, n)
    assert torch.normal(torch.zeros(4, device=TPU, dtype=torch.float64), 1.0).dtype == torch.float64


def test_random_argument_errors_and_cpu_generator():
    x = torch.empty(4, device=TPU)
    for bad in (lambda: x.cauchy_(0, -1.0), lambda: x.log_normal_(0, 0.0), lambda: x.geometric_(1.5),
                lambda: torch.normal(torch.zeros(2, device=TPU), torch.tensor([1.0, -1.0], device=TPU))):
        with pytest.raises(RuntimeError):
            bad()
    # an explicit CPU generator draws on CPU: bit-identical to CPU
    for draw in (lambda t, g: t.cauchy_(generator=g), lambda t, g: t.log_normal_(generator=g),
                 lambda t, g: t.geometric_(0.4, generator=g)):
        expected = draw(torch.empty(5), torch.Generator().manual_seed(3))
        actual = draw(torch.empty(5, device=TPU), torch.Generator().manual_seed(3))
        assert_same(actual, expected, tol="exact")
    expected = torch.normal(torch.zeros(5), torch.ones(5), generator=torch.Generator().manual_seed(3))
    actual = torch.normal(torch.zeros(5, device=TPU), torch.ones(5, device=TPU),
                          generator=torch.Generator().manual_seed(3))
    assert_same(actual, expected, tol="exact")
