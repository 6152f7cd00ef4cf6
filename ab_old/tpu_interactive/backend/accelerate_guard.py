"""Refuse Accelerate's multi-process runs on ``tpu`` instead of letting them train unsynchronized.

Accelerate (1.x) maps the current accelerator to a distributed type by name (``MULTI_GPU``,
``MULTI_XPU``, ...) and keeps those names in fixed lists throughout (DDP wrapping, barriers, RNG
synchronisation). A device it does not know gets ``DistributedType.NO`` even under torchrun with
``WORLD_SIZE=2``: ``PartialState`` then reports one process, ``prepare()`` wraps nothing in DDP, and
every rank trains on its own while the job looks healthy (measured: HF Trainer and ``Accelerator``
under ``tpu_interactive.launch``). That is a silent wrong result, so such a run stops at
``PartialState()`` with the reason and the ways that work: torch.distributed directly, or Accelerate
on one process. ``Accelerator(cpu=True)`` (gloo on CPU tensors) is left alone.

``notebook_launcher(fn, num_processes=N > 1)`` forks the notebook's process, which has already
started XLA (not fork-safe): its workers hung until killed (measured: no output in 90 s). It now
refuses at once and names ``tpu_interactive.launch``, which starts fresh worker processes.
"""
from __future__ import annotations

import functools
import os
import sys
from types import ModuleType

import torch

from .import_hooks import after_import

_MARK = "_tpu_interactive_guarded"


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _on_tpu() -> bool:
    device = torch.accelerator.current_accelerator()
    forced = os.environ.get("ACCELERATE_TORCH_DEVICE")
    return (torch.device(forced).type if forced else getattr(device, "type", None)) == "tpu"


def _guard(state_module: ModuleType) -> None:
    partial_state = getattr(state_module, "PartialState", None)
    original = getattr(partial_state, "_prepare_backend", None)
    if original is None or getattr(original, _MARK, False):
        return

    def _prepare_backend(self, cpu: bool = False, *args, **kwargs):
        backend, distributed_type = original(self, cpu, *args, **kwargs)
        if distributed_type == "NO" and not cpu and _world_size() > 1 and _on_tpu():
            import accelerate

            raise RuntimeError(
                f"Accelerate {accelerate.__version__} cannot run a {_world_size()}-process job on the 'tpu' "
                "device: it has no distributed type for it, so each process would train alone with no gradient "
                "synchronization. Use torch.distributed directly (dist.init_process_group('tpu') and "
                "DistributedDataParallel or fully_shard: docs/distributed.md), or run Accelerate in one process.")
        return backend, distributed_type

    setattr(_prepare_backend, _MARK, True)
    partial_state._prepare_backend = _prepare_backend


def _guard_launcher(launchers: ModuleType) -> None:
    original = getattr(launchers, "notebook_launcher", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def notebook_launcher(function, args=(), num_processes=None, *rest, **kwargs):
        if num_processes is not None and num_processes > 1 and _on_tpu():
            raise RuntimeError(
                f"notebook_launcher(num_processes={num_processes}) forks this process, which has already started "
                "XLA on 'tpu' (not fork-safe: the workers would hang). Use tpu_interactive.launch(fn, *args, "
                f"nprocs={num_processes}): fresh worker processes with torchrun's environment, output streamed "
                "here; inside fn use torch.distributed (Accelerate has no multi-process mode for tpu).")
        return original(function, args, num_processes, *rest, **kwargs)

    setattr(notebook_launcher, _MARK, True)
    launchers.notebook_launcher = notebook_launcher
    package = sys.modules.get("accelerate")
    if getattr(package, "notebook_launcher", None) is original:  # accelerate was imported before us
        package.notebook_launcher = notebook_launcher


def install() -> None:
    """Guard Accelerate's ``PartialState`` and ``notebook_launcher`` once Accelerate is imported
    (not importing it here)."""
    after_import("accelerate.state", _guard)
    after_import("accelerate.launchers", _guard_launcher)
