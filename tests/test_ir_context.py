"""ir_context: the backend's lowerings reuse one MLIR context per thread, and a module compiled on
another thread (compile ahead) is parsed into that thread's own context first."""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest
import torch
from helpers import TPU, assert_same

from tpu_interactive.backend import compile_ahead, ir_context, op_jit, program_store


def _lower(fn, *args):
    with ir_context.reused():
        return jax.jit(fn).lower(*args)


def test_lowerings_in_a_block_share_this_threads_context_and_nested_ones_do_not():
    x = jnp.arange(6.0)
    first, second = _lower(lambda v: v * 2, x), _lower(lambda v: v - 1, x)
    assert first._lowering._hlo.context is second._lowering._hlo.context
    plain = jax.jit(lambda v: v + 3).lower(x)  # outside the block: jax's own fresh context
    assert plain._lowering._hlo.context is not first._lowering._hlo.context
    from jax._src.interpreters import mlir

    with ir_context.reused():
        offered = mlir.make_ir_context()
        nested = mlir.make_ir_context()  # a lowering inside that lowering (a Pallas kernel's)
    assert offered is first._lowering._hlo.context and nested is not offered
    assert [float(v) for v in first.compile()(x)] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert [float(v) for v in second.compile()(x)] == [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_context_is_replaced_after_its_quota_of_lowerings(monkeypatch):
    monkeypatch.setattr(ir_context, "_REUSES", 2)
    x = jnp.arange(3.0)
    contexts = [_lower(lambda v, k=k: v * k, x) for k in range(5)]
    distinct = {id(lowered._lowering._hlo.context) for lowered in contexts}
    assert len(distinct) >= 3
    for k, lowered in enumerate(contexts):
        assert [float(v) for v in lowered.compile()(x)] == [0.0, float(k), 2.0 * k]


def test_a_detached_module_compiles_in_the_compiling_threads_context_and_the_original_is_untouched():
    x = jnp.arange(4.0)
    lowered = _lower(lambda v: jnp.sin(v) * 3, x)
    bytecode = ir_context.detach(lowered)
    made: dict = {}

    def compile_elsewhere():
        moved = ir_context.attach(lowered, bytecode)
        made["context"] = moved._lowering._hlo.context
        made["out"] = moved.compile()(x)

    worker = threading.Thread(target=compile_elsewhere)
    worker.start()
    worker.join()
    assert made["context"] is not lowered._lowering._hlo.context
    assert lowered._lowering._hlo is not None and lowered._lowering._executable is None  # jax's object as it was
    assert jnp.allclose(made["out"], jnp.sin(x) * 3)
    assert jnp.allclose(lowered.compile()(x), made["out"])  # and it still compiles here


@pytest.mark.eager_only  # compile ahead defers plain eager's cold calls only
def test_compile_ahead_never_compiles_a_module_of_the_lowering_threads_context(monkeypatch):
    monkeypatch.setattr(program_store, "directory", lambda: None)  # cold: nothing found on disk
    compiled_in: list = []
    store = program_store.compile_and_store

    def recording(lowered, path):
        compiled_in.append((threading.current_thread(), lowered._lowering._hlo.context))
        return store(lowered, path)

    monkeypatch.setattr(program_store, "compile_and_store", recording)
    lowering_contexts: list = []
    offer = ir_context._thread_context

    def noting():
        context = offer()
        lowering_contexts.append((threading.current_thread(), context))
        return context

    monkeypatch.setattr(ir_context, "_thread_context", noting)
    cpu = torch.randn(5, 37)
    x = cpu.to(TPU)
    y = (x.cosh() * 2).expm1().sum(0)  # cold programs: lowered here, compiled on the pool's threads
    assert_same(y, (cpu.cosh() * 2).expm1().sum(0), rtol=1e-4, atol=1e-4)
    torch.tpu.synchronize()
    compile_ahead.wait_for_compiles()
    background = [(thread, context) for thread, context in compiled_in if thread is not threading.current_thread()]
    assert len(background) >= 3
    here = {id(context) for thread, context in lowering_contexts if thread is threading.current_thread()}
    assert here and not {id(context) for _, context in background} & here


def test_an_op_program_lowers_in_the_reused_context(monkeypatch):
    monkeypatch.setattr(program_store, "directory", lambda: None)
    offered: list = []
    offer = ir_context._thread_context
    monkeypatch.setattr(ir_context, "_thread_context", lambda: offered.append(1) or offer())
    program = op_jit.Program(lambda v: v * 5 + 1, lambda v: v * 5 + 1)
    assert [float(v) for v in program(jnp.arange(3.0))] == [1.0, 6.0, 11.0]
    assert offered
