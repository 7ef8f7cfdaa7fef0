"""Nested tensors on pjrt, as torch's transformer fast path uses them (runtime/csrc/nested.cpp
holds ATen's device-generic kernels: creation from a mask or a padded tensor, sizes, padding).

nn.TransformerEncoder in inference with a `src_key_padding_mask` packs its input into a nested
tensor and runs each layer's `_transformer_encoder_layer_fwd` on it. Here a nested layer is the
dense layer (ops/transformer.py) over the padded batch with the padding as a key padding mask:
every real position attends to the same keys as in CPU's nested kernel, and the rows of the
padding, which CPU never computes, are dropped when the result is packed again."""
from __future__ import annotations

import torch

_library = None  # registrations live as long as their Library object


def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                  ffn_bias_2, mask=None, mask_type=None):
    """_transformer_encoder_layer_fwd of a nested `src` (sequences of embed_dim-wide rows)."""
    if mask is not None:  # CPU's native_multi_head_attention refuses it in the same words
        raise RuntimeError("NestedTensor with mask is not supported yet")
    sizes = src._nested_tensor_size()  # (B, 2) on the host: each sequence's length and width
    if sizes.numel() == 0 or int(sizes[:, 0].max()) == 0:
        return src  # nothing to compute: CPU returns the input's buffer as it is
    padded = src.to_padded_tensor(0.0)
    lengths = sizes[:, 0].to(padded.device)
    padding = torch.arange(padded.shape[1], device=padded.device)[None, :] >= lengths[:, None]
    out = torch.ops.aten._transformer_encoder_layer_fwd(
        padded, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
        norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
        padding, 1)  # mask type 1: a (B, L) key padding mask
    return torch._nested_from_padded(out, sizes)


def register() -> None:
    global _library
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("_transformer_encoder_layer_fwd", encoder_layer, "NestedTensorPrivateUse1")
