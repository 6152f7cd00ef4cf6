"""scaled_dot_product_attention as one fused (jitted) XLA computation, forward and backward.

Routing: torch's composite F.scaled_dot_product_attention asks a device's ``_fused_sdp_choice_stub``
(a C++ DispatchStub) which kernel to run. The C++ extension answers it (``route``; csrc/tpu_native.cpp):

- 4-d float q/k/v of one batch and head count (torch 2.14's composite asks with 3-d ones made 4-d), no
  dropout, no mask or one that broadcasts (a bool mask arrives as torch's additive float mask):
  ``aten::_scaled_dot_product_fused_attention_overrideable``, lowered here as one op (output and
  logsumexp; the L x S weights are neither output nor kept) with torch's own C++ autograd formula,
  whose backward op is lowered too (``jax.vjp``, recomputing from q/k/v). Both are ordinary registry
  ops: a repeated call runs, or in fused mode is recorded, from a C++ plan; the Pallas flash kernel is
  their variant where there is no mask.
- everything else (dropout, GQA, broadcast batch/heads, other ranks, traced tensors, the user's
  ``sdpa_kernel(SDPBackend.MATH)``): ``aten::_scaled_dot_product_attention_math``, which is
  CompositeImplicitAutograd (torch would decompose it into ~15 small ops); we lower it whole:
  a PrivateUse1 kernel (registry) for inference and an AutogradPrivateUse1 kernel (here): an
  autograd.Function whose backward is ``jax.vjp`` of the same jitted function. Dropout draws its
  keep-mask from a device RNG key that the backward reuses.

Without the C++ extension, our Python kernels on ``aten::scaled_dot_product_attention`` itself make
that choice: the flash kernel when the Pallas switch covers the call, else the math op.

Numerics follow ATen's math path exactly: half inputs computed in float32, q and k each scaled by
sqrt(scale), ``_safe_softmax`` (a fully masked row gives zeros, not NaN), at::dropout scaling,
GQA by repeat_interleave of k/v heads.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from .. import compile_ahead, dtypes, fusion, op_jit, storage
from ..config import config
from ..dispatch import meta_spec
from ..registry import lower, pallas_variant
from ._common import HALF
from ..rng import default_generator
from ..stats import STATS, record_kernel_path

_aten = torch.ops.aten
_OP = _aten._scaled_dot_product_attention_math.default
_OP_NAME = "aten::_scaled_dot_product_attention_math"
_PREC = jax.lax.Precision.HIGHEST


def _allow_half_reduction() -> bool:
    getter = getattr(torch._C, "_get_math_sdp_allow_fp16_bf16_reduction", None)
    return bool(getter()) if getter is not None else False


@jax.custom_jvp
def _safe_softmax(x):
    """Softmax over the last axis; a row of all -inf (fully masked: left padding makes such rows) gives
    zeros, not NaN. Its row max is -inf exactly then: the row's exponentials are all 0 and its sum is
    divided by 1 instead, so the mask comes from the max the softmax needs anyway (no full-size
    ``all(x == -inf)`` reduction, no selects on the full-size weights)."""
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    fully_masked = row_max == -jnp.inf
    unnormalized = jnp.exp(x - jnp.where(fully_masked, jnp.zeros((), x.dtype), row_max))
    total = jnp.sum(unnormalized, axis=-1, keepdims=True)
    return unnormalized / jnp.where(fully_masked, jnp.ones((), x.dtype), total)


@_safe_softmax.defjvp
def _safe_softmax_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    y = _safe_softmax(x)  # zeros in a fully masked row: its tangent is zero too, never NaN
    return y, y * (x_dot - jnp.sum(y * x_dot, axis=-1, keepdims=True))


def _scores(q, k, bias, is_causal: bool, scale):
    """q k^T * scale plus the causal or additive mask, in q's (the compute) dtype; q and k are each
    scaled by sqrt(scale) first, as ATen's math path does for stability."""
    factor = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    q = q * (-factor if scale is not None and scale < 0 else factor)
    scores = jnp.matmul(q, jnp.swapaxes(k * factor, -1, -2), precision=_PREC)
    if is_causal:
        causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
        return scores + jnp.where(causal, 0.0, -jnp.inf).astype(q.dtype)
    return scores if bias is None else scores + bias.astype(q.dtype)


