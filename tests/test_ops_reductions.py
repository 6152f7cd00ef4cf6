"""Reductions, scans, sort/selection: differential tests against CPU PyTorch."""
import math

import pytest
import torch

from helpers import TPU, assert_same, check, slow, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")

torch.manual_seed(0)
X = torch.randn(4, 6, 5)
XI = torch.randint(-5, 6, (4, 6, 5))
XB = torch.randn(4, 6, 5).bfloat16()


# ---------------------------------------------------------------- sum / mean / prod
@pytest.mark.parametrize("dim", [None, 0, -1, (0, 2), (-1, 1), ()])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_dims(dim, keepdim):
    if dim is None:
        check(torch.sum, X)
        check(torch.mean, X)
        return
    check(lambda a: a.sum(dim, keepdim=keepdim), X, tol="ulps")
    check(lambda a: a.mean(dim, keepdim=keepdim), X, tol="ulps")
    check(lambda a: a.sum(dim, keepdim=keepdim), XI)


def test_sum_dtypes():
    check(lambda a: a.sum(), XI.int())  # int32 -> int64
    check(lambda a: a.sum(1), XI.to(torch.int8))
    check(lambda a: a.sum(), torch.rand(7, 3) > 0.5)  # bool -> int64
    check(lambda a: a.sum(1, dtype=torch.float64), X)
    check(lambda a: a.sum(dtype=torch.float32), XI)
    check(lambda a: a.sum(-1), XB, tol="ulps")
    check(lambda a: a.mean(), XB, tol="ulps")
    check(lambda a: a.mean(1, dtype=torch.float64), XI)
    # a large int64 sum must not overflow through a narrower accumulator
    big = torch.full((4,), 2**40, dtype=torch.int64)
    check(torch.sum, big)


def test_sum_noncontiguous_empty_zero_dim():
    check(lambda a: a.transpose(0, 2).sum(0), X, tol="ulps")
    check(lambda a: a[:, ::2].mean(-1), X, tol="ulps")
    check(lambda a: a.sum(0), torch.empty(0, 3))
    check(lambda a: a.sum(), torch.empty(0, 3))
    check(lambda a: a.prod(1), torch.empty(2, 0))
    check(lambda a: a.sum(0), torch.tensor(3.5))
    check(lambda a: a.sum(-1, keepdim=True), torch.tensor(3.5))
    check(lambda a: a.mean(1), torch.empty(2, 0))  # nan


def test_prod_nansum():
    check(torch.prod, torch.rand(3, 4) + 0.5)
    check(lambda a: a.prod(1, keepdim=True), torch.rand(3, 4) + 0.5)
    check(lambda a: a.prod(-1), XI)
    check(lambda a: a.prod(0, dtype=torch.float64), XI)
    x = X.clone()
    x[0, 0, 0] = x[1, 2, 3] = float("nan")
    check(torch.nansum, x, tol="ulps")
    check(lambda a: a.nansum((0, 1), keepdim=True), x, tol="ulps")
    check(lambda a: torch.nansum(a, 1), XI)


def test_logsumexp():
    check(lambda a: a.logsumexp(1), X)
    check(lambda a: a.logsumexp((0, -1), keepdim=True), X)
    check(lambda a: a.logsumexp(1), XB, tol="ulps")
    check(lambda a: a.logsumexp(1), XI)  # ints -> float
    x = torch.tensor([[-math.inf, -math.inf], [math.inf, 1.0], [0.0, -math.inf]])
    check(lambda a: a.logsumexp(1), x)


