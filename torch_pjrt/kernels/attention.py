"""Flash attention (forward and backward), causal or not, with grouped-query heads.

Shapes: q [B, Hq, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], Hq a multiple of Hkv (GQA:
query head h reads key/value head h // (Hq // Hkv)). `is_causal` masks as torch's SDPA
does: query i sees keys j <= i (top-left aligned when L != S). Returns (out, logsumexp).

Forward: one program per (batch, head, query block); it streams key/value blocks through
on-chip memory with the online softmax (running max m, running sum l), never writing the
L x S score matrix. Backward (FlashAttention-2): one kernel per key block accumulates dK
and dV over query blocks, one per query block accumulates dQ over key blocks, both
recomputing probabilities from the saved logsumexp. Ragged L and S are padded to whole
blocks; padded keys are masked, padded queries sliced off (and masked in the backward).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from .op import kernel
from .platforms import pallas_call
from .tiling import accumulator, pad_rows, row_block, triton_friendly


def attention_reference(q, k, v, is_causal: bool = False, scale: float | None = None):
    """Plain attention in JAX: (out, logsumexp), the oracle of the kernel."""
    acc = accumulator(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rep = q.shape[1] // k.shape[1]
    k = jnp.repeat(k, rep, axis=1).astype(acc)
    v = jnp.repeat(v, rep, axis=1).astype(acc)
    s = jnp.einsum("bhld,bhsd->bhls", q.astype(acc), k) * scale
    if is_causal:
        L, S = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((L, S), bool)), s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    return jnp.einsum("bhls,bhsd->bhld", p, v).astype(q.dtype), lse


def _mask(rows, cols, kv_len: int, q_len: int | None, causal: bool):
    """Which (query row, key column) pairs take part: real keys, real queries (None: any), causal."""
    ok = cols[None, :] < kv_len
    if q_len is not None:
        ok &= rows[:, None] < q_len
    if causal:
        ok &= cols[None, :] <= rows[:, None]
    return ok


def _dot(a, b, acc):
    return jnp.dot(a, b, preferred_element_type=acc)


def _forward_block(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, q_len, kv_len, block_k):
    block_q = q_ref.shape[0]
    acc = accumulator(q_ref.dtype)
    i = pl.program_id(2)
    q = q_ref[...].astype(acc) * scale
    rows = i * block_q + jax.lax.iota(jnp.int32, block_q)
    n_k = k_ref.shape[0] // block_k
    if causal:  # key blocks wholly right of the diagonal contribute nothing
        n_k = jnp.minimum(n_k, ((i + 1) * block_q + block_k - 1) // block_k)

    def step(j, carry):
        m, l, o = carry
        k = k_ref[pl.ds(j * block_k, block_k), :].astype(acc)
        v = v_ref[pl.ds(j * block_k, block_k), :].astype(acc)
        cols = j * block_k + jax.lax.iota(jnp.int32, block_k)
        s = jnp.where(_mask(rows, cols, kv_len, None, causal), _dot(q, k.T, acc), -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[:, None])
        correction = jnp.exp(m - m_new)
        return m_new, l * correction + p.sum(axis=-1), o * correction[:, None] + _dot(p, v, acc)

    init = (jnp.full((block_q,), -jnp.inf, acc), jnp.zeros((block_q,), acc), jnp.zeros((block_q, v_ref.shape[-1]), acc))
    m, l, o = jax.lax.fori_loop(0, n_k, step, init)
    o_ref[...] = (o / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = (m + jnp.log(l)).astype(lse_ref.dtype)


def _probabilities_and_score_grads(q, k, v, do, lse, delta, mask, scale, acc):
    """A (query block, key block) tile of the backward: P recomputed from the saved logsumexp,
    and dS = P * (dO V^T - D)."""
    p = jnp.where(mask, jnp.exp(_dot(q * scale, k.T, acc) - lse[:, None]), 0.0)
    return p, p * (_dot(do, v.T, acc) - delta[:, None])


def _dkdv_block(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, scale, causal, q_len, kv_len,
                block_q):
    block_k = k_ref.shape[0]
    acc = accumulator(q_ref.dtype)
    j = pl.program_id(2)
    k = k_ref[...].astype(acc)
    v = v_ref[...].astype(acc)
    cols = j * block_k + jax.lax.iota(jnp.int32, block_k)
    n_q = q_ref.shape[0] // block_q
    start = (j * block_k) // block_q if causal else 0  # query blocks above the diagonal see none of these keys

    def step(i, carry):
        dk, dv = carry
        q = q_ref[pl.ds(i * block_q, block_q), :].astype(acc)
        do = do_ref[pl.ds(i * block_q, block_q), :].astype(acc)
        lse = lse_ref[pl.ds(i * block_q, block_q)].astype(acc)
        delta = delta_ref[pl.ds(i * block_q, block_q)].astype(acc)
        rows = i * block_q + jax.lax.iota(jnp.int32, block_q)
        p, ds = _probabilities_and_score_grads(q, k, v, do, lse, delta, _mask(rows, cols, kv_len, q_len, causal),
                                               scale, acc)
        return dk + _dot(ds.T, q, acc) * scale, dv + _dot(p.T, do, acc)

    dk, dv = jax.lax.fori_loop(start, n_q, step, (jnp.zeros(k.shape, acc), jnp.zeros(v.shape, acc)))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_block(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, causal, q_len, kv_len, block_k):
    block_q = q_ref.shape[0]
    acc = accumulator(q_ref.dtype)
    i = pl.program_id(2)
    q = q_ref[...].astype(acc)
    do = do_ref[...].astype(acc)
    lse = lse_ref[...].astype(acc)
    delta = delta_ref[...].astype(acc)
    rows = i * block_q + jax.lax.iota(jnp.int32, block_q)
    n_k = k_ref.shape[0] // block_k
    if causal:
        n_k = jnp.minimum(n_k, ((i + 1) * block_q + block_k - 1) // block_k)

    def step(j, dq):
        k = k_ref[pl.ds(j * block_k, block_k), :].astype(acc)
        v = v_ref[pl.ds(j * block_k, block_k), :].astype(acc)
        cols = j * block_k + jax.lax.iota(jnp.int32, block_k)
        _, ds = _probabilities_and_score_grads(q, k, v, do, lse, delta, _mask(rows, cols, kv_len, q_len, causal),
                                               scale, acc)
        return dq + _dot(ds, k, acc) * scale

    dq_ref[...] = jax.lax.fori_loop(0, n_k, step, jnp.zeros(q.shape, acc)).astype(dq_ref.dtype)


class _Layout:
    """Padded sizes and block specs of one attention call."""

    def __init__(self, q, k, v, block_q: int, block_k: int):
        self.B, self.Hq, self.L, self.D = q.shape
        self.Hkv, self.S, self.Dv = k.shape[1], k.shape[2], v.shape[-1]
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"flash_attention: query, key and value must have one dtype, got {q.dtype}, {k.dtype} "
                             f"and {v.dtype}")
        if self.Hq % self.Hkv:
            raise ValueError(f"flash_attention: query heads ({self.Hq}) must be a multiple of key/value heads ({self.Hkv})")
        self.rep = self.Hq // self.Hkv
        self.bq = row_block(self.L, block_q, minimum=16)
        self.bk = row_block(self.S, block_k, minimum=16)
        self.Lp = -(-self.L // self.bq) * self.bq
        self.Sp = -(-self.S // self.bk) * self.bk

    def q_block(self, width):
        return pl.BlockSpec((None, None, self.bq, width), lambda b, h, i: (b, h, i, 0))

    def q_whole(self, width):
        return pl.BlockSpec((None, None, self.Lp, width), lambda b, h, j: (b, h, 0, 0))

    def kv_whole(self, width):
        rep = self.rep
        return pl.BlockSpec((None, None, self.Sp, width), lambda b, h, i: (b, h // rep, 0, 0))

    def kv_block(self, width, per_query_head=False):
        rep = 1 if per_query_head else self.rep
        return pl.BlockSpec((None, None, self.bk, width), lambda b, h, j: (b, h // rep, j, 0))

    def row_stats(self, whole):
        if whole:
            return pl.BlockSpec((None, None, self.Lp), lambda b, h, j: (b, h, 0))
        return pl.BlockSpec((None, None, self.bq), lambda b, h, i: (b, h, i))


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                           scale: float | None = None, *, block_q: int = 64, block_k: int = 64
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Hq, L, Dv], logsumexp [B, Hq, L] in float32, float64 for float64 inputs)."""
    lay = _Layout(q, k, v, block_q, block_k)
    statics = dict(scale=_scale(q, scale), causal=is_causal, q_len=lay.L, kv_len=lay.S, block_k=lay.bk)
    out, lse = pallas_call(
        functools.partial(_forward_block, **statics),
        (jax.ShapeDtypeStruct((lay.B, lay.Hq, lay.Lp, lay.Dv), q.dtype),
         jax.ShapeDtypeStruct((lay.B, lay.Hq, lay.Lp), accumulator(q.dtype))),
        grid=(lay.B, lay.Hq, lay.Lp // lay.bq),
        in_specs=[lay.q_block(lay.D), lay.kv_whole(lay.D), lay.kv_whole(lay.Dv)],
        out_specs=(lay.q_block(lay.Dv), lay.row_stats(whole=False)),
    )(pad_rows(q, lay.bq, axis=2), pad_rows(k, lay.bk, axis=2), pad_rows(v, lay.bk, axis=2))
    return out[:, :, : lay.L], lse[:, :, : lay.L]


def flash_attention_backward(q, k, v, is_causal: bool = False, scale: float | None = None, *, outputs, grad_outputs,
                             block_q: int = 64, block_k: int = 64):
    """(dq, dk, dv) from the saved (out, logsumexp) and the gradients of both."""
    out, lse = outputs
    do, dlse = grad_outputs
    lay = _Layout(q, k, v, block_q, block_k)
    acc = accumulator(q.dtype)
    # FlashAttention-2's D = rowsum(dO * O). A gradient g of logsumexp adds p * g to dS
    # (d lse / d s = p), the same as lowering D by g, so the kernels need no extra input.
    delta = jnp.sum(do.astype(acc) * out.astype(acc), axis=-1) - dlse.astype(acc)
    qp, dop = pad_rows(q, lay.bq, axis=2), pad_rows(do, lay.bq, axis=2)
    lsep, deltap = pad_rows(lse, lay.bq, axis=2), pad_rows(delta, lay.bq, axis=2)
    kp, vp = pad_rows(k, lay.bk, axis=2), pad_rows(v, lay.bk, axis=2)
    common = dict(scale=_scale(q, scale), causal=is_causal, q_len=lay.L, kv_len=lay.S)
    # dK, dV per query head (a GQA group's heads are summed below)
    dk, dv = pallas_call(
        functools.partial(_dkdv_block, block_q=lay.bq, **common),
        (jax.ShapeDtypeStruct((lay.B, lay.Hq, lay.Sp, lay.D), acc),
         jax.ShapeDtypeStruct((lay.B, lay.Hq, lay.Sp, lay.Dv), acc)),
        grid=(lay.B, lay.Hq, lay.Sp // lay.bk),
        in_specs=[lay.q_whole(lay.D), lay.kv_block(lay.D), lay.kv_block(lay.Dv), lay.q_whole(lay.Dv),
                  lay.row_stats(whole=True), lay.row_stats(whole=True)],
        out_specs=(lay.kv_block(lay.D, per_query_head=True), lay.kv_block(lay.Dv, per_query_head=True)),
    )(qp, kp, vp, dop, lsep, deltap)
    dq = pallas_call(
        functools.partial(_dq_block, block_k=lay.bk, **common),
        jax.ShapeDtypeStruct((lay.B, lay.Hq, lay.Lp, lay.D), q.dtype),
        grid=(lay.B, lay.Hq, lay.Lp // lay.bq),
        in_specs=[lay.q_block(lay.D), lay.kv_whole(lay.D), lay.kv_whole(lay.Dv), lay.q_block(lay.Dv),
                  lay.row_stats(whole=False), lay.row_stats(whole=False)],
        out_specs=lay.q_block(lay.D),
    )(qp, kp, vp, dop, lsep, deltap)

    def per_kv_head(g, width):
        return g[:, :, : lay.S].reshape(lay.B, lay.Hkv, lay.rep, lay.S, width).sum(axis=2)

    return dq[:, :, : lay.L], per_kv_head(dk, lay.D).astype(k.dtype), per_kv_head(dv, lay.Dv).astype(v.dtype)


flash_attention_kernel = kernel("pjrt_kernels::flash_attention", reference=attention_reference,
                                backward=flash_attention_backward,
                                tune={"block_q": (64, 128, 32), "block_k": (64, 128, 32)},
                                supports=lambda platform, q, k, v, *a, **kw: triton_friendly(platform, q.shape[-1],
                                                                                             v.shape[-1]))(_flash_forward)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Attention output [B, Hq, L, Dv] (the logsumexp is kept for the backward only)."""
    return flash_attention_kernel(q, k, v, is_causal, scale)[0]
