"""A segment past its compiled shape variants, run as fused pieces with the changing ops between them.

``generate()`` with a growing KV cache records the same ~72 ops per decode step (tiny GPT-2), and 12 of
them see a new length each time (the cache's ``cat``, attention, the mask). Only those need new programs:
the layer norms, projections and MLPs see the same shapes every step. Once such a segment is past
``config.fuse_variants``, each of its steps whose signature (lowering, static arguments, where its inputs
come from, their shapes) equals the previous run's is *stable*; each maximal stretch of stable steps
runs as one program (a *piece*, compiled once, then cached by its steps and input shapes), and the steps
in between run op by op on plain eager's programs. A piece keeps only the results that later steps read,
that are referenced when it runs, or that the undo log may restore. Like the rest of fused mode, which
steps are stable depends on the op sequence and shapes only, so every rank cuts its pieces alike.

A piece that fails (a value check) re-runs its steps op by op, which raises plain eager's error at the
recorded line; pieces never donate their inputs, so the re-run finds them whole.
"""
from __future__ import annotations

from . import segment_program

MIN_STEPS = 2  # a stable step alone runs on plain eager's own program
MIN_SHARE = 0.5  # fewer steps than this share stable: the segment runs op by op (and soon unrecorded)
_LIMIT = 2_000

_last: dict[tuple, list] = {}  # (op sequence, length, first site) -> its last run's step signatures
_programs: dict[tuple, segment_program.SegmentProgram] = {}


class Piece:
    """Steps ``start:stop`` of a segment (``size`` results) as one program reading ``inputs`` (segment
    refs: a result's position, or -1 - an external input's index) and returning the results at
    positions ``kept``."""

    __slots__ = ("start", "stop", "size", "inputs", "program", "kept")
    compile_label = "fused piece"  # names its XLA compile in compile_log

    def __init__(self, start: int, stop: int, size: int, inputs: list[int], program, kept: tuple[int, ...]):
        self.start, self.stop, self.size, self.inputs, self.program, self.kept = \
            start, stop, size, inputs, program, kept

    def run(self, ext: list, env: list) -> list:
        """The kept results (in ``kept`` order), from the segment's inputs and results so far."""
        floats, arrays = segment_program.split_floats([ext[-1 - r] if r < 0 else env[r] for r in self.inputs])
        program = self.program
        executable, inputs, _ = program.executable(floats, arrays, program.undonated)
        return executable(*inputs)


def forget() -> None:
    _last.clear()
    _programs.clear()


def _aval(seg, ref: int):
    """What a segment ref reads: an external input's aval (``float`` for a Python float), or a result's."""
    if ref < 0:
        return seg.ext_avals[-1 - ref]
    value = seg.values[ref]
    return value.shape, value.dtype, value.weak_type


def _signatures(seg) -> list[tuple]:
    return [(key, tuple([_aval(seg, r) for r in key[2]])) for key in seg.key]


def _stable_runs(old: list, new: list) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, (a, b) in enumerate(zip(old, new)):
        if a == b:
            start = i if start is None else start
            continue
        if start is not None and i - start >= MIN_STEPS:
            runs.append((start, i))
        start = None
    if start is not None and len(new) - start >= MIN_STEPS:
        runs.append((start, len(new)))
    return runs


def split(seg, live: tuple[int, ...]) -> list[Piece] | None:
    """The pieces to run segment ``seg`` in (its steps past its compiled variants), or None: op by op."""
    struct = segment_program.struct_of(seg)
    signatures = _signatures(seg)
    last = _last.get(struct)
    if len(_last) > _LIMIT:
        _last.clear()
    _last[struct] = signatures
    if last is None or len(last) != len(signatures):
        return None
    runs = _stable_runs(last, signatures)
    if sum(stop - start for start, stop in runs) < MIN_SHARE * len(signatures):
        return None
    firsts, position = [], 0  # each step's first result position
    for step, *_ in seg.steps:
        firsts.append(position)
        position += len(step.avals)
    firsts.append(position)
    last_read = [-1] * position  # by result: the last step reading it
    for i, (_, _, refs) in enumerate(seg.key):
        for r in refs:
            if r >= 0:
                last_read[r] = i
    keep = set(live)
    keep.update(previous for _, previous, _ in seg.undo if type(previous) is int)  # what a failure restores
    return [_piece(seg, start, stop, firsts, last_read, keep) for start, stop in runs]


def _piece(seg, start: int, stop: int, firsts: list[int], last_read: list[int], keep: set) -> Piece:
    base, end = firsts[start], firsts[stop]
    inputs: list[int] = []
    local: dict[int, int] = {}  # a segment ref read from outside the piece -> the piece's ref to it

    def ref(r: int) -> int:
        if r >= base:
            return r - base
        found = local.get(r)
        if found is None:
            inputs.append(r)
            found = local[r] = -len(inputs)
        return found

    recorded, key = [], []
    for i in range(start, stop):
        step, key_refs, refs, op_name, site = seg.steps[i]
        key_refs, refs = tuple([ref(r) for r in key_refs]), tuple([ref(r) for r in refs])
        recorded.append((step, key_refs, refs, op_name, site))
        key.append((seg.key[i][0], key_refs, refs))
    values = seg.values
    ext_avals = [_aval(seg, r) for r in inputs]
    kept = tuple([p - base for p in range(base, end) if p in keep or last_read[p] >= stop])
    program_key = (tuple(key), tuple(ext_avals), kept)
    program = _programs.get(program_key)
    if program is None:
        if len(_programs) > _LIMIT:
            _programs.clear()
        program = _programs[program_key] = segment_program.SegmentProgram(
            recorded, ext_avals, kept, [(values[base + p].shape, values[base + p].dtype) for p in kept])
    return Piece(start, stop, end - base, inputs, program, tuple([base + p for p in kept]))


def cause(pieces: list[Piece], why: str) -> str:
    """The report's line for a segment run in ``pieces`` (``why``: why it has no program of its own)."""
    covered = sum(piece.stop - piece.start for piece in pieces)
    return why.replace("run op by op", f"{covered} of them ran as {len(pieces)} fused pieces, the others op by op")
