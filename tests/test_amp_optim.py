"""Fused optimizers, GradScaler, torch.autocast("tpu") and the fallback's write-back of mutated
tensor lists, all checked against CPU PyTorch on the same inputs."""
from __future__ import annotations

import copy
import os
import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from autocast_samples import CAST_ONLY, SAMPLES
from helpers import TPU, assert_same, floats, rand, to_tpu

import tpu_interactive as tt
from tpu_interactive.backend import autocast_policy, dispatch, fallback, storage


# ============================================================ fallback write-back of Tensor(a!)[] lists
def _is_mutable_list(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write and isinstance(arg.type, torch.ListType)


def _backend_ops_with_mutable_lists() -> list[torch._ops.OpOverload]:
    """Every aten overload with a mutable tensor-list argument whose tpu call reaches a backend
    kernel (a lowering of ours or the fallback), i.e. has no composite kernel that runs instead."""
    found = []
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        if not full.startswith("aten::"):
            continue
        packet_name, _, overload = full[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, packet_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None or not any(_is_mutable_list(a) for a in op._schema.arguments):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(full, k) for k in
               ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")):
            continue
        found.append(op)
    return found


# Ops of that walk that cannot be exercised here, with the reason. Empty today: every such op is
# built from its schema below. A new op whose arguments the builder does not know fails the test
# until it is built or listed here.
CANNOT_EXERCISE: dict[str, str] = {}

# values by argument name (the builder reads names and types from the schema)
_FLOAT_ARGS = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.05, "eps": 1e-8, "momentum": 0.9,
               "dampening": 0.1, "lr_decay": 0.01}
_BOOL_ARGS = {"amsgrad": True, "maximize": False, "nesterov": True, "is_first_step": False}


def _build(op):
    """CPU arguments for ``op`` from its schema, or None when an argument is unknown."""
    args, kwargs = [], {}
    seed = iter(range(1000))
    for a in op._schema.arguments:
        t = str(a.type)
        if t == "List[Tensor]":
            value = ([torch.full((), 3.0), torch.full((), 3.0)] if a.name == "state_steps" else
                     [rand(3, 4, seed=next(seed)), rand(5, seed=next(seed))])
            if a.name == "self" and "non_finite" in op._schema.name:
                value[1][2] = float("inf")
        elif t == "float" and a.name in _FLOAT_ARGS:
            value = _FLOAT_ARGS[a.name]
        elif t == "bool" and a.name in _BOOL_ARGS:
            value = _BOOL_ARGS[a.name]
        elif t == "Tensor" and a.name == "lr":
            value = torch.tensor(0.1)
        elif t in ("Tensor", "Optional[Tensor]") and a.name in ("grad_scale", "inv_scale"):
            value = torch.tensor([0.5])
        elif t in ("Tensor", "Optional[Tensor]") and a.name == "found_inf":
            value = torch.zeros(1)
        else:
            return None
        (kwargs.__setitem__(a.name, value) if a.kwarg_only else args.append(value))
    return args, kwargs


def test_fallback_writes_back_every_mutable_list():
    ops = _backend_ops_with_mutable_lists()
    assert ops, "the schema walk found nothing: the walk itself is broken"
    unknown = [str(op) for op in ops if _build(op) is None and str(op) not in CANNOT_EXERCISE]
    assert not unknown, f"new ops with mutable tensor lists need a builder or a CANNOT_EXERCISE entry: {unknown}"
    for op in ops:
        built = _build(op)
        if built is None:
            continue
        args, kwargs = built
        dev_args, dev_kwargs = to_tpu(args), to_tpu(kwargs)
        op(*args, **kwargs)  # CPU, in place
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dispatch.TPUFallbackWarning)
            fallback.fallback(op, *dev_args, **dev_kwargs)  # forced through the fallback, lowered or not
        for i, a in enumerate(op._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                expected = kwargs[a.name] if a.kwarg_only else args[i]
                actual = dev_kwargs[a.name] if a.kwarg_only else dev_args[i]
                assert_same(actual, expected, rtol=1e-5, atol=1e-6), (str(op), a.name)


# ============================================================ fused optimizers
OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=0.1, weight_decay=0.1)),
    "adam-amsgrad-maximize": (torch.optim.Adam, dict(lr=0.05, amsgrad=True, maximize=True)),
    "adam-tensor-lr": (torch.optim.Adam, dict(lr=torch.tensor(0.02), betas=(0.8, 0.9))),
    "adamw": (torch.optim.AdamW, dict(lr=0.1)),
    "adamw-amsgrad": (torch.optim.AdamW, dict(lr=0.1, amsgrad=True, weight_decay=0.3)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum-nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd-dampening-maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.8, dampening=0.3, maximize=True)),
    "sgd-tensor-lr": (torch.optim.SGD, dict(lr=torch.tensor(0.05), momentum=0.5)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    "adagrad-maximize": (torch.optim.Adagrad, dict(lr=0.1, maximize=True, initial_accumulator_value=0.5)),
}


