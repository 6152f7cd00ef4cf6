"""Tiled matmul, our own ``pl.pallas_call`` kernels: on TPU (Mosaic) a (M, N, K)-block grid with a
float32 VMEM accumulator; on GPU (Triton) and CPU (interpret mode) one program per output block that
loops over K. Both multiply at HIGHEST precision, as the XLA lowering does (torch's float32 matmul is
full precision; ``jax.experimental.pallas.ops.tpu.matmul`` uses the default one-pass bf16 product,
which a TPU v5e run showed 0.55 off the float32 result at 2048x2051x2043). Ragged sizes are
zero-padded to whole blocks (zeros in K add nothing) and the result is sliced back. Backward: the
same kernel on the transposed operands."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import interpret, next_pow2, pad_axis, platform, round_up, x32

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
    with x32():
        out = pl.pallas_call(kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
                             interpret=interpret(), name="tpu_interactive_matmul")(xp, yp)
    return out[..., :m, :n]


def _tpu_block(d: int) -> int:
    return 512 if d >= 1024 else 128  # multiples of the MXU's 128; big blocks amortise the grid steps


def _tpu_kernel(x_ref, y_ref, o_ref, acc_ref, *, k_axis: int):
    @pl.when(pl.program_id(k_axis) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], precision=_PREC, preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(k_axis) == pl.num_programs(k_axis) - 1)
    def _():  # the output block stays in VMEM over the K steps (its index does not change)
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _tpu_mm(x: jax.Array, y: jax.Array, interpret: bool = False) -> jax.Array:
    """[B,] M x K @ [B,] K x N on the TPU grid (batch, M/bm, N/bn, K/bk), K last ('arbitrary')."""
    from jax.experimental.pallas import tpu as pltpu

    batched = x.ndim == 3
    m, k = x.shape[-2:]
    n = y.shape[-1]
    bm, bn, bk = _tpu_block(m), _tpu_block(n), _tpu_block(k)
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    xp = pad_axis(pad_axis(x, -2, mp), -1, kp)
    yp = pad_axis(pad_axis(y, -2, kp), -1, np_)
    grid = (mp // bm, np_ // bn, kp // bk)
    x_spec = pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk))
    y_spec = pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))
    o_spec = pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))
    out_shape = (mp, np_)
    if batched:
        grid = (x.shape[0], *grid)
        x_spec = pl.BlockSpec((None, bm, bk), lambda g, i, j, kk: (g, i, kk))
        y_spec = pl.BlockSpec((None, bk, bn), lambda g, i, j, kk: (g, kk, j))
        o_spec = pl.BlockSpec((None, bm, bn), lambda g, i, j, kk: (g, i, j))
        out_shape = (x.shape[0], *out_shape)
    params = getattr(pltpu, "CompilerParams", None) or pltpu.TPUCompilerParams  # renamed in jax 0.7
    with x32():
        out = pl.pallas_call(
            functools.partial(_tpu_kernel, k_axis=len(grid) - 1),
            out_shape=jax.ShapeDtypeStruct(out_shape, jnp.result_type(x.dtype, y.dtype)),
            grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=0, grid=grid, in_specs=[x_spec, y_spec],
                                                   out_specs=o_spec,
                                                   scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
            compiler_params=params(dimension_semantics=("parallel",) * (len(grid) - 1) + ("arbitrary",)),
            interpret=interpret, name="tpu_interactive_matmul_tpu",
        )(xp, yp)
    return out[..., :m, :n]


def _forward(x, y):
    return _tpu_mm(x, y) if platform() == "tpu" else _pallas_mm(x, y)


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
    return (x.dtype == y.dtype and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize <= 4
            and x.ndim == y.ndim and x.ndim in (2, 3) and x.size > 0 and y.size > 0)
