"""Special functions (polygamma, Bessel, orthogonal polynomials, erfcx, ndtri, igamma, ...).

Where JAX's implementation differs from ATen's (e.g. ``lax.zeta`` is wrong for negative ``q``, and the
polynomials' handling of ``n < 0`` / ``|x| == 1``), the formulas are ports of ATen's CPU kernels
(``ATen/native/Math.h``, mostly Cephes-derived), so values match CPU PyTorch to rounding:
- float32 keeps ATen's float formulas; where ATen accumulates in ``acc_type`` (double for float on
  CPU, e.g. ``zeta``) we do too; bfloat16/float16 compute in float32 and round once;
- integer/bool inputs arrive promoted to torch's float result dtype (``promote="result"``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from ..registry import lower
from .elementwise import _digamma, _require, _up

_MACHEP = 1.11022302462515654042e-16  # Cephes' MACHEP, used by ATen's zeta for every dtype


def _acc(x):
    """ATen's CPU acc_type: float32 accumulates in float64."""
    return x.astype(jnp.float64) if x.dtype == jnp.float32 else x


def _unary(name, fn):
    """Register a float-result unary special function (``fn`` sees float32/float64 arrays)."""
    def lowering(x):
        return fn(_up(x))

    lowering.__name__ = lowering.__qualname__ = name
    lower(name, promote="result")(lowering)


# ---------------------------------------------------------------- zeta / polygamma
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)


@jax.jit
def _zeta(x, q):
    """Hurwitz zeta, ATen's Cephes port: direct summation until the terms are tiny (also valid for
    negative non-integer q with integer x, where lax.zeta returns garbage), then Euler-Maclaurin."""
    x, q = jnp.broadcast_arrays(x, q)
    inf, nan = jnp.full_like(x, jnp.inf), jnp.full_like(x, jnp.nan)
    special = jnp.where(x == 1, inf, jnp.where(x < 1, nan, jnp.where(
        (q <= 0) & (q == jnp.floor(q)), inf, jnp.where((q <= 0) & (x != jnp.floor(x)), nan, 0.0))))
    done = (x == 1) | (x < 1) | ((q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))))

    def active(state):
        i, a, _, _, done = state
        return ~done & ((i < 9) | (a <= 9.0))

    def body(state):
        i, a, b, s, done = state
        live = active(state)
        a = jnp.where(live, a + 1, a)
        b = jnp.where(live, jnp.power(a, -x), b)
        s = jnp.where(live, s + b, s)
        done = done | (live & (-_MACHEP * s < b) & (b < _MACHEP * s))
        return i + 1, a, b, s, done

    state = (jnp.int32(0), q, jnp.zeros_like(x), jnp.power(q, -x), done)
    _, a, b, s, done = lax.while_loop(lambda st: jnp.any(active(st)), body, state)
    w = a
    s = jnp.where(done, s, s + b * w / (x - 1) - 0.5 * b)
    a, k = jnp.ones_like(x), 0.0
    for coefficient in _ZETA_A:  # Euler-Maclaurin tail, each element stopping at its own term
        a = a * (x + k)
        b = b / w
        t = a * b / coefficient
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < _MACHEP)
        k += 1.0
        a = a * (x + k)
        b = b / w
        k += 1.0
    return jnp.where(special != 0, special, s)


@jax.jit
def _trigamma(x):
    """ATen's trigamma (reflection below 0.5, six recurrence steps, asymptotic series), in x's dtype:
    at poles it gives ATen's huge finite value from sin(pi * x) rounding, not inf."""
    pi = jnp.asarray(math.pi, x.dtype)
    reflect = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    result = jnp.where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(reflect, -result, result)


@functools.partial(jax.jit, static_argnames="n")
def _polygamma(x, n):
    # ATen: (-1)^(n+1) n! zeta(n + 1, x), the factorial as exp(lgamma(n + 1)) in x's dtype
    sign = 1.0 if n % 2 else -1.0
    factorial = jnp.exp(lax.lgamma(jnp.asarray(n + 1.0, x.dtype)))
    return sign * factorial * _zeta(jnp.asarray(n + 1.0, _acc(x).dtype), _acc(x)).astype(x.dtype)


@lower("polygamma", promote="result")
def polygamma(n, x):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    x = _up(x)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    return _polygamma(x, n=int(n))
