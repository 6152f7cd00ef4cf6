"""Convolution.

Convolutions are one ``lax.conv_general_dilated`` (transposed = input-dilated conv with a flipped,
group-transposed kernel); their backward is ``jax.vjp`` of the same function, so every
stride/padding/dilation/groups/output_padding combination has a consistent gradient. Pooling and
im2col/col2im are in pooling.py, upsampling and grid sampling in resample.py. Output shapes always come from torch's meta
kernels.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from ..registry import Promote, lower
from ._common import HALF, per_dim

_PREC = jax.lax.Precision.HIGHEST


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


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, bias=None):
    """The convolution, plus ``bias`` added before the one rounding to a half dtype (as ATen's CPU
    and cuDNN kernels do: rounding the sum and then adding the bias is off by an ulp)."""
    n = x.ndim - 2
    stride, padding, dilation = per_dim(stride, n), per_dim(padding, n), per_dim(dilation, n)
    acc = jnp.float32 if x.dtype in HALF else None
    if transposed:
        output_padding = per_dim(output_padding, n)
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
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape(_bias_shape(out.ndim))
    return out.astype(x.dtype)


def _bias_shape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


def _check_bias(w, bias, transposed: bool, groups: int) -> None:
    """check_shape_forward's bias check (aten::_convolution's, which our lowering of aten::convolution
    skips; torch's meta kernel lacks it): a [1, C] bias was broadcast silently."""
    channels = w.shape[1] * groups if transposed else w.shape[0]
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != channels):
        given = f"Given transposed={int(transposed)}, weight" if transposed else "Given weight"
        raise RuntimeError(f"{given} of size {list(w.shape)}, expected bias to be 1-dimensional with {channels} "
                           f"elements, but got bias of size {list(bias.shape)} instead")


@lower("convolution", promote=Promote.RESULT)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if x.ndim < 3:
        raise RuntimeError(f"convolution expects a batched input of at least 3 dims, got {x.shape}")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, bias)
    _check_bias(w, bias, transposed, groups)  # after the checks CPU makes first (dims, groups, channels:
    return out  # a mismatch fails in _conv, and dispatch raises CPU's error for it)


def _conv_backward(grad, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        fn = lambda a, b: _conv(a, b, stride, padding, dilation, transposed, output_padding, groups)  # noqa: E731
        out, vjp = jax.vjp(fn, x, w)
        gi, gw = vjp(grad.astype(out.dtype))
        grad_input = gi if output_mask[0] else None
        grad_weight = gw if output_mask[1] else None
    if output_mask[2]:
        acc = jnp.float32 if grad.dtype in HALF else grad.dtype
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
