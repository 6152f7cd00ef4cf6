"""Tiled matmul: our own ``pl.pallas_call`` kernel (GPU via Triton, CPU in interpret mode); on TPU
``jax.experimental.pallas.ops.tpu.matmul``. Ragged sizes are zero-padded to whole blocks (zeros in K
add nothing) and the result is sliced back. Backward: the same kernel on the transposed operands."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import interpret, next_pow2, pad_axis, platform, round_up

_PREC = jax.lax.Precision.HIGHEST


def block_sizes(m: int, n: int, k: int) -> tuple[int, int, int]:
    if platform() == "tpu":
        return 128, 128, 128
    cap = 64 if platform() == "gpu" else 32  # small blocks on CPU: the interpreter is slow per block
    pick = lambda d: min(cap, max(16, next_pow2(d)))  # noqa: E731
    return pick(m), pick(n), pick(k)


def _kernel(x_ref, y_ref, o_ref, *, bk: int, nk: int):
    def step(i, acc):
        a = x_ref[:, pl.ds(i * bk, bk)]
        b = y_ref[pl.ds(i * bk, bk), :]
        return acc + jnp.dot(a, b, precision=_PREC, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, nk, step, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _pallas_mm(x: jax.Array, y: jax.Array, blocks=None) -> jax.Array:
    """[B,] M x K @ [B,] K x N with a (batch, M/bm, N/bn) grid; each program loops over K blocks."""
    batched = x.ndim == 3
    m, k = x.shape[-2:]
    n = y.shape[-1]
    bm, bn, bk = blocks or block_sizes(m, n, k)
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    xp = pad_axis(pad_axis(x, -2, mp), -1, kp)
    yp = pad_axis(pad_axis(y, -2, kp), -1, np_)
    out_dtype = jnp.result_type(x.dtype, y.dtype)
    kernel = functools.partial(_kernel, bk=bk, nk=kp // bk)
    if batched:
        b = x.shape[0]
        grid = (b, mp // bm, np_ // bn)
        in_specs = [pl.BlockSpec((None, bm, kp), lambda g, i, j: (g, i, 0)),
                    pl.BlockSpec((None, kp, bn), lambda g, i, j: (g, 0, j))]
        out_specs = pl.BlockSpec((None, bm, bn), lambda g, i, j: (g, i, j))
        out_shape = jax.ShapeDtypeStruct((b, mp, np_), out_dtype)
    else:
        grid = (mp // bm, np_ // bn)
        in_specs = [pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), pl.BlockSpec((kp, bn), lambda i, j: (0, j))]
        out_specs = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
        out_shape = jax.ShapeDtypeStruct((mp, np_), out_dtype)
    out = pl.pallas_call(kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
                         interpret=interpret(), name="tpu_interactive_matmul")(xp, yp)
    return out[..., :m, :n]


def _tpu_mm(x, y):
    from jax.experimental.pallas.ops.tpu.matmul import matmul as tpu_matmul

    m, k = x.shape
    n = y.shape[1]
    mp, np_, kp = round_up(m, 128), round_up(n, 128), round_up(k, 128)
    out = tpu_matmul(pad_axis(pad_axis(x, 0, mp), 1, kp), pad_axis(pad_axis(y, 0, kp), 1, np_),
                     block_shape=(128, 128), block_k=128, out_dtype=jnp.result_type(x.dtype, y.dtype))
    return out[:m, :n]


def _forward(x, y):
    if platform() == "tpu" and x.ndim == 2:
        return _tpu_mm(x, y)
    return _pallas_mm(x, y)


@jax.custom_vjp
def _matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    return _forward(x, y)


def _fwd(x, y):
    return _forward(x, y), (x, y)


def _bwd(res, g):
    x, y = res
    dx = _forward(g, jnp.swapaxes(y, -1, -2)).astype(x.dtype)
    dy = _forward(jnp.swapaxes(x, -1, -2), g).astype(y.dtype)
    return dx, dy


_matmul.defvjp(_fwd, _bwd)


@jax.jit  # jitted: eager calls hit jit's cache instead of re-tracing the kernel (interpret mode: seconds)
def matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    """x @ y for 2-D or batched 3-D float operands, through the Pallas kernel (forward and backward)."""
    return _matmul(x, y)


def supported(x, y) -> bool:
    return (x.dtype == y.dtype and jnp.issubdtype(x.dtype, jnp.floating) and x.ndim == y.ndim
            and x.ndim in (2, 3) and x.size > 0 and y.size > 0)
