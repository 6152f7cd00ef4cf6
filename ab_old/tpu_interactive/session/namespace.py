"""Which of the user's variables are tensors or modules, and where they live (no IPython here).

A tpu tensor's device bytes are its storage's bytes (``t.untyped_storage().nbytes()``): views share
their base's storage, so live tensors are grouped by storage and every name of that storage is kept.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Mapping

import torch

_SKIP_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}


@dataclasses.dataclass
class Placement:
    name: str
    kind: str  # "tensor", "parameter" or "module"
    devices: tuple[str, ...]
    shape: str
    dtype: str
    nbytes: int
    requires_grad: bool

    @property
    def mixed(self) -> bool:
        return len(self.devices) > 1

    @property
    def device(self) -> str:
        return ", ".join(self.devices)


@dataclasses.dataclass
class LiveTensor:
    names: list[str]
    device: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    data_ptr: int = 0  # the storage's address (matches torch.tpu.memory snapshots' blocks)


def user_variables(ns: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in list(ns.items()):
        if name.startswith("_") or name in _SKIP_NAMES:
            continue
        yield name, value


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # sparse/nested/functional tensors have no plain storage
        return t.numel() * t.element_size()


def _tensor_placement(name: str, t: torch.Tensor) -> Placement:
    kind = "parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
    return Placement(name, kind, (str(t.device),), str(tuple(t.shape)), _dtype(t), storage_bytes(t),
                     bool(t.requires_grad))


def _module_placement(name: str, m: torch.nn.Module) -> Placement:
    tensors = list(m.parameters()) + list(m.buffers())
    devices = tuple(sorted({str(t.device) for t in tensors})) or ("(no parameters)",)
    dtypes = sorted({_dtype(t) for t in tensors})
    numel = sum(p.numel() for p in m.parameters())
    return Placement(name, "module", devices, f"{type(m).__name__}: {numel:,} params", "/".join(dtypes) or "-",
                     sum(storage_bytes(t) for t in tensors), any(p.requires_grad for p in m.parameters()))


def placements(ns: Mapping[str, Any]) -> list[Placement]:
    """The namespace's tensors and nn.Modules, sorted by name."""
    out = []
    for name, value in user_variables(ns):
        if isinstance(value, torch.Tensor):
            out.append(_tensor_placement(name, value))
        elif isinstance(value, torch.nn.Module):
            out.append(_module_placement(name, value))
    return sorted(out, key=lambda p: p.name)


def _named_tensors(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors reachable from one variable: itself, one level of list/tuple/dict, module
    parameters/buffers and optimizer state."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, torch.nn.Module):
        for pname, p in value.named_parameters():
            yield f"{name}.{pname}", p
            if p.grad is not None:
                yield f"{name}.{pname}.grad", p.grad
        for bname, b in value.named_buffers():
            yield f"{name}.{bname}", b
    elif isinstance(value, torch.optim.Optimizer):
        index = 0
        for group in value.param_groups:
            for p in group["params"]:
                for key, s in value.state.get(p, {}).items():
                    if isinstance(s, torch.Tensor):
                        yield f"{name}.state[{index}][{key!r}]", s
                index += 1
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:256]):
            if isinstance(v, torch.Tensor):
                yield f"{name}[{i}]", v
    elif isinstance(value, dict):
        for k, v in list(value.items())[:256]:
            if isinstance(v, torch.Tensor):
                yield f"{name}[{k!r}]", v


def live_tensors(ns: Mapping[str, Any], device_type: str = "tpu") -> list[LiveTensor]:
    """Device tensors reachable from the namespace, one entry per storage, largest first."""
    by_storage: dict[int, LiveTensor] = {}
    for var, value in user_variables(ns):
        for name, t in _named_tensors(var, value):
            if t.device.type != device_type:
                continue
            key = t.untyped_storage().data_ptr()
            entry = by_storage.get(key)
            if entry is None:
                by_storage[key] = LiveTensor([name], str(t.device), tuple(t.shape), _dtype(t), storage_bytes(t), key)
            elif name not in entry.names:
                entry.names.append(name)
                if t.numel() > math.prod(entry.shape):  # show the base's shape, not a view's
                    entry.shape, entry.dtype = tuple(t.shape), _dtype(t)
    return sorted(by_storage.values(), key=lambda e: (-e.nbytes, e.names[0]))