@functools.partial(jax.jit, static_argnames=("dropout_p", "is_causal", "scale", "enable_gqa", "explicit_mask",
                                             "compute_dtype"))
def _attention(q, k, v, bias, keep, *, dropout_p, is_causal, scale, enable_gqa, explicit_mask, compute_dtype):
    """(out, attn weights) in q's dtype. ``keep`` is the dropout keep-mask (None without dropout)."""
    origin = q.dtype
    acc = jnp.dtype(compute_dtype)
    q, k, v = q.astype(acc), k.astype(acc), v.astype(acc)
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    attn = _safe_softmax(_scores(q, k, bias, is_causal, scale))
    if keep is not None and explicit_mask:  # ATen: masked_fill, scaling moved onto v, weights unscaled
        attn = jnp.where(keep, attn, jnp.zeros((), acc))
        v = v * (1.0 / (1.0 - dropout_p))
    elif keep is not None:  # at::dropout: input * (mask / (1 - p))
        attn = attn * (keep.astype(acc) / (1.0 - dropout_p) if dropout_p < 1 else jnp.zeros((), acc))
    out = jnp.matmul(attn, v, precision=_PREC)
    return out.astype(origin), attn.astype(origin)


@functools.partial(jax.jit, static_argnames=("dropout_p", "is_causal", "scale", "enable_gqa", "explicit_mask",
                                             "compute_dtype", "bias_grad", "grad_dtypes"))
def _attention_vjp(q, k, v, bias, keep, g_out, g_attn, *, bias_grad, grad_dtypes, **static):
    """The gradients of q, k, v (and of the bias where ``bias_grad``, else None), cast to
    ``grad_dtypes`` (the tensors' dtype names) in the program."""
    if bias_grad:
        fn = lambda q_, k_, v_, b_: _attention(q_, k_, v_, b_, keep, **static)  # noqa: E731
        _, vjp = jax.vjp(fn, q, k, v, bias)
        grads = vjp((g_out, g_attn))
    else:
        fn = lambda q_, k_, v_: _attention(q_, k_, v_, bias, keep, **static)  # noqa: E731
        _, vjp = jax.vjp(fn, q, k, v)
        grads = vjp((g_out, g_attn)) + (None,)
    return tuple(None if g is None else g.astype(d) for g, d in zip(grads, grad_dtypes))


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:  # numpy's dtype name lookup costs ~2 us, twice per attention call
    return jnp.dtype(dtype).name


def _keep_mask(key, shape, dropout_p):
    return jax.random.bernoulli(key, 1.0 - dropout_p, shape)


def _compute_dtype(dtype) -> str:
    """The dtype attention computes in (half inputs in float32, as ATen's math path), by name."""
    return _dtype_name(jnp.float32 if dtype in HALF and not _allow_half_reduction() else dtype)


def _static(dtype, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa):
    return dict(dropout_p=float(dropout_p), is_causal=bool(is_causal), scale=scale, enable_gqa=bool(enable_gqa),
                explicit_mask=dropout_mask is not None, compute_dtype=_compute_dtype(dtype))


def _keep(dropout_p, dropout_mask, weights_shape):
    """The dropout keep-mask (drawn from the device generator unless given), None without dropout."""
    if dropout_p <= 0:
        return None
    if dropout_mask is not None:
        return dropout_mask.astype(bool)
    return _keep_mask(default_generator.next_key(), tuple(weights_shape), dropout_p)


def _run(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa, weights_shape):
    """Arrays in, (out, attn, keep) out; draws the dropout keep-mask when dropout is on."""
    static = _static(q.dtype, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa)
    keep = _keep(dropout_p, dropout_mask, weights_shape)
    bias = None if is_causal else attn_mask
    out, attn = _attention(q, k, v, bias, keep, **static)
    return out, attn, keep


