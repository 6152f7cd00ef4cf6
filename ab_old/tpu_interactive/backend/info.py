"""What the `tpu` device really runs on, said plainly."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from . import stats
from .config import STARTUP_ONLY_ENV, config


@dataclasses.dataclass
class BackendInfo:
    platform: str  # the real JAX platform: 'tpu', 'gpu' or 'cpu'
    device_kind: str
    device_count: int
    emulated: bool  # True when the `tpu` device runs on XLA:CPU
    jax_version: str
    summary: str
    warnings: list[str]
    startup_env: dict[str, str]

    def __str__(self) -> str:
        lines = [self.summary] + [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def backend_info() -> BackendInfo:
    devices = jax.devices()
    first = devices[0]
    platform = first.platform
    kind = getattr(first, "device_kind", platform)
    emulated = platform == "cpu"
    if emulated:
        summary = (f"tpu:0 — emulated on XLA:CPU ({len(devices)} host device{'s' if len(devices) != 1 else ''}; "
                   "no TPU in use)")
    elif platform == "tpu":
        summary = f"tpu:0 — {kind} x{len(devices)} (libtpu)"
    else:
        summary = f"tpu:0 — runs on {platform.upper()}: {kind} x{len(devices)} (not a TPU)"
    from .detect import device_warnings

    return BackendInfo(
        platform=platform,
        device_kind=kind,
        device_count=len(devices),
        emulated=emulated,
        jax_version=jax.__version__,
        summary=summary,
        warnings=device_warnings(platform),
        startup_env={k: os.environ[k] for k in STARTUP_ONLY_ENV if k in os.environ},
    )


def memory_stats() -> dict[str, Any]:
    """bytes_in_use / peak_bytes_in_use / bytes_limit: from the device where it reports them,
    else from the backend's exact accounting of live tpu buffers."""
    device_stats = None
    try:
        device_stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - some platforms raise instead of returning None
        device_stats = None
    s = stats.memory()
    out: dict[str, Any] = {
        "tracked_bytes_in_use": s.live_bytes,
        "tracked_peak_bytes": s.peak_bytes,
        "tracked_buffers": s.live_buffers,
        "memory_limit_bytes": config.memory_limit_bytes,
    }
    if device_stats:
        out.update(source="device", bytes_in_use=device_stats.get("bytes_in_use", s.live_bytes),
                   peak_bytes_in_use=device_stats.get("peak_bytes_in_use", s.peak_bytes),
                   bytes_limit=config.memory_limit_bytes or device_stats.get("bytes_limit"))
    else:
        out.update(source="accounting", bytes_in_use=s.live_bytes, peak_bytes_in_use=s.peak_bytes,
                   bytes_limit=config.memory_limit_bytes)
    return out
