"""Matrix products (mm/bmm/addmm/...) and linear algebra (inv/solve/cholesky/qr/eigh/svd/det).

Products use Precision.HIGHEST (float32 matches CPU; the TPU default would be bf16 passes) and
accumulate float16/bfloat16 in float32 like CPU PyTorch. Shapes, dtypes and shape-mismatch errors
come from torch's meta kernels before a lowering runs.

Factorizations report failure through torch's ``info`` outputs (LAPACK convention: 0 = success,
k > 0 = the k-th pivot / leading minor failed), so torch's own checks raise torch's own errors.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch

from .. import dtypes, storage
from ..dispatch import current_spec, meta_spec
from ..registry import lower

_aten = torch.ops.aten

_PREC = jax.lax.Precision.HIGHEST
_HALF = (jnp.float16, jnp.bfloat16)


def _check_dtype(x, kernel: str):
    if x.dtype == jnp.bool_:
        raise RuntimeError(f'"{kernel}" not implemented for \'Bool\'')


def _matmul(x, y, kernel: str = "addmm_impl_cpu_"):
    """x @ y at full precision; half types accumulate in float32 and round once, like CPU."""
    _check_dtype(x, kernel)
    acc = jnp.float32 if x.dtype in _HALF else None
    out = jnp.matmul(x, y, precision=_PREC, preferred_element_type=acc)
    return out.astype(x.dtype)


def _scaled_sum(bias, prod, beta, alpha):
    """beta * bias + alpha * prod; beta == 0 ignores bias entirely (NaN/Inf in it too), like torch."""
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return jnp.broadcast_to(prod, prod.shape)
    return prod + (bias * beta if beta != 1 else bias)


@lower("mm", promote="result")
def mm(x, y):
    return _matmul(x, y)


@lower("bmm", promote="result")
def bmm(x, y):
    return _matmul(x, y, "bmm")


@lower("addmm", promote="result")
def addmm(bias, x, y, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, y), beta, alpha)


@lower("baddbmm", promote="result")
def baddbmm(bias, x, y, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, y, "baddbmm"), beta, alpha)


@lower("addbmm", promote="result")
def addbmm(bias, x, y, beta=1, alpha=1):
    _check_dtype(x, "addbmm")
    acc = jnp.float32 if x.dtype in _HALF else None
    prod = jnp.einsum("bij,bjk->ik", x, y, precision=_PREC, preferred_element_type=acc).astype(x.dtype)
    return _scaled_sum(bias, prod, beta, alpha)


@lower("mv", promote="result")
def mv(x, v):
    return _matmul(x, v, "addmv_impl_cpu")


@lower("addmv", promote="result")
def addmv(bias, x, v, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, v, "addmv_impl_cpu"), beta, alpha)


@lower("dot", promote="result")
def dot(x, y):
    return _matmul(x, y, "dot")


@lower("vdot", promote="result")
def vdot(x, y):
    return _matmul(jnp.conj(x), y, "vdot")


@lower("addr", promote="result")
def addr(bias, v1, v2, beta=1, alpha=1):
    if bias.dtype == jnp.bool_:  # torch: logical and/or for bool
        outer = jnp.logical_and(v1[:, None], v2[None, :]) & bool(alpha)
        return outer | (bias & bool(beta))
    return _scaled_sum(bias, v1[:, None] * v2[None, :], beta, alpha)


@lower("_addmm_activation", promote="result")
def addmm_activation(bias, x, y, beta=1, alpha=1, use_gelu=False):
    out = _scaled_sum(bias, _matmul(x, y), beta, alpha)
    if use_gelu:
        return jax.nn.gelu(out.astype(jnp.float32), approximate=False).astype(out.dtype)
    return jnp.maximum(out, 0)


# ---------------------------------------------------------------- factorizations
def _spec_shapes():
    outs = current_spec().outputs
    return [o.shape for o in outs] if isinstance(outs, tuple) else [outs.shape]


def _lu(a):
    """LU with partial pivoting; pivots 1-based int32 (LAPACK/torch); info = first zero pivot."""
    lu, piv, _ = jax.lax.linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, (piv + 1).astype(jnp.int32), _first_true(diag == 0)


def _first_true(flags):
    """1-based index of the first True along the last axis, 0 if none (LAPACK info)."""
    if flags.shape[-1] == 0:
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    first = jnp.argmax(flags, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(flags, axis=-1), first, 0).astype(jnp.int32)


@lower("linalg_inv_ex")
def linalg_inv_ex(a, check_errors=False):
    lu, piv, info = _lu(a)
    n = a.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)
    inv = jsl.lu_solve((lu, piv - 1), eye)
    return inv, info


def _is_vector_rhs(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lower("_linalg_solve_ex")
def linalg_solve_ex(a, b, left=True, check_errors=False):
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
    shapes = _spec_shapes()
    return x, lu, piv, info.reshape(shapes[3])


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


@lower("triangular_solve")
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    x = _triangular(a, b, upper, True, unitriangular, transpose)
    return x, jnp.broadcast_to(a, _spec_shapes()[1])


@lower("linalg_lu_factor_ex")
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg_lu_factor_ex with pivot=False is not supported on tpu")
    return _lu(a)


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


def _unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    shapes = _spec_shapes()
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


@lower("lu_unpack")
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    return _unpack(lu, pivots, unpack_data, unpack_pivots)


@lower("linalg_lu")
def linalg_lu(a, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg_lu with pivot=False is not supported on tpu")
    lu, piv, _ = _lu(a)
    return _unpack(lu, piv)
