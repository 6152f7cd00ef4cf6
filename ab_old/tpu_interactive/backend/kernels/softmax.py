"""Row softmax: on GPU ``jax.experimental.pallas.ops.gpu.softmax``; elsewhere our own kernel (rows in
blocks, the row padded to a whole block and the padding masked with -inf, so it adds exp(-inf) = 0).
Backward: the XLA reference's vjp."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import interpret, next_pow2, pad_axis, platform, round_up, with_reference_vjp, x32


def _kernel(x_ref, o_ref, *, n: int):
    x = x_ref[...].astype(jnp.float32)
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    x = jnp.where(col < n, x, -jnp.inf)
    e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)


def _rows_softmax(x2d: jax.Array, out_dtype) -> jax.Array:
    rows, n = x2d.shape
    if platform() == "gpu":
        from jax.experimental.pallas.ops.gpu.softmax import softmax as gpu_softmax

        return gpu_softmax(x2d.astype(jnp.float32), axis=-1).astype(out_dtype)
    lane = 128 if platform() == "tpu" else 1
    npad = round_up(next_pow2(n), lane)
    br = 8 if platform() == "tpu" else min(16, next_pow2(rows))
    rpad = round_up(rows, br)
    xp = pad_axis(pad_axis(x2d, 0, rpad), 1, npad)
    with x32():
        out = pl.pallas_call(functools.partial(_kernel, n=n),
                             out_shape=jax.ShapeDtypeStruct((rpad, npad), out_dtype),
                             grid=(rpad // br,), in_specs=[pl.BlockSpec((br, npad), lambda i: (i, 0))],
                             out_specs=pl.BlockSpec((br, npad), lambda i: (i, 0)), interpret=interpret(),
                             name="tpu_interactive_softmax")(xp)
    return out[:rows, :n]


def _forward(x, axis, out_dtype):
    moved = jnp.moveaxis(x, axis, -1)
    out = _rows_softmax(moved.reshape(-1, moved.shape[-1]), out_dtype).reshape(moved.shape)
    return jnp.moveaxis(out, -1, axis)


def _reference(x, axis, out_dtype):
    return jax.nn.softmax(x.astype(jnp.float32), axis=axis).astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("axis", "out_dtype"))
def softmax(x: jax.Array, axis: int = -1, out_dtype=None) -> jax.Array:
    """softmax along ``axis`` (computed in float32, returned as ``out_dtype``, default x's)."""
    out_dtype = out_dtype or x.dtype
    if x.ndim == 0:
        return _reference(x[None], 0, out_dtype)[0]
    axis = axis % x.ndim
    if x.size == 0:
        return _reference(x, axis, out_dtype)
    fn = with_reference_vjp(functools.partial(_forward, axis=axis, out_dtype=out_dtype),
                            functools.partial(_reference, axis=axis, out_dtype=out_dtype))
    return fn(x)
