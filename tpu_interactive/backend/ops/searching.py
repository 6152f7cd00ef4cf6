"""Unique, counting, searching and histograms: ops whose output shape depends on the data sync once
to learn it, as on CUDA."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from .. import dtypes
from ..registry import lower
from ._common import check_range, jit_static, norm_dim

_aten = torch.ops.aten


# ---------------------------------------------------------------- unique / counting / searching
def _empty_long():
    return jnp.zeros((0,), jnp.int64)


@lower("_unique2", meta=False)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    inverse = inverse.reshape(self.shape).astype(jnp.int64) if return_inverse else _empty_long()
    return values, inverse, counts.astype(jnp.int64) if return_counts else _empty_long()


@lower("_unique", meta=False)
def unique_legacy(self, sorted=True, return_inverse=False):
    values, inverse, _ = unique2(self, sorted, return_inverse, False)
    return values, inverse


@lower("unique_dim", meta=False)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    dim = norm_dim(dim, self.ndim)
    if self.shape[dim] == 0:
        return self, _empty_long(), _empty_long()
    values, inverse, counts = jnp.unique(self, axis=dim, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1).astype(jnp.int64) if return_inverse else _empty_long()
    return values, inverse, counts.astype(jnp.int64) if return_counts else _empty_long()


def _consecutive(self, dim, return_inverse, return_counts):
    """unique_consecutive along ``dim`` (None: flattened)."""
    x = self.reshape(-1) if dim is None else jnp.moveaxis(self, norm_dim(dim, self.ndim), 0)
    n = x.shape[0]
    if n == 0:
        return self.reshape(-1) if dim is None else self, _empty_long(), _empty_long()
    # explicit row size: reshape can't infer -1 for a single element (n - 1 == 0)
    changed = jnp.any((x[1:] != x[:-1]).reshape(n - 1, math.prod(x.shape[1:])), axis=1)
    starts = jnp.concatenate([jnp.ones((1,), bool), changed])
    first = jnp.nonzero(starts)[0]
    values = x[first]
    if dim is not None:
        values = jnp.moveaxis(values, 0, norm_dim(dim, self.ndim))
    inverse = jnp.cumsum(starts.astype(jnp.int64)) - 1
    inverse = (inverse.reshape(self.shape) if dim is None else inverse) if return_inverse else _empty_long()
    counts = jnp.diff(jnp.append(first, n)).astype(jnp.int64) if return_counts else _empty_long()
    return values, inverse, counts


@lower("unique_consecutive", meta=False)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    return _consecutive(self, dim, return_inverse, return_counts)


@lower("unique_dim_consecutive", meta=False)
def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    return _consecutive(self, dim, return_inverse, return_counts)


@lower("bincount", meta=False)
def bincount(self, weights=None, minlength=0):
    if self.ndim != 1 or not jnp.issubdtype(self.dtype, jnp.integer):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = minlength
    if self.size:
        lo, hi = (int(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(minlength, hi + 1)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), dtype).at[self].add(weights.astype(dtype))


@jit_static("side")
def _search(seq, values, side: str):
    if seq.ndim == 1:
        return jnp.searchsorted(seq, values, side=side)
    lead = seq.shape[:-1]
    rows = math.prod(lead)  # explicit sizes: a -1 cannot be inferred next to a 0-sized dim
    seq2 = seq.reshape(rows, seq.shape[-1])
    val2 = values.reshape(rows, math.prod(values.shape[len(lead):]))
    found = jax.vmap(functools.partial(jnp.searchsorted, side=side))(seq2, val2)
    return found.reshape(lead + values.shape[len(lead):])


def _side(right: bool, side: str | None) -> str:
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    return side or ("right" if right else "left")


@lower("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        n = sorted_sequence.shape[-1] if sorted_sequence.ndim else 1
        check_range(sorter, n, lambda _: "torch.searchsorted(): sorter index out of range", negative=False,
                    error=RuntimeError)
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    values = jnp.asarray(self)
    common = jnp.promote_types(sorted_sequence.dtype, values.dtype)
    return _search(sorted_sequence.astype(common), values.astype(common), _side(right, side))


@lower("bucketize.Tensor", "bucketize.Scalar")
def bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    values = jnp.asarray(self)
    common = jnp.promote_types(boundaries.dtype, values.dtype)
    return _search(boundaries.astype(common), values.astype(common), "right" if right else "left")


@lower("histc")
def histc(self, bins=100, min=0, max=0):
    if not jnp.issubdtype(self.dtype, jnp.floating):
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{dtypes.to_torch(self.dtype)}'")
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    lo, hi = float(min), float(max)
    if lo == hi and self.size:
        lo, hi = (float(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # a NaN or inf in the data, or given
        raise RuntimeError(f"torch.histc: range of [{_cpp_double(lo)}, {_cpp_double(hi)}] is not finite")
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    return _histc(self.reshape(-1), lo, hi, bins)


def _cpp_double(value: float) -> str:
    """``value`` as a C++ stream prints a double (torch's messages): 6 significant digits, NaN signed."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{value:g}"


@jit_static("bins")
def _histc(x, lo, hi, bins):
    lo_t, hi_t = jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)
    pos = ((x - lo_t) * bins / (hi_t - lo_t)).astype(jnp.int64)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (x >= lo_t) & (x <= hi_t)
    return jnp.zeros((bins,), x.dtype).at[jnp.where(inside, pos, bins)].add(1, mode="drop")


