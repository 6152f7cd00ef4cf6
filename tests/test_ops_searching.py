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
