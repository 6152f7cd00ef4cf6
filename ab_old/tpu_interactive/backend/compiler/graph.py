"""The compiled graphs' runtime: one ``jax.jit`` function per (graph, input signature, flags), its
cache and recompile causes, and the calls (inputs read from their buffers, mutations written back)."""
from __future__ import annotations

import hashlib
import time

import jax
import numpy as np
import torch

from .. import dispatch, dtypes, graph_checks, storage
from ..compile_log import follow_persistent_cache_config
from ..config import config
from ..rng import default_generator
from ..stats import record_compile
from .collectives import SPMD, TRACED, signature
from .functional import RANDOM, op_key
from .interpreter import check_supported, interpret


_CACHE: dict = {}
_LAST: dict = {}  # graph family -> (signature, flags, input names) of its latest compile


def clear_cache() -> None:
    """Forget every compiled executable (the next call of each compiled graph recompiles)."""
    _CACHE.clear()
    _LAST.clear()


def _describe(sig) -> str:
    if isinstance(sig, tuple) and len(sig) == 2 and isinstance(sig[1], torch.dtype):
        return f"{tuple(sig[0])} {str(sig[1]).replace('torch.', '')}"
    return repr(sig)


def _cause(family, sig, flags, names) -> str:
    last = _LAST.get(family)
    if last is None:
        return "first compile"
    old_sig, old_flags = last
    changes = []
    for name, old, new in zip(("pallas", "sync"), old_flags, flags):
        if old != new:
            changes.append(f"{name} flag {old} -> {new}")
    if len(old_sig) != len(sig):
        changes.append(f"number of inputs {len(old_sig)} -> {len(sig)}")
    else:
        for i, (old, new) in enumerate(zip(old_sig, sig)):
            if old != new:
                what = "shape" if isinstance(old, tuple) and isinstance(new, tuple) and old[1:] == new[1:] else \
                    "dtype" if isinstance(old, tuple) and isinstance(new, tuple) and old[0] == new[0] else "value"
                changes.append(f"input {i} ({names[i]}) {what} {_describe(old)} -> {_describe(new)}")
    return "; ".join(changes) or "graph changed (same inputs)"


class _Entry:
    __slots__ = ("fn", "tensor_out", "static_out", "has_mutation", "has_checks", "collectives")

    def __init__(self):
        self.fn = None
        self.tensor_out = None
        self.static_out = None
        self.has_mutation = False
        self.has_checks = False
        self.collectives = None  # hash of the collectives a graph with some traced (compiler/collectives.py)