# ---------------------------------------------------------------- max / min / arg
@pytest.mark.parametrize("x", [X, XI, XB], ids=["f32", "i64", "bf16"])
def test_extremes(x):
    check(torch.amax, x)
    check(lambda a: a.amax((0, -1)), x)
    check(lambda a: a.amin(1, keepdim=True), x)
    check(torch.max, x)
    check(torch.min, x)
    check(lambda a: a.max(1), x)
    check(lambda a: a.min(-1, keepdim=True), x)
    check(torch.argmax, x)
    check(lambda a: a.argmin(0), x)
    check(lambda a: a.argmax(-1, keepdim=True), x)
    check(lambda a: torch.argmax(a, keepdim=True), x)
    check(torch.aminmax, x)
    check(lambda a: torch.aminmax(a, dim=1, keepdim=True), x)


def test_extremes_ties_and_nan():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [1.0, math.nan, 5.0, math.nan]])
    check(lambda a: a.max(1), x)
    check(lambda a: a.min(1), x)
    check(lambda a: a.argmax(1), x)  # first occurrence; NaN wins
    check(lambda a: a.argmin(1), x)
    check(lambda a: a.amax(1), x)
    check(lambda a: a.amin(0), x)
    check(torch.max, x)
    check(lambda a: torch.aminmax(a, dim=1), x)
    check(lambda a: a.max(0), torch.randint(0, 2, (5, 3)).bool())
    check(lambda a: a.t().max(1), X[0])  # non-contiguous
    check(lambda a: a.max(0), torch.tensor(2.0))
    check(lambda a: a.argmax(), torch.tensor(2.0))


# ---------------------------------------------------------------- var / std / norms
@pytest.mark.parametrize("correction", [None, 0, 1, 2])
def test_var_std(correction):
    kw = {} if correction is None else {"correction": correction}
    check(lambda a: torch.var(a, **kw), X, tol="ulps")
    check(lambda a: torch.std(a, dim=1, **kw), X, tol="ulps")
    check(lambda a: torch.var(a, dim=(0, -1), keepdim=True, **kw), X, tol="ulps")
    check(lambda a: torch.var_mean(a, dim=1, **kw), X, tol="ulps")
    check(lambda a: torch.std_mean(a, dim=(0, 2), keepdim=True, **kw), X, tol="ulps")


def test_var_edge_cases():
    check(lambda a: a.var(1, unbiased=False), X)
    check(lambda a: a.var(1), torch.randn(3, 1))  # N <= correction: nan/inf like torch
    check(lambda a: a.std(0), XB, tol="ulps")
    check(lambda a: a.t().var(0), X[0], tol="ulps")
    check(lambda a: torch.var_mean(a), X, tol="ulps")


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, math.inf, -math.inf])
def test_vector_norm(ord):
    check(lambda a: torch.linalg.vector_norm(a, ord), X, tol="ulps")
    check(lambda a: torch.linalg.vector_norm(a, ord, dim=(0, 2), keepdim=True), X, tol="ulps")
    check(lambda a: torch.linalg.vector_norm(a, ord, dim=-1), XB, tol="ulps")


def test_norm():
    check(lambda a: a.norm(), X, tol="ulps")
    check(lambda a: torch.norm(a, dim=1), X, tol="ulps")
    check(lambda a: torch.norm(a, p=1, dim=(0, 1), keepdim=True), X, tol="ulps")
    check(lambda a: torch.linalg.vector_norm(a, dtype=torch.float64), X)
    check(lambda a: torch.linalg.vector_norm(a), torch.empty(0, 3))
    check(lambda a: a.t().norm(dim=0), X[0], tol="ulps")


# ---------------------------------------------------------------- all / any / count_nonzero
def test_all_any_count():
    b = torch.rand(4, 5) > 0.3
    f = torch.tensor([[0.0, 1.0, math.nan], [2.0, 3.0, 4.0]])
    for x in (b, f, XI):
        check(torch.all, x)
        check(torch.any, x)
        check(lambda a: a.all(1), x)
        check(lambda a: a.any(0, keepdim=True), x)
        check(lambda a: torch.all(a, dim=(0, 1)), x)
        check(lambda a: torch.any(a, dim=(-1,), keepdim=True), x)
        check(torch.count_nonzero, x)
        check(lambda a: torch.count_nonzero(a, dim=1), x)
        check(lambda a: torch.count_nonzero(a, dim=(0, -1)), x)
    check(lambda a: a.all(), torch.randint(0, 3, (5,), dtype=torch.uint8))  # uint8 result
    check(torch.all, torch.empty(0, 2))
    check(lambda a: a.any(1), torch.empty(2, 0))
    check(lambda a: a.t().any(1), b)


