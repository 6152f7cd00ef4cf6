"""Matrix products (mm/bmm/addmm/...) and linear algebra (inv/solve/cholesky/qr/eigh/svd/det).

Products use Precision.HIGHEST (float32 matches CPU; the TPU default would be bf16 passes) and
accumulate float16/bfloat16 in float32 like CPU PyTorch. Shapes, dtypes and shape-mismatch errors
come from torch's meta kernels before a lowering runs.

Factorizations report failure through torch's ``info`` outputs (LAPACK convention: 0 = success,
k > 0 = the k-th pivot / leading minor failed), so torch's own checks raise torch's own errors.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch

from .. import dtypes, storage
from ..dispatch import meta_spec
from ..registry import Promote, lower
from ._common import HALF, norm_dim
from ._lapack_info import check_lapack_info, first_true

_aten = torch.ops.aten

_PREC = jax.lax.Precision.HIGHEST


def _check_dtype(x, kernel: str, y=None):
    """CPU's AT_DISPATCH refusal (NotImplementedError) of a bool product. mm/mv/bmm return before it
    when the result is empty or the reduced dim is 0 (a zero/empty result); dot never does."""
    if x.dtype != jnp.bool_:
        return
    if kernel in ("dot", "vdot"):
        trivial = False
    elif y is None:
        trivial = not x.size
    else:
        trivial = x.shape[-1] == 0 or 0 in jax.eval_shape(jnp.matmul, x, y).shape
    if not trivial:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def _no_integer_dot() -> bool:
    """A TPU has no 64-bit integer dot (XLA: "rewriting computation to not contain X64 element
    types ... is not implemented" for dot_general)."""
    return jax.default_backend() == "tpu"


def _integer_matmul(x, y):
    """x @ y for integers as exact products summed over k (what ATen's integer kernels compute)."""
    if y.ndim == 1:
        return jnp.sum(x * y, axis=-1, dtype=x.dtype)
    if x.ndim == 1:
        return jnp.sum(x[:, None] * y, axis=-2, dtype=x.dtype)
    return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2, dtype=x.dtype)


def _matmul(x, y, kernel: str = "addmm_impl_cpu_", rounded: bool = True):
    """x @ y at full precision; half types accumulate in float32 and round once, like CPU
    (``rounded=False``: keep the float32 sum for a following _scaled_sum)."""
    _check_dtype(x, kernel, y)
    if jnp.issubdtype(x.dtype, jnp.integer) and _no_integer_dot():
        return _integer_matmul(x, y)
    acc = jnp.float32 if x.dtype in HALF else None
    out = jnp.matmul(x, y, precision=_PREC, preferred_element_type=acc)
    return out.astype(x.dtype) if rounded else out


def _scaled_sum(bias, prod, beta, alpha):
    """beta * bias + alpha * prod; beta == 0 ignores bias entirely (NaN/Inf in it too), like torch.
    As on CPU: integer kernels use int(alpha), int(beta); half types add in float32, round once."""
    if jnp.issubdtype(prod.dtype, jnp.integer):
        alpha, beta = int(alpha), int(beta)
    if bias.dtype in HALF:
        bias = bias.astype(jnp.float32)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return jnp.broadcast_to(prod, prod.shape)
    return prod + (bias * beta if beta != 1 else bias)


@lower("mm", promote=Promote.RESULT, strict_dtypes=True)
def mm(x, y):
    return _matmul(x, y)


@lower("bmm", promote=Promote.RESULT, strict_dtypes=True)
def bmm(x, y):
    return _matmul(x, y, "bmm")


def _expands_to(bias, shape: tuple) -> None:
    """CPU's ``expand_size(self, result shape)`` of addmm's self, with its error (torch's meta kernel
    does not check it: a [2, 3] bias took a [1, 3] product, a [1, 2, 3] one made a 3-d result)."""
    aligned = zip(reversed(bias.shape), reversed(shape))
    if bias.ndim > len(shape) or any(b != 1 and b != s for b, s in aligned):
        torch.empty_strided(bias.shape, (0,) * bias.ndim, dtype=dtypes.to_torch(bias.dtype)).expand(shape)


