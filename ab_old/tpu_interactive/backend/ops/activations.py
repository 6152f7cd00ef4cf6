"""Activation functions and their backward ops (the ones autograd calls), as CPU ATen computes them.

Each formula is one fused ``jax.jit`` kernel; bfloat16/float16 compute in float32 and round once
(CPU's opmath). Floating-point only, like CPU, except threshold/hardtanh which also take integers.
Scalar parameters (alpha, beta, slope, ...) are traced, so changing them does not recompile.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from ..registry import ALL_BUT_BOOL, FLOATING, Promote, lower
from ._common import compute_dtype, norm_dim, opmath
from .elementwise import _named

_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_GELU_BETA = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


def _check_gelu_mode(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate!r}")


# ---------------------------------------------------------------- gelu
@functools.partial(jax.jit, static_argnames="approximate")
def _gelu(x, approximate):
    # note: gelu(+inf) is +inf here (the limit; CUDA agrees); CPU's vectorized kernel returns NaN
    x = opmath(x)
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_GELU_BETA * (x + _GELU_KAPPA * x * x * x)))
    return 0.5 * x * (1 + jax.lax.erf(x * _SQRT1_2))


@functools.partial(jax.jit, static_argnames="approximate")
def _gelu_backward(grad, x, approximate):
    grad, x = opmath(grad), opmath(x)
    if approximate == "tanh":
        inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
        t = jnp.tanh(inner)
        left_derivative = 0.5 * (1 + t)
        right_derivative = 0.5 * x * (1 - t * t) * _GELU_BETA * (1 + 3 * _GELU_KAPPA * x * x)
        return grad * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + jax.lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return grad * (cdf + x * pdf)


@lower("gelu", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="GeluKernelImpl")
def gelu(x, approximate="none"):
    _check_gelu_mode(approximate)
    return _gelu(x, approximate=approximate)


@lower("gelu_backward", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="GeluBackwardKernelImpl")
def gelu_backward(grad, x, approximate="none"):
    _check_gelu_mode(approximate)
    return _gelu_backward(grad, x, approximate=approximate)


# ---------------------------------------------------------------- silu / mish
@jax.jit
def _silu(x):
    x = opmath(x)
    return x * jax.nn.sigmoid(x)


@jax.jit
def _silu_backward(grad, x):
    grad, x = opmath(grad), opmath(x)
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@jax.jit
def _mish(x):
    x = opmath(x)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@jax.jit
def _mish_backward(grad, x):
    grad, x = opmath(grad), opmath(x)
    s = jax.nn.sigmoid(x)
    t = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return grad * (t + x * s * (1 - t * t))


# ---------------------------------------------------------------- elu / leaky_relu
@jax.jit
def _elu(x, alpha, scale, input_scale):
    x = opmath(x)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * (alpha * scale))


@functools.partial(jax.jit, static_argnames="is_result")
def _elu_backward(grad, alpha, scale, input_scale, is_result, y):
    grad, y = opmath(grad), opmath(y)
    neg_coef = alpha * scale
    if is_result:  # y is elu's output: d/dx = input_scale * (y + alpha * scale) on the negative side
        negative = grad * input_scale * (y + neg_coef)
    else:
        negative = grad * input_scale * neg_coef * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, grad * scale)


@lower("elu", promote=Promote.RESULT, dtypes=FLOATING)
def elu(x, alpha=1, scale=1, input_scale=1):
    return _elu(x, alpha, scale, input_scale)


@lower("elu_backward", promote=Promote.RESULT, dtypes=FLOATING)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    if is_result and alpha < 0:
        raise RuntimeError("In-place elu backward calculation is triggered with a negative slope which is "
                           "not supported. This is caused by calling in-place forward function with a "
                           "negative slope, please call out-of-place version instead.")
    return _elu_backward(grad, alpha, scale, input_scale, bool(is_result), self_or_result)


@jax.jit
def _leaky_relu(x, slope):
    x = opmath(x)
    return jnp.where(x > 0, x, x * slope)


@jax.jit
def _leaky_relu_backward(grad, x, slope):
    grad = opmath(grad)
    return jnp.where(x > 0, grad, grad * slope)


@lower("leaky_relu", promote=Promote.RESULT, dtypes=FLOATING)
def leaky_relu(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope)


@lower("leaky_relu_backward", promote=Promote.RESULT, dtypes=FLOATING)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    if self_is_result and negative_slope < 0:
        raise RuntimeError("In-place leakyReLu backward calculation is triggered with a negative slope which "
                           "is not supported. This is caused by calling in-place forward function with a "
                           "negative slope, please call out-of-place version instead. File an issue at "
                           "https://github.com/pytorch/pytorch if you do require supporting in-place "
                           "leakRelu backward calculation with negative slope")
    return _leaky_relu_backward(grad, x, negative_slope)


# ---------------------------------------------------------------- hardtanh / threshold (ints allowed)
@lower("hardtanh", promote=Promote.RESULT)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, min_val), max_val)


@jax.jit
def _hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros_like(grad), grad)


@lower("hardtanh_backward", promote=Promote.RESULT)
def hardtanh_backward(grad, x, min_val, max_val):
    return _hardtanh_backward(grad, x, min_val, max_val)


@jax.jit
def _threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value, x.dtype), x)


@lower("threshold", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL)
def threshold(x, threshold, value):
    return _threshold(x, threshold, value)


@jax.jit
def _threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros_like(grad), grad)


@lower("threshold_backward", promote=Promote.RESULT, dtypes=ALL_BUT_BOOL)
def threshold_backward(grad, x, threshold):
    return _threshold_backward(grad, x, threshold)


# ---------------------------------------------------------------- softplus
@jax.jit
def _softplus(x, beta, threshold):
    x = opmath(x)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@jax.jit
def _softplus_backward(grad, x, beta, threshold):
    grad, x = opmath(grad), opmath(x)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lower("softplus", promote=Promote.RESULT, dtypes=FLOATING)
def softplus(x, beta=1, threshold=20):
    return _softplus(x, beta, threshold)


@lower("softplus_backward", promote=Promote.RESULT, dtypes=FLOATING)
def softplus_backward(grad, x, beta, threshold):
    return _softplus_backward(grad, x, beta, threshold)


# ---------------------------------------------------------------- hardswish / hardsigmoid
@jax.jit
def _hardsigmoid(x):
    x = opmath(x)
    return jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@jax.jit
def _hardsigmoid_backward(grad, x):
    grad = opmath(grad)
    return jnp.where((x > -3) & (x < 3), grad / 6, jnp.zeros_like(grad))


@jax.jit
def _hardswish(x):
    x = opmath(x)
    return x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@jax.jit
def _hardswish_backward(grad, x):
    grad, x = opmath(grad), opmath(x)
    return jnp.where(x < -3, jnp.zeros_like(grad), jnp.where(x <= 3, grad * (x / 3 + 0.5), grad))


# silu, mish, hardsigmoid, hardswish and their backwards: floating-point kernels only on CPU
_FLOAT_KERNELS = {
    "silu": _silu, "silu_backward": _silu_backward, "mish": _mish, "mish_backward": _mish_backward,
    "hardsigmoid": _hardsigmoid, "hardsigmoid_backward": _hardsigmoid_backward,
    "hardswish": _hardswish, "hardswish_backward": _hardswish_backward,
}


def _float_kernel(name, kernel):
    def lowering(*args):  # (x) or (grad, x), as the kernel
        return kernel(*args)

    lower(name, promote=Promote.RESULT, dtypes=FLOATING)(_named(lowering, name))


for _name, _kernel in _FLOAT_KERNELS.items():
    _float_kernel(_name, _kernel)


# ---------------------------------------------------------------- shrink
@jax.jit
def _softshrink(x, lambd):
    # x * 0 in the middle keeps NaN (and -0.0), as ATen's kernel
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@jax.jit
def _shrink_mask(values, x, lambd):
    # hardshrink and both shrink backwards: zero inside [-lambd, lambd]
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(values), values)


@lower("softshrink", promote=Promote.RESULT, dtypes=FLOATING)
def softshrink(x, lambd=0.5):
    return _softshrink(x, lambd)


@lower("hardshrink", promote=Promote.RESULT, dtypes=FLOATING)
def hardshrink(x, lambd=0.5):
    return _shrink_mask(x, x, lambd)


@lower("softshrink_backward", "hardshrink_backward", promote=Promote.RESULT, dtypes=FLOATING,
       cpu_kernel="shrink_backward")
def shrink_backward(grad, x, lambd):
    return _shrink_mask(grad, x, lambd)


# ---------------------------------------------------------------- sigmoid / tanh / logit backward
@jax.jit
def _sigmoid_backward(grad, y):
    grad, y = opmath(grad), opmath(y)
    return grad * (1 - y) * y


@jax.jit
def _tanh_backward(grad, y):
    grad, y = opmath(grad), opmath(y)
    return grad * (1 - y * y)


@lower("sigmoid_backward", promote=Promote.RESULT)
def sigmoid_backward(grad, output):
    return _sigmoid_backward(grad, output)


@lower("tanh_backward", promote=Promote.RESULT)
def tanh_backward(grad, output):
    return _tanh_backward(grad, output)


@functools.partial(jax.jit, static_argnames="eps")
def _logit_backward(grad, x, eps):
    grad, x = opmath(grad), opmath(x)
    value = grad / (x * (1 - x))
    if eps is None or eps < 0:  # no clamping: outside [0, 1] the gradient is NaN
        return jnp.where((x < 0) | (x > 1), jnp.full_like(value, jnp.nan), value)
    return jnp.where((x < eps) | (x > 1 - eps), jnp.zeros_like(value), value)


@lower("logit_backward", promote=Promote.RESULT, dtypes=FLOATING)
def logit_backward(grad, x, eps=None):
    return _logit_backward(grad, x, eps=None if eps is None else float(eps))


# ---------------------------------------------------------------- log_sigmoid
@jax.jit
def _log_sigmoid_forward(x):
    x = opmath(x)
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


@jax.jit
def _log_sigmoid_backward(grad, x):
    # recomputes exp(-|x|) instead of reading the buffer: same values, and works for any buffer
    grad, x = opmath(grad), opmath(x)
    z = jnp.exp(-jnp.abs(x))
    negative = x < 0
    return grad * (jnp.where(negative, 1.0, 0.0) - jnp.where(negative, 1.0, -1.0) * (z / (1 + z)))


@lower("log_sigmoid_forward", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="log_sigmoid_cpu")
def log_sigmoid_forward(x):
    return _log_sigmoid_forward(x)


@lower("log_sigmoid_backward", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="log_sigmoid_backward_cpu")
def log_sigmoid_backward(grad, x, buffer):
    return _log_sigmoid_backward(grad, x)


# ---------------------------------------------------------------- prelu (kernel level; prelu itself decomposes)
@jax.jit
def _prelu(x, weight):
    return jnp.where(x > 0, x, opmath(weight) * opmath(x))


@jax.jit
def _prelu_backward(grad, x, weight):
    shape = jnp.broadcast_shapes(grad.shape, x.shape, weight.shape)
    grad, x, weight = (jnp.broadcast_to(opmath(v), shape) for v in (grad, x, weight))
    positive = x > 0
    return jnp.where(positive, grad, weight * grad), jnp.where(positive, jnp.zeros_like(grad), x * grad)


@lower("_prelu_kernel", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="prelu_cpu")
def prelu_kernel(x, weight):
    return _prelu(x, weight)


@lower("_prelu_kernel_backward", promote=Promote.RESULT, dtypes=FLOATING, cpu_kernel="prelu_backward_cpu")
def prelu_kernel_backward(grad, x, weight):
    return _prelu_backward(grad, x, weight)


# ---------------------------------------------------------------- glu
@functools.partial(jax.jit, static_argnames="dim")
def _glu(x, dim):
    a, b = jnp.split(opmath(x), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@functools.partial(jax.jit, static_argnames="dim")
def _glu_backward(grad, x, dim):
    a, b = jnp.split(opmath(x), 2, axis=dim)
    grad = opmath(grad)
    s = jax.nn.sigmoid(b)
    return jnp.concatenate([grad * s, grad * a * s * (1 - s)], axis=dim)


def _glu_dim(x, dim):
    if x.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    return norm_dim(dim, x.ndim)


@lower("glu", promote=Promote.RESULT, dtypes=FLOATING)
def glu(x, dim=-1):
    return _glu(x, dim=_glu_dim(x, dim))


@lower("glu_backward", promote=Promote.RESULT, dtypes=FLOATING)
def glu_backward(grad, x, dim):
    return _glu_backward(grad, x, dim=_glu_dim(x, dim))


# ---------------------------------------------------------------- channel shuffle, rrelu with noise
@lower("channel_shuffle")
def channel_shuffle(x, groups):
    # a copy (not a view), as CPU's kernel: (N, g, C/g, *) -> (N, C/g, g, *)
    if groups <= 0:
        raise RuntimeError(f"Number of groups to divide channels in must be positive. Value of groups:{groups}")
    if x.ndim < 3:
        raise RuntimeError(f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"sizes {list(x.shape)}")
    c = x.shape[1]
    if c % groups:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    n, rest = x.shape[0], x.shape[2:]
    return x.reshape(n, groups, c // groups, *rest).swapaxes(1, 2).reshape(x.shape)


@lower("rrelu_with_noise", raw=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """Training: negative inputs scaled by r ~ U(lower, upper), which is written into ``noise`` (1 for
    non-negative inputs); eval: leaky_relu with slope (lower + upper) / 2, ``noise`` untouched."""
    from .. import storage
    from ..rng import is_cpu_generator
    from .random import _draw

    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"\"rrelu_with_noise\" not implemented for '{x.dtype}'")
    value = opmath(storage.read(x))
    if not training:
        out = jnp.where(value >= 0, value, value * ((lower + upper) / 2))
        return storage.from_array(out.astype(storage.read(x).dtype), x.dtype)
    if is_cpu_generator(generator):  # draw on the CPU with it (bit-identical to CPU), as the RNG ops do
        noise_cpu = noise.cpu()
        out = torch.ops.aten.rrelu_with_noise(x.cpu(), noise_cpu, lower, upper, training, generator)
        storage.write(noise, storage.read(noise_cpu.to(noise.device)))
        return out.to(x.device)
    compute = compute_dtype(value.dtype)
    r = _draw(jax.random.uniform, tuple(x.shape), compute, generator, minval=lower, maxval=upper).astype(value.dtype)
    negative = value <= 0
    storage.write(noise, jnp.where(negative, r, jnp.ones_like(r)).astype(storage.read(noise).dtype).reshape(noise.shape))
    out = jnp.where(negative, value * r, value)
    return storage.from_array(out.astype(storage.read(x).dtype), x.dtype)
