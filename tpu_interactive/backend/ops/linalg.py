"""Matrix products (mm/bmm/addmm/baddbmm/...): f32 accumulate at highest precision, like CPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import lower

_PREC = jax.lax.Precision.HIGHEST


@lower("mm", promote="result")
def mm(x, y):
    return jnp.matmul(x, y, precision=_PREC)


@lower("addmm", promote="result")
def addmm(bias, x, y, beta=1, alpha=1):
    prod = jnp.matmul(x, y, precision=_PREC)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return prod + (bias * beta if beta != 1 else bias)
