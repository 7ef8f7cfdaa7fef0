"""Lowerings: LDL^T factorization with Bunch-Kaufman pivoting, and its solve.

`linalg_ldl_factor_ex` follows LAPACK's unblocked `?sytf2`/`?hetf2` with uplo='L' (what CPU
torch calls through `?sytrf`), step for step, so its pivots, its compact LD and its info are
CPU's: a column is eliminated with a 1x1 pivot or, when that would grow the entries too much,
a 2x2 pivot; rows and columns are interchanged in the trailing matrix only (the columns of L
already computed stay in place), and pivots are 1-based, negative for a 2x2 block.
`linalg_ldl_solve` follows `?sytrs`/`?hetrs`. `hermitian=True` conjugates where the Hermitian
routines do (and keeps D's diagonal real); for real dtypes both are the same.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .linalg import _broadcast_batch, lowering

aten = torch.ops.aten

ALPHA = (1 + math.sqrt(17)) / 8  # Bunch-Kaufman's growth bound


def _abs1(x):
    """LAPACK's pivot magnitude: |re| + |im| for complex (CABS1), |x| for real."""
    return jnp.abs(x.real) + jnp.abs(x.imag) if jnp.iscomplexobj(x) else jnp.abs(x)


def _factor_one(a, hermitian: bool):
    n = a.shape[-1]
    herm = hermitian and jnp.iscomplexobj(a)
    conj = jnp.conj if herm else (lambda x: x)
    idx = jnp.arange(n)
    real_diag = (lambda w: jnp.where(jnp.eye(n, dtype=bool), w.real.astype(w.dtype), w)) if herm else (lambda w: w)
    diag_abs = (lambda x: jnp.abs(x.real)) if herm else _abs1
    w = real_diag(jnp.tril(a) + conj(jnp.tril(a, -1)).T)  # the lower triangle, as a full symmetric matrix

    def step(state):
        k, w, piv, info = state
        col = _abs1(w[:, k])
        absakk = diag_abs(w[k, k])
        colmag = jnp.where(idx > k, col, -1)
        imax = jnp.argmax(colmag)  # the first largest, as IDAMAX
        colmax = jnp.maximum(colmag[imax], 0)
        # the largest off-diagonal magnitude in row/column imax of the trailing matrix (lower part)
        rowmax = jnp.maximum(jnp.max(jnp.where((idx >= k) & (idx < imax), _abs1(w[imax, :]), -1)),
                             jnp.max(jnp.where(idx > imax, _abs1(w[:, imax]), -1)))
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        no_swap = singular | (absakk >= ALPHA * colmax)
        no_swap = no_swap | (absakk >= ALPHA * colmax * (colmax / rowmax))
        one_by_one = no_swap | (diag_abs(w[imax, imax]) >= ALPHA * rowmax)
        kp = jnp.where(no_swap, k, imax)
        kstep = jnp.where(one_by_one, 1, 2)
        kk = k + kstep - 1
        # interchange rows and columns kk and kp of the trailing matrix
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trailing = (idx[:, None] >= k) & (idx[None, :] >= k)
        w = jnp.where(trailing, w[perm][:, perm], w)

        # 1x1 pivot: A22 -= x x^T / d, the column scaled by 1/d
        d11 = 1 / (w[k, k].real if herm else w[k, k])
        x = jnp.where(idx > k, w[:, k], 0)
        one = w + jnp.where((idx[:, None] > k) & (idx[None, :] > k), x[:, None] * (-d11 * conj(x))[None, :], 0)
        one = one.at[:, k].set(jnp.where(idx > k, x * d11, w[:, k]))

        # 2x2 pivot on columns k, k+1
        below = idx > k + 1
        c0 = jnp.where(below, w[:, k], 0)
        c1 = jnp.where(below, w[:, k + 1], 0)
        if herm:
            dabs = jnp.abs(w[k + 1, k])
            e11, e22 = w[k + 1, k + 1].real / dabs, w[k, k].real / dabs
            d21 = w[k + 1, k] / dabs
            dd = (1 / (e11 * e22 - 1)) / dabs
            wk = dd * (e11 * c0 - d21 * c1)
            wkp1 = dd * (e22 * c1 - jnp.conj(d21) * c0)
        else:
            d21 = w[k + 1, k]
            e11, e22 = w[k + 1, k + 1] / d21, w[k, k] / d21
            d21 = (1 / (e11 * e22 - 1)) / d21
            wk = d21 * (e11 * c0 - c1)
            wkp1 = d21 * (e22 * c1 - c0)
        block = below[:, None] & below[None, :]
        two = jnp.where(block, w - c0[:, None] * conj(wk)[None, :] - c1[:, None] * conj(wkp1)[None, :], w)
        two = two.at[:, k].set(jnp.where(below, wk, w[:, k])).at[:, k + 1].set(jnp.where(below, wkp1, w[:, k + 1]))

        updated = jnp.where(singular, w, jnp.where(kstep == 1, one, two))
        updated = real_diag(jnp.tril(updated) + conj(jnp.tril(updated, -1)).T)  # symmetric again, exactly
        pivot = (kp + 1).astype(jnp.int32)
        piv = jnp.where(kstep == 1, piv.at[k].set(pivot), piv.at[k].set(-pivot).at[k + 1].set(-pivot))
        info = jnp.where(singular & (info == 0), (k + 1).astype(jnp.int32), info)
        return k + kstep, updated, piv, info

    _, w, piv, info = lax.while_loop(lambda s: s[0] < n, step,
                                     (jnp.int32(0), w, jnp.zeros((n,), jnp.int32), jnp.int32(0)))
    return jnp.tril(w), piv, info