@lower("addmm", promote=Promote.RESULT, strict_dtypes=True)
def addmm(bias, x, y, beta=1, alpha=1):
    _expands_to(bias, (x.shape[0], y.shape[1]))
    return _scaled_sum(bias, _matmul(x, y, rounded=False), beta, alpha)


@lower("baddbmm", promote=Promote.RESULT, strict_dtypes=True)
def baddbmm(bias, x, y, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, y, "baddbmm", rounded=False), beta, alpha)


@lower("addbmm", promote=Promote.RESULT, strict_dtypes=True)
def addbmm(bias, x, y, beta=1, alpha=1):
    _check_dtype(x, "addbmm")
    if x.dtype in HALF and x.shape[0] > 1:
        # CPU: one addmm_ per batch into the half-type result (float32 inside, rounded each time)
        prods = jnp.matmul(x, y, precision=_PREC, preferred_element_type=jnp.float32)
        first = _scaled_sum(bias, prods[0], beta, alpha).astype(x.dtype)

        def step(acc, p):
            return (acc.astype(jnp.float32) + (p * alpha if alpha != 1 else p)).astype(x.dtype), None

        return jax.lax.scan(step, first, prods[1:])[0]
    if jnp.issubdtype(x.dtype, jnp.integer) and _no_integer_dot():  # the chip refused the einsum's s64 dot
        return _scaled_sum(bias, jnp.sum(_integer_matmul(x, y), axis=0, dtype=x.dtype), beta, alpha)
    acc = jnp.float32 if x.dtype in HALF else None
    prod = jnp.einsum("bij,bjk->ik", x, y, precision=_PREC, preferred_element_type=acc)
    return _scaled_sum(bias, prod, beta, alpha)


@lower("mv", promote=Promote.RESULT, strict_dtypes=True)
def mv(x, v):
    return _matmul(x, v, "addmv_impl_cpu")


@lower("addmv", promote=Promote.RESULT, strict_dtypes=True)
def addmv(bias, x, v, beta=1, alpha=1):
    if bias.ndim > 1:  # CPU's check (torch's meta kernel lacks it)
        raise RuntimeError(f"vector + matrix @ vector expected, got {bias.ndim}, {x.ndim}, {v.ndim}")
    return _scaled_sum(bias, _matmul(x, v, "addmv_impl_cpu", rounded=False), beta, alpha)


@lower("dot", promote=Promote.RESULT, strict_dtypes=True)
def dot(x, y):
    return _matmul(x, y, "dot")


@lower("vdot", promote=Promote.RESULT, strict_dtypes=True)
def vdot(x, y):
    return _matmul(jnp.conj(x), y, "vdot")


@lower("addr", promote=Promote.RESULT)
def addr(bias, v1, v2, beta=1, alpha=1):
    if bias.dtype == jnp.bool_:  # torch: logical and/or for bool
        outer = jnp.logical_and(v1[:, None], v2[None, :]) & bool(alpha)
        return outer | (bias & bool(beta))
    if bias.dtype in HALF:  # CPU's kernel: beta * self + alpha * v1 * v2 in the half type, rounding each op
        a, b = jnp.asarray(alpha, jnp.float32).astype(bias.dtype), jnp.asarray(beta, jnp.float32).astype(bias.dtype)
        prod = (a * v1[:, None]) * v2[None, :]
        return prod if beta == 0 else b * bias + prod
    return _scaled_sum(bias, v1[:, None] * v2[None, :], beta, alpha)


@lower("_addmm_activation", promote=Promote.RESULT, strict_dtypes=True)
def addmm_activation(bias, x, y, beta=1, alpha=1, use_gelu=False):
    _expands_to(bias, (x.shape[0], y.shape[1]))
    out = _scaled_sum(bias, _matmul(x, y), beta, alpha)
    if use_gelu:
        return jax.nn.gelu(out.astype(jnp.float32), approximate=False).astype(out.dtype)
    return jnp.maximum(out, 0)


