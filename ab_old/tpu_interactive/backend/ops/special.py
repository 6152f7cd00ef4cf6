"""Special functions (polygamma, Bessel, orthogonal polynomials, erfcx, ndtri, igamma, ...).

Where JAX's implementation differs from ATen's (e.g. ``lax.zeta`` is wrong for negative ``q``, and the
polynomials' handling of ``n < 0`` / ``|x| == 1``), the formulas are ports of ATen's CPU kernels
(``ATen/native/Math.h``, mostly Cephes-derived), so values match CPU PyTorch to rounding:
- float32 keeps ATen's float formulas; where ATen accumulates in ``acc_type`` (double for float on
  CPU, e.g. ``zeta``) we do too; bfloat16/float16 compute in float32 and round once;
- integer/bool inputs arrive promoted to torch's float result dtype (``promote=Promote.RESULT``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from .. import dtypes
from ..registry import FLOAT_AND_DOUBLE, FLOATING, Promote, lower, require_dtype
from . import cephes
from ._common import acc64, norm_dim, opmath, p_norm
from .elementwise import _digamma

_MACHEP = 1.11022302462515654042e-16  # Cephes' MACHEP, used by ATen's zeta for every dtype


# ops whose CPU kernels also cover bfloat16/float16 (the others: float32/float64 only, never complex)
_HALF_OK = {"i0", "special_i0e", "special_i1", "special_i1e", "special_entr"}


def _unary(name, fn):
    """Register a float-result unary special function (``fn`` sees float32/float64 arrays)."""
    kernel = "i0_vml" if name == "i0" else name.removeprefix("special_")

    def lowering(x):
        return fn(opmath(x))

    lowering.__name__ = lowering.__qualname__ = name
    lower(name, promote=Promote.RESULT, dtypes=FLOATING if name in _HALF_OK else FLOAT_AND_DOUBLE,
          cpu_kernel=f"{kernel}_cpu")(lowering)


# ---------------------------------------------------------------- zeta / polygamma
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
    for coefficient in cephes.ZETA_A:  # Euler-Maclaurin tail, each element stopping at its own term
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
    return sign * factorial * _zeta(jnp.asarray(n + 1.0, acc64(x).dtype), acc64(x)).astype(x.dtype)


@lower("polygamma", promote=Promote.RESULT, needs_spec=True)
def polygamma(n, x, *, spec):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    # the kernel CPU names depends on n, so this is not a dtypes= rule
    require_dtype(FLOATING, "polygamma" if n != 1 else "trigamma", spec.dtype)
    x = opmath(x)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    return _polygamma(x, n=int(n))


# ---------------------------------------------------------------- error function family, ndtri, entr
_ISPI = 0.56418958354775628694807945156  # 1 / sqrt(pi)


def _exp_square(x):
    """exp(x * x) with x * x split exactly into hi + lo (Veltkamp), so large x keep full precision."""
    c = (2.0 ** (27 if x.dtype == jnp.float64 else 12) + 1) * x
    xh = c - (c - x)
    xl = x - xh
    hi = x * x
    lo = ((xh * xh - hi) + 2 * xh * xl) + xl * xl
    return jnp.exp(hi) * jnp.exp(lo)


def _erfcx_nonneg(x):
    # exp(x^2) erfc(x) directly below 2; above, the continued fraction 1/(x + (1/2)/(x + 1/(x + ...)))
    # (jnp.exp(x*x) * erfc(x) underflows to 0 / overflows to NaN from x ~ 9 in float32)
    terms = 80 if x.dtype == jnp.float64 else 40
    xs = jnp.maximum(x, 2.0)
    f = xs
    for k in range(terms, 0, -1):
        f = xs + (k / 2) / f
    direct = _exp_square(jnp.minimum(x, 2.0)) * lax.erfc(jnp.minimum(x, 2.0))
    large = _ISPI * ((x * x) * (x * x + 4.5) + 2) / (x * ((x * x) * (x * x + 5) + 3.75))  # ATen, x > 50
    value = jnp.where(x < 2, direct, _ISPI / f)
    return jnp.where(x > 5e7, _ISPI / x, jnp.where(x > 50, large, value))


@jax.jit
def _erfcx(x):
    # negative x as ATen: inf below -26.7, 2 exp(x^2) below -6.1, else 2 exp(x^2) - erfcx(-x)
    positive = _erfcx_nonneg(jnp.abs(x))
    two_exp = 2 * jnp.exp(x * x)
    negative = jnp.where(x < -26.7, jnp.inf, jnp.where(x < -6.1, two_exp, two_exp - positive))
    return jnp.where(jnp.isnan(x), x, jnp.where(x >= 0, positive, negative))


@jax.jit
def _log_ndtr(x):
    # ATen's formula: log(erfcx(-t) / 2) - t^2 in the left tail, log1p(-erfc(t) / 2) elsewhere
    t = x * jnp.asarray(1 / math.sqrt(2), x.dtype)
    tail = jnp.log(_erfcx(-jnp.minimum(t, 0)) / 2) - t * t
    return jnp.where(x < -1, tail, jnp.log1p(-lax.erfc(t) / 2))


@jax.jit
def _entr(x):
    # -x log x; 0 at 0, -inf for negatives, NaN stays NaN
    value = jnp.where(x == 0, jnp.zeros_like(x), -x * jnp.log(jnp.where(x > 0, x, 1)))
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, -jnp.inf, value))


_unary("special_erfcx", _erfcx)
_unary("special_log_ndtr", _log_ndtr)
_unary("special_entr", _entr)
_unary("special_ndtri", jsp.ndtri)  # Cephes' ndtri, like ATen's calc_ndtri
_unary("i0", jnp.i0)  # Cephes' Chebyshev expansions, like ATen's calc_i0 / calc_i0e / calc_i1 / calc_i1e
_unary("special_i0e", jsp.i0e)
_unary("special_i1", jsp.i1)
_unary("special_i1e", jsp.i1e)


@functools.partial(jax.jit, static_argnames="upper")
def _igamma(a, x, upper):
    """Regularized incomplete gamma with ATen's (SciPy's) boundary values, checked in ATen's order:
    x < 0 or a < 0 -> NaN; a == 0 -> 1 (P) / 0 (Q) for x > 0 else NaN; x == 0 -> 0 / 1;
    a == inf -> NaN if x == inf else 0 / 1; x == inf -> 1 / 0 (so NaN a with x == 0 or inf is defined)."""
    a, x = jnp.broadcast_arrays(a, x)
    value = jsp.gammaincc(a, x) if upper else jsp.gammainc(a, x)
    lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)  # value at x == 0 and as x -> inf
    nan = jnp.full_like(value, jnp.nan)
    value = jnp.where(jnp.isinf(x), hi, value)
    value = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, lo), value)
    value = jnp.where(x == 0, lo, value)
    value = jnp.where(a == 0, jnp.where(x > 0, hi, nan), value)
    return jnp.where((x < 0) | (a < 0), nan, value)


def _igamma_operands(a, x, op, spec):
    # CPU's kernel runs in the inputs' common dtype, which has no integer version (meta says float32)
    a, x = jnp.asarray(a), jnp.asarray(x)  # 0-dim cpu tensors arrive as python scalars
    common = jnp.promote_types(a.dtype, x.dtype)
    if not jnp.issubdtype(common, jnp.inexact):
        name = "Bool" if common == jnp.bool_ else dtypes.SCALAR_NAMES[dtypes.to_torch(common)]
        raise NotImplementedError(f'"{op}_cpu" not implemented for \'{name}\'')
    dt = dtypes.to_jax(spec.dtype)
    return opmath(a.astype(dt)), opmath(x.astype(dt))


@lower("igamma", dtypes=FLOATING, needs_spec=True)
def igamma(a, x, *, spec):
    return _igamma(*_igamma_operands(a, x, "igamma", spec), upper=False)


@lower("igammac", dtypes=FLOATING, needs_spec=True)
def igammac(a, x, *, spec):
    return _igamma(*_igamma_operands(a, x, "igammac", spec), upper=True)


# ---------------------------------------------------------------- Bessel and Airy functions (ATen/Cephes ports)
# coefficient tables in cephes.py
_PI_4, _3PI_4, _SQRT_2_PI, _2_PI = 0.785398163397448309615660845819875721, \
    2.356194490192344928846982537459627163, 0.797884560802865355879892119868763737, \
    0.636619772367581343075535053490057448


def _horner(coefficients, z):
    result = jnp.zeros_like(z)
    for c in coefficients:
        result = result * z + c
    return result


def _chebyshev(coefficients, t):
    """Cephes' chbevl (ATen's unrolled p/q/a recurrences): 0.5 * (b0 - b2)."""
    p, q, a = jnp.zeros_like(t), jnp.zeros_like(t), jnp.full_like(t, coefficients[0])
    for c in coefficients[1:]:
        p, q = q, a
        a = t * q - p + c
    return 0.5 * (a - p)


def _bessel_asymptotic(c, x, phase, second_kind):
    # x > 5: sqrt(2 / (pi x)) (P cos(x - phase) - 5/x Q sin(x - phase)) (Y: sin and +cos)
    z = 25.0 / (x * x)
    p = _horner(c["PP"], z) / _horner(c["PQ"], z)
    q = 5.0 / x * (_horner(c["QP"], z) / _horner(c["QQ"], z))
    s, co = jnp.sin(x - phase), jnp.cos(x - phase)
    value = p * s + q * co if second_kind else p * co - q * s
    return value * _SQRT_2_PI / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    c = cephes.BESSEL_J0
    small, large = jnp.minimum(x, 5.0), jnp.maximum(x, 5.0)
    z = small * small
    series = (z - 5.78318596294678452118e+00) * (z - 3.04712623436620863991e+01) * \
        _horner(c["RP"], z) / _horner(c["RQ"], z)
    series = jnp.where(small < 1e-5, 1.0 - small * small / 4.0, series)
    return jnp.where(x <= 5.0, series, _bessel_asymptotic(c, large, _PI_4, False))


def _j1(x):
    sign, x = jnp.sign(x), jnp.abs(x)
    c = cephes.BESSEL_J1
    small, large = jnp.minimum(x, 5.0), jnp.maximum(x, 5.0)
    z = small * small
    series = _horner(c["RP"], z) / _horner(c["RQ"], z) * small * \
        (z - 1.46819706421238932572e+01) * (z - 4.92184563216946036703e+01)
    value = jnp.where(x <= 5.0, series, _bessel_asymptotic(c, large, _3PI_4, False))
    return jnp.where(sign < 0, -value, value)  # odd; sign(NaN) keeps NaN


def _y0(x):
    c = cephes.BESSEL_Y0
    small, large = jnp.clip(x, 1e-300 if x.dtype == jnp.float64 else 1e-37, 5.0), jnp.maximum(x, 5.0)
    z = small * small
    series = _horner(c["YP"], z) / _horner(c["YQ"], z) + _2_PI * jnp.log(small) * _j0(small)
    value = jnp.where(x <= 5.0, series, _bessel_asymptotic(c, large, _PI_4, True))
    return jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, value))


def _y1(x):
    c = cephes.BESSEL_Y1
    small, large = jnp.clip(x, 1e-300 if x.dtype == jnp.float64 else 1e-37, 5.0), jnp.maximum(x, 5.0)
    z = small * small
    series = small * (_horner(c["YP"], z) / _horner(c["YQ"], z)) + \
        _2_PI * (_j1(small) * jnp.log(small) - 1.0 / small)
    value = jnp.where(x <= 5.0, series, _bessel_asymptotic(c, large, _3PI_4, True))
    return jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, value))


def _k_family(c, x, order, scaled):
    """K0/K1 (scaled: times exp(x)): Chebyshev series in x^2 - 2 up to 2, in 8/x - 2 above."""
    small, large = jnp.clip(x, 1e-300 if x.dtype == jnp.float64 else 1e-37, 2.0), jnp.maximum(x, 2.0)
    a = _chebyshev(c["A"], small * small - 2.0)
    if order == 0:
        series = a - jnp.log(0.5 * small) * jnp.i0(small)
    else:
        series = jnp.log(0.5 * small) * jsp.i1(small) + a / small
    tail = _chebyshev(c["B"], 8.0 / large - 2.0) / jnp.sqrt(large)
    if scaled:
        series = series * jnp.exp(small)
    else:
        tail = jnp.exp(-large) * tail
    value = jnp.where(x <= 2.0, series, tail)
    return jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, value))


def _airy_ai(x):
    c = cephes.AIRY_AI
    eps = jnp.finfo(x.dtype).eps
    # x < -2.09: asymptotic oscillating form
    neg = jnp.minimum(x, -2.09)
    zeta_neg = -2.0 * neg * jnp.sqrt(-neg) / 3.0
    z = 1.0 / zeta_neg
    zz = z * z
    t = zeta_neg + 0.25 * math.pi
    oscillating = _ISPI / jnp.sqrt(jnp.sqrt(-neg)) * (
        jnp.sin(t) * (1.0 + zz * _horner(c["AFN"], zz) / _horner(c["AFD"], zz))
        - jnp.cos(t) * (z * _horner(c["AGN"], zz) / _horner(c["AGD"], zz)))
    # x >= 2.09: exponentially decaying form (used alone above 8.3203353)
    pos = jnp.maximum(x, 2.09)
    zeta = 2.0 * pos * jnp.sqrt(pos) / 3.0
    decaying = _ISPI * (_horner(c["AN"], 1.0 / zeta) / _horner(c["AD"], 1.0 / zeta)) / \
        (2.0 * jnp.sqrt(jnp.sqrt(pos)) * jnp.exp(zeta))
    # |x| moderate: Maclaurin series f, g summed until the relative term is below eps
    xs = jnp.where((x >= -2.09) & (x < 2.09), x, 0.0)
    cube = xs * xs * xs

    def body(state):
        f, g, k, m, n, t = state
        live = t > eps
        m1 = m * cube
        k1 = k + 1.0
        m1 = m1 / k1
        n1 = n * cube
        k2 = k1 + 1.0
        n1 = n1 / k2
        m1 = m1 / k2
        f1 = f + m1
        k3 = k2 + 1.0
        n1 = n1 / k3
        g1 = g + n1
        t1 = jnp.abs(m1 / f1)
        pick = lambda new, old: jnp.where(live, new, old)  # noqa: E731
        return pick(f1, f), pick(g1, g), pick(k3, k), pick(m1, m), pick(n1, n), pick(t1, t)

    one = jnp.ones_like(x)
    state = (one, xs, one, one, xs, one)
    f, g, *_ = lax.while_loop(lambda s: jnp.any(s[5] > eps), body, state)
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    value = jnp.where(x < -2.09, oscillating, jnp.where(x >= 2.09, decaying, series))
    return jnp.where(jnp.isinf(x), jnp.nan, jnp.where(x > 103.892, 0.0, jnp.where(jnp.isnan(x), x, value)))


def _spherical_j0(x):
    # ATen: a degree-12 series below 0.5 (so j0(0) == 1), sin(x) / x above, 0 at +-inf
    z = x * x
    series = 1.0 + z * (-1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (
        1.0 / 362880.0 + z * (-1.0 / 39916800.0 + z * (1.0 / 6227020800.0))))))
    value = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), 0.0, value)


for _name, _fn in {
    "special_bessel_j0": _j0, "special_bessel_j1": _j1, "special_bessel_y0": _y0, "special_bessel_y1": _y1,
    "special_modified_bessel_i0": jnp.i0, "special_modified_bessel_i1": jsp.i1,
    "special_modified_bessel_k0": lambda x: _k_family(cephes.MODIFIED_BESSEL_K0, x, 0, False),
    "special_modified_bessel_k1": lambda x: _k_family(cephes.MODIFIED_BESSEL_K1, x, 1, False),
    "special_scaled_modified_bessel_k0": lambda x: _k_family(cephes.SCALED_MODIFIED_BESSEL_K0, x, 0, True),
    "special_scaled_modified_bessel_k1": lambda x: _k_family(cephes.SCALED_MODIFIED_BESSEL_K1, x, 1, True),
    "special_airy_ai": _airy_ai, "special_spherical_bessel_j0": _spherical_j0,
}.items():
    _unary(_name, jax.jit(_fn))


# ---------------------------------------------------------------- orthogonal polynomials (ATen's recurrences)
def _degree(n):
    """ATen casts n to int64; NaN/inf/out-of-range n become negative (x86's cvttsd2si), so the result is 0."""
    if jnp.issubdtype(n.dtype, jnp.integer):
        return n.astype(jnp.int64)
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0 ** 63)
    return jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)), -1).astype(jnp.int64)


