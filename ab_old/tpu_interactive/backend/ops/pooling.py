"""Sliding windows: max/avg (2d/3d), adaptive and fractional max pooling with their backwards, max
unpooling, and im2col/col2im (F.unfold / F.fold).

Pooling windows are gathered as an explicit window axis (N-d, so 1d/2d/3d share one code path) with
a validity mask: max pooling picks the element CPU PyTorch picks (first maximum in scan order, the
last NaN if any) and returns CPU's flattened per-plane indices; backward scatter-adds into them.
Output shapes always come from torch's meta kernels (ceil_mode etc. are torch's decision).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..registry import lower
from ._common import HALF, per_dim, range_checked

_PREC = jax.lax.Precision.HIGHEST


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
    kernel = per_dim(kernel_size, n)
    stride = per_dim(stride, n) if stride else kernel
    return kernel, stride, per_dim(padding, n), per_dim(dilation, n)


def _max_pool(x, n, kernel_size, stride, padding, dilation, spec):
    kernel, stride, padding, dilation = _pool_params(n, kernel_size, stride, padding, dilation)
    outs = spec.shape(0)[-n:]
    spatial = x.shape[-n:]
    axes = [_window_positions(spatial[d], outs[d], kernel[d], stride[d], padding[d], dilation[d]) for d in range(n)]
    win, valid, flat = _gather_windows(x, axes)
    return _select_max(win, valid, flat)


@lower("max_pool2d_with_indices", needs_spec=True)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, spec):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, spec)


@lower("max_pool3d_with_indices", needs_spec=True)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, spec):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, spec)


def _scatter_to_planes(grad, indices, input_shape, n):
    """Sum grad into a zero input at the per-plane flat indices (max-pool backward)."""
    planes = int(np.prod(input_shape[:-n]))
    plane = int(np.prod(input_shape[-n:]))
    if planes == 0:  # an empty batch: nothing to scatter (and no -1 to infer)
        return jnp.zeros(input_shape, grad.dtype)
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
    acc = jnp.float32 if x.dtype in HALF else x.dtype
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


# ---------------------------------------------------------------- max unpooling
@lower("max_unpool2d", needs_spec=True)
def max_unpool2d(x, indices, output_size, *, spec):
    return _max_unpool(x, indices, output_size, spec)


@lower("max_unpool3d", needs_spec=True)
def max_unpool3d(x, indices, output_size, stride, padding, *, spec):
    return _max_unpool(x, indices, output_size, spec)


def _max_unpool(x, indices, output_size, spec):
    """x's values at their per-plane flat indices of zeros of the output's shape. An index outside
    its plane is CPU's error (torch's decomposition would scatter it into the next plane or drop it)."""
    shape = tuple(spec.shape())
    plane = math.prod(output_size)
    if 0 in shape:
        return jnp.zeros(shape, x.dtype)
    sizes = "x".join(str(s) for s in output_size)
    # CPU run serially reports the last bad index (each one found overwrites the report): the first
    # one in reverse order
    in_report_order = jnp.flip(indices.reshape(-1))
    return range_checked(_unpool, (x, indices), in_report_order, plane,
                         lambda bad: f"Found an invalid max index: {bad} (output volumes are of size {sizes})",
                         negative=False, error=RuntimeError, static=(shape, plane))


def _unpool(x, indices, shape, plane):
    planes = math.prod(shape) // plane
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), x.dtype).at[rows, indices.reshape(planes, -1)].set(x.reshape(planes, -1))
    return out.reshape(shape)


@lower("avg_pool2d", needs_spec=True)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
               *, spec):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     spec.shape()[-2:])


@lower("avg_pool3d", needs_spec=True)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
               *, spec):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     spec.shape()[-3:])


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
    acc = jnp.float32 if x.dtype in HALF else x.dtype
    y = x.astype(acc)
    for d in range(n):
        axis = x.ndim - n + d
        m = jnp.asarray(_adaptive_matrix(x.shape[axis], outs[d]), acc)
        y = jnp.moveaxis(jnp.tensordot(y, m, axes=([axis], [1]), precision=_PREC), -1, axis)
    return y.astype(x.dtype)


@lower("_adaptive_avg_pool2d", needs_spec=True)
def adaptive_avg_pool2d(x, output_size, *, spec):
    return _adaptive_avg(x, spec.shape()[-2:])


@lower("_adaptive_avg_pool3d", needs_spec=True)
def adaptive_avg_pool3d(x, output_size, *, spec):
    return _adaptive_avg(x, spec.shape()[-3:])


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


def _adaptive_max(x, n, spec):
    outs = spec.shape(0)[-n:]
    axes = [_adaptive_positions(x.shape[x.ndim - n + d], outs[d]) for d in range(n)]
    win, valid, flat = _gather_windows(x, axes)
    return _select_max(win, valid, flat)


@lower("adaptive_max_pool2d", needs_spec=True)
def adaptive_max_pool2d(x, output_size, *, spec):
    return _adaptive_max(x, 2, spec)


@lower("adaptive_max_pool3d", needs_spec=True)
def adaptive_max_pool3d(x, output_size, *, spec):
    return _adaptive_max(x, 3, spec)


@lower("adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_planes(grad, indices, x.shape, 2)


@lower("adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_planes(grad, indices, x.shape, 3)


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
    if nb == 0:  # an empty batch (CPU refuses other empty dims before this): empty results, no windows
        out = jnp.zeros((0, c) + tuple(outs), x.dtype)
        return out, out.astype(jnp.int64)
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


# ---------------------------------------------------------------- im2col / col2im (F.unfold / F.fold)
def _im2col(x, kernel_size, dilation, padding, stride, outs):
    kernel, dilation, padding, stride = (per_dim(v, 2) for v in (kernel_size, dilation, padding, stride))
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
    kernel, dil, pad, st = (per_dim(v, 2) for v in (kernel_size, dilation, padding, stride))
    outs = [_im2col_out_size(x.shape[-2 + d], kernel[d], dil[d], pad[d], st[d]) for d in range(2)]
    return _im2col(x, kernel_size, dilation, padding, stride, outs)


@lower("col2im")
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    kernel, dil, pad, st = (per_dim(v, 2) for v in (kernel_size, dilation, padding, stride))
    out_hw = list(output_size)
    outs = [_im2col_out_size(out_hw[d], kernel[d], dil[d], pad[d], st[d]) for d in range(2)]
    c = cols.shape[-2] // math.prod(kernel)
    image = cols.shape[:-2] + (c,) + tuple(out_hw)
    _, vjp = jax.vjp(lambda a: _im2col(a, kernel_size, dilation, padding, stride, outs), jnp.zeros(image, cols.dtype))
    return vjp(cols)[0]
