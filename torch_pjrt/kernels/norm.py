"""Fused RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * weight.

Forward and backward are Pallas kernels over blocks of rows (each block holds whole rows,
so the mean is one on-chip reduction); the weight gradient is summed per block in the
kernel and across blocks outside it. Statistics are computed in float32 whatever the
input dtype, as torch's rms_norm does for half types (float64 stays float64).
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


def rms_norm_reference(x, weight, eps: float):
    acc = accumulator(x.dtype)
    xf = x.astype(acc)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * r * weight.astype(acc)).astype(x.dtype)


def _forward_block(x_ref, w_ref, y_ref, *, eps):
    acc = accumulator(x_ref.dtype)
    x = x_ref[...].astype(acc)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    y_ref[...] = (x * r * w_ref[...].astype(acc)).astype(y_ref.dtype)


def _backward_block(x_ref, w_ref, g_ref, dx_ref, dw_ref, *, eps):
    acc = accumulator(x_ref.dtype)
    x = x_ref[...].astype(acc)
    w = w_ref[...].astype(acc)
    g = g_ref[...].astype(acc)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    gw = g * w
    # d/dx of x*r: r * (gw - xhat * mean(gw * xhat)) (r depends on every element of the row)
    dx_ref[...] = (r * (gw - xhat * jnp.mean(gw * xhat, axis=-1, keepdims=True))).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(g * xhat, axis=0, keepdims=True)


def _rows(x, block_rows):
    d = x.shape[-1]
    flat = x.reshape(-1, d)
    block = row_block(flat.shape[0], block_rows)
    return flat, block, pad_rows(flat, block)


def _backward(x, weight, eps: float, *, outputs, grad_outputs, block_rows=64):
    d = x.shape[-1]
    flat, block, xp = _rows(x, block_rows)
    gp = pad_rows(grad_outputs[0].reshape(-1, d), block)  # padded rows have g = 0: no dw contribution
    n_blocks = xp.shape[0] // block
    row_spec = pl.BlockSpec((block, d), lambda i: (i, 0))
    dx, dw = pallas_call(
        functools.partial(_backward_block, eps=eps),
        (jax.ShapeDtypeStruct(xp.shape, x.dtype), jax.ShapeDtypeStruct((n_blocks, d), accumulator(x.dtype))),
        grid=(n_blocks,),
        in_specs=[row_spec, pl.BlockSpec((1, d), lambda i: (0, 0)), row_spec],
        out_specs=(row_spec, pl.BlockSpec((1, d), lambda i: (i, 0))),
    )(xp, weight.reshape(1, d), gp)
    return dx[: flat.shape[0]].reshape(x.shape), dw.sum(axis=0).astype(weight.dtype)


@kernel("pjrt_kernels::rms_norm", reference=rms_norm_reference, backward=_backward,
        tune={"block_rows": (64, 128, 256, 32)},
        supports=lambda platform, x, w, eps=1e-6: triton_friendly(platform, x.shape[-1]))
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, block_rows: int = 64) -> torch.Tensor:
    """RMSNorm of `x` over its last dimension, scaled by `weight` (shape [x.shape[-1]])."""
    d = x.shape[-1]
    flat, block, xp = _rows(x, block_rows)
    row_spec = pl.BlockSpec((block, d), lambda i: (i, 0))
    y = pallas_call(
        functools.partial(_forward_block, eps=eps),
        jax.ShapeDtypeStruct(xp.shape, x.dtype),
        grid=(xp.shape[0] // block,),
        in_specs=[row_spec, pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=row_spec,
    )(xp, weight.reshape(1, d))
    return y[: flat.shape[0]].reshape(x.shape)
