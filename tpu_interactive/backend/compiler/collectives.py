"""Functional collectives (``torch.ops._c10d_functional.*``) inside compiled graphs.

DTensor, FSDP2 and ``torch.distributed._functional_collectives`` issue these ops, and dynamo turns an
in-place ``dist.all_reduce(x)`` into them too. A graph containing any is built as ONE SPMD program over
the ``tpu`` process group's mesh (one device per process): every input enters as a global array in
which each rank's device holds that rank's own value (``Group.per_rank``), the graph interpreter runs
under ``jax.shard_map`` over the group's axis, and each collective node lowers to the XLA collective
(``lax.psum``/``pmax``/``pmin``/``all_gather``/``psum_scatter``/``all_to_all``); ``wait_tensor`` is the
identity (XLA orders the program). Results are each rank's own shard again (``addressable_data(0)``).
Every rank compiles and runs the same program, as with NCCL inside a CUDA graph.

The ranks' signature pre-check (``c10d.check_collectives``) runs once per compiled program, at its
first call on this rank: a warm call stays one program, and ranks that compiled different programs
(other shapes, other collectives) get the same error as eager collectives instead of a hang.
"""
from __future__ import annotations

import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.sharding import PartitionSpec

from .. import c10d
from .. import collectives as xla
from .functional import functional, op_key

NAMESPACE = "_c10d_functional"
_AXIS = "r"  # the group mesh's axis (collectives.Group)


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


def _collective_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target.namespace == NAMESPACE and n.target._schema.name != f"{NAMESPACE}::wait_tensor"]


class SPMD:
    """How a graph with collectives runs: the same program on every rank of one tpu process group."""

    def __init__(self, pg: c10d.TPUProcessGroup, collectives: list[str]):
        self.pg, self.group = pg, pg._group
        self.collectives = collectives

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> SPMD | None:
        """The graph's SPMD plan, or None when it has no collectives."""
        nodes = _collective_nodes(gm)
        if not nodes:
            return None
        names = sorted({_group_name(n) for n in nodes})
        if len(names) > 1:  # one shard_map axis per program; a 2-D mesh's groups would need named sub-axes
            raise NotImplementedError(f"a tpu compiled graph with collectives over several process groups "
                                      f"({', '.join(names)}) is not supported; split the function or run it eagerly")
        descriptions = [f"{op_key(n.target)}{tuple(a for a in n.args[1:] if not isinstance(a, torch.fx.Node))}"
                        for n in nodes]
        return cls(_resolve(names[0]), descriptions)

    def program(self, fn: Callable) -> Callable:
        """``fn`` run per rank: its inputs and outputs are per-rank global arrays (see ``inputs``)."""
        return jax.shard_map(fn, mesh=self.group.mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(),
                             check_vma=False)

    def inputs(self, rng_key, arrays: list) -> tuple:
        per_rank = self.group.per_rank
        return per_rank(rng_key), [None if a is None else per_rank(a) for a in arrays]

    @staticmethod
    def outputs(values):
        return jax.tree.map(lambda a: a.addressable_data(0), values)

    def check(self, signature) -> None:
        """The eager collectives' signature pre-check, before a program is compiled: every rank must be
        about to run the same collectives on inputs of the same shapes (a hash of both; the graph's code
        may differ, e.g. by a rank number baked in as a constant)."""
        self.pg._check("compiled_graph", None, zlib.crc32(repr((self.collectives, signature)).encode()))


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


@functional(f"{NAMESPACE}::all_reduce")
def _all_reduce(ctx, x, op: str, group_name: str):
    return _reduce(x, op, _size(group_name))


@functional(f"{NAMESPACE}::all_reduce_coalesced")
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


@functional(f"{NAMESPACE}::all_gather_into_tensor")
def _all_gather_into_tensor(ctx, x, group_size: int, group_name: str):
    return _all_gather(x, group_size, group_name)


@functional(f"{NAMESPACE}::all_gather_into_tensor_coalesced")
def _all_gather_into_tensor_coalesced(ctx, xs, group_size: int, group_name: str):
    return [_all_gather(x, group_size, group_name) for x in xs]


@functional(f"{NAMESPACE}::reduce_scatter_tensor")
def _reduce_scatter_tensor(ctx, x, op: str, group_size: int, group_name: str):
    return _reduce_scatter(x, op, group_size, group_name)


@functional(f"{NAMESPACE}::reduce_scatter_tensor_coalesced")
def _reduce_scatter_tensor_coalesced(ctx, xs, op: str, group_size: int, group_name: str):
    return [_reduce_scatter(x, op, group_size, group_name) for x in xs]


@functional(f"{NAMESPACE}::all_to_all_single")
def _all_to_all_single(ctx, x, output_split_sizes, input_split_sizes, group_name: str):
    n = _size(group_name)
    even = [x.shape[0] // n] * n
    if x.shape[0] % n or [int(s) for s in output_split_sizes] != even or [int(s) for s in input_split_sizes] != even:
        raise NotImplementedError(
            f"all_to_all_single with uneven splits (input {list(input_split_sizes)}, output "
            f"{list(output_split_sizes)}) inside a tpu compiled graph: every rank's program must have the same "
            "shapes; run it eagerly (uneven splits work there)")
    return lax.all_to_all(x, _AXIS, 0, 0, tiled=True)


@functional(f"{NAMESPACE}::broadcast")
def _broadcast(ctx, x, src: int, group_name: str):
    # src's bits, summed with zeros from every other rank: exact for every value (-0.0 and NaN too)
    mine = lax.axis_index(_AXIS) == src
    if jnp.iscomplexobj(x):
        return lax.complex(_broadcast(ctx, x.real, src, group_name), _broadcast(ctx, x.imag, src, group_name))
    bits = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
    total = lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), _AXIS)
    return total.astype(jnp.bool_) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(total, x.dtype)


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
