"""Wrong results the all-samples OpInfo sweep and the hypothesis pass found (issue 17), vs CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import TPU, both, check, rand

pytestmark = pytest.mark.usefixtures("no_fallback")
g = torch.Generator().manual_seed(0)
BF16 = torch.bfloat16


def _ints(*shape):
    return torch.randint(-9, 10, shape, generator=g)


def test_integer_addmm_family_truncates_alpha_beta():
    # CPU casts alpha/beta to the integer type: 0.6 -> 0, 0.2 -> 0
    both(lambda b, x, v: torch.addmv(b, x, v, beta=0.2, alpha=0.6), _ints(5), _ints(5, 10), _ints(10))
    both(lambda b, x, y: torch.addbmm(b, x, y, beta=0.6, alpha=1.2), _ints(5, 10), _ints(3, 5, 5), _ints(3, 5, 10))
    both(lambda b, x, y: torch.baddbmm(b, x, y, beta=1.7, alpha=0.6), _ints(3, 5, 10), _ints(3, 5, 5),
         _ints(3, 5, 10))


def test_bfloat16_addbmm_addr_baddbmm_round_like_cpu():
    x, y = torch.randn(6, 5, 5, generator=g).to(BF16) * 4, torch.randn(6, 5, 10, generator=g).to(BF16) * 4
    bias = torch.randn(5, 10, generator=g).to(BF16)
    exact = dict(rtol=0, atol=0)
    both(torch.addbmm, bias, x, y, tol=exact)
    both(lambda b, u, v: torch.addr(b, u, v, beta=0.6, alpha=0.2), bias, torch.randn(5, generator=g).to(BF16),
         torch.randn(10, generator=g).to(BF16), tol=exact)
    both(torch.baddbmm, torch.randn(6, 5, 10, generator=g).to(BF16), x, y, tol=exact)


def test_bfloat16_trunc_division_rounds_the_quotient_first():
    a = torch.tensor([-3.890625, 8.375, 5.125, 2.984375], dtype=BF16)
    b = torch.tensor([-0.216796875, 0.55859375, 5.125, -0.06103515625], dtype=BF16)
    both(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b, tol="exact")


@pytest.mark.parametrize("dtype", [torch.int64, BF16, torch.float32])
def test_range_factories(dtype):
    for args in [(0, 1, 50), (4.3, -3, 50), (2.1, -2.9, 7)]:
        _factory_check(torch.linspace, args, dtype)
    for args in [(0, 1.2, 2), (4.3, -3, 2), (4.3, -3, 1)]:
        _factory_check(torch.logspace, args, dtype)
    if dtype == torch.int64:
        _factory_check(torch.arange, (2.1, -2.9, -1.0), dtype)


def _factory_check(fn, args, dtype):
    expected = fn(*args, dtype=dtype)
    actual = fn(*args, dtype=dtype, device=TPU)
    assert actual.device.type == "tpu"
    rtol = 1e-6 if dtype == torch.float32 else 0  # float32: CPU steps in float32, tpu in float64 (1 ulp)
    torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=rtol)


def test_masked_scatter_broadcasts_self_to_the_mask():
    mask = torch.rand(5, 5, generator=g) > 0.5
    both(torch.masked_scatter, torch.randn(5, generator=g), mask, torch.randn(5, 5, generator=g))


@pytest.mark.parametrize("shape,dim,index", [((0, 0), 0, [0]), ((3, 0), 0, [5]), ((3, 0), 1, [0]), ((0,), 0, [5]),
                                             ((2, 0, 3), 0, [1]), ((3, 0), 0, [-1])])
def test_index_select_on_empty_self(shape, dim, index):
    # found by the hypothesis pass: CPU's own checks and words for an empty self
    both(lambda t, i: torch.index_select(t, dim, i), torch.zeros(shape), torch.tensor(index), message=True)


def test_getitem_with_an_empty_result_checks_no_index():
    # found by the hypothesis pass: CPU checks indices per result element, so none for an empty result
    both(lambda t, i: t[:, i], torch.zeros(0, 1), torch.tensor([1]))
    both(lambda t, i: t[i], torch.zeros(2, 0), torch.tensor([5]))
    both(lambda t, i: t[:, i], torch.zeros(3, 1), torch.tensor([1]))  # IndexError (CPU words the dim oddly)


def test_group_norm_on_an_empty_batch():
    both(lambda x, w, b: torch.nn.functional.group_norm(x, 1, w, b), torch.zeros(0, 2), torch.ones(2), torch.zeros(2))
    both(lambda x: torch.nn.functional.group_norm(x, 2), torch.zeros(0, 4, 3))


def test_integer_avg_pool():
    x = torch.randint(0, 9, (2, 3, 4, 9), generator=g)
    both(lambda t: torch.nn.functional.avg_pool1d(t[0], 3), x)
    both(lambda t: torch.nn.functional.avg_pool2d(t, (2, 2), (2, 2), (1,), True, True), x)
    both(lambda t: torch.nn.functional.avg_pool3d(t.unsqueeze(0), (1, 2, 2)), x)


def test_index_put_with_an_empty_selection_checks_no_index():
    def put(t, i):
        t = t.clone()
        t[:, i] = torch.ones((), device=t.device)
        return t

    both(put, torch.zeros(0, 1), torch.tensor([1]))
    both(put, torch.zeros(3, 1), torch.tensor([1]))  # a non-empty selection: IndexError on both


def test_indexing_into_a_size_0_dim_is_checked():
    both(lambda t, i: t[i], torch.zeros(0, 0), torch.tensor([0]))
    both(lambda t, i: t[:, i], torch.zeros(2, 0), torch.tensor([0]))


def test_bfloat16_convolution_adds_the_bias_before_rounding():
    # the sweep's sample: grouped conv2d with bias; rounding the conv and then adding the bias in
    # bfloat16 was one ulp off CPU (and off the float64 result) at 169.7 -> 169 instead of 170
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "nn.functional.conv2d")
    sample = next(s for s in op.sample_inputs("cpu", BF16) if s.kwargs.get("groups") == 4 and s.args[1] is not None)
    both(lambda x, w, b: torch.nn.functional.conv2d(x, w, b, **sample.kwargs), sample.input, *sample.args[:2],
         tol="exact")
    x, w, b = torch.randn(2, 4, 9, generator=g).to(BF16) * 8, torch.randn(4, 3, 3, generator=g).to(BF16), \
        torch.randn(3, generator=g).to(BF16) * 8
    # conv_transpose: CPU's bfloat16 kernel rounds partial sums (a third of these elements are off the
    # correctly rounded value); tpu's is the float64 result rounded once, so closer than CPU's
    from tpu_interactive.testing.compare import at_least_as_accurate

    def f(x, w, b):
        return torch.nn.functional.conv_transpose1d(x, w, b, stride=2)

    exact, cpu, tpu = f(x.double(), w.double(), b.double()), f(x, w, b), f(x.to(TPU), w.to(TPU), b.to(TPU)).cpu()
    assert torch.equal(tpu, exact.to(BF16)) and at_least_as_accurate(tpu, cpu, exact)


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_on_an_empty_batch(n):
    f = getattr(torch.nn.functional, f"fractional_max_pool{n}d")
    x = torch.randn((0, 3) + (5,) * n)
    out, idx = both(lambda t: f(t, 2, output_size=(3,) * n, return_indices=True), x)
    assert out.shape == (0, 3) + (3,) * n and idx.dtype == torch.int64
    xt = x.to(TPU).requires_grad_()
    f(xt, 2, output_size=(3,) * n).sum().backward()
    assert xt.grad.shape == x.shape


def test_bfloat16_norm_statistics_have_cudas_float32_dtype():
    # the saved mean/rstd of a bfloat16 layer/batch norm are float32 on CUDA and in torch's meta
    # kernels (bfloat16 on CPU); values equal CPU's after rounding
    x = torch.randn(4, 3, 5, generator=g).to(BF16)
    w, b = torch.randn(5, generator=g).to(BF16), torch.randn(5, generator=g).to(BF16)
    meta = torch.ops.aten.native_layer_norm(x.to("meta"), [5], w.to("meta"), b.to("meta"), 1e-5)
    cpu = torch.ops.aten.native_layer_norm(x, [5], w, b, 1e-5)
    tpu = torch.ops.aten.native_layer_norm(x.to(TPU), [5], w.to(TPU), b.to(TPU), 1e-5)
    assert [t.dtype for t in tpu] == [t.dtype for t in meta] == [BF16, torch.float32, torch.float32]
    for got, want in zip(tpu, cpu):
        torch.testing.assert_close(got.cpu().to(want.dtype), want, rtol=1.6e-2, atol=1e-2)


def test_accuracy_rule_passes_only_results_at_least_as_close_to_float64_as_cpu():
    from tpu_interactive.testing.compare import at_least_as_accurate

    # near zero (a cancelling sum) the bfloat16 tolerance is its atol, 1e-2
    exact = torch.tensor([0.05, -141.42138671875, 1.0], dtype=torch.float64)
    cpu = exact.to(BF16)
    assert at_least_as_accurate(cpu.clone(), cpu, exact)
    assert not at_least_as_accurate(torch.tensor([0.0703125, -141.0, 1.0], dtype=BF16), cpu, exact)  # 0.02 off
    # CPU 0.044 off, tpu 0.028: tpu is the more accurate one
    assert at_least_as_accurate(torch.tensor([0.078125, -141.0, 1.0], dtype=BF16),
                                torch.tensor([0.09375, -141.0, 1.0], dtype=BF16), exact)
    assert not at_least_as_accurate(torch.tensor([0.05, -141.0, float("nan")], dtype=BF16), cpu, exact)


# ---------------------------------------------------------------- fixed failures from the OpInfo sweep
def test_unfold_empty_batch_and_unique_consecutive_scalar():
    check(lambda a: F.unfold(a, 2), torch.zeros(0, 1, 5, 5))
    check(lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), torch.tensor(3.0))
    check(lambda a: torch.unique_consecutive(a, return_counts=True, dim=0), rand(1, 3))


def test_two_dim_multinomial_checks_each_row():
    # the all-samples sweep: a valid 2-D distribution was refused ("sum of probabilities <= 0")
    probs = torch.rand(3, 10, generator=g) + 0.1
    probs[:, 4] = 0  # never drawn
    for replacement in (True, False):
        drawn = torch.multinomial(probs.to(TPU), 5, replacement).cpu()
        assert drawn.shape == (3, 5) and drawn.dtype == torch.int64
        assert ((drawn >= 0) & (drawn < 10) & (drawn != 4)).all()
        if not replacement:
            assert all(len(set(row.tolist())) == 5 for row in drawn)
    probs[1] = 0  # one row without mass: CPU's error
    both(lambda p: torch.multinomial(p, 3, True), probs, message=True)


def test_empty_searchsorted_and_nonzero_static_fill():
    for seq, values in [((0, 0), (0, 0)), ((0, 3), (0, 2)), ((2, 0), (2, 3))]:
        both(torch.searchsorted, torch.zeros(seq), torch.zeros(values))
    both(lambda t: torch.nonzero_static(t, size=1), torch.zeros(5, 0, 5))
    both(lambda t: torch.nonzero_static(t, size=2, fill_value=-5), torch.zeros(2, 0))


# ---------------------------------------------------------------- the shape-mutation sweep
# OpInfo samples with one tensor argument's shape changed (a dim added, dropped, grown or shrunk), run
# on CPU and on tpu: where CPU refused, tpu computed something, because torch's Python meta kernels
# (which dispatch runs) lack checks its C++ ones make. Each case must now raise CPU's error.
def _r(*shape):
    return torch.randn(shape, generator=g)


def _ix(*values):
    return torch.tensor(values)


REFUSED = {
    "addmm: a bias of more dims": (torch.addmm, _r(1, 2, 3), _r(2, 4), _r(4, 3)),
    "addmm: bias rows": (torch.addmm, _r(2, 3), _r(1, 4), _r(4, 3)),
    "addmm: bfloat16": (torch.addmm, _r(1, 2, 3).to(BF16), _r(2, 4).to(BF16), _r(4, 3).to(BF16)),
    "linear: a 3-d bias": (F.linear, _r(2, 4), _r(3, 4), _r(1, 2, 3)),
    "_addmm_activation": (torch.ops.aten._addmm_activation, _r(2, 3), _r(1, 4), _r(4, 3)),
    "addmv: a 2-d self": (torch.addmv, _r(1, 5), _r(5, 4), _r(4)),
    "conv1d: a 2-d bias": (F.conv1d, _r(1, 3, 4), _r(3, 3, 3), _r(1, 3)),
    "conv2d: bias size": (lambda x, w, b: F.conv2d(x, w, b, groups=2), _r(2, 4, 8, 8), _r(2, 2, 3, 3), _r(3)),
    "conv_transpose2d: a 2-d bias": (lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2), _r(2, 2, 4, 4),
                                     _r(2, 2, 4, 5), _r(1, 4)),
    "sort: dim": (lambda t: torch.sort(t, -3), _r(5, 5)),
    "argsort: dim": (lambda t: torch.argsort(t, 2), _r(5, 5)),
    "softmax: dim": (lambda t: torch.softmax(t, 1), _r(5)),
    "softmin: dim": (lambda t: F.softmin(t, -2), _r(5)),
    "cummax: dim of a 0-dim": (lambda t: torch.cummax(t, 1), _r()),
    "cummin: dim": (lambda t: torch.cummin(t, -3), _r(2, 2)),
    "_softmax_backward_data": (lambda a, b: torch.ops.aten._softmax_backward_data(a, b, 0, torch.float32),
                               _r(1, 5), _r(5)),
    "diagonal_scatter": (torch.diagonal_scatter, _r(1, 10, 10), _r(10)),
    "select_scatter: src": (lambda a, b: torch.select_scatter(a, b, 0, 0), _r(1, 5, 5, 5), _r(5, 5)),
    "select_scatter: index": (lambda a, b: torch.select_scatter(a, b, -1, 2), _r(5, 5, 5, 1), _r(5, 5, 5)),
    "select_scatter: negative index": (lambda a, b: torch.select_scatter(a, b, 1, -6), _r(5, 5), _r(5)),
    "slice_scatter": (torch.slice_scatter, _r(1, 4, 4), _r(4, 4)),
    "index_select: a 2-d index": (lambda t, i: t.index_select(0, i), _r(3, 4), _ix([0, 1])),
    "index_select: 0-dim self": (lambda t, i: t.index_select(0, i), _r(), _ix([0])),
    "index_reduce: a 2-d index": (lambda t, i, s: t.index_reduce(0, i, s, "amax"), _r(3), _ix([0]), _r(1)),
    "index_reduce: int32 index": (lambda t, i, s: t.index_reduce(0, i.int(), s, "prod"), _r(3), _ix([0]), _r(1)),
    "index_reduce: 0-dim source": (lambda t, i, s: t.index_reduce(0, i, s, "amax"), _r(), _ix(0, 0), _r()),
    "index_reduce: indices": (lambda t, i, s: t.index_reduce(0, i, s, "mean"), _r(3, 4), _ix(0, 1), _r(3, 4)),
    "index_reduce: dim": (lambda t, i, s: t.index_reduce(1, i, s, "amin"), _r(3, 4), _ix(0, 1), _r(2)),
    "put: source size": (lambda t, i, s: t.put(i, s), _r(3, 3), _ix(0, 1, 2), _r()),
    # a boolean mask's hit count is data: checked once known (the meta kernel and a replay on zeros cannot)
    "index_put: a mask that selects nothing": (lambda t, m, v: t.index_put((m,), v), _r(4), _ix(0, 0, 0, 0).bool(),
                                               _r(3)),
    "index_put_: a mask's hit count": (lambda t, m, v: t.clone().index_put_((m,), v), _r(4), _ix(1, 0, 1, 0).bool(),
                                       _r(3)),
}


@pytest.mark.parametrize("case", REFUSED)
def test_shape_mutation_sweep_refusals(case):
    fn, *args = REFUSED[case]
    with pytest.raises((RuntimeError, IndexError)):
        fn(*args)  # CPU refuses: the case cannot pass by both computing
    both(fn, *args, message=True)


ACCEPTED = {  # their neighbours that CPU computes: the new checks refuse nothing more
    "addmm: broadcast biases": (lambda b, c, x, y: torch.addmm(b, x, y) + torch.addmm(c, x, y), _r(3), _r(2, 1),
                                _r(2, 4), _r(4, 3)),
    "addmv: one-element self": (torch.addmv, _r(1), _r(5, 4), _r(4)),
    "conv_transpose2d: bias": (lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2), _r(2, 2, 4, 4), _r(2, 2, 4, 5),
                               _r(4)),
    "softmax: dims of a 0-dim": (lambda t: torch.softmax(t, -1) + torch.softmax(t, 0), _r()),
    "diagonal_scatter: offsets": (lambda a, b, c: torch.diagonal_scatter(a, b, 1, 1, 2) + torch.diagonal_scatter(
        a, c, -2, 2, 1), _r(3, 10, 10), _r(3, 9), _r(3, 8)),
    "select_scatter: negative index": (lambda a, b: torch.select_scatter(a, b, 1, -5), _r(5, 5), _r(5)),
    "slice_scatter: clamped ends": (lambda a, b, c: torch.slice_scatter(a, b, 1, -5, 100, 3) + torch.slice_scatter(
        a, c, 0, 9, 12), _r(8, 8), _r(8, 2), _r(0, 8)),
    "index_reduce: 0-dim": (lambda t, i, s: t.index_reduce(0, i, s, "amax"), _r(), _ix(0), _r()),
    "put: a 2-d index": (lambda t, i, s: t.put(i, s), _r(3, 3), _ix([0, 1, 2]), _r(3)),
    "index_put: one value per hit, or one for all": (
        lambda t, m, v, w, n: t.index_put((m,), v) + t.index_put((m,), w) + t.index_put((~m | m,), n), _r(4),
        _ix(1, 0, 1, 0).bool(), _r(2), _r(1, 2), _r(4)),
    # an empty dim list is every dim (torch's meta kernel kept the shape: a [1] input gave a [1] result)
    "nansum: no dims": (lambda t: torch.nansum(t, dim=()), _r(1)),
    "nanmean: no dims": (lambda t: torch.nanmean(t, dim=[], keepdim=True), _r(2, 3)),
    "multilabel_margin_loss: 0-dim and 1-element": (
        lambda x, t, y, u: F.multilabel_margin_loss(x, t) + F.multilabel_margin_loss(y, u), _r(1), torch.tensor(0),
        _r(), _ix(0)),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_shape_mutation_sweep_neighbours_compute(case):
    fn, *args = ACCEPTED[case]
    both(fn, *args)


def test_batch_norm_takes_a_1_by_c_statistic_as_its_c_elements():
    # CPU refuses a [1, C] running stat (its TensorAccessor, not a check: F.batch_norm checks C elements);
    # tpu takes the C elements: CPU's values for the 1-d ones, the stats updated in their own shape
    x, weight = _r(5, 5, 5), _r(1, 5)
    mean, var = _r(1, 5), torch.rand(1, 5, generator=g) + 0.5
    flat = [t.reshape(5).clone() for t in (mean, var, weight)]
    expected = F.batch_norm(x, flat[0], flat[1], flat[2], training=True, momentum=0.3)
    on_tpu = [t.to(TPU) for t in (mean, var, weight)]
    actual = F.batch_norm(x.to(TPU), on_tpu[0], on_tpu[1], on_tpu[2], training=True, momentum=0.3)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
    for stat, cpu_stat in zip(on_tpu[:2], flat[:2]):
        assert stat.shape == (1, 5)
        torch.testing.assert_close(stat.cpu().reshape(5), cpu_stat, rtol=1e-5, atol=1e-6)
