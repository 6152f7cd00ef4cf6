"""The graph interpreter: an aten FX graph evaluated on jax values (tracers under ``jax.jit``)."""
from __future__ import annotations

import torch

from .. import dispatch, storage
from .functional import GraphContext, qualified
from .lowerings import handler, supported


def _map(value, fn):
    if isinstance(value, torch.fx.Node):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _constant(value):
    if isinstance(value, torch.Tensor):
        if value.device.type == "tpu":
            return storage.read(value)
        return dispatch.cpu_to_jax(value)
    return value


def check_supported(gm: torch.fx.GraphModule) -> None:
    missing = sorted({qualified(n.target) for n in gm.graph.nodes if n.op == "call_function"
                      and isinstance(n.target, torch._ops.OpOverload) and not supported(n.target)})
    if missing:
        raise NotImplementedError(
            "the tpu compiler has no lowering (and torch._decomp no decomposition) for: "
            + ", ".join(missing)
            + ". Run this code eagerly on tpu, or add a lowering in tpu_interactive/backend/ops/.")


def interpret(gm: torch.fx.GraphModule, rng_key, inputs: list, pallas: bool):
    """Evaluate the aten graph on jax values (tracers under jit). Returns (outputs, mutated inputs)."""
    ctx = GraphContext(rng_key, pallas)
    ctx.mutated = {}
    env: dict = {}
    feed = iter(inputs)
    placeholders = []
    for index, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            env[node] = next(feed)
            placeholders.append(node)
        elif node.op == "get_attr":
            env[node] = _constant(getattr(gm, node.target))
        elif node.op == "call_function":
            args = _map(node.args, env.__getitem__)
            kwargs = _map(node.kwargs, env.__getitem__)
            if isinstance(node.target, torch._ops.OpOverload):
                ctx.node, ctx.index = node, index
                try:
                    env[node] = handler(node.target)(ctx, *args, **kwargs)
                except (NotImplementedError, RuntimeError, TypeError, ValueError) as exc:
                    if qualified(node.target) in str(exc):
                        raise
                    raise type(exc)(f"{qualified(node.target)} (graph node {node.name}) failed in the "
                                    f"tpu compiler: {exc}") from exc
            else:  # operator.getitem, SymInt arithmetic: plain Python on concrete values
                env[node] = node.target(*args, **kwargs)
        elif node.op == "output":
            outputs = _map(node.args[0], env.__getitem__)
            mutated = [ctx.mutated.get(p) for p in placeholders]
            return outputs, mutated
        else:
            raise NotImplementedError(f"fx node kind {node.op!r} is not supported by the tpu compiler")
    raise RuntimeError("graph has no output node")
