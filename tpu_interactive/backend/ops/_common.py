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


def out_of_range(flat, lo: int, hi: int, allowed: int | None = None):
    """An index outside [lo, hi) (``allowed``: a value that is not an index, e.g. nll_loss's ignore_index)."""
    bad = (flat < lo) | (flat >= hi)
    return bad if allowed is None else bad & (flat != allowed)


def outside_unit_interval(flat):
    """A probability outside [0, 1], NaN included (CPU's ``p >= 0 && p <= 1`` is false for it)."""
    return ~((flat >= 0) & (flat <= 1))


@functools.partial(jax.jit, static_argnums=(1, 2))  # the test's bounds in the program: a Python int argument
def _first_bad(values, bad: Callable, params: tuple):  # is moved to the device on every call (~160 us, TPU v5e)
    flat = values.reshape(-1)
    mask = bad(flat, *params)
    position = jnp.argmax(mask)
    return jnp.any(mask), flat[position], position


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
    Python arguments, baked into the program; ``allowed``: a value outside the range that passes)."""
    return value_checked(compute, args, index, out_of_range, (-size if negative else 0, size, allowed), message,
                         error=error, with_position=with_position, static=static)


def value_checked(compute: Callable | None, args: tuple, values, bad: Callable, params: tuple, message: Callable, *,
                  error: type = RuntimeError, with_position: bool = False, static: tuple = ()):
    """``compute(*args, *static)`` once no element of ``values`` is ``bad(flat_values, *params)`` (a module-level
    function and hashable params), else ``error(message(first bad value))``. In plain eager the two run as one
    program, then the check's scalars are read (for a hot op such as an embedding: the check, a sync and the op's
    own primitives one by one cost ~15x the op's planned program); traced, the check goes into the graph."""
    if values is not None and values.size:
        if isinstance(values, jax.core.Tracer):
            any_bad, first, position = _first_bad(values, bad, params)
            if graph_checks.is_traced(any_bad):  # (a per-op program: NeedsEager, it runs eagerly instead)
                graph_checks.check_in_graph(any_bad, first, error, message, position if with_position else None)
        else:
            program = _first_bad if compute is None else _with_check(compute)
            *computed, any_bad, first, position = (program(values, bad, params) if compute is None else
                                                    program(values, bad, params, static, *args))
            if bool(any_bad):  # the one scalar read when every value passes
                first = first.item()
                raise error(message(first, int(position)) if with_position else message(first))
            if computed:
                return computed[0]
    return None if compute is None else compute(*args, *static)


@functools.lru_cache(maxsize=None)
def _with_check(compute: Callable) -> Callable:
    def run(values, bad, params, static, *args):
        return compute(*args, *static), *_first_bad(values, bad, params)

    return jax.jit(run, static_argnums=(1, 2, 3))


@functools.partial(jax.jit, static_argnums=(1,))
def _first_code(values: tuple, code: Callable):
    codes = code(*[v.reshape(-1) for v in jnp.broadcast_arrays(*values)])  # per element: 0 passes, k fails with message k
    return codes[jnp.argmax(codes != 0)]


def code_checked(compute: Callable, args: tuple, values: tuple, code: Callable, messages: tuple[str, ...], *,
                 error: type = RuntimeError, static: tuple = ()):
    """``compute(*args, *static)`` once every element passes ``code`` (a module-level function of the flat
    ``values``, broadcast together, giving 0 or the 1-based number of the check an element fails, in CPU's order),
    else ``error(messages[k - 1])`` for the first element that fails: :func:`value_checked` for a kernel
    whose loop makes several checks per element, each in its own words."""
    if values[0].size:
        if isinstance(values[0], jax.core.Tracer):
            first = _first_code(values, code)
            if graph_checks.is_traced(first):
                for k, text in enumerate(messages, 1):
                    graph_checks.check_in_graph(first == k, first, error, lambda _, text=text: text)
        else:
            computed, first = _with_code_check(compute)(values, code, static, *args)
            if int(first):
                raise error(messages[int(first) - 1])
            return computed
    return compute(*args, *static)


@functools.lru_cache(maxsize=None)
def _with_code_check(compute: Callable) -> Callable:
    def run(values, code, static, *args):
        return compute(*args, *static), _first_code(values, code)

    return jax.jit(run, static_argnums=(1, 2))
