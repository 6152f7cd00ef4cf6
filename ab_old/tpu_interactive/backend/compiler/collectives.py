"""Functional collectives (``torch.ops._c10d_functional.*``) inside compiled graphs.

DTensor, FSDP2 and ``torch.distributed._functional_collectives`` issue these ops, and dynamo turns an
in-place ``dist.all_reduce(x)`` into them too. A graph containing any is built as ONE SPMD program over
the ``tpu`` process group's mesh (one device per process): every input enters as a global array in
which each rank's device holds that rank's own value (``Group.per_rank``), the graph interpreter runs
under ``jax.shard_map`` over the group's axis, and each collective node lowers to the XLA collective
(``lax.psum``/``pmax``/``pmin``/``all_gather``/``psum_scatter``/``all_to_all``); ``wait_tensor`` is the
identity (XLA orders the program). Results are each rank's own shard again (``addressable_data(0)``).
Every rank compiles and runs the same program, as with NCCL inside a CUDA graph.

The ranks' signature pre-check (``c10d.check_collectives``) runs once per call, before the program:
ranks about to run different collectives (other kinds, shapes or dtypes, as the program's trace
records them) get the same error as eager collectives instead of a hang or a crash. Once per call,
not once per compile, because ranks' dynamo caches can diverge (a rank-specific Python value that
changes recompiles on one rank only); switched off, a call is exactly one program.
"""
from __future__ import annotations

import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .. import c10d, graph_checks
from .. import collectives as xla
from .functional import functional

NAMESPACE = "_c10d_functional"
_AXIS = xla.AXIS  # the group mesh's axis


def _resolve(group_name: str) -> c10d.TPUProcessGroup:
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = _resolve_process_group(group_name)
    if not isinstance(pg, c10d.TPUProcessGroup):
        raise NotImplementedError(f"a collective of process group {group_name!r} ({pg.name()}) inside a tpu "
                                  "compiled graph: only groups of the tpu backend run in a compiled graph")
    return pg


def _group_name(node: torch.fx.Node) -> str:
    schema = node.target._schema
    index = next(i for i, a in enumerate(schema.arguments) if a.name == "group_name")
    return node.args[index] if index < len(node.args) else node.kwargs["group_name"]


class SPMD:
    """How a graph with collectives runs: the same program on every rank of one tpu process group."""

    def __init__(self, pg: c10d.TPUProcessGroup):
        self.pg, self.group = pg, pg._group

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> SPMD | None:
        """The graph's SPMD plan, or None when it has no collectives."""
        names = sorted({_group_name(n) for n in gm.graph.nodes if n.op == "call_function"
                        and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == NAMESPACE
                        and n.target._schema.name != f"{NAMESPACE}::wait_tensor"})
        if len(names) > 1:  # one shard_map axis per program; a 2-D mesh's groups would need named sub-axes
            raise NotImplementedError(f"a tpu compiled graph with collectives over several process groups "
                                      f"({', '.join(names)}) is not supported; split the function or run it eagerly")
        return cls(_resolve(names[0])) if names else None

    def program(self, fn: Callable) -> Callable:
        """``fn`` run per rank: its inputs and outputs are per-rank global arrays (see ``inputs``)."""
        return self.group.per_rank_map(fn)

    def inputs(self, rng_key, arrays: list) -> tuple:
        per_rank = self.group.per_rank
        return per_rank(rng_key), [None if a is None else per_rank(a) for a in arrays]

    @staticmethod
    def outputs(values):
        return jax.tree.map(lambda a: a.addressable_data(0), values)

    def check(self, signature: int) -> None:
        """The eager collectives' signature pre-check, once per call: every rank must be about to run the
        same collectives on operands of the same shapes and dtypes (``signature``: a hash of them, from
        the program's trace; the graphs' code may differ, e.g. by a rank number or an all-to-all's splits
        baked in as constants)."""
        self.pg._check("compiled_graph", None, signature)


TRACED: list = []  # the collectives traced so far: (op, operand dtypes/shapes, reduction/root/size)


def signature(traced: list) -> int:
    return zlib.crc32(repr(traced).encode())


def _collective(name: str) -> Callable[[Callable], Callable]:
    """Register the graph form of ``_c10d_functional::name``; each traced call is recorded in ``TRACED``."""
    def register(fn):
        def traced(ctx, x, *args, **kwargs):
            operands = [(str(v.dtype), v.shape) for v in (x if isinstance(x, (list, tuple)) else [x])]
            TRACED.append((name, operands, [a for a in args if isinstance(a, (str, int))]))
            return fn(ctx, x, *args, **kwargs)

        functional(f"{NAMESPACE}::{name}")(traced)
        return fn

    return register


