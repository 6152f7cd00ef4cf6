"""Shape ops that copy data: cat/stack, flip/roll/repeat, tril/triu, padding, *_scatter, diag_embed.

Shapes and dtypes come from torch's meta kernels (lowerings declared with ``needs_spec=True`` read them
from ``spec`` where JAX needs them);
``*_scatter`` ops are what autograd and functionalization use for the backward of views.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes
from ..registry import lower
from ._common import jit_static, norm_dim

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_aten = torch.ops.aten


# ---------------------------------------------------------------- joining
@lower("cat", needs_spec=True)
def cat(tensors, dim=0, *, spec):
    shape = spec.shape()
    dtype = dtypes.to_jax(spec.dtype)
    # torch skips empty inputs (even legacy 1-d (0,) ones of another rank); they add nothing
    parts = [t for t in tensors if t.size]
    if not parts:
        return jnp.zeros(shape, dtype)
    return _concat(parts, norm_dim(dim, len(shape)), dtype)


@jit_static("axis", "dtype")
def _concat(parts, axis, dtype):
    return jnp.concatenate([p.astype(dtype) for p in parts], axis=axis)


@lower("stack", needs_spec=True)
def stack(tensors, dim=0, *, spec):
    shape = spec.shape()
    dtype = dtypes.to_jax(spec.dtype)
    return _stack(list(tensors), norm_dim(dim, len(shape)), dtype)


@jit_static("axis", "dtype")
def _stack(parts, axis, dtype):
    return jnp.stack([p.astype(dtype) for p in parts], axis=axis)


# ---------------------------------------------------------------- reordering / repeating
@lower("flip")
def flip(self, dims):
    axes = tuple(norm_dim(d, self.ndim) for d in dims)
    return jnp.flip(self, axes) if axes and self.ndim else self


@lower("roll")
def roll(self, shifts, dims=()):
    if self.size == 0:
        return self  # torch clones an empty tensor before it wraps any dim (its checks ran on CPU)
    return _roll(self, tuple(shifts), tuple(norm_dim(d, self.ndim) for d in dims))


@jit_static("shifts", "dims")
def _roll(self, shifts, dims):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, shifts, dims)


@lower("repeat", needs_spec=True)
def repeat(self, repeats, *, spec):
    return jnp.tile(self, tuple(repeats)).reshape(spec.shape())


@lower("tril")
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lower("triu")
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


# ---------------------------------------------------------------- padding
def _pairs(ndim: int, pad) -> list[tuple[int, int]]:
    """torch's flat (last dim first) pad list -> per-dim (before, after) pairs."""
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return pairs


@lower("constant_pad_nd")
def constant_pad_nd(self, pad, value=0):
    config = tuple((lo, hi, 0) for lo, hi in _pairs(self.ndim, pad))
    return _constant_pad(self, jnp.asarray(value), config)


@jit_static("config")
def _constant_pad(x, value, config):
    return jax.lax.pad(x, value.astype(x.dtype), config)


