"""Fused mode's unrecorded stretches: segments known to run op by op are not recorded at all.

A segment that runs op by op (a shape-changing loop past ``config.fuse_variants`` with too little
to run in pieces, segment_pieces.py) pays for recording every op and then runs as plain eager would,
only slower. After :data:`SKIP_AFTER` such runs in a row of segments that start with the same op at
the same line, the next segments starting there (where none is recorded, or where autograd's
backward begins: a training step's segment) are not recorded: their ops run as plain eager (the C++
fast path included) until the next flush point (a host read, ``synchronize()``, leaving fused mode,
an op with a data-dependent shape: where the recorded segment would have been cut). After
:data:`FIRST_PROBE` unrecorded ones, one is recorded again, to notice shapes that came back to a
compiled variant; then after 4x as many, and so on (a probe that runs op by op compiles its ops'
programs for new shapes, so probes must stay rare). The decisions depend on the op sequence only, as
flushes do, so every rank of a job decides alike.
"""
from __future__ import annotations

from typing import Callable

from .errors import user_site
from .stats import record_fused

SKIP_AFTER, FIRST_PROBE, LAST_PROBE = 2, 8, 1024
# (first op's lowering, its line) -> [op-by-op runs in a row, unrecorded since the last probe, next probe]
_op_by_op: dict[tuple, list[int]] = {}
_site: list = [None]  # the line whose segment is running unrecorded, while one does
on_change: list[Callable] = []  # told when a stretch starts or ends (fast_path switches the C++ path)


def running() -> bool:
    """An unrecorded stretch is running (fused mode records nothing until it ends)."""
    return _site[0] is not None


def any_known() -> bool:
    """Some segment is known to keep running op by op."""
    return bool(_op_by_op)


def start_if_known(fn: Callable) -> bool:
    """Whether the segment that ``fn`` would start is one to run unrecorded; if so, the stretch starts."""
    site = user_site()
    counts = _op_by_op.get((fn, site))
    if counts is None or counts[0] < SKIP_AFTER:
        return False
    if counts[1] >= counts[2]:  # a probe: recorded, as any segment
        counts[1], counts[2] = 0, min(4 * counts[2], LAST_PROBE)
        return False
    counts[1] += 1
    _site[0] = site
    for listener in on_change:
        listener()
    return True


def end(reason: str) -> None:
    """End the running stretch, if any (at a flush point)."""
    site = _site[0]
    if site is None:
        return
    _site[0] = None
    for listener in on_change:
        listener()
    record_fused(0, "not recorded", "a segment that keeps running op by op (new shapes each time)", reason, 0.0,
                 f"{site[0]}:{site[1]}" if site else "")


def note_run(fn: Callable, site, op_by_op: bool) -> None:
    """A recorded segment starting with ``fn`` at ``site`` ran op by op (past its variants) or not."""
    if op_by_op:
        _op_by_op.setdefault((fn, site), [0, 0, FIRST_PROBE])[0] += 1
    else:
        _op_by_op.pop((fn, site), None)


def forget() -> None:
    _op_by_op.clear()
