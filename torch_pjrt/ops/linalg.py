"""Lowerings: linalg family.

Results follow torch's conventions: `info` tensors are int32 (0 = success, i > 0 = the
first failing leading minor / zero pivot, 1-based), LU pivots are LAPACK's 1-based int32
row swaps, batch dimensions lead, and outputs torch leaves empty (eigenvectors when
compute_v=False, Q for mode='r', ...) are 0-element tensors of the right dtype.

`check_errors=True` cannot raise from inside an XLA executable; the lowerings return
the info tensor and leave raising to the caller (torch raises only when asked to).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch
from jax import lax
from jax.lax import linalg as lxl
from .registry import family
from ..dtypes import c10_name, to_torch

lowering = family(not_paddable="a factorization or solve mixes the elements of its matrices: padding would change them")
# the `_ex` ops' eager kernel: the lowering, then CPU's check of info when check_errors=True
_CHECKED = "eager/linalg_checks.py: the lowering, then torch's _linalg_check_errors of its info when check_errors=True"


aten = torch.ops.aten

I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)
HIGHEST = lax.Precision.HIGHEST


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x))


def _real_dtype(dtype):
    return np.dtype(jnp.finfo(dtype).dtype)


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _matmul(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def _first_failure(bad):
    """1-based index of the first True along the last axis, 0 where none (int32)."""
    n = bad.shape[-1]
    idx = jnp.where(bad, jnp.arange(1, n + 1, dtype=I32), jnp.array(n + 1, I32))
    first = jnp.min(idx, axis=-1) if n else jnp.zeros(bad.shape[:-1], I32)
    return jnp.where(first > n, jnp.zeros((), I32), first).astype(I32)


def _diag(x):
    return jnp.diagonal(x, axis1=-2, axis2=-1)


def _broadcast_batch(a, b):
    """Broadcast the batch dimensions (all but the last two) of two matrices."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


# ----------------------------------------------------------------------- cholesky


def _cholesky_lower(a):
    L = lxl.cholesky(a, symmetrize_input=False)  # reads the lower triangle, as LAPACK does
    return jnp.tril(L)


def _cholesky_info(a):
    """LAPACK potrf's info: order of the first leading minor that is not positive definite.

    XLA reports a failed factorisation only as an all-NaN result, so on failure this
    re-runs a column-by-column Cholesky that records where it first breaks down."""
    n = a.shape[-1]
    rows = jnp.arange(n)

    def column(j, state):
        L, info = state
        row_j = jnp.where(rows < j, L[..., j, :], 0)
        d = jnp.real(a[..., j, j]) - jnp.sum(jnp.abs(row_j) ** 2, axis=-1)
        bad = ~(d > 0)
        info = jnp.where((info == 0) & bad, j + 1, info).astype(I32)
        ljj = jnp.sqrt(jnp.where(bad, 1, d))
        col = (a[..., :, j] - jnp.einsum("...ik,...k->...i", L, jnp.conj(row_j), precision=HIGHEST)) / ljj[..., None]
        col = jnp.where(rows > j, col, jnp.where(rows == j, ljj[..., None].astype(a.dtype), 0))
        return L.at[..., :, j].set(col), info

    L0 = jnp.zeros_like(a)
    return lax.fori_loop(0, n, column, (L0, jnp.zeros(a.shape[:-2], I32)))[1]


@lowering(aten.linalg_cholesky_ex.default, eager=_CHECKED)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    if self.shape[-1] == 0:  # CPU: an empty factor and info 0 (the info loop has no column to index)
        return self, jnp.zeros(self.shape[:-2], I32)
    L = _cholesky_lower(self)
    failed = jnp.any(~jnp.isfinite(L))
    info = lax.cond(failed, _cholesky_info, lambda a: jnp.zeros(a.shape[:-2], I32), self)
    return (_mH(L) if upper else L), info


