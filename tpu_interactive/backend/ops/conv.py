"""Convolution, pooling, upsampling, im2col/col2im.

Convolutions are one ``lax.conv_general_dilated`` (transposed = input-dilated conv with a flipped,
group-transposed kernel); their backward is ``jax.vjp`` of the same function, so every
stride/padding/dilation/groups/output_padding combination has a consistent gradient.

Pooling windows are gathered as an explicit window axis (N-d, so 1d/2d/3d share one code path) with
a validity mask: max pooling picks the element CPU PyTorch picks (first maximum in scan order, the
last NaN if any) and returns CPU's flattened per-plane indices; backward scatter-adds into them.
Upsampling follows ATen's float32 source-index arithmetic exactly (nearest, nearest-exact, linear).
Output shapes always come from torch's meta kernels (ceil_mode etc. are torch's decision).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..dispatch import current_spec
from ..registry import lower

_PREC = jax.lax.Precision.HIGHEST
_HALF = (jnp.float16, jnp.bfloat16)


def _out_shape(i=0):
    outs = current_spec().outputs
    return (outs[i] if isinstance(outs, tuple) else outs).shape


def _expand(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


# ---------------------------------------------------------------- convolution
def _dimension_numbers(n):
    sp = "DHW"[3 - n:] if n <= 3 else None
    if sp is None:
        raise NotImplementedError(f"convolution with {n} spatial dims is not supported on tpu")
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _transpose_kernel(w, groups):
    """ConvTranspose weight (C_in, O/g, *k) -> an ordinary conv weight (O, C_in/g, *k), flipped."""
    c_in, o_per_g = w.shape[:2]
    k = w.shape[2:]
    w = w.reshape((groups, c_in // groups, o_per_g) + k)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * o_per_g, c_in // groups) + k)
    return jnp.flip(w, axis=tuple(range(2, 2 + len(k))))


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    acc = jnp.float32 if x.dtype in _HALF else None
    if transposed:
        output_padding = _expand(output_padding, n)
        k = w.shape[2:]
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
                for kk, p, d, op in zip(k, padding, dilation, output_padding)]
        out = jax.lax.conv_general_dilated(
            x, _transpose_kernel(w, groups), window_strides=(1,) * n, padding=pads, lhs_dilation=stride,
            rhs_dilation=dilation, dimension_numbers=_dimension_numbers(n), feature_group_count=groups,
            precision=_PREC, preferred_element_type=acc)
    else:
        out = jax.lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(n), feature_group_count=groups, precision=_PREC,
            preferred_element_type=acc)
    return out.astype(x.dtype)


def _bias_shape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


@lower("convolution", promote="result")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if x.ndim < 3:
        raise RuntimeError(f"convolution expects a batched input of at least 3 dims, got {x.shape}")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape(_bias_shape(out.ndim))
    return out


def _conv_backward(grad, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        fn = lambda a, b: _conv(a, b, stride, padding, dilation, transposed, output_padding, groups)  # noqa: E731
        out, vjp = jax.vjp(fn, x, w)
        gi, gw = vjp(grad.astype(out.dtype))
        grad_input = gi if output_mask[0] else None
        grad_weight = gw if output_mask[1] else None
    if output_mask[2]:
        acc = jnp.float32 if grad.dtype in _HALF else grad.dtype
        grad_bias = jnp.sum(grad.astype(acc), axis=(0,) + tuple(range(2, grad.ndim))).astype(grad.dtype)
    return grad_input, grad_weight, grad_bias


@lower("convolution_backward")
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    return _conv_backward(grad, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask)


# The *_overrideable pair is what aten::_convolution calls for a PrivateUse1 device. Their meta kernels
# are torch's "not implemented" stubs, so output metadata comes from the lowering itself (meta=False).
@lower("convolution_overrideable", meta=False)
def convolution_overrideable(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lower("convolution_backward_overrideable", meta=False)
def convolution_backward_overrideable(grad, x, w, stride, padding, dilation, transposed, output_padding, groups,
                                      output_mask):
    grads = _conv_backward(grad, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    # without meta there is no "undefined" output: an unrequested gradient is returned as zeros
    return tuple(g if g is not None else jnp.zeros(shape, grad.dtype)
                 for g, shape in zip(grads, (x.shape, w.shape, (w.shape[1 if transposed else 0] * (groups if transposed else 1),))))


# ---------------------------------------------------------------- pooling windows
def _window_positions(in_size, out_size, kernel, stride, padding, dilation):
    """(out, kernel) input positions of every window element along one axis, and their validity."""
    pos = np.arange(out_size)[:, None] * stride - padding + np.arange(kernel)[None, :] * dilation
    return pos, (pos >= 0) & (pos < in_size)


def _gather_windows(x, axes_pos):
    """x (..., *spatial) -> (..., *out, K) window values, plus the (K-flattened) validity and
    per-plane flat input index of every window element."""
    n = len(axes_pos)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    for d, (pos, _) in enumerate(axes_pos):
        axis = lead + 2 * d
        clipped = np.clip(pos, 0, spatial[d] - 1)
        x = jnp.take(x, jnp.asarray(clipped.reshape(-1)), axis=axis)
        x = x.reshape(x.shape[:axis] + pos.shape + x.shape[axis + 1:])
    # (..., O1, K1, O2, K2, ...) -> (..., O1, O2, ..., K1, K2, ...)
    perm = list(range(lead)) + [lead + 2 * d for d in range(n)] + [lead + 2 * d + 1 for d in range(n)]
    x = jnp.transpose(x, perm)
    outs = tuple(p.shape[0] for p, _ in axes_pos)
    # explicit window size: reshape can't infer -1 when the batch is empty
    x = x.reshape(x.shape[:lead] + outs + (math.prod(p.shape[1] for p, _ in axes_pos),))
    valid = np.ones((), bool)
    flat = np.zeros((), np.int64)
    plane_strides = [int(np.prod(spatial[d + 1:])) for d in range(n)]
    for d, (pos, ok) in enumerate(axes_pos):
        shape = [1] * (2 * n)
        shape[d], shape[n + d] = pos.shape
        valid = valid & ok.reshape(shape)
        flat = flat + pos.reshape(shape) * plane_strides[d]
    full = outs + tuple(p.shape[1] for p, _ in axes_pos)
    flat = np.broadcast_to(flat, full).reshape(outs + (-1,))
    valid = np.broadcast_to(valid, full).reshape(outs + (-1,))
    return x, valid, flat


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min


def _select_max(win, valid, flat):
    """Max over the last (window) axis with CPU's choice: first maximum, or the last NaN."""
    valid = jnp.asarray(valid)
    masked = jnp.where(valid, win, jnp.asarray(_lowest(win.dtype), win.dtype))
    k_size = win.shape[-1]
    first_max = jnp.argmax((masked == jnp.max(masked, axis=-1, keepdims=True)) & valid, axis=-1)
    if jnp.issubdtype(win.dtype, jnp.inexact):
        nan = jnp.isnan(win) & valid
        last_nan = k_size - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        choice = jnp.where(jnp.any(nan, axis=-1), last_nan, first_max)
    else:
        choice = first_max
    out = jnp.take_along_axis(win, choice[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat), win.shape), choice[..., None], axis=-1)[..., 0]
    return out, idx