# ---------------------------------------------------------------- factorizations
def _lu(a):
    """LU with partial pivoting; pivots 1-based int32 (LAPACK/torch); info = first zero pivot."""
    lu, piv, _ = jax.lax.linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, (piv + 1).astype(jnp.int32), first_true(diag == 0)


@lower("linalg_inv_ex")
def linalg_inv_ex(a, check_errors=False):
    lu, piv, info = _lu(a)
    n = a.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)
    inv = jsl.lu_solve((lu, piv - 1), eye)
    if check_errors:
        check_lapack_info(info, "linalg.inv_ex", a.ndim > 2)
    return inv, info


def _is_vector_rhs(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lower("_linalg_solve_ex", needs_spec=True)
def linalg_solve_ex(a, b, left=True, check_errors=False, *, spec):
    lu, piv, info = _lu(a)
    vector = _is_vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    if left:
        batch = jnp.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
        x = jsl.lu_solve((jnp.broadcast_to(lu, batch + lu.shape[-2:]), jnp.broadcast_to(piv - 1, batch + piv.shape[-1:])),
                         jnp.broadcast_to(rhs, batch + rhs.shape[-2:]))
    else:  # X A = B  <=>  A^T X^T = B^T
        x = jnp.swapaxes(jsl.solve(jnp.swapaxes(a, -1, -2), jnp.swapaxes(rhs, -1, -2)), -1, -2)
    x = x[..., 0] if vector else x
    if check_errors:
        check_lapack_info(info, "torch.linalg.solve_ex", a.ndim > 2)
    return x, lu, piv, info.reshape(spec.shape(3))


def _hermitian_t(a):
    return jnp.swapaxes(jnp.conj(a), -1, -2)


def _first_nonpositive_pivot(a):
    """LAPACK potrf's info: the order of the first leading minor that is not positive-definite
    (unpivoted elimination on the lower triangle, mirrored); 0 if all are."""
    n = a.shape[-1]
    m = jnp.tril(a) + _hermitian_t(jnp.tril(a, -1))
    later = jnp.arange(n)

    def step(k, state):
        m, info = state
        pivot = jnp.real(m[..., k, k])
        bad = ~(pivot > 0)
        info = jnp.where((info == 0) & bad, k + 1, info).astype(jnp.int32)
        col = m[..., :, k] / jnp.where(bad, 1, pivot)[..., None]
        keep = (later > k)
        m = m - col[..., :, None] * m[..., k, None, :] * (keep[:, None] & keep[None, :])
        return m, info

    return jax.lax.fori_loop(0, n, step, (m, jnp.zeros(a.shape[:-2], jnp.int32)))[1]


@lower("linalg_cholesky_ex")
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    source = _hermitian_t(a) if upper else a  # torch reads the triangle named by `upper`
    factor = jax.lax.linalg.cholesky(source, symmetrize_input=False)
    failed = jnp.any(jnp.isnan(factor), axis=(-2, -1))
    # jax NaNs the whole factor on failure; find LAPACK's minor order only when something failed
    info = jax.lax.cond(jnp.any(failed), _first_nonpositive_pivot, lambda m: jnp.zeros(m.shape[:-2], jnp.int32),
                        source)
    if check_errors:
        check_lapack_info(info, "linalg.cholesky_ex", a.ndim > 2)
    return (_hermitian_t(factor) if upper else factor), info


@lower("linalg_qr")
def linalg_qr(a, mode="reduced"):
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or 'complete'")
    if mode == "r":
        r = jnp.linalg.qr(a, mode="r")
        return jnp.zeros((0,), a.dtype), r
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@lower("_linalg_eigh")
def linalg_eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    if not compute_v:
        return w, jnp.zeros((0,), a.dtype)
    return w, v


@lower("_linalg_svd")
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    if a.size:  # LAPACK's gesdd refuses a NaN (info -4): torch's words for it
        check_lapack_info(jnp.where(jnp.any(jnp.isnan(a), axis=(-2, -1)), -4, 0).astype(jnp.int32), "linalg.svd",
                           a.ndim > 2, negative=True)
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


def _lu_det_parts(a):
    lu, piv, _ = _lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.arange(1, piv.shape[-1] + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(a.dtype)
    return lu, piv, diag, parity


def _det_input(A):
    """torch factors A^T when A is contiguous and real (no copy for LAPACK), and its backward
    formulas assume that LU; so do the same. Needs the tensor's strides, hence raw lowerings."""
    a = storage.read(A)
    return jnp.swapaxes(a, -1, -2) if A.is_contiguous() and not A.is_complex() else a


def _as_tensors(op, args, arrays):
    specs = meta_spec(op, args, {}, False).outputs  # torch's checks (square, dtype) and result dtypes
    return tuple(storage.new_tensor(jnp.asarray(x).astype(dtypes.to_jax(s.dtype)), s.shape, s.dtype)
                 for x, s in zip(arrays, specs))


@lower("_linalg_det", raw=True)
def linalg_det(A):
    meta_spec(_aten._linalg_det.default, (A,), {}, False)
    lu, piv, diag, parity = _lu_det_parts(_det_input(A))
    return _as_tensors(_aten._linalg_det.default, (A,), (parity * jnp.prod(diag, axis=-1), lu, piv))


@lower("_linalg_slogdet", raw=True)
def linalg_slogdet(A):
    meta_spec(_aten._linalg_slogdet.default, (A,), {}, False)
    a = _det_input(A)
    lu, piv, diag, parity = _lu_det_parts(a)
    if jnp.iscomplexobj(a):
        sign = parity * jnp.prod(diag / jnp.abs(diag), axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    logabs = jnp.sum(jnp.log(jnp.abs(diag)), axis=-1)
    return _as_tensors(_aten._linalg_slogdet.default, (A,), (sign, logabs, lu, piv))


def _triangular(a, b, upper, left, unitriangular, transpose=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return jax.lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, transpose_a=transpose,
                                           unit_diagonal=unitriangular)


@lower("linalg_solve_triangular")
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    return _triangular(a, b, upper, left, unitriangular)


@lower("triangular_solve", needs_spec=True)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False, *, spec):
    x = _triangular(a, b, upper, True, unitriangular, transpose)
    return x, jnp.broadcast_to(a, spec.shape(1))


@lower("linalg_lu_factor_ex")
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg_lu_factor_ex with pivot=False is not supported on tpu")
    lu, piv, info = _lu(a)
    if check_errors:
        check_lapack_info(info, "torch.linalg.lu_factor_ex", a.ndim > 2)
    return lu, piv, info


def _permutation_from_pivots(piv, m):
    """LAPACK sequential row swaps (1-based) -> the permutation they apply to rows 0..m-1."""
    perm = jnp.broadcast_to(jnp.arange(m), piv.shape[:-1] + (m,))

    def swap(i, perm):
        j = piv[..., i] - 1
        pi = perm[..., i]
        pj = jnp.take_along_axis(perm, j[..., None], axis=-1)[..., 0]
        perm = perm.at[..., i].set(pj)
        return jnp.where(jnp.arange(m) == j[..., None], pi[..., None], perm)

    return jax.lax.fori_loop(0, piv.shape[-1], swap, perm)


@lower("linalg_lu_solve")
def linalg_lu_solve(lu, pivots, b, left=True, adjoint=False):
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    piv = jnp.broadcast_to(pivots, batch + pivots.shape[-1:]) - 1
    rhs = b if left else _hermitian_t(b)
    rhs = jnp.broadcast_to(rhs, batch + rhs.shape[-2:])
    # left: A X = B (or A^H X = B); right: X A = B  <=>  A^H X^H = B^H
    trans = 2 if adjoint == left else 0
    x = jsl.lu_solve((lu, piv), rhs, trans=trans)
    return x if left else _hermitian_t(x)


def _unpack(lu, piv, spec, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    shapes = [spec.shape(i) for i in range(3)]
    if unpack_pivots:
        perm = _permutation_from_pivots(piv, m)
        # A = P @ L @ U with P[perm[i], i] = 1
        p = (jnp.arange(m)[:, None] == perm[..., None, :]).astype(lu.dtype)
    else:
        p = jnp.zeros(shapes[0], lu.dtype)
    if unpack_data:
        lower_part = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        upper_part = jnp.triu(lu[..., :k, :])
    else:
        lower_part, upper_part = jnp.zeros(shapes[1], lu.dtype), jnp.zeros(shapes[2], lu.dtype)
    return p, lower_part, upper_part


@lower("lu_unpack", needs_spec=True)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True, *, spec):
    return _unpack(lu, pivots, spec, unpack_data, unpack_pivots)


@lower("linalg_lu", needs_spec=True)
def linalg_lu(a, pivot=True, *, spec):
    if not pivot:
        raise NotImplementedError("linalg_lu with pivot=False is not supported on tpu")
    lu, piv, _ = _lu(a)
    return _unpack(lu, piv, spec)


# ---------------------------------------------------------------- cross / distances
@lower("linalg_cross", promote=Promote.RESULT)
def linalg_cross(a, b, dim=-1):
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    dim = norm_dim(dim, len(shape))

    def part(x, i):
        return jax.lax.index_in_dim(x, i, dim, keepdims=True)

    # explicit products (not jnp.cross): integer dtypes and bool-free, same order of terms as ATen
    return jnp.concatenate([part(a, (i + 1) % 3) * part(b, (i + 2) % 3) - part(a, (i + 2) % 3) * part(b, (i + 1) % 3)
                            for i in range(3)], axis=dim)


def _minkowski(diff, p):
    """||diff||_p over the last axis with ATen's special cases (p = 0 counts nonzeros, inf = max)."""
    d = jnp.abs(diff)
    if p == 0:
        return jnp.sum(d != 0, axis=-1).astype(diff.dtype)
    if p == 1:
        return jnp.sum(d, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, axis=-1))
    if math.isinf(p):
        return jnp.max(d, axis=-1, initial=0) if d.shape[-1] else jnp.zeros(d.shape[:-1], d.dtype)
    return jnp.sum(d ** p, axis=-1) ** (1.0 / p)


def _euclidean_mm(x1, x2):
    """ATen's _euclidean_dist (matrix-product form, used for p=2 with large inputs)."""
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    prod = jnp.matmul(x1, jnp.swapaxes(x2, -1, -2), precision=_PREC)
    return jnp.sqrt(jnp.maximum(n1 - 2 * prod + jnp.swapaxes(n2, -1, -2), 0))


def _pairwise_diff(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    return x1[..., :, None, :] - x2[..., None, :, :]


@lower("_cdist_forward")
def cdist_forward(x1, x2, p, compute_mode=None):
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    r1, r2 = x1.shape[-2], x2.shape[-2]
    # ATen: mode None/0 = mm for euclidean if either side has > 25 rows; 1 = always mm; 2 = never
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (r1 > 25 or r2 > 25))):
        batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
        return _euclidean_mm(jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:]))
    return _minkowski(_pairwise_diff(x1, x2), p)


