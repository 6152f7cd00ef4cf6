"""``torch.tpu``: the device module torch looks up for the renamed PrivateUse1 backend.

Mirrors ``torch.cuda``: device_count, synchronize, manual_seed(_all), get/set_rng_state, the
memory functions (memory_allocated/reserved, max_*, memory_stats, memory_summary, mem_get_info),
device name/properties, and the single-stream ``Stream``/``Event`` API (streams.py).
"""
from __future__ import annotations

import dataclasses
import gc
import os
from typing import Any

import jax
import torch

from . import memory_history as memory  # noqa: F401  torch.tpu.memory._record_memory_history/_snapshot
from . import stats
from .rng import default_generator
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream  # noqa: F401


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
    """Wait for every pending device computation and host-to-device copy."""
    from . import fusion, transfers

    fusion.flush("synchronize()")
    transfers.wait_all()
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


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]  # one device


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    set_rng_state(new_states[0])


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


def reset_accumulated_memory_stats(device: Any = None) -> None:
    stats.reset_accumulated()


def _device_memory() -> dict[str, int]:
    try:
        return jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - some platforms raise instead of returning None
        return {}


def memory_reserved(device: Any = None) -> int:
    """Bytes the device allocator holds: XLA's ``bytes_in_use`` where the device reports it (it
    includes JAX arrays outside torch), else the live tpu buffers (no caching allocator here)."""
    return max(memory_allocated(), _device_memory().get("bytes_in_use", 0))


def max_memory_reserved(device: Any = None) -> int:
    return max(max_memory_allocated(), _device_memory().get("peak_bytes_in_use", 0))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes. Total: ``config.memory_limit_bytes``, else the device's ``bytes_limit``,
    else (XLA:CPU, whose device memory is host memory) the host's physical memory."""
    from .config import config

    total = config.memory_limit_bytes or _device_memory().get("bytes_limit") or \
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(0, total - memory_reserved()), total


def memory_stats(device: Any = None) -> dict[str, Any]:
    """The backend's memory report (info.memory_stats) plus torch.cuda.memory_stats()'s keys
    (``allocated_bytes.all.current``, ...), the numbers torch.accelerator.memory_stats() reports."""
    from .info import memory_stats as _memory_stats

    out = _memory_stats()
    c = stats.memory_totals()
    reserved, max_reserved = memory_reserved(), max_memory_reserved()
    rows = {"allocated_bytes": (c.live_bytes, c.peak_bytes, c.allocated_bytes, c.freed_bytes),
            "active_bytes": (c.live_bytes, c.peak_bytes, c.allocated_bytes, c.freed_bytes),
            "requested_bytes": (c.live_bytes, c.peak_bytes, c.allocated_bytes, c.freed_bytes),
            "reserved_bytes": (reserved, max_reserved, 0, 0),
            "allocation": (c.live_buffers, c.peak_buffers, c.allocations, c.frees),
            "active": (c.live_buffers, c.peak_buffers, c.allocations, c.frees),
            "segment": (c.live_buffers, c.peak_buffers, c.allocations, c.frees)}
    for name, values in rows.items():
        for pool in ("all", "large_pool", "small_pool"):
            for field, value in zip(("current", "peak", "allocated", "freed"), values):
                out[f"{name}.{pool}.{field}"] = value
    for name in ("inactive_split", "inactive_split_bytes"):  # no caching allocator: nothing split
        for pool in ("all", "large_pool", "small_pool"):
            out.update({f"{name}.{pool}.{field}": 0 for field in ("current", "peak", "allocated", "freed")})
    for name in ("oversize_allocations", "oversize_segments"):
        out.update({f"{name}.{field}": 0 for field in ("current", "peak", "allocated", "freed")})
    out.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, max_split_size=0,
               num_device_alloc=c.allocations, num_device_free=c.frees)
    return out


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table in the spirit of ``torch.cuda.memory_summary()``: current, peak, total allocated and
    total freed bytes and buffers."""
    from .storage import _fmt_bytes

    s = memory_stats()
    free, total = mem_get_info()
    width = 75
    lines = ["=" * width, f"{'tpu memory summary, device ID 0':^{width}}", "-" * width,
             f"{'Metric':<27}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | {'Tot Freed':>10}",
             "-" * width]
    for label, key, fmt in (("Allocated memory", "allocated_bytes", _fmt_bytes),
                            ("Reserved memory", "reserved_bytes", _fmt_bytes),
                            ("Allocations (buffers)", "allocation", str)):
        cells = [fmt(s[f"{key}.all.{f}"]) for f in ("current", "peak", "allocated", "freed")]
        lines.append(f"{label:<27}| " + " | ".join(f"{c:>10}" for c in cells))
    lines += ["-" * width, f"{'Device memory free / total':<27}| {_fmt_bytes(free)} / {_fmt_bytes(total)}",
              f"{'Accounting source':<27}| {s['source']}", "=" * width]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """``torch.cuda.get_device_properties()``'s common fields, for the JAX device behind tpu:0."""

    name: str
    total_memory: int
    platform: str
    emulated: bool
    multi_processor_count: int  # TPU cores (or host CPUs when emulated)


def get_device_properties(device: Any = None) -> DeviceProperties:
    from .info import backend_info

    info = backend_info()
    name = f"{info.device_kind} (emulated tpu on XLA:CPU)" if info.emulated else info.device_kind
    cores = getattr(jax.devices()[0], "num_cores", None) or (os.cpu_count() if info.emulated else 1)
    return DeviceProperties(name=name, total_memory=mem_get_info()[1], platform=info.platform,
                            emulated=info.emulated, multi_processor_count=int(cores))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True  # bfloat16 is XLA's native reduced precision on every platform