def _recurrence(n, p0, p1, step, start, stop, inc=1, nan_stops=True):
    """ATen's loops ``r = step(k, q, p); p = q; q = r`` for k = start, start + inc, ... until
    ``stop(k, n)`` (or q is NaN where ATen checks it), vectorized: each element stops on its own.
    p0, p1 are the two first terms; returns the last one."""
    def live(state):
        k, p, q = state
        on = ~stop(k, n)
        return on & ~jnp.isnan(q) if nan_stops else on

    def body(state):
        k, p, q = state
        on = live(state)
        r = step(k, q, p)
        return k + inc, jnp.where(on, q, p), jnp.where(on, r, q)

    _, _, q = lax.while_loop(lambda s: jnp.any(live(s)), body, (jnp.int64(start), p0, p1))
    return q


def _chebyshev_like(x, n, first, cutoff, closed, at_one, at_minus_one, t):
    """T/U/V/W (and shifted, t = 2x - 1): the three-term recurrence 2t p_k - p_{k-1}, ATen's closed
    trigonometric forms for n > cutoff inside (-1, 1), and its exact values at t = +-1."""
    one = jnp.ones_like(t)
    rec = _recurrence(n, one, first(t), lambda k, q, p: (t + t) * q - p, 2, lambda k, n: k > n)
    value = jnp.where(n == 0, one, jnp.where(n == 1, first(t), rec))
    inside = (n > cutoff) & (jnp.abs(t) < 1)
    value = jnp.where(inside, closed(jnp.where(inside, t, 0.0), n.astype(t.dtype)), value)
    nf = n.astype(t.dtype)
    value = jnp.where(t == 1, at_one(nf), jnp.where(t == -1, at_minus_one(nf, n % 2 == 0), value))
    return jnp.where(n < 0, jnp.zeros_like(t), value)