def _run_optimizer(cls, kwargs, device, steps=3, dtypes=(torch.float32,), **flags):
    params = [nn.Parameter(rand(4, 3, seed=1, dtype=dt).to(device)) for dt in dtypes]
    params.append(nn.Parameter(rand(5, seed=2).to(device)))
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    opt = cls(params, **kwargs, **flags)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = rand(*p.shape, seed=10 * step + i, dtype=p.dtype).to(device)
        opt.step()
    return params, opt


def _assert_optimizers_equal(dev, ref, rtol=1e-5, atol=1e-6):
    """Parameters and every state tensor of two optimizer runs agree (either may be on tpu)."""
    (p_dev, o_dev), (p_ref, o_ref) = dev, ref
    for a, b in zip(p_dev, p_ref):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol)
        for key, value in o_ref.state[b].items():
            torch.testing.assert_close(torch.as_tensor(o_dev.state[a][key]).cpu(), torch.as_tensor(value).cpu(),
                                       rtol=rtol, atol=atol)


def test_reproducer_adamw_fused():
    p = nn.Parameter(torch.ones(3, device="tpu"))
    p.grad = torch.ones(3, device="tpu")
    torch.optim.AdamW([p], lr=0.1, fused=True).step()
    q = nn.Parameter(torch.ones(3))
    q.grad = torch.ones(3)
    torch.optim.AdamW([q], lr=0.1, fused=True).step()
    assert_same(p.detach(), q.detach())
    assert abs(q[0].item() - 0.899) < 1e-3


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_step_matches_cpu_fused_and_foreach(name, no_fallback):
    cls, kwargs = OPTIMIZERS[name]
    before = tt.stats()["op_counts"].copy()
    fused_dev = _run_optimizer(cls, kwargs, TPU, fused=True)
    counts = {k: v - before.get(k, 0) for k, v in tt.stats()["op_counts"].items() if "_fused_" in k and v - before.get(k, 0)}
    assert list(counts.values()) == [3], f"one fused update per step expected, got {counts}"
    _assert_optimizers_equal(fused_dev, _run_optimizer(cls, kwargs, "cpu", fused=True))
    # the foreach path with a tensor lr needs capturable (torch refuses it otherwise)
    capturable = {"capturable": True} if isinstance(kwargs.get("lr"), torch.Tensor) and cls is not torch.optim.SGD else {}
    _assert_optimizers_equal(fused_dev, _run_optimizer(cls, kwargs, TPU, foreach=True, **capturable))


def test_fused_step_mixed_dtypes_grouped_like_cpu(no_fallback):
    cls, kwargs = OPTIMIZERS["adamw-amsgrad"]
    dtypes = (torch.float32, torch.float64, torch.bfloat16)
    dev = _run_optimizer(cls, kwargs, TPU, dtypes=dtypes, fused=True)
    cpu = _run_optimizer(cls, kwargs, "cpu", dtypes=dtypes, fused=True)
    _assert_optimizers_equal(dev, cpu, rtol=1e-2, atol=1e-2)  # bf16 parameters round differently per op


