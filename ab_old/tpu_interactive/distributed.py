"""Sharding tpu tensors over a device mesh: tensor parallelism by XLA SPMD, no communication layer.

A tpu tensor's data is one ``jax.Array`` (its storage's ``DeviceBuffer``). Sharding a tensor means
re-placing that array with ``jax.device_put(array, NamedSharding(mesh, PartitionSpec(*spec)))``, in
place: the torch tensor keeps its identity (an ``nn.Parameter`` stays the same Parameter, optimizers
and hooks still hold it), only where its bytes live changes. Every later eager op is a jax call on
sharded inputs, and jax/XLA propagate the shardings and insert the collectives (all-gather,
reduce-scatter, all-reduce) themselves - the same SPMD engine that runs multi-host TPU pod slices
after ``jax.distributed.initialize()``.

    import tpu_interactive.distributed as dist
    m = dist.mesh((2, 4))                        # axes ("data", "model") over jax.devices()
    dist.tensor_parallel(model, m, {"*.up_proj": "colwise", "*.down_proj": "rowwise"})
    dist.shard(batch, m, ("data", None))         # data parallel over the other axis
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import weakref
from typing import Iterable, Mapping, Sequence

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .backend import dtypes, storage

__all__ = ["mesh", "shard", "unshard", "replicate", "from_process_local", "sharding_of", "placement", "TensorParallelConfig",
           "tensor_parallel", "LLAMA_PLAN", "GPT2_PLAN", "BERT_PLAN"]

STYLES = ("colwise", "rowwise", "replicate")


# ---------------------------------------------------------------- meshes
def mesh(shape: Sequence[int] | None = None, axis_names: Sequence[str] = ("data", "model"),
         devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``jax.sharding.Mesh`` over ``devices`` (default: all of ``jax.devices()``, every host's).

    ``shape=None`` puts every device on the last axis (pure tensor parallelism: ``(1, n)`` for the
    default axes). One dimension may be ``-1`` (inferred). On TPU the device order follows the
    physical interconnect (``mesh_utils.create_device_mesh``) so neighbouring shards are linked.
    """
    devices = list(jax.devices() if devices is None else devices)
    axis_names = tuple(axis_names)
    n = len(devices)
    if shape is None:
        shape = (1,) * (len(axis_names) - 1) + (n,)
    shape = _infer_shape(tuple(int(s) for s in shape), n)
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} has {len(shape)} axes but axis_names {axis_names} has "
                         f"{len(axis_names)}")
    if math.prod(shape) != n:
        raise ValueError(f"mesh shape {shape} needs {math.prod(shape)} devices, there are {n} "
                         f"({devices[0].platform}); on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
                         "(set before jax starts) simulates N devices")
    return Mesh(_device_grid(shape, devices), axis_names)


def _infer_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one dimension may be -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or n % known:
            raise ValueError(f"mesh shape {shape} does not divide the {n} devices")
        shape = tuple(n // known if s == -1 else s for s in shape)
    return shape


def _device_grid(shape, devices) -> np.ndarray:
    if devices[0].platform == "tpu":
        try:
            from jax.experimental import mesh_utils

            return mesh_utils.create_device_mesh(shape, devices)
        except (ValueError, NotImplementedError, AssertionError):
            pass  # a sub-slice or odd shape the topology helper can't map: plain order still works
    return np.array(devices, dtype=object).reshape(shape)


# ---------------------------------------------------------------- placing tensors
def _owned_buffer(t: torch.Tensor) -> storage.DeviceBuffer:
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"shard() needs a tpu tensor, got {where}; move it first with .to('tpu')")
    buf = storage.buffer_of(t)
    if not (t.storage_offset() == 0 and tuple(t.shape) == buf.shape and t.is_contiguous()):
        raise ValueError(
            f"shard(): the {tuple(t.shape)} tensor is a view of a {buf.shape} buffer; sharding is a property "
            "of the whole buffer - shard its base tensor, or shard t.clone()")
    return buf