@jit_static("padding", "mode")
def _mode_pad(x, padding, mode: str):
    """Reflect/edge padding; negative amounts crop the (already padded) result, as torch does."""
    pairs = _pairs(x.ndim, padding)
    padded = jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in pairs], mode=mode)
    crop = tuple(slice(max(-lo, 0), padded.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(pairs))
    return padded[crop]


@jit_static("padding", "mode")
def _mode_pad_backward(grad_output, x, padding, mode):
    _, vjp = jax.vjp(lambda v: _mode_pad(v, padding, mode), x)
    return vjp(grad_output)[0]


def _pad_pair(mode: str):
    def forward(self, padding):
        return _mode_pad(self, tuple(padding), mode)

    def backward(grad_output, self, padding):
        return _mode_pad_backward(grad_output.astype(self.dtype), self, tuple(padding), mode)

    return forward, backward


for _n in (1, 2, 3):
    for _torch_mode, _jax_mode in (("reflection", "reflect"), ("replication", "edge")):
        _fwd, _bwd = _pad_pair(_jax_mode)
        _fwd.__name__, _bwd.__name__ = f"{_torch_mode}_pad{_n}d", f"{_torch_mode}_pad{_n}d_backward"
        lower(f"{_torch_mode}_pad{_n}d")(_fwd)
        lower(f"{_torch_mode}_pad{_n}d_backward")(_bwd)


# ---------------------------------------------------------------- diagonals and *_scatter (view backward)
def _diag_positions(n: int, offset: int):
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    return rows, cols


@lower("diag_embed", needs_spec=True)
def diag_embed(self, offset=0, dim1=-2, dim2=-1, *, spec):
    shape = spec.shape()
    nd = len(shape)
    d1, d2 = norm_dim(dim1, nd), norm_dim(dim2, nd)
    return _diag_embed(self, offset, d1, d2)


@jit_static("offset", "d1", "d2")
def _diag_embed(self, offset, d1, d2):
    n = self.shape[-1]
    m = n + abs(offset)
    base = jnp.zeros(self.shape[:-1] + (m, m), self.dtype)
    rows, cols = _diag_positions(n, offset)
    base = base.at[..., rows, cols].set(self)
    return jnp.moveaxis(base, (-2, -1), (d1, d2))


def _src_fits(src, part: np.ndarray) -> None:
    """The *_scatter ops' check (torch's C++ kernels make it, its meta kernels do not): src has the
    shape of the part of self it replaces (``part``: that part of a zero-stride stand-in for self)."""
    if tuple(src.shape) != part.shape:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {list(part.shape)}")


def _stand_in(self) -> np.ndarray:
    return np.broadcast_to(np.empty((), np.int8), self.shape)  # self's shape, no memory


@lower("diagonal_scatter")
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = norm_dim(dim1, self.ndim), norm_dim(dim2, self.ndim)
    _src_fits(src, np.diagonal(_stand_in(self), offset, d1, d2))
    return _diagonal_scatter(self, src, offset, d1, d2)


@jit_static("offset", "d1", "d2")
def _diagonal_scatter(self, src, offset, d1, d2):
    moved = jnp.moveaxis(self, (d1, d2), (-2, -1))
    n = src.shape[-1]
    rows, cols = _diag_positions(n, offset)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lower("select_scatter")
def select_scatter(self, src, dim, index):
    dim = norm_dim(dim, self.ndim)
    if not -self.shape[dim] <= index < self.shape[dim]:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} at dimension {dim}")
    index = index + self.shape[dim] if index < 0 else index
    _src_fits(src, _stand_in(self)[(slice(None),) * dim + (index,)])
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


@lower("slice_scatter")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, self.ndim)
    _src_fits(src, _stand_in(self)[(slice(None),) * dim + (slice(start, end, step),)])
    return _slice_scatter(self, src, dim, start, end, step)


@jit_static("dim", "start", "end", "step")
def _slice_scatter(self, src, dim, start, end, step):
    return self.at[(slice(None),) * dim + (slice(start, end, step),)].set(src.astype(self.dtype))


# The backward of a select or a slice as a pad of the gradient: one program (one recorded step in
# fused mode), not torch's composite kernel (zeros, then a copy into a view of them: four steps).
# nn.MultiheadAttention's packed q, k, v projection makes three per training step. A call autograd
# would not make (a gradient of another shape, which copy_ may broadcast; an index out of range, a
# step below 1) is left to that kernel, with its result or its error.
def _selected_shape(sizes: list, dim: int, index: int) -> list | None:
    if not -len(sizes) <= dim < len(sizes) or not sizes:
        return None
    dim %= len(sizes)
    return sizes[:dim] + sizes[dim + 1:] if -sizes[dim] <= index < sizes[dim] else None


def _sliced_shape(sizes: list, dim: int, start, end, step: int) -> list | None:
    if not -len(sizes) <= dim < len(sizes) or not sizes or step < 1:
        return None
    dim %= len(sizes)
    return sizes[:dim] + [len(range(*slice(start, end, step).indices(sizes[dim])))] + sizes[dim + 1:]


