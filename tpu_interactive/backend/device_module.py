"""``torch.tpu``: the device module torch looks up for the renamed PrivateUse1 backend.

Mirrors the ``torch.cuda`` functions notebook users reach for: device_count, synchronize,
manual_seed(_all), get/set_rng_state, memory_allocated/max_memory_allocated/memory_stats.
"""
from __future__ import annotations

import gc
from typing import Any

import jax
import torch

from . import memory_history as memory  # noqa: F401  torch.tpu.memory._record_memory_history/_snapshot
from . import stats
from .rng import default_generator


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def current_device() -> int:
    return 0


def device_count() -> int:
    # One torch device index: a pure-Python PrivateUse1 backend supports index 0 only. All JAX
    # devices are reachable through tpu_interactive.distributed (a mesh) instead.
    return 1


def set_device(index: int) -> None:
    if int(index) != 0:
        raise ValueError("the tpu backend exposes one torch device (tpu:0); use tpu_interactive.distributed for meshes")


class device:  # noqa: N801 - mirrors torch.cuda.device
    """``with torch.tpu.device(0):`` (torch.load and storage moves enter it); one device, so a no-op."""

    def __init__(self, device: Any):
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
        if index not in (None, 0, -1):
            set_device(index)  # raises: only tpu:0 exists

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


def synchronize(device: Any = None) -> None:
    """Wait for every pending device computation."""
    for array in jax.live_arrays():
        array.block_until_ready()


def manual_seed(seed: int) -> None:
    default_generator.manual_seed(seed)


manual_seed_all = manual_seed


def seed() -> int:
    import random

    value = random.getrandbits(63)
    default_generator.manual_seed(value)
    return value


seed_all = seed


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return default_generator.get_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    default_generator.set_state(state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def memory_allocated(device: Any = None) -> int:
    return stats.memory().live_bytes


def max_memory_allocated(device: Any = None) -> int:
    return stats.memory().peak_bytes


def reset_peak_memory_stats(device: Any = None) -> None:
    stats.reset_peak()


def empty_cache() -> None:
    gc.collect()


def memory_stats(device: Any = None) -> dict[str, Any]:
    from .info import memory_stats as _memory_stats

    return _memory_stats()
