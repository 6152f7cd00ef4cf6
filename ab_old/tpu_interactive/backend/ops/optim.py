"""Fused optimizer steps and GradScaler's AMP kernels: one jitted update per call, on the device.

``torch.optim.{Adam,AdamW,SGD,Adagrad}(fused=True)`` call ``aten::_fused_*_`` with whole tensor
lists; the CPU fallback would copy every parameter and state to the host and back each step, so
these run as one ``jax.jit`` over the lists. Semantics follow torch's CPU/CUDA fused kernels:
the update is skipped entirely when ``found_inf == 1``; with ``grad_scale`` the grads are unscaled
and the unscaled grads are written back; hyper-parameters are traced values (an LR schedule does not
recompile). Every check runs before anything is written, so a step that raises changes nothing.
The lists a step rewrites (parameters, moments, unscaled grads) are donated to the update where only
their tensors hold them: XLA then updates them in place, as CUDA's fused kernels do, instead of holding
a second copy of every parameter and moment at the step's peak.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from .. import fusion, op_jit, storage
from ..registry import lower
from ._common import compute_dtype

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------- argument checks (before any write)
def _check_lists(kernel: str, names: str, lists: list[list[torch.Tensor]]) -> None:
    """The checks of torch's fused kernels: equal lengths, one dtype/device/layout, floating dtype."""
    n = len(lists[0])
    for other in lists[1:]:
        if len(other) != n:
            raise RuntimeError(f"Tensor lists must have the same number of tensors, got {n} and {len(other)}")
    if not n:
        return
    first = lists[0][0]
    for group in zip(*lists):
        for t in group:
            if t.device != first.device or t.dtype != first.dtype or t.layout != first.layout \
                    or t.shape != group[0].shape:
                raise RuntimeError(f"{names} must have same dtype, device, and layout")
    if first.dtype not in _FLOATS:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_type_name(first.dtype)}\'')


