"""Histograms (ops/searching.py) vs CPU PyTorch."""
import pytest
import torch

from helpers import TPU, check, rand

pytestmark = pytest.mark.usefixtures("no_fallback")


# ---------------------------------------------------------------- histogram
@pytest.mark.parametrize("kwargs", [dict(bins=7), dict(bins=5, range=(-1.0, 1.0)), dict(bins=4, density=True),
                                    dict(bins=torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0]))])
def test_histogram(kwargs):
    x, w = rand(3, 40), torch.rand(3, 40, generator=torch.Generator().manual_seed(1))
    check(lambda a, **kw: torch.histogram(a, **kw), x, **kwargs, rtol=1e-6, atol=0)  # density: one rounding
    check(lambda a, ww, **kw: torch.histogram(a, weight=ww, **kw), x, w, **kwargs, rtol=1e-6, atol=1e-6)


def test_histogram_edge_cases():
    check(lambda a: torch.histogram(a, bins=3), torch.ones(5), tol="exact")  # min == max: +-0.5
    check(lambda a: torch.histogram(a, bins=3), torch.zeros(0), tol="exact")  # empty: [0, 1]
    check(lambda a: torch.histogram(a, bins=3), torch.tensor([1.0, 9.0, 3.0, 9.0, 2.0])[::2], tol="exact")
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histogram(torch.tensor([1.0, float("nan")], device=TPU), bins=3)


@pytest.mark.parametrize("elements, test_elements", [
    (torch.tensor([1., 2., float("nan")]), torch.tensor([1, 3])),  # float elements, int tests: float32
    (torch.tensor([16777217]), torch.tensor([16777216.])),  # compared in float32, as on CPU: equal
    (torch.randint(0, 50, (4, 5)), torch.randint(0, 50, (7,))),
    (torch.randn(3, 2).half(), torch.randn(4).half()),
    (torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)),
    (torch.tensor([], dtype=torch.long), torch.tensor([1])),
    (torch.tensor([1, 2]), 2),  # isin.Tensor_Scalar
    (2, torch.tensor([1, 2])),  # isin.Scalar_Tensor
])
@pytest.mark.parametrize("invert", [False, True])
def test_isin_matches_cpu_as_one_program(elements, test_elements, invert, no_fallback):
    def on_tpu(v):
        return v.to(TPU) if isinstance(v, torch.Tensor) else v

    expected = torch.isin(elements, test_elements, invert=invert)
    got = torch.isin(on_tpu(elements), on_tpu(test_elements), invert=invert)
    assert got.device.type == "tpu" and got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_isin_refuses_the_dtypes_cpu_refuses(dtype):
    a = torch.tensor([1, 0]).to(dtype)
    with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
        torch.isin(a, a)
    with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
        torch.isin(a.to(TPU), a.to(TPU))
