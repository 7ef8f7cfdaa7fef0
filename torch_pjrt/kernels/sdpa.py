"""scaled_dot_product_attention on pjrt: flash attention where shapes suit it, math otherwise.

torch's SDPA asks `_fused_sdp_choice_stub` for the query's device; the runtime's C++ stub
(runtime/csrc/fast_path.cpp, `sdp_choice`) asks `choose` below. Choosing
"overrideable" routes the call to `aten._scaled_dot_product_fused_attention_overrideable`
(and autograd to its `_backward`), whose lowerings here run the flash-attention kernel; so
eager calls and compiled graphs both use it, the latter inlined in the graph's executable.
Anything else (a mask, dropout, odd head sizes, float64, symbolic sizes under dynamic=True)
takes torch's math path, which decomposes into table ops as before.

TORCH_PJRT_FLASH_SDPA chooses where the kernel serves SDPA: `auto` (the default) where Pallas
runs natively (GPUs, TPUs); on the CPU platform Pallas is interpreted, and an eager Llama
prefill of 8x512 took 15.7 s with the kernel against 4.0 s with the math path (torch CPU:
4.7 s), so the CPU takes the math path. `1` uses it on every platform where shapes suit it
(the CPU tests of the kernel), `0` nowhere.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import torch

from ..runtime import build as _runtime
from ..ops.registry import lowering
from . import platforms

aten = torch.ops.aten

MATH = int(torch.nn.attention.SDPBackend.MATH)
OVERRIDEABLE = int(torch.nn.attention.SDPBackend.OVERRIDEABLE)
ERROR = int(torch.nn.attention.SDPBackend.ERROR)
FLASH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def suits_flash(query, key, value, attn_mask, dropout_p: float) -> bool:
    """Where the flash kernel gives SDPA's result: 4-D, no mask, no dropout, GQA-compatible heads,
    head sizes a multiple of 8 up to 256, half or single precision."""
    setting = os.environ.get("TORCH_PJRT_FLASH_SDPA", "auto").lower()
    if setting in ("0", "false", "off") or (setting == "auto" and platforms.interpret()):
        return False
    if attn_mask is not None or dropout_p != 0.0:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if query.dtype not in FLASH_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    hq, hk, hv = query.shape[1], key.shape[1], value.shape[1]
    if hk != hv or hq % hk:
        return False
    d, dv = query.shape[-1], value.shape[-1]
    return d == key.shape[-1] and d % 8 == 0 and dv % 8 == 0 and d <= MAX_HEAD_DIM and dv <= MAX_HEAD_DIM


def _overrideable_enabled() -> bool:
    """sdpa_kernel()'s switch for this backend (torch builds without it: always on)."""
    flag = getattr(torch._C, "_get_overrideable_sdp_enabled", None)
    return True if flag is None else bool(flag())


def choose(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    """The backend for one SDPA call; `torch.nn.attention.sdpa_kernel` limits the choice as on CUDA
    (SDPBackend.OVERRIDEABLE is the flash kernel, SDPBackend.MATH the decomposition)."""
    if any(not isinstance(n, int) for n in (*query.shape, *key.shape, *value.shape)):
        # symbolic sizes (torch.compile dynamic=True): the math path's ops are the ones the
        # compiler's shape bucketing (compiler/padding.py) knows how to pad
        return MATH if torch._C._get_math_sdp_enabled() else ERROR
    heads_ok = query.dim() < 3 or key.dim() < 3 or query.shape[-3] == key.shape[-3] or enable_gqa
    if (heads_ok and _overrideable_enabled()
            and suits_flash(query, key, value, attn_mask, dropout_p)):
        return OVERRIDEABLE
    # mismatched heads without enable_gqa: the math path raises torch's own error
    return MATH if torch._C._get_math_sdp_enabled() else ERROR


# ------------------------------------------------------------------------------ lowerings
def _flash():
    from .attention import flash_attention_kernel

    return flash_attention_kernel


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_fused_attention_overrideable(query, key, value, attn_bias=None, dropout_p=0.0,
                                                     is_causal=False, return_debug_mask=False, *, scale=None):
    if attn_bias is not None or dropout_p != 0.0:
        raise NotImplementedError("pjrt flash attention: attn_bias and dropout take SDPA's math path "
                                  "(_fused_sdp_choice does not pick this op for them)")
    out, lse = _flash()._run(platforms.target(), (query, key, value, is_causal, scale), {})
    seed = jnp.zeros((), jnp.int64)
    # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_attn_mask)
    return out, lse.astype(jnp.float32), None, None, query.shape[-2], key.shape[-2], seed, seed, None


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward.default,
          not_paddable="no padding rule yet: attention over padded keys would need their mask")
def _scaled_dot_product_fused_attention_overrideable_backward(
        grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
        dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    kernel = _flash()
    lse = logsumexp.astype(jnp.promote_types(query.dtype, jnp.float32))
    dq, dk, dv = kernel._backward(platforms.target(), [query, key, value, is_causal, scale], {},
                                  (out, lse), (grad_out, jnp.zeros_like(lse)))
    return dq, dk, dv, None


# ------------------------------------------------------------------------------ the C++ stub
def install() -> None:
    """Make the runtime's SDPA backend choice for pjrt tensors ask `choose`."""
    _runtime.load().set_sdp_choice(choose)
