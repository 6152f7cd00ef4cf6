"""Reductions, scans, sorting and selection (sum/mean/max/var/norm/cumsum/sort/topk/median/...).

Conventions: output shapes/dtypes come from torch's meta kernels; ``promote=Promote.RESULT`` casts the
input to torch's result dtype (so integer sums accumulate in int64, ``dtype=`` is honoured);
float16/bfloat16 accumulate in float32 like torch's CPU kernels. Index outputs are int64 and
follow torch's tie rules: first occurrence for argmax/max.dim, stable order for sort.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import dtypes, storage
from ..registry import Promote, lower
from ._common import norm_dim as wrap_dim  # this module's norm_dim is aten::norm's lowering
from ._common import opmath, p_norm



# ---------------------------------------------------------------- helpers
def _axes(x, dim):
    """Torch reduction dims -> jnp axes; None or [] means every dim; 0-dim tensors accept 0/-1."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    axes = {wrap_dim(d, x.ndim) for d in dims}
    if not dims or x.ndim == 0:
        return None
    return tuple(sorted(axes))


def _scan_axis(fn, x, dim):
    """Apply a scan along ``dim``, treating a 0-dim tensor as a length-1 vector."""
    axis = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, axis)


def _moved(x, dim):
    """(x with ``dim`` moved last, axis); 0-dim tensors become length-1 vectors."""
    axis = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x.reshape(1), None
    return jnp.moveaxis(x, axis, -1), axis


def _restore(y, axis, keepdim):
    """Undo _moved for a result whose last axis was reduced away (keepdim puts it back)."""
    if axis is None:
        return y.reshape(())
    return jnp.expand_dims(y, axis) if keepdim else y


def _restore_full(y, axis):
    """Undo _moved for a result that kept the last axis."""
    if axis is None:
        return y.reshape(())
    return jnp.moveaxis(y, -1, axis)


# ---------------------------------------------------------------- sums, means, products
def _reduction(name: str, reduce, prepare, dim_overloads: list[str], promote: Promote | None = None) -> None:
    """Register ``name`` (over every dim) and its ``dim_overloads`` (over one dim or a list of dims:
    ``_axes`` takes either) as ``reduce`` of ``prepare(x)``; ``dtype`` is applied by dispatch."""
    def whole(x, dtype=None):
        return reduce(prepare(x))

    def along(x, dim=None, keepdim=False, dtype=None):
        return reduce(prepare(x), axis=_axes(x, dim), keepdims=keepdim)

    whole.__name__, along.__name__ = name, f"{name}_dim"
    lower(name, promote=promote)(whole)
    lower(*(f"{name}.{overload}" for overload in dim_overloads), promote=promote)(along)


_reduction("sum", jnp.sum, opmath, ["dim_IntList"], Promote.RESULT)
_reduction("mean", jnp.mean, opmath, ["dim"], Promote.RESULT)
_reduction("prod", jnp.prod, opmath, ["dim_int"], Promote.RESULT)


@lower("nansum", promote=Promote.RESULT)
def nansum(x, dim=None, keepdim=False, dtype=None):
    x = opmath(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim)


@lower("logsumexp", promote=Promote.RESULT)
def logsumexp(x, dim, keepdim=False):
    # jax's logsumexp keeps +-inf rows exact (max-shift with inf guarded), as torch does
    return jax.nn.logsumexp(opmath(x), axis=_axes(x, dim), keepdims=keepdim)


# ---------------------------------------------------------------- max / min
@lower("amax")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)  # NaN propagates, like torch


@lower("amin")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower("max")
def max_(x):
    return jnp.max(x)


@lower("min")
def min_(x):
    return jnp.min(x)


def _arg_reduce(pick, x, dim, keepdim):
    """argmax/argmin: first occurrence; NaN counts as the extreme (jnp and torch agree)."""
    if dim is None:
        index = pick(x.reshape(-1))
        return index.reshape((1,) * x.ndim) if keepdim else index
    axis = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return pick(x, axis=axis, keepdims=keepdim)


@lower("argmax")
def argmax(x, dim=None, keepdim=False):
    return _arg_reduce(jnp.argmax, x, dim, keepdim)


@lower("argmin")
def argmin(x, dim=None, keepdim=False):
    return _arg_reduce(jnp.argmin, x, dim, keepdim)


@lower("max.dim")
def max_dim(x, dim, keepdim=False):
    return amax(x, [dim], keepdim), argmax(x, dim, keepdim)


@lower("min.dim")
def min_dim(x, dim, keepdim=False):
    return amin(x, [dim], keepdim), argmin(x, dim, keepdim)


@lower("aminmax")
def aminmax(x, dim=None, keepdim=False):
    axes = None if dim is None else _axes(x, [dim])
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