@lower("_scaled_dot_product_attention_math", needs_spec=True)
def sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, dropout_mask=None, *, scale=None,
              enable_gqa=False, spec):
    weights_shape = spec.shape(1)
    out, attn, _ = _run(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa, weights_shape)
    return out, attn


# ---------------------------------------------------------------- the fused op torch's composite calls
# With the C++ extension, torch's composite F.scaled_dot_product_attention asks our kernel choice
# (csrc/tpu_native.cpp, tpu_sdp_choice) and sends the calls it covers (4-d float q/k/v of one batch and
# head count, no dropout, a mask that broadcasts) here: one lowered op, forward and backward, with
# torch's own C++ autograd formula, so a repeated call runs (or, fused, is recorded) from a C++ plan.
# The L x S weights are neither an output nor kept: the backward recomputes them (jax.vjp).
def _fused_static(q, is_causal, scale) -> dict:
    return dict(is_causal=bool(is_causal), scale=scale, compute_dtype=_compute_dtype(q.dtype))


@functools.partial(jax.jit, static_argnames=("is_causal", "scale", "compute_dtype"))
def _fused_forward(q, k, v, bias, *, is_causal, scale, compute_dtype):
    """(out in q's dtype, the float32 logsumexp of each query's scores): the op's meaningful outputs."""
    acc = jnp.dtype(compute_dtype)
    scores = _scores(q.astype(acc), k.astype(acc), bias, is_causal, scale)
    out = jnp.matmul(_safe_softmax(scores), v.astype(acc), precision=_PREC).astype(q.dtype)
    return out, jax.nn.logsumexp(scores, axis=-1).astype(jnp.float32)


def _fused_out(q, k, v, bias, **static):
    return _fused_forward(q, k, v, bias, **static)[0]


def no_fused_extras(dropout_p, return_debug_mask) -> None:
    if dropout_p > 0 or return_debug_mask:  # never chosen so (tpu_sdp_choice): only a direct call
        raise NotImplementedError("aten::_scaled_dot_product_fused_attention_overrideable on tpu: dropout and "
                                  "return_debug_mask are not supported (F.scaled_dot_product_attention "
                                  "takes the math path for dropout)")


