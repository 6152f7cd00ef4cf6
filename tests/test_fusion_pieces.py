"""Fused mode's pieces (backend/segment_pieces.py): a segment past its compiled shape variants runs
its steps whose shapes stay as fused programs and the others op by op, with plain eager's results,
no program per iteration, and plain eager's errors."""
import inspect
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, fused_runs

import tpu_interactive
from tpu_interactive.backend import fusion, segment_pieces, unrecorded
from tpu_interactive.backend.config import config


@pytest.fixture(autouse=True)
def _plain_eager_by_default():
    segment_pieces.forget()
    unrecorded.forget()
    with tpu_interactive.fuse(False):
        yield


def _piece_compiles(before: dict) -> int:
    after = tpu_interactive.stats()
    n = after["xla_compiles"] - before["xla_compiles"]
    return sum(e["op"] == "fused piece" for e in (after["recent_xla_compiles"][-n:] if n else []))


def _decode(table, w, steps: int, noise: bool = False):
    """A decode loop in miniature: per step an embedding and projections of fixed shapes around a cache
    that grows by one row (its cat and attention see a new length each step), a host read per step."""
    d = table.shape[1]
    cache, h = torch.zeros(1, d, device=table.device), torch.zeros(1, d, device=table.device)
    count, kept = torch.zeros(1, device=table.device), torch.ones(1, d, device=table.device)
    tokens, token = [], 1
    for i in range(steps):
        index = torch.tensor([token], device=table.device)
        count.add_(1)
        q = torch.tanh(F.embedding(index, table) @ w + h)
        if noise:
            q = q + 0.01 * torch.randn(1, d, device=table.device)
        cache = torch.cat([cache, q])
        att = torch.softmax(cache @ q.t(), 0)
        h = torch.relu((att * cache).sum(0, keepdim=True) @ w) * 0.5 + h
        kept.mul_(1.5)
        token = int((h @ table.t()).argmax())  # the host read: one segment per step
        tokens.append(token)
    return tokens, h, cache, count, kept


def _inputs():
    torch.manual_seed(0)
    return torch.randn(16, 8), torch.randn(8, 8) * 0.5


@pytest.mark.parametrize("noise", [False, True], ids=["plain", "random"])
def test_steady_steps_of_a_growing_loop_run_as_fused_pieces_with_eager_results(noise):
    table, w = _inputs()
    torch.manual_seed(1)
    cpu = _decode(table, w, 10, noise=noise) if not noise else None
    torch.manual_seed(1)
    eager = _decode(table.to("tpu"), w.to("tpu"), 10, noise=noise)
    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        torch.manual_seed(1)  # random ops draw the same keys as in plain eager
        fused = _decode(table.to("tpu"), w.to("tpu"), 10, noise=noise)
    assert fused[0] == eager[0] and (cpu is None or fused[0] == cpu[0])
    for got, expected in zip(fused[1:], eager[1:]):
        assert_same(got, expected.cpu(), rtol=1e-6, atol=1e-6)
    if cpu is not None:  # (a TPU's float32 matmuls differ from CPU's in the 5th digit)
        for got, expected in zip(fused[1:], cpu[1:]):
            assert_same(got, expected, rtol=1e-3, atol=1e-4)
    runs = fused_runs(before)
    n = config.fuse_variants  # the first segment (the setup and the first step) is a sequence of its own
    modes = [r["mode"] for r in runs]
    assert modes == ["compiled"] * (1 + n) + ["op by op"] + ["in pieces"] * (10 - n - 2), modes
    assert "fused pieces" in runs[-1]["cause"] and "pad or bucket" in runs[-1]["cause"]


def test_pieces_compile_once_and_are_reused():
    table, w = _inputs()
    table, w = table.to("tpu"), w.to("tpu")
    with tpu_interactive.fuse():
        before = tpu_interactive.stats()
        _decode(table, w, 5)  # the variants, a run op by op, then a run in pieces: they compile
        middle = tpu_interactive.stats()
        _decode(table, w, 12)  # the variants again (cached), then new lengths: the same pieces
    assert _piece_compiles(before) == 2  # the stretches before and after the cat and attention
    runs = [r["mode"] for r in fused_runs(middle)]
    assert runs == ["cached"] * (config.fuse_variants + 1) + ["in pieces"] * (12 - config.fuse_variants - 1), runs
    assert _piece_compiles(middle) == 0
    fusion.reset()  # forgets the pieces too (%tpu cache clear)
    after_reset = tpu_interactive.stats()
    with tpu_interactive.fuse():
        _decode(table, w, 5)
    assert _piece_compiles(after_reset) == 2