def _type_name(dtype: torch.dtype) -> str:
    return {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble"}.get(dtype, str(dtype).removeprefix("torch."))


def _check_aux(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device != device and not (name == "lr" and t.device.type == "cpu"):
            raise RuntimeError(f"{name} must be on the same device as the params ({t.device} vs {device})")


def _scalar(value):
    """A hyper-parameter for the update: a Python float, or a tpu tensor lr's array, made a float64
    scalar inside the jitted update (:func:`_f64`): eagerly, each was a program and a transfer of its
    own before every step (~0.1 ms apiece on a TPU host)."""
    if isinstance(value, torch.Tensor):
        return storage.read_lazy(value) if value.device.type == "tpu" else float(value.item())
    return float(value)


def _f64(value) -> jax.Array:
    return jnp.asarray(value, jnp.float64).reshape(())


def _f32(value) -> jax.Array | None:
    return None if value is None else value.astype(jnp.float32).reshape(())


def _optional(t: torch.Tensor | None):
    return None if t is None else storage.read_lazy(t)


def _finish(old: tuple, new: tuple, found_inf):
    """Keep every old value when found_inf == 1 (the kernels return before touching anything)."""
    if found_inf is None:
        return new
    skip = found_inf == 1.0
    return jax.tree_util.tree_map(lambda o, n: jnp.where(skip, o, n), old, new)


def _unscale(g, grad_scale, ct):
    return g if grad_scale is None else g / grad_scale.astype(ct)


_UPDATES: dict = {}  # jitted update -> (its function, static argument names)
_TWINS: dict = {}  # (update, lists written, lists donated) -> jitted update returning only those lists


def _update(*static_argnames: str):
    """``jax.jit`` with these static arguments, registered for :func:`_step`'s twins."""
    def wrap(fn):
        jitted = jax.jit(fn, static_argnames=static_argnames)
        _UPDATES[jitted] = (fn, static_argnames)
        return jitted
    return wrap


def _twin(update, order: tuple[int, ...], donate: tuple[int, ...]):
    """``update`` returning only the lists at ``order`` (what is written back: no copy of the rest),
    the first ``donate`` of them donated. jax pairs each donated input with the first free output of its
    shape, so the donated lists' results come first, in the order of their inputs: each result then
    takes its own input's memory."""
    key = (update, order, donate)
    twin = _TWINS.get(key)
    if twin is None:
        fn, static_argnames = _UPDATES[update]

        @functools.wraps(fn)  # jit reads the signature (static argument names) through __wrapped__
        def kept(*args, **static):
            out = fn(*args, **static)
            return tuple(out[k] for k in order)

        twin = _TWINS[key] = jax.jit(kept, static_argnames=static_argnames, donate_argnums=donate)
    return twin


def _donatable(tensors: list[torch.Tensor], arrays: list) -> bool:
    """``arrays`` (the tensors' concrete values, this list holding each) can be donated. A whole
    buffer's array that something else also holds (a tensor ``copy_`` made share it, a queued call) is
    replaced by a copy here, so that holder keeps the old value; a view's value is already a fresh
    array (read from its buffer), written back through the view afterwards."""
    if not all(type(a) is op_jit.ARRAY for a in arrays):
        return False
    for i, t in enumerate(tensors):
        buf = storage.buffer_of(t)
        if buf.array is arrays[i] and not storage.held_only_by(buf, extra=1):
            arrays[i] = jax.device_put(arrays[i], may_alias=False)
    return True


def _step(update, lists: list[list[torch.Tensor]], arrays: list[list], written: list[int], *rest,
          in_place: tuple[int, ...] | None = None, **static) -> None:
    """Run ``update(*arrays, *rest, **static)`` and write its ``written`` lists back into their
    tensors: recorded in fused mode; run now otherwise, donating the written lists (``in_place`` of
    them, default all), updated in place as CUDA's fused kernels do: no second copy of the parameters
    and moments at the step's peak."""
    written = tuple(k for k in written if lists[k])
    if fusion.active():
        order, results = written, fusion.call(_twin(update, written, ()), *arrays, *rest, **static)
    else:
        donate = tuple(k for k in written if (in_place is None or k in in_place) and _donatable(lists[k], arrays[k]))
        order = donate + tuple(k for k in written if k not in donate)
        results = _twin(update, order, donate)(*arrays, *rest, **static)
    for k, values in zip(order, results):
        for t, v in zip(lists[k], values):
            storage.write(t, v)


# ---------------------------------------------------------------- Adam / AdamW
@_update("adamw", "amsgrad", "maximize")
def _adam_update(params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps, hyper, grad_scale, found_inf,
                 *, adamw: bool, amsgrad: bool, maximize: bool):
    lr, beta1, beta2, weight_decay, eps = (_f64(h) for h in hyper)
    grad_scale, found_inf = _f32(grad_scale), _f32(found_inf)
    out = ([], [], [], [], [])
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        ct = compute_dtype(p.dtype)
        step = _f64(steps[i])
        bias1 = 1 - beta1 ** step
        bias2_sqrt = jnp.sqrt(1 - beta2 ** step)
        pc, gc = p.astype(ct), _unscale(g.astype(ct), grad_scale, ct)
        d = -gc if maximize else gc
        if adamw:
            pc = pc * (1 - lr * weight_decay).astype(ct)
        else:
            d = d + pc * weight_decay.astype(ct)
        m_new = m.astype(ct) * beta1.astype(ct) + d * (1 - beta1).astype(ct)
        v_new = v.astype(ct) * beta2.astype(ct) + d * d * (1 - beta2).astype(ct)
        second = v_new
        if amsgrad:
            second = jnp.maximum(max_sqs[i].astype(ct), v_new)
            out[4].append(second.astype(p.dtype))
        denom = jnp.sqrt(second) / bias2_sqrt.astype(ct) + eps.astype(ct)
        pc = pc - (lr / bias1).astype(ct) * m_new / denom
        out[0].append(pc.astype(p.dtype))
        out[1].append(gc.astype(g.dtype))
        out[2].append(m_new.astype(p.dtype))
        out[3].append(v_new.astype(p.dtype))
    return _finish((params, grads, exp_avgs, exp_avg_sqs, max_sqs), out, found_inf)


def _adam(adamw: bool, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
          beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    lists = [params, grads, exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad else [])
    names = ("params, grads, exp_avgs, exp_avg_sqs, and max_exp_avg_sqs" if amsgrad
             else "params, grads, exp_avgs, and exp_avg_sqs")
    kernel = "fused_adamw_kernel" if adamw else "fused_adam_kernel"
    _check_lists(kernel, names, lists)
    if not amsgrad and len(max_exp_avg_sqs):
        raise RuntimeError("max_exp_avg_sqs must be empty when amsgrad is False")
    if len(state_steps) != len(params):
        raise RuntimeError(f"Tensor lists must have the same number of tensors, got {len(params)} and "
                           f"{len(state_steps)}")
    if not params:
        return None
    device = params[0].device
    _check_aux(device, lr=lr if isinstance(lr, torch.Tensor) else None, grad_scale=grad_scale,
               found_inf=found_inf, **{f"state_steps[{i}]": s for i, s in enumerate(state_steps)})
    read = [[storage.read_lazy(t) for t in group] for group in lists]
    if not amsgrad:
        lists, read = lists + [[]], read + [[]]
    hyper = tuple(_scalar(x) for x in (lr, beta1, beta2, weight_decay, eps))
    steps = [storage.read_lazy(s) for s in state_steps]
    keep = [k for k in range(5) if k != 1 or grad_scale is not None]  # grads: only when unscaled
    _step(_adam_update, lists, read, keep, steps, hyper, _optional(grad_scale), _optional(found_inf),
          adamw=adamw, amsgrad=bool(amsgrad), maximize=bool(maximize))
    return None


@lower("_fused_adam_", "_fused_adam_.tensor_lr", raw=True)
def fused_adam_(*args, **kwargs):
    return _adam(False, *args, **kwargs)


@lower("_fused_adamw_", "_fused_adamw_.tensor_lr", raw=True)
def fused_adamw_(*args, **kwargs):
    return _adam(True, *args, **kwargs)


# ---------------------------------------------------------------- SGD
@_update("nesterov", "maximize", "is_first_step", "momentum_on")
def _sgd_update(params, grads, bufs, hyper, grad_scale, found_inf, *, nesterov: bool, maximize: bool,
                is_first_step: bool, momentum_on: bool):
    weight_decay, momentum, lr, dampening = (_f64(h) for h in hyper)
    grad_scale, found_inf = _f32(grad_scale), _f32(found_inf)
    out = ([], [], [])
    for i, (p, g) in enumerate(zip(params, grads)):
        ct = compute_dtype(p.dtype)
        pc, gc = p.astype(ct), _unscale(g.astype(ct), grad_scale, ct)
        d = (-gc if maximize else gc) + weight_decay.astype(ct) * pc  # buffers hold the negated grads, as CPU's
        if momentum_on:
            buf = d if is_first_step else (momentum.astype(ct) * bufs[i].astype(ct)
                                           + (1 - dampening).astype(ct) * d)
            out[2].append(buf.astype(p.dtype))
            d = d + momentum.astype(ct) * buf if nesterov else buf
        pc = pc - lr.astype(ct) * d
        out[0].append(pc.astype(p.dtype))
        out[1].append(gc.astype(g.dtype))
    return _finish((params, grads, bufs), out, found_inf)


@lower("_fused_sgd_", "_fused_sgd_.tensor_lr", raw=True)
def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
               maximize, is_first_step, grad_scale=None, found_inf=None):
    momentum_on = len(momentum_buffer_list) > 0
    lists = [params, grads] + ([momentum_buffer_list] if momentum_on else [])
    names = "params, grads, and momentum_buffer_list" if momentum_on else "params and grads"
    _check_lists("fused_sgd_kernel", names, lists)
    if not params:
        return None
    _check_aux(params[0].device, lr=lr if isinstance(lr, torch.Tensor) else None,
               grad_scale=grad_scale, found_inf=found_inf)
    read = [[storage.read_lazy(t) for t in group] for group in lists]
    if not momentum_on:
        lists, read = lists + [[]], read + [[]]
    hyper = tuple(_scalar(x) for x in (weight_decay, momentum, lr, dampening))
    keep = [0, 1] if grad_scale is not None else [0]
    keep += [2] if momentum_on else []
    _step(_sgd_update, lists, read, keep, hyper, _optional(grad_scale), _optional(found_inf),
          nesterov=bool(nesterov), maximize=bool(maximize), is_first_step=bool(is_first_step), momentum_on=momentum_on)
    return None


# ---------------------------------------------------------------- Adagrad
@_update("maximize")
def _adagrad_update(params, grads, sums, steps, hyper, grad_scale, found_inf, *, maximize: bool):
    lr, lr_decay, weight_decay, eps = (_f64(h) for h in hyper)
    grad_scale, found_inf = _f32(grad_scale), _f32(found_inf)
    out = ([], [], [])
    for i, (p, g, s) in enumerate(zip(params, grads, sums)):
        ct = compute_dtype(p.dtype)
        pc, gc = p.astype(ct), _unscale(g.astype(ct), grad_scale, ct)
        d = -gc if maximize else gc
        d = d + pc * weight_decay.astype(ct)
        clr = lr / (1 + (_f64(steps[i]) - 1) * lr_decay)
        s_new = s.astype(ct) + d * d
        pc = pc - clr.astype(ct) * d / (jnp.sqrt(s_new) + eps.astype(ct))
        out[0].append(pc.astype(p.dtype))
        out[1].append(gc.astype(g.dtype))
        out[2].append(s_new.astype(p.dtype))
    return _finish((params, grads, sums), out, found_inf)


@lower("_fused_adagrad_", "_fused_adagrad_.tensor_lr", raw=True)
def fused_adagrad_(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                   grad_scale=None, found_inf=None):
    lists = [params, grads, state_sums]
    _check_lists("fused_adagrad_kernel", "params, grads, and state_sums", lists)
    if len(state_steps) != len(params):
        raise RuntimeError(f"Tensor lists must have the same number of tensors, got {len(params)} and "
                           f"{len(state_steps)}")
    if not params:
        return None
    _check_aux(params[0].device, lr=lr if isinstance(lr, torch.Tensor) else None,
               grad_scale=grad_scale, found_inf=found_inf)
    read = [[storage.read_lazy(t) for t in group] for group in lists]
    steps = [storage.read_lazy(s) for s in state_steps]
    hyper = tuple(_scalar(x) for x in (lr, lr_decay, weight_decay, eps))
    keep = [0, 1, 2] if grad_scale is not None else [0, 2]
    _step(_adagrad_update, lists, read, keep, steps, hyper, _optional(grad_scale), _optional(found_inf),
          maximize=bool(maximize))
    return None


# ---------------------------------------------------------------- GradScaler
def _check_amp_scalar(t: torch.Tensor, what: str) -> None:
    if t.numel() != 1:
        raise RuntimeError(f"{what} must be a 1-element tensor.")
    if t.dtype != torch.float32:
        raise RuntimeError(f"{what} must be a float tensor.")


@_update()
def _unscale_update(values, found_infs, inv_scale):
    shape = found_infs[0].shape
    found_inf, inv_scale = _f32(found_infs[0]), _f32(inv_scale)
    finite = jnp.array(True)
    out = []
    for v in values:
        finite = finite & jnp.all(jnp.isfinite(v))
        ct = compute_dtype(v.dtype)
        out.append((v.astype(ct) * inv_scale.astype(ct)).astype(v.dtype))
    return out, [jnp.where(finite, found_inf, jnp.float32(1.0)).reshape(shape)]


@lower("_amp_foreach_non_finite_check_and_unscale_", raw=True)
def amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    _check_amp_scalar(inv_scale, "inv_scale")
    _check_amp_scalar(found_inf, "found_inf")
    for t in self:
        if t.device != found_inf.device or t.device != inv_scale.device:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               f"devices, {t.device} and {found_inf.device if t.device != found_inf.device else inv_scale.device}!")
        if not t.is_floating_point():
            raise RuntimeError("scaled_grads must be floating point tensors.")
    if not self:
        return None
    # the grads in place (a GradScaler rewrites every grad each step); found_inf, a small shared fill, not
    _step(_unscale_update, [list(self), [found_inf]], [[storage.read_lazy(t) for t in self], [_optional(found_inf)]],
          [0, 1], _optional(inv_scale), in_place=(0,))
    return None


@functools.partial(jax.jit, static_argnames=("growth_interval",))
def _scale_update(scale, tracker, found_inf, growth, backoff, *, growth_interval: int):
    growth, backoff = jnp.float32(growth), jnp.float32(backoff)  # Python floats: no transfer per call
    grown = tracker + 1
    do_grow = grown == growth_interval
    new_scale = jnp.where(do_grow, scale * growth, scale)
    new_scale = jnp.where(jnp.isfinite(new_scale), new_scale, scale)
    inf = found_inf != 0
    return (jnp.where(inf, scale * backoff, new_scale),
            jnp.where(inf | do_grow, jnp.zeros_like(tracker), grown))


@lower("_amp_update_scale_", raw=True)
def amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, backoff_factor, growth_interval):
    _check_amp_scalar(self, "current_scale")
    if growth_tracker.numel() != 1:
        raise RuntimeError("growth_tracker must be a 1-element tensor.")
    if found_inf.numel() != 1:
        raise RuntimeError("found_inf must be a 1-element tensor.")
    if growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be an int tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")
    scale, tracker = fusion.call(
        _scale_update, storage.read_lazy(self), storage.read_lazy(growth_tracker), storage.read_lazy(found_inf),
        float(scale_growth_factor), float(backoff_factor), growth_interval=int(growth_interval))
    storage.write(self, scale)
    storage.write(growth_tracker, tracker)
    return self