def _adam_lists(device, dtype=torch.float32):
    return ([rand(3, seed=1).to(device)], [rand(3, seed=2).to(device, dtype)], [torch.zeros(3, device=device)],
            [torch.zeros(3, device=device)], [], [torch.ones((), device=device)])


_ADAM_KW = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)


@pytest.mark.parametrize("case", ["mixed-dtype", "mixed-device", "integer", "length"])
def test_fused_misuse_raises_and_changes_nothing(case):
    if case == "mixed-dtype":
        lists, error = _adam_lists(TPU, torch.float64), "params, grads, exp_avgs, and exp_avg_sqs must have same dtype, device, and layout"
    elif case == "mixed-device":
        lists = _adam_lists(TPU)
        lists[1][0] = lists[1][0].cpu()
        error = "params, grads, exp_avgs, and exp_avg_sqs must have same dtype, device, and layout"
    elif case == "integer":
        lists = tuple([t.long() for t in group] for group in _adam_lists(TPU)[:5]) + (_adam_lists(TPU)[5],)
        error = "\"fused_adam_kernel\" not implemented for 'Long'"
    else:
        lists = _adam_lists(TPU)
        lists[1].append(rand(3).to(TPU))
        error = "Tensor lists must have the same number of tensors, got 1 and 2"
    before = [[t.cpu().clone() for t in group] for group in lists]
    kind = NotImplementedError if case == "integer" else RuntimeError
    with pytest.raises(kind, match=re.escape(error)):
        torch._fused_adam_(*lists, **_ADAM_KW)
    for group, saved in zip(lists, before):
        for t, s in zip(group, saved):
            torch.testing.assert_close(t.cpu(), s)


def test_fused_skips_step_on_found_inf_like_cpu():
    results = []
    for device in ("cpu", TPU):
        lists = _adam_lists(device)
        torch._fused_adam_(*lists, **_ADAM_KW, grad_scale=torch.tensor(4.0, device=device),
                           found_inf=torch.ones((), device=device))
        results.append(lists)
    for dev_group, cpu_group in zip(results[1], results[0]):
        assert_same(dev_group, cpu_group)


