"""``torch.compile(model, backend="tpu")``: aten FX graphs -> ONE ``jax.jit``-ed function each.

Pipeline:
1. dynamo captures a torch-level graph; ``aot_autograd`` traces it (with torch._decomp
   decompositions for every op we have no lowering for) into functional aten forward/backward
   graphs, so ``loss.backward()`` works;
2. each aten graph becomes a :class:`CompiledGraph`: a Python interpreter over the graph that calls
   the SAME lowerings as eager (``registry.LOWERINGS[op].fn``, with eager's ``promote=`` casting and
   outputs cast to torch's dtypes) on jax tracers, plus functional versions of the views, factories,
   copies and RNG ops (those are ``raw`` in eager, i.e. they work on torch tensors);
3. at call time the jax arrays of the tpu inputs (``storage.read``) go through ``jax.jit`` of that
   interpreter; results become tpu tensors again.

Randomness: every call draws one key from ``rng.default_generator`` (so ``torch.manual_seed``
reproduces compiled runs) and passes it to the jitted function as an explicit input; each random
node folds its own index into it.

Compile cache: one entry per (graph, input shapes/dtypes, non-tensor inputs, pallas flag, sync
flag). Every miss and hit is recorded with ``stats.record_compile`` (``%tpu compiles``); a miss says
why it recompiled compared with the previous compile of the same graph family (which input's shape
or dtype changed, or which flag). ``clear_cache()`` drops every entry. JAX's persistent compilation
cache (on by default; ``config.persistent_cache_dir``, env ``TPU_INTERACTIVE_CACHE_DIR``) is in compile_log.py.

Unsupported ops: an aten op with neither a (non-raw) lowering, a functional version here, nor a
torch._decomp decomposition raises ``NotImplementedError`` naming the op when the graph is compiled
(dynamo reports it as a backend failure; it does not graph-break). Data-dependent ops (``nonzero``,
``.item()``) already graph-break in dynamo and run eagerly.
"""
from __future__ import annotations

from ..compile_log import disable_persistent_cache, follow_persistent_cache_config
from .dynamo import compile, install_dynamo_hook, register_dynamo_backend, tpu_backend  # noqa: A004
from .functional import FUNCTIONAL, RANDOM, functional, op_key
from .graph import CompiledGraph, clear_cache
from .interpreter import interpret
from .lowerings import decompositions, handler

__all__ = ["CompiledGraph", "FUNCTIONAL", "RANDOM", "clear_cache", "compile", "decompositions",
           "disable_persistent_cache", "follow_persistent_cache_config", "functional", "handler", "install_dynamo_hook",
           "interpret", "op_key", "register_dynamo_backend", "tpu_backend"]