def _pool_params(n, kernel_size, stride, padding, dilation=1):
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n) if stride else kernel
    return kernel, stride, _expand(padding, n), _expand(dilation, n)


def _max_pool(x, n, kernel_size, stride, padding, dilation):
    kernel, stride, padding, dilation = _pool_params(n, kernel_size, stride, padding, dilation)
    outs = _out_shape(0)[-n:]
    spatial = x.shape[-n:]
    axes = [_window_positions(spatial[d], outs[d], kernel[d], stride[d], padding[d], dilation[d]) for d in range(n)]
    win, valid, flat = _gather_windows(x, axes)
    return _select_max(win, valid, flat)


@lower("max_pool2d_with_indices")
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation)


@lower("max_pool3d_with_indices")
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation)


def _scatter_to_planes(grad, indices, input_shape, n):
    """Sum grad into a zero input at the per-plane flat indices (max-pool backward)."""
    planes = int(np.prod(input_shape[:-n]))
    plane = int(np.prod(input_shape[-n:]))
    g = grad.reshape(planes, -1)
    idx = indices.reshape(planes, -1)
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), grad.dtype).at[rows, idx].add(g)
    return out.reshape(input_shape)


@lower("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_planes(grad, indices, x.shape, 2)


@lower("max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_planes(grad, indices, x.shape, 3)


def _avg_divisor(in_size, out_size, kernel, stride, padding, count_include_pad):
    start = np.arange(out_size) * stride - padding
    end = np.minimum(start + kernel, in_size + padding)
    size = end - start
    if not count_include_pad:
        size = np.minimum(end, in_size) - np.maximum(start, 0)
    return size


def _avg_pool(x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, outs):
    kernel, stride, padding, _ = _pool_params(n, kernel_size, stride, padding)
    spatial = x.shape[-n:]
    axes = [_window_positions(spatial[d], outs[d], kernel[d], stride[d], padding[d], 1) for d in range(n)]
    acc = jnp.float32 if x.dtype in _HALF else x.dtype
    win, valid, _ = _gather_windows(x.astype(acc), axes)
    total = jnp.sum(jnp.where(jnp.asarray(valid), win, 0), axis=-1)
    if divisor_override:
        divisor = np.asarray(divisor_override)
    else:
        divisor = np.ones((), np.int64)
        for d in range(n):
            shape = [1] * n
            shape[d] = outs[d]
            size = _avg_divisor(spatial[d], outs[d], kernel[d], stride[d], padding[d], count_include_pad)
            divisor = divisor * size.reshape(shape)
    if jnp.issubdtype(acc, jnp.integer):
        # C++ integer division truncates (lax.div does not broadcast: divisor to total's shape)
        return jax.lax.div(total, jnp.broadcast_to(jnp.asarray(divisor, acc), total.shape))
    return (total / jnp.asarray(divisor, acc)).astype(x.dtype)


def _avg_pool_backward(grad, x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    outs = grad.shape[-n:]
    fn = lambda a: _avg_pool(a, n, kernel_size, stride, padding, ceil_mode, count_include_pad,  # noqa: E731
                             divisor_override, outs)
    _, vjp = jax.vjp(fn, x)
    return vjp(grad.astype(x.dtype))[0]


@lower("avg_pool2d")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     _out_shape()[-2:])


@lower("avg_pool3d")
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     _out_shape()[-3:])


@lower("avg_pool2d_backward")
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


@lower("avg_pool3d_backward")
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


# ---------------------------------------------------------------- adaptive pooling
def _adaptive_bounds(in_size, out_size):
    o = np.arange(out_size)
    return (o * in_size) // out_size, -((-(o + 1) * in_size) // out_size)  # floor, ceil


def _adaptive_matrix(in_size, out_size):
    start, end = _adaptive_bounds(in_size, out_size)
    i = np.arange(in_size)[None, :]
    inside = (i >= start[:, None]) & (i < end[:, None])
    return inside / (end - start)[:, None]


def _adaptive_avg(x, outs):
    n = len(outs)
    acc = jnp.float32 if x.dtype in _HALF else x.dtype
    y = x.astype(acc)
    for d in range(n):
        axis = x.ndim - n + d
        m = jnp.asarray(_adaptive_matrix(x.shape[axis], outs[d]), acc)
        y = jnp.moveaxis(jnp.tensordot(y, m, axes=([axis], [1]), precision=_PREC), -1, axis)
    return y.astype(x.dtype)


@lower("_adaptive_avg_pool2d")
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, _out_shape()[-2:])


