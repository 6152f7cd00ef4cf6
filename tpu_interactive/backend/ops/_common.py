"""Helpers shared by the lowering families: CPU's compute dtypes, norms, dims, jit. (Torch's output
metadata reaches a lowering declared with ``needs_spec=True`` as its ``spec`` argument.)"""
from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from .. import graph_checks

# float16/bfloat16: the dtypes CPU kernels compute in float32 (ATen's opmath type)
HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def opmath(x):
    """CPU's opmath upcast: float16/bfloat16 arrays compute in float32; other arrays, python scalars
    (weakly typed, so they do not promote) and None are returned as they are."""
    if isinstance(x, jax.Array) and x.dtype in HALF:
        return x.astype(jnp.float32)
    return x


def with_alpha(op, x, y, alpha):
    """x op alpha * y, for a ``Promote.RESULT`` lowering (tensor operands already have the result
    dtype, so x's is it). For float16/bfloat16 CPU rounds alpha (and a scalar y) to the dtype, then
    computes in float32 and rounds once; multiplying in the half type first would round twice."""
    dtype = x.dtype if hasattr(x, "dtype") else jnp.result_type(x, y)  # no result_type per eager call
    if dtype not in HALF:
        return op(x, y * alpha)
    as_half = lambda v: jnp.asarray(v, dtype).astype(jnp.float32)  # noqa: E731
    return op(as_half(x), as_half(y) * as_half(alpha)).astype(dtype)


def _real_scalar(v) -> bool:
    """A real Python scalar, or what jit makes of one (a weakly typed scalar)."""
    t = type(v)
    if t is float or t is int or t is bool:
        return True
    aval = getattr(v, "aval", None)
    return aval is not None and aval.weak_type and not jnp.issubdtype(aval.dtype, jnp.complexfloating)


def half_scalar_dtype(x, y):
    """The float16/bfloat16 dtype of a half tensor times a real Python scalar, else None. ATen (CPU and
    CUDA) multiplies in float32 with the scalar unrounded and rounds once: bf16 2.234375 * 1.1 is
    2.453125, not 2.46875 (1.1 rounded to bf16 first). Its add/sub round the scalar to the dtype.
    (Runs on every eager call: no jnp.result_type.)"""
    for array, other in ((x, y), (y, x)):
        dtype = getattr(array, "dtype", None)
        if dtype is not None and dtype in HALF and not getattr(getattr(array, "aval", None), "weak_type", False) \
                and _real_scalar(other):
            return dtype
    return None


def acc64(x):
    """ATen's CPU accumulate type of float32 in the kernels that widen it: float64."""
    return x.astype(jnp.float64) if x.dtype == jnp.float32 else x


def compute_dtype(dtype):
    """The float type a computation (random draws, optimizer math) runs in: float64 for float64,
    float32 for everything narrower."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def p_norm(x, p: float, axes, keepdim: bool):
    """The p-norm of ``x`` (already in its compute dtype) over ``axes`` (None: all), as ATen's
    vector norm: max / min of |x| for +-inf, the count of non-zeros for 0."""
    a = jnp.abs(x)
    if p == math.inf:
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if p == -math.inf:
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if p == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if p == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** p, axis=axes, keepdims=keepdim) ** (1.0 / p)


def jit_static(*static: str) -> Callable[[Callable], Callable]:
    """jax.jit with static (python) arguments: one fused program instead of many eager jnp calls
    (eager advanced indexing costs milliseconds of Python per call; jitted, microseconds)."""
    return functools.partial(jax.jit, static_argnames=static)


def per_dim(value, n: int) -> list:
    """A size/stride/padding argument as one value per spatial dim (torch accepts one for all)."""
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


def norm_dim(dim: int, ndim: int) -> int:
    """A torch dim as a non-negative axis (0-dim tensors accept 0 and -1), or torch's IndexError for one
    out of range (as maybe_wrap_dim: torch's meta kernels for sort, softmax, ... do not check it)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n if ndim else 0


@functools.partial(jax.jit, static_argnums=(1, 2, 3))  # bounds in the program: a Python int argument is
def _first_out_of_range(index, lo, hi, allowed=None):  # moved to the device on every call (~160 us on a TPU v5e)
    flat = index.reshape(-1)
    bad = (flat < lo) | (flat >= hi)
    if allowed is not None:  # a value that is not an index (nll_loss's ignore_index)
        bad = bad & (flat != allowed)
    position = jnp.argmax(bad)
    return jnp.any(bad), flat[position], position


def check_range(index, size: int, message: Callable, *, negative: bool, error: type = IndexError,
                with_position: bool = False) -> None:
    """Raise ``error(message(bad_index))`` (``message(bad_index, its flat position)`` with
    ``with_position``) if some index is outside [-size or 0, size): one small host sync, as torch's
    CPU kernels check; inside a compiled graph or a fused segment the check is traced in instead
    (graph_checks) and raised when the graph runs. XLA alone would clamp or drop the index silently."""
    range_checked(None, (), index, size, message, negative=negative, error=error, with_position=with_position)


def range_checked(compute: Callable | None, args: tuple, index, size: int, message: Callable, *, negative: bool,
                  error: type = IndexError, with_position: bool = False, static: tuple = (),
                  allowed: int | None = None):
    """``compute(*args, *static)`` once ``index`` passed :func:`check_range`'s check (``static``: hashable
    Python arguments, baked into the program; ``allowed``: a value outside the range that passes). In
    plain eager the two run as one program, then the check's scalars are read (for a hot op such as an
    embedding: the check, a sync and the op's own primitives one by one cost ~15x the op's planned program)."""
    if index is not None and index.size:
        lo = -size if negative else 0
        if isinstance(index, jax.core.Tracer):
            any_bad, first, position = _first_out_of_range(index, lo, size, allowed)
            if graph_checks.is_traced(any_bad):  # (a per-op program: NeedsEager, it runs eagerly instead)
                graph_checks.check_in_graph(any_bad, first, error, message, position if with_position else None)
        else:
            program = _first_out_of_range if compute is None else _with_range_check(compute)
            *computed, any_bad, first, position = (program(index, lo, size, allowed) if compute is None else
                                                    program(index, lo, size, allowed, static, *args))
            if bool(any_bad):  # the one scalar read when every index is in range
                raise error(message(int(first), int(position)) if with_position else message(int(first)))
            if computed:
                return computed[0]
    return None if compute is None else compute(*args, *static)


@functools.lru_cache(maxsize=None)
def _with_range_check(compute: Callable) -> Callable:
    def run(index, lo, hi, allowed, static, *args):
        return compute(*args, *static), *_first_out_of_range(index, lo, hi, allowed)

    return jax.jit(run, static_argnums=(1, 2, 3, 4))