def _cheb_u_closed(t, n):
    theta = jnp.arccos(t)
    s = jnp.sin(theta)
    return jnp.where(s != 0, jnp.sin((n + 1) * theta) / jnp.where(s != 0, s, 1),
                     (n + 1) * jnp.cos((n + 1) * theta) / t)


def _cheb_v_closed(t, n):
    theta = jnp.arccos(t)
    return jnp.where(jnp.sin(theta / 2) != 1, jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2),
                     jnp.where(n % 2 == 0, n + n + 1, -(n + n + 1)))


def _cheb_w_closed(t, n, x_positive):
    theta = jnp.arccos(t)
    at_edge = jnp.where(x_positive, n + n + 1, jnp.where(n % 2 == 0, 1.0, -1.0))
    return jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2), at_edge)


_sign_parity = lambda value: (lambda nf, even: jnp.where(even, value(nf), -value(nf)))  # noqa: E731
_CHEBYSHEV = {  # kind -> (p1(t), cutoff for the closed form, closed form, value at t=1, value at t=-1)
    "t": (lambda t: t, 6, lambda t, n: jnp.cos(n * jnp.arccos(t)), lambda nf: 1.0, _sign_parity(lambda nf: 1.0)),
    "u": (lambda t: t + t, 8, _cheb_u_closed, lambda nf: nf + 1, _sign_parity(lambda nf: nf + 1)),
    "v": (lambda t: t + t - 1, 8, _cheb_v_closed, lambda nf: 1.0, _sign_parity(lambda nf: nf + nf + 1)),
    "w": (lambda t: t + t + 1, 8, lambda t, n: _cheb_w_closed(t, n, t > 0), lambda nf: nf + nf + 1,
          _sign_parity(lambda nf: 1.0)),
}
# the shifted kinds: same in t = 2x - 1 except ATen's own cutoffs (6; 4 for W) and its exact tests on x
_SHIFTED_CUTOFF = {"t": 6, "u": 6, "v": 6, "w": 4}


