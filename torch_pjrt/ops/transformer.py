"""Lowerings: the fused transformer ops of torch's nn modules in inference (eval mode, no grad):
nn.MultiheadAttention's `_native_multi_head_attention`, nn.TransformerEncoderLayer's
`_transformer_encoder_layer_fwd`, and the masked softmax they use. torch sends PrivateUse1 down
this fast path as it sends CPU and CUDA; CPU composes each op from matmuls, layer norm and
softmax (aten/src/ATen/native/transformers), and so do these, in CPU's order and roundings.
Bad arguments raise here while tracing; eager then raises CPU's own exception for the call."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .nn import _along, _dot_general, _softmax_fn, _up, native_layer_norm
from .registry import family
from .views import wrap_dim

lowering = family(not_paddable="no padding rule yet: attention mixes every position of a sequence")

aten = torch.ops.aten
_FLOATS = (np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32), np.dtype(np.float64))


def _require_float(x, name: str) -> None:
    if np.dtype(x.dtype) not in _FLOATS:  # CPU's kernels dispatch on floating types only
        raise NotImplementedError(f'"{name}" not implemented for {x.dtype}')


# ------------------------------------------------------------------------- masked softmax


def _softmax_mask(input, mask, mask_type):
    """`mask` (True: left out) broadcast to `input` as CPU's _masked_softmax reads it: mask_type 0 an
    (L, L) attention mask, 1 a (B, L) key padding mask, 2 a mask of the input's shape; a mask that
    is not 2-D, or an input that is not 4-D, is read as type 2."""
    if mask.dtype != np.bool_:
        raise RuntimeError("Mask should be a boolean tensor")
    if mask.ndim != 2 or input.ndim != 4:
        mask_type = 2
    if mask_type is None:
        raise RuntimeError("Mask Type should be defined")
    if mask_type == 2:
        if tuple(mask.shape) != tuple(input.shape):
            raise RuntimeError("For mask_type == 2 mask shape should match input shape")
        return mask
    if mask_type == 1:
        if input.shape[0] != mask.shape[0] or input.shape[2] != mask.shape[1]:
            raise RuntimeError("For mask_type == 1 mask shape should be (B, L)")
        return jnp.broadcast_to(mask.reshape(mask.shape[0], 1, 1, mask.shape[1]), input.shape)
    if mask_type == 0:
        if input.shape[2] != mask.shape[0] or input.shape[2] != mask.shape[1]:
            raise RuntimeError("For mask_type == 0 mask shape should be (L, L)")
        return jnp.broadcast_to(mask, input.shape)
    raise RuntimeError("Mask Type should be 0 (src_mask) or 1 (src_key_padding_mask), or 2 (default_mask)")


def _softmax_dim(dim, ndim: int) -> int:
    """The masked softmax's dim: the last where none is given."""
    return max(ndim - 1, 0) if dim is None else wrap_dim(dim, ndim)


def _masked_softmax_of(input, mask, dim: int):
    """softmax of `input` over `dim` leaving out the True positions of `mask` (its shape): a row
    with every position left out is NaN, as on CPU."""
    return _along(_softmax_fn, jnp.where(mask, -jnp.inf, _up(input)), dim).astype(input.dtype)


@lowering(aten._masked_softmax.default)
def _masked_softmax(self, mask, dim=None, mask_type=None):
    _require_float(self, "masked_softmax")
    dim = _softmax_dim(dim, self.ndim)
    return _masked_softmax_of(self, _softmax_mask(self, mask, mask_type), dim)


@lowering(aten._masked_softmax_backward.default)
def _masked_softmax_backward(grad_output, output, mask, dim=None):
    _require_float(output, "masked_softmax_backward")
    if tuple(grad_output.shape) != tuple(mask.shape):
        raise RuntimeError("Mask shape should match grad shape")
    if mask.dtype != np.bool_:
        raise RuntimeError("Mask should be a boolean tensor")
    axis = _softmax_dim(dim, output.ndim)
    g, y = _up(grad_output).reshape(output.shape or (1,)), _up(output).reshape(output.shape or (1,))
    kept = ~mask.reshape(output.shape or (1,))
    gy = jnp.where(kept, g * y, 0)
    grad = jnp.where(kept, gy - y * jnp.sum(gy, axis=axis, keepdims=True), 0)
    return grad.reshape(output.shape).astype(output.dtype)


# ------------------------------------------------------------------------- attention


def _linear(x, weight, bias=None):
    """x @ weight.T (+ bias) over x's last dim, rounded to x's dtype as CPU's gemm and addmm."""
    out = _dot_general(x, weight, ((x.ndim - 1,), (1,)))
    if bias is not None:
        out = _up(out) + _up(bias)
    return out.astype(x.dtype)