@lower("_adaptive_avg_pool3d")
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, _out_shape()[-3:])


def _adaptive_avg_backward(grad, x, n):
    _, vjp = jax.vjp(lambda a: _adaptive_avg(a, grad.shape[-n:]), x)
    return vjp(grad.astype(x.dtype))[0]


@lower("_adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 2)


@lower("_adaptive_avg_pool3d_backward")
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 3)


def _adaptive_positions(in_size, out_size):
    start, end = _adaptive_bounds(in_size, out_size)
    k = int((end - start).max()) if out_size else 1
    pos = start[:, None] + np.arange(k)[None, :]
    return pos, pos < end[:, None]


def _adaptive_max(x, n):
    outs = _out_shape(0)[-n:]
    axes = [_adaptive_positions(x.shape[x.ndim - n + d], outs[d]) for d in range(n)]
    win, valid, flat = _gather_windows(x, axes)
    return _select_max(win, valid, flat)


@lower("adaptive_max_pool2d")
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2)


@lower("adaptive_max_pool3d")
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3)


@lower("adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_planes(grad, indices, x.shape, 2)


@lower("adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_planes(grad, indices, x.shape, 3)


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


# ---------------------------------------------------------------- im2col / col2im (F.unfold / F.fold)
def _im2col(x, kernel_size, dilation, padding, stride, outs):
    kernel, dilation, padding, stride = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    axes = [_window_positions(x.shape[-2 + d], outs[d], kernel[d], stride[d], padding[d], dilation[d])
            for d in range(2)]
    win, valid, _ = _gather_windows(x, axes)  # (..., C, OH, OW, KH*KW)
    win = jnp.where(jnp.asarray(valid), win, jnp.zeros((), win.dtype))
    lead = win.shape[:-4]
    c, oh, ow, k = win.shape[-4:]
    win = jnp.moveaxis(win, -1, -3)  # (..., C, K, OH, OW)
    return win.reshape(lead + (c * k, oh * ow))


def _im2col_out_size(in_size, k, d, p, s):
    return (in_size + 2 * p - d * (k - 1) - 1) // s + 1


@lower("im2col")
def im2col(x, kernel_size, dilation, padding, stride):
    kernel, dil, pad, st = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    outs = [_im2col_out_size(x.shape[-2 + d], kernel[d], dil[d], pad[d], st[d]) for d in range(2)]
    return _im2col(x, kernel_size, dilation, padding, stride, outs)


@lower("col2im")
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    kernel, dil, pad, st = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    out_hw = list(output_size)
    outs = [_im2col_out_size(out_hw[d], kernel[d], dil[d], pad[d], st[d]) for d in range(2)]
    c = cols.shape[-2] // math.prod(kernel)
    image = cols.shape[:-2] + (c,) + tuple(out_hw)
    _, vjp = jax.vjp(lambda a: _im2col(a, kernel_size, dilation, padding, stride, outs), jnp.zeros(image, cols.dtype))
    return vjp(cols)[0]


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


def _grid_sample(x, grid, mode, padding, align_corners):
    """x (N, C, *spatial), grid (N, *out, nd) with coordinates ordered (x, y[, z]) -> (N, C, *out)."""
    if mode not in _GRID_MODES or padding not in _GRID_PADDINGS:
        raise RuntimeError(f"grid_sampler: unsupported interpolation mode {mode} or padding mode {padding}")
    nd = grid.shape[-1]
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out = grid.shape[1:-1]
    opmath = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
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


def _grid_backward(grad, x, grid, mode, padding, align_corners, output_mask):
    _, vjp = jax.vjp(lambda a, g: _grid_sample(a, g, mode, padding, align_corners), x, grid)
    gx, gg = vjp(grad.astype(x.dtype))
    return (gx if output_mask[0] else jnp.zeros_like(x)), gg


@lower("grid_sampler_2d", "grid_sampler_3d")
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lower("grid_sampler_2d_backward", "grid_sampler_3d_backward")
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask)


# ---------------------------------------------------------------- fractional max pooling
def _fractional_starts(sample, in_size, out_size, pool):
    """ATen's generate_intervals, in the input's float type: window starts (..., out_size)."""
    if out_size == 1:
        return jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    alpha = jnp.asarray(in_size - pool, sample.dtype) / jnp.asarray(out_size - 1, sample.dtype)
    i = jnp.arange(out_size - 1, dtype=sample.dtype)
    s = sample[..., None]
    starts = jnp.trunc((i + s) * alpha).astype(jnp.int64) - jnp.trunc(s * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, n, sample_order):
    """Per-(batch, channel) random windows; CPU's max choice and flat per-plane indices."""
    kernel, outs = list(kernel_size), list(output_size)
    batched = x.ndim == n + 2
    xb = x if batched else x[None]
    spatial = xb.shape[-n:]
    for d in range(n):
        if outs[d] + kernel[d] - 1 > spatial[d]:
            raise RuntimeError(f"fractional_max_pool{n}d(): pool size {kernel[d]} and output size {outs[d]} are too "
                               f"large for input size {spatial[d]}")
    samples = samples.astype(x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32)
    lin = 0
    strides = [int(np.prod(spatial[d + 1:])) for d in range(n)]
    for d in range(n):
        starts = _fractional_starts(samples[..., sample_order[d]], spatial[d], outs[d], kernel[d])  # (N, C, O)
        pos = starts[..., :, None] + jnp.arange(kernel[d])  # (N, C, O_d, K_d)
        # place O_d at axis d and K_d at axis n + d of an (N, C, O_1..O_n, K_1..K_n) grid
        shape = list(pos.shape[:2]) + [1] * (2 * n)
        shape[2 + d], shape[2 + n + d] = outs[d], kernel[d]
        lin = lin + pos.reshape(shape) * strides[d]
    nb, c = xb.shape[:2]
    lin = jnp.broadcast_to(lin, (nb, c) + tuple(outs) + tuple(kernel)).reshape(nb, c, -1)
    win = jnp.take_along_axis(xb.reshape(nb, c, -1), lin, axis=2)
    k = int(np.prod(kernel))
    win = win.reshape((nb, c) + tuple(outs) + (k,))
    out, idx = _select_max(win, jnp.ones((), bool), lin.reshape(win.shape))
    return (out, idx) if batched else (out[0], idx[0])


@lower("fractional_max_pool2d")
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2, (1, 0))  # samples are (w, h)


@lower("fractional_max_pool3d")
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3, (0, 1, 2))  # (t, h, w)


@lower("fractional_max_pool2d_backward")
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_planes(grad, indices, x.shape, 2)


@lower("fractional_max_pool3d_backward", meta=False)  # no meta kernel: the grad is x-shaped
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _scatter_to_planes(grad, indices, x.shape, 3)