# ---------------------------------------------------------------- variance, norms
def _var(x, dim, correction, keepdim):
    x = opmath(x)
    axes = _axes(x, dim)
    n = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    mu = jnp.mean(x, axis=axes, keepdims=True)
    squares = jnp.sum(jnp.abs(x - mu) ** 2, axis=axes, keepdims=keepdim)
    correction = 1 if correction is None else correction
    var = squares / max(n - correction, 0)  # torch: N <= correction gives inf/nan, never negative
    return var, mu if keepdim else jnp.squeeze(mu, axes)


@lower("var.correction")
def var(x, dim=None, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)[0]


@lower("std.correction")
def std(x, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim)[0])


@lower("var_mean.correction")
def var_mean(x, dim=None, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@lower("std_mean.correction")
def std_mean(x, dim=None, correction=None, keepdim=False):
    v, mu = _var(x, dim, correction, keepdim)
    return jnp.sqrt(v), mu


def _vector_norm(x, ord, dim, keepdim, dtype=None):
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    return p_norm(opmath(x), 2.0 if ord is None else float(ord), _axes(x, dim), keepdim)


@lower("linalg_vector_norm")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    return _vector_norm(x, ord, dim, keepdim, dtype)


@lower("norm.Scalar")
def norm_scalar(x, p=2):
    return _vector_norm(x, p, None, False)


@lower("norm.ScalarOpt_dtype")
def norm_dtype(x, p, dtype):
    return _vector_norm(x, p, None, False, dtype)


@lower("norm.ScalarOpt_dim")
def norm_dim(x, p, dim, keepdim=False):
    return _vector_norm(x, p, dim, keepdim)


@lower("norm.ScalarOpt_dim_dtype")
def norm_dim_dtype(x, p, dim, keepdim, dtype):
    return _vector_norm(x, p, dim, keepdim, dtype)


# ---------------------------------------------------------------- logical reductions, counting
def _nonzero(x):
    return x != 0


_reduction("all", jnp.all, _nonzero, ["dim", "dims"])
_reduction("any", jnp.any, _nonzero, ["dim", "dims"])


@lower("count_nonzero.dim_IntList")
def count_nonzero_dims(x, dim):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=jnp.int64)


@lower("count_nonzero")
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=None if dim is None else _axes(x, [dim]), dtype=jnp.int64)


# ---------------------------------------------------------------- scans
@lower("cumsum", promote=Promote.RESULT)
def cumsum(x, dim, dtype=None):
    out = x.dtype
    return _scan_axis(lambda v, a: jnp.cumsum(opmath(v), axis=a), x, dim).astype(out)


@lower("cumprod", promote=Promote.RESULT)
def cumprod(x, dim, dtype=None):
    out = x.dtype
    return _scan_axis(lambda v, a: jnp.cumprod(opmath(v), axis=a), x, dim).astype(out)


@lower("logcumsumexp", "_logcumsumexp", promote=Promote.RESULT)
def logcumsumexp(x, dim):
    # CPU accumulates in acc_type (float64 for float32); its backward cancels `result - self`
    # terms, so a float32 scan's few-ulp rounding at |x| ~ 1e4 became 1e-3 gradient errors
    out = x.dtype
    acc = jnp.float64 if out == jnp.float32 else None
    return _scan_axis(lambda v, a: jax.lax.cumlogsumexp(opmath(v).astype(acc), axis=a), x, dim).astype(out)


def _cum_extreme(x, dim, better):
    """(values, indices) of a running max/min. Torch's CPU rule: a later element replaces the
    running one when it is NaN or ``better`` (>= / <=, so ties take the later index); NaN sticks."""
    if x.ndim == 0 and dim not in (0, -1):  # CPU's words for a 0-dim self (torch's meta kernel checks nothing)
        name = "cummax" if better is jnp.greater_equal else "cummin"
        raise IndexError(f"{name}(): Expected reduction dim -1 or 0 for scalar but got {dim}")
    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = better(vb, va)
        if jnp.issubdtype(va.dtype, jnp.inexact):
            take_b = jnp.isnan(vb) | (~jnp.isnan(va) & take_b)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    def scan(v, axis):
        shape = [1] * v.ndim
        shape[axis] = v.shape[axis]
        idx = jnp.broadcast_to(jnp.arange(v.shape[axis], dtype=jnp.int64).reshape(shape), v.shape)
        return jax.lax.associative_scan(combine, (v, idx), axis=axis)

    axis = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    if x.size == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    return scan(x, axis)


@lower("cummax")
def cummax(x, dim):
    return _cum_extreme(x, dim, jnp.greater_equal)