@lower("repeat_interleave.Tensor", meta=False, out_dtype=lambda a: torch.int64)
def repeat_interleave(repeats, *, output_size=None):
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    low, total = (int(v) for v in jax.device_get((jnp.min(repeats), jnp.sum(repeats)))) if repeats.size else (0, 0)
    if low < 0:
        raise RuntimeError("repeats can not be negative")
    if output_size is not None and output_size != total:  # CPU checks the size it was told (CUDA trusts it)
        raise RuntimeError("allocated size does not match required size")
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats, total_repeat_length=total)


# ---------------------------------------------------------------- histogram (ATen histogramdd semantics, 1-D)
def _histogram(x, edges, weight, density):
    """Counts of x in [edges[i], edges[i+1]) (the last bin closed); values outside are dropped."""
    flat = x.reshape(-1)
    n = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, flat, side="right") - 1  # ATen: upper_bound - 1
    pos = jnp.where(pos == n, n - 1, pos)
    inside = (flat >= edges[0]) & (flat <= edges[-1])  # NaN is outside
    w = jnp.ones_like(flat) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((n,), x.dtype).at[jnp.where(inside, pos, n)].add(w, mode="drop")
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist


def _check_histogram(x, weight, op="torch.histogram"):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError(f"{op}: input tensor and bins tensors should have the same dtype, but got a "
                           f"non-floating input of dtype {dtypes.to_torch(x.dtype)}")
    if weight is not None and weight.shape != x.shape:
        raise RuntimeError(f"{op}: if weight tensor is provided it should have the same shape as the input tensor")


@lower("histogram.bins_tensor", meta=False)  # no meta kernels for histogram
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    _check_histogram(self, weight)
    if bins.ndim != 1 or bins.shape[0] < 1:
        raise RuntimeError("torch.histogram: bins tensor should have one dimension and at least 1 element")
    if bins.shape[0] == 1:
        return jnp.zeros((0,), self.dtype), bins
    return _histogram(self, bins.astype(self.dtype), weight, density), bins


@lower("histogram.bin_ct", meta=False)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    _check_histogram(self, weight)
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if range is not None:
        lo, hi = float(range[0]), float(range[1])
    elif self.size:  # one host sync: the edges are shapes' worth of static values
        lo, hi = (float(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
    else:
        lo, hi = 0.0, 1.0  # ATen: an empty input without range gets [0, 1]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(f"torch.histogramdd: dimension 0's range [{lo}, {hi}] is not finite")
    if lo > hi:
        raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {lo} max {hi} for dimension 0")
    if lo == hi:  # numpy's behaviour, and no division by zero in density
        lo, hi = lo - 0.5, hi + 0.5
    # the edges are a few static values: torch's own CPU linspace gives CPU's exact roundings
    edges = torch.linspace(lo, hi, bins + 1, dtype=dtypes.to_torch(self.dtype))
    edges = jnp.asarray(edges.float().numpy() if edges.dtype == torch.bfloat16 else edges.numpy()).astype(self.dtype)
    return _histogram(self, edges, weight, density), edges
