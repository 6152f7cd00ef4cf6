"""Differential conformance against PyTorch's OpInfo suite (see tpu_interactive/conformance.py).

One test per (op, dtype) of the fixed CI subset, plus one float32 gradient test per differentiable
op: each must *pass* (every sample matches CPU, no aten op took the CPU fallback) unless it is listed
in KNOWN_FAILURES, in which case it must still *not* pass, so fixing an op forces removing it here.
The full sweep over every OpInfo is marked slow (run with ``-m slow``).
"""
from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_dtype import floating_types
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

from helpers import TPU, rand

from tpu_interactive.testing import compare as K
from tpu_interactive.testing import conformance as C
from tpu_interactive.testing import tables

MAX_SAMPLES = 3  # bounded CI run; the full sweep (-m slow / the CLI) takes more

# "op/dtype" (forward) or "op/grad" (float32 gradients) -> why it does not pass yet.
# Measured with the CI subset; remove an entry once its lowering lands (the test then demands it).
KNOWN_FAILURES: dict[str, str] = {}


def _params():
    params = []
    for opinfo in C.find_ops(tables.CI_SUBSET):
        key = C.op_key(opinfo)
        for dtype in C.tested_dtypes(opinfo):  # float32 by default; the other dtypes with -m slow
            marks = () if dtype == "float32" else pytest.mark.slow
            params.append(pytest.param(opinfo, dtype, False, id=f"{key}-{dtype}", marks=marks))
        if C.supports_grad(opinfo):
            params.append(pytest.param(opinfo, "float32", True, id=f"{key}-grad"))
    return params


PARAMS = _params()


def _key(opinfo, dtype, grad):
    return f"{C.op_key(opinfo)}/{'grad' if grad else dtype}"


@pytest.mark.parametrize("opinfo,dtype,grad", PARAMS)
def test_opinfo_ci_subset(opinfo, dtype, grad):
    key = _key(opinfo, dtype, grad)
    result = C.run_op(opinfo, dtype, grad=grad, max_samples=MAX_SAMPLES)
    summary = (f"{key}: {result.outcome} ({result.sample_outcomes}) {result.detail} "
               f"fallback={result.fallback_ops} repro: {result.repro}")
    if key in KNOWN_FAILURES:
        assert result.outcome != "pass", f"{key} passes now: remove it from KNOWN_FAILURES ({KNOWN_FAILURES[key]})"
    else:
        assert result.outcome == "pass", summary


def test_known_failures_are_in_the_subset():
    keys = {_key(*p.values) for p in PARAMS}
    stale = sorted(set(KNOWN_FAILURES) - keys)
    assert not stale, f"KNOWN_FAILURES entries that name no CI test: {stale}"


# ---------------------------------------------------------------- the harness itself can fail
_lib = torch.library.Library("conformance_selftest", "DEF")
_lib.define("right(Tensor x) -> Tensor")
_lib.define("wrong(Tensor x) -> Tensor")
_lib.define("broken(Tensor x) -> Tensor")
_lib.define("cpu_only(Tensor x) -> Tensor")
for _name in ("right", "wrong", "broken", "cpu_only"):
    _lib.impl(_name, lambda x: x * 2, "CPU")
_lib.impl("right", lambda x: x * 2, "PrivateUse1")
_lib.impl("wrong", lambda x: x * 2 + (x.numel() > 1), "PrivateUse1")  # off by one, except for scalars


def _raise(x):
    raise NotImplementedError("selftest: no tpu kernel")


_lib.impl("broken", _raise, "PrivateUse1")  # cpu_only has no PrivateUse1 kernel: the CPU fallback


def _samples(op, device, dtype, requires_grad, **kwargs):
    yield SampleInput(torch.randn(3, 4, dtype=dtype, device=device))
    yield SampleInput(torch.randn(5, dtype=dtype, device=device).t())


def _selftest_op(name):
    return OpInfo(f"selftest_{name}", op=getattr(torch.ops.conformance_selftest, name), dtypes=floating_types(),
                  sample_inputs_func=_samples, supports_autograd=False)


@pytest.mark.parametrize("name,outcome", [("right", "pass"), ("wrong", "fail"), ("broken", "error"),
                                          ("cpu_only", "fallback")])
def test_harness_outcomes(name, outcome):
    result = C.run_op(_selftest_op(name), "float32")
    assert result.outcome == outcome, result
    assert result.samples == 2
    if outcome == "fallback":
        assert result.fallback_ops == {"aten::cpu_only.default": 2} or \
            list(result.fallback_ops) == ["conformance_selftest::cpu_only.default"], result.fallback_ops
    if outcome == "fail":
        assert "Mismatched elements" in result.detail and result.repro.startswith("selftest_wrong(T([3, 4]")


def test_compare_checks_dtype_shape_and_nan():
    x = torch.tensor([1.0, float("nan")])
    K.compare(x.to("tpu"), x)  # NaN == NaN
    with pytest.raises(K.Mismatch, match="dtype"):
        K.compare(x.to("tpu").double(), x)
    with pytest.raises(K.Mismatch, match="shape"):
        K.compare(x.to("tpu")[:1], x)
    with pytest.raises(K.Mismatch, match="on cpu"):
        K.compare(x, x)
    with pytest.raises(K.Mismatch):
        K.compare(torch.tensor([1, 2], device="tpu"), torch.tensor([1, 3]))


