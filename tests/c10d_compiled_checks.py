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

from tpu_interactive.backend import c10d, collectives, stats


@contextlib.contextmanager
def _counted(owner, name: str):
    """Counts the calls of ``owner.name`` inside the block."""
    count, method = [0], getattr(owner, name)

    def counting(self, *args, **kwargs):
        count[0] += 1
        return method(self, *args, **kwargs)

    setattr(owner, name, counting)
    try:
        yield count
    finally:
        setattr(owner, name, method)


def _one_program(fn, *args, check: bool = True):
    """``fn(*args)``, asserting it ran as exactly one warm compiled graph: one cache hit, no compile, no
    eager op, no eager collective (each is one ``Group._run``), and one exchange of the ranks'
    signatures through the store when the pre-check is on (``check``: on for this call)."""
    before, c10d.check_collectives = stats.snapshot(), check
    try:
        with _counted(collectives.Group, "_run") as eager, _counted(c10d.TPUProcessGroup, "_exchange") as checks:
            out = fn(*args)
    finally:
        c10d.check_collectives = True
    delta = stats.diff(before, stats.snapshot())
    assert (delta["compile_hits"], delta["compile_misses"], delta["xla_compiles"]) == (1, 0, 0), delta
    assert not delta["op_counts"] and eager[0] == 0 and checks[0] == int(check), (delta["op_counts"], eager[0], checks[0])
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
        p = funcol.all_reduce(x.sigmoid() + 0.5, "product", group)
        top = funcol.reduce_scatter_single(y.cos(), "max", 0, group)  # not a sum: an all-to-all, then max
        pair = funcol.all_reduce_coalesced([x, y.T], "sum", group)
        return s + m * a, gathered.sum(0), scattered, swapped.tanh() + z, b - 1, p, top, *pair

    return fn


