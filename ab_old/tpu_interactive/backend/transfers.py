"""Asynchronous host-to-device copies (``.to("tpu", non_blocking=True)`` from pinned memory).

On TPU/GPU ``jax.device_put`` is already an asynchronous DMA that keeps its host buffer alive
until read. XLA:CPU instead aliases the host memory (so later changes to the pinned source would
show through) and runs a device-side copy inline on the caller's thread; there the copy runs on one
background "copy engine" thread, in submission order, and the destination buffer holds the future
until first read (storage.DeviceBuffer.pending). ``torch.tpu.synchronize`` waits for it.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

_HOST_ALIASING = jax.devices()[0].platform == "cpu"
_executor: ThreadPoolExecutor | None = None
_inflight: set[Future] = set()
_lock = threading.Lock()


def _copy_to_device(host: np.ndarray) -> jax.Array:
    array = jnp.asarray(host)  # a copy: the device value no longer depends on the host memory
    array.block_until_ready()
    return array


def start(host: np.ndarray) -> jax.Array | Future:
    """Begin copying ``host`` to the device; the caller keeps ``host`` unchanged until synchronize."""
    global _executor
    if not _HOST_ALIASING:
        return jax.device_put(host)
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu-h2d")
        future = _executor.submit(_copy_to_device, host)
        _inflight.add(future)
    future.add_done_callback(_inflight.discard)
    return future


def wait_all() -> None:
    """Wait for every copy started so far."""
    for future in list(_inflight):
        future.result()
