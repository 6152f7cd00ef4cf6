"""Complex tensors and FFTs on tpu vs CPU: dtype-changing views (real aliases), lazy conj/neg bits,
complex/polar/angle/conj_physical, the _fft_* primitives (all norm modes, directions, dims) and their
gradients, stft/istft."""
import math

import pytest
import torch

from helpers import TPU, assert_same, check, raises_like_cpu, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")


def _randc(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g)


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g)


def _grads(fn, *inputs, seed=1):
    """d(sum(fn(x) * cotangent))/dx on one device; real views of complex outputs for the cotangent."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    real = torch.view_as_real(out.resolve_conj()) if out.is_complex() else out
    cot = _randn(*real.shape, dtype=real.dtype, seed=seed).to(real.device)
    return torch.autograd.grad((real * cot).sum(), leaves)


def check_grad(fn, *inputs, tol="loose"):
    expected = _grads(fn, *inputs)
    actual = _grads(fn, *to_tpu(inputs))
    assert_same(actual, expected, tol=tol)


# ---------------------------------------------------------------- views of complex are aliases
def test_view_as_real_is_an_alias():
    c = _randc(3, 4)
    t = c.to(TPU)
    r = torch.view_as_real(t)
    assert r.dtype == torch.float32 and r.shape == (3, 4, 2) and r.stride() == (8, 2, 1)
    assert r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert_same(r, torch.view_as_real(c))
    r[1, 2, 1] = 7.0
    torch.view_as_real(c)[1, 2, 1] = 7.0
    assert_same(t, c)


def test_view_as_real_of_a_strided_view():
    c = _randc(4, 6)
    check(lambda x: torch.view_as_real(x.t()[1:, ::2]), c)
    check(lambda x: torch.view_as_real(x[2]), c)


def test_view_as_complex_is_an_alias():
    r = _randn(5, 3, 2)
    t = r.to(TPU)
    z = torch.view_as_complex(t)
    assert z.dtype == torch.complex64 and z.shape == (5, 3)
    assert_same(z, torch.view_as_complex(r))
    z.mul_(2j)
    torch.view_as_complex(r).mul_(2j)
    assert_same(t, r)


def test_view_as_complex_of_an_odd_length_buffer():
    r = _randn(7)
    t = r.to(TPU)
    z = torch.view_as_complex(t[:6].view(3, 2))
    z[2] = 1 + 2j
    torch.view_as_complex(r[:6].view(3, 2))[2] = 1 + 2j
    assert_same(t, r)  # the 7th float survived the round trip through complex


def test_complex_bitcast_views():
    check(lambda x: torch.view_as_real(x), _randc(4, dtype=torch.complex128), tol="exact")
    c = _randc(2, 3)
    check(lambda x: x.view(torch.float64), c, tol="exact")  # same element size: a bitcast view
    check(lambda x: x.view(torch.int64), c, tol="exact")
    check(lambda x: x.view(torch.int64).view(torch.complex64), c, tol="exact")


def test_real_and_imag_write_through():
    c = _randc(2, 3)
    t = c.to(TPU)
    t.real.mul_(3)
    t.imag.fill_(-1.5)
    c.real.mul_(3)
    c.imag.fill_(-1.5)
    assert_same(t, c)
    assert_same(t.real, c.real)
    assert_same(t.imag, c.imag)


@pytest.mark.parametrize("fn", [
    lambda x: torch.view_as_real(x.conj()),  # RuntimeError: unresolved conjugation
    lambda x: torch.view_as_real(x.real),  # RuntimeError: not complex
    lambda x: torch.view_as_complex(torch.view_as_real(x)[..., :1]),  # last dim must be 2
    lambda x: torch.view_as_complex(torch.view_as_real(x).transpose(1, 2)),  # last stride must be 1
    lambda x: torch.view_as_complex(torch.view_as_real(x).flatten()[1:5].view(2, 2)),  # odd offset
])
def test_view_errors_match_cpu(fn):
    raises_like_cpu(fn, _randc(2, 2))


# ---------------------------------------------------------------- lazy conj / neg bits
def test_conj_view_reads_transfers_and_copies():
    c = _randc(3, 4)
    t = c.to(TPU)
    assert t.conj().is_conj()
    assert_same(t.conj(), c.conj())
    assert_same(t.conj().resolve_conj(), c.conj().resolve_conj())
    assert_same(t.conj().clone(), c.conj().clone())
    assert_same(t.conj().t()[1:], c.conj().t()[1:])
    assert_same(t.conj() * 2, c.conj() * 2)


def test_neg_bit_of_conj_imag():
    c = _randc(3, 4)
    t = c.to(TPU)
    assert t.conj().imag.is_neg()
    assert_same(t.conj().imag, c.conj().imag)
    assert_same(t.conj().imag + 1, c.conj().imag + 1)
    assert_same(t.conj().imag.resolve_neg(), c.conj().imag.resolve_neg())


def test_writes_through_conj_and_neg_views():
    c = _randc(3, 4)
    t = c.to(TPU)
    t.conj()[0] = 1 + 2j  # stored as 1 - 2j
    c.conj()[0] = 1 + 2j
    t.conj().imag[1].fill_(5.0)  # neg view: stored imag is -5
    c.conj().imag[1].fill_(5.0)
    t.conj().copy_(torch.full((3, 4), 3 - 1j).to(TPU)[None].expand(1, 3, 4)[0])
    c.conj().copy_(torch.full((3, 4), 3 - 1j))
    assert_same(t, c)
    assert not t.is_conj()


def test_ifft_of_real_returns_a_correct_conj_view():
    # torch.fft.ifft of a real input is conj(fft(x)) / n: a lazy conj view that used to lose its bit
    x = _randn(5, 6, 7)
    actual = torch.fft.ifft(x.to(TPU), n=10, dim=1, norm="ortho")
    assert_same(actual, torch.fft.ifft(x, n=10, dim=1, norm="ortho"), tol="loose")


# ---------------------------------------------------------------- complex / polar / angle / conj_physical
def test_complex():
    re, im = _randn(3, 1, seed=1), _randn(4, seed=2)
    check(torch.complex, re, im)
    check(torch.complex, re.double(), im.double().expand(3, 4))
    inf = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    check(torch.complex, torch.zeros(4), inf)  # not 1j * inf = nan + inf j
    check(torch.complex, torch.zeros(0), torch.zeros(0))
    for op in (torch.complex, torch.polar):
        for da, db in [(torch.float32, torch.float64), (torch.int64, torch.int64), (torch.bfloat16, torch.bfloat16)]:
            raises_like_cpu(op, torch.ones(2, dtype=da), torch.ones(2, dtype=db))
    check_grad(torch.complex, re.expand(3, 4), im.expand(3, 4))


def test_polar():
    r, theta = _randn(3, 4, seed=1).abs(), _randn(4, seed=2)
    check(torch.polar, r, theta)
    check(torch.polar, r.double(), theta.double())
    check_grad(torch.polar, r, theta.expand(3, 4))


def test_angle():
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, math.nan, -math.inf, math.inf])
    check(torch.angle, x)
    check(torch.angle, torch.tensor([-3, 0, 4]))
    check(torch.angle, torch.tensor([True, False]))
    check(torch.angle, x.to(torch.bfloat16))
    c = torch.complex(x, torch.tensor([1.0, -1.0, 0.0, -0.0, 1.0, 2.0, math.nan]))
    check(torch.angle, c)
    check(lambda z: torch.angle(z.conj()), c)
    check(torch.angle, torch.zeros(0, 3, dtype=torch.complex64))
    check_grad(torch.angle, _randn(3, 4))


def test_abs_of_complex_and_angle_gradient():
    # regression: abs once cast complex input to its real result dtype first, dropping .imag
    c = _randc(3, 4)
    check(torch.abs, c)
    check_grad(torch.angle, c)


def test_conj_physical():
    c = _randc(3, 4)
    check(torch.conj_physical, c)
    check(torch.conj_physical, c.t())
    check(lambda z: torch.conj_physical(z.conj()), c)
    check(torch.conj_physical, torch.tensor([1, -2]))
    check(lambda z: z.clone().conj_physical_(), c)
    check(lambda z: torch.conj_physical(z, out=torch.empty(0, dtype=z.dtype, device=z.device)), c)
    check(lambda z: torch.conj_physical(z, out=torch.empty_like(z)), c)
    check_grad(torch.conj_physical, c)


def test_equal():
    a = _randn(3, 4)
    nan = torch.tensor([1.0, math.nan])
    for x, y in [(a, a.clone()), (a, a + 1), (a, a[:2]), (nan, nan), (torch.tensor([0.0]), torch.tensor([-0.0])),
                 (torch.tensor([1.0]), torch.tensor([1])), (torch.zeros(2, 0), torch.zeros(2, 0)),
                 (torch.ones(2, 1), torch.ones(2)), (a.t(), a.t().contiguous())]:
        assert torch.equal(*to_tpu((x, y))) == torch.equal(x, y)
    c = _randc(3)
    assert torch.equal(*to_tpu((c.conj(), c.conj().resolve_conj())))
    assert not torch.equal(*to_tpu((c, c.conj())))


# ---------------------------------------------------------------- FFT primitives
@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("dim", [[1], [0, 2], [2, 0, 1], [2]])
def test_fft_c2c(normalization, forward, dim):
    check(torch.ops.aten._fft_c2c, _randc(4, 5, 6), dim, normalization, forward, tol="loose")


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("onesided", [True, False])
@pytest.mark.parametrize("dim", [[1], [0, 2], [2, 1]])
def test_fft_r2c(normalization, onesided, dim):
    check(torch.ops.aten._fft_r2c, _randn(4, 5, 6), dim, normalization, onesided, tol="loose")


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("dim,last", [([1], 8), ([1], 9), ([0, 2], 10), ([2, 0], 7)])
def test_fft_c2r(normalization, dim, last):
    x = _randc(4, 5, 6)
    x = x.narrow(dim[-1], 0, min(x.shape[dim[-1]], last // 2 + 1))
    check(torch.ops.aten._fft_c2r, x, dim, normalization, last, tol="loose")


def test_fft_primitives_out_and_errors():
    x = _randc(4, 6)
    check(lambda z: torch.ops.aten._fft_c2c.out(z, [1], 1, True, out=torch.empty(0, dtype=z.dtype, device=z.device)),
          x, tol="loose")
    with pytest.raises(RuntimeError, match="normalization"):
        torch.ops.aten._fft_c2c(x.to(TPU), [1], 3, True)
    with pytest.raises(RuntimeError):
        torch.fft.fft(torch.zeros(3, 0, device=TPU))


FFT_CASES = [
    ("fft", dict()), ("fft", dict(n=9, dim=0, norm="ortho")), ("ifft", dict(n=4, norm="forward")),
    ("rfft", dict(n=11)), ("irfft", dict(n=9, norm="ortho")), ("hfft", dict(n=10, dim=0)),
    ("ihfft", dict(norm="forward")), ("fft2", dict()), ("ifft2", dict(s=(3, 5), norm="ortho")),
    ("rfft2", dict(dim=(1, 0))), ("irfft2", dict(s=(4, 7))), ("hfft2", dict(s=(3, 10), norm="ortho")),
    ("ihfft2", dict()), ("fftn", dict(norm="forward")), ("ifftn", dict(dim=(0,))), ("rfftn", dict(s=(8, 3))),
    ("irfftn", dict()), ("hfftn", dict(dim=(0, 1))), ("ihfftn", dict(norm="ortho")),
]


@pytest.mark.parametrize("name,kwargs", FFT_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FFT_CASES)])
@pytest.mark.parametrize("kind", ["real", "complex", "transposed", "float64"])
def test_torch_fft_functions(name, kwargs, kind):
    fn = getattr(torch.fft, name)
    rand = _randn if name.startswith(("rfft", "ihfft")) else _randc  # real-input transforms
    x = {"real": _randn(6, 7), "complex": rand(6, 7), "transposed": rand(7, 6).t(),
         "float64": _randn(6, 7, dtype=torch.float64)}[kind]
    check(lambda z: fn(z, **kwargs), x, tol="loose")


@pytest.mark.parametrize("name,kwargs", FFT_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FFT_CASES)])
def test_torch_fft_gradients(name, kwargs):
    fn = getattr(torch.fft, name)
    x = _randn(6, 7) if name.startswith(("rfft", "ihfft")) else _randc(6, 7)
    check_grad(lambda z: fn(z, **kwargs), x)
    if not name.startswith(("rfft", "ihfft")):
        check_grad(lambda z: fn(z, **kwargs), _randn(6, 7))  # real input, complex path


def test_fftshift():
    x = _randc(5, 6)
    check(torch.fft.fftshift, x)
    check(lambda z: torch.fft.ifftshift(z, dim=1), x)


def test_fft_empty_batch():
    # CPU's MKL refuses an empty batch (a DFTI configuration error); tpu returns the empty result that
    # torch's meta kernel describes
    for fn, x in [(lambda z: torch.fft.fft(z, dim=1), torch.zeros(0, 4)),
                  (lambda z: torch.fft.irfft(z, dim=1), torch.zeros(0, 4, dtype=torch.complex64)),
                  (lambda z: torch.fft.rfft2(z), torch.zeros(0, 3, 4))]:
        meta, out = fn(x.to("meta")), fn(x.to(TPU))
        assert out.device.type == "tpu" and (out.shape, out.dtype) == (meta.shape, meta.dtype)
        assert out.cpu().numel() == 0


# ---------------------------------------------------------------- stft / istft
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("return_complex", [True, False])
def test_stft(center, return_complex):
    x = _randn(2, 64)
    window = torch.hann_window(16)
    kwargs = dict(n_fft=16, hop_length=4, center=center, return_complex=return_complex)
    check(lambda z, w: torch.stft(z, window=w, **kwargs), x, window, tol="loose")
    check(lambda z: torch.stft(z, n_fft=10, onesided=False, return_complex=True), x[0], tol="loose")
    check_grad(lambda z, w: torch.stft(z, window=w, **kwargs), x, window)


def test_istft_round_trip_and_grad():
    x = _randn(2, 64)
    window = torch.hann_window(16)
    spec = torch.stft(x, 16, hop_length=4, window=window, return_complex=True)
    istft = lambda s, w: torch.istft(s, 16, hop_length=4, window=w, length=64)  # noqa: E731
    actual, _ = check(istft, spec, window, tol="loose")
    assert_same(actual, x, tol="loose")
    check_grad(istft, spec, window)
