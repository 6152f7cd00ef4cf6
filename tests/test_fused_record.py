"""Fused mode's C++ recorder (csrc/fused_record.cpp): a call that a C++ record plan serves is appended to
the segment without Python, exactly as fusion.Recorder / Segment.add append it (a segment's program is
cached by what they append, so any difference recompiles or, worse, mixes up inputs)."""
import pytest
import torch
from helpers import fused_runs

import tpu_interactive
from tpu_interactive.backend import fast_path, fusion, segment_program, unrecorded
from tpu_interactive.backend.config import config

pytestmark = pytest.mark.skipif(fast_path._native is None, reason="the C++ extension is not built here")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _step(model, x, y, lr: float) -> None:
    for p in model.parameters():
        p.grad = None
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # records its ops after running the forward's segment: its inputs are computed values
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)  # a new Python float each step: a program input
        # a multi-result op (var_mean: a tuple) and a float argument recorded on computed and pending inputs
        return torch.var_mean(model[0].weight * 0.5, dim=1)


def _segment_record(seg) -> dict:
    """What decides a segment's program and how it is run: per step its id, keys and input references, its
    op name and user line; the outside inputs' avals; the op-structure hash; the results' metadata."""
    return {"key": list(seg.key), "avals": list(seg.ext_avals), "struct": segment_program.struct_of(seg),
            "names": [(e[3], e[4]) for e in seg.steps],
            "results": [(v.pos, v.shape, v.dtype, v.weak_type) for v in seg.values], "depth": list(seg.depth)}


@pytest.mark.parametrize("elsewhere", [False, True], ids=["", "a loop elsewhere runs unrecorded"])
def test_the_cpp_recorder_appends_what_the_python_recorder_does(monkeypatch, elsewhere):
    """Step 0 is recorded in Python (each call's first key) and offers record plans; steps 1 and 2 are
    recorded from them by the C++ recorder. The segment each records (the backward and update) is the same
    record, and the results equal plain eager's. A segment known to run op by op elsewhere (a generate()
    loop earlier in the session) changes none of it: only a segment's first op may start such a stretch."""
    if elsewhere:
        monkeypatch.setitem(unrecorded._op_by_op, (torch.add, ("elsewhere.py", 1, "loop")), [5, 0, 8])
    x, y = torch.randn(7, 8), torch.randn(7, 4)
    model = _model()
    expected = [_step(model, x, y, 0.1 * (i + 1)) for i in range(3)]
    expected_weights = [p.detach().clone() for p in model.parameters()]
    model, xt, yt = _model().to("tpu"), x.to("tpu"), y.to("tpu")
    records, here, outs = [], [], []
    with tpu_interactive.fuse():
        for i in range(3):
            fusion.flush()
            before = fast_path.recorded_in_cpp()
            outs.append(_step(model, xt, yt, 0.1 * (i + 1)))
            here.append(fast_path.recorded_in_cpp() - before)
            records.append(_segment_record(fusion.current()))
    assert here[1] > 10 and here[2] == here[1], here
    assert records[1] == records[0]
    assert records[2] == records[0]
    for got, want in zip(outs, expected):
        for g, e in zip(got, want):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6)
    for p, e in zip(model.parameters(), expected_weights):
        torch.testing.assert_close(p.detach().cpu(), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("limit", ["fuse_max_ops", "fuse_max_depth"])
def test_the_cpp_recorder_flushes_at_the_limits(monkeypatch, limit):
    """The op-count and dependency-chain limits flush from C++ too: a chain of 12 repeated ops with a limit
    of 5 runs as segments of 5, 5 and 2 ops, with plain eager's values."""
    x = torch.randn(4, 4)
    want = x.clone()
    for _ in range(12):
        want = want * 1.5 - 0.25
    xt = x.to("tpu")
    with tpu_interactive.fuse():
        t = xt
        for _ in range(12):
            t = t * 1.5 - 0.25  # warm: the keys have record plans
        fusion.flush()
        monkeypatch.setattr(config, limit, 5)
        before, native = tpu_interactive.stats(), fast_path.recorded_in_cpp()
        t = xt
        for _ in range(12):
            t = t.mul(1.5).sub(0.25)
        fusion.flush()
        runs = fused_runs(before)
        # the first op of each of the 5 segments starts it in Python
        assert fast_path.recorded_in_cpp() - native == 24 - 5
    reason = "op-count limit" if limit == "fuse_max_ops" else "dependency-chain limit"
    lengths = [(r["ops"], r["reason"]) for r in runs]
    assert lengths == [(5, reason)] * 4 + [(4, "flush")], lengths
    torch.testing.assert_close(t.cpu(), want)


def test_an_input_whose_segment_failed_still_raises_from_a_record_plan():
    """The C++ recorder leaves a call reading a value that was never computed to the Python recorder:
    plain eager's error for it, as before."""
    bad = torch.tensor([[0, 9]], device="tpu")
    base = torch.randn(3, 4, device="tpu")
    with tpu_interactive.fuse():
        for _ in range(2):  # the reading op's key (a (1, 2) float tensor times a float) gets a record plan
            fusion.flush()
            torch.randn(1, 2, device="tpu") * 2.0
        fusion.flush()
        broken = base.gather(1, bad)  # fails when its segment runs (index 9 of 4)
        with pytest.raises(RuntimeError, match="out of bounds"):
            fusion.flush()
        before = fast_path.recorded()
        with pytest.raises(RuntimeError, match="never computed"):
            broken * 2.0
        assert fast_path.recorded() == before


def test_writes_from_record_plans_after_a_failing_op_are_undone():
    """In-place writes recorded from C++ plans note the buffer's previous value in the segment's undo log
    (in C++ too): when an op of the segment fails, writes recorded before it are applied and writes
    recorded after it are undone, as plain eager would have left them."""
    bad = torch.tensor([[0, 9]], device="tpu")
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    ps, qs = [torch.ones(5, device="tpu") for _ in range(3)], [torch.ones(5, device="tpu") for _ in range(3)]
    with tpu_interactive.fuse():
        for _ in range(2):  # the writes' keys get record plans
            fusion.flush()
            torch._foreach_add_(ps, qs, alpha=0.5)
            ps[0].mul_(2.0)
        fusion.flush()
        start = [p.cpu() for p in ps]
        before = fast_path.recorded()
        torch._foreach_add_(ps, qs, alpha=0.5)  # recorded before the failing op: applied
        x.gather(1, bad)  # fails when the segment runs (index 9 of 4)
        ps[0].mul_(2.0)  # recorded after it: undone
        torch._foreach_add_(ps, qs, alpha=0.5)
        assert fast_path.recorded() - before >= 3  # the three writes (and the gather, if an earlier test planned it)
        with pytest.raises(RuntimeError, match="out of bounds"):
            fusion.flush()
    for p, s in zip(ps, start):
        torch.testing.assert_close(p.cpu(), s + 0.5)