@lower("select_backward", composite_when=lambda grad, sizes, dim, index:
       list(grad.shape) != _selected_shape(list(sizes), dim, index))
def select_backward(grad, input_sizes, dim, index):
    sizes = tuple(input_sizes)
    dim = norm_dim(dim, len(sizes))
    index = index + sizes[dim] if index < 0 else index
    return _pad_along(jnp.expand_dims(grad, dim), dim, index, sizes[dim] - index - 1, 0)


@lower("slice_backward", composite_when=lambda grad, sizes, dim, start, end, step:
       list(grad.shape) != _sliced_shape(list(sizes), dim, start, end, step))
def slice_backward(grad, input_sizes, dim, start, end, step):
    sizes = tuple(input_sizes)
    dim = norm_dim(dim, len(sizes))
    size, n = sizes[dim], grad.shape[dim]
    if n == 0:
        return jnp.zeros(sizes, grad.dtype)
    start = range(*slice(start, end, step).indices(size)).start  # as torch's slice clamps it
    return _pad_along(grad, dim, start, size - start - (n - 1) * step - 1, step - 1)


def _pad_along(x, dim: int, low: int, high: int, interior: int):
    config = [(0, 0, 0)] * x.ndim
    config[dim] = (low, high, interior)
    return jax.lax.pad(x, jnp.zeros((), x.dtype), config)


def _strided_index(size, stride, offset) -> np.ndarray:
    idx = np.full((), offset, dtype=np.int64)
    for n, st in zip(size, stride):
        idx = np.add.outer(idx, np.arange(n, dtype=np.int64) * st)
    return idx.reshape(tuple(size))


@lower("as_strided_scatter")
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    offset, itemsize = storage_offset or 0, self.dtype.itemsize
    needed = 0 if 0 in size else itemsize * (offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1)
    if needed > self.size * itemsize:  # CPU's as_strided over the contiguous clone of self refuses it
        raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
                           f"and itemsize {itemsize} requiring a storage size of {needed} are out of bounds "
                           f"for storage of size {self.size * itemsize}")
    # semantics of torch's reference: clone self (contiguous), write src through as_strided of the clone
    positions = _strided_index(tuple(size), tuple(stride), storage_offset or 0).reshape(-1)
    flat = self.reshape(-1).at[positions].set(src.reshape(-1).astype(self.dtype))
    return flat.reshape(self.shape)


@lower("narrow_copy")
def narrow_copy(self, dim, start, length):
    dim = norm_dim(dim, self.ndim)
    start = start + self.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


@lower("unfold_backward")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    sizes = tuple(input_sizes)
    if not sizes:  # unfold of a 0-dim tensor: one window of one element
        return grad_in.reshape(())
    return _unfold_backward(grad_in, sizes, norm_dim(dim, len(sizes)), size, step)


@jit_static("sizes", "dim", "size", "step")
def _unfold_backward(grad_in, sizes, dim, size, step):
    """Sum every window element back to its source position (windows may overlap)."""
    windows = jnp.moveaxis(grad_in, dim, -2)  # (..., n_windows, size)
    positions = jnp.arange(windows.shape[-2])[:, None] * step + jnp.arange(size)[None, :]
    out = jnp.zeros(windows.shape[:-2] + (sizes[dim],), grad_in.dtype).at[..., positions].add(windows)
    return jnp.moveaxis(out, -1, dim)


# ---------------------------------------------------------------- dtype views
@lower("view.dtype", raw=True)
def view_dtype(self, dtype):
    """A same-storage reinterpretation; storage.read/write bitcast to the view's dtype."""
    if dtype != self.dtype and dtype.itemsize != self.dtype.itemsize:
        raise NotImplementedError(
            f"x.view({dtype}) of a {self.dtype} tpu tensor (different element size) is not supported; "
            "use .to(dtype) to convert values, or view between dtypes of the same size")
    return _aten.view.dtype.redispatch(_CPU, self, dtype)