def test_a_value_check_failing_in_a_piece_raises_eager_error_at_the_recorded_line():
    table, w = _inputs()
    source, first = inspect.getsourcelines(_decode_checked)
    line = first + next(i for i, text in enumerate(source) if "index_select" in text)
    outcomes = {}
    for mode in ("eager", "fused"):
        state, before = {}, tpu_interactive.stats()
        with tpu_interactive.fuse(mode == "fused"), pytest.raises(IndexError) as raised:
            _decode_checked(table.to("tpu"), w.to("tpu"), 8, 6, state)
        outcomes[mode] = raised.value, state
    assert [r["mode"] for r in fused_runs(before)][-2:] == ["in pieces"] * 2  # the failing step's segment too
    eager, fused = outcomes["eager"], outcomes["fused"]
    assert str(fused[0]).splitlines()[0] == str(eager[0]).splitlines()[0] == "index out of range in self"
    text = str(fused[0])
    assert "aten::index_select" in text and f"test_fusion_pieces.py:{line}" in text and "recorded in fused mode" in text
    assert fused[1]["count"].item() == eager[1]["count"].item() == 7.0  # the failing step's add_ applied
    # the failing step's first write (in the piece before the failing one) stays; its last is undone
    assert_same(fused[1]["kept"], eager[1]["kept"].cpu(), rtol=1e-6, atol=1e-6)
    assert torch.equal((fused[1]["count"] + 1).cpu(), torch.tensor([8.0]))  # the device keeps working


def _decode_checked(table, w, steps, bad_at, state):
    """_decode with an index op after the attention, whose index is bad at step ``bad_at``; hands out
    its in-place state before it fails."""
    d = table.shape[1]
    cache, h = torch.zeros(1, d, device="tpu"), torch.zeros(1, d, device="tpu")
    state["count"], state["kept"] = count, kept = torch.zeros(1, device="tpu"), torch.ones(1, d, device="tpu")
    token = 1
    for i in range(steps):
        index = torch.tensor([token], device="tpu")
        column = torch.tensor([0 if i != bad_at else d + 3], device="tpu")
        count.add_(1)
        kept.mul_(1.5)  # kept after a failure later in the step (its piece keeps it for the undo log)
        q = torch.tanh(F.embedding(index, table) @ w + h)
        cache = torch.cat([cache, q])
        att = torch.softmax(cache @ q.t(), 0)
        h = torch.relu((att * cache).sum(0, keepdim=True) @ w) * 0.5 + h
        h = h + h.index_select(1, column)
        kept.copy_(h * 0.5)  # undone when the index is bad
        token = int((h @ table.t()).argmax())


def test_a_loop_with_few_steady_steps_still_runs_op_by_op_then_unrecorded():
    x = torch.randn(50, device="tpu")  # (not test_fusion's loop: programs are cached by ops and shapes)
    before = tpu_interactive.stats()
    with tpu_interactive.fuse():
        peaks = [(x[:n] * 3 - 1).abs().amax().item() for n in range(6, 15)]
    assert peaks == pytest.approx([(x.cpu()[:n] * 3 - 1).abs().amax().item() for n in range(6, 15)], rel=1e-6)
    modes = {r["mode"] for r in fused_runs(before)[config.fuse_variants:]}
    assert modes == {"op by op", "not recorded"}, modes


def test_the_cell_report_counts_segments_run_in_pieces(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext tpu_interactive")
    table, w = _inputs()
    shell.user_ns.update(decode=_decode, table=table.to("tpu"), w=w.to("tpu"))
    capsys.readouterr()
    assert shell.run_cell("%%tpu --fuse\nresult = decode(table, w, 8)\n").success
    out = capsys.readouterr().out
    assert f"{8 - config.fuse_variants - 2} in pieces" in out, out
    assert re.search(r"in pieces: same \d+ ops as a compiled segment but new shapes .*: (\d+) of them ran as 2 fused "
                     r"pieces, the others op by op \(pad or bucket", out), out
