"""Embedding and embedding bags (forward and backward ops).

Indices are range-checked as torch's CPU kernels check them, with their errors: one small host sync
per call in plain eager, traced into the program in a fused segment or a compiled graph (raised when
it runs). XLA alone would clamp them, and a NaN row was easy to miss (and integer tables had none).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import lower
from ._common import check_range, opmath, out_of_range, range_checked, value_checked


# ---------------------------------------------------------------- embedding
@lower("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return range_checked(_rows, (weight, indices), indices, weight.shape[0], _out_of_range, negative=False)


def _rows(weight, indices):
    return jnp.take(weight, indices.astype(jnp.int64), axis=0, mode="clip")


def _out_of_range(_index) -> str:
    return "index out of range in self"


@lower("embedding_dense_backward")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1).astype(jnp.int64)
    g = opmath(grad).reshape(idx.shape[0], -1)
    keep = idx != padding_idx if padding_idx >= 0 else jnp.ones(idx.shape, bool)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.float32).at[idx].add(1.0, mode="drop")
        g = g / jnp.take(counts, idx, mode="clip")[:, None]
    g = jnp.where(keep[:, None], g, 0)
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g, mode="drop")


# ---------------------------------------------------------------- embedding bag
_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bag_layout(indices, offsets, include_last_offset):
    """(num_bags, offset2bag): the bag of every index; with include_last_offset the final offset
    closes the last bag and indices past it belong to no bag (bag id num_bags, dropped)."""
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = jnp.arange(indices.shape[0])
    offset2bag = jnp.searchsorted(offsets.astype(jnp.int64), positions, side="right") - 1
    return num_bags, offset2bag.astype(jnp.int64)


def _bag_keep(indices, padding_idx):
    return indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)


@lower("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    size = weight.shape[0]
    _check_offsets(offsets, indices.shape[0])
    if mode == _BAG_MAX:
        check_range(indices, size, lambda v: f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx "
                    f"to be {v}", negative=False, error=RuntimeError)
    else:
        check_range(indices, size, lambda v, i: f"Index {i} of input takes value {v} which is not in the valid range "
                    f"[0, {size})", negative=False, error=RuntimeError, with_position=True)
    idx = indices.astype(jnp.int64)
    num_bags, offset2bag = _bag_layout(idx, offsets, include_last_offset)
    keep = _bag_keep(idx, padding_idx)
    rows = opmath(jnp.take(weight, idx, axis=0, mode="clip"))
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    seg = jnp.where(keep, offset2bag, num_bags)  # padding rows go to a dropped segment
    # torch's meta kernel sizes bag_size like offsets (one extra, zero, slot with include_last_offset)
    bag_size = jax.ops.segment_sum(keep.astype(jnp.int64), seg, offsets.shape[0] + 1)[:offsets.shape[0]]
    bag_size = jnp.where(jnp.arange(offsets.shape[0]) < num_bags, bag_size, 0)
    if mode == _BAG_MAX:
        neg = jnp.full(rows.shape, -jnp.inf, rows.dtype)
        best = jax.ops.segment_max(jnp.where(keep[:, None], rows, neg), seg, num_bags + 1)[:num_bags]
        # weight row that attains each (bag, feature) maximum: the first such index
        hit = (rows == best[jnp.minimum(seg, num_bags - 1)]) & keep[:, None] & (seg < num_bags)[:, None]
        pos = jnp.where(hit, jnp.arange(idx.shape[0])[:, None], idx.shape[0])
        first = jax.ops.segment_min(pos, seg, num_bags + 1)[:num_bags]
        max_indices = jnp.take(idx, first, mode="fill", fill_value=-1)
        out = jnp.where(bag_size[:num_bags, None] > 0, best, 0)
        return out, offset2bag, bag_size, max_indices
    out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), seg, num_bags + 1)[:num_bags]
    if mode == _BAG_MEAN:
        out = out / jnp.maximum(bag_size[:num_bags], 1)[:, None].astype(out.dtype)
    return out, offset2bag, bag_size, jnp.zeros((0,), jnp.int64)


def _check_offsets(offsets, length: int) -> None:
    """CPU's checks of the bags' starts, before the indices' (XLA would silently read a bag past the end)."""
    if offsets.size:
        value_checked(None, (), offsets[:1], out_of_range, (0, 1), lambda v: (
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
            f"However, got {v}"))
        value_checked(None, (), offsets[-1:], out_of_range, (-(2 ** 62), length + 1), lambda v: (
            f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {v}"))


def _bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
                        mode, per_sample_weights, padding_idx):
    g = opmath(grad)
    idx = indices.astype(jnp.int64)
    num_bags = g.shape[0]
    table = jnp.zeros((num_weights, g.shape[1]), g.dtype)
    if mode == _BAG_MAX:
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        valid = (bag_size[:num_bags, None] > 0) & (maximum_indices >= 0)
        return table.at[jnp.where(valid, maximum_indices, num_weights), cols].add(g, mode="drop")
    keep = _bag_keep(idx, padding_idx) & (offset2bag < num_bags)
    bag = jnp.minimum(offset2bag, num_bags - 1)
    rows = g[bag]
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(bag_size[bag], 1)[:, None].astype(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[idx].add(1.0, mode="drop")
        rows = rows / jnp.take(counts, idx, mode="clip")[:, None]
    return table.at[jnp.where(keep, idx, num_weights)].add(rows, mode="drop")


@lower("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lower("_embedding_bag_backward")
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("embedding_bag(sparse=True): sparse gradients are not supported on tpu")
    return _bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lower("_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    if mode != _BAG_SUM:
        raise NotImplementedError("embedding_bag: per_sample_weights are only supported with mode='sum'")
    idx = indices.astype(jnp.int64)
    num_bags = grad.shape[0]
    keep = _bag_keep(idx, padding_idx) & (offset2bag < num_bags)
    rows = opmath(jnp.take(weight, idx, axis=0, mode="clip"))
    g = opmath(grad)[jnp.minimum(offset2bag, num_bags - 1)]
    return jnp.where(keep, jnp.sum(rows * g, axis=1), 0)
