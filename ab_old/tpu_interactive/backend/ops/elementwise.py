"""Elementwise arithmetic and unary math, matching CPU PyTorch's kernels (bitwise, logical and
comparison ops are in logical.py).

Conventions of this family:
- result dtypes come from torch (``promote=Promote.RESULT`` casts tensor inputs to it first); bfloat16 and
  float16 compute in float32 and round once, like CPU's "opmath" (``_common.opmath``);
- formulas follow ATen's CPU kernels where they differ from NumPy/JAX (floor division, remainder,
  sign of NaN, pow special cases, shift counts out of range, lerp, xlogy, digamma at 0);
- integer division/remainder by zero raises ``RuntimeError("ZeroDivisionError")`` as on CPU (this
  costs one host sync, and only for integer dtypes);
- dtypes CPU has no kernel for raise ``NotImplementedError('"op" not implemented for 'Bool'')``
  where torch's meta kernel would let them through (``@lower(dtypes=...)``, checked by dispatch);
- multi-op formulas are ``jax.jit``-fused so they run as one kernel on the device.
"""
from __future__ import annotations

import functools
import math
from typing import NoReturn

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .. import dtypes, graph_checks
from ..registry import ALL_BUT_BOOL, FLOATING, FLOATING_AND_COMPLEX, Promote, lower, require_dtype
from ._common import half_scalar_dtype, opmath, with_alpha

# ---------------------------------------------------------------- helpers
def _is_integral(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)


def _check_divisor(y, op: str) -> None:
    """CPU raises for integer division by zero; so do we (needs the value: one host sync; in a fused
    segment or a compiled graph the check is traced in and raised when it runs)."""
    if graph_checks.is_traced(y):
        graph_checks.check_in_graph(jnp.any(y == 0), jnp.zeros((), jnp.int8), RuntimeError, lambda _: "ZeroDivisionError")
        return
    if isinstance(y, jax.Array):
        zero = bool(jnp.any(y == 0))
    else:
        zero = y == 0
    if zero:
        raise RuntimeError("ZeroDivisionError")


def _array(x, dtype):
    return jnp.asarray(x, dtype)


def _named(fn, name):
    fn.__name__ = fn.__qualname__ = name
    return fn


# ---------------------------------------------------------------- add / sub / mul
# jnp.add/subtract/multiply, not jax.lax: jnp's functions are jitted, so an eager call dispatches
# through jit's C++ fast path (~9 us), while a lax primitive binds through Python (~21 us).
@lower("add.Tensor", "add.Scalar", promote=Promote.RESULT)
def add(x, y, alpha=1):
    # no branch on a float alpha's value: it is a traced input of per-op and fused programs
    # (SGD's lr arrives as alpha), and a branch would make every new lr a new program
    return jnp.add(x, y) if _is_one(alpha) else with_alpha(jnp.add, x, y, alpha)


def _is_one(alpha) -> bool:
    return (type(alpha) is int or type(alpha) is bool) and alpha == 1


_BOOL = torch.zeros(1, dtype=torch.bool)


def _raise_like_cpu(op: torch._ops.OpOverload, *args) -> NoReturn:
    """Raise what the installed torch's CPU kernel raises for these inputs: the error type changes
    between releases (bool sub/relu: RuntimeError in torch 2.13, NotImplementedError in 2.14)."""
    op(*args)
    raise NotImplementedError(f"{op} accepts these inputs on CPU but has no tpu lowering for them")


@lower("sub.Tensor", "sub.Scalar", promote=Promote.RESULT, strict_dtypes=True,  # CPU refuses float - bool
       needs_spec=True)
def sub(x, y, alpha=1, *, spec):
    if spec.dtype == torch.bool:  # torch's meta lets bool - bool-scalar through, CPU does not
        _raise_like_cpu(torch.ops.aten.sub.Tensor, _BOOL, _BOOL)
    return jnp.subtract(x, y) if _is_one(alpha) else with_alpha(jnp.subtract, x, y, alpha)


@lower("mul.Tensor", "mul.Scalar", promote=Promote.RESULT)
def mul(x, y):
    half = half_scalar_dtype(x, y)
    return jnp.multiply(x, y) if half is None else jnp.multiply(opmath(x), opmath(y)).astype(half)


@lower("relu", promote=Promote.RESULT)
def relu(x):
    if x.dtype == jnp.bool_:  # meta accepts bool, CPU does not
        _raise_like_cpu(torch.ops.aten.relu.default, _BOOL)
    return jnp.maximum(x, 0)