def test_to_tpu_keeps_geometry_and_aliasing():
    base = torch.arange(12.0).reshape(3, 4)
    view = base.t()
    out = K.to_tpu([view, view, {"device": torch.device("cpu")}])
    assert out[0] is out[1] and out[2]["device"] == torch.device("tpu", 0)
    assert out[0].stride() == view.stride() and not out[0].is_contiguous()
    torch.testing.assert_close(out[0].cpu(), view)


def test_cpu_error_must_be_matched_on_tpu():
    op = C.find_ops(["mm"])[0]
    bad = SampleInput(torch.randn(2, 3), args=(torch.randn(4, 5),))  # CPU raises RuntimeError
    outcome, detail, _ = C._forward_sample(op, bad, shapes_only=False)
    assert outcome in ("pass", "fallback"), detail  # tpu raised the same RuntimeError


# ---------------------------------------------------------------- the conformance harness's equivalence rules
@pytest.mark.usefixtures("no_fallback")
def test_harness_aligns_eigenvector_signs_but_not_wrong_vectors():

    a = rand(2, 4, 4)
    a = a + a.mT
    expected = torch.linalg.eigh(a)
    flipped = torch.linalg.eigh(a.to(TPU))
    flipped = type(flipped)((flipped[0], flipped[1] * torch.tensor([1.0, -1.0, -1.0, 1.0], device=TPU)))
    K.compare(C._align_signs("linalg.eigh", flipped, expected), expected)
    wrong = type(flipped)((flipped[0], flipped[1].roll(1, dims=-1)))
    with pytest.raises(K.Mismatch):
        K.compare(C._align_signs("linalg.eigh", wrong, expected), expected)


@pytest.mark.usefixtures("no_fallback")
def test_harness_svd_signs_move_u_and_v_together():

    a = rand(3, 5)
    expected = torch.linalg.svd(a, full_matrices=True)
    u, s, vh = torch.linalg.svd(a.to(TPU), full_matrices=True)
    sign = torch.tensor([-1.0, 1.0, -1.0], device=TPU)
    joint = (u * sign, s, torch.cat([vh[:3] * sign[:, None], vh[3:]]))
    K.compare(C._align_signs("linalg.svd", joint, expected), expected)
    only_u = (u * sign, s, vh)  # U flipped without V: a different (wrong) factorization
    with pytest.raises(K.Mismatch):
        K.compare(C._align_signs("linalg.svd", only_u, expected), expected)


@pytest.mark.usefixtures("no_fallback")
def test_harness_keeps_cpu_only_arguments_on_cpu():

    op = C.find_ops(["tensor_split"])[0]
    sample = next(s for s in op.sample_inputs("cpu", torch.float32) if isinstance(s.args[0], torch.Tensor))
    inp, args, _ = K.sample_to_tpu("tensor_split", sample)
    assert inp.device.type == "tpu" and args[0].device.type == "cpu"
    assert C.run_op(op, "float32", max_samples=4).outcome == "pass"


@pytest.mark.usefixtures("no_fallback")
def test_harness_mha_dropout_sample_is_shapes_only():

    op = C.find_ops(["nn.functional.multi_head_attention_forward"])[0]
    samples = list(op.sample_inputs("cpu", torch.float32))[:3]
    assert [tables.random_sample("nn.functional.multi_head_attention_forward", s) for s in samples] == [False, True, False]


# ---------------------------------------------------------------- the full sweep
@pytest.mark.slow
def test_full_sweep_has_no_new_silent_wrong_results(tmp_path):
    results = list(C.run(C.find_ops(), tuple(C.DTYPES), grad=True, max_samples=2))
    summary = C.summarize(results)
    wrong = {f"{r['op']}/{'grad' if r['kind'] == 'grad' else r['dtype']}" for r in summary["silent_wrong_results"]}
    new = sorted(wrong - set(KNOWN_FAILURES) - set(FULL_SWEEP_KNOWN_WRONG))
    assert not new, f"silent wrong results: {new}"


# Silent wrong results the last full sweep found outside the CI subset (see docs/conformance.md).
FULL_SWEEP_KNOWN_WRONG: dict[str, str] = {
}


def test_reports_of_a_split_sweep_merge_with_later_rows_winning(tmp_path):
    import json

    from tpu_interactive.testing import cli

    def row(op, outcome):
        return json.dumps(C.Result(op, "float32", "forward", outcome, samples=3).to_json())

    first, rerun = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join([json.dumps({"start": "abs"}), row("abs", "pass"), row("conv", "fail")]) + "\n")
    rerun.write_text(row("conv", "pass") + "\n" + row("sin", "pass") + "\n")
    out = tmp_path / "merged.json"
    assert cli.main(["--from-jsonl", f"{first},{rerun}", "--json", str(out)]) == 0
    results = {r["op"]: r["outcome"] for r in json.loads(out.read_text())["results"]}
    assert results == {"abs": "pass", "conv": "pass", "sin": "pass"}