def _dist_grad_weight(diff, dist, p):
    """d dist / d diff, elementwise, with ATen's conventions (0 where dist == 0, except p = 1)."""
    dist = dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    safe = jnp.where(dist == 0, jnp.ones((), dist.dtype), dist)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if math.isinf(p):
        return jnp.sign(diff) * (jnp.abs(diff) == dist)
    if p < 2:
        w = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
    elif p == 2:
        w = diff / safe
    else:
        w = diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1)
    return jnp.where(dist == 0, zero, w)


@lower("_cdist_backward")
def cdist_backward(grad, x1, x2, p, cdist):
    diff = _pairwise_diff(x1, x2)
    g = jnp.sum(grad[..., None] * _dist_grad_weight(diff, cdist, p), axis=-2)
    return g  # in the broadcast batch shape (torch's too); autograd sums it down to x1's


@lower("_pdist_forward")
def pdist_forward(x, p=2):
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    i, j = np.triu_indices(x.shape[0], 1)
    return _minkowski(x[i] - x[j], p)


@lower("_pdist_backward")
def pdist_backward(grad, x, p, pdist):
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    # every pair (i<j) as a symmetric matrix; the weights are odd in diff, so cdist's backward applies
    g = jnp.zeros((n, n), grad.dtype).at[i, j].set(grad).at[j, i].set(grad)
    d = jnp.zeros((n, n), pdist.dtype).at[i, j].set(pdist).at[j, i].set(pdist)
    return jnp.sum(g[..., None] * _dist_grad_weight(x[:, None, :] - x[None, :, :], d, p), axis=-2)


