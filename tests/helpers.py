"""Differential helpers: run the same function on CPU and on tpu inputs, compare results."""
from __future__ import annotations

import copy

import pytest
import torch

TPU = torch.device("tpu", 0)
TOL = {torch.float64: dict(rtol=1e-7, atol=1e-7), torch.float32: dict(rtol=1e-5, atol=1e-5),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
LOOSE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def slow(*values, id: str | None = None):
    """One parametrization that runs only with ``-m slow``: a heavier twin of a default case (another
    dtype or shape of the same check). The default run is CI's bounded subset."""
    return pytest.param(*values, marks=pytest.mark.slow, id=id)


def to_tpu(value):
    if isinstance(value, torch.Tensor):
        out = value.detach().to(TPU)
        return out.requires_grad_(value.requires_grad) if value.is_leaf else out
    if isinstance(value, (list, tuple)):
        return type(value)(to_tpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_tpu(v) for k, v in value.items()}
    return value


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def assert_same(actual, expected, rtol=1.3e-6, atol=1e-5, check_dtype=True):
    """``actual`` (from tpu) equals ``expected`` (from CPU): values, shapes, dtypes, on tpu."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"result is on {actual.device}, expected tpu"
        torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, check_dtype=check_dtype,
                                   equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol, check_dtype)
    else:
        assert actual == expected or (actual != actual and expected != expected), f"{actual} != {expected}"


def floats(value) -> list:
    """Every floating-point tensor in a (nested) tuple/list result, in order."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in floats(v)]
    return []


def check(fn, *inputs, rtol=1.3e-6, atol=1e-5, **kwargs):
    """Run ``fn`` on CPU inputs and on copies moved to tpu; assert the results agree."""
    expected = fn(*inputs, **kwargs)
    actual = fn(*to_tpu(inputs), **to_tpu(kwargs))
    assert_same(actual, expected, rtol, atol)
    return actual, expected


def rand(*shape, seed=0, dtype=torch.float32):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.to(dtype) if dtype.is_floating_point else (t * 10).to(dtype)


def grad_check(fn, *inputs, rtol=1e-5, atol=1e-5, seed=7):
    """Forward values and the .grad of every floating-point tensor input (one fixed random cotangent)
    agree with CPU autograd; other inputs (integer tensors, Python values) are passed as they are."""
    def leaf(x, device):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(device, copy=True).requires_grad_(x.is_floating_point() or x.is_complex())

    cpu, dev = [leaf(x, "cpu") for x in inputs], [leaf(x, TPU) for x in inputs]
    expected, actual = fn(*cpu), fn(*dev)
    assert_same(actual, expected.detach(), rtol, atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=expected.dtype)
    expected.backward(g)
    actual.backward(g.to(TPU))
    for c, d in zip(cpu, dev):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            assert d.grad is not None, "no gradient reached a tpu input"
            assert_same(d.grad, c.grad, rtol, atol)


def module_grad_check(module, x, rtol=1e-5, atol=1e-5):
    """A module's output, input grad and parameter grads agree between CPU and a tpu copy of it."""
    dev_module = copy.deepcopy(module).to(TPU)
    xc = x.clone().requires_grad_(True)
    xd = x.to(TPU).requires_grad_(True)
    expected, actual = module(xc), dev_module(xd)
    assert_same(actual, expected.detach(), rtol, atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected.backward(g)
    actual.backward(g.to(TPU))
    assert_same(xd.grad, xc.grad, rtol, atol)
    for (name, pc), (_, pd) in zip(module.named_parameters(), dev_module.named_parameters()):
        assert pd.grad is not None, f"no grad for {name}"
        assert_same(pd.grad, pc.grad, rtol, atol)


# An op with only a CPU kernel: the stable example of an op the tpu backend cannot lower
# (any real aten op might gain a lowering later).
_cpu_only_lib = torch.library.Library("tpu_test", "DEF")
_cpu_only_lib.define("cpu_only_scale(Tensor x, float factor) -> Tensor")
_cpu_only_lib.impl("cpu_only_scale", lambda x, factor: x * factor, "CPU")
cpu_only_scale = torch.ops.tpu_test.cpu_only_scale


def move(value):
    """To tpu, except 0-dim cpu tensors marked by wrapping them in a tuple ("keep on cpu")."""
    if isinstance(value, tuple):
        return value[0]
    return to_tpu(value)


def unmark(value):
    return value[0] if isinstance(value, tuple) else value


def _first_dtype(value):
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (list, tuple)) and value:
        return _first_dtype(value[0])
    return None


def tol_for(dtype, loose=False):
    return (LOOSE if loose else TOL).get(dtype, dict(rtol=0, atol=0))


def both(fn, *args, tol=None, loose=False, message=False, **kwargs):
    """Run ``fn`` on CPU and on tpu copies; equal results, or the same exception type (and with
    ``message``, tpu's message contains CPU's first line: PyTorch's own words).

    The tolerance follows the result dtype: exact for integers/bool, looser for bfloat16."""
    cpu_args = [unmark(a) for a in args]
    try:
        expected = fn(*cpu_args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the tpu must fail the same way
        with pytest.raises(type(exc)) as raised:
            fn(*[move(a) for a in args], **kwargs)
        if message:
            first = str(exc).strip().splitlines()[0]
            assert first in str(raised.value), f"CPU: {first!r}\ntpu: {str(raised.value)!r}"
        return None
    actual = fn(*[move(a) for a in args], **kwargs)
    assert_same(actual, expected, **(tol or tol_for(_first_dtype(expected), loose)))
    return actual


def needs_aten(name: str):
    """Skip a test of aten::``name`` only on a torch release that removed the op (torch 2.14 dropped
    aten::cholesky); the reason names the release and the registry's record of the skipped lowering."""
    import pytest

    from tpu_interactive.backend import registry

    packet = name.split(".")[0]
    missing = not hasattr(torch.ops.aten, packet)
    reason = registry.skipped().get(f"aten::{registry.canonical(name)}", "")
    return pytest.mark.skipif(missing, reason=f"torch {torch.__version__} removed aten::{packet} ({reason})")