@functools.partial(jax.jit, static_argnames=("kind", "shifted"))
def _chebyshev_poly(x, n, kind, shifted):
    first, cutoff, closed, at_one, at_minus_one = _CHEBYSHEV[kind]
    x, n = jnp.broadcast_arrays(x, _degree(n))
    if not shifted:
        return _chebyshev_like(x, n, first, cutoff, closed, at_one, at_minus_one, x)
    t = x + x - 1.0
    # ATen tests x == 1 / x == 0 (not t == +-1) and W's edge sign on x > 0, which is t > -1 here
    if kind == "w":
        closed = lambda tt, nn: _cheb_w_closed(tt, nn, False)  # noqa: E731
    value = _chebyshev_like(t, n, first, _SHIFTED_CUTOFF[kind], closed, at_one, at_minus_one, t)
    nf = n.astype(x.dtype)
    value = jnp.where(x == 1, at_one(nf), jnp.where(x == 0, at_minus_one(nf, n % 2 == 0), value))
    return jnp.where(n < 0, jnp.zeros_like(x), value)


def _hermite_limit(dtype):
    return 128 if dtype == jnp.float32 else 512  # ATen: NaN above this degree


def _polynomial(x, n, p1, step, inc, stop, nan_stops=True):
    """n < 0 -> 0, n == 0 -> 1, n == 1 -> p1, else ATen's recurrence from (1, p1)."""
    one = jnp.ones_like(x)
    start = 2 if inc == 2 else 1
    rec = _recurrence(n, one, p1, step, start, stop, inc, nan_stops)
    value = jnp.where(n == 0, one, jnp.where(n == 1, p1, rec))
    return jnp.where(n < 0, jnp.zeros_like(x), value)