# ---------------------------------------------------------------- scans
@pytest.mark.parametrize("x", [X, XI, XB], ids=["f32", "i64", "bf16"])
@pytest.mark.parametrize("dim", [0, -1])
def test_cumsum_cumprod(x, dim):
    check(lambda a: a.cumsum(dim), x, tol="ulps")
    small = x if x.dtype != torch.int64 else x.clamp(-2, 2)
    check(lambda a: a.cumprod(dim), small, tol="ulps")


def test_cumsum_dtypes_and_edges():
    check(lambda a: a.cumsum(0), XI.int())  # int32 -> int64
    check(lambda a: a.cumsum(1), torch.rand(3, 4) > 0.5)
    check(lambda a: a.cumsum(1, dtype=torch.float64), X)
    check(lambda a: a.cumsum(0), torch.tensor(2.0))
    check(lambda a: a.cumsum(1), torch.empty(3, 0))
    check(lambda a: a.t().cumsum(1), X[0], tol="ulps")


@pytest.mark.parametrize("op", [torch.cummax, slow(torch.cummin)])  # cummin: cummax's twin
def test_cummax_cummin(op):
    check(lambda a: op(a, 1), X)
    check(lambda a: op(a, -1), XI)  # many ties: later index wins
    check(lambda a: op(a, 0), XB)
    nan = torch.tensor([1.0, 3.0, 3.0, math.nan, 2.0, math.nan, 0.0])
    check(lambda a: op(a, 0), nan)
    check(lambda a: op(a, 0), torch.tensor(1.5))
    check(lambda a: op(a.t(), 0), X[0])
    check(lambda a: op(a, 1), torch.empty(2, 0))


def test_logcumsumexp():
    check(lambda a: a.logcumsumexp(1), X, tol="ulps")
    check(lambda a: a.logcumsumexp(0), XB, tol="ulps")
    check(lambda a: a.logcumsumexp(0), torch.tensor([-math.inf, -math.inf, 1.0, math.inf, 2.0]))


# ---------------------------------------------------------------- sort / topk / kthvalue
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("x", [X, XI, XB, torch.rand(5, 7) > 0.5], ids=["f32", "i64", "bf16", "bool"])
def test_sort_stable(x, descending):
    check(lambda a: torch.sort(a, dim=-1, descending=descending, stable=True), x)
    check(lambda a: torch.sort(a, dim=0, descending=descending, stable=True), x)
    check(lambda a: torch.argsort(a, dim=1, descending=descending, stable=True), x)


def test_sort_nan_and_default():
    x = torch.tensor([[2.0, math.nan, 1.0, 2.0, math.nan, -math.inf], [0.0, 0.0, -0.0, 1.0, 1.0, 0.0]])
    check(lambda a: torch.sort(a, stable=True), x)
    check(lambda a: torch.sort(a, descending=True, stable=True), x)
    distinct = torch.randperm(30).float().reshape(5, 6)
    check(lambda a: a.sort(), distinct)
    check(lambda a: a.sort(0, descending=True), distinct)
    check(lambda a: a.t().sort(), distinct)
    check(lambda a: a.sort(), torch.tensor(3.0))
    check(lambda a: a.sort(1), torch.empty(2, 0))


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = torch.randperm(60).float().reshape(6, 10) / 7  # distinct values: tie order is unspecified
    check(lambda a: a.topk(3, largest=largest), x)
    check(lambda a: a.topk(2, dim=0, largest=largest), x)
    check(lambda a: a.t().topk(4, largest=largest), x)
    check(lambda a: a.topk(3, largest=largest), torch.randperm(40).reshape(4, 10))
    check(lambda a: a.topk(0, largest=largest), x)
    nan = torch.tensor([1.0, math.nan, 3.0, -2.0])
    check(lambda a: a.topk(2, largest=largest), nan)
    # sorted=False: any order is allowed; the set of values must match
    values, _ = torch.randn(50).to(TPU).topk(5, sorted=False)
    assert values.device.type == "tpu" and values.shape == (5,)