# ---------------------------------------------------------------- the collectives, per rank
def _reduce(x: jax.Array, op: str, n: int) -> jax.Array:
    op = op.lower()
    if op in ("sum", "avg"):
        total = lax.psum(x, _AXIS)
        return xla.average(total, n) if op == "avg" else total
    if op == "max":
        return lax.pmax(x, _AXIS)
    if op == "min":
        return lax.pmin(x, _AXIS)
    if op == "product":  # no product all-reduce in XLA's collectives: gather, then multiply in rank order
        return xla.reduce_stacked("product", lax.all_gather(x, _AXIS), n)
    raise ValueError(f"tpu process group: reduce op {op!r} is not supported (sum, avg, product, min, max are)")


def _size(group_name: str) -> int:
    return _resolve(group_name).size()


@functional(f"{NAMESPACE}::wait_tensor")
def _wait_tensor(ctx, x):
    return x


@_collective("all_reduce")
def _all_reduce(ctx, x, op: str, group_name: str):
    return _reduce(x, op, _size(group_name))


@_collective("all_reduce_coalesced")
def _all_reduce_coalesced(ctx, xs, op: str, group_name: str):
    return [_reduce(x, op, _size(group_name)) for x in xs]


def _all_gather(x, group_size: int, group_name: str):
    _check_size(group_size, group_name, "all_gather_into_tensor")
    return lax.all_gather(x, _AXIS, axis=0, tiled=True)


def _reduce_scatter(x, op: str, group_size: int, group_name: str):
    _check_size(group_size, group_name, "reduce_scatter_tensor")
    op = op.lower()
    if op in ("sum", "avg"):
        total = lax.psum_scatter(x, _AXIS, scatter_dimension=0, tiled=True)
        return xla.average(total, group_size) if op == "avg" else total
    # other reductions: rank i receives every rank's chunk i (an all-to-all) and reduces them
    chunks = x.reshape(group_size, x.shape[0] // group_size, *x.shape[1:])
    return xla.reduce_stacked(op, lax.all_to_all(chunks, _AXIS, 0, 0), group_size)


def _check_size(group_size: int, group_name: str, what: str) -> None:
    if group_size != _size(group_name):
        raise ValueError(f"{what}: group_size {group_size} but process group {group_name!r} has "
                         f"{_size(group_name)} ranks")


@_collective("all_gather_into_tensor")
def _all_gather_into_tensor(ctx, x, group_size: int, group_name: str):
    return _all_gather(x, group_size, group_name)


@_collective("all_gather_into_tensor_coalesced")
def _all_gather_into_tensor_coalesced(ctx, xs, group_size: int, group_name: str):
    return [_all_gather(x, group_size, group_name) for x in xs]


@_collective("reduce_scatter_tensor")
def _reduce_scatter_tensor(ctx, x, op: str, group_size: int, group_name: str):
    return _reduce_scatter(x, op, group_size, group_name)


@_collective("reduce_scatter_tensor_coalesced")
def _reduce_scatter_tensor_coalesced(ctx, xs, op: str, group_size: int, group_name: str):
    return [_reduce_scatter(x, op, group_size, group_name) for x in xs]


@_collective("all_to_all_single")
def _all_to_all_single(ctx, x, output_split_sizes, input_split_sizes, group_name: str):
    n, rows = _size(group_name), x.shape[0]
    ins = [int(s) for s in input_split_sizes] or [rows // n] * n
    outs = [int(s) for s in output_split_sizes] or [rows // n] * n
    if ins == outs == [rows // n] * n and rows % n == 0:
        return lax.all_to_all(x, _AXIS, 0, 0, tiled=True)
    # uneven: XLA's all-to-all moves equal blocks, so every block is padded to the input's row count (a
    # bound every rank shares: the ranks' programs have the same input shapes) and trimmed after; what
    # the others send is checked in the program, as eager checks it
    sent = lax.all_gather(jnp.asarray(ins), _AXIS)[:, lax.axis_index(_AXIS)]
    rank = _resolve(group_name).rank()
    graph_checks.check_in_graph(jnp.any(sent != jnp.asarray(outs)), sent, ValueError, lambda got: (
        f"all_to_all_single: rank {rank} expects {outs} rows but the ranks send {got}"))
    starts = [sum(ins[:i]) for i in range(n)]
    blocks = jnp.stack([jnp.pad(x[s:s + k], [(0, rows - k)] + [(0, 0)] * (x.ndim - 1)) for s, k in zip(starts, ins)])
    got = lax.all_to_all(blocks, _AXIS, 0, 0)
    return jnp.concatenate([got[j, :k] for j, k in enumerate(outs)])


@_collective("broadcast")
def _broadcast(ctx, x, src: int, group_name: str):
    # src's bits, summed with zeros from every other rank: exact for every value (-0.0 and NaN too)
    mine = lax.axis_index(_AXIS) == src
    if jnp.iscomplexobj(x):
        return lax.complex(_broadcast(ctx, x.real, src, group_name), _broadcast(ctx, x.imag, src, group_name))
    bits = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
    total = lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), _AXIS)
    return total.astype(jnp.bool_) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(total, x.dtype)


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