def _check_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias) -> None:
    """CPU's argument checks of native_multi_head_attention, in its order."""
    D = embed_dim
    if query.ndim != 3:
        raise RuntimeError(f"expected 3-D `query`, got {query.ndim}-D tensor")
    if query.shape[2] != D:
        raise RuntimeError(f"passed-in embed_dim {D} didn't match last dim of query {query.shape[2]}")
    if key.ndim != 3:
        raise RuntimeError(f"expected 3-D `key`, got {key.ndim}-D tensor")
    if value.ndim != 3:
        raise RuntimeError(f"expected 3-D `value`, got {value.ndim}-D tensor")
    if not tuple(query.shape) == tuple(key.shape) == tuple(value.shape):
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if qkv_weight.ndim != 2:
        raise RuntimeError(f"expected 2-D `qkv_weight`, got {qkv_weight.ndim}-D tensor")
    if qkv_weight.shape[0] != 3 * D:
        raise RuntimeError("expected `qkv_weight` first dim to be 3x embed_dim")
    if qkv_weight.shape[1] != D:
        raise RuntimeError("expected `qkv_weight` second dim to be embed_Dim")
    if qkv_bias.ndim != 1:
        raise RuntimeError(f"expected 1-D `qkv_bias`, got {qkv_bias.ndim}-D tensor")
    if qkv_bias.shape[0] != 3 * D:
        raise RuntimeError("expected `qkv_bias` first dim and first dim of query to be equal")
    if num_head <= 0 or D % num_head:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")


@lowering(aten._native_multi_head_attention.default)
def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    _check_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias)
    B, T, D = query.shape
    if B * T * D == 0:  # CPU returns before its dtype dispatch (its projection is empty), and no weights
        return jnp.zeros_like(query), None
    _require_float(query, "transform_bias_rescale_qkv")
    dt, head = query.dtype, D // num_head
    # the projections without bias, then (q + bias) / sqrt(head), k + bias, v + bias in the dtype
    # (CPU's gemm_nt, then _transform_bias_rescale_qkv with its 1 / sqrt computed as there)
    inv_sqrt = np.asarray(1.0 / float(np.sqrt(np.asarray(head, _up(query).dtype))), dt)
    q, k, v = (_linear(x, qkv_weight[i * D:(i + 1) * D]) for i, x in enumerate((query, key, value)))
    q = ((q + qkv_bias[:D]).astype(dt) * inv_sqrt).astype(dt)
    k, v = (k + qkv_bias[D:2 * D]).astype(dt), (v + qkv_bias[2 * D:]).astype(dt)
    q, k, v = (x.reshape(B, T, num_head, head).transpose(0, 2, 1, 3) for x in (q, k, v))
    scores = _dot_general(q, k, ((3,), (3,)), ((0, 1), (0, 1))).astype(dt)  # [B, heads, T, T]
    if mask is None:
        weights = _softmax_fn(_up(scores), 3).astype(dt)
    else:
        mask = mask if mask.dtype == np.bool_ else mask != 0  # CPU reads any mask as bool
        weights = _masked_softmax_of(scores, _softmax_mask(scores, mask, mask_type), 3)
    context = _dot_general(weights, v, ((3,), (2,)), ((0, 1), (0, 1))).astype(dt)  # [B, heads, T, head]
    out = _linear(context.transpose(0, 2, 1, 3).reshape(B, T, D), proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = (jnp.sum(_up(weights), axis=1).astype(dt) / np.asarray(num_head, dt)).astype(dt)
    return out, weights


@lowering(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                                   norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                   ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """CPU's transformer_encoder_layer_forward: self-attention, residual, layer norm (before or
    after), the feed-forward block with gelu or relu, residual, layer norm."""
    if src.size == 0:
        return src
    if ffn_weight_1.ndim != 2 or ffn_weight_2.ndim != 2:
        raise RuntimeError("2d weights expected")

    def norm(x, weight, bias):
        return native_layer_norm(x, [embed_dim], weight, bias, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                     mask, False, True, mask_type)[0]
    x = (x + src).astype(src.dtype)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = _up(_linear(x, ffn_weight_1, ffn_bias_1))  # CPU's _addmm_activation: the activation of the rounded sum
    hidden = (jax.nn.gelu(hidden, approximate=False) if use_gelu else jnp.maximum(hidden, 0)).astype(src.dtype)
    x = (_linear(hidden, ffn_weight_2, ffn_bias_2) + residual).astype(src.dtype)
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x