def test_kthvalue_median():
    x = torch.randperm(42).float().reshape(6, 7)
    check(lambda a: a.kthvalue(3, 1), x)
    check(lambda a: a.kthvalue(1, 0, keepdim=True), x)
    check(lambda a: a.t().kthvalue(2), x)
    check(lambda a: a.kthvalue(2), torch.randperm(20).reshape(4, 5))
    check(torch.median, x)
    check(torch.median, x[:, :6])  # even count -> lower median
    check(lambda a: a.median(1), x)
    check(lambda a: a.median(0, keepdim=True), x[:, :6])
    check(lambda a: a.median(-1), torch.randperm(20).reshape(4, 5))
    check(lambda a: a.median(0), XB[:, 0, 0])
    check(torch.median, torch.empty(0))


def test_median_nan():
    x = torch.tensor([[3.0, math.nan, 1.0, math.nan], [1.0, 4.0, 2.0, 3.0], [math.nan, 1.0, math.nan, math.nan], [5.0, math.nan, 2.0, 0.0]])
    check(lambda a: a.median(1), x)
    check(lambda a: a.nanmedian(1), x)
    check(torch.median, x)
    check(torch.nanmedian, x)
    check(lambda a: a.nanmedian(0), torch.randperm(20).float().reshape(4, 5))
    # an all-NaN row: NaN value (CPU's index there is an nth_element artifact, not specified)
    assert_same(torch.full((2, 5), math.nan).to(TPU).nanmedian(1).values, torch.full((2,), math.nan))


def test_mode():
    x = torch.tensor([[1, 2, 2, 1, 3, 3], [5, 5, 4, 4, 4, 5], [7, 1, 1, 7, 7, 1], [0, 1, 2, 3, 4, 5]])
    check(lambda a: a.mode(1), x)
    check(lambda a: a.mode(0, keepdim=True), x)
    check(lambda a: a.float().mode(-1), x)
    check(lambda a: a.t().mode(0), x)
    # longer rows: CPU's index among repeats is an artifact of its unstable sort; check that
    # values match and each index points at an occurrence of the mode
    x = torch.randint(0, 4, (3, 20))
    values, indices = x.to(TPU).mode()
    assert_same(values, x.mode().values)
    assert torch.equal(x.gather(1, indices.cpu()[:, None])[:, 0], values.cpu())


def test_out_and_inplace_variants():
    out = torch.empty(0).to(TPU)
    torch.sum(X.to(TPU), 1, out=out)
    assert_same(out, X.sum(1))
    values, indices = torch.empty(0).to(TPU), torch.empty(0, dtype=torch.long).to(TPU)
    torch.max(X.to(TPU), 1, out=(values, indices))
    assert_same((values, indices), X.max(1))
    y = to_tpu(X.clone())
    y.cumsum_(1)
    assert_same(y, X.cumsum(1), tol="ulps")


def test_autograd_reductions():
    for fn in (lambda a: a.sum(1).pow(2).sum(), lambda a: a.amax(1).sum(), lambda a: a.var(1).sum(),
               lambda a: a.logsumexp(1).sum(), lambda a: a.norm(), lambda a: a.cumsum(1).sum(),
               lambda a: a.sort(1)[0][:, 0].sum(), lambda a: a.max(1)[0].sum()):
        x = X.clone().requires_grad_()
        xt = to_tpu(x)
        fn(x).backward()
        fn(xt).backward()
        assert_same(xt.grad, x.grad, tol="ulps")