if hasattr(aten, "cholesky"):  # torch 2.14 removed aten::cholesky (torch.cholesky only raises there)
    @lowering(aten.cholesky.default)
    def cholesky(self, upper=False):
        L = _cholesky_lower(self)
        return _mH(L) if upper else L


def _cholesky_solve(b, factor, upper):
    L = _mH(factor) if upper else factor
    L, b = _broadcast_batch(L, b)
    y = lxl.triangular_solve(L, b, left_side=True, lower=True)
    return lxl.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lowering(aten.cholesky_solve.default)
def cholesky_solve(self, input2, upper=False):
    return _cholesky_solve(self, input2, upper)


@lowering(aten._cholesky_solve_helper.default)
def _cholesky_solve_helper(self, A, upper):
    return _cholesky_solve(self, A, upper)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return _cholesky_solve(eye, self, upper)


# ----------------------------------------------------------------------------- LU


def _lu(a):
    """(packed LU, 1-based int32 pivots, 0-based permutation, info) as LAPACK's getrf."""
    lu, piv, perm = lxl.lu(a)
    k = min(a.shape[-2], a.shape[-1])
    info = _first_failure(_diag(lu)[..., :k] == 0)
    return lu, (piv + 1).astype(I32), perm, info


def _lu_solve(lu, perm, b, adjoint=False):
    """Solve A x = b (or A^H x = b) for A = P L U given as packed LU and row permutation."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    take_rows = jax.vmap(lambda m, p: m[p]) if b.ndim > 2 else (lambda m, p: m[p])
    for _ in range(b.ndim - 3):
        take_rows = jax.vmap(take_rows)
    if not adjoint:
        x = take_rows(b, perm)
        x = lxl.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return lxl.triangular_solve(lu, x, left_side=True, lower=False)
    x = lxl.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    x = lxl.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True, transpose_a=True,
                             conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return take_rows(x, inv)


def _pivots_to_perm(pivots, m):
    return lxl.lu_pivots_to_permutation(pivots - 1, m)


def _solve_with(lu, perm, B, left, adjoint, vector):
    b = B[..., None] if vector else B
    if left:
        x = _lu_solve(lu, perm, b, adjoint)
    else:
        # X A = B  <=>  A^H X^H = B^H  (adjoint: X A^H = B <=> A X^H = B^H)
        x = _mH(_lu_solve(lu, perm, _mH(b), not adjoint))
    return x[..., 0] if vector else x


def _is_vector_rhs(A, B):
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lowering(aten.linalg_lu_factor_ex.default, eager=_CHECKED)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg_lu_factor_ex: pivot=False is not supported by XLA's LU on pjrt")
    lu, piv, _, info = _lu(A)
    return lu, piv, info


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    perm = _pivots_to_perm(pivots, LU.shape[-1])
    return _solve_with(LU, perm, B, left, adjoint, False)


@lowering(aten._linalg_solve_ex.default, eager=_CHECKED)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, piv, perm, info = _lu(A)
    vector = _is_vector_rhs(A, B)
    return _solve_with(lu, perm, B, left, False, vector), lu, piv, info


@lowering(aten.linalg_inv_ex.default, eager=_CHECKED)
def linalg_inv_ex(A, *, check_errors=False):
    lu, _, perm, info = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye), info


def _unpack_lu(lu, perm, m, n):
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    # A[perm] = L U  =>  A = P L U with P[perm[i], i] = 1
    P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu.dtype), -1, -2)
    return P, L, U


@lowering(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg_lu: pivot=False is not supported by XLA's LU on pjrt")
    lu, _, perm, _ = _lu(A)
    return _unpack_lu(lu, perm, A.shape[-2], A.shape[-1])


@lowering(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    perm = _pivots_to_perm(LU_pivots, m)
    P, L, U = _unpack_lu(LU_data, perm, m, n)
    if not unpack_data:
        L = U = _empty(LU_data.dtype)
    if not unpack_pivots:
        P = _empty(LU_data.dtype)
    return P, L, U


def _lu_det_parts(A):
    # torch factors A^H (a free transpose of a row-major A) for real inputs; the LU and
    # pivots it returns (and its backward reads) are those of A^T
    n = A.shape[-1]
    if A.size == 0:  # no LAPACK call, as CPU makes none: a 0 x 0 float16 matrix's determinant is 1 there,
        # where LAPACK, which has no float16 kernels, failed when the executable compiled
        lu, piv = A if jnp.iscomplexobj(A) else _mT(A), jnp.zeros(A.shape[:-2] + (n,), I32)
        return lu, piv, _diag(lu), jnp.ones(A.shape[:-2], _real_dtype(A.dtype))
    lu, piv, _, _ = _lu(A if jnp.iscomplexobj(A) else _mT(A))
    swaps = jnp.sum(piv != jnp.arange(1, n + 1, dtype=I32), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(_real_dtype(A.dtype))
    return lu, piv, _diag(lu), parity


@lowering(aten._linalg_det.default)
def _linalg_det(A):
    lu, piv, d, parity = _lu_det_parts(A)
    return jnp.prod(d, axis=-1) * parity.astype(A.dtype), lu, piv


@lowering(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    lu, piv, d, parity = _lu_det_parts(A)
    logabsdet = jnp.sum(jnp.log(jnp.abs(d)), axis=-1)
    # jnp.sign is d / |d| for complex d and 0 at 0: a singular matrix's sign is 0, as on CPU
    sign = jnp.prod(jnp.sign(d), axis=-1) * parity.astype(d.dtype)
    return sign.astype(A.dtype), logabsdet, lu, piv


# --------------------------------------------------------------- triangular solves


@lowering(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    A_b, B_b = _broadcast_batch(A, self)
    x = lxl.triangular_solve(A_b, B_b, left_side=True, lower=not upper, transpose_a=transpose,
                             unit_diagonal=unitriangular)
    return x, A_b


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    # CPU solves in A's dtype, B cast to it (float32 A, float64 B: float32); JAX refuses two dtypes
    A_b, B_b = _broadcast_batch(self, B.astype(self.dtype))
    return lxl.triangular_solve(A_b, B_b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


# ------------------------------------------------------------ QR, Householder


@lowering(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    q, r = jnp.linalg.qr(A, mode=mode)
    return q, r


@lowering(aten.geqrf.default)
def geqrf(self):
    h, tau = jnp.linalg.qr(self, mode="raw")  # numpy's raw mode: reflectors transposed
    return _mT(h), tau


@lowering(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    return lxl.householder_product(input, tau)


@lowering(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    """input3 multiplied by the Q of geqrf's (self, tau=input2)."""
    return lxl.ormqr(self, input2, input3, left=left, transpose=transpose)