class CompiledGraph:
    """A boxed callable (aot_autograd convention) running one aten graph as one jitted function."""

    _boxed_call = True  # also set per instance: functools.wraps (dynamo.disable) copies __dict__

    @property
    def compile_label(self) -> str:  # names this graph's XLA compiles in compile_log
        return f"torch.compile graph {self.name}"

    def __init__(self, gm: torch.fx.GraphModule, family, name: str, input_names: list[str]):
        check_supported(gm)
        self._boxed_call = True
        self.cause_override: str | None = None  # set by callers that know why this graph was (re)built
        self.gm = gm
        self.family, self.name = family, name
        self.code = hashlib.sha1(gm.code.encode()).hexdigest()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.input_names = [input_names[i] if i < len(input_names) else n.name for i, n in enumerate(placeholders)]
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        outs = output.args[0]
        self.out_nodes = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        index = {n: i for i, n in enumerate(placeholders)}
        # outputs that ARE inputs are returned as the input tensor itself (no new buffer)
        self.passthrough = [index.get(n) if isinstance(n, torch.fx.Node) else None for n in self.out_nodes]
        self.out_vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in self.out_nodes]
        self.spmd = SPMD.of(gm)  # functional collectives: one program over the process group's mesh
        self.uses_rng = any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                            and op_key(n.target) in RANDOM for n in gm.graph.nodes)

    # -- signature of one call
    def _split(self, args):
        """The inputs' jax arrays (None for non-tensors) and the call's cache signature."""
        arrays, sig = [], []
        read = storage.read
        for a in args:
            if isinstance(a, torch.Tensor):
                arrays.append(read(a) if a.device.type == "tpu" else dispatch.cpu_to_jax(a))
                sig.append((a.shape, a.dtype))  # torch.Size is a hashable tuple
            else:
                arrays.append(None)
                sig.append(a if not isinstance(a, torch.SymInt) else int(a))
        return arrays, tuple(sig)

    def _build(self, sig, flags) -> _Entry:
        entry = _Entry()
        pallas = flags[0]
        statics = {i: s for i, s in enumerate(sig) if not (isinstance(s, tuple) and len(s) == 2
                                                          and isinstance(s[1], torch.dtype))}
        gm = self.gm

        def run(rng_key, arrays):
            inputs = [statics[i] if i in statics else arrays[i] for i in range(len(sig))]
            checks_before, collectives_before = graph_checks.traced_checks[0], len(TRACED)
            outputs, mutated = interpret(gm, rng_key, inputs, pallas)
            entry.collectives = signature(TRACED[collectives_before:])
            del TRACED[collectives_before:]
            is_array = [isinstance(o, jax.Array) for o in outputs]
            entry.tensor_out = is_array
            entry.static_out = [None if a else o for a, o in zip(is_array, outputs)]
            entry.has_mutation = any(m is not None for m in mutated)
            entry.has_checks = graph_checks.traced_checks[0] != checks_before
            return [o for o, a in zip(outputs, is_array) if a], mutated

        checked = graph_checks.checkified(run)
        # in an SPMD program each rank checks its own values (checkify's error codes are per process)
        entry.fn = jax.jit(checked if self.spmd is None else self.spmd.program(checked))
        return entry

    def _run(self, entry: _Entry, rng_key, arrays):
        if self.spmd is None:
            return entry.fn(rng_key, arrays)
        inputs = self.spmd.inputs(rng_key, arrays)
        if entry.collectives is None:  # not traced yet: trace (jit keeps it) to learn its collectives
            entry.fn.trace(*inputs)
        self.spmd.check(entry.collectives)  # ranks about to run other collectives fail instead of hanging
        return self.spmd.outputs(entry.fn(*inputs))

    def __call__(self, *args):
        # boxed (one list, which we may empty) or, when dynamo wraps us (backward), unboxed
        boxed = len(args) == 1 and isinstance(args[0], list)
        args = args[0] if boxed else list(args)
        arrays, sig = self._split(args)
        flags = (bool(config.pallas), bool(config.sync))
        key = (self.code, sig, flags)
        entry = _CACHE.get(key)
        rng_key = default_generator.next_key() if self.uses_rng else _ZERO_KEY()
        if entry is None:
            cause = self.cause_override or _cause(self.family, sig, flags, self.input_names)
            self.cause_override = None
            follow_persistent_cache_config()
            entry = self._build(sig, flags)
            start = time.perf_counter()
            failed, (results, mutated) = self._run(entry, rng_key, arrays)
            seconds = time.perf_counter() - start
            _CACHE[key] = entry
            _LAST[self.family] = (sig, flags)
            record_compile(self.name, cause, seconds, False)
        else:
            record_compile(self.name, "cache hit", 0.0, True)
            failed, (results, mutated) = self._run(entry, rng_key, arrays)
        if entry.has_checks:  # before any mutation is written back: a failed call changes nothing
            graph_checks.raise_if_failed(failed)
        if entry.has_mutation:
            for tensor, value in zip(args, mutated):
                if value is None:
                    continue
                if tensor.device.type == "tpu":
                    storage.write(tensor, value)
                else:  # a host input the graph updates (e.g. Adam's CPU step counter)
                    tensor.copy_(dtypes.numpy_to_torch(np.asarray(value), tensor.dtype))
        outputs = self._wrap(args, results, entry)
        if flags[1]:
            jax.block_until_ready(results)
        if boxed:
            args.clear()  # boxed convention: let the inputs die as early as possible
        return outputs

    def _wrap(self, args, results, entry):
        it = iter(results)
        outputs = []
        for i, is_array in enumerate(entry.tensor_out):
            if not is_array:
                outputs.append(entry.static_out[i])
                continue
            array = next(it)
            source = self.passthrough[i]
            if source is not None and isinstance(args[source], torch.Tensor):
                outputs.append(args[source])
                continue
            val = self.out_vals[i]
            dtype = val.dtype if isinstance(val, torch.Tensor) else dtypes.to_torch(array.dtype)
            if isinstance(val, torch.Tensor) and val.device.type == "cpu":
                outputs.append(dtypes.numpy_to_torch(np.asarray(array), dtype))
            else:
                outputs.append(storage.new_tensor(array, array.shape, dtype))
        return outputs


_zero_key: list = []


def _ZERO_KEY():
    if not _zero_key:
        _zero_key.append(jax.random.key(0))
    return _zero_key[0]
