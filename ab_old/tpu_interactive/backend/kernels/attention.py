"""Scaled dot-product attention, q/k/v laid out [batch, heads, seq, head_dim] (torch's layout).

- TPU: ``jax.experimental.pallas.ops.tpu.flash_attention`` (segment ids mask the padding), traced,
  forward and backward, with 64-bit types off (Mosaic refuses int64 block indices) and at HIGHEST
  matmul precision (its dots take the default, one bf16 pass for float32 inputs);
- GPU: ``jax.experimental.pallas.ops.gpu.attention.mha`` when q and kv lengths match (segment ids
  mask the padding), else our kernel compiled through Triton;
- CPU: our kernel in interpret mode.
Our kernel is a flash-attention forward: one program per (batch*head, q block), an online softmax
over kv blocks (skipping blocks above the diagonal when causal); sequence and head dims are padded
to whole blocks, padded keys masked with -inf, padded head-dim columns are zeros (add nothing).
Causal masks are top-left aligned (key j visible to query i iff j <= i), as in torch's SDPA.
Backward: the library kernels bring their own; ours uses the XLA reference's vjp.
"""
from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import interpret, next_pow2, pad_axis, platform, round_up, with_reference_vjp, x32

_PREC = jax.lax.Precision.HIGHEST


def _kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, bq, bk, lk, nk, causal, scale):
    qi = pl.program_id(1)
    q = q_ref[...].astype(jnp.float32) * scale
    rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)

    def body(j, carry):
        m, row_sum, acc = carry
        kb = k_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        vb = v_ref[pl.ds(j * bk, bk), :].astype(jnp.float32)
        s = jax.lax.dot_general(q, kb, (((1,), (1,)), ((), ())), precision=_PREC,
                                preferred_element_type=jnp.float32)
        cols = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        valid = cols < lk
        if causal:
            valid = jnp.logical_and(valid, cols <= rows)
        s = jnp.where(valid, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # rows with nothing visible yet
        p = jnp.exp(s - shift[:, None])
        alpha = jnp.exp(m - shift)
        acc = acc * alpha[:, None] + jnp.dot(p, vb, precision=_PREC, preferred_element_type=jnp.float32)
        return m_new, row_sum * alpha + jnp.sum(p, axis=1), acc

    d = q_ref.shape[-1]
    init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32), jnp.zeros((bq, d), jnp.float32))
    upper = jnp.minimum(nk, ((qi + 1) * bq + bk - 1) // bk) if causal else nk
    m, row_sum, acc = jax.lax.fori_loop(0, upper, body, init)
    safe_sum = jnp.where(row_sum == 0, 1.0, row_sum)
    o_ref[...] = (acc / safe_sum[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(row_sum == 0, -jnp.inf, m + jnp.log(safe_sum))


def _blocks(lq: int, lk: int) -> tuple[int, int]:
    cap = 64 if platform() == "gpu" else 32
    return min(cap, max(16, next_pow2(lq))), min(cap, max(16, next_pow2(lk)))


def _own(q, k, v, causal: bool, scale: float):
    b, h, lq, d = q.shape
    lk = k.shape[2]
    bq, bk = _blocks(lq, lk)
    dp = max(16, next_pow2(d))
    lqp, lkp = round_up(lq, bq), round_up(lk, bk)
    qp = pad_axis(pad_axis(q, 3, dp), 2, lqp).reshape(b * h, lqp, dp)
    kp = pad_axis(pad_axis(k, 3, dp), 2, lkp).reshape(b * h, lkp, dp)
    vp = pad_axis(pad_axis(v, 3, dp), 2, lkp).reshape(b * h, lkp, dp)
    kernel = functools.partial(_kernel, bq=bq, bk=bk, lk=lk, nk=lkp // bk, causal=causal, scale=scale)
    q_spec = pl.BlockSpec((None, bq, dp), lambda g, i: (g, i, 0))
    kv_spec = pl.BlockSpec((None, lkp, dp), lambda g, i: (g, 0, 0))
    with x32():
        out, lse = pl.pallas_call(
            kernel, grid=(b * h, lqp // bq), in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=(q_spec, pl.BlockSpec((None, bq), lambda g, i: (g, i))),
            out_shape=(jax.ShapeDtypeStruct((b * h, lqp, dp), q.dtype),
                       jax.ShapeDtypeStruct((b * h, lqp), jnp.float32)),
            interpret=interpret(), name="tpu_interactive_attention",
        )(qp, kp, vp)
    return out.reshape(b, h, lqp, dp)[:, :, :lq, :d], lse.reshape(b, h, lqp)[:, :, :lq]


def reference(q, k, v, causal: bool, scale: float):
    """XLA attention in float32: (out, logsumexp)."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32), precision=_PREC) * scale
    if causal:
        lq, lk = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((lq, lk), jnp.bool_)), s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None])
    out = jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32), precision=_PREC)
    return out.astype(q.dtype), lse


def _segments(length: int, padded: int, batch: int):
    return jnp.broadcast_to((jnp.arange(padded) >= length).astype(jnp.int32), (batch, padded))


def _gpu_mha(q, k, v, causal, scale):
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    b, h, length, d = q.shape
    block = min(64, max(16, next_pow2(length)))
    lp, dp = round_up(length, block), max(16, next_pow2(d))
    prep = lambda t: jnp.swapaxes(pad_axis(pad_axis(t, 3, dp), 2, lp), 1, 2)  # noqa: E731  [B, L, H, D]
    seg = _segments(length, lp, b) if lp != length else None
    sizes = BlockSizes(block_q=block, block_k=block, block_q_dkv=min(32, block), block_kv_dkv=min(32, block),
                       block_q_dq=min(32, block), block_kv_dq=min(32, block))
    out = mha(prep(q), prep(k), prep(v), seg, sm_scale=scale, causal=causal, block_sizes=sizes)
    return jnp.swapaxes(out, 1, 2)[:, :, :length, :d]


def _tpu_flash_padded(q, k, v, causal, scale):
    from jax.experimental.pallas.ops.tpu.flash_attention import SegmentIds, flash_attention

    b, h, lq, d = q.shape
    lk = k.shape[2]
    lqp, lkp, dp = round_up(lq, 128), round_up(lk, 128), round_up(d, 128)
    pad = lambda t, lp: pad_axis(pad_axis(t, 3, dp), 2, lp)  # noqa: E731
    seg = None
    if lqp != lq or lkp != lk:
        seg = SegmentIds(q=_segments(lq, lqp, b), kv=_segments(lk, lkp, b))
    out = flash_attention(pad(q, lqp), pad(k, lkp), pad(v, lkp), segment_ids=seg, causal=causal, sm_scale=scale)
    return out[:, :, :lq, :d]


@contextlib.contextmanager
def _tpu_context(dtype):
    # float32 at full precision (the default rounds matmul operands to bfloat16); half inputs as
    # they are: Mosaic rejects an fp32 contract precision on bfloat16 operands ("Bad lhs type")
    full = jax.default_matmul_precision("highest") if dtype == jnp.float32 else contextlib.nullcontext()
    with x32(), full:
        yield


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _tpu_flash(q, k, v, causal, scale):
    with _tpu_context(q.dtype):
        return _tpu_flash_padded(q, k, v, causal, scale)


def _tpu_flash_fwd(q, k, v, causal, scale):
    # the library's backward is traced when the vjp is applied: keep the linearization (a pytree of
    # arrays) as the residual and apply it under the same context
    with _tpu_context(q.dtype):
        out, vjp = jax.vjp(functools.partial(_tpu_flash_padded, causal=causal, scale=scale), q, k, v)
    return out, vjp


def _tpu_flash_bwd(causal, scale, vjp, g):
    with _tpu_context(g.dtype):
        return vjp(g)


_tpu_flash.defvjp(_tpu_flash_fwd, _tpu_flash_bwd)


def attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False):
    """softmax(q k^T * scale [+ causal mask]) v. With ``return_lse`` also the float32 logsumexp
    [batch, heads, q_len] (from our kernel; from an XLA reduction where a library kernel ran)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attention(q, k, v, bool(causal), scale, bool(return_lse))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _attention(q, k, v, causal: bool, scale: float, return_lse: bool):
    lq, lk = q.shape[2], k.shape[2]
    if q.size == 0 or k.size == 0:
        out, lse = reference(q, k, v, causal, scale)
        return (out, lse) if return_lse else out
    library = None
    if platform() == "tpu":
        library = _tpu_flash
    elif platform() == "gpu" and lq == lk:
        library = _gpu_mha
    if library is not None:
        out = library(q, k, v, causal, scale)
        if not return_lse:
            return out
        return out, jax.lax.stop_gradient(reference(q, k, v, causal, scale)[1])
    fn = with_reference_vjp(functools.partial(_own, causal=causal, scale=scale),
                            functools.partial(reference, causal=causal, scale=scale))
    out, lse = fn(q, k, v)
    return (out, lse) if return_lse else out