@lower("_scaled_dot_product_fused_attention_overrideable")
def sdpa_fused(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    no_fused_extras(dropout_p, return_debug_mask)
    return fused_results(*_fused_forward(q, k, v, None if is_causal else attn_bias,
                                         **_fused_static(q, is_causal, scale)))


def fused_results(out, lse) -> tuple:
    """The fused op's nine results from its output and logsumexp (its Pallas variant's too)."""
    seed = jnp.zeros((), jnp.int32)  # no dropout: no RNG state for the backward
    # cum_seq_q/k and the debug mask are undefined; max_q/max_k are torch's meta values (dispatch fills them)
    return out, lse, None, None, None, None, seed, seed, None


@functools.partial(jax.jit, static_argnames=("is_causal", "scale", "compute_dtype", "bias_grad"))
def _fused_backward(g, q, k, v, bias, *, bias_grad, **static):
    if bias_grad:
        _, vjp = jax.vjp(lambda q_, k_, v_, b_: _fused_out(q_, k_, v_, b_, **static), q, k, v, bias)
        return vjp(g)
    _, vjp = jax.vjp(lambda q_, k_, v_: _fused_out(q_, k_, v_, bias, **static), q, k, v)
    return (*vjp(g), None if bias is None else jnp.zeros(bias.shape, bias.dtype))


@lower("_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_fused_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                        max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    no_fused_extras(dropout_p, False)
    bias = None if is_causal else attn_bias
    bias_grad = bool(grad_input_mask[3]) and bias is not None
    return _fused_backward(grad_out, q, k, v, bias, bias_grad=bias_grad,
                           **_fused_static(q, is_causal, scale))


# ---------------------------------------------------------------- autograd
def _buffers(tensors: list) -> tuple[list, tuple]:
    """(each tensor's buffer array, each one's view geometry or None): the program or the recorded
    step reads the views itself, one program instead of a read program per view (q, k and v are views
    of one projection). Recorded or deferred values (fused mode, compile_ahead.py) stay so."""
    lazy = fusion.active() or compile_ahead.has_pending()
    pairs = [(None, None) if t is None else storage.buffer_and_view(t, lazy) for t in tensors]
    return [array for array, _ in pairs], tuple(where for _, where in pairs)


def _read_views(arrays, views) -> list:
    return [a if where is None or a is None else storage.view_value(a, *where) for a, where in zip(arrays, views)]


def _run_of_buffers(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa, weights_shape, *,
                    views):
    q, k, v, attn_mask, dropout_mask = _read_views((q, k, v, attn_mask, dropout_mask), views)
    return _run(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa, weights_shape)


def _attention_of_buffers(q, k, v, bias, keep, *, views, **static):
    q, k, v, bias = _read_views((q, k, v, bias), views)
    return _attention(q, k, v, bias, keep, **static)


def _attention_vjp_of_buffers(q, k, v, bias, keep, g_out, g_attn, *, views, **static):
    q, k, v, bias, g_out, g_attn = _read_views((q, k, v, bias, g_out, g_attn), views)
    return _attention_vjp_or_zeros(q, k, v, bias, keep, g_out, g_attn, **static)


def _attention_vjp_or_zeros(q, k, v, bias, keep, g_out, g_attn, *, g_shapes, **static):
    """A missing output gradient (``attn_weights`` is unused when ``need_weights=False``) is zeros
    made in the program: made eagerly, each was a dispatch of its own (~44 us on XLA:CPU) and an input."""
    g_out = g_out if g_out is not None else jnp.zeros(g_shapes[0], q.dtype)
    g_attn = g_attn if g_attn is not None else jnp.zeros(g_shapes[1], q.dtype)
    return _attention_vjp(q, k, v, bias, keep, g_out, g_attn, **static)


def _program(fn, inputs: list, static: dict):
    """``fn(*inputs, **static)``: recorded in fused mode; else one program per signature (op_jit),
    deferred while it compiles (compile_ahead.py), as an op's lowering is."""
    if fusion.active():
        return fusion.call(fn, *inputs, **static)
    return op_jit.call(fn, inputs, static, None, defer=_OP_NAME)


class _SDPAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa):
        spec = meta_spec(_OP, (q, k, v, attn_mask, dropout_p, is_causal, dropout_mask),
                         {"scale": scale, "enable_gqa": enable_gqa}, False)  # torch's checks and shapes
        STATS.op_counts[_OP_NAME] += 1
        op_name = _OP_NAME  # noqa: F841 - compile_log.attribute names this frame's compiles after it
        if fusion.active():  # the keep-mask drawn in the recorded step (its keys are drawn as it is recorded)
            (qa, ka, va, mask, drop), views = _buffers([q, k, v, attn_mask, dropout_mask])
            out, attn, keep = fusion.call(_run_of_buffers, qa, ka, va, mask, dropout_p, is_causal, drop, scale,
                                          enable_gqa, spec.outputs[1].shape, views=views)
        else:  # the keep-mask drawn now (a program's inputs are pure); the attention deferred while it compiles
            keep = _keep(dropout_p, None if dropout_mask is None else storage.read(dropout_mask), spec.outputs[1].shape)
            static = _static(dtypes.to_jax(q.dtype), attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa)
            arrays, static["views"] = _buffers([q, k, v, None if is_causal else attn_mask])
            out, attn = _program(_attention_of_buffers, [*arrays, keep], static)
        ctx.save_for_backward(q, k, v, attn_mask)
        # an unused output's gradient (attn_weights: F.scaled_dot_product_attention drops it) comes as
        # None and is zeros made in the program; materialized, it was an empty + zero_ dispatch per call
        # and a [batch, heads, L, S] input
        ctx.set_materialize_grads(False)
        ctx.keep = keep
        ctx.args = (dropout_p, is_causal, dropout_mask is not None, scale, enable_gqa)
        ctx.weights_shape = spec.outputs[1].shape
        return tuple(storage.new_tensor(a, s.shape, s.dtype) for a, s in zip((out, attn), spec.outputs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, g_attn):
        q, k, v, attn_mask = ctx.saved_tensors
        dropout_p, is_causal, explicit, scale, enable_gqa = ctx.args
        STATS.op_counts[_OP_NAME + " (backward)"] += 1
        op_name = _OP_NAME + " (backward)"  # noqa: F841 - compile_log.attribute names this frame's compiles after it
        dtype = dtypes.to_jax(q.dtype)
        static = _static(dtype, attn_mask, dropout_p, is_causal, None, scale, enable_gqa)
        static["explicit_mask"] = explicit
        bias_grad = not is_causal and attn_mask is not None and attn_mask.requires_grad and attn_mask.is_floating_point()
        out_shape = ctx.weights_shape[:-1] + v.shape[-1:]
        tensors = [q, k, v, attn_mask]
        grad_dtypes = tuple([None if t is None else _dtype_name(dtypes.to_jax(t.dtype)) for t in tensors])
        # g_shapes: a missing output gradient is zeros, made in the program (either path)
        static.update(bias_grad=bias_grad, grad_dtypes=grad_dtypes, g_shapes=(out_shape, tuple(ctx.weights_shape)))
        arrays, static["views"] = _buffers([q, k, v, None if is_causal else attn_mask, g_out, g_attn])
        grads = _program(_attention_vjp_of_buffers, [*arrays[:4], ctx.keep, *arrays[4:]], static)
        wrapped = [None if g is None else storage.new_tensor(g, t.shape, t.dtype) for g, t in zip(grads, tensors)]
        if g_out is None:  # v reaches the weights through nothing: no gradient, as torch's math kernel gives
            wrapped[2] = None
        return (*wrapped, None, None, None, None, None)


_BELOW_AUTOGRAD = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _traced(t: torch.Tensor) -> bool:
    """Fake / functional / functorch-wrapped tensors: torch.compile, make_fx or torch.func tracing,
    where the op must decompose into traceable aten ops instead of running our kernel."""
    return (type(t) not in (torch.Tensor, torch.nn.Parameter) or torch._C._functorch.is_functorch_wrapped_tensor(t)
            or torch._is_functional_tensor(t))


def _autograd_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, dropout_mask=None, *, scale=None,
                     enable_gqa=False):
    if _traced(q):
        return _OP.decompose(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale=scale,
                             enable_gqa=enable_gqa)
    tensors = (q, k, v) + ((attn_mask,) if attn_mask is not None and attn_mask.is_floating_point() else ())
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return _OP.redispatch(_BELOW_AUTOGRAD, q, k, v, attn_mask, dropout_p, is_causal, dropout_mask,
                              scale=scale, enable_gqa=enable_gqa)
    return _SDPAFunction.apply(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa)


_AUTOGRAD_LIB = torch.library.Library("aten", "IMPL")
_AUTOGRAD_LIB.impl("_scaled_dot_product_attention_math", _autograd_kernel, "AutogradPrivateUse1")


# ---------------------------------------------------------------- F.scaled_dot_product_attention -> Pallas
_SDPA = _aten.scaled_dot_product_attention.default
_SDPA_NAME = "aten::scaled_dot_product_attention"


def _flash(q, k, v, is_causal, scale):
    from ..kernels.attention import attention  # the kernels package loads after every ops module

    return attention(q, k, v, causal=is_causal, scale=scale)


@functools.partial(jax.jit, static_argnames=("is_causal", "scale"))
def _flash_vjp(q, k, v, g, *, is_causal, scale):
    _, vjp = jax.vjp(lambda q_, k_, v_: _flash(q_, k_, v_, is_causal, scale), q, k, v)
    return vjp(g)


def _flash_float(*arrays) -> bool:
    from ..kernels import _float

    return _float(*arrays)


# the fused op's Pallas variants (as the kernels package attaches its own): the flash kernel where there
# is no mask, its vjp for the backward (kept here: the kernels package does not import the ops modules)
@pallas_variant("_scaled_dot_product_fused_attention_overrideable",
                covers=lambda q, k, v, attn_bias=None, *args, **kwargs: attn_bias is None and _flash_float(q, k, v))
def sdpa_fused_flash(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    from ..kernels.attention import attention

    no_fused_extras(dropout_p, return_debug_mask)
    return fused_results(*attention(q, k, v, causal=is_causal, scale=scale, return_lse=True))


@pallas_variant("_scaled_dot_product_fused_attention_overrideable_backward",
                covers=lambda grad_out, q, k, v, attn_bias, *args, **kwargs: attn_bias is None and _flash_float(q, k, v))
def sdpa_fused_flash_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                              max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    no_fused_extras(dropout_p, False)
    return (*_flash_vjp(q, k, v, grad_out.astype(q.dtype), is_causal=is_causal, scale=scale), None)


def _flash_covers(q, k, v, attn_mask, dropout_p, enable_gqa) -> bool:
    from ..kernels import available

    return (available() and attn_mask is None and dropout_p == 0.0 and q.dim() == 4 and k.dim() == 4 and v.dim() == 4
            and q.dtype.is_floating_point and q.dtype.itemsize <= 4 and q.dtype == k.dtype == v.dtype
            and q.shape[:2] == k.shape[:2] == v.shape[:2] and k.shape[2] == v.shape[2]
            and q.shape[3] == k.shape[3] == v.shape[3] and q.numel() and k.numel())


class _FlashFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        STATS.op_counts[_SDPA_NAME] += 1
        out = _flash(storage.read(q), storage.read(k), storage.read(v), is_causal, scale)
        ctx.save_for_backward(q, k, v)
        ctx.static = dict(is_causal=is_causal, scale=scale)
        return storage.new_tensor(out, q.shape[:-1] + v.shape[-1:], q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out):
        q, k, v = ctx.saved_tensors
        STATS.op_counts[_SDPA_NAME + " (backward)"] += 1
        grads = _flash_vjp(storage.read(q), storage.read(k), storage.read(v), storage.read(g_out), **ctx.static)
        return (*(storage.new_tensor(g.astype(dtypes.to_jax(t.dtype)), t.shape, t.dtype)
                  for g, t in zip(grads, (q, k, v))), None, None)


def _sdpa_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False,
                 autograd: bool = False):
    args = (q, k, v, attn_mask, dropout_p, is_causal)
    kwargs = {"scale": scale, "enable_gqa": enable_gqa}
    if not _traced(q):
        meta_spec(_SDPA, args, kwargs, False)  # torch's own input checks and errors, before anything is counted
        if config.pallas and _flash_covers(q, k, v, attn_mask, dropout_p, enable_gqa):
            record_kernel_path(_SDPA_NAME, "pallas")
            return _FlashFunction.apply(q, k, v, bool(is_causal), scale)
        record_kernel_path(_SDPA_NAME, "xla")  # switch off, or a mask/dropout the kernel does not cover
        if autograd and (attn_mask is None or attn_mask.dtype != torch.bool):
            # what torch's composite does for a device without fused kernels, without its dispatch: the
            # math op on the same arguments (it converts only a boolean mask)
            return _autograd_kernel(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                                    enable_gqa=enable_gqa)[0]
    return _SDPA.decompose(*args, **kwargs)


def _sdpa_autograd_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return _sdpa_kernel(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa, autograd=True)


def route(native_module) -> None:
    """How F.scaled_dot_product_attention reaches us (installation.install, once). With the C++
    extension, torch's own composite asks its kernel choice (``register_sdp_choice``): the covered
    calls take the fused overrideable op (Pallas through its variant), the rest the math op. Without
    it, our kernels on the op itself make that choice in Python."""
    if native_module is not None:
        native_module.register_sdp_choice()
        return
    _AUTOGRAD_LIB.impl("scaled_dot_product_attention", _sdpa_autograd_kernel, "AutogradPrivateUse1")
    _AUTOGRAD_LIB.impl("scaled_dot_product_attention", _sdpa_kernel, "PrivateUse1")
