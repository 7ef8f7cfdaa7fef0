"""Grouped matrix multiply for mixture-of-experts, with torch._grouped_mm's semantics.

`offs` (int32) holds the cumulative end of each group along the grouped dimension:
  a [M, K]    x b [G, K, N] -> [M, N]     rows offs[g-1]:offs[g] of a use b[g] (MoE experts)
  a [M, Ktot] x b [Ktot, N] -> [G, M, N]  group g contracts over K-slice g (the weight gradient)
  a [G, M, K] x b [K, Ntot] -> [M, Ntot]  columns of group g come from a[g]
  a [G, M, K] x b [G, K, N] -> [G, M, N]  a plain batched matmul (no offs)
Rows (or columns, or K) past offs[-1] belong to no group and give zeros.

The Pallas kernel covers the MoE case: one program per (row tile, column tile) loops over
only the groups whose rows intersect its tile, masking rows of other groups. The other
layouts (they appear in the backward) use the JAX reference, which XLA fuses well.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from .op import kernel
from .platforms import pallas_call
from .tiling import accumulator, pad_rows, row_block, triton_friendly


def _group_of(index, offs):
    """Group id of each position along the grouped dimension (G where past the last offset)."""
    return jnp.searchsorted(offs, index, side="right")


def _check_dtypes(a, b) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"grouped_mm: both operands must have one dtype, got {a.dtype} and {b.dtype}")


def grouped_mm_reference(a, b, offs=None):
    _check_dtypes(a, b)
    acc = accumulator(a.dtype)
    out_dtype = a.dtype
    a, b = a.astype(acc), b.astype(acc)
    if a.ndim == 3 and b.ndim == 3:
        return jnp.matmul(a, b).astype(out_dtype)
    offs = offs.astype(jnp.int32)
    G = offs.shape[0]
    if a.ndim == 2 and b.ndim == 3:
        gid = _group_of(jnp.arange(a.shape[0]), offs)
        per_group = jnp.einsum("mk,gkn->gmn", a, b)
        onehot = (gid[None, :] == jnp.arange(G)[:, None]).astype(acc)  # [G, M]
        return jnp.einsum("gm,gmn->mn", onehot, per_group).astype(out_dtype)
    if a.ndim == 2 and b.ndim == 2:
        gid = _group_of(jnp.arange(a.shape[1]), offs)
        onehot = (gid[None, :] == jnp.arange(G)[:, None]).astype(acc)  # [G, K]
        return jnp.einsum("mk,gk,kn->gmn", a, onehot, b).astype(out_dtype)
    gid = _group_of(jnp.arange(b.shape[1]), offs)  # a [G, M, K], b [K, Ntot]
    onehot = (gid[None, :] == jnp.arange(G)[:, None]).astype(acc)  # [G, N]
    return jnp.einsum("gmk,kn,gn->mn", a, b, onehot).astype(out_dtype)


def _tile(a_ref, b_ref, offs_ref, o_ref, *, groups):
    tm = a_ref.shape[0]
    acc = accumulator(a_ref.dtype)
    i = pl.program_id(0)
    rows = i * tm + jax.lax.iota(jnp.int32, tm)
    offs = offs_ref[...]
    # groups whose [start, end) meets this tile's rows: skip the rest
    first = jnp.sum(offs <= i * tm).astype(jnp.int32)
    last = jnp.minimum(jnp.sum(offs < (i + 1) * tm).astype(jnp.int32) + 1, groups)
    a = a_ref[...].astype(acc)

    def step(g, out):
        start = jnp.where(g == 0, 0, offs_ref[jnp.maximum(g - 1, 0)])
        end = offs_ref[g]
        mine = (rows >= start) & (rows < end)
        part = jnp.dot(a, b_ref[g].astype(acc), preferred_element_type=acc)
        return out + jnp.where(mine[:, None], part, 0.0)

    o_ref[...] = jax.lax.fori_loop(first, last, step, jnp.zeros(o_ref.shape, acc)).astype(o_ref.dtype)


def _moe_layout(a, b, offs):
    return a.ndim == 2 and b.ndim == 3 and offs is not None


def _backward(a, b, offs=None, *, outputs, grad_outputs, block_m=64, block_n=128):
    g = grad_outputs[0]
    if not _moe_layout(a, b, offs):
        _, pull = jax.vjp(lambda x, y: grouped_mm_reference(x, y, offs), a, b)
        da, db = pull(g)
        return da, db, None
    da = _moe_forward(g, jnp.swapaxes(b, 1, 2), offs, block_m=block_m, block_n=block_n)
    db = grouped_mm_reference(a.T, g, offs)  # [M, K]^T x [M, N] grouped over M: [G, K, N]
    return da, db.astype(b.dtype), None


def _moe_forward(a, b, offs, *, block_m, block_n):
    _check_dtypes(a, b)
    M, K = a.shape
    G, _, N = b.shape
    tm, tn = row_block(M, block_m, minimum=16), row_block(N, block_n, minimum=16)
    ap, bp = pad_rows(a, tm), pad_rows(b, tn, axis=2)
    out = pallas_call(
        functools.partial(_tile, groups=G),
        jax.ShapeDtypeStruct((ap.shape[0], bp.shape[2]), a.dtype),
        grid=(ap.shape[0] // tm, bp.shape[2] // tn),
        in_specs=[pl.BlockSpec((tm, K), lambda i, j: (i, 0)), pl.BlockSpec((G, K, tn), lambda i, j: (0, 0, j)),
                  pl.BlockSpec((G,), lambda i, j: (0,))],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
    )(ap, bp, offs.astype(jnp.int32))
    return out[:M, :N]


@kernel("pjrt_kernels::grouped_mm", reference=grouped_mm_reference, backward=_backward,
        tune={"block_m": (64, 128, 32), "block_n": (128, 64, 256)},
        supports=lambda platform, a, b, offs=None: not _moe_layout(a, b, offs)
        or triton_friendly(platform, a.shape[-1], b.shape[-1], b.shape[0]))  # K, N (whole in the backward), G
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *, block_m: int = 64,
               block_n: int = 128) -> torch.Tensor:
    """torch._grouped_mm(a, b, offs) (see the module docstring for the layouts)."""
    if not _moe_layout(a, b, offs):
        return grouped_mm_reference(a, b, offs)
    return _moe_forward(a, b, offs, block_m=block_m, block_n=block_n)
