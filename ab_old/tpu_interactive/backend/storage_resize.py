"""``UntypedStorage.resize_`` for tpu storages (FSDP2 frees unsharded parameters with ``resize_(0)``
and re-allocates them with ``resize_(n)`` before the all-gather writes into them).

Called from the C++ hook ``resizePrivateUse1Bytes``: the storage gets a fresh ``DeviceBuffer`` over a
fresh fake address range (returned, for the StorageImpl's data pointer); the first ``min(old, new)``
bytes keep their value and the rest reads as zeros, as CUDA's resize keeps the prefix.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from . import memory_history as _history
from . import stats, storage


def resize(raw: torch.UntypedStorage, nbytes: int) -> int:
    old = raw._tpu_buffer
    storage._check_memory(max(nbytes - old.nbytes, 0))
    keep = min(old.nbytes, nbytes)
    # keep the element dtype when the new size is whole elements (reads then need no bitcast)
    dtype = old.dtype if nbytes % old.dtype.itemsize == 0 and keep % old.dtype.itemsize == 0 else torch.uint8
    count = nbytes // dtype.itemsize
    array = None  # never written: reads as zeros
    if keep and (old.array is not None or old.pending is not None):
        flat = storage._bitcast(old.flat(), old.dtype, dtype)[: keep // dtype.itemsize]
        array = jnp.pad(flat, (0, count - flat.size))
    address = storage._reserve(nbytes)
    raw._tpu_buffer = storage.DeviceBuffer(array, (count,), dtype, nbytes, address)  # the old one frees itself
    stats.record_alloc(nbytes)
    if _history.RECORDING:
        _history.on_alloc(address, nbytes)
    return address
