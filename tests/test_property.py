"""Property-based differential tests (hypothesis): elementwise, reduction and indexing ops on random
shapes (0-sized dims included), broadcasting, non-contiguous views (transposes, strided slices,
expands) and flips, with extreme values (+-inf, nan, -0.0, float32 max, int64 min/max). For every
drawn case tpu returns CPU's result, or raises CPU's exception type.

Subnormal float32 inputs are flushed to zero on tpu (XLA:CPU, like TPU hardware, runs with FTZ/DAZ);
that device property is pinned by test_subnormals_are_flushed_to_zero and kept out of the draws.
The default suite draws a few examples per family (seconds); the ``slow`` twins draw many more.
"""
from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import TPU, assert_same, both

pytestmark = pytest.mark.usefixtures("no_fallback")

_COMMON = dict(deadline=None, database=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = settings(max_examples=8, **_COMMON)
SLOW = settings(max_examples=120, **_COMMON)

I64 = np.iinfo(np.int64)
F32_MAX = float(np.finfo(np.float32).max)
FLOAT_SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, F32_MAX, -F32_MAX]
INT_SPECIALS = [int(I64.min), int(I64.max), 0, -1, 1]


def _elements(dtype: str, moderate: bool = False):
    if dtype == "float32":
        finite = st.floats(-1e3, 1e3, width=32) if moderate else st.floats(width=32, allow_subnormal=False)
        specials = [v for v in FLOAT_SPECIALS if not (moderate and abs(v) == F32_MAX)]
        return st.one_of(finite, st.sampled_from(specials))
    if dtype == "int64":
        return st.one_of(st.integers(-100, 100) if moderate else st.integers(int(I64.min), int(I64.max)),
                         st.sampled_from([0, -1, 1] if moderate else INT_SPECIALS))
    return st.booleans()


def _tensor(draw, dtype: str, shape, moderate: bool = False) -> torch.Tensor:
    array = draw(hnp.arrays(np.dtype(dtype if dtype != "bool" else np.bool_), shape,
                            elements=_elements(dtype, moderate)))
    return torch.from_numpy(np.ascontiguousarray(array))


SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def views(draw, shape):
    """A view to apply to a tensor of ``shape`` on both devices (the tpu side reads through it)."""
    ndim = len(shape)
    kind = draw(st.sampled_from(["same", "flip", "transpose", "stride", "expand"] if ndim else ["same"]))
    if kind == "flip":
        dims = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
        return lambda t: t.flip(dims)
    if kind == "transpose" and ndim >= 2:
        return lambda t: t.transpose(0, ndim - 1)
    if kind == "stride":
        dim = draw(st.integers(0, ndim - 1))
        return lambda t: t[(slice(None),) * dim + (slice(None, None, 2),)]
    if kind == "expand":
        return lambda t: t.unsqueeze(0).expand(2, *t.shape)
    return lambda t: t


@st.composite
def viewed(draw, dtype, moderate=False, shape=None):
    base = _tensor(draw, dtype, draw(SHAPES) if shape is None else shape, moderate)
    return base, draw(views(tuple(base.shape)))


# ---------------------------------------------------------------- elementwise
UNARY = {
    "float32": ["neg", "abs", "exp", "log", "sqrt", "sin", "tanh", "sigmoid", "floor", "ceil", "round",
                "sign", "isnan", "isinf", "reciprocal", "expm1", "log1p", "nan_to_num", "relu", "square"],
    "int64": ["neg", "abs", "sign", "bitwise_not", "square", "relu"],
    "bool": ["logical_not", "bitwise_not", "abs"],
}
BINARY = {
    "float32": ["add", "sub", "mul", "div", "maximum", "minimum", "fmax", "eq", "lt", "ge", "atan2",
                "remainder", "fmod", "copysign", "floor_divide", "pow", "hypot"],
    "int64": ["add", "sub", "mul", "maximum", "eq", "lt", "bitwise_and", "bitwise_xor", "remainder",
              "floor_divide", "bitwise_left_shift"],
    "bool": ["logical_and", "logical_xor", "eq", "bitwise_or", "add", "mul"],
}


@st.composite
def unary_cases(draw):
    dtype = draw(st.sampled_from(sorted(UNARY)))
    return draw(st.sampled_from(UNARY[dtype])), draw(viewed(dtype))


@st.composite
def binary_cases(draw):
    dtype = draw(st.sampled_from(sorted(BINARY)))
    name = draw(st.sampled_from(BINARY[dtype]))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3))
    a, b = (_tensor(draw, dtype, s, moderate=name == "bitwise_left_shift") for s in shapes.input_shapes)
    return name, a, b, draw(views(tuple(a.shape)))


def _check_unary(case):
    name, (base, view) = case
    op = getattr(torch, name)
    both(lambda t: op(view(t)), base, tol="accumulated")


def _check_binary(case):
    name, a, b, view = case
    op = getattr(torch, name)
    both(lambda x, y: op(view(x), y), a, b, tol="accumulated")


@FAST
@given(unary_cases())
def test_elementwise_unary(case):
    _check_unary(case)