@jax.jit
def _hermite_h(x, n):
    x, n = jnp.broadcast_arrays(x, _degree(n))
    value = _polynomial(x, n, x + x, lambda k, q, p: (x + x) * q - k.astype(x.dtype) * p, 2,
                        lambda k, n: k >= n + n, nan_stops=False)
    return jnp.where(n > _hermite_limit(x.dtype), jnp.nan, value)


@jax.jit
def _hermite_he(x, n):
    x, n = jnp.broadcast_arrays(x, _degree(n))
    value = _polynomial(x, n, x, lambda k, q, p: x * q - k.astype(x.dtype) * p, 1,
                        lambda k, n: k >= n, nan_stops=False)
    return jnp.where(n > _hermite_limit(x.dtype), jnp.nan, value)


@jax.jit
def _laguerre_l(x, n):
    x, n = jnp.broadcast_arrays(x, _degree(n))

    def step(k, q, p):
        k = k.astype(x.dtype)
        return (((k + k) + (1.0 - x)) * q - k * p) / (k + 1)

    value = _polynomial(x, n, 1.0 - x, step, 1, lambda k, n: k >= n)
    return jnp.where((x == 0) & (n >= 0), 1.0, value)


@jax.jit
def _legendre_p(x, n):
    x, n = jnp.broadcast_arrays(x, _degree(n))

    def step(k, q, p):
        k = k.astype(x.dtype)
        return ((k + k + 1) * x * q - k * p) / (k + 1)

    value = _polynomial(x, n, x, step, 1, lambda k, n: k >= n)
    at_one = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)
    return jnp.where((jnp.abs(x) == 1) & (n >= 0), at_one, value)


