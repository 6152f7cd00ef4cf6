"""Softmax, normalization layers and losses (forward and backward ops; embeddings are in embedding.py).

Statistics and softmax of float16/bfloat16 inputs are computed in float32 (torch's CPU acc type);
results are cast back to torch's output dtype by the dispatcher. Batch-norm forwards are raw
lowerings: in training they update ``running_mean``/``running_var`` in place (storage.write), as
torch's kernels do although the schema does not declare it.

Out-of-range class indices (nll_loss, multi_margin_loss) raise CPU's error: checked in the op's
program, then one scalar read (traced in, and raised when it runs, in a fused segment or a compiled
graph), as embedding's indices are; a NaN loss with no line to blame was the answer before.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .. import dtypes, storage
from ..dispatch import unbatched_target
from ..registry import Promote, lower
from ._common import code_checked, norm_dim, opmath, outside_unit_interval, range_checked

_aten = torch.ops.aten


def _on_axis(fn, x, dim):
    axis = norm_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, axis)


def _reduce(loss, reduction):
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _reduce_grad(grad, loss_numel, reduction):
    """Gradient of the reduction step, broadcastable to the elementwise loss."""
    return grad / loss_numel if reduction == 1 else grad


# ---------------------------------------------------------------- raw-lowering plumbing
def _read(t):
    if t is None:
        return None
    if t.device.type != "tpu":
        if t.dim() == 0:
            return jnp.asarray(t.item(), dtypes.to_jax(t.dtype))
        raise RuntimeError(f"Expected all tensors to be on the same device, but found tpu:0 and {t.device}")
    return storage.read(t)


def _emit(array, dtype, shape=None):
    shape = tuple(array.shape) if shape is None else tuple(shape)
    array = jnp.asarray(array).astype(dtypes.to_jax(dtype)).reshape(shape)
    return storage.new_tensor(array, shape, dtype)


def _empty(dtype):
    return storage.new_tensor(None, (0,), dtype)


# ---------------------------------------------------------------- softmax
@lower("_softmax")
def softmax(x, dim, half_to_float=False):
    return _on_axis(lambda v, a: jax.nn.softmax(opmath(v), axis=a), x, dim)


@lower("_log_softmax")
def log_softmax(x, dim, half_to_float=False):
    return _on_axis(lambda v, a: jax.nn.log_softmax(opmath(v), axis=a), x, dim)


@lower("_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype):
    if grad.shape != out.shape:  # CPU's check (torch's meta kernel lacks it; out was reshaped to grad's shape)
        raise RuntimeError(f"Expected tensor for argument #1 'grad' to have same size as tensor for argument #2 "
                           f"'output'; but {list(grad.shape)} does not equal {list(out.shape)} (while checking "
                           "arguments for softmax_backward)")
    def fn(g, a):
        y = opmath(out).reshape(g.shape)
        return y * (g - jnp.sum(g * y, axis=a, keepdims=True))
    return _on_axis(fn, opmath(grad), dim)


@lower("_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype):
    def fn(g, a):
        y = opmath(out).reshape(g.shape)
        return g - jnp.exp(y) * jnp.sum(g, axis=a, keepdims=True)
    return _on_axis(fn, opmath(grad), dim)


# ---------------------------------------------------------------- layer norm
def _norm_axes(x, normalized_shape):
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@lower("native_layer_norm")
def native_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    xf = opmath(x)
    axes = _norm_axes(x, normalized_shape)
    mu = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    y = (xf - mu) * rstd
    if weight is not None:
        y = y * opmath(weight)
    if bias is not None:
        y = y + opmath(bias)
    return y, mu, rstd


def _affine_norm_grad_input(g, xhat, rstd, axes, n):
    """d/dx of (x - mean) * rstd given upstream g (already multiplied by the weight)."""
    sum_g = jnp.sum(g, axis=axes, keepdims=True)
    sum_gx = jnp.sum(g * xhat, axis=axes, keepdims=True)
    return rstd / n * (n * g - sum_g - xhat * sum_gx)


@lower("native_layer_norm_backward")
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    g, xf = opmath(grad), opmath(x)
    axes = _norm_axes(x, normalized_shape)
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    n = math.prod(x.shape[a] for a in axes)
    xhat = (xf - mean) * rstd
    gw = g * opmath(weight) if weight is not None else g
    gi = _affine_norm_grad_input(gw, xhat, rstd, axes, n) if output_mask[0] else None
    g_weight = jnp.sum(g * xhat, axis=batch_axes) if output_mask[1] and weight is not None else None
    g_bias = jnp.sum(g, axis=batch_axes) if output_mask[2] and bias is not None else None
    return gi, g_weight, g_bias


# ---------------------------------------------------------------- batch norm
def _channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2) if x.ndim > 1 else (x.shape[0],)


def _bn_axes(x):
    return tuple(a for a in range(x.ndim) if a != 1)


def _bn_apply(xf, mean, invstd, weight, bias):
    shape = _channel_shape(xf)
    y = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        y = y * opmath(weight).reshape(shape)
    if bias is not None:
        y = y + opmath(bias).reshape(shape)
    return y


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    """Batch statistics; updates the running stats in place; returns (out, mean, invstd) arrays."""
    x = opmath(_read(input))
    axes = _bn_axes(x)
    n = x.size // x.shape[1]
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(_channel_shape(x))), axis=axes)
    invstd = jax.lax.rsqrt(var + eps)
    if running_mean is not None:
        storage.write(running_mean, (1 - momentum) * opmath(_read(running_mean)) + momentum * mean)
    if running_var is not None:
        unbiased = var * (n / (n - 1)) if n > 1 else jnp.full_like(var, jnp.nan)
        storage.write(running_var, (1 - momentum) * opmath(_read(running_var)) + momentum * unbiased)
    return _bn_apply(x, mean, invstd, _read(weight), _read(bias)), mean, invstd


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    if running_mean is None or running_var is None:
        raise RuntimeError("batch_norm: running_mean and running_var must be defined in evaluation mode")
    x = opmath(_read(input))
    invstd = jax.lax.rsqrt(opmath(_read(running_var)) + eps)
    return _bn_apply(x, opmath(_read(running_mean)), invstd, _read(weight), _read(bias))


def _stat_dtype(input):
    return torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype


def _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    stat = _stat_dtype(input)
    if training:
        out, mean, invstd = _bn_train(input, weight, bias, running_mean, running_var, momentum, eps)
        return _emit(out, input.dtype), _emit(mean, stat), _emit(invstd, stat)
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return _emit(out, input.dtype), _empty(stat), _empty(stat)  # CPU returns empty saved stats


@lower("native_batch_norm", raw=True)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower("_native_batch_norm_legit", raw=True)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower("_native_batch_norm_legit.no_stats", raw=True)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _bn_forward(input, weight, bias, None, None, training, momentum, eps)


@lower("_native_batch_norm_legit_no_training", raw=True)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, False, momentum, eps)


@lower("_batch_norm_with_update", raw=True)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd = _bn_forward(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, storage.new_tensor(None, (0,), torch.uint8)


def _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps):
    g, xf = opmath(grad), opmath(x)
    shape, axes = _channel_shape(xf), _bn_axes(xf)
    if train:
        mean, invstd = opmath(save_mean), opmath(save_invstd)
    else:
        mean, invstd = opmath(running_mean), jax.lax.rsqrt(opmath(running_var) + eps)
    xhat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    w = opmath(weight).reshape(shape) if weight is not None else 1.0
    # torch's meta kernel declares all three outputs whatever output_mask says, so all are computed
    # (XLA drops the unused ones under jit)
    if train:
        gi = _affine_norm_grad_input(g * w, xhat, invstd.reshape(shape), axes, xf.size // xf.shape[1])
    else:
        gi = g * w * invstd.reshape(shape)
    return gi, jnp.sum(g * xhat, axis=axes), jnp.sum(g, axis=axes)


@lower("native_batch_norm_backward")
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps)


@lower("batch_norm_backward")
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    return _bn_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps)


# ---------------------------------------------------------------- group norm
def _grouped(x, n, group):
    return x.reshape(n, group, -1)


@lower("native_group_norm")
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    for name, param in (("weight", weight), ("bias", bias)):  # CPU's checks (torch's meta kernel lacks them)
        if param is not None and (param.ndim != 1 or param.size != C):
            shown = weight if weight is not None else param  # CPU's bias message prints weight's shape
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of channels in input, "
                               f"but got {name} of shape {list(shown.shape)} and input of shape {list(x.shape)}")
    if x.size == 0:  # an empty batch: empty results, as CPU (no -1 to infer in the reshapes)
        empty = jnp.zeros((N, group), jnp.float32)
        return x, empty, empty
    xf = _grouped(opmath(x), N, group)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True) + eps)
    y = ((xf - mean) * rstd).reshape(N, C, -1)
    if weight is not None:
        y = y * opmath(weight).reshape(1, C, 1)
    if bias is not None:
        y = y + opmath(bias).reshape(1, C, 1)
    return y.reshape(x.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lower("native_group_norm_backward")
def native_group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    g = opmath(grad).reshape(N, C, -1)
    mean3, rstd3 = mean.reshape(N, group, 1), rstd.reshape(N, group, 1)
    xhat = ((_grouped(opmath(x), N, group) - mean3) * rstd3).reshape(N, C, -1)
    gw = g * opmath(weight).reshape(1, C, 1) if weight is not None else g
    gi = None
    if output_mask[0]:
        n = (C // group) * HxW
        gi = _affine_norm_grad_input(_grouped(gw, N, group), _grouped(xhat, N, group), rstd3, (-1,), n)
        gi = gi.reshape(x.shape)
    g_weight = jnp.sum(g * xhat, axis=(0, 2)) if output_mask[1] else None
    g_bias = jnp.sum(g, axis=(0, 2)) if output_mask[2] else None
    return gi, g_weight, g_bias


# ---------------------------------------------------------------- nll loss
def _nll_parts(x, target, weight, ignore_index):
    """Per-element (picked log-prob, weight) with classes on axis 1 (axis 0 for 1-D input). The forward's
    lowering checks targets first; one out of range would pick NaN here."""
    class_axis = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_axis]
    t = target.astype(jnp.int64)
    valid = t != ignore_index
    safe_t = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe_t, class_axis), axis=class_axis, mode="fill",
                                 fill_value=jnp.nan)
    picked = jnp.squeeze(picked, class_axis)
    w = jnp.ones((n_classes,), x.dtype) if weight is None else weight.astype(x.dtype)
    w_t = jnp.take(w, safe_t, mode="fill", fill_value=jnp.nan)
    w_t = jnp.where(valid, w_t, jnp.zeros((), x.dtype))
    return picked, w_t, class_axis


@lower("nll_loss_forward", "nll_loss2d_forward")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    target = unbatched_target(x, target)
    classes = x.shape[0 if x.ndim == 1 else 1]
    return range_checked(_nll_loss, (x, target, weight), target, classes, _target_out_of_bounds, negative=False,
                         static=(reduction, ignore_index), allowed=ignore_index)


def _target_out_of_bounds(target: int) -> str:
    return f"Target {target} is out of bounds."


def _nll_loss(x, target, weight, reduction, ignore_index):
    picked, w_t, _ = _nll_parts(opmath(x), target, opmath(weight), ignore_index)
    loss = -jnp.where(w_t != 0, picked * w_t, 0)  # ignored targets contribute exactly 0
    total = jnp.sum(w_t)
    if reduction == 0:
        return loss, jnp.zeros((), loss.dtype)
    if reduction == 1:
        return jnp.sum(loss) / total, total
    return jnp.sum(loss), total


@lower("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    picked, w_t, class_axis = _nll_parts(opmath(x), target, opmath(weight), ignore_index)
    g = opmath(grad)
    scale = -w_t * (g if reduction == 0 else g / total_weight if reduction == 1 else g)
    onehot = jnp.expand_dims(target.astype(jnp.int64), class_axis) == jnp.arange(x.shape[class_axis]).reshape(
        (-1,) + (1,) * (x.ndim - class_axis - 1))
    return jnp.where(onehot, jnp.expand_dims(scale, class_axis), jnp.zeros((), scale.dtype))


# ---------------------------------------------------------------- regression and binary losses
@lower("mse_loss", promote=Promote.RESULT)
def mse_loss(x, target, reduction=1):
    return _reduce(jnp.square(opmath(x) - opmath(target)), reduction)


@lower("mse_loss_backward", promote=Promote.RESULT)
def mse_loss_backward(grad, x, target, reduction):
    return 2 * (x - target) * _reduce_grad(grad, x.size, reduction)


def _huber(d, delta):
    a = jnp.abs(d)
    return jnp.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta))


@lower("smooth_l1_loss", promote=Promote.RESULT)
def smooth_l1_loss(x, target, reduction=1, beta=1.0):
    d = opmath(x) - opmath(target)
    if beta == 0:
        return _reduce(jnp.abs(d), reduction)
    return _reduce(_huber(d, beta) / beta, reduction)


@lower("smooth_l1_loss_backward", promote=Promote.RESULT)
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    d = x - target
    g = _reduce_grad(grad, x.size, reduction)
    slope = jnp.sign(d) if beta == 0 else jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d))
    return slope * g


@lower("huber_loss", promote=Promote.RESULT)
def huber_loss(x, target, reduction=1, delta=1.0):
    return _reduce(_huber(opmath(x) - opmath(target), delta), reduction)


@lower("huber_loss_backward", promote=Promote.RESULT)
def huber_loss_backward(grad, x, target, reduction, delta):
    d = x - target
    return jnp.clip(d, -delta, delta) * _reduce_grad(grad, x.size, reduction)


@lower("binary_cross_entropy", promote=Promote.RESULT)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    return code_checked(_binary_cross_entropy, (x, target, weight), (x, target), _bce_bad_element,
                        ("all elements of input should be between 0 and 1",
                         "all elements of target should be between 0 and 1"), static=(reduction,))


def _bce_bad_element(x, target):  # CPU's loop checks each element's input, then its target
    return jnp.where(outside_unit_interval(x), 1, jnp.where(outside_unit_interval(target), 2, 0)).astype(jnp.int8)


def _binary_cross_entropy(x, target, weight, reduction):
    # torch clamps each log at -100 so x == 0 or 1 gives a finite loss
    x, t = opmath(x), opmath(target)
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * opmath(weight)
    return _reduce(loss, reduction)


@lower("binary_cross_entropy_backward", promote=Promote.RESULT)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=1):
    g = (x - target) / jnp.maximum((1 - x) * x, 1e-12) * _reduce_grad(grad, x.size, reduction)
    return g * weight if weight is not None else g


@lower("binary_cross_entropy_with_logits", promote=Promote.RESULT)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    # (1 - t) * x - log_weight * log(sigmoid(x)), with a stable log_sigmoid
    x, t = opmath(x), opmath(target)
    log_weight = 1 + (opmath(pos_weight) - 1) * t if pos_weight is not None else 1
    loss = (1 - t) * x - log_weight * jax.nn.log_sigmoid(x)
    if weight is not None:
        loss = loss * opmath(weight)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- margin losses (backward = vjp of forward)
def _reduce_rows(loss, reduction):
    if reduction == 1:
        return jnp.mean(loss)
    return jnp.sum(loss) if reduction == 2 else loss


def _multi_margin(x, target, p, margin, weight, reduction):
    """ATen multi_margin_loss: sum_{i != y} w[y] * max(0, margin - x[y] + x[i])^p / C per row (targets
    are checked by the forward's lowering first; NaN for one out of range keeps the gather defined)."""
    if p not in (1, 2):
        raise RuntimeError("only p == 1 and p == 2 supported")
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    t = target.reshape(-1, 1).astype(jnp.int64)
    picked = jnp.take_along_axis(rows, t, axis=1, mode="fill", fill_value=jnp.nan)
    z = margin - picked + rows
    h = jnp.where(z > 0, z if p == 1 else z * z, jnp.zeros((), z.dtype))  # ATen: z > 0 (zero grad at 0)
    if weight is not None:
        h = h * jnp.take(weight.astype(rows.dtype), t, mode="fill", fill_value=jnp.nan)
    h = jnp.where(jnp.arange(rows.shape[1]) == t, jnp.zeros((), h.dtype), h)
    loss = jnp.sum(h, axis=1) / rows.shape[1]
    return _reduce_rows(loss if x.ndim > 1 else loss.reshape(()), reduction)


def _multilabel_margin(x, target, reduction, is_target=None):
    """ATen multilabel_margin_loss: targets are the labels before the first -1 (duplicates count
    twice, as in ATen's loop); sum over them and over non-target classes i of max(0, 1 - x[t] + x[i]) / C."""
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    t = target.reshape(rows.shape).astype(jnp.int64)
    valid = jnp.cumprod(t != -1, axis=1).astype(bool)
    safe = jnp.where(valid, t, 0)
    if is_target is None:
        hits = (safe[:, :, None] == jnp.arange(rows.shape[1])) & valid[:, :, None]
        is_target = jnp.any(hits, axis=1).astype(x.dtype)
    else:
        is_target = is_target.reshape(rows.shape)
    picked = jnp.take_along_axis(rows, safe, axis=1, mode="fill", fill_value=jnp.nan)  # (N, K)
    z = 1 - picked[:, :, None] + rows[:, None, :]
    keep = valid[:, :, None] & (is_target[:, None, :] == 0) & (z > 0)
    loss = jnp.sum(jnp.where(keep, z, jnp.zeros((), z.dtype)), axis=(1, 2)) / rows.shape[1]
    return _reduce_rows(loss if x.ndim > 1 else loss.reshape(()), reduction), is_target.reshape(x.shape)


def _loss_vjp(forward, grad, x):
    out, vjp = jax.vjp(forward, x)
    return vjp(jnp.broadcast_to(grad.astype(out.dtype), out.shape))[0]


# meta=False: torch's meta kernels give a 1-D input's unreduced loss shape (1,), CPU gives ()
@lower("multi_margin_loss", meta=False)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    _check_margin_input(x)  # no meta kernel checks these: CPU's checks, in CPU's order and words
    rows, classes = (x.shape[0] if x.ndim == 2 else 1), (x.shape[-1] if x.ndim else 1)
    if target.ndim > 1 or target.size != rows:
        raise RuntimeError("multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
                           f"samples (batch size). Expected target size [{rows}], but got {list(target.shape)}. "
                           f"Input has shape {list(x.shape)}.")
    if weight is not None and (weight.ndim > 1 or weight.size != classes):
        raise RuntimeError(f"inconsistent weight size, expected {classes} but got {list(weight.shape)}")
    _check_long_target(target)
    return range_checked(_multi_margin_loss, (x, target, weight), target, classes, lambda _: "target out of range",
                         negative=False, error=RuntimeError, static=(p, margin, reduction))


def _multi_margin_loss(x, target, weight, p, margin, reduction):
    return _multi_margin(opmath(x), target, p, margin, opmath(weight), reduction).astype(x.dtype)


@lower("multi_margin_loss_backward", meta=False)  # torch has no meta kernel: the grad is x-shaped
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    return _loss_vjp(lambda a: _multi_margin(a, target, p, margin, opmath(weight), reduction), opmath(grad),
                     opmath(x)).astype(x.dtype)


def _check_margin_input(x) -> None:
    if not (x.ndim == 0 or (x.ndim in (1, 2) and x.shape[-1] != 0)):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(x.shape)}")