# ---------------------------------------------------------------- cholesky family / QR pieces
def _raise_not_pd(info, op: str):
    """torch's LinAlgError for a failed Cholesky factorization (one host sync on ``info``)."""
    flat = np.asarray(jax.device_get(info)).reshape(-1)
    bad = np.nonzero(flat)[0]
    if bad.size:
        batch = f"(Batch element {bad[0]}): " if info.ndim else ""
        raise torch.linalg.LinAlgError(
            f"{op}: {batch}The factorization could not be completed because the input is not positive-definite "
            f"(the leading minor of order {flat[bad[0]]} is not positive-definite).")


@lower("cholesky", torch_versions="<2.14")  # torch 2.14 removed aten::cholesky
def cholesky(a, upper=False):
    if a.shape[-1] == 0:
        return a
    factor, info = linalg_cholesky_ex(a, upper)  # LAPACK potrf reads the triangle named by `upper`
    _raise_not_pd(info, "cholesky")
    return factor


def _cholesky_solve(b, factor, upper):
    """Solve (L L^H) X = B (or U^H U X = B) with two triangular solves."""
    lower_factor = _hermitian_t(factor) if upper else factor
    y = _triangular(lower_factor, b, False, True, False)
    return _triangular(_hermitian_t(lower_factor), y, True, True, False)


