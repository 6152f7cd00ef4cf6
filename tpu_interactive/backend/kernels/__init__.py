"""Pallas kernels for the hot ops, attached to the eager lowerings with ``@registry.pallas_variant``.

The switch is ``config.pallas`` (``tpu_interactive.pallas``); this package holds only the kernels.

``tpu_interactive.pallas(True)`` (or ``with tpu_interactive.pallas(True):``, env
``TPU_INTERACTIVE_PALLAS=1``) routes these ops to Pallas, eagerly and in compiled graphs; each call
is counted in ``stats()['kernel_paths'][op]['pallas'|'xla']``. Per platform: TPU and GPU use the
kernels of ``jax.experimental.pallas.ops`` where they exist (flash attention, GPU softmax/norms/mha)
and ours otherwise (tiled matmul, attention with unequal q/kv lengths); on CPU our kernels run in
Pallas interpret mode (correct, slow: it only proves the kernels). Arguments a kernel does not
cover (integer dtypes, attention masks, dropout, ...) take the XLA lowering, counted as 'xla'.

This module is imported by ``installation.install()`` after every ``ops`` module, so the target ops
exist; a target that no ops module lowers is skipped.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from ..registry import LOWERINGS, pallas_variant
from ..stats import STATS
from . import attention as _attention_mod
from . import matmul as _matmul_mod
from . import norms as _norms_mod
from . import softmax as _softmax_mod
from ._common import platform

attention = _attention_mod.attention
matmul = _matmul_mod.matmul
softmax = _softmax_mod.softmax
layer_norm = _norms_mod.layer_norm
rms_norm = _norms_mod.rms_norm

ATTACHED: list[str] = []


class _NotCovered(Exception):
    """Raised inside a variant for arguments the kernel does not cover: use the XLA lowering."""


def _attach(name: str, variant: Callable) -> None:
    """``variant`` (the lowering's arguments; raises _NotCovered for what it does not cover) as the
    Pallas path of the lowering ``name``."""
    low = LOWERINGS.get(name)
    if low is None or low.raw:
        return
    xla_fn = low.fn

    def pallas_or_xla(*args, **kwargs):
        try:
            return variant(*args, **kwargs)
        except _NotCovered:  # dispatch already counted this call as 'pallas': it took 'xla'
            paths = STATS.kernel_paths[f"aten::{name}"]
            paths["pallas"] -= 1
            paths["xla"] += 1
            return xla_fn(*args, **kwargs)

    pallas_or_xla.__name__ = f"pallas_{name.replace('.', '_')}"
    pallas_variant(name)(pallas_or_xla)
    ATTACHED.append(name)


def _float(*arrays) -> bool:
    return all(a is None or jnp.issubdtype(a.dtype, jnp.floating) for a in arrays)


# ---------------------------------------------------------------- matmul family
def _mm(x, y):
    if not _matmul_mod.supported(x, y):
        raise _NotCovered
    return matmul(x, y)


def _addmm(bias, x, y, beta=1, alpha=1):
    if not _matmul_mod.supported(x, y):
        raise _NotCovered
    prod = matmul(x, y)
    prod = prod * alpha if alpha != 1 else prod
    return prod if beta == 0 else prod + (bias * beta if beta != 1 else bias)


# ---------------------------------------------------------------- softmax / norms
def _softmax(x, dim, half_to_float=False):
    if not _float(x):
        raise _NotCovered
    return softmax(x, dim, jnp.float32 if half_to_float else x.dtype)


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not _float(x, weight, bias):
        raise _NotCovered
    return layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    if not _float(x, weight):
        raise _NotCovered
    return rms_norm(x, tuple(normalized_shape), weight, eps)


_attach("mm.default", _mm)
_attach("bmm.default", _mm)
_attach("addmm.default", _addmm)
_attach("_softmax.default", _softmax)
_attach("native_layer_norm.default", _layer_norm)
_attach("_fused_rms_norm.default", _rms_norm)

__all__ = ["attention", "matmul", "softmax", "layer_norm", "rms_norm", "platform", "ATTACHED"]
