"""Upsampling (nearest, nearest-exact, linear, bicubic) and grid sampling, with their backwards.

Upsampling follows ATen's float32 source-index arithmetic exactly; grid_sample follows ATen's
GridSampler (modes, padding modes, align_corners). Output shapes come from torch's meta kernels.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..registry import lower
from ._common import compute_dtype

_PREC = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------- upsampling (ATen index math, float32)
def _scale_value(scale, in_size, out_size):
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(in_size) / np.float32(out_size)


def _nearest_index(in_size, out_size, scale, exact):
    o = np.arange(out_size, dtype=np.float32)
    s = _scale_value(scale, in_size, out_size)
    src = np.floor((o + np.float32(0.5)) * s) if exact else np.floor(o * s)
    return np.minimum(src.astype(np.int64), in_size - 1)


def _upsample_nearest(x, outs, scales, exact=False):
    n = len(outs)
    for d in range(n):
        axis = x.ndim - n + d
        x = jnp.take(x, jnp.asarray(_nearest_index(x.shape[axis], outs[d], scales[d], exact)), axis=axis)
    return x


def _linear_weights(in_size, out_size, align_corners, scale, opmath):
    o = np.arange(out_size).astype(opmath)
    if align_corners:
        s = opmath(in_size - 1) / opmath(out_size - 1) if out_size > 1 else opmath(0)
        src = s * o
    else:
        s = _scale_value(scale, in_size, out_size).astype(opmath)
        src = np.maximum(s * (o + opmath(0.5)) - opmath(0.5), opmath(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam1 = np.clip(src - i0.astype(opmath), 0, 1).astype(opmath)
    i1 = i0 + (i0 < in_size - 1)
    return i0, i1, (opmath(1) - lam1).astype(opmath), lam1


def _upsample_linear(x, outs, align_corners, scales):
    n = len(outs)
    opmath = np.float64 if x.dtype == jnp.float64 else np.float32
    y = x.astype(opmath)
    for d in range(n):
        axis = x.ndim - n + d
        i0, i1, l0, l1 = _linear_weights(x.shape[axis], outs[d], align_corners, scales[d], opmath)
        shape = [1] * y.ndim
        shape[axis] = outs[d]
        y = (jnp.take(y, jnp.asarray(i0), axis=axis) * jnp.asarray(l0).reshape(shape)
             + jnp.take(y, jnp.asarray(i1), axis=axis) * jnp.asarray(l1).reshape(shape))
    return y.astype(x.dtype)


def _upsample_backward(forward, grad, input_size):
    dtype = grad.dtype
    _, vjp = jax.vjp(forward, jnp.zeros(tuple(input_size), dtype))
    return vjp(grad)[0]


@lower("upsample_nearest1d")
def upsample_nearest1d(x, output_size, scales=None):
    return _upsample_nearest(x, list(output_size), [scales])


@lower("upsample_nearest2d")
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, list(output_size), [scales_h, scales_w])


@lower("upsample_nearest3d")
def upsample_nearest3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, list(output_size), [scales_d, scales_h, scales_w])


@lower("_upsample_nearest_exact1d")
def upsample_nearest_exact1d(x, output_size, scales=None):
    return _upsample_nearest(x, list(output_size), [scales], exact=True)


@lower("_upsample_nearest_exact2d")
def upsample_nearest_exact2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, list(output_size), [scales_h, scales_w], exact=True)


@lower("_upsample_nearest_exact3d")
def upsample_nearest_exact3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, list(output_size), [scales_d, scales_h, scales_w], exact=True)


@lower("upsample_nearest1d_backward")
def upsample_nearest1d_backward(grad, output_size, input_size, scales=None):
    return _upsample_backward(lambda a: _upsample_nearest(a, list(output_size), [scales]), grad, input_size)


@lower("upsample_nearest2d_backward")
def upsample_nearest2d_backward(grad, output_size, input_size, scales_h=None, scales_w=None):
    return _upsample_backward(lambda a: _upsample_nearest(a, list(output_size), [scales_h, scales_w]), grad,
                              input_size)


@lower("upsample_nearest3d_backward")
def upsample_nearest3d_backward(grad, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_backward(lambda a: _upsample_nearest(a, list(output_size), [scales_d, scales_h, scales_w]),
                              grad, input_size)


@lower("_upsample_nearest_exact2d_backward")
def upsample_nearest_exact2d_backward(grad, output_size, input_size, scales_h=None, scales_w=None):
    return _upsample_backward(lambda a: _upsample_nearest(a, list(output_size), [scales_h, scales_w], True),
                              grad, input_size)


@lower("upsample_linear1d")
def upsample_linear1d(x, output_size, align_corners, scales=None):
    return _upsample_linear(x, list(output_size), align_corners, [scales])


@lower("upsample_bilinear2d")
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(x, list(output_size), align_corners, [scales_h, scales_w])


@lower("upsample_trilinear3d")
def upsample_trilinear3d(x, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear(x, list(output_size), align_corners, [scales_d, scales_h, scales_w])


@lower("upsample_linear1d_backward")
def upsample_linear1d_backward(grad, output_size, input_size, align_corners, scales=None):
    return _upsample_backward(lambda a: _upsample_linear(a, list(output_size), align_corners, [scales]), grad,
                              input_size)


@lower("upsample_bilinear2d_backward")
def upsample_bilinear2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda a: _upsample_linear(a, list(output_size), align_corners, [scales_h, scales_w]), grad, input_size)


@lower("upsample_trilinear3d_backward")
def upsample_trilinear3d_backward(grad, output_size, input_size, align_corners, scales_d=None, scales_h=None,
                                  scales_w=None):
    return _upsample_backward(
        lambda a: _upsample_linear(a, list(output_size), align_corners, [scales_d, scales_h, scales_w]), grad,
        input_size)


# ---------------------------------------------------------------- more upsampling (nearest-exact, bicubic)
@lower("_upsample_nearest_exact1d_backward")
def upsample_nearest_exact1d_backward(grad, output_size, input_size, scales=None):
    return _upsample_backward(lambda a: _upsample_nearest(a, list(output_size), [scales], True), grad, input_size)


@lower("_upsample_nearest_exact3d_backward")
def upsample_nearest_exact3d_backward(grad, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda a: _upsample_nearest(a, list(output_size), [scales_d, scales_h, scales_w], True), grad, input_size)


_CUBIC_A = -0.75  # ATen's bicubic convolution constant (upsampling and grid_sample)


def _cubic_coefficients(t):
    """ATen's get_cubic_upsample_coefficients: weights of the taps at -1, 0, 1, 2 for offset t."""
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _upsample_bicubic(x, outs, align_corners, scales):
    opmath = np.float64 if x.dtype == jnp.float64 else np.float32
    y = x.astype(opmath)
    for d in range(2):
        axis = x.ndim - 2 + d
        in_size = x.shape[axis]
        o = np.arange(outs[d]).astype(opmath)
        if align_corners:  # area_pixel_compute_source_index(cubic=True): no clamping at 0
            s = opmath(in_size - 1) / opmath(outs[d] - 1) if outs[d] > 1 else opmath(0)
            src = s * o
        else:
            s = _scale_value(scales[d], in_size, outs[d]).astype(opmath)
            src = s * (o + opmath(0.5)) - opmath(0.5)
        i0 = np.floor(src).astype(np.int64)
        t = (src - i0.astype(opmath)).astype(opmath)
        shape = [1] * y.ndim
        shape[axis] = outs[d]
        acc = 0
        for k, w in enumerate(_cubic_coefficients(t)):
            idx = np.clip(i0 - 1 + k, 0, in_size - 1)  # upsample_get_value_bounded
            acc = acc + jnp.take(y, jnp.asarray(idx), axis=axis) * jnp.asarray(w.astype(opmath)).reshape(shape)
        y = acc
    return y.astype(x.dtype)