@lower("_cholesky_solve_helper")
def cholesky_solve_helper(b, factor, upper):
    return _cholesky_solve(b, factor, upper)


@lower("cholesky_inverse")
def cholesky_inverse(factor, upper=False):
    if factor.size:  # LAPACK's potri: a zero on the factor's diagonal is a singular matrix
        check_lapack_info(first_true(jnp.diagonal(factor, axis1=-2, axis2=-1) == 0), "cholesky_inverse", factor.ndim > 2)
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(eye, factor, upper)


@lower("linalg_matrix_exp")
def linalg_matrix_exp(a):
    if a.shape[-1] == 0 or a.size == 0:
        return a
    if a.dtype in HALF:  # like CPU's opmath: compute in float32, round once
        return jsl.expm(a.astype(jnp.float32)).astype(a.dtype)
    return jsl.expm(a)


@lower("geqrf", meta=False)  # torch has no meta kernel for geqrf
def geqrf(a):
    if a.ndim < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2] + (min(a.shape[-2:]),), a.dtype)
    h, tau = jnp.linalg.qr(a, mode="raw")  # LAPACK geqrf, with the reflectors transposed
    return jnp.swapaxes(h, -1, -2), tau


@lower("linalg_householder_product")
def linalg_householder_product(a, tau):
    if a.size == 0 or tau.shape[-1] == 0:
        return jnp.broadcast_to(jnp.eye(*a.shape[-2:], dtype=a.dtype), a.shape) if a.size else a
    return jax.lax.linalg.householder_product(a, tau)


@lower("ormqr")
def ormqr(a, tau, c, left=True, transpose=False):
    if c.size == 0:
        return c
    if tau.shape[-1] == 0:
        return c
    a = a[..., :tau.shape[-1]]
    if hasattr(jax.lax.linalg, "ormqr"):
        return jax.lax.linalg.ormqr(a, tau, c, left=left, transpose=transpose)
    # jax < 0.7 has no ormqr: the full m x m Q (zero tau for the padded columns: identity reflectors)
    m, k = a.shape[-2], tau.shape[-1]
    pad = [(0, 0)] * (a.ndim - 1)
    q = jax.lax.linalg.householder_product(jnp.pad(a, pad + [(0, m - k)]), jnp.pad(tau, pad[:-1] + [(0, m - k)]))
    q = jnp.conj(jnp.swapaxes(q, -1, -2)) if transpose else q
    return jnp.matmul(q, c, precision=_PREC) if left else jnp.matmul(c, q, precision=_PREC)