def _spec(spec, ndim: int, mesh_: Mesh) -> PartitionSpec:
    if isinstance(spec, PartitionSpec):
        entries = tuple(spec)
    elif spec is None:
        entries = ()
    else:
        entries = tuple(spec)
    if len(entries) > ndim:
        raise ValueError(f"partition spec {entries} has {len(entries)} entries for a {ndim}-dim tensor")
    for entry in entries:
        for name in (entry if isinstance(entry, tuple) else (entry,)):
            if name is not None and name not in mesh_.axis_names:
                raise ValueError(f"partition spec {entries} names axis {name!r}; the mesh axes are "
                                 f"{mesh_.axis_names}")
    return PartitionSpec(*entries)


def _check_divisible(shape, pspec: PartitionSpec, mesh_: Mesh) -> None:
    for dim, entry in enumerate(pspec):
        names = entry if isinstance(entry, tuple) else (entry,)
        parts = math.prod(mesh_.shape[n] for n in names if n is not None)
        if parts > 1 and shape[dim] % parts:
            raise ValueError(f"dim {dim} of size {shape[dim]} can't be split evenly over {parts} devices "
                             f"(mesh axes {names}); pick a size divisible by {parts} or replicate it")


# A sharded buffer keeps its placement across writes (optimizer steps, load_state_dict, copy_, the CPU
# fallback write-back), like a DTensor's placement: its class becomes _PinnedBuffer, whose ``array``
# setter re-places any value that arrives with another sharding. Unsharded buffers are untouched.
_ARRAY_SLOT = storage.DeviceBuffer.__dict__["array"]
_PINNED: "weakref.WeakKeyDictionary[storage.DeviceBuffer, NamedSharding]" = weakref.WeakKeyDictionary()


class _PinnedBuffer(storage.DeviceBuffer):
    __slots__ = ()  # same layout as DeviceBuffer, so a live buffer can switch class in place

    @property
    def array(self):
        return _ARRAY_SLOT.__get__(self, type(self))

    @array.setter
    def array(self, value):
        sharding = _PINNED.get(self)
        # a fused-mode Lazy is placed when it is resolved (it comes back through this setter)
        if (sharding is not None and value is not None and not isinstance(value, (jax.core.Tracer, storage.fusion.Lazy))
                and value.sharding != sharding):
            value = jax.device_put(value, sharding)
        _ARRAY_SLOT.__set__(self, value)


def _pin(buf: storage.DeviceBuffer, sharding: NamedSharding | None) -> None:
    if sharding is None:
        _PINNED.pop(buf, None)
        buf.__class__ = storage.DeviceBuffer
    else:
        _PINNED[buf] = sharding
        buf.__class__ = _PinnedBuffer


def shard(tensor: torch.Tensor, mesh: Mesh, spec=None) -> torch.Tensor:
    """Re-place tpu ``tensor`` over ``mesh`` per ``spec`` (one mesh axis name, a tuple of names, or
    None per dim; missing trailing dims are replicated), in place. Returns ``tensor`` itself.

    ``shard(w, m, ("model", None))`` splits dim 0 of ``w`` over the mesh's "model" axis and keeps a
    copy of each piece on every device along the other axes. The value is unchanged; later ops on
    it run sharded (XLA SPMD) and their results come out sharded as XLA propagates the layout.
    """
    buf = _owned_buffer(tensor)
    pspec = _spec(spec, tensor.dim(), mesh)
    _check_divisible(tuple(tensor.shape), pspec, mesh)
    sharding = NamedSharding(mesh, pspec)
    _pin(buf, sharding)
    buf.array = jax.device_put(buf.value(), sharding)
    return tensor


def unshard(tensor: torch.Tensor, device: jax.Device | None = None) -> torch.Tensor:
    """Gather a sharded tensor back onto one device (default: ``jax.devices()[0]``), in place."""
    buf = _owned_buffer(tensor)
    _pin(buf, None)
    buf.array = jax.device_put(buf.value(), device or jax.devices()[0])
    return tensor