def _check_long_target(target) -> None:
    if target.dtype != jnp.int64:
        raise RuntimeError(f"expected scalar type Long but found {dtypes.scalar_name(dtypes.to_torch(target.dtype))}")


@lower("multilabel_margin_loss_forward", meta=False)
def multilabel_margin_loss_forward(x, target, reduction):
    _check_margin_input(x)
    if x.ndim <= 1:  # one row: CPU pairs a 0-dim and a 1-element 1-d tensor
        fits = target.ndim <= 1 and target.size == (x.shape[0] if x.ndim else 1)
    else:
        fits = target.shape == x.shape
    if not fits:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(x.shape)}")
    _check_long_target(target)
    classes = x.shape[-1] if x.ndim else 1  # every label, those after the first -1 too, is a class or -1
    return range_checked(_multilabel_margin_loss, (x, target), target, classes,
                         lambda _: "argument #2 'target' is out of range", negative=False, error=RuntimeError,
                         static=(reduction,), allowed=-1)


def _multilabel_margin_loss(x, target, reduction):
    loss, is_target = _multilabel_margin(opmath(x), target, reduction)
    return loss.astype(x.dtype), is_target.astype(x.dtype)


@lower("multilabel_margin_loss_backward", meta=False)  # no meta kernel either
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    return _loss_vjp(lambda a: _multilabel_margin(a, target, reduction, opmath(is_target))[0], opmath(grad),
                     opmath(x)).astype(x.dtype)
