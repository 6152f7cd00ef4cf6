"""Elementwise arithmetic, comparisons and unary math (promote= makes dtypes follow torch)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import lower


@lower("add.Tensor", "add.Scalar", promote="result")
def add(x, y, alpha=1):
    return x + y * alpha if alpha != 1 else x + y


@lower("sub.Tensor", "sub.Scalar", promote="result")
def sub(x, y, alpha=1):
    return x - y * alpha if alpha != 1 else x - y


@lower("mul.Tensor", "mul.Scalar", promote="result")
def mul(x, y):
    return x * y


@lower("relu", promote="result")
def relu(x):
    return jnp.maximum(x, 0)
