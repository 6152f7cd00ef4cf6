"""Bitwise, logical and comparison ops (comparisons compute in the inputs' common dtype), and the
NaN/Inf/sign tests, matching CPU PyTorch's kernels."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import dtypes
from ..registry import INTEGRAL, INTEGRAL_NO_BOOL, Promote, lower
from .elementwise import _array, _named


# ---------------------------------------------------------------- bitwise and logical
def _bitwise(name, fn):
    def lowering(x, y):
        return fn(x, y)

    for overload in ("Tensor", "Scalar", "Scalar_Tensor"):
        lower(f"{name}.{overload}", promote=Promote.RESULT, dtypes=INTEGRAL)(_named(lowering, name))


_bitwise("bitwise_and", jnp.bitwise_and)
_bitwise("bitwise_or", jnp.bitwise_or)
_bitwise("bitwise_xor", jnp.bitwise_xor)


@lower("bitwise_not", promote=Promote.RESULT, dtypes=INTEGRAL)
def bitwise_not(x):
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x)


def _shift_operands(x, y, spec):
    dt = dtypes.to_jax(spec.dtype)
    return _array(x, dt), _array(y, dt)


@jax.jit
def _shift_left(a, b):
    # counts < 0 or >= the bit width give 0 (ATen, like NumPy)
    bits = jnp.iinfo(a.dtype).bits
    return jnp.where((b < 0) | (b >= bits), jnp.zeros_like(a), jnp.left_shift(a, jnp.clip(b, 0, bits - 1)))


@jax.jit
def _shift_right(a, b):
    # out-of-range counts: signed fills with the sign bit (a >> bits-1), unsigned gives 0
    bits = jnp.iinfo(a.dtype).bits
    out_of_range = (b < 0) | (b >= bits)
    if jnp.issubdtype(a.dtype, jnp.signedinteger):
        return jnp.right_shift(a, jnp.where(out_of_range, bits - 1, b))
    return jnp.where(out_of_range, jnp.zeros_like(a), jnp.right_shift(a, jnp.clip(b, 0, bits - 1)))


@lower("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift.Scalar_Tensor",
       "__lshift__.Tensor", "__lshift__.Scalar", promote=Promote.RESULT, dtypes=INTEGRAL_NO_BOOL,
       cpu_kernel="lshift", needs_spec=True)
def left_shift(x, y, *, spec):
    return _shift_left(*_shift_operands(x, y, spec))


@lower("bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift.Scalar_Tensor",
       "__rshift__.Tensor", "__rshift__.Scalar", promote=Promote.RESULT, dtypes=INTEGRAL_NO_BOOL,
       cpu_kernel="rshift", needs_spec=True)
def right_shift(x, y, *, spec):
    return _shift_right(*_shift_operands(x, y, spec))


@lower("logical_and")
def logical_and(x, y):
    return jnp.logical_and(x, y)


@lower("logical_or")
def logical_or(x, y):
    return jnp.logical_or(x, y)


@lower("logical_xor")
def logical_xor(x, y):
    return jnp.logical_xor(x, y)


@lower("logical_not")
def logical_not(x):
    return jnp.logical_not(x)


# ---------------------------------------------------------------- comparisons (compute in the common dtype)
def _comparison(name, fn):
    lower(f"{name}.Tensor", f"{name}.Scalar", promote=Promote.COMMON)(_named(lambda x, y: fn(x, y), name))


for _name, _fn in {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                   "gt": jnp.greater, "ge": jnp.greater_equal}.items():
    _comparison(_name, _fn)


@lower("equal", raw=True)
def equal(x, y):
    """Python bool: same shape and all elements equal (NaN != NaN); one host sync, as on CPU."""
    from .. import storage
    if x.device != y.device:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{x.device} and {y.device}!")
    if x.shape != y.shape:
        return False
    a, b = storage.read(x), storage.read(y)
    common = jnp.promote_types(a.dtype, b.dtype)
    return bool(jnp.all(a.astype(common) == b.astype(common)))


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _float_test(name, fn):
    """isnan/isinf/...: a test of float values, all False for integers and bools."""
    def lowering(x):
        return fn(x) if _inexact(x) else jnp.zeros(x.shape, bool)

    lower(name)(_named(lowering, name))


for _name, _fn in {"isnan": jnp.isnan, "isinf": jnp.isinf, "isposinf": jnp.isposinf,
                   "isneginf": jnp.isneginf}.items():
    _float_test(_name, _fn)


@lower("signbit")
def signbit(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.signbit(x)
    return x < 0 if jnp.issubdtype(x.dtype, jnp.signedinteger) else jnp.zeros(x.shape, bool)


@lower("isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor", promote=Promote.COMMON)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """One program (generate()'s end-of-sequence check calls it every token; torch's Python
    decomposition cost ~180 us there), comparing in torch's common dtype as its kernel does."""
    return jnp.isin(elements, test_elements, assume_unique=assume_unique, invert=invert)