class CompiledChecks:
    def compiled_functional_collectives(self):
        world = dist.group.WORLD
        tpu_fn = _mixed(world, lambda v, g: funcol.all_reduce(v, "avg", g))
        cpu_fn = _mixed(self.gloo, lambda v, g: funcol.all_reduce(v, "sum", g) / self.n)
        compiled = torch.compile(tpu_fn, backend="tpu")
        for seed in (90, 91, 92):  # later calls hit the compile cache: one program (the last: no pre-check)
            (x, xc), (y, yc) = self.pair(seed, (4, 3)), self.pair(seed + 10, (2 * self.n, 3))
            got = compiled(x, y) if seed == 90 else _one_program(compiled, x, y, check=seed == 91)
            self.same(got, [t.cpu() for t in tpu_fn(x, y)])
            self.same(got, cpu_fn(xc, yc))

    def compiled_dtensor_and_autograd(self):
        """DTensor redistributions compile to the same collectives, and a differentiable functional
        collective's backward (an all-gather's: a reduce-scatter) runs in the compiled backward graph."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("tpu", (self.n,))
        full = torch.arange(4.0 * self.n * 3).reshape(4 * self.n, 3)  # the same on every rank
        fn = torch.compile(lambda d: ((d * 2).redistribute(mesh, [Replicate()]).to_local(),
                                      d.sum().redistribute(mesh, [Replicate()]).to_local()), backend="tpu")
        self.same(fn(distribute_tensor(full.to("tpu"), mesh, [Shard(0)])), [full * 2, full.sum()])

        def loss(v, group):
            weights = torch.arange(3.0 * self.n, device=v.device)
            return (funcol.all_gather_single_autograd(v * v, 0, group) * weights).sum()

        compiled = torch.compile(loss, backend="tpu")
        (x, c) = self.pair(93, (3,))
        x.requires_grad_(), c.requires_grad_()
        got, want = compiled(x, dist.group.WORLD), loss(c, self.gloo)
        got.backward(), want.backward()
        self.same([got, x.grad], [want, c.grad])

    def compiled_all_to_all_uneven(self):
        """Uneven splits (the same number of input rows on every rank); a rank expecting other splits
        than the others send gets eager's error."""
        n, r = self.n, self.rank
        ins = [1 + (r + j) % n for j in range(n)]  # rank r sends 1 + (r + j) % n rows to rank j
        outs = [1 + (i + r) % n for i in range(n)]
        fn = torch.compile(lambda v, i, o: funcol.all_to_all_single(v * 2, o, i, dist.group.WORLD) + 1, backend="tpu")
        x, c = self.pair(94, (sum(ins), 3))
        got = fn(x, ins, outs)
        self.same(got, funcol.all_to_all_single(c * 2, outs, ins, self.gloo) + 1)
        try:  # rank 0 expects other splits than the others send: it fails, the others' calls work
            again = fn(x, ins, outs[::-1] if r == 0 else outs)
        except ValueError as e:
            assert r == 0 and f"rank 0 expects {outs[::-1]} rows but the ranks send" in str(e), e
        else:
            assert r != 0, "mismatched splits did not raise"
            self.same(again, got.cpu())

    def compiled_collectives_refused(self):
        """A gloo group's collective in a tpu graph, and a graph over two groups, are refused when compiled."""
        other = dist.new_group(list(range(self.n)))  # the same ranks, another group
        x = torch.ones(3, device="tpu")
        for fn, words in ((lambda v: funcol.all_reduce(v, "sum", self.gloo), "only groups of the tpu backend"),
                          (lambda v: funcol.all_reduce(funcol.all_reduce(v, "sum", dist.group.WORLD), "sum", other),
                           "collectives over several process groups")):
            try:
                torch.compile(fn, backend="tpu")(x)
            except Exception as e:  # noqa: BLE001  (dynamo wraps the backend's NotImplementedError)
                assert words in str(e), e
            else:
                raise AssertionError(f"not refused: {words}")

    def compiled_collectives_mismatched_shapes(self):
        """Ranks about to run different programs (here: other input shapes) fail before running, as eager does."""
        fn = torch.compile(lambda v: funcol.all_reduce(v + 1, "sum", dist.group.WORLD), backend="tpu")
        try:
            fn(torch.ones(self.rank + 2, device="tpu"))
        except RuntimeError as e:
            assert "mismatched collectives (rank 0: a compiled graph whose collectives hash to" in str(e), e
        else:
            raise AssertionError("mismatched compiled graphs did not raise")
        x, c = self.pair(95)
        self.same(fn(x), funcol.all_reduce(c + 1, "sum", self.gloo))  # the group still works afterwards

    def compiled_collectives_value_check(self):
        """An index out of range on one rank fails that rank's call with CPU's error, as eager does (the
        program still ran on every rank, so none waits for it)."""
        fn = torch.compile(lambda v, i: funcol.all_reduce(v, "sum", dist.group.WORLD)[i], backend="tpu")
        bad = self.rank == self.n - 1
        index, x = torch.tensor([0, 5 if bad else 1]), torch.arange(4.0)
        try:
            want = funcol.all_reduce(x, "sum", self.gloo)[index]
        except IndexError as e:
            want = e
        try:
            got = fn(x.to("tpu"), index.to("tpu"))
        except IndexError as e:
            assert isinstance(want, IndexError) and str(e) == str(want), (str(e), want)
        else:
            self.same(got, want)
        fn(x.to("tpu"), torch.tensor([3, 0], device="tpu"))  # the program keeps working

    def compiled_data_parallel_step(self):
        """A DDP-free data-parallel SGD step compiled whole (forward, backward, the gradients' all-reduce,
        the update): one program per step; 3 steps equal one CPU process averaging the ranks' gradients."""
        from c10d_checks import _batch, _mlp

        torch.manual_seed(0)
        ref = _mlp()
        model = _mlp().to("tpu")
        model.load_state_dict(ref.state_dict())
        weights = {k: p.detach() for k, p in model.named_parameters()}  # the parameters' storage, no autograd

        def loss_of(w, x, y):
            return torch.nn.functional.mse_loss(torch.func.functional_call(model, w, (x,)), y)

        @torch.compile(backend="tpu")
        def step(x, y):
            grads, loss = torch.func.grad_and_value(loss_of)(weights, x, y)
            with torch.no_grad():
                for name, w in weights.items():
                    w.sub_(0.1 * funcol.all_reduce(grads[name], "avg", dist.group.WORLD))
            return loss

        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for i in range(3):
            x, y = _batch(i, self.rank)
            x, y = x.to("tpu"), y.to("tpu")
            loss = step(x, y) if i == 0 else _one_program(step, x, y, check=i == 1)
            ref_opt.zero_grad()
            for r in range(self.n):  # the CPU run: every rank's batch, gradients averaged
                xr, yr = _batch(i, r)
                ref_loss = torch.nn.functional.mse_loss(ref(xr), yr) / self.n
                ref_loss.backward()
                if r == self.rank:
                    torch.testing.assert_close(loss.item(), ref_loss.item() * self.n, rtol=1e-5, atol=1e-6)
            ref_opt.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
