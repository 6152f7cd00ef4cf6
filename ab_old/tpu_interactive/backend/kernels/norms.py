"""LayerNorm and RMSNorm over the trailing ``normalized_shape`` dims (flattened to one row each).

GPU: ``jax.experimental.pallas.ops.gpu.layer_norm`` / ``rms_norm`` for the output (they have their
own backward); the mean/rstd that aten also returns come from an XLA reduction. Elsewhere: our own
kernel, rows in blocks, each row padded to a whole block with the padding masked out of the
statistics; it returns (y, mean, rstd) in one pass. Backward of our kernel: the XLA reference's vjp."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import interpret, next_pow2, pad_axis, platform, round_up, with_reference_vjp, x32


def _layout(rows: int, n: int) -> tuple[int, int, int]:
    lane = 128 if platform() == "tpu" else 1
    npad = round_up(next_pow2(n), lane)
    br = 8 if platform() == "tpu" else min(16, next_pow2(rows))
    return npad, br, round_up(rows, br)


def _ln_kernel(x_ref, w_ref, b_ref, y_ref, mean_ref, rstd_ref, *, n: int, eps: float, rms: bool):
    x = x_ref[...].astype(jnp.float32)
    valid = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < n
    x = jnp.where(valid, x, 0.0)
    if rms:
        mean = jnp.zeros((x.shape[0], 1), jnp.float32)
        centered = x
    else:
        mean = jnp.sum(x, axis=1, keepdims=True) / n
        centered = jnp.where(valid, x - mean, 0.0)
    rstd = jax.lax.rsqrt(jnp.sum(centered * centered, axis=1, keepdims=True) / n + eps)
    y = centered * rstd * w_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    y_ref[...] = y.astype(y_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _rows_norm(x2d, w, b, eps, rms, out_dtype):
    rows, n = x2d.shape
    npad, br, rpad = _layout(rows, n)
    xp = pad_axis(pad_axis(x2d, 0, rpad), 1, npad)
    wp = pad_axis(w.reshape(1, n), 1, npad)
    bp = pad_axis(b.reshape(1, n), 1, npad)
    row_spec = pl.BlockSpec((br, npad), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((1, npad), lambda i: (0, 0))
    stat_spec = pl.BlockSpec((br, 1), lambda i: (i, 0))
    stat = jax.ShapeDtypeStruct((rpad, 1), jnp.float32)
    with x32():
        y, mean, rstd = pl.pallas_call(
            functools.partial(_ln_kernel, n=n, eps=eps, rms=rms),
            out_shape=(jax.ShapeDtypeStruct((rpad, npad), out_dtype), stat, stat), grid=(rpad // br,),
            in_specs=[row_spec, vec_spec, vec_spec], out_specs=(row_spec, stat_spec, stat_spec),
            interpret=interpret(), name="tpu_interactive_rms_norm" if rms else "tpu_interactive_layer_norm",
        )(xp, wp, bp)
    return y[:rows, :n], mean[:rows, 0], rstd[:rows, 0]


def _reference(x2d, w, b, eps, rms, out_dtype):
    xf = x2d.astype(jnp.float32)
    mean = jnp.zeros(xf.shape[:1], jnp.float32) if rms else jnp.mean(xf, axis=1)
    centered = xf - mean[:, None]
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=1) + eps)
    y = centered * rstd[:, None] * w.astype(jnp.float32) + b.astype(jnp.float32)
    return y.astype(out_dtype), mean, rstd


def _gpu_rows_norm(x2d, w, b, eps, rms, out_dtype):
    if rms:
        from jax.experimental.pallas.ops.gpu.rms_norm import rms_norm as gpu_norm
    else:
        from jax.experimental.pallas.ops.gpu.layer_norm import layer_norm as gpu_norm
    y = gpu_norm(x2d.astype(jnp.float32), w.astype(jnp.float32), b.astype(jnp.float32), eps=eps)
    _, mean, rstd = _reference(jax.lax.stop_gradient(x2d), w, b, eps, rms, out_dtype)
    return y.astype(out_dtype), mean, rstd


@functools.partial(jax.jit, static_argnames=("n_axes", "eps", "rms", "out_dtype"))
def norm_rows(x, n_axes: int, weight, bias, eps: float, rms: bool, out_dtype=None):
    """Normalize x over its last ``n_axes`` dims. Returns (y, mean, rstd); mean/rstd shaped like x
    with the normalized dims kept as 1 (aten's native_layer_norm layout), float32."""
    out_dtype = out_dtype or x.dtype
    batch, normalized = x.shape[: x.ndim - n_axes], x.shape[x.ndim - n_axes:]
    n = math.prod(normalized)
    x2d = x.reshape(-1, n)
    w = jnp.ones((n,), x.dtype) if weight is None else weight.reshape(n)
    b = jnp.zeros((n,), x.dtype) if bias is None else bias.reshape(n)
    if x2d.shape[0] == 0 or n == 0:
        y, mean, rstd = _reference(x2d, w, b, eps, rms, out_dtype)
    elif platform() == "gpu":
        y, mean, rstd = _gpu_rows_norm(x2d, w, b, eps, rms, out_dtype)
    else:
        static = dict(eps=eps, rms=rms, out_dtype=out_dtype)
        fn = with_reference_vjp(functools.partial(_rows_norm, **static), functools.partial(_reference, **static))
        y, mean, rstd = fn(x2d, w, b)
    stat_shape = batch + (1,) * n_axes
    return y.reshape(x.shape), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    return norm_rows(x, len(normalized_shape), weight, bias, eps, rms=False)


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None):
    eps = jnp.finfo(jnp.float32).eps if eps is None else eps
    y, _, rstd = norm_rows(x, len(normalized_shape), weight, None, float(eps), rms=True)
    return y, rstd