# ------------------------------------------------------------- spectral decompositions


@lowering(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(A, UPLO=UPLO.upper(), symmetrize_input=False)  # torch takes "l" and "u" too
    return w, (v if compute_v else _empty(A.dtype))


def _singular_values(A):
    """A's singular values. JAX's LAPACK call declares the full n x n V^H of an m x n input even when
    it computes no vectors (2^40 elements for torch's test of a 3 x 2^20 matrix: out of memory),
    so a matrix much longer one way than the other goes first through the QR of its tall form,
    whose square R has the same singular values (what LAPACK's gesdd does inside)."""
    m, n = A.shape[-2:]
    if min(m, n) and max(m, n) > 2 * min(m, n):
        tall = A if m > n else jnp.conj(jnp.swapaxes(A, -1, -2))
        A = jnp.linalg.qr(tall, mode="r")
    return jnp.linalg.svd(A, compute_uv=False)


@lowering(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return _empty(A.dtype), _singular_values(A), _empty(A.dtype)
    u, s, vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


def _complex_of(dtype):
    """The complex dtype of eig's results, as c10's toComplexType gives it: none for an integer or bool
    input (CPU's _linalg_eigvals raises this before its dtype dispatch, so the dtype table, which learns
    the ops an error passes through, has no entry for it)."""
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise RuntimeError(f"Unknown Complex ScalarType for {c10_name(to_torch(dtype))}")
    _lapack_dtype(dtype, "eig")
    return np.dtype(np.complex128) if np.dtype(dtype) in (np.float64, np.complex128) else np.dtype(np.complex64)


def _lapack_dtype(dtype, name: str) -> None:
    """Refuse a float16 or bfloat16 input of a lowering that hands it to LAPACK as it is: JAX traces it but
    fails when the executable compiles (in fused eager, when its region runs: "failed when its region ran"),
    past eager's checks; refused here, at trace time, CPU's call names the error (eigvals', lstsq's)."""
    if np.dtype(dtype) in (np.dtype(np.float16), np.dtype(jnp.bfloat16)):
        raise TypeError(f"{name}: LAPACK has no {np.dtype(dtype).name} kernels")


@lowering(aten.linalg_eig.default,
          eager="eager/linalg_checks.py: CPU's check that the input is finite (on the host), then the lowering")
def linalg_eig(self):
    w, v = jnp.linalg.eig(self)  # LAPACK geev on CPU: unit-norm vectors, as torch
    c = _complex_of(self.dtype)
    return w.astype(c), v.astype(c)


@lowering(aten._linalg_eigvals.default)
def _linalg_eigvals(self):
    return jnp.linalg.eigvals(self).astype(_complex_of(self.dtype))


@lowering(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    # in double precision: jsl.expm has no half types, and its single-precision Pade
    # approximant is less accurate than CPU's Taylor one (relative errors of 2e-6 at 1e6)
    x = self.astype(jnp.complex128 if jnp.iscomplexobj(self) else jnp.float64)
    flat = x.reshape((-1,) + x.shape[-2:])
    return jax.vmap(jsl.expm)(flat).reshape(x.shape).astype(self.dtype)


# ------------------------------------------------------------------- least squares


@lowering(aten.linalg_lstsq.default)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """Minimum-norm least squares through the SVD; outputs shaped as torch's `driver`."""
    driver = driver or "gelsy"  # torch's default off CUDA
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):  # pjrt accepted any name (test_linalg_lstsq_input_checks)
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if self.dtype != b.dtype:  # CPU refuses rather than promotes (pjrt solved in input's dtype)
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's "
                           f"dtype {c10_name(to_torch(self.dtype))} and other's dtype {c10_name(to_torch(b.dtype))}")
    _lapack_dtype(self.dtype, "lstsq")
    A = self
    m, n = A.shape[-2:]
    vector = b.ndim == A.ndim - 1
    B = b[..., None] if vector else b
    A, B = _broadcast_batch(A, B)
    real = _real_dtype(A.dtype)
    if rcond is None:
        rcond = float(np.finfo(real).eps) * max(m, n)
    u, s, vh = jnp.linalg.svd(A, full_matrices=False)
    keep = s > rcond * s[..., :1]
    s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(A.dtype)
    x = _matmul(_mH(vh), s_inv[..., None] * _matmul(_mH(u), B))
    rank = jnp.sum(keep, axis=-1).astype(I64)
    residuals = _empty(real)
    if m > n and driver != "gelsy":
        residuals = jnp.sum(jnp.abs(_matmul(A, x) - B) ** 2, axis=-2).astype(real)
    sv = s if driver in ("gelsd", "gelss") else _empty(real)
    if driver == "gels":
        rank = _empty(I64)
    if vector:
        x = x[..., 0]
    return x, residuals, rank, sv


# --------------------------------------------------------------------------- cross


@lowering(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    if self.dtype != other.dtype:  # CPU's cross kernel does not promote
        raise RuntimeError(f"expected scalar type {c10_name(to_torch(self.dtype))} but found "
                           f"{c10_name(to_torch(other.dtype))}")
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    a, b = jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape)
    return jnp.cross(a, b, axis=dim).astype(jnp.result_type(self, other))