# ---------------------------------------------------------------- division family
@jax.jit
def _true_div(x, y):
    return opmath(x) / opmath(y)


@jax.jit
def _float_floor_div(a, b):
    # ATen's div_floor_floating (Python's float //): exact where floor(a / b) is off by one
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    out = jnp.where(div != 0, floor, jnp.copysign(jnp.zeros_like(div), a / b))
    return jnp.where(b == 0, a / b, out)


@jax.jit
def _int_floor_div(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    q = lax.div(a, b)  # truncates toward zero
    return jnp.where((lax.rem(a, b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@jax.jit
def _int_trunc_div(a, b):
    a, b = jnp.broadcast_arrays(a, b)
    return lax.div(a, b)


def _rounding_div(x, y, mode: str, dt):
    op = f"div_{mode}"
    if _is_integral(dt):
        _check_divisor(y, op)
        fn = _int_floor_div if mode == "floor" else _int_trunc_div
        return fn(_array(x, dt), _array(y, dt))
    # python scalars keep their float precision for half types, as CPU's reduced-float scalar path
    if mode == "floor":
        return _float_floor_div(opmath(x), opmath(y))
    # half types: CPU truncates the quotient rounded to the half type (17.95 -> 18.0 -> 18)
    return jnp.trunc(_true_div(x, y).astype(dt))


@lower("div.Tensor", "div.Scalar", promote=Promote.RESULT)
def div(x, y):
    return _true_div(x, y)


@lower("div.Tensor_mode", "div.Scalar_mode", promote=Promote.RESULT, needs_spec=True)
def div_mode(x, y, rounding_mode=None, *, spec):
    if rounding_mode is None:
        return _true_div(x, y)
    if rounding_mode not in ("trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                         f"but found '{rounding_mode}'")
    # depends on rounding_mode (true division has a Bool kernel), so it is not a dtypes= rule
    require_dtype(ALL_BUT_BOOL, f"div_{rounding_mode}", spec.dtype)
    return _rounding_div(x, y, rounding_mode, dtypes.to_jax(spec.dtype))


@lower("floor_divide", "floor_divide.Scalar", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL, cpu_kernel="div_floor",
       needs_spec=True)
def floor_divide(x, y, *, spec):
    return _rounding_div(x, y, "floor", dtypes.to_jax(spec.dtype))


@jax.jit
def _remainder(a, b):
    # sign follows the divisor (Python %): ATen's fmod-then-adjust formula, for ints and floats
    mod = jnp.fmod(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def _mod_like(x, y, op: str, fn, dt):
    if _is_integral(dt):
        _check_divisor(y, op)
    return fn(opmath(_array(x, dt)), opmath(_array(y, dt)))


@lower("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor", promote=Promote.RESULT,
       dtypes=ALL_BUT_BOOL, needs_spec=True)
def remainder(x, y, *, spec):
    return _mod_like(x, y, "remainder", _remainder, dtypes.to_jax(spec.dtype))


@lower("fmod.Tensor", "fmod.Scalar", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL, needs_spec=True)
def fmod(x, y, *, spec):
    # sign follows the dividend (C fmod); for ints lax.rem is C's %
    return _mod_like(x, y, "fmod", jnp.fmod, dtypes.to_jax(spec.dtype))


# ---------------------------------------------------------------- pow
@jax.jit
def _int_pow(base, exponent):
    """Integer power by squaring; negative exponents give 0 except for bases 1 and -1 (ATen powi)."""
    base, exponent = jnp.broadcast_arrays(base, exponent)
    signed = jnp.issubdtype(base.dtype, jnp.signedinteger)

    def body(state):
        result, b, e = state
        return jnp.where((e & 1) == 1, result * b, result), b * b, e >> 1

    e0 = jnp.maximum(exponent, 0) if signed else exponent
    result, _, _ = lax.while_loop(lambda s: jnp.any(s[2] > 0), body, (jnp.ones_like(base), base, e0))
    if not signed:
        return result
    odd = (exponent & 1) == 1
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0)).astype(base.dtype)
    return jnp.where(exponent < 0, negative, result)


# torch's pow(tensor, scalar) fast paths: exactly these formulas, not a generic pow
_POW_SPECIAL = {
    0.5: jnp.sqrt, 2.0: lambda x: x * x, 3.0: lambda x: x * x * x, -0.5: lax.rsqrt,
    -1.0: lambda x: 1 / x, -2.0: lambda x: 1 / (x * x),
}


@lower("pow.Tensor_Scalar", promote=Promote.RESULT)
def pow_tensor_scalar(x, exponent):
    # known difference: bool_tensor ** True/False is int64 here (torch's meta kernel), bool on CPU
    if isinstance(exponent, complex):
        return jnp.power(x, exponent)
    if exponent == 0:
        return jnp.ones_like(x)
    if exponent == 1:
        return x
    if _is_integral(x.dtype):  # an integral result implies an integral exponent
        if exponent < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        return lax.integer_pow(x, int(exponent))
    special = _POW_SPECIAL.get(float(exponent))
    if special is not None:
        return special(opmath(x))
    return jnp.power(opmath(x), exponent)


@lower("pow.Tensor_Tensor", needs_spec=True)
def pow_tensor_tensor(x, exponent, *, spec):
    # meta says bool ** bool is int64, but CPU's kernel runs in the common dtype (bool) and has none
    if x.dtype == jnp.bool_ and exponent.dtype == jnp.bool_:
        raise NotImplementedError("\"pow\" not implemented for 'Bool'")
    dt = dtypes.to_jax(spec.dtype)
    x, exponent = x.astype(dt), exponent.astype(dt)
    if _is_integral(dt):
        return _int_pow(x, exponent)
    return jnp.power(opmath(x), opmath(exponent))


@lower("pow.Scalar", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL)
def pow_scalar(base, exponent):
    if base == 1:  # torch returns ones even for NaN exponents
        return jnp.ones_like(exponent)
    if _is_integral(exponent.dtype):
        return _int_pow(_array(base, exponent.dtype), exponent)
    return jnp.power(_array(base, opmath(exponent).dtype), opmath(exponent))


# ---------------------------------------------------------------- other binary math
@lower("rsub.Tensor", "rsub.Scalar", promote=Promote.RESULT, needs_spec=True)
def rsub(x, y, alpha=1, *, spec):
    return sub(y, x, alpha, spec=spec)


@lower("atan2", promote=Promote.RESULT)
def atan2(x, y):
    return jnp.arctan2(opmath(x), opmath(y))


@lower("hypot", promote=Promote.RESULT, dtypes=FLOATING)
def hypot(x, y):
    return jnp.hypot(opmath(x), opmath(y))


@lower("copysign.Tensor", "copysign.Scalar", promote=Promote.RESULT)
def copysign(x, y):
    return jnp.copysign(opmath(x), opmath(y))


@functools.partial(jax.jit, static_argnames="log")
def _xlog(x, y, log):
    # ATen: NaN if y is NaN, else 0 where x == 0 (even for y == 0), else x * log(y)
    value = jnp.where(x == 0, jnp.zeros_like(y), x * log(y))
    return jnp.where(jnp.isnan(y), jnp.full_like(value, jnp.nan), value)


def _xlog_operands(x, y, spec):
    dt = dtypes.to_jax(spec.dtype)
    return opmath(_array(x, dt)), opmath(_array(y, dt))


@lower("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self", promote=Promote.RESULT, needs_spec=True)
def xlogy(x, y, *, spec):
    return _xlog(*_xlog_operands(x, y, spec), log=jnp.log)


@lower("special_xlog1py", "special_xlog1py.other_scalar", "special_xlog1py.self_scalar", promote=Promote.RESULT,
       needs_spec=True)
def xlog1py(x, y, *, spec):
    return _xlog(*_xlog_operands(x, y, spec), log=jnp.log1p)


@functools.partial(jax.jit, static_argnames="log2")
def _logaddexp(x, y, log2=False):
    # ATen: max + log1p(exp(-|x - y|)) (log2: exp2, times 1/ln 2); equal infinities return x
    x, y = opmath(x), opmath(y)
    hi, lo = jnp.maximum(x, y), jnp.minimum(x, y)
    if log2:
        value = hi + jnp.log1p(jnp.exp2(lo - hi)) * (1 / math.log(2.0))
    else:
        value = hi + jnp.log1p(jnp.exp(lo - hi))
    return jnp.where(jnp.isinf(x) & (x == y), x, value)


@lower("logaddexp", promote=Promote.RESULT, dtypes=FLOATING_AND_COMPLEX, needs_spec=True)
def logaddexp(x, y, *, spec):
    if spec.dtype is not None and spec.dtype.is_complex:  # CPU has a complex kernel; we do not yet
        raise NotImplementedError("logaddexp: complex inputs are not supported on tpu yet")
    return _logaddexp(x, y)


@lower("logaddexp2", promote=Promote.RESULT, dtypes=FLOATING)
def logaddexp2(x, y):
    return _logaddexp(x, y, log2=True)


@lower("nextafter", promote=Promote.RESULT, dtypes=FLOATING)
def nextafter(x, y):
    return jnp.nextafter(x, y)  # in the tensor's own dtype: it is about its representable values


@lower("maximum", promote=Promote.RESULT)
def maximum(x, y):
    return jnp.maximum(x, y)  # NaN-propagating, as torch


@lower("minimum", promote=Promote.RESULT)
def minimum(x, y):
    return jnp.minimum(x, y)


@lower("fmax", promote=Promote.RESULT)
def fmax(x, y):
    return jnp.fmax(x, y)  # NaN-ignoring


@lower("fmin", promote=Promote.RESULT)
def fmin(x, y):
    return jnp.fmin(x, y)


# ---------------------------------------------------------------- unary: same dtype
@lower("neg", promote=Promote.RESULT)
def neg(x):
    return jnp.negative(x)


@lower("abs", dtypes=ALL_BUT_BOOL)  # no promote: casting complex input to the (real) result dtype would drop .imag
def abs_(x):
    return jnp.abs(x)


@lower("sign", "sgn", promote=Promote.RESULT)
def sign(x):
    # ATen: (0 < x) - (x < 0), so sign(NaN) == 0, unlike jnp.sign
    if x.dtype == jnp.bool_:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.where(x == 0, 0, x / jnp.abs(x))  # sgn of complex: x / |x|
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _integer_identity(name, fn):
    """floor/ceil/round/trunc: identity on integers, no kernel for bool."""
    def lowering(x):
        return x if _is_integral(x.dtype) else fn(x)

    lower(name, promote=Promote.RESULT, dtypes=ALL_BUT_BOOL)(_named(lowering, name))


_integer_identity("floor", jnp.floor)
_integer_identity("ceil", jnp.ceil)
_integer_identity("trunc", jnp.trunc)
_integer_identity("round", jnp.round)  # round half to even, like std::nearbyint


@functools.partial(jax.jit, static_argnames="decimals")
def _round_decimals(x, decimals):
    y = opmath(x)
    scale = jnp.asarray(10.0 ** abs(decimals), y.dtype)
    if decimals < 0:
        return jnp.round(y / scale) * scale
    return jnp.round(y * scale) / scale


@lower("round.decimals", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="round")
def round_decimals(x, decimals):
    return _round_decimals(x, decimals=int(decimals))


@lower("frac", promote=Promote.RESULT, dtypes=FLOATING)
def frac(x):
    return x - jnp.trunc(x)


@jax.jit
def _nan_to_num(x, nan, posinf, neginf):
    x = jnp.where(jnp.isnan(x), nan, x)
    return jnp.where(jnp.isposinf(x), posinf, jnp.where(jnp.isneginf(x), neginf, x))


@lower("nan_to_num", promote=Promote.RESULT)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    info = jnp.finfo(x.dtype)
    values = [jnp.asarray(v, x.dtype) for v in (0.0 if nan is None else nan,
                                                 info.max if posinf is None else posinf,
                                                 info.min if neginf is None else neginf)]
    return _nan_to_num(x, *values)


# ---------------------------------------------------------------- unary: floating results
@jax.jit
def _digamma(x):
    # torch: digamma(+0) = -inf, digamma(-0) = +inf (lax gives NaN at both)
    return jnp.where(x == 0, jnp.copysign(jnp.full_like(x, jnp.inf), -x), lax.digamma(x))


_FLOAT_UNARY = {
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "reciprocal": lambda x: 1 / x, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin,
    "acos": jnp.arccos, "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh, "sigmoid": jax.nn.sigmoid,
    "erf": lax.erf, "erfc": lax.erfc, "erfinv": lax.erf_inv, "lgamma": lax.lgamma, "digamma": _digamma,
}


def _float_unary(name, fn):
    # ints/bools arrive already cast to the float result dtype (promote=Promote.RESULT)
    lower(name, promote=Promote.RESULT)(_named(lambda x: fn(opmath(x)), name))


for _name, _fn in _FLOAT_UNARY.items():
    _float_unary(_name, _fn)


@functools.partial(jax.jit, static_argnames="eps")
def _logit(x, eps):
    y = opmath(x)
    if eps is not None and eps >= 0:  # torch ignores a negative eps
        y = jnp.clip(y, eps, 1 - eps)
    return jnp.log(y / (1 - y))


@jax.jit
def _sinc(x):
    # ATen: sin(pi x) / (pi x), exactly 1 at 0, NaN stays NaN
    y = opmath(x)
    pix = y * jnp.asarray(math.pi, y.dtype)
    return jnp.where(y == 0, jnp.ones_like(y), jnp.sin(pix) / jnp.where(y == 0, 1, pix))


@lower("sinc", promote=Promote.RESULT)
def sinc(x):
    return _sinc(x)


@lower("frexp.Tensor")
def frexp(x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    mantissa, exponent = jnp.frexp(x)  # C frexp: inf/NaN mantissas pass through, exponent 0
    return mantissa, exponent.astype(jnp.int32)


@lower("logit", promote=Promote.RESULT)
def logit(x, eps=None):
    return _logit(x, eps=None if eps is None else float(eps))


# ---------------------------------------------------------------- clamp and friends
@jax.jit
def _clamp(x, lo, hi):
    # max then min (so min > max gives max), NaN-propagating in x and in the bounds, as torch
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


def _clamp_bounds(x, lo, hi, op):
    if lo is None and hi is None:
        raise RuntimeError(f"torch.{op}: At least one of 'min' or 'max' must not be None")
    return _clamp(x, lo, hi)


# CPU's scalar-bound clamp kernels have no Bool version; its tensor-bound clamp_min/clamp_max do
@lower("clamp", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL, cpu_kernel="clamp_scalar")
def clamp(x, min=None, max=None):
    return _clamp_bounds(x, min, max, "clamp")


@lower("clamp.Tensor", promote=Promote.RESULT, needs_spec=True)
def clamp_tensor(x, min=None, max=None, *, spec):
    if min is not None and max is not None:  # only the two-bound kernel lacks Bool: not a dtypes= rule
        require_dtype(ALL_BUT_BOOL, "clamp", spec.dtype)
    return _clamp_bounds(x, min, max, "clamp")


def _one_bound(name: str, lower_bound: bool) -> None:
    """clamp_min / clamp_max: the scalar-bound overload (no Bool kernel) and the tensor-bound one."""
    def lowering(x, bound):
        return _clamp(x, bound, None) if lower_bound else _clamp(x, None, bound)

    lower(name, promote=Promote.RESULT, dtypes=ALL_BUT_BOOL, cpu_kernel=f"{name}_scalar")(_named(lowering, name))
    lower(f"{name}.Tensor", promote=Promote.RESULT)(lowering)


_one_bound("clamp_min", lower_bound=True)
_one_bound("clamp_max", lower_bound=False)


# ---------------------------------------------------------------- ternary
@lower("where.self", needs_spec=True)
def where(condition, x, y, *, spec):
    dt = dtypes.to_jax(spec.dtype)  # promote x and y only: the condition stays bool
    return jnp.where(condition, _array(x, dt), _array(y, dt))


@jax.jit
def _lerp(start, end, weight):
    # ATen's two-sided formula: exact at weight 0 and weight 1
    start, end, weight = opmath(start), opmath(end), opmath(weight)
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight))


@lower("lerp.Scalar", "lerp.Tensor", promote=Promote.RESULT, dtypes=FLOATING_AND_COMPLEX)
def lerp(start, end, weight):
    return _lerp(start, end, weight)


@jax.jit
def _addcmul(x, t1, t2, value):
    return opmath(x) + value * opmath(t1) * opmath(t2)


@jax.jit
def _addcdiv(x, t1, t2, value):
    return opmath(x) + value * opmath(t1) / opmath(t2)


@lower("addcmul", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL)
def addcmul(x, t1, t2, value=1):
    if _is_integral(x.dtype):
        value = int(value)  # CPU converts value to the integer dtype first (0.5 -> 0)
    return _addcmul(x, t1, t2, value)


_ADDCDIV_INT = (
    "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a "
    "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
    "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
    "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
    "(input + value * tensor1 / tensor2), for all dtypes."
)


@lower("addcdiv", needs_spec=True, scalar_values_in_meta=False)
def addcdiv(x, t1, t2, value=1, *, spec):
    if _is_integral(t1.dtype) and _is_integral(t2.dtype):  # checked on the inputs, before promotion
        raise RuntimeError(_ADDCDIV_INT)
    dt = dtypes.to_jax(spec.dtype)
    return _addcdiv(_array(x, dt), _array(t1, dt), _array(t2, dt), value)


@lower("heaviside")
def heaviside(x, values):
    if x.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))
