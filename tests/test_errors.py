"""Bad input gets PyTorch's error: the cases issue 17 found silent or leaking Python exceptions, each
compared against CPU's exception type and message; the OpInfo error_inputs / out= harness; the
safety net that turns a lowering's Python-internal exception into PyTorch's error."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import TPU, both
from tpu_interactive.testing import conformance as C
from tpu_interactive.testing import conformance_errors as E
from tpu_interactive.backend.registry import LOWERINGS

x34 = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
LONG = torch.long

# name -> (fn, CPU arguments); CPU raises for each, tpu must raise the same type with CPU's message
CASES = {
    "exponential_lambda_0": (lambda t: t.exponential_(0), (torch.zeros(3),)),
    "exponential_lambda_neg": (lambda t: t.exponential_(-1.5), (torch.zeros(3),)),
    "uniform_from_gt_to": (lambda t: t.uniform_(3, -1), (torch.zeros(3),)),
    "masked_scatter_byte_mask": (lambda t, m, s: t.masked_scatter(m, s),
                                 (x34, torch.ones(3, 4, dtype=torch.uint8), torch.zeros(12))),
    "as_strided_scatter_past_end": (lambda t, s: torch.as_strided_scatter(t, s, (2, 2), (200, 200)),
                                    (torch.zeros(4, 4), torch.ones(2, 2))),
    "conv3d_negative_padding": (lambda x, w: F.conv3d(x, w, padding=-1),
                                (torch.randn(1, 1, 4, 4, 4), torch.randn(1, 1, 2, 2, 2))),
    "conv1d_negative_dilation": (lambda x, w: F.conv1d(x, w, dilation=-1),
                                 (torch.randn(1, 1, 8), torch.randn(1, 1, 2))),
    "conv2d_negative_dilation": (lambda x, w: F.conv2d(x, w, dilation=-1),
                                 (torch.randn(1, 1, 6, 6), torch.randn(1, 1, 2, 2))),
    "multi_margin_float_target": (F.multi_margin_loss, (torch.randn(5, 4), torch.zeros(5))),
    "multi_margin_weight_size": (lambda x, t, w: F.multi_margin_loss(x, t, weight=w),
                                 (torch.randn(5, 4), torch.zeros(5, dtype=LONG), torch.ones(5))),
    "multi_margin_empty_classes": (F.multi_margin_loss, (torch.randn(5, 0), torch.zeros(5, dtype=LONG))),
    "multi_margin_target_shape": (F.multi_margin_loss, (torch.randn(5, 4), torch.zeros(5, 4, dtype=LONG))),
    "multilabel_margin_empty": (F.multilabel_margin_loss, (torch.randn(5, 0), torch.zeros(5, 0, dtype=LONG))),
    "multilabel_margin_target_size": (F.multilabel_margin_loss, (torch.randn(5, 4), torch.zeros(4, dtype=LONG))),
    "aminmax_out_dtype": (lambda x, a, b: torch.aminmax(x, dim=0, out=(a, b)),
                          (x34, torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.float64))),
    "amax_out_dtype": (lambda x, o: torch.amax(x, 0, out=o), (x34, torch.empty(4, dtype=torch.int32))),
    "complex_out_dtype": (lambda a, b, o: torch.complex(a, b, out=o),
                          (torch.zeros(3), torch.zeros(3), torch.empty(3, dtype=torch.complex128))),
    "gather_out_dtype": (lambda x, i, o: torch.gather(x, 1, i, out=o),
                         (x34, torch.zeros(3, 2, dtype=LONG), torch.empty(3, 2, dtype=torch.float64))),
    "cat_out_long": (lambda a, b, o: torch.cat([a, b], out=o), (x34, x34, torch.empty(6, 4, dtype=LONG))),
    "mm_out_long": (lambda a, b, o: torch.mm(a, b, out=o), (x34, x34.t(), torch.empty(3, 3, dtype=LONG))),
    "index_add_source_shape": (lambda x, i, s: x.index_add(0, i, s),
                               (torch.zeros(3, 2), torch.tensor([0, 1]), torch.ones(2))),
    "multinomial_int_input": (lambda p: torch.multinomial(p, 1), (torch.ones(2, 3, dtype=LONG),)),
    "multinomial_no_samples": (lambda p: torch.multinomial(p, 0), (torch.ones(3),)),
    "multinomial_negative": (lambda p: torch.multinomial(p, 2), (torch.tensor([1.0, -1.0, 1.0]),)),
    "multinomial_negative_replacement": (lambda p: torch.multinomial(p, 2, True), (torch.tensor([1.0, -1.0, 1.0]),)),
    "multinomial_inf_replacement": (lambda p: torch.multinomial(p, 2, True),
                                    (torch.tensor([1.0, float("inf"), 1.0]),)),
    "multinomial_zero_sum": (lambda p: torch.multinomial(p, 2, True), (torch.zeros(2, 3),)),
    "bucketize_2d_boundaries": (torch.bucketize, (torch.randn(5), torch.randn(2, 3))),
    "eye_negative_m": (lambda: torch.eye(3, -3, device=_DEVICE[0]), ()),
    "max_unpool2d_index_past_plane": (lambda y, i: F.max_unpool2d(y, i, 2),
                                      (torch.ones(1, 2, 2, 2), torch.tensor([[[[0, 1], [2, 3]], [[0, 16], [2, 3]]]]))),
    "max_unpool2d_negative_index": (lambda y, i: F.max_unpool2d(y, i, 2),
                                    (torch.ones(2, 2, 2), torch.tensor([[[0, -2], [2, 3]], [[0, 1], [2, 3]]]))),
    "max_unpool1d_index_past_plane": (lambda y, i: F.max_unpool1d(y, i, 2),
                                      (torch.ones(1, 2, 3), torch.tensor([[[0, 2, 6], [1, 2, 4]]]))),
    "max_unpool2d_int32_indices": (lambda y, i: F.max_unpool2d(y, i, 2),
                                   (torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, dtype=torch.int32))),
    "multilabel_margin_target_past_classes": (F.multilabel_margin_loss, (torch.randn(2, 3), torch.tensor([[0, 5, -1], [1, -1, 0]]))),
    "multilabel_margin_target_below_minus_1": (F.multilabel_margin_loss, (torch.randn(2, 3), torch.tensor([[0, -2, 1], [1, 0, 2]]))),
    "multilabel_margin_target_after_the_end": (F.multilabel_margin_loss, (torch.randn(3), torch.tensor([0, -1, 7]))),
    "bce_input_above_1": (F.binary_cross_entropy, (torch.tensor([0.5, 1.5]), torch.tensor([0.0, 1.0]))),
    "bce_input_nan": (F.binary_cross_entropy, (torch.tensor([0.5, float("nan")]), torch.tensor([0.0, 1.0]))),
    "bce_target_below_0_first": (F.binary_cross_entropy, (torch.tensor([0.5, 1.5]), torch.tensor([-1.0, 1.0]))),
    "bce_input_first_weighted": (lambda x, t, w: F.binary_cross_entropy(x, t, weight=w, reduction="sum"),
                                 (torch.tensor([-0.5, 0.5]), torch.tensor([0.0, 2.0]), torch.ones(2))),
    "bernoulli_p_tensor_above_1": (torch.bernoulli, (torch.tensor([0.5, 1.5]),)),
    "bernoulli_p_tensor_nan": (torch.bernoulli, (torch.tensor([0.5, float("nan")]),)),
    "bernoulli_inplace_p_tensor": (lambda t, p: t.bernoulli_(p), (torch.zeros(2), torch.tensor([0.5, -0.1]))),
    "bernoulli_inplace_p_2": (lambda t: t.bernoulli_(2), (torch.zeros(2),)),
    "normal_std_negative": (lambda t: t.normal_(0, -1), (torch.zeros(2),)),
    "searchsorted_sorter_out_of_range": (lambda s, v, o: torch.searchsorted(s, v, sorter=o),
                                         (torch.tensor([3.0, 1.0, 2.0]), torch.tensor([2.0]), torch.tensor([1, 2, 5]))),
    "embedding_bag_offsets_start_not_0": (lambda w, i, o: F.embedding_bag(i, w, o),
                                          (torch.randn(5, 3), torch.tensor([0, 1, 1]), torch.tensor([2, 0]))),
    "embedding_bag_offsets_past_the_end": (lambda w, i, o: F.embedding_bag(i, w, o, mode="max"),
                                           (torch.randn(5, 3), torch.tensor([0, 9, 1]), torch.tensor([0, 9]))),
    "floor_divide_int_by_0": (lambda a, b: a // b, (torch.tensor([1, 2]), torch.tensor([1, 0]))),
    "repeat_interleave_wrong_output_size": (lambda x, r: torch.repeat_interleave(x, r, output_size=5),
                                            (torch.arange(3.0), torch.tensor([1, 1, 2]))),
    "index_fill_negative_out_of_range": (lambda x, i: x.index_fill(0, i, 1.0), (torch.zeros(3), torch.tensor([-4]))),
    "histc_inf_in_data": (torch.histc, (torch.tensor([float("inf"), 1.0]),)),
    "histc_nan_bound": (lambda x: torch.histc(x, 10, float("nan"), 1.0), (torch.randn(4),)),
    "histc_max_below_min": (lambda x: torch.histc(x, 10, 5.0, 1.0), (torch.randn(4),)),
    "histc_negative_bins": (lambda x: torch.histc(x, -1), (torch.randn(4),)),
    "normal_std_tensor_nan": (lambda m, s: torch.normal(m, s), (torch.zeros(2), torch.tensor([1.0, float("nan")]))),
    "normal_std_nan": (lambda t: t.normal_(0, float("nan")), (torch.zeros(2),)),
    "cauchy_sigma_nan": (lambda t: t.cauchy_(0, float("nan")), (torch.zeros(2),)),
    "log_normal_std_negative": (lambda t: t.log_normal_(0, -1), (torch.zeros(2),)),
    "geometric_p_above_1": (lambda t: t.geometric_(1.5), (torch.zeros(2),)),
    "uniform_from_nan": (lambda t: t.uniform_(float("nan"), 1.0), (torch.zeros(2),)),
    "uniform_to_past_half": (lambda t: t.uniform_(-7e4, 0.0), (torch.zeros(2, dtype=torch.float16),)),
    "uniform_span_past_float": (lambda t: t.uniform_(-3e38, 3e38), (torch.zeros(2),)),
    "cholesky_ex_check_errors": (lambda a: torch.linalg.cholesky_ex(a, check_errors=True),
                                 (torch.tensor([[1.0, 2.0], [2.0, 1.0]]),)),
    "inv_ex_check_errors_batched": (lambda a: torch.linalg.inv_ex(a, check_errors=True),
                                    (torch.stack([torch.eye(2), torch.tensor([[1.0, 2.0], [2.0, 4.0]])]),)),
    "lu_factor_ex_check_errors": (lambda a: torch.linalg.lu_factor_ex(a, check_errors=True),
                                  (torch.tensor([[1.0, 2.0], [2.0, 4.0]]),)),
    "solve_ex_check_errors": (lambda a, b: torch.linalg.solve_ex(a, b, check_errors=True),
                              (torch.tensor([[1.0, 2.0], [2.0, 4.0]]), torch.ones(2))),
    "cholesky_inverse_singular": (torch.cholesky_inverse, (torch.stack([torch.eye(2), torch.zeros(2, 2)]),)),
    "svd_nan": (torch.linalg.svd, (torch.tensor([[float("nan"), 0.0], [0.0, 1.0]]),)),
    "svdvals_nan_batched": (torch.linalg.svdvals, (torch.stack([torch.eye(2), torch.full((2, 2), float("nan"))]),)),
    "multinomial_3d": (lambda p: torch.multinomial(p, 1), (torch.rand(2, 2, 2),)),
    "roll_empty_misaligned": (lambda t: torch.roll(t, (1, 2), (0,)), (torch.empty(0, 3),)),
    "roll_empty_no_shifts": (lambda t: torch.roll(t, (), ()), (torch.empty(0, 3),)),
}
_DEVICE = ["cpu"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_matches_cpu(name):
    fn, args = CASES[name]
    try:
        _DEVICE[0] = "cpu"
        with pytest.raises(Exception):  # noqa: PT011 - every case is an error on CPU: the test checks that premise
            fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        if name == "eye_negative_m":  # a factory: the device argument selects tpu
            with pytest.raises(RuntimeError, match="m must be greater or equal to 0, got -3"):
                _DEVICE[0] = "tpu"
                fn()
            return
        both(fn, *[a.clone() for a in args], message=True)
    finally:
        _DEVICE[0] = "cpu"


def test_roll_of_an_empty_tensor_checks_no_dim_as_cpu():
    """CPU and CUDA clone an empty tensor before wrapping any dim; torch's Python ref (the meta kernel)
    wraps them first and refused dims that CPU never reads."""
    for shifts, dims in ((1, 5), ((1, 2), (0, 7)), ((1,), ())):
        both(lambda t: torch.roll(t, shifts, dims), torch.empty(0, 3))
    both(lambda t: torch.roll(t, 1, 5), torch.empty(2, 3), message=True)  # with elements: CPU wraps it


def test_histc_of_data_with_a_nan_is_refused_as_on_cpu():
    # CPU prints the range its reduction found: x86's default NaN has its sign bit set ("-nan"), jax's not
    with pytest.raises(RuntimeError, match=r"torch.histc: range of \[-?nan, -?nan\] is not finite"):
        torch.histc(torch.tensor([float("nan"), 1.0], device=TPU))


@pytest.mark.parametrize("fn, a", [
    (lambda a: torch.linalg.cholesky_ex(a, check_errors=True)[0] * 2,
     torch.stack([torch.eye(2), torch.eye(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]])])),
    (lambda a: torch.linalg.lu_factor_ex(a, check_errors=True)[0] * 2, torch.tensor([[1.0, 2.0], [2.0, 4.0]])),
    (lambda a: torch.linalg.svdvals(a) * 2, torch.stack([torch.eye(2), torch.full((2, 2), float("nan"))])),
])
def test_lapack_info_checks_in_a_compiled_graph_raise_cpus_error(fn, a):
    """Traced into the graph (the check needs the info's values): CPU's type and words, batch element too."""
    with pytest.raises(RuntimeError) as cpu:
        fn(a)
    with pytest.raises(type(cpu.value)) as compiled:
        torch.compile(fn, backend="tpu")(a.to(TPU))
    assert str(compiled.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_python_scalar_cases_opinfo_calls_errors_work_as_on_cpu():
    """OpInfo's generic error_inputs claim clamp_min/clamp_max(t, 2) and 2 % t raise; CPU accepts them
    (the harness reports these as n/a); tpu must then give CPU's values."""
    t = torch.tensor((1, 2, 3))
    both(lambda x: torch.clamp_min(x, 2), t)
    both(lambda x: torch.clamp_max(x, 2), t)
    both(lambda x: x.__rmod__(2), t)


def test_out_aliasing_input_is_refused_like_cpu():
    def take_into_self(x, i):
        return torch.take(x, i, out=x.view(-1)[:2])

    def cat_into_view(a, z):
        return torch.cat([a, z], out=z[:2])

    both(take_into_self, x34.clone(), torch.tensor([0, 1]), message=True)
    y, z = torch.randn(4, 6), torch.zeros(4, 6)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        cat_into_view(y, z)
    zt = z.to(TPU)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        cat_into_view(y.to(TPU), zt)


@pytest.mark.parametrize("fn", [
    lambda x, o: torch.special.zeta(x, x, out=o),  # the CPU fallback
    lambda x, o: torch.mvlgamma(x + 2, 1, out=o),
    lambda x, o: torch.linalg.det(x, out=o),  # a decomposition
    lambda x, o: torch.add(x, x, out=o),  # a lowering's derived out= variant
])
def test_out_on_the_cpu_with_tpu_inputs_is_refused(fn):
    # as CUDA refuses a CPU out=; the fallback used to fill the CPU tensor silently
    x, out = torch.rand(4, 4).to(TPU), torch.empty(0)
    with pytest.raises(RuntimeError, match="Expected out tensor to have device tpu:0, but got cpu instead"):
        fn(x, out)
    assert out.shape == (0,)


def test_decomposed_out_dtype_misuse_gets_cpus_words():
    x, w, b = torch.randn(5, 5, 5), torch.ones(5), torch.zeros(5)

    def batch_norm_into_long(x, w, b, m, v):
        outs = tuple(torch.empty(0, dtype=LONG, device=x.device) for _ in range(3))
        return torch.ops.aten.native_batch_norm.out(x, w, b, m, v, True, 0.5, 0.6, out=outs[0], save_mean=outs[1],
                                                    save_invstd=outs[2])

    both(batch_norm_into_long, x, w, b, torch.zeros(5), torch.ones(5), message=True)


def test_too_many_dims_is_a_runtime_error():
    x = torch.zeros((1,) * 65)
    with pytest.raises(RuntimeError, match="only tensors with up to 64 dims are supported"):
        x.to(TPU)


# ---------------------------------------------------------------- the safety net for lowering bugs
@pytest.fixture
def broken_neg(monkeypatch):
    def bug(x):
        return {}["missing"]  # a KeyError: a Python-internal error, never PyTorch's

    monkeypatch.setattr(LOWERINGS["neg.default"], "fn", bug)


def test_python_error_in_lowering_becomes_runtime_error(broken_neg):
    with pytest.raises(RuntimeError, match=r"aten::neg.*KeyError") as raised:
        torch.neg(torch.ones(3, device=TPU))
    assert "inputs: self=Tensor[3, float32, tpu:0]" in str(raised.value)
    assert not isinstance(raised.value, KeyError)


def test_python_error_in_lowering_becomes_cpus_error_when_cpu_refuses(broken_neg):
    x = torch.ones(3, dtype=torch.bool)
    with pytest.raises(RuntimeError) as cpu:
        torch.neg(x)
    with pytest.raises(RuntimeError) as tpu:
        torch.neg(x.to(TPU))
    assert str(cpu.value).splitlines()[0] in str(tpu.value)


# ---------------------------------------------------------------- the harness
# OpInfos whose error_inputs / out= checks issue 17 found silent, of another type or misworded, and (session
# 30) those whose shape-mutation cases did
FIXED_OPINFOS = (
    "exponential", "uniform", "masked_scatter", "as_strided_scatter", "nn.functional.conv1d",
    "nn.functional.conv3d", "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss",
    "aminmax", "complex", "gather", "take", "index_add", "eye", "bucketize", "kthvalue", "cat",
    "addmm", "addmv", "nn.functional.conv_transpose2d", "diagonal_scatter", "select_scatter", "slice_scatter",
    "index_select", "put", "native_group_norm", "nn.functional.batch_norm", "expand",
)


@pytest.mark.parametrize("name", FIXED_OPINFOS)
def test_opinfo_error_inputs(name):
    results = E.run_errors(C.find_ops([name])[0])
    bad = [r for r in results if r.outcome in ("silent", "other-type", "message")]
    assert results and not bad, bad


@pytest.mark.slow
def test_opinfo_error_inputs_all():
    results, _ = E.run_all(C.find_ops())
    summary = E.summarize(results)
    assert summary["counts"]["silent"] == 0 and summary["counts"]["other-type"] == 0, summary["problems"]


def test_harness_detects_silent_and_other_type():
    def raise_type(exc):
        def call(device):
            def run():
                if device == "tpu" and exc is not None:
                    raise exc
                if device == "cpu":
                    raise RuntimeError("bad input")
            return run
        return call

    silent = E.judge("x", E._Case("error_inputs[0]", raise_type(None), RuntimeError, "bad input", ""))
    other = E.judge("x", E._Case("error_inputs[0]", raise_type(ValueError("x")), RuntimeError, "bad input", ""))
    words = E.judge("x", E._Case("error_inputs[0]", raise_type(RuntimeError("other words")), RuntimeError,
                                 "bad input", ""))
    good = E.judge("x", E._Case("error_inputs[0]", raise_type(RuntimeError("bad input!")), RuntimeError,
                                "bad input", ""))
    assert [r.outcome for r in (silent, other, words, good)] == ["silent", "other-type", "message", "matched"]


def test_native_user_site_walks_as_the_python_one():
    """errors.user_site's C++ walk (the extension's) and its Python one find the same frame: under
    internal frames (a file of transformers, an internal package), at each skip, and None where every
    frame is internal."""
    import inspect
    import threading

    import transformers.utils.generic as internal_module

    from tpu_interactive.backend import errors, native

    if not native.available():
        pytest.skip("the C++ extension did not build here: only the Python walk exists")
    source = ("from tpu_interactive.backend import errors\n"
              "def deep(n, skip):\n"
              "    return deep(n - 1, skip) if n else errors.user_site(skip)\n"
              "def collect(out):\n"
              "    out.append(deep(3, 1))\n")
    scope: dict = {}
    exec(compile(source, internal_module.__file__, "exec"), scope)  # frames the walk must pass over
    deep, native_walk = scope["deep"], errors.NATIVE_USER_SITE[0]
    assert native_walk is not None

    def both_walks(depth: int, skip: int) -> list:
        walks = []
        try:
            for walk in (native_walk, None):
                errors.NATIVE_USER_SITE[0] = walk
                walks.append(deep(depth, skip))  # the line both walks must name
        finally:
            errors.NATIVE_USER_SITE[0] = native_walk
        return walks

    lines, first = inspect.getsourcelines(both_walks)
    call_line = first + next(i for i, text in enumerate(lines) if "walks.append(deep(" in text)
    for depth in (0, 3, 30):
        for skip in (1, 2):
            by_native, by_python = both_walks(depth, skip)
            assert by_native == by_python == (__file__, call_line, "both_walks")
    in_thread: list = []  # threading's own frames (stdlib) are internal too
    thread = threading.Thread(target=lambda: in_thread.extend(both_walks(2, 1)))
    thread.start()
    thread.join()
    assert in_thread == [(__file__, call_line, "both_walks")] * 2
    everything_internal: list = []  # threads whose every frame is internal: no user frame
    for walk in (native_walk, None):
        errors.NATIVE_USER_SITE[0] = walk
        try:
            thread = threading.Thread(target=scope["collect"], args=(everything_internal,))
            thread.start()
            thread.join()
        finally:
            errors.NATIVE_USER_SITE[0] = native_walk
    assert everything_internal == [None, None]


def test_native_user_site_lets_its_frames_go_when_classify_raises():
    """A classify that raises reaches the caller, and the walk holds no frame: a frame kept alive
    would keep its locals (tensors) alive."""
    import gc
    import weakref

    from tpu_interactive.backend import errors, native

    if not native.available():
        pytest.skip("the C++ extension did not build here: only the Python walk exists")

    class Held:
        pass

    def refuse(_filename):
        raise ValueError("classify refused")

    def walk_from_a_new_code_object():  # a code object the walk has not classified yet
        scope: dict = {}
        exec(compile("def f(walk, refuse, held):\n    return walk(0, refuse)\n", f"<walk {id(scope)}>", "exec"), scope)
        held = Held()
        with pytest.raises(ValueError, match="classify refused"):
            scope["f"](errors.NATIVE_USER_SITE[0], refuse, held)
        return weakref.ref(held)

    alive = walk_from_a_new_code_object()
    gc.collect()
    assert alive() is None


def test_harness_shape_cases_take_cpus_exception_type_and_device_neutral_words():
    def refused_on_cpu(tpu_exc):
        def call(device):
            def run():
                if device == "cpu":
                    raise IndexError("expand(torch.FloatTensor{[1, 2]}, size=[2]): too many dims")
                if tpu_exc is not None:
                    raise tpu_exc
            return run
        return call

    outcomes = [E.judge("x", E._Case("shape: input unsqueeze(0)", refused_on_cpu(exc), None, None, "")).outcome
                for exc in (None, RuntimeError("expand(tpuFloatType{[1, 2]}, size=[2]): too many dims"),
                            IndexError("expand(tpuFloatType{[1, 2]}, size=[2]): too many dims"),
                            IndexError("expand(tpuFloatType{[1, 3]}, size=[2]): too many dims"))]
    assert outcomes == ["silent", "other-type", "matched", "message"]
    assert E._device_neutral("indices (torch.Size([1, 2])) but") == "indices ([1, 2]) but"
    # a mutated sample: one argument's shape changed, CPU's call refused
    labels = [c.label for c in E.cases(C.find_ops(["addmm"])[0]) if c.label.startswith("shape:")]
    assert "shape: input unsqueeze(0)" in labels and "shape: args[0] first dim - 1" in labels
