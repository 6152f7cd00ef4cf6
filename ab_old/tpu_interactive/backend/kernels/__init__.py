"""Pallas kernels for the hot ops, attached to the eager lowerings with ``@registry.pallas_variant``
(its ``covers`` predicate names the arguments its kernel covers; the rest take the XLA lowering).

The switch is ``config.pallas`` (``tpu_interactive.pallas``); this package holds only the kernels.

``tpu_interactive.pallas(True)`` (or ``with tpu_interactive.pallas(True):``, env
``TPU_INTERACTIVE_PALLAS=1``) routes these ops to Pallas, eagerly and in compiled graphs; each call
is counted in ``stats()['kernel_paths'][op]['pallas'|'xla']``. Per platform: TPU and GPU use the
kernels of ``jax.experimental.pallas.ops`` where they exist (TPU flash attention, GPU softmax/norms/mha)
and ours otherwise (tiled matmul, TPU softmax/norms, attention with unequal q/kv lengths); every kernel
is traced with 64-bit types off (``_common.x32``) and multiplies float32 at HIGHEST; on CPU our kernels run in
Pallas interpret mode (correct, slow: it only proves the kernels). Arguments a kernel does not
cover (integer and float64 dtypes, attention masks, dropout, ...) take the XLA lowering, counted as 'xla'.

This module is imported by ``installation.install()`` after every ``ops`` module, so the target ops
exist (a target that no ops module lowers is an error; one skipped for this torch is skipped).
"""
from __future__ import annotations

import jax.numpy as jnp

from ..registry import LOWERINGS, pallas_variant
from . import attention as _attention_mod
from . import matmul as _matmul_mod
from . import norms as _norms_mod
from . import softmax as _softmax_mod
from ._common import available, platform

attention = _attention_mod.attention
matmul = _matmul_mod.matmul
softmax = _softmax_mod.softmax
layer_norm = _norms_mod.layer_norm
rms_norm = _norms_mod.rms_norm


def _float(*arrays) -> bool:
    """Floats of 32 bits or less (the kernels trace with 64-bit types off: ``_common.x32``), where
    the kernels run at all (``_common.available``)."""
    return available() and all(a is None or (jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize <= 4)
                               for a in arrays)


# ---------------------------------------------------------------- matmul family
def _mm_covered(x, y) -> bool:
    return available() and _matmul_mod.supported(x, y)


@pallas_variant("mm", "bmm", covers=_mm_covered)
def _mm(x, y):
    return matmul(x, y)


@pallas_variant("addmm", covers=lambda bias, x, y, beta=1, alpha=1: _mm_covered(x, y))
def _addmm(bias, x, y, beta=1, alpha=1):
    prod = matmul(x, y)
    prod = prod * alpha if alpha != 1 else prod
    return prod if beta == 0 else prod + (bias * beta if beta != 1 else bias)


# ---------------------------------------------------------------- softmax / norms
@pallas_variant("_softmax", covers=lambda x, dim, half_to_float=False: _float(x))
def _softmax(x, dim, half_to_float=False):
    return softmax(x, dim, jnp.float32 if half_to_float else x.dtype)


@pallas_variant("native_layer_norm",
                covers=lambda x, normalized_shape, weight=None, bias=None, eps=1e-5: _float(x, weight, bias))
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return layer_norm(x, tuple(normalized_shape), weight, bias, eps)


# the ops with a Pallas variant (for tests and docs), read from the registry
ATTACHED: list[str] = [name for name, low in LOWERINGS.items() if low.pallas_fn is not None]

__all__ = ["attention", "matmul", "softmax", "layer_norm", "rms_norm", "platform", "available", "ATTACHED"]
