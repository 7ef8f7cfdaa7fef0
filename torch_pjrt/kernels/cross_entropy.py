"""Fused softmax cross-entropy: per-row loss = logsumexp(logits) - logits[target].

The forward streams each block of rows through the vocabulary in chunks with an online
logsumexp, picking the target's logit on the way, so neither the softmax nor a one-hot
matrix is ever written. The backward writes d logits = (softmax - onehot) * grad in one
pass from the saved logsumexp (plus softmax * the logsumexp output's own gradient). Rows whose target is `ignore_index` get loss 0 and zero
gradient, as in torch.nn.functional.cross_entropy.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from .op import kernel
from .platforms import pallas_call
from .tiling import accumulator, pad_rows, row_block


def cross_entropy_reference(logits, target, ignore_index: int = -100):
    acc = accumulator(logits.dtype)
    x = logits.astype(acc)
    lse = jax.nn.logsumexp(x, axis=-1)
    valid = target != ignore_index
    picked = jnp.take_along_axis(x, jnp.where(valid, target, 0)[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return jnp.where(valid, lse - picked, 0.0).astype(logits.dtype), lse


def _forward_block(x_ref, t_ref, loss_ref, lse_ref, *, ignore_index, vocab, block_v):
    acc = accumulator(x_ref.dtype)
    rows = x_ref.shape[0]
    target = t_ref[...]

    def step(j, carry):
        m, l, picked = carry
        cols = j * block_v + jax.lax.iota(jnp.int32, block_v)
        x = x_ref[:, pl.ds(j * block_v, block_v)].astype(acc)
        x = jnp.where(cols[None, :] < vocab, x, -jnp.inf)
        m_new = jnp.maximum(m, x.max(axis=-1))
        l = l * jnp.exp(m - m_new) + jnp.exp(x - m_new[:, None]).sum(axis=-1)
        picked = picked + jnp.where(cols[None, :] == target[:, None], x, 0.0).sum(axis=-1)
        return m_new, l, picked

    init = (jnp.full((rows,), -jnp.inf, acc), jnp.zeros((rows,), acc), jnp.zeros((rows,), acc))
    m, l, picked = jax.lax.fori_loop(0, x_ref.shape[1] // block_v, step, init)
    lse = m + jnp.log(l)
    loss_ref[...] = jnp.where(target != ignore_index, lse - picked, 0.0).astype(loss_ref.dtype)
    lse_ref[...] = lse.astype(lse_ref.dtype)


def _backward_block(x_ref, t_ref, lse_ref, g_ref, glse_ref, dx_ref, *, ignore_index, block_v):
    acc = accumulator(x_ref.dtype)
    target = t_ref[...]
    lse = lse_ref[...].astype(acc)
    g = jnp.where(target != ignore_index, g_ref[...].astype(acc), 0.0)
    g_lse = glse_ref[...].astype(acc)

    @pl.loop(0, x_ref.shape[1] // block_v)
    def _(j):  # one vocabulary chunk at a time, as in the forward
        cols = j * block_v + jax.lax.iota(jnp.int32, block_v)
        p = jnp.exp(x_ref[:, pl.ds(j * block_v, block_v)].astype(acc) - lse[:, None])
        # d loss/dx = (p - onehot) * g; the logsumexp output's own gradient adds p * g_lse
        dx = p * (g + g_lse)[:, None] - (cols[None, :] == target[:, None]) * g[:, None]
        dx_ref[:, pl.ds(j * block_v, block_v)] = dx.astype(dx_ref.dtype)


def _layout(logits, block_rows, block_v):
    n, vocab = logits.shape
    rows = row_block(n, block_rows)
    bv = row_block(vocab, block_v, minimum=128)
    return n, vocab, rows, bv


def _backward(logits, target, ignore_index: int = -100, *, outputs, grad_outputs, block_rows=32, block_v=2048):
    n, vocab, rows, bv = _layout(logits, block_rows, block_v)
    xp = pad_rows(pad_rows(logits, rows), bv, axis=1)
    row_spec = pl.BlockSpec((rows, xp.shape[1]), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((rows,), lambda i: (i,))
    dx = pallas_call(
        functools.partial(_backward_block, ignore_index=ignore_index, block_v=bv),
        jax.ShapeDtypeStruct(xp.shape, logits.dtype),
        grid=(xp.shape[0] // rows,),
        in_specs=[row_spec, vec_spec, vec_spec, vec_spec, vec_spec],
        out_specs=row_spec,
    )(xp, pad_rows(target.astype(jnp.int32), rows, value=ignore_index), pad_rows(outputs[1], rows),
      pad_rows(grad_outputs[0], rows), pad_rows(grad_outputs[1], rows))
    return dx[:n, :vocab], None


@kernel("pjrt_kernels::softmax_cross_entropy", reference=cross_entropy_reference, backward=_backward,
        tune={"block_rows": (32, 64, 16), "block_v": (2048, 1024, 4096)})
def softmax_cross_entropy_kernel(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, *,
                                 block_rows: int = 32, block_v: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss [N] in logits' dtype, logsumexp [N]) for logits [N, V] and integer targets [N]."""
    n, vocab, rows, bv = _layout(logits, block_rows, block_v)
    xp = pad_rows(pad_rows(logits, rows), bv, axis=1)
    vec_spec = pl.BlockSpec((rows,), lambda i: (i,))
    loss, lse = pallas_call(
        functools.partial(_forward_block, ignore_index=ignore_index, vocab=vocab, block_v=bv),
        (jax.ShapeDtypeStruct((xp.shape[0],), logits.dtype), jax.ShapeDtypeStruct((xp.shape[0],), accumulator(logits.dtype))),
        grid=(xp.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, xp.shape[1]), lambda i: (i, 0)), vec_spec],
        out_specs=(vec_spec, vec_spec),
    )(xp, pad_rows(target.astype(jnp.int32), rows, value=ignore_index))
    return loss[:n], lse[:n]


def softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                          reduction: str = "mean") -> torch.Tensor:
    """torch.nn.functional.cross_entropy(logits, target, ignore_index=, reduction=) for 2-D logits."""
    loss = softmax_cross_entropy_kernel(logits, target, ignore_index)[0]
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (target != ignore_index).sum().to(loss.dtype)
    raise ValueError(f"softmax_cross_entropy: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