def from_process_local(local: torch.Tensor, mesh: Mesh, spec=("data",)) -> torch.Tensor:
    """A new tpu tensor assembled from every process's ``local`` piece (multi-host input pipelines).

    On a pod slice each host loads only its part of the batch; ``spec`` says which dims the pieces
    are stacked along (default: dim 0 over "data"). The result's dim 0 is ``local``'s times the
    number of processes sharing that axis. With one process it equals ``shard(local.to('tpu'), ...)``.
    """
    if local.device.type == "tpu":
        host = np.asarray(storage.read(local))
    else:
        host = dtypes.torch_to_numpy(local.detach().contiguous())
    sharding = NamedSharding(mesh, _spec(spec, local.dim(), mesh))
    array = jax.make_array_from_process_local_data(sharding, host)
    out = storage.from_array(array, local.dtype)
    _pin(storage.buffer_of(out), sharding)
    return out


def replicate(tensor: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """A full copy of ``tensor`` on every device of ``mesh`` (in place, like ``shard``)."""
    return shard(tensor, mesh, ())


def sharding_of(tensor: torch.Tensor) -> jax.sharding.Sharding:
    """The ``jax.sharding.Sharding`` of tpu ``tensor``'s buffer (SingleDeviceSharding if unsharded)."""
    if tensor.device.type != "tpu":
        raise TypeError(f"sharding_of() needs a tpu tensor, got one on {tensor.device}")
    return storage.buffer_of(tensor).value().sharding


def placement(tensor: torch.Tensor) -> dict:
    """Where ``tensor``'s bytes live, for display: spec, mesh, and per-device shard shape and bytes."""
    array = storage.buffer_of(tensor).value()
    sharding = array.sharding
    shards = [{"device": str(s.device), "index": _fmt_index(s.index, array.shape),
               "shape": tuple(s.data.shape), "nbytes": int(s.data.nbytes)} for s in array.addressable_shards]
    info = {"shape": tuple(array.shape), "dtype": str(tensor.dtype), "nbytes": int(array.nbytes),
            "devices": len(sharding.device_set), "fully_replicated": bool(sharding.is_fully_replicated),
            "shards": shards}
    if isinstance(sharding, NamedSharding):
        info["spec"] = tuple(sharding.spec)
        info["mesh"] = dict(sharding.mesh.shape)
    return info


def _fmt_index(index, shape) -> str:
    parts = []
    for sl, size in zip(index, shape):
        start, stop, _ = sl.indices(size)
        parts.append(":" if (start, stop) == (0, size) else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


# ---------------------------------------------------------------- tensor parallelism
LLAMA_PLAN = {
    "*.self_attn.q_proj": "colwise", "*.self_attn.k_proj": "colwise", "*.self_attn.v_proj": "colwise",
    "*.self_attn.o_proj": "rowwise",
    "*.mlp.gate_proj": "colwise", "*.mlp.up_proj": "colwise", "*.mlp.down_proj": "rowwise",
    "*embed_tokens": "rowwise", "lm_head": "colwise",
}
"""Megatron-style plan for Llama-family models (also Mistral, Qwen2): heads and MLP split over "model"."""

GPT2_PLAN = {"*.attn.c_attn": "colwise", "*.attn.c_proj": "rowwise", "*.mlp.c_fc": "colwise",
             "*.mlp.c_proj": "rowwise", "*.wte": "rowwise", "lm_head": "colwise"}
"""Plan for GPT-2 (its projections are transformers' Conv1D, weight stored (in, out))."""

BERT_PLAN = {"*.attention.self.query": "colwise", "*.attention.self.key": "colwise",
             "*.attention.self.value": "colwise", "*.attention.output.dense": "rowwise",
             "*.intermediate.dense": "colwise", "*.output.dense": "rowwise"}
"""Plan for BERT encoders. ``*.output.dense`` also matches ``attention.output.dense`` (rowwise too)."""


@dataclasses.dataclass
class TensorParallelConfig:
    """How ``tensor_parallel`` splits a model.

    plan: module-name glob pattern (``fnmatch``, matched against ``model.named_modules()`` names)
        -> "colwise" | "rowwise" | "replicate". The first matching pattern wins.
    axis: the mesh axis the weights are split over.
    replicate_rest: also put every parameter/buffer no pattern matched on all mesh devices (a full
        copy each), so every op's inputs live on the mesh.
    """

    plan: Mapping[str, str]
    axis: str = "model"
    replicate_rest: bool = True

    def __post_init__(self):
        for pattern, style in self.plan.items():
            if style not in STYLES:
                raise ValueError(f"plan entry {pattern!r}: style {style!r} is not one of {STYLES}")

    def style_of(self, name: str) -> str | None:
        for pattern, style in self.plan.items():
            if fnmatch.fnmatchcase(name, pattern):
                return style
        return None


def _weight_specs(module: torch.nn.Module, style: str, axis: str) -> dict[str, tuple]:
    """Parameter name -> partition spec for one module of a supported kind."""
    if style == "replicate":
        return {name: () for name, _ in module.named_parameters(recurse=False)}
    kind = type(module).__name__
    if isinstance(module, torch.nn.Linear):  # weight (out, in): colwise splits out, rowwise splits in
        weight = (axis, None) if style == "colwise" else (None, axis)
        bias = (axis,) if style == "colwise" else ()
    elif kind == "Conv1D" and hasattr(module, "nf"):  # transformers' GPT-2 projection, weight (in, out)
        weight = (None, axis) if style == "colwise" else (axis, None)
        bias = (axis,) if style == "colwise" else ()
    elif isinstance(module, torch.nn.Embedding):  # weight (num, dim): like torch's TP, rowwise splits the vocab
        weight = (None, axis) if style == "colwise" else (axis, None)
        bias = ()
    else:
        raise TypeError(f"tensor_parallel: {kind} can't be split {style}; only nn.Linear, nn.Embedding and "
                        "transformers' Conv1D can (or use 'replicate')")
    specs = {"weight": weight}
    if getattr(module, "bias", None) is not None:
        specs["bias"] = bias
    return specs


def tensor_parallel(model: torch.nn.Module, mesh: Mesh,
                    plan: TensorParallelConfig | Mapping[str, str]) -> dict[str, tuple]:
    """Shard ``model``'s (tpu) weights per ``plan`` over ``mesh``, in place; returns name -> spec.

    Column-parallel ("colwise") splits a Linear's output features, row-parallel ("rowwise") its input
    features, so a colwise -> rowwise pair (attention q/k/v -> o, MLP up -> down) needs only one
    all-reduce, which XLA inserts. The model's forward code is unchanged.
    """
    config = plan if isinstance(plan, TensorParallelConfig) else TensorParallelConfig(dict(plan))
    if config.axis not in mesh.axis_names:
        raise ValueError(f"tensor_parallel: axis {config.axis!r} is not a mesh axis {mesh.axis_names}")
    applied: dict[str, tuple] = {}
    matched = set()
    for name, module in model.named_modules():
        style = config.style_of(name)
        if style is None:
            continue
        matched.add(name)
        for pname, spec in _weight_specs(module, style, config.axis).items():
            param = getattr(module, pname)
            full = f"{name}.{pname}" if name else pname
            if full in applied:  # tied weights (lm_head = embeddings): keep the first placement
                continue
            _require_tpu(param, full)
            shard(param, mesh, spec)
            applied[full] = spec
    unused = [p for p in config.plan if not any(fnmatch.fnmatchcase(n, p) for n in matched)]
    if unused:
        raise ValueError(f"tensor_parallel: plan patterns {unused} match no module of {type(model).__name__}")
    if config.replicate_rest:
        placed = {id(model.get_parameter(name)) for name in applied}
        for full, tensor in _named_tensors(model):
            if id(tensor) in placed or not _owns_buffer(tensor):
                continue  # views (e.g. expanded position ids) stay as they are: jax moves them as needed
            _require_tpu(tensor, full)
            replicate(tensor, mesh)
    return applied


def _owns_buffer(t: torch.Tensor) -> bool:
    if t.device.type != "tpu":
        return True  # let _require_tpu report it
    buf = storage.buffer_of(t)
    return t.storage_offset() == 0 and tuple(t.shape) == buf.shape and t.is_contiguous()


def _named_tensors(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if b is not None)


def _require_tpu(t: torch.Tensor, name: str) -> None:
    if t.device.type != "tpu":
        raise TypeError(f"tensor_parallel: {name} is on {t.device}; call model.to('tpu') first")
