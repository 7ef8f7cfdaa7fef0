"""scaled_dot_product_attention on pjrt: one op, one executable, flash attention where it pays.

torch's SDPA asks `_fused_sdp_choice_stub` for the query's device; the runtime's C++ stub
(runtime/csrc/fast_path.cpp, `sdp_choice`) answers without Python (it asks
`ring_attention_active` below only once torch.distributed.tensor is imported). Choosing
"overrideable" routes the call to `aten._scaled_dot_product_fused_attention_overrideable`
(and autograd to its `_backward`), whose lowerings here run either the flash-attention
kernel or attention written out in XLA (`_attention`: masks, causal, GQA, float64); eager
calls and compiled graphs both use them. Only dropout (random draws: torch's own), symbolic
sizes under dynamic=True (the math path's ops are the ones compiler/padding.py can pad),
inputs torch's math path refuses (its errors) and `sdpa_kernel(SDPBackend.MATH)` take
torch's math path, which decomposes into table ops. A mask together with is_causal applies
both, as CPU torch does.

One op instead of the math path's five to eight makes eager attention one executable per
shape, and lets it read a KV cache that grows token by token (ops/growth.py): keys and
values padded to a capacity, masked past their length.

TORCH_PJRT_FLASH_SDPA chooses where the flash kernel serves: `auto` (the default) where Pallas
runs natively (GPUs, TPUs); on the CPU platform Pallas is interpreted, and an eager Llama
prefill of 8x512 took 15.7 s with the kernel against 4.0 s with the math path (torch CPU:
4.7 s). `1` uses it on every platform where shapes suit it (the CPU tests of the kernel),
`0` nowhere.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import torch

from ..dtypes import to_torch
from ..runtime import build as _runtime
from ..ops.growth import Growth, PaddedOperand
from ..ops.nn import matmul_precision
from ..ops.registry import lowering
from . import platforms

aten = torch.ops.aten

FLASH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def suits_flash(query, key, value, attn_mask, dropout_p: float) -> bool:
    """Where the flash kernel gives SDPA's result: 4-D, no mask, no dropout, GQA-compatible heads,
    head sizes a multiple of 8 up to 256, half or single precision, on a platform where it pays.
    Takes torch tensors or the lowering's values (a padded key: the XLA attention masks it)."""
    setting = os.environ.get("TORCH_PJRT_FLASH_SDPA", "auto").lower()
    if setting in ("0", "false", "off") or (setting == "auto" and platforms.interpret()):
        return False
    if attn_mask is not None or dropout_p != 0.0 or isinstance(key, PaddedOperand):
        return False
    if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
        return False
    dtypes = [_torch_dtype(t.dtype) for t in (query, key, value)]
    if dtypes[0] not in FLASH_DTYPES or dtypes[1] != dtypes[0] or dtypes[2] != dtypes[0]:
        return False
    hq, hk, hv = query.shape[1], key.shape[1], value.shape[1]
    if hk != hv or hq % hk:
        return False
    d, dv = query.shape[-1], value.shape[-1]
    return d == key.shape[-1] and d % 8 == 0 and dv % 8 == 0 and d <= MAX_HEAD_DIM and dv <= MAX_HEAD_DIM


def _torch_dtype(dtype):
    return dtype if isinstance(dtype, torch.dtype) else to_torch(dtype)


