"""Where the shipped kernels serve aten ops on pjrt, installed when the device is set up:
scaled_dot_product_attention -> flash attention (sdpa.py), torch._grouped_mm -> grouped matmul.

The lowerings join the op table (so compiled graphs inline the kernels); their eager
PrivateUse1 kernels are made the way the table's other ops' are (eager.register_lowering).
"""
from __future__ import annotations

import torch

from ..ops.registry import lowering
from . import platforms, sdpa

aten = torch.ops.aten


@lowering(aten._grouped_mm.default, not_paddable="grouped matmul: no padding rule yet")
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    if bias is not None:
        raise NotImplementedError("pjrt _grouped_mm: bias is not supported (torch's own kernels reject it too)")
    from .moe import grouped_mm

    out = grouped_mm._run(platforms.target(), (self, mat2, offs), {})
    return out if out_dtype is None else out.astype(_jax_dtype(out_dtype))


def _jax_dtype(dtype):
    from ..dtypes import to_jax

    return to_jax(dtype)


OPS = (aten._grouped_mm.default, aten._scaled_dot_product_fused_attention_overrideable.default,
       aten._scaled_dot_product_fused_attention_overrideable_backward.default,
       aten._scaled_dot_product_efficient_attention.default,
       aten._scaled_dot_product_efficient_attention_backward.default)


def install() -> None:
    """Register the eager kernels of OPS and the SDPA backend choice (setup calls it once)."""
    from ..eager.kernels import register_lowering

    for op in OPS:
        register_lowering(op)
    sdpa.install()