@lower("cummin")
def cummin(x, dim):
    return _cum_extreme(x, dim, jnp.less_equal)


def _cum_helper(better):
    def helper(self, values, indices, dim):
        v, i = _cum_extreme(storage.read(self), dim, better)
        storage.write(values, v)
        storage.write(indices, i)
    return helper


lower("_cummax_helper", raw=True)(_cum_helper(jnp.greater_equal))
lower("_cummin_helper", raw=True)(_cum_helper(jnp.less_equal))


# ---------------------------------------------------------------- sorting and selection
def _sort_last(x, descending=False):
    """Stable sort along the last axis: (values, int64 indices). NaN sorts as the largest value
    (last ascending, first descending), like torch."""
    if x.shape[-1] == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    if x.dtype == jnp.bool_:  # jnp's descending sort of bools is not stable; sort as ints
        v, i = _sort_last(x.astype(jnp.int8), descending)
        return v.astype(jnp.bool_), i
    idx = jnp.argsort(x, axis=-1, stable=True, descending=descending).astype(jnp.int64)
    return jnp.take_along_axis(x, idx, axis=-1), idx


@lower("sort.stable")
def sort_stable(x, stable=None, dim=-1, descending=False):
    y, axis = _moved(x, dim)
    v, i = _sort_last(y, descending)
    return _restore_full(v, axis), _restore_full(i, axis)


@lower("sort")
def sort(x, dim=-1, descending=False):
    return sort_stable(x, True, dim, descending)


@lower("topk")
def topk(x, k, dim=-1, largest=True, sorted=True):
    # sorted=False may return any order in torch; we always return the sorted order
    y, axis = _moved(x, dim)
    v, i = _sort_last(y, descending=largest)
    return _restore_full(v[..., :k], axis), _restore_full(i[..., :k], axis)


@lower("kthvalue")
def kthvalue(x, k, dim=-1, keepdim=False):
    y, axis = _moved(x, dim)
    v, i = _sort_last(y)
    return _restore(v[..., k - 1], axis, keepdim), _restore(i[..., k - 1], axis, keepdim)


def _median_last(y, ignore_nan):
    """Lower median along the last axis. torch.median: any NaN -> NaN (index of the first NaN,
    which a stable sort puts first among the trailing NaNs); nanmedian: median of the non-NaN."""
    n = y.shape[-1]
    v, i = _sort_last(y)
    if jnp.issubdtype(y.dtype, jnp.inexact):
        nans = jnp.sum(jnp.isnan(y), axis=-1, keepdims=True)
        valid = n - nans
        if ignore_nan:
            pos = jnp.maximum((valid - 1) // 2, 0)
        else:
            pos = jnp.where(nans > 0, valid, (n - 1) // 2)
    else:
        pos = jnp.full(y.shape[:-1] + (1,), (n - 1) // 2)
    pos = pos.astype(jnp.int64)
    return jnp.take_along_axis(v, pos, -1)[..., 0], jnp.take_along_axis(i, pos, -1)[..., 0]


def _median_all(x, ignore_nan):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _median_last(x.reshape(-1), ignore_nan)[0]


def _median_dim(x, dim, keepdim, ignore_nan):
    y, axis = _moved(x, dim)
    v, i = _median_last(y, ignore_nan)
    return _restore(v, axis, keepdim), _restore(i, axis, keepdim)


@lower("median")
def median(x):
    return _median_all(x, False)


@lower("nanmedian")
def nanmedian(x):
    return _median_all(x, True)


@lower("median.dim")
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, False)


@lower("nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, True)


@lower("mode")
def mode(x, dim=-1, keepdim=False):
    """Most frequent value; ties -> smallest value; index = its last occurrence (torch's CPU rule)."""
    y, axis = _moved(x, dim)
    v, i = _sort_last(y)
    n = v.shape[-1]
    pos = jnp.arange(n)
    new_run = jnp.concatenate([jnp.ones(v.shape[:-1] + (1,), bool), v[..., 1:] != v[..., :-1]], axis=-1)
    start = jax.lax.cummax(jnp.where(new_run, pos, 0), axis=v.ndim - 1)
    run_end = jnp.concatenate([new_run[..., 1:], jnp.ones(v.shape[:-1] + (1,), bool)], axis=-1)
    length = jnp.where(run_end, pos - start + 1, -1)
    best = jnp.argmax(length, axis=-1, keepdims=True)  # first max = smallest value
    value = jnp.take_along_axis(v, best, -1)[..., 0]
    index = jnp.take_along_axis(i, best, -1)[..., 0]  # stable sort: last in run = last occurrence
    return _restore(value, axis, keepdim), _restore(index, axis, keepdim)
