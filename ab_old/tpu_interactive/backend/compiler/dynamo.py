"""The dynamo backend ``"tpu"`` (``torch.compile(model, backend="tpu")``) and its lazy registration."""
from __future__ import annotations

import enum
import hashlib

import torch

from ..import_hooks import after_import
from .graph import CompiledGraph
from .lowerings import decompositions


_family_ids: dict = {}


def _graph_family(gm: torch.fx.GraphModule) -> tuple:
    """Identity of a captured graph that survives recompiles for new shapes (for recompile causes)."""
    ops = tuple(str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    frame = None
    try:
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
        frame = getattr(compile_id, "frame_id", None)
    except Exception:  # noqa: BLE001 - naming only
        pass
    digest = hashlib.sha1(repr(ops).encode()).hexdigest()[:12]
    family = (frame, digest)
    _family_ids.setdefault(family, len(_family_ids))
    return family


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend: ``torch.compile(model, backend="tpu")``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    # torch.compile(mode=..., options=...) are inductor tuning knobs (callers such as Transformers'
    # generate() pass them to any backend); jax.jit has no equivalent, so they are accepted and ignored
    kwargs.pop("mode", None)
    kwargs.pop("options", None)
    family = _graph_family(gm)
    label = f"graph{_family_ids[family]}"
    # dynamo's placeholder names, e.g. l_x_ / l_self_modules_fc_parameters_weight_ -> x / ..._weight
    names = [n.name.removeprefix("l_").rstrip("_") or n.name for n in gm.graph.nodes if n.op == "placeholder"]

    def compiler(kind):
        def compile_graph(aot_gm, aot_inputs):
            input_names = names if kind != "bw" else []
            return CompiledGraph(aot_gm, family + (kind,), f"{label}.{kind}", input_names)

        return compile_graph

    # Input mutations (optimizer steps, buffers) stay in the graph and are written back by
    # CompiledGraph (no copy_ dispatch per tensor); the min-cut partitioner recomputes cheap values
    # (weight transposes, views) in the backward instead of saving them: fewer outputs to wrap.
    backend = aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                           inference_compiler=compiler("inference"), decompositions=decompositions(),
                           keep_inference_input_mutations=True,
                           partition_fn=min_cut_rematerialization_partition, **kwargs)
    return backend(gm, example_inputs)


def compile(model_or_fn=None, **kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile`` with the tpu backend and static shapes (a new input shape recompiles)."""
    kwargs.setdefault("dynamic", False)
    if model_or_fn is None:
        return lambda fn: torch.compile(fn, backend=tpu_backend, **kwargs)
    return torch.compile(model_or_fn, backend=tpu_backend, **kwargs)


# ---------------------------------------------------------------- register "tpu" with dynamo lazily
def _register(registry_module) -> None:
    if "tpu" not in registry_module._BACKENDS:
        registry_module.register_backend(compiler_fn=tpu_backend, name="tpu")


def register_dynamo_backend() -> None:
    """``torch.compile(backend="tpu")``; imports dynamo (~1.5 s), so the import itself only hooks it."""
    from torch._dynamo.backends import registry

    _register(registry)


def _add_enum_member(enum_cls: type[enum.Enum], name: str, value: str) -> None:
    """A member ``name = value`` on an existing ``str`` enum: lookup by value, by name and iteration
    see it, as if it had been declared."""
    if value in enum_cls._value2member_map_:
        return
    member = str.__new__(enum_cls, value)
    member._name_, member._value_ = name, value
    member._sort_order_ = len(enum_cls._member_names_)
    type.__setattr__(enum_cls, name, member)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)


def _allow_tpu_in_accelerate(dataclasses_module) -> None:
    """Accelerate checks a dynamo backend's name against its fixed ``DynamoBackend`` enum, so
    ``TrainingArguments(torch_compile_backend="tpu")`` / ``Accelerator(dynamo_backend="tpu")`` would be
    refused before ``torch.compile`` ever sees the registered name; add it to the enum."""
    backends = getattr(dataclasses_module, "DynamoBackend", None)
    if isinstance(backends, enum.EnumMeta) and issubclass(backends, str):
        _add_enum_member(backends, "TPU", "TPU")


def install_dynamo_hook() -> None:
    after_import("torch._dynamo.backends.registry", _register)
    after_import("accelerate.utils.dataclasses", _allow_tpu_in_accelerate)