@FAST
@given(binary_cases())
def test_elementwise_binary_broadcast(case):
    _check_binary(case)


@pytest.mark.slow
@SLOW
@given(unary_cases())
def test_elementwise_unary_slow(case):
    _check_unary(case)


@pytest.mark.slow
@SLOW
@given(binary_cases())
def test_elementwise_binary_broadcast_slow(case):
    _check_binary(case)


# ---------------------------------------------------------------- reductions
REDUCTIONS = {
    "float32": ["sum", "mean", "amax", "amin", "prod", "argmax", "argmin", "logsumexp", "nansum", "std",
                "cumsum", "all", "any"],
    "int64": ["sum", "amax", "amin", "prod", "argmax", "cumsum", "all", "any"],
    "bool": ["sum", "all", "any", "amax"],
}
_NEEDS_DIM = {"logsumexp", "cumsum"}


@st.composite
def reduction_cases(draw):
    dtype = draw(st.sampled_from(sorted(REDUCTIONS)))
    name = draw(st.sampled_from(REDUCTIONS[dtype]))
    base, view = draw(viewed(dtype, moderate=True))
    ndim = view(base).dim()
    dim = draw(st.one_of(st.none(), st.integers(-max(ndim, 1), max(ndim, 1) - 1)))
    if dim is None and name in _NEEDS_DIM:
        dim = 0
    keepdim = draw(st.booleans())
    return name, base, view, dim, keepdim


def _check_reduction(case):
    name, base, view, dim, keepdim = case
    op = getattr(torch, name)
    if name == "cumsum":
        fn = lambda t: op(view(t), dim)  # noqa: E731
    elif dim is None:
        fn = lambda t: op(view(t))  # noqa: E731
    else:
        fn = lambda t: op(view(t), dim, keepdim=keepdim)  # noqa: E731
    both(fn, base, tol="loose")


@FAST
@given(reduction_cases())
def test_reductions(case):
    _check_reduction(case)


@pytest.mark.slow
@SLOW
@given(reduction_cases())
def test_reductions_slow(case):
    _check_reduction(case)


# ---------------------------------------------------------------- indexing
@st.composite
def indexing_cases(draw):
    dtype = draw(st.sampled_from(["float32", "int64", "bool"]))
    base, view = draw(viewed(dtype, moderate=True, shape=draw(hnp.array_shapes(min_dims=1, max_dims=3,
                                                                                 min_side=0, max_side=4))))
    shape = view(base).shape
    dim = draw(st.integers(0, len(shape) - 1))
    n = shape[dim]
    # mostly valid indices, sometimes out of range or negative: CPU's IndexError / RuntimeError then
    index = draw(st.lists(st.integers(-n - 1, n) if n else st.integers(-1, 1), min_size=0, max_size=4))
    kind = draw(st.sampled_from(["index_select", "gather", "getitem", "mask", "index_put", "take"]))
    return kind, base, view, dim, torch.tensor(index, dtype=torch.long)


def _check_indexing(case):
    kind, base, view, dim, index = case
    if kind == "index_select":
        both(lambda t, i: torch.index_select(view(t), dim, i), base, index)
    elif kind == "gather":
        def gather(t, i):
            v = view(t)
            shape = list(v.shape)
            shape[dim] = i.numel()
            return torch.gather(v, dim, i.reshape([-1 if d == dim else 1 for d in range(v.dim())]).expand(shape))
        both(gather, base, index)
    elif kind == "getitem":
        both(lambda t, i: view(t)[(slice(None),) * dim + (i,)], base, index)
    elif kind == "mask":
        both(lambda t: view(t)[view(t) == view(t).flatten()[:1].reshape(())] if view(t).numel() else view(t)[...],
             base)
    elif kind == "index_put":
        def put(t, i):
            v = view(t).clone()
            v[(slice(None),) * dim + (i,)] = torch.ones((), dtype=v.dtype, device=v.device)
            return v
        both(put, base, index)
    else:
        both(lambda t, i: torch.take(view(t), i), base, index)


@FAST
@given(indexing_cases())
def test_indexing(case):
    _check_indexing(case)


@pytest.mark.slow
@SLOW
@given(indexing_cases())
def test_indexing_slow(case):
    _check_indexing(case)


# ---------------------------------------------------------------- a device property
@pytest.mark.eager_only
def test_subnormals_are_flushed_to_zero():
    """tpu (XLA:CPU here, TPU hardware) computes float32 arithmetic with subnormals flushed to zero:
    the result is CPU's on the inputs with subnormals replaced by zero (same sign). (Transcendentals
    of a subnormal, e.g. log, depend on XLA's fused implementation, and abs/neg copy the bits: not pinned.)"""
    x = torch.tensor([1e-45, -1e-40, 1e-38, 3e-39, 1.0, -2.0])
    flushed = torch.where(x.abs() < torch.finfo(torch.float32).tiny, x * 0, x)
    for fn in (torch.sqrt, lambda t: t * 2, lambda t: t + 0, lambda t: t > 0):
        assert_same(fn(x.to(TPU)), fn(flushed), rtol=1e-6, atol=0)
