"""Nested tensors on pjrt, as torch's transformer fast path uses them (runtime/csrc/nested.cpp
holds ATen's device-generic kernels: creation from a mask or a padded tensor, sizes, padding).

nn.TransformerEncoder in inference with a `src_key_padding_mask` packs its input into a nested
tensor and runs each layer's `_transformer_encoder_layer_fwd` on it. Here a nested layer is the
dense layer (ops/transformer.py) over the padded batch with the padding as a key padding mask:
every real position attends to the same keys as in CPU's nested kernel, and the rows of the
padding, which CPU never computes, are dropped when the result is packed again."""
from __future__ import annotations

import torch

from . import errors

_library = None  # registrations live as long as their Library object


def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                  ffn_bias_2, mask=None, mask_type=None):
    """_transformer_encoder_layer_fwd of a nested `src` (sequences of embed_dim-wide rows)."""
    if mask is not None:  # CPU's native_multi_head_attention refuses it in the same words
        raise RuntimeError("NestedTensor with mask is not supported yet")
    if not src.is_contiguous():  # CPU reads the buffer (sequences one after another), so do these
        raise RuntimeError("NestedTensor must be contiguous to get buffer.")
    sizes = src._nested_tensor_size()  # (B, 2) on the host: each sequence's length and width
    if sizes.numel() == 0 or int(sizes[:, 0].max()) == 0:
        return src  # nothing to compute: CPU returns the input's buffer as it is
    layout = _Layout.of(src, sizes)
    if layout is not None:
        padded, padding = layout.padded(src), layout.padding
    else:
        padded = src.to_padded_tensor(0.0)
        padding = torch.arange(padded.shape[1])[None, :] >= sizes[:, :1]
    out = torch.ops.aten._transformer_encoder_layer_fwd(
        padded, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
        norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
        padding.to(padded.device), 1)  # mask type 1: a (B, L) key padding mask
    return layout.packed(out) if layout is not None else torch._nested_from_padded(out, sizes)


def from_mask(t, mask, mask_check=True):
    """_nested_tensor_from_mask: the rows of a padded (B, L, width) batch where a left-aligned (B, L)
    mask is True, as a nested tensor. One host read (the lengths) and one gather."""
    if mask.dtype != torch.bool or t.dim() != 3 or tuple(mask.shape) != tuple(t.shape[:2]) or not len(t):
        op = torch.ops.aten._nested_tensor_from_mask.default
        errors.raise_as_cpu(op, (t, mask, mask_check), {})
        raise RuntimeError(f"pjrt: {op} takes a (B, L, width) tensor and a (B, L) bool mask, got {tuple(t.shape)} and "
                           f"{tuple(mask.shape)} {mask.dtype}")
    if mask_check and not torch._nested_tensor_from_mask_left_aligned(t, mask):
        raise RuntimeError("Mask must be left-aligned without gaps")
    return _Layout.for_lengths(mask.sum(1).tolist(), t.shape[2], t.device).packed(t)


class _Layout:
    """Where each row of a contiguous nested batch of (length, width) sequences sits in its padded
    (B, longest, width) form: a gather each way with indices made once per batch of lengths, where
    ATen's generic kernels take a dozen ops per sequence and a host sync (masked_select)."""

    _recent: dict = {}  # (lengths, width, device) -> _Layout; the few a model's batches use

    def __init__(self, lengths: list, width: int, device):
        self.lengths, self.width, self.longest = lengths, width, max(lengths)
        self.rows = sum(lengths)
        valid = torch.arange(self.longest)[None, :] < torch.tensor(lengths)[:, None]
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
        source = (starts[:, None] + torch.arange(self.longest)[None, :]).clamp(max=max(self.rows - 1, 0))
        self.source = source.reshape(-1).to(device)  # padded row -> buffer row (any real row where padding)
        self.valid = valid.reshape(-1, 1).to(device)
        self.padding = (~valid).to(device)  # the key padding mask of the padded batch
        self.kept = torch.arange(len(lengths) * self.longest)[valid.reshape(-1)].to(device)  # buffer row -> padded row
        self.sizes = torch.tensor([[n, width] for n in lengths])
        self.strides = torch.tensor([[width, 1]] * len(lengths))
        self.offsets = starts * width

    @classmethod
    def of(cls, nested, sizes) -> "_Layout | None":
        """The layout of a contiguous `nested`, or None where its sequences are not (length, width) ones."""
        if sizes.shape[1] != 2 or len(set(sizes[:, 1].tolist())) != 1:
            return None
        return cls.for_lengths(sizes[:, 0].tolist(), int(sizes[0, 1]), nested.device)

    @classmethod
    def for_lengths(cls, lengths: list, width: int, device) -> "_Layout":
        key = (tuple(lengths), width, device)
        layout = cls._recent.get(key)
        if layout is None:
            if len(cls._recent) >= 16:
                cls._recent.clear()
            layout = cls._recent[key] = cls(lengths, width, device)
        return layout

    def padded(self, nested):
        """(B, longest, width), zeros after each sequence's end."""
        buffer = torch.empty(0, dtype=nested.dtype, device=nested.device).set_(
            nested.untyped_storage(), 0, (self.rows, self.width), (self.width, 1))
        padded = torch.where(self.valid, buffer.index_select(0, self.source), 0)
        return padded.reshape(len(self.lengths), self.longest, self.width)

    def packed(self, padded):
        """The nested tensor of `padded`'s rows within each sequence's length (its length dim may run
        past the longest sequence)."""
        if padded.shape[1] != self.longest:
            padded = padded[:, :self.longest]
        buffer = padded.reshape(-1, self.width).index_select(0, self.kept).reshape(-1)
        return torch._nested_view_from_buffer(buffer, self.sizes, self.strides, self.offsets)


def register() -> None:
    global _library
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("_transformer_encoder_layer_fwd", encoder_layer, "NestedTensorPrivateUse1")
    _library.impl("_nested_tensor_from_mask", from_mask, "PrivateUse1")