@lowering(aten.linalg_ldl_factor_ex.default,
          eager="eager/linalg_checks.py: the lowering, then torch's _linalg_check_errors of its info when check_errors=True")
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    n = self.shape[-1]
    batch = self.shape[:-2]
    if n == 0 or math.prod(batch) == 0:
        return self, jnp.zeros((*batch, n), jnp.int32), jnp.zeros(batch, jnp.int32)
    ld, piv, info = jax.vmap(lambda a: _factor_one(a, hermitian))(self.reshape(-1, n, n))
    return ld.reshape(self.shape), piv.reshape(*batch, n), info.reshape(batch)


def _solve_one(ld, piv, b, hermitian: bool):
    n = ld.shape[-1]
    herm = hermitian and jnp.iscomplexobj(ld)
    conj = jnp.conj if herm else (lambda x: x)
    idx = jnp.arange(n)

    def swap(b, i, j):
        perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return b[perm]

    def forward(state):  # L D X = B
        k, b = state
        two = piv[k] < 0
        kp = jnp.abs(piv[k]) - 1
        b = swap(b, jnp.where(two, k + 1, k), kp)
        below = (idx > jnp.where(two, k + 1, k))[:, None]  # a 2x2 block's column k holds D below its diagonal
        b = b - jnp.where(below, ld[:, k][:, None] * b[k][None, :], 0)
        b = jnp.where(two, b - jnp.where(below, ld[:, k + 1][:, None] * b[k + 1][None, :], 0), b)
        # 1x1: divide row k by d
        d = ld[k, k].real if herm else ld[k, k]
        one = b.at[k].set((1 / d) * b[k])  # as LAPACK scales: 1/0 is nan for complex, inf for real
        # 2x2: the block [[akm1, conj(akm1k)], [akm1k, ak]] solved in LAPACK's scaled form
        k1 = jnp.minimum(k + 1, n - 1)  # in range when the last pivot is 1x1 (the block is not taken)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / conj(akm1k)
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = b[k] / conj(akm1k)
        bk = b[k1] / akm1k
        block = b.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return k + jnp.where(two, 2, 1), jnp.where(two, block, one)

    def backward(state):  # L^T X = B (L^H when Hermitian)
        k, b = state
        two = (k > 0) & (piv[k] < 0)
        lower = (idx > k)[:, None]
        b = b.at[k].add(-jnp.sum(jnp.where(lower, conj(ld[:, k])[:, None] * b, 0), axis=0))
        prev = jnp.maximum(k - 1, 0)
        b = jnp.where(two, b.at[prev].add(-jnp.sum(jnp.where(lower, conj(ld[:, prev])[:, None] * b, 0), axis=0)), b)
        b = swap(b, k, jnp.abs(piv[k]) - 1)
        return k - jnp.where(two, 2, 1), b

    _, b = lax.while_loop(lambda s: s[0] < n, forward, (jnp.int32(0), b))
    _, b = lax.while_loop(lambda s: s[0] >= 0, backward, (jnp.int32(n - 1), b))
    return b


@lowering(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    LD, B = _broadcast_batch(LD, B)
    batch = LD.shape[:-2]
    n, k = B.shape[-2], B.shape[-1]
    pivots = jnp.broadcast_to(pivots, (*batch, n))
    if n == 0 or k == 0 or math.prod(batch) == 0:
        return jnp.zeros(B.shape, B.dtype)
    dtype = jnp.result_type(LD.dtype, B.dtype)
    solve = jax.vmap(lambda ld, p, b: _solve_one(ld, p, b, hermitian))
    out = solve(LD.reshape(-1, n, n).astype(dtype), pivots.reshape(-1, n), B.reshape(-1, n, k).astype(dtype))
    return out.reshape(B.shape).astype(np.dtype(B.dtype))
