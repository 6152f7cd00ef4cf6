"""The declarative registry: dtype kinds checked by dispatch, the op's spec passed explicitly to the
lowerings that declare ``needs_spec``, Pallas variants attached by decorator, ``registry.table()``."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import tpu_interactive as tt
from tpu_interactive.backend import dispatch, registry
from tpu_interactive.backend import stats as backend_stats

from helpers import both

LONG, BOOL, HALF, CFLOAT = torch.int64, torch.bool, torch.float16, torch.complex64


def _t(dtype, *shape):
    return (torch.arange(1, 1 + int(torch.tensor(shape or (4,)).prod())) % 3).reshape(shape or (4,)).to(dtype)


# result dtypes outside a lowering's declared kind, as user calls: CPU refuses each with its own words
REFUSED = {
    "gelu_long": (F.gelu, (_t(LONG),)),
    "elu_long": (F.elu, (_t(LONG),)),
    "leaky_relu_bool": (F.leaky_relu, (_t(BOOL),)),
    "softshrink_long": (F.softshrink, (_t(LONG),)),
    "logsigmoid_complex": (F.logsigmoid, (_t(CFLOAT),)),
    "frac_bool": (torch.frac, (_t(BOOL),)),
    "frac_out_bool": (lambda x: torch.frac(x, out=torch.empty_like(x)), (_t(BOOL),)),
    "leaky_relu_inplace_long": (lambda x: F.leaky_relu_(x), (_t(LONG),)),
    "floor_divide_bool": (torch.floor_divide, (_t(BOOL), _t(BOOL))),
    "lshift_float": (lambda x, y: x << y, (_t(torch.float32), _t(torch.float32))),
    "rshift_half": (lambda x, y: x >> y, (_t(HALF), _t(HALF))),
    "logaddexp2_complex": (torch.logaddexp2, (_t(CFLOAT), _t(CFLOAT))),
    "i0e_complex": (torch.special.i0e, (_t(CFLOAT),)),
    "bessel_j0_half": (torch.special.bessel_j0, (_t(HALF),)),
    "chebyshev_t_half": (torch.special.chebyshev_polynomial_t, (_t(HALF), _t(HALF))),
    "igamma_bool": (torch.igamma, (_t(BOOL), _t(BOOL))),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_declared_dtype_kinds_refuse_like_cpu(name):
    fn, args = REFUSED[name]
    with pytest.raises(NotImplementedError):  # the premise: CPU has no kernel for this dtype
        fn(*[a.clone() for a in args])
    both(fn, *[a.clone() for a in args], message=True)


def test_dtype_kind_is_checked_before_the_lowering_runs(monkeypatch):
    low = registry.LOWERINGS["hypot.default"]
    assert low.dtypes is registry.FLOATING
    calls = []
    original = low.fn
    monkeypatch.setattr(low, "fn", lambda *a, **k: calls.append(a) or original(*a, **k))
    x = torch.arange(3).to("tpu")
    with pytest.raises(NotImplementedError, match="\"hypot\" not implemented for 'Long'"):
        torch.hypot(x, x)
    assert calls == []
    both(torch.hypot, torch.rand(3), torch.rand(3))  # an accepted dtype reaches the lowering
    assert len(calls) == 1


def test_dtype_kind_is_checked_in_compiled_graphs():
    def fn(x):
        return torch.frac(x + 1)

    torch._dynamo.reset()
    with pytest.raises(NotImplementedError, match="\"frac\" not implemented for 'Long'"):
        tt.compile(fn)(torch.arange(4).to("tpu"))
    x = torch.rand(4)
    both(lambda a: tt.compile(fn)(a) if a.device.type == "tpu" else fn(a), x)
    torch._dynamo.reset()


def test_needs_spec_is_declared_exactly_by_the_lowerings_that_take_spec():
    for name, low in registry.LOWERINGS.items():
        if low.raw:
            assert not low.needs_spec, name
            continue
        takes_spec = "spec" in inspect.signature(low.fn).parameters
        assert takes_spec == low.needs_spec, name
    assert not hasattr(dispatch, "current_spec") and not hasattr(dispatch, "lowering_spec")


@pytest.mark.parametrize("compiled", [False, True])
def test_spec_reaches_lowerings_eagerly_and_in_graphs(compiled):
    def fn(a, b, i):
        # cat/stack/where read torch's result dtype, index_select/repeat torch's shape, from spec
        joined = torch.cat([a, b.to(torch.int32)]) + torch.stack([a, a]).sum(0)
        picked = torch.index_select(joined.repeat(2, 1), 0, i)
        return torch.where(picked > 0, picked, b.to(torch.float64)[:1]), torch.remainder(b, 3)

    torch._dynamo.reset()
    run = (lambda *xs: tt.compile(fn)(*xs) if xs[0].device.type == "tpu" else fn(*xs)) if compiled else fn
    both(run, torch.randn(2, 3), torch.arange(6).reshape(2, 3), torch.tensor([0, 3, 1]))
    torch._dynamo.reset()


def test_pallas_variant_takes_the_calls_it_covers_counted_per_call(monkeypatch):
    low = registry.LOWERINGS["mm.default"]
    monkeypatch.setattr(low, "pallas_fn", None)
    monkeypatch.setattr(low, "pallas_covers", None)
    traced = []

    def covers(x, y):
        return str(x.dtype) == "float32"

    @registry.pallas_variant("mm", covers=covers)
    def variant(x, y):
        traced.append(str(x.dtype))
        return x @ y * 1.0

    assert low.pallas_fn is variant and low.pallas_covers is covers
    backend_stats.reset()
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with tt.pallas(True):
        for _ in range(2):  # a call run again from memory (or a program loaded from disk) counts the same
            both(torch.mm, a, b)
            both(torch.mm, a.double(), b.double())  # not covered: the XLA lowering runs, counted as 'xla'
    assert set(traced) <= {"float32"}  # the variant never sees what it does not cover
    assert dict(tt.stats()["kernel_paths"]["aten::mm.default"]) == {"pallas": 2, "xla": 2}
    both(torch.mm, a, b)  # switch off: 'xla'
    assert dict(tt.stats()["kernel_paths"]["aten::mm.default"]) == {"pallas": 2, "xla": 3}
    with pytest.raises(ValueError, match="no lowering of aten::no_such_op.default"):
        registry.pallas_variant("no_such_op", covers=covers)(variant)
    with pytest.raises(ValueError, match="raw"):
        registry.pallas_variant("view", covers=covers)(variant)


def test_table_rows_describe_every_lowering():
    rows = registry.table()
    assert [r["op"] for r in rows] == sorted(f"aten::{k}" for k in registry.LOWERINGS)
    by_op = {r["op"]: r for r in rows}
    assert by_op["aten::silu.default"]["dtypes"] == "floating"
    assert by_op["aten::cat.default"]["needs_spec"] and not by_op["aten::silu.default"]["needs_spec"]
    assert by_op["aten::mm.default"]["pallas"] and by_op["aten::view.default"]["raw"]
    assert not by_op["aten::nonzero.default"]["meta"]


def test_cpu_views_are_cpus_kernels_from_cpp_and_alias_like_cpu():
    """``cpu_view`` lowerings are registered from C++ where the extension is built (no Python per
    view); their results alias the same storage with CPU's geometry and CPU's bounds errors."""
    from tpu_interactive.backend import native

    views = sorted(k for k, low in registry.LOWERINGS.items() if low.cpu_view)
    assert {"as_strided.default", "view.default", "unfold.default"} <= set(views)
    assert all(registry.LOWERINGS[k].raw for k in views)
    if native.available():
        dump = torch._C._dispatch_dump("aten::as_strided")
        line = next(x for x in dump.splitlines() if x.startswith("PrivateUse1:"))
        assert "tpu_native.cpp" in line, line
    cpu = torch.arange(12.0)
    t = cpu.to("tpu")
    for make in (lambda x: x.as_strided((3, 2), (4, 1), 1), lambda x: x.view(3, 4).t(), lambda x: x.unfold(0, 4, 3)):
        v, c = make(t), make(cpu)
        assert (v.shape, v.stride(), v.storage_offset()) == (c.shape, c.stride(), c.storage_offset())
        assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        assert torch.equal(v.cpu(), c)
    with pytest.raises(RuntimeError) as expected:
        cpu.as_strided((5, 5), (5, 1))
    with pytest.raises(RuntimeError) as raised:
        t.as_strided((5, 5), (5, 1))
    assert str(raised.value) == str(expected.value)


def test_cpu_view_declares_a_raw_lowering():
    with pytest.raises(ValueError, match="raw"):
        registry.lower("view.default", cpu_view=True)