def ring_attention_active() -> bool:
    """Whether torch's context_parallel() is on: it routes DTensors' flash, efficient and cuDNN
    attention ops to ring attention (DTensor's custom op handlers) and knows no overrideable
    op, so while it is on SDPA takes the efficient-attention op (as sdpa_kernel(EFFICIENT_ATTENTION)
    asks), whose lowering below accepts another block's output and logsumexp in its backward."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return aten._scaled_dot_product_efficient_attention.default in DTensor._op_dispatcher._custom_op_handlers


# ------------------------------------------------------------------------------ lowerings
def _flash():
    from .attention import flash_attention_kernel

    return flash_attention_kernel


def _grows(values) -> Growth | None:
    """Keys and values that grow token by token (a KV cache) arrive padded; the output is exact.
    A mask over the keys has their exact length, so with one the call runs at exact sizes."""
    query, key, bias = values[0], values[1], values[3]
    if len(key.shape) < 2 or len(query.shape) != len(key.shape) or (bias is not None and bias.shape[-1] != 1):
        return None
    return Growth(operands=((1, None), (2, None)), axis=len(key.shape) - 2, length=None)


def _attention(query, key, value, attn_bias, is_causal, scale):
    """(output, logsumexp) of softmax(q k^T * scale + bias) v, in float32 or wider; a query
    whose every key is masked gets zeros (torch's _safe_softmax). Keys past a padded key's
    length are masked; GQA repeats key/value heads as torch's enable_gqa does."""
    valid = key.valid() if isinstance(key, PaddedOperand) else None
    key = key.array if isinstance(key, PaddedOperand) else key
    value = value.array if isinstance(value, PaddedOperand) else value
    key, value = _repeat_heads(query, key, value)
    wide = jnp.promote_types(query.dtype, jnp.float32)
    precision = matmul_precision()
    scores, _ = _scores(query, key, attn_bias, is_causal, scale, valid)
    top = jnp.max(scores, axis=-1, keepdims=True)
    top = jax.lax.stop_gradient(jnp.where(jnp.isneginf(top), 0, top))  # a fully masked row: every term 0
    terms = jnp.exp(scores - top)
    total = terms.sum(axis=-1, keepdims=True)
    weights = terms / jnp.where(total == 0, 1, total)
    lse = (jnp.log(total) + top)[..., 0]
    out = jnp.matmul(weights, value.astype(wide), precision=precision)
    return out.astype(query.dtype), lse


def _repeat_heads(query, key, value):
    """GQA: key and value heads repeated to the query's, as torch's enable_gqa does."""
    if query.ndim < 3 or key.shape[-3] == query.shape[-3]:
        return key, value
    repeat = query.shape[-3] // key.shape[-3]
    return jnp.repeat(key, repeat, axis=-3), jnp.repeat(value, repeat, axis=-3)


def _scores(query, key, attn_bias, is_causal, scale, valid=None):
    """(q k^T * scale + a float bias, -inf where causality, a bool mask or `valid` (a padded
    key's length) forbids; the scale), in float32 or wider."""
    wide = jnp.promote_types(query.dtype, jnp.float32)
    scale = 1.0 / jnp.sqrt(jnp.asarray(query.shape[-1], wide)) if scale is None else jnp.asarray(scale, wide)
    scores = jnp.matmul(query.astype(wide), jnp.swapaxes(key.astype(wide), -1, -2),
                        precision=matmul_precision()) * scale
    allowed = valid
    if is_causal:
        causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
        allowed = causal if allowed is None else causal & allowed
    if attn_bias is not None:
        if attn_bias.dtype == jnp.bool_:
            allowed = attn_bias if allowed is None else attn_bias & allowed
        else:
            scores = scores + attn_bias.astype(wide)
    if allowed is not None:
        scores = jnp.where(allowed, scores, -jnp.inf)
    return scores, scale


def _length(key):
    return key.length if isinstance(key, PaddedOperand) else key.shape[-2]


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default, grows=_grows,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_fused_attention_overrideable(query, key, value, attn_bias=None, dropout_p=0.0,
                                                     is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p != 0.0:
        raise NotImplementedError("pjrt SDPA: dropout takes SDPA's math path (_fused_sdp_choice does not pick "
                                  "this op for it)")
    if suits_flash(query, key, value, attn_bias, dropout_p):
        out, lse = _flash()._run(platforms.target(), (query, key, value, is_causal, scale), {})
    else:
        out, lse = _attention(query, key, value, attn_bias, is_causal, scale)
    seed = jnp.zeros((), jnp.int64)
    # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_attn_mask)
    return out, lse.astype(jnp.float32), None, None, query.shape[-2], _length(key), seed, seed, None


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward.default,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_fused_attention_overrideable_backward(
        grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
        dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if suits_flash(query, key, value, attn_bias, dropout_p):
        kernel = _flash()
        lse = logsumexp.astype(jnp.promote_types(query.dtype, jnp.float32))
        dq, dk, dv = kernel._backward(platforms.target(), [query, key, value, is_causal, scale], {},
                                      (out, lse), (grad_out, jnp.zeros_like(lse)))
        return dq, dk, dv, None
    wants_bias = attn_bias is not None and attn_bias.dtype != jnp.bool_ and bool(grad_input_mask[3])
    if wants_bias:
        _, pullback = jax.vjp(lambda q, k, v, b: _attention(q, k, v, b, is_causal, scale)[0], query, key, value,
                              attn_bias)
        dq, dk, dv, db = pullback(grad_out.astype(query.dtype))
        return dq, dk, dv, db
    _, pullback = jax.vjp(lambda q, k, v: _attention(q, k, v, attn_bias, is_causal, scale)[0], query, key, value)
    dq, dk, dv = pullback(grad_out.astype(query.dtype))
    return dq, dk, dv, None


def _padded_logsumexp(lse, rows: int):
    """The efficient-attention op's logsumexp: float32, its query axis padded with zeros to `rows`
    (a multiple of 32 on CUDA, as torch's meta kernel says; 0 without compute_log_sumexp)."""
    lse = lse.astype(jnp.float32)
    return jnp.pad(lse, [(0, 0)] * (lse.ndim - 1) + [(0, rows - lse.shape[-1])])[..., :rows]


@lowering(aten._scaled_dot_product_efficient_attention.default,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                                            is_causal=False, *, scale=None):
    if dropout_p != 0.0:
        raise NotImplementedError("pjrt: _scaled_dot_product_efficient_attention with dropout is not lowered "
                                  "(SDPA takes its math path for dropout)")
    out, lse = _attention(query, key, value, attn_bias, is_causal, scale)
    rows = -(-query.shape[-2] // 32) * 32 if compute_log_sumexp else 0
    seed = jnp.zeros((), jnp.int64)
    return out, _padded_logsumexp(lse, rows), seed, seed


@lowering(aten._scaled_dot_product_efficient_attention_backward.default,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_efficient_attention_backward(grad_out, query, key, value, attn_bias, out, logsumexp,
                                                     philox_seed, philox_offset, dropout_p, grad_input_mask,
                                                     is_causal=False, *, scale=None):
    """Flash attention's backward from the given output and logsumexp, not recomputed ones: ring
    attention (context parallel) passes the whole sequence's output and logsumexp with one block of
    keys, and the block's gradients are its share of the whole one."""
    wide = jnp.promote_types(query.dtype, jnp.float32)
    k, v = _repeat_heads(query, key.astype(wide), value.astype(wide))
    q, o, do = (t.astype(wide) for t in (query, out, grad_out))
    groups = k.shape[-3] // key.shape[-3] if q.ndim >= 3 else 1
    scores, scale = _scores(q, k, attn_bias, is_causal, scale)
    precision = matmul_precision()
    lse = logsumexp[..., :q.shape[-2], None].astype(wide)
    probs = jnp.where(jnp.isneginf(lse), 0, jnp.exp(scores - lse))  # a fully masked query row: no weights
    grad_v = jnp.matmul(jnp.swapaxes(probs, -1, -2), do, precision=precision)
    grad_probs = jnp.matmul(do, jnp.swapaxes(v, -1, -2), precision=precision)
    grad_scores = probs * (grad_probs - jnp.sum(do * o, axis=-1, keepdims=True))
    grad_q = jnp.matmul(grad_scores, k, precision=precision) * scale
    grad_k = jnp.matmul(jnp.swapaxes(grad_scores, -1, -2), q, precision=precision) * scale
    if groups > 1:
        shape = grad_k.shape[:-3] + (grad_k.shape[-3] // groups, groups) + grad_k.shape[-2:]
        grad_k, grad_v = grad_k.reshape(shape).sum(-3), grad_v.reshape(shape).sum(-3)
    wants_bias = attn_bias is not None and attn_bias.dtype != jnp.bool_ and bool(grad_input_mask[3])
    grad_bias = _sum_to(grad_scores, attn_bias.shape).astype(attn_bias.dtype) if wants_bias else None
    return grad_q.astype(query.dtype), grad_k.astype(key.dtype), grad_v.astype(value.dtype), grad_bias


def _sum_to(x, shape):
    """`x` summed over the axes a broadcast of `shape` to x.shape expanded."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x


# ------------------------------------------------------------------------------ the C++ stub
def install() -> None:
    """Let the runtime's SDPA backend choice for pjrt tensors see context parallelism."""
    _runtime.load().set_ring_attention_active(ring_attention_active)
