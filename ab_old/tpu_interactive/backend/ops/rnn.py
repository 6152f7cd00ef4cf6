"""Fused RNN cells: what ``nn.LSTMCell``/``nn.GRUCell`` (``lstm_cell``, ``gru_cell``) call on every
non-CPU device, forward and backward, with the layouts of CUDA's kernels (aten/native/cuda/RNN.cu).

The gate matmuls stay outside (``linear``); these ops take the pre-activation gates. ``workspace``
carries what the backward needs: LSTM, the four activated gates ``[i, f, g, o]``; GRU,
``[r, z, n, hx, hn + b_hn]`` (5·hidden). Half inputs are computed in float32, as CUDA's acc type.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import lower
from ._common import opmath


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = opmath(input_gates) + opmath(hidden_gates)
    if input_bias is not None:
        gates = gates + opmath(input_bias) + opmath(hidden_bias)
    return gates


# meta=False: torch's meta kernel for it fails on the bias-free call (it reads None.device)
@lower("_thnn_fused_lstm_cell", meta=False)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dtype = cx.dtype
    i, f, g, o = jnp.split(_gates(input_gates, hidden_gates, input_bias, hidden_bias), 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * opmath(cx) + i * g
    workspace = jnp.concatenate([i, f, g, o], axis=1)
    return tuple(t.astype(dtype) for t in (o * jnp.tanh(cy), cy, workspace))


@lower("_thnn_fused_lstm_cell_backward_impl")
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = jnp.split(opmath(workspace), 4, axis=1)
    cx, cy = opmath(cx), opmath(cy)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else opmath(grad_hy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + opmath(grad_cy)
    grad_gates = jnp.concatenate([
        grad_c * g * i * (1 - i),
        grad_c * cx * f * (1 - f),
        grad_c * i * (1 - g * g),
        grad_hy * tanh_cy * o * (1 - o),
    ], axis=1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


@lower("_thnn_fused_gru_cell", meta=False)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dtype = hx.dtype
    ir, iz, in_ = jnp.split(opmath(input_gates), 3, axis=1)
    hr, hz, hn = jnp.split(opmath(hidden_gates), 3, axis=1)
    if input_bias is not None:
        bir, biz, bin_ = jnp.split(opmath(input_bias), 3)
        bhr, bhz, bhn = jnp.split(opmath(hidden_bias), 3)
        ir, iz, in_ = ir + bir + bhr, iz + biz + bhz, in_ + bin_
        hn = hn + bhn
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hx = opmath(hx)
    hy = n + z * (hx - n)
    return hy.astype(dtype), jnp.concatenate([r, z, n, hx, hn], axis=1).astype(dtype)


@lower("_thnn_fused_gru_cell_backward", meta=False)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dtype = grad_hy.dtype
    r, z, n, hx, hn = jnp.split(opmath(workspace), 5, axis=1)
    grad_hy = opmath(grad_hy)
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * (1 - r) * r
    grad_input_gates = jnp.concatenate([grad_r, grad_z, grad_n], axis=1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=1)
    outs = [grad_input_gates, grad_hidden_gates, grad_hy * z]
    if has_bias:
        outs += [grad_input_gates.sum(0), grad_hidden_gates.sum(0)]
    else:
        outs += [None, None]
    return tuple(None if t is None else t.astype(dtype) for t in outs)