# ============================================================ GradScaler
def _scaler_run(device, fused, steps=6):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=fused)
    scaler = torch.amp.GradScaler(device.type if isinstance(device, torch.device) else device,
                                  init_scale=2.0 ** 10, growth_interval=2)
    scales = []
    for step in range(steps):
        x = rand(5, 4, seed=step)
        if step in (2, 4):
            x[0, 0] = float("inf") if step == 2 else float("nan")  # skipped steps, scale backs off
        opt.zero_grad()
        scaler.scale(model(x.to(device)).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


@pytest.mark.parametrize("fused", [pytest.param(False, marks=pytest.mark.slow), True])
def test_grad_scaler_matches_cpu(fused, no_fallback):
    dev, dev_scales = _scaler_run(TPU, fused)
    cpu, cpu_scales = _scaler_run("cpu", fused)
    assert dev_scales == cpu_scales and len(set(cpu_scales)) > 2, cpu_scales  # growth and backoff happened
    for a, b in zip(dev.parameters(), cpu.parameters()):
        assert_same(a.detach(), b.detach(), 1e-5, 1e-6)


def test_amp_kernels_match_cpu():
    for found in (0.0, 1.0):
        for tracker in (0, 1):
            out = []
            for device in ("cpu", TPU):
                scale, trk = torch.full((1,), 8.0, device=device), torch.full((1,), tracker, dtype=torch.int32, device=device)
                torch._amp_update_scale_(scale, trk, torch.full((1,), found, device=device), 2.0, 0.5, 2)
                out.append((scale, trk))
            assert_same(out[1], out[0])
    values = [rand(3, 4, seed=3), rand(5, seed=4, dtype=torch.bfloat16)]
    for bad in (None, float("nan")):
        got = []
        for device in ("cpu", TPU):
            ts = [v.clone().to(device) for v in values]
            if bad is not None:
                ts[1][0] = bad
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(ts, found, torch.full((1,), 0.25, device=device))
            got.append((ts, found))
        assert_same(got[1], got[0])


# ============================================================ autocast
def _header_lists() -> dict[str, list[str]]:
    """CUDA's policy lists, read from the ATen header shipped with this torch."""
    path = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    text = open(path).read()
    lists = {}
    for macro in ("AT_FORALL_LOWER_PRECISION_FP", "AT_FORALL_FP32", "AT_FORALL_FP32_SET_OPT_DTYPE", "AT_FORALL_PROMOTE"):
        body = re.search(rf"#define {macro}\(_\)(.*?)\n\n", text, re.S).group(1)
        lists[macro] = [".".join(p.strip() for p in m.split(",")) for m in re.findall(r"_\(([^()]*)\)", body)]
    body = re.search(r"#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE\(_\)(.*?)\n\n", text, re.S).group(1)
    lists["APPEND"] = re.findall(r'"(norm\.[A-Za-z_]+)"', body)
    return lists


# autocast_mode.cpp registers, for CUDA, the header's lists plus these
_CUDA_EXTRA_LOWER = ["cudnn_convolution", "cudnn_convolution_transpose"]


def _expected_policy() -> dict[str, str]:
    h = _header_lists()
    expected = {n: "lower" for n in h["AT_FORALL_LOWER_PRECISION_FP"] + _CUDA_EXTRA_LOWER}
    expected.update({n: "fp32" for n in h["AT_FORALL_FP32"]})
    expected.update({n: "set_opt" for n in h["AT_FORALL_FP32_SET_OPT_DTYPE"]})
    expected.update({n: "append" for n in h["APPEND"]})
    expected.update({n: "promote" for n in h["AT_FORALL_PROMOTE"]})
    expected["binary_cross_entropy"] = "banned"
    return expected


def test_policy_table_is_cudas():
    ours = {n: "lower" for n in autocast_policy.LOWER_PRECISION_FP}
    ours.update({n: "fp32" for n in autocast_policy.FP32})
    ours.update({n: "set_opt" for n in autocast_policy.FP32_SET_OPT_DTYPE})
    ours.update({n: "append" for n in autocast_policy.FP32_APPEND_DTYPE})
    ours.update({n: "promote" for n in autocast_policy.PROMOTE})
    ours.update({n: "banned" for n in autocast_policy.BANNED})
    assert ours == _expected_policy()
    assert set(SAMPLES) == set(ours)


def _resolve(name):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _case(name, rule, low):
    """(autocast inputs, CPU reference op, CPU reference inputs, expected floating input dtype)."""
    f = lambda *shape: rand(*shape, seed=len(shape)).sigmoid() * 0.8 + 0.1  # noqa: E731
    args = SAMPLES[name](f)
    op = _resolve(name)
    if rule == "lower":
        return _cast(args, torch.float32), op, _cast(args, low), low
    if rule == "promote":  # one float32 input among autocast-dtype ones: everything runs in float32
        inputs = list(_cast(args, low))
        first = next(i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.is_floating_point())
        inputs[first] = inputs[first].float()
        return tuple(inputs), op, _cast(inputs, torch.float32), torch.float32
    inputs = _cast(args, low)
    if rule == "append":
        target = {"norm.Scalar": torch.ops.aten.norm.ScalarOpt_dtype,
                  "norm.ScalarOpt_dim": torch.ops.aten.norm.ScalarOpt_dim_dtype}[name]
        return inputs, lambda *a: target(*a, dtype=torch.float32), inputs, None
    if rule == "set_opt":
        return inputs, lambda *a: op(*a, dtype=torch.float32), inputs, None
    return inputs, op, _cast(inputs, torch.float32), torch.float32


class _Stopped(Exception):
    pass


class _StopAtBackend(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the floating input dtypes of the first op (after autocast's casts) that reaches the
    backend, below the autocast key, then stops: the cast is checked without a kernel to run."""

    seen = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = floats((args, kwargs or {}))
        if inputs and func is not torch.ops.aten._to_copy.default:  # _to_copy: autocast's own casts
            self.seen = {t.dtype for t in inputs}
            raise _Stopped
        return func(*args, **(kwargs or {}))


# float16 runs for the lower-precision list (the other rules do not depend on the autocast dtype)
# (the float16 twins are slow-marked: same casts, other dtype)
_AUTOCAST_CASES = [pytest.param(name, torch.bfloat16, id=f"{name}-bfloat16") for name in sorted(_expected_policy())] + [
    pytest.param(name, torch.float16, id=f"{name}-float16", marks=pytest.mark.slow)
    for name, rule in sorted(_expected_policy().items()) if rule == "lower"]


@pytest.mark.parametrize("name,low", _AUTOCAST_CASES)
def test_autocast_op_dtype_and_values(name, low):
    rule = _expected_policy()[name]
    if rule == "banned":
        args = to_tpu(SAMPLES[name](lambda *s: rand(*s).sigmoid()))
        with torch.autocast("tpu"), pytest.raises(RuntimeError, match="unsafe to autocast"):
            _resolve(name)(*args)
        return
    inputs, ref_op, ref_inputs, input_dtype = _case(name, rule, low)
    if name in CAST_ONLY:
        mode, dev_inputs = _StopAtBackend(), to_tpu(inputs)
        with torch.autocast("tpu", dtype=low), mode, pytest.raises(_Stopped):
            _resolve(name)(*dev_inputs)
        assert mode.seen == {input_dtype}, CAST_ONLY[name]
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dispatch.TPUFallbackWarning)
        with torch.autocast("tpu", dtype=low):
            actual = _resolve(name)(*to_tpu(inputs))
    expected = ref_op(*ref_inputs)
    for a, e in zip(floats(actual), floats(expected)):
        assert a.dtype == e.dtype, (name, a.dtype, e.dtype)
    tol = 3e-2 if low in {t.dtype for t in floats(expected)} else 1e-4
    assert_same(floats(actual), floats(expected), rtol=tol, atol=tol)


def test_autocast_defaults_nesting_and_disabled():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    x, w = to_tpu(rand(2, 3)), to_tpu(rand(4, 3))
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu") and F.linear(x, w).dtype == torch.bfloat16
        assert (x + 1).dtype == torch.float32  # not in any list: unchanged
        with torch.autocast("tpu", enabled=False):
            assert F.linear(x, w).dtype == torch.float32
        with torch.autocast("tpu", dtype=torch.float16):
            assert F.linear(x, w).dtype == torch.float16
        assert F.linear(x, w).dtype == torch.bfloat16
    assert F.linear(x, w).dtype == torch.float32


def test_autocast_unsupported_dtype_warns_like_torch():
    match = "In tpu autocast, but the target dtype is not supported. Disabling autocast"
    with pytest.warns(UserWarning, match=match), torch.autocast("tpu", dtype=torch.float64):
        assert F.linear(to_tpu(rand(2, 3)), to_tpu(rand(4, 3))).dtype == torch.float32


def test_autocast_training_matches_cpu_bf16():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    dev = copy.deepcopy(cpu).to(TPU)
    x, target = rand(6, 8), rand(6, 4, seed=1)
    results = []
    for model, device in ((cpu, "cpu"), (dev, "tpu")):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(x.to(device))
            loss = F.mse_loss(out, target.to(device))
        loss.backward()
        results.append((out, loss, [p.grad for p in model.parameters()]))
    (out_c, loss_c, grads_c), (out_d, loss_d, grads_d) = results
    assert out_d.dtype == out_c.dtype == torch.bfloat16 and loss_d.dtype == torch.float32
    assert_same(out_d, out_c.detach(), 2e-2, 2e-2)
    assert_same(loss_d.detach(), loss_c.detach(), 2e-2, 2e-2)
    for a, b in zip(grads_d, grads_c):
        assert_same(a, b, 5e-2, 5e-2)


class _ScaledMM(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="tpu", cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.inside = torch.is_autocast_enabled("tpu")
        return a.mm(b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="tpu")
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ctx.grad_dtype = grad.dtype
        return grad.mm(b.t()), a.t().mm(grad)


def test_custom_fwd_bwd():
    a = to_tpu(rand(3, 3)).requires_grad_()
    with torch.autocast("tpu"):
        out = _ScaledMM.apply(a.bfloat16(), a)
        assert out.dtype == torch.float32  # cast_inputs=float32 and autocast off inside forward
        assert a.mm(a).dtype == torch.bfloat16
    out.sum().backward()
    ones, a_low = torch.ones(3, 3), rand(3, 3).bfloat16().float()  # the first operand went through bf16
    expected = (ones @ rand(3, 3).t()).bfloat16().float() + a_low.t() @ ones
    assert_same(a.grad, expected, tol="ulps")


def _mlp_loss(model, x, t):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return F.mse_loss(model(x), t)


def test_autocast_inside_torch_compile():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    dev = copy.deepcopy(model).to(TPU)
    x, t = rand(4, 8), rand(4, 4, seed=1)

    def fn(m, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return m(x)

    out = torch.compile(fn, backend="tpu")(dev, x.to(TPU))
    assert out.dtype == torch.bfloat16
    assert_same(out, fn(model, x).detach(), 2e-2, 2e-2)
    loss = torch.compile(_mlp_loss, backend="tpu")(dev, x.to(TPU), t.to(TPU))
    assert_same(loss.detach(), _mlp_loss(model, x, t).detach(), 2e-2, 2e-2)


@pytest.mark.parametrize("fused", [pytest.param(False, marks=pytest.mark.slow), True])
def test_autocast_and_fused_inside_compile_train_step(fused, no_fallback):
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    dev = copy.deepcopy(cpu).to(TPU)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, fused=fused)
    step = tt.compile_train_step(dev, _mlp_loss, torch.optim.AdamW(dev.parameters(), lr=1e-2, fused=fused))
    for i in range(3):
        x, t = rand(4, 8, seed=i), rand(4, 3, seed=10 + i)
        opt_cpu.zero_grad()
        loss_cpu = _mlp_loss(cpu, x, t)
        loss_cpu.backward()
        opt_cpu.step()
        assert_same(step(x.to(TPU), t.to(TPU)), loss_cpu.detach(), 2e-2, 2e-2)
    for a, b in zip(dev.parameters(), cpu.parameters()):
        assert_same(a.detach(), b.detach(), 2e-2, 5e-3)


def test_fused_optimizer_steps_and_grad_scaler_run_no_eager_jax_op(monkeypatch, no_fallback):
    """A warm fused step (Adam/AdamW/SGD/Adagrad, with GradScaler's unscale and update) is its
    programs only: hyper-parameters, step counts and scales are read inside them. Each of them made
    eagerly was a jax dispatch and a host-to-device transfer of its own (~0.1 ms apiece on a TPU
    host, where fused=True AdamW took 4.9 ms against foreach's 3.1 ms)."""
    from jax._src import core as jax_core

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model = copy.deepcopy(cpu_model).to(TPU)
    cpu_x, cpu_t = torch.randn(4, 8), torch.randn(4, 3)
    x, t = cpu_x.to(TPU), cpu_t.to(TPU)

    def optimizers(params, device):
        params = list(params)
        return [torch.optim.AdamW(params, lr=1e-3, fused=True),
                torch.optim.Adam(params, lr=torch.tensor(1e-3).to(device), fused=True),
                torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True),
                torch.optim.Adagrad(params, lr=1e-2, fused=True)]

    def train(model, x, t, opts, scaler, steps):
        for _ in range(steps):
            for opt in opts:
                opt.zero_grad()
                scaler.scale(F.mse_loss(model(x), t)).backward()
                scaler.step(opt)
                scaler.update()

    eager_ops = []
    original = jax_core.EvalTrace.process_primitive

    def counted(trace, primitive, tracers, params):  # a primitive run outside any jit: an eager jax op
        eager_ops.append(primitive.name)
        return original(trace, primitive, tracers, params)

    opts, scaler = optimizers(model.parameters(), TPU), torch.amp.GradScaler("tpu")
    train(model, x, t, opts, scaler, 2)
    monkeypatch.setattr(jax_core.EvalTrace, "process_primitive", counted)  # warm from here on
    train(model, x, t, opts, scaler, 2)
    monkeypatch.undo()
    assert eager_ops == []
    train(cpu_model, cpu_x, cpu_t, optimizers(cpu_model.parameters(), "cpu"), torch.amp.GradScaler("cpu"), 4)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        assert_same(p.detach(), q.detach(), 1e-4, 1e-5)


@pytest.mark.eager_only  # fused mode records the step into its segment's program instead
@pytest.mark.parametrize("name", ["adamw", "adam-amsgrad-maximize", "sgd-momentum-nesterov", "adagrad"])
@pytest.mark.parametrize("scaled", [False, True])
def test_fused_step_updates_parameters_and_state_in_place(name, scaled, no_fallback):
    """As CUDA's fused kernels do, a warm fused step rewrites each parameter, moment (and, with a
    GradScaler, unscaled grad) in its own device memory: the update donates them, so no second copy of
    the model and its optimizer state exists at the step's peak. A tensor sharing a parameter's array
    keeps the old values (that one parameter is updated from a copy). Values equal CPU's fused step."""
    cls, kwargs = OPTIMIZERS[name]

    def run(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).to(device)
        opt = cls(model.parameters(), **kwargs, fused=True)
        scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=256.0, enabled=scaled)
        x = rand(5, 6, seed=3).to(device)

        def backward():
            opt.zero_grad()
            scaler.scale(model(x).square().mean()).backward()

        def update():
            scaler.step(opt)
            scaler.update()

        return model, opt, backward, update

    model, opt, backward, update = run(TPU)
    for _ in range(2):
        backward(), update()
    backward()
    def rewritten() -> list[torch.Tensor]:
        state = [v for s in opt.state.values() for v in s.values() if v.dim() > 0]
        return list(model.parameters()) + state + ([p.grad for p in model.parameters()] if scaled else [])

    def memory() -> list[int]:
        torch.tpu.synchronize()  # nothing queued (compile ahead) still holds an array
        return [storage.buffer_of(t).array.unsafe_buffer_pointer() for t in rewritten()]

    before, old = memory(), model[0].weight.detach().cpu()
    kept = torch.empty_like(model[0].weight)
    kept.copy_(model[0].weight)  # a whole-tensor copy_ shares the weight's array
    assert storage.buffer_of(kept).array is storage.buffer_of(model[0].weight).array
    update()
    assert [b == a for b, a in zip(before, memory())] == [t is not model[0].weight for t in rewritten()]
    assert torch.equal(kept.cpu(), old) and not torch.equal(model[0].weight.detach().cpu(), old)
    backward()
    before = memory()
    update()
    assert memory() == before  # every one in place now
    cpu_model, cpu_opt, cpu_backward, cpu_update = run("cpu")
    for _ in range(4):
        cpu_backward(), cpu_update()
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        assert_same(p.detach(), q.detach(), 1e-5, 1e-6)