_POLYNOMIALS = {
    **{f"special_chebyshev_polynomial_{k}": functools.partial(_chebyshev_poly, kind=k, shifted=False) for k in "tuvw"},
    **{f"special_shifted_chebyshev_polynomial_{k}": functools.partial(_chebyshev_poly, kind=k, shifted=True)
       for k in "tuvw"},
    "special_hermite_polynomial_h": _hermite_h, "special_hermite_polynomial_he": _hermite_he,
    "special_laguerre_polynomial_l": _laguerre_l, "special_legendre_polynomial_p": _legendre_p,
}


def _polynomial_lowering(name, fn):
    def lowering(x, n, *, spec):
        dt = dtypes.to_jax(spec.dtype)
        return fn(opmath(jnp.asarray(x, dt)), opmath(jnp.asarray(n, dt)))

    lowering.__name__ = lowering.__qualname__ = name
    lower(name, f"{name}.x_scalar", f"{name}.n_scalar", promote=Promote.RESULT, dtypes=FLOAT_AND_DOUBLE,
          cpu_kernel=name.removeprefix("special_") + "_cpu", needs_spec=True)(lowering)


for _name, _fn in _POLYNOMIALS.items():
    _polynomial_lowering(_name, _fn)


# ---------------------------------------------------------------- trace, renorm
@lower("trace", needs_spec=True)
def trace(x, *, spec):
    if x.dtype == jnp.bool_:  # torch's meta says int64; CPU's kernel has no Bool version
        raise NotImplementedError('"trace" not implemented for \'Bool\'')
    if x.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return jnp.trace(x.astype(dtypes.to_jax(spec.dtype)))  # integers accumulate in int64


@lower("renorm", promote=Promote.RESULT, needs_spec=True)
def renorm(x, p, dim, maxnorm, *, spec):
    # ATen: each slice along dim with norm > maxnorm is scaled by maxnorm / (norm + 1e-7); the norm is
    # taken in acc_type (float64 for float32 on CPU) and the factor rounded to x's dtype
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. "
                           f"Got {dtypes.SCALAR_NAMES.get(spec.dtype, x.dtype)}")
    if x.ndim == 0:
        raise RuntimeError("renorm: input needs at least 2 dimensions, got 0 dimensions")
    axes = tuple(d for d in range(x.ndim) if d != norm_dim(dim, x.ndim))
    acc = acc64(opmath(x))
    norm = p_norm(acc, float(p), axes, True)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0).astype(opmath(x).dtype)
    return opmath(x) * factor