@lower("upsample_bicubic2d")
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bicubic(x, list(output_size), align_corners, [scales_h, scales_w])


@lower("upsample_bicubic2d_backward")
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda a: _upsample_bicubic(a, list(output_size), align_corners, [scales_h, scales_w]), grad, input_size)


# ---------------------------------------------------------------- grid_sample (ATen GridSampler semantics)
_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _clip(x, hi):
    # ATen's clip_coordinates_set_grad: zero gradient at and beyond the bounds (jnp.clip splits ties)
    return jnp.where(x <= 0, jnp.zeros((), x.dtype), jnp.where(x >= hi, jnp.asarray(hi, x.dtype), x))


def _reflect(x, twice_low, twice_high):
    """ATen's reflect_coordinates: fold x into [low, high] (gradient sign flips like ATen's)."""
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    x = x - low
    x = jnp.where(x < 0, -x, x)
    extra = jnp.fmod(x, span)
    even = jnp.fmod(jnp.floor(x / span), 2) == 0
    return jnp.where(even, extra + low, span - extra + low)


def _grid_coordinates(x, size, padding, align_corners):
    if padding == 1:
        return _clip(x, size - 1)
    if padding == 2:
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        return _clip(x, size - 1)
    return x


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


@lower("grid_sampler_2d", "grid_sampler_3d")
def grid_sampler(x, grid, mode, padding, align_corners):
    """x (N, C, *spatial), grid (N, *out, nd) with coordinates ordered (x, y[, z]) -> (N, C, *out)."""
    if mode not in _GRID_MODES or padding not in _GRID_PADDINGS:
        raise RuntimeError(f"grid_sampler: unsupported interpolation mode {mode} or padding mode {padding}")
    nd = grid.shape[-1]
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out = grid.shape[1:-1]
    opmath = compute_dtype(x.dtype)
    flat = x.astype(opmath).reshape(n, c, -1)
    grid = grid.astype(opmath)
    coords = [_unnormalize(grid[..., nd - 1 - d], spatial[d], align_corners) for d in range(nd)]
    strides = [int(np.prod(spatial[d + 1:])) for d in range(nd)]

    def tap(indices):  # integer coordinates per dim (N, *out) -> values (N, C, *out), 0 outside
        valid = functools.reduce(jnp.logical_and, [(i >= 0) & (i < s) for i, s in zip(indices, spatial)])
        lin = sum(jnp.clip(i, 0, s - 1) * st for i, s, st in zip(indices, spatial, strides))
        vals = jnp.take_along_axis(flat, lin.reshape(n, 1, -1), axis=2).reshape((n, c) + out)
        return jnp.where(valid[:, None], vals, jnp.zeros((), opmath))

    def as_index(v):  # NaN/huge coordinates become an out-of-range index (ATen: a zero tap)
        return jnp.where(jnp.isfinite(v) & (jnp.abs(v) < 2 ** 30), v, -2.0).astype(jnp.int64)

    if mode == 2:
        if nd != 2:
            raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
        base = [jnp.floor(v) for v in coords]
        weights = [_cubic_coefficients(v - b) for v, b in zip(coords, base)]
        result = 0
        for ky in range(4):
            for kx in range(4):
                idx = [_grid_coordinates(base[0] - 1 + ky, spatial[0], padding, align_corners),
                       _grid_coordinates(base[1] - 1 + kx, spatial[1], padding, align_corners)]
                w = weights[0][ky] * weights[1][kx]
                result = result + tap([as_index(jax.lax.stop_gradient(i)) for i in idx]) * w[:, None]
        return result.astype(x.dtype)
    src = [_grid_coordinates(v, s, padding, align_corners) for v, s in zip(coords, spatial)]
    if mode == 1:  # nearbyint: round half to even
        return tap([as_index(jnp.round(v)) for v in src]).astype(x.dtype)
    base = [jnp.floor(v) for v in src]
    result = 0
    for corner in np.ndindex(*(2,) * nd):
        w = functools.reduce(jnp.multiply, [(v - b) if k else (b + 1 - v) for v, b, k in zip(src, base, corner)])
        idx = [as_index(jax.lax.stop_gradient(b) + k) for b, k in zip(base, corner)]
        result = result + tap(idx) * w[:, None]
    return result.astype(x.dtype)


@lower("grid_sampler_2d_backward", "grid_sampler_3d_backward")
def grid_sampler_backward(grad, x, grid, mode, padding, align_corners, output_mask):
    _, vjp = jax.vjp(lambda a, g: grid_sampler(a, g, mode, padding, align_corners), x, grid)
    gx, gg = vjp(grad.astype(x.dtype))
    return (gx if output_mask[0] else jnp.zeros_like(x)), gg
