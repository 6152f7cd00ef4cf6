"""Functional collectives inside ``torch.compile(backend="tpu")`` graphs (a mixin of c10d_checks.Checks).

Each compiled function must be ONE program per call with its XLA collectives: its values equal the
same function run eagerly on tpu and on CPU copies over gloo, a warm call runs one compiled graph (a
compile-cache hit, no XLA compile) and no eager op or eager collective.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tpu_interactive.backend import collectives, stats


@contextlib.contextmanager
def _eager_collectives():
    """Counts the eager collectives (each is one ``Group._run``) run inside the block."""
    count, run = [0], collectives.Group._run

    def counting(self, *args, **kwargs):
        count[0] += 1
        return run(self, *args, **kwargs)

    collectives.Group._run = counting
    try:
        yield count
    finally:
        collectives.Group._run = run


def _one_program(fn, *args):
    """``fn(*args)``, asserting it ran as exactly one warm compiled graph: one cache hit, no compile,
    no eager op, no eager collective."""
    before = stats.snapshot()
    with _eager_collectives() as eager:
        out = fn(*args)
    delta = stats.diff(before, stats.snapshot())
    assert (delta["compile_hits"], delta["compile_misses"], delta["xla_compiles"]) == (1, 0, 0), delta
    assert not delta["op_counts"] and eager[0] == 0, (delta["op_counts"], eager[0])
    return out


def _mixed(group, avg):
    """Every functional collective, with math before and after; ``avg(x, group)`` is the AVG all-reduce
    (gloo has none: the CPU twin divides the SUM)."""
    def fn(x, y):
        s = funcol.all_reduce(x * 2, "sum", group)
        m = funcol.all_reduce(x.cos(), "max", group)
        a = avg(x + 1, group)
        gathered = funcol.all_gather_single(x.relu(), 0, group)
        scattered = funcol.reduce_scatter_single(y * y, "sum", 0, group)
        swapped = funcol.all_to_all_single(y - 1, None, None, group)
        b = funcol.broadcast(x.exp(), 1, group)
        z = y.sin()
        dist.all_reduce(z, op=dist.ReduceOp.MIN, group=group)  # in place: dynamo makes it functional
        return s + m * a, gathered.sum(0), scattered, swapped.tanh() + z, b - 1

    return fn


class CompiledChecks:
    def compiled_functional_collectives(self):
        world = dist.group.WORLD
        tpu_fn = _mixed(world, lambda v, g: funcol.all_reduce(v, "avg", g))
        cpu_fn = _mixed(self.gloo, lambda v, g: funcol.all_reduce(v, "sum", g) / self.n)
        compiled = torch.compile(tpu_fn, backend="tpu")
        for seed in (90, 91):  # the second call hits the compile cache and is one program
            (x, xc), (y, yc) = self.pair(seed, (4, 3)), self.pair(seed + 10, (2 * self.n, 3))
            got = compiled(x, y) if seed == 90 else _one_program(compiled, x, y)
            self.same(got, [t.cpu() for t in tpu_fn(x, y)])
            self.same(got, cpu_fn(xc, yc))
