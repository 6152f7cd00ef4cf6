"""Torch's output metadata for one op call (from its meta kernel), as dispatch, the compiler and the
planned programs of the fast path read it."""
from __future__ import annotations

import math

import jax
import torch

from . import dtypes


class Spec:
    """Output metadata of one tensor result, from torch's meta kernel."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __stable__(self) -> str:  # program_store's key text
        from .program_store import stable

        return stable((self.shape, self.dtype))


class OpSpec:
    """Torch's output metadata for one op call (its meta kernel's result): what a lowering declared
    with ``needs_spec=True`` receives as ``spec=``. Equal specs (same output shapes and dtypes, same
    common dtype) hash alike, so a per-op jitted program is keyed by it."""

    __slots__ = ("outputs", "common_dtype", "sig")

    def __init__(self, outputs, common_dtype):
        self.outputs, self.common_dtype = outputs, common_dtype
        self.sig = None  # filled by output_signature

    def output(self, i: int = 0):
        """Output ``i`` (a :class:`Spec` for a tensor result)."""
        return self.outputs[i] if isinstance(self.outputs, tuple) else self.outputs

    @property
    def dtype(self) -> torch.dtype | None:
        """Torch's result dtype (of the first output; None when that is not a tensor)."""
        out = self.outputs[0] if isinstance(self.outputs, tuple) else self.outputs  # hot path: no call
        return out.dtype if isinstance(out, Spec) else None

    def shape(self, i: int = 0) -> tuple:
        """Torch's shape of output ``i``."""
        return self.output(i).shape

    def __hash__(self) -> int:
        return hash(output_signature(self))

    def __eq__(self, other) -> bool:
        return type(other) is OpSpec and output_signature(self) == output_signature(other)

    def __stable__(self) -> str:  # program_store's key text
        from .program_store import stable

        return stable(output_signature(self))


def fit_result(array: jax.Array, shape: tuple, dtype: torch.dtype, op_name: str) -> jax.Array:
    """A lowering's array as torch's metadata for the output says: its dtype, and a 0-d / 1-element
    result reshaped to torch's shape (symbolic shapes in compiled graphs are left alone)."""
    if array.shape != shape and all(type(s) is int for s in shape):
        if array.size == math.prod(shape) and (array.ndim == 0 or not shape):
            array = array.reshape(shape)
        else:
            raise RuntimeError(f"internal error: lowering of {op_name} returned shape {tuple(array.shape)}, "
                               f"torch expects {shape}")
    target = dtypes.to_jax(dtype)
    if array.dtype != target:
        array = dtypes.cast(array, target)
    return array


def output_signature(spec: OpSpec) -> tuple:
    """What the lowering may read from the spec while tracing: part of its program's key."""
    sig = spec.sig
    if sig is None:
        sig = spec.sig = (spec_key(spec.outputs), spec.common_dtype)
    return sig


def spec_key(value):
    if isinstance(value, Spec):
        return (value.shape, value.dtype)
    if isinstance(value, tuple):
        return tuple(spec_key(v) for v in value)
    return value
