"""CTC loss (Graves et al. 2006) and its backward, as torch's CPU kernels compute them.

The forward runs the alpha recursion in log space over time with `lax.scan`, one batch
element per `vmap` lane. The lengths are static (host int lists: torch's `ctc_loss` moves
tensor lengths to the host itself, and with concatenated targets log_alpha is as wide as the
longest target), so each new set of lengths compiles. The backward is the forward's VJP plus torch's extra term: CPU's
`ctc_loss_backward` returns exp(log_probs) * grad - (the true derivative), the gradient
with respect to logits that went through log_softmax (the exp term cancels there); we return
the same numbers, zero past each input length; an infinite loss gives nan (CPU's arithmetic)
or, with zero_infinity, zero.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .registry import family

lowering = family(not_paddable="a sequence loss: its time axis runs a recursion")

aten = torch.ops.aten
I64 = jnp.int64


def _logsumexp(*xs):
    """log(sum(exp(x))) of equally shaped arrays; -inf when all are, with finite gradients."""
    stacked = jnp.stack(xs)
    top = jnp.max(stacked, axis=0)
    finite_top = jnp.where(jnp.isfinite(top), top, 0)
    total = jnp.sum(jnp.exp(stacked - finite_top), axis=0)
    safe = jnp.where(total > 0, total, 1)
    return jnp.where(total > 0, finite_top + jnp.log(safe), -jnp.inf)


def _padded_targets(targets, target_lengths: list[int]):
    """(batch, S) targets: 2-D targets as given, 1-D ones (concatenated) cut at each length's
    offset and padded to the longest (S = max(target_lengths), as CPU's log_alpha)."""
    if targets.ndim == 2:
        return targets.astype(I64)
    width = max(target_lengths, default=0)
    starts = np.cumsum([0, *target_lengths[:-1]])
    positions = np.minimum(starts[:, None] + np.arange(width)[None, :], max(targets.shape[0] - 1, 0))
    if targets.shape[0] == 0:
        return jnp.zeros((len(target_lengths), width), I64)
    return jnp.take(targets.astype(I64), jnp.asarray(positions.reshape(len(target_lengths), width)))


def _one_sequence(log_probs, target, input_length, target_length, blank: int):
    """(-log p(target | log_probs), log_alpha (T, 2S+1)) of one batch element; log_probs (T, C)."""
    steps, width = log_probs.shape[0], 2 * target.shape[0] + 1
    s = jnp.arange(width)
    if target.shape[0]:
        labels = jnp.where(s % 2 == 1, jnp.take(target, s // 2, mode="clip"), blank)
    else:  # every target empty (width 1): the all-blank path alone, and nothing to take from
        labels = jnp.full((width,), blank, I64)
    valid = s < 2 * target_length + 1
    skip = (s % 2 == 1) & (s >= 2) & (labels != jnp.roll(labels, 2))
    ninf = jnp.full((width,), -jnp.inf, log_probs.dtype)
    emit0 = jnp.take(log_probs[0], labels)
    first = jnp.where((s < 2) & valid, emit0, ninf)
    first = jnp.where(input_length > 0, first, ninf)

    def step(alpha, t):
        shifted1 = jnp.concatenate([ninf[:1], alpha[:-1]])
        shifted2 = jnp.where(skip, jnp.concatenate([ninf[:2], alpha[:-2]]), -jnp.inf)
        new = _logsumexp(alpha, shifted1, shifted2) + jnp.take(log_probs[t], labels)
        new = jnp.where(valid, new, -jnp.inf)
        alpha = jnp.where(t < input_length, new, alpha)  # frozen past this element's input
        return alpha, alpha

    last, rest = lax.scan(step, first, jnp.arange(1, steps))
    log_alpha = jnp.concatenate([first[None], rest]) if steps > 1 else first[None]
    end = 2 * target_length
    final = _logsumexp(jnp.take(last, end, mode="clip"),
                       jnp.where(target_length > 0, jnp.take(last, end - 1, mode="clip"), -jnp.inf))
    return -final, log_alpha


def _forward(log_probs, targets, input_lengths, target_lengths, blank: int):
    """(nll (B,), log_alpha (B, T, 2S+1)) of log_probs (T, B, C)."""
    padded = _padded_targets(targets, list(target_lengths))
    return jax.vmap(_one_sequence, in_axes=(1, 0, 0, 0, None))(
        log_probs, padded, jnp.asarray(input_lengths, I64), jnp.asarray(target_lengths, I64), blank)


@lowering(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    # zero_infinity acts in the backward and in torch's ctc_loss (composite), not here: CPU's
    # _ctc_loss returns the infinite loss
    return _forward(log_probs, targets, input_lengths, target_lengths, blank)


@lowering(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    nll, vjp = jax.vjp(lambda lp: _forward(lp, targets, input_lengths, target_lengths, blank)[0], log_probs)
    finite = ~jnp.isinf(nll)
    scale = jnp.where(finite, grad, jnp.zeros((), grad.dtype)).astype(log_probs.dtype)
    (true_grad,) = vjp(scale)
    steps = jnp.arange(log_probs.shape[0])[:, None]
    inside = steps < jnp.asarray(input_lengths, I64).reshape(1, -1)
    out = true_grad + jnp.exp(log_probs) * scale[None, :, None]
    # an impossible alignment: CPU's exp(-inf + inf) is nan whatever the incoming gradient
    out = jnp.where(finite[None, :, None], out, jnp.full((), jnp.nan if not zero_infinity else 0, out.dtype))
    return jnp.where(inside[:, :, None], out, jnp.zeros((), out.dtype))
