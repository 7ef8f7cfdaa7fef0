"""grid_sample: input values at the grid's normalized coordinates, 2-D and 3-D, and their backward.

Bilinear (trilinear in 3-D) and nearest run one dimension-generic sampler: the grid's last
axis holds (x, y[, z]), which address the input's spatial dims from the last; bicubic
exists only in 2-D, as in torch. The backward ops are the forward's VJP.
"""
from __future__ import annotations

import functools
import itertools
import math
import operator

import jax
import jax.numpy as jnp
import torch

from .nn import _acc, I64
from .registry import family

lowering = family(not_paddable="a gather at data-given coordinates")

aten = torch.ops.aten

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _grid_unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    c = jnp.abs(coord - lo)
    extra = jnp.fmod(c, span)
    flips = jnp.floor(c / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _grid_pad_index(c, size, padding_mode, align_corners):
    if padding_mode == BORDER:
        return jnp.clip(c, 0, size - 1)
    c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
    return jnp.clip(c, 0, size - 1)


def _grid_source(coord, size, padding_mode, align_corners):
    c = _grid_unnormalize(coord, size, align_corners)
    return c if padding_mode == ZEROS else _grid_pad_index(c, size, padding_mode, align_corners)


def _tap(x, positions):
    """x[n, :, p0, p1, ...] for integer-valued coordinate maps (N, *out) per spatial dim, zero
    outside -> (N, C, *out)."""
    sizes = x.shape[2:]
    ok = functools.reduce(operator.and_, [(p >= 0) & (p < size) for p, size in zip(positions, sizes)])
    clipped = [jnp.clip(p, 0, size - 1).astype(I64) for p, size in zip(positions, sizes)]
    values = jax.vmap(lambda image, *at: image[(slice(None), *at)])(x, *clipped)
    return jnp.where(ok[:, None], values, jnp.zeros((), x.dtype))


def _sample_linear_or_nearest(input, grid, interpolation_mode, padding_mode, align_corners):
    """Bilinear/trilinear or nearest sampling over any number of spatial dims."""
    acc = _acc(input.dtype)
    x, g = input.astype(acc), grid.astype(acc)
    sizes = input.shape[2:]
    # grid[..., 0] is x (the last spatial dim), grid[..., 1] y, grid[..., 2] z
    coords = [_grid_source(g[..., len(sizes) - 1 - d], size, padding_mode, align_corners)
              for d, size in enumerate(sizes)]
    if interpolation_mode == NEAREST:  # ties to even, as nearbyint
        return _tap(x, [jnp.round(c) for c in coords]).astype(input.dtype)
    lows = [jnp.floor(c) for c in coords]
    fractions = [c - low for c, low in zip(coords, lows)]
    out = 0
    for corner in itertools.product((0, 1), repeat=len(sizes)):
        weight = math.prod(f if up else 1 - f for f, up in zip(fractions, corner))
        out = out + _tap(x, [low + up for low, up in zip(lows, corner)]) * weight[:, None]
    return out.astype(input.dtype)


def _grid_sample_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode != BICUBIC:
        return _sample_linear_or_nearest(input, grid, interpolation_mode, padding_mode, align_corners)
    # bicubic: unclamped source coordinates, each tap padded by padding_mode
    _, _, H, W = input.shape
    acc = _acc(input.dtype)
    x, g = input.astype(acc), grid.astype(acc)
    ix = _grid_unnormalize(g[..., 0], W, align_corners)
    iy = _grid_unnormalize(g[..., 1], H, align_corners)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    tx, ty = ix - x0, iy - y0
    A = -0.75

    def coeffs(t):
        c1 = lambda v: ((A + 2) * v - (A + 3)) * v * v + 1  # noqa: E731
        c2 = lambda v: ((A * v - 5 * A) * v + 8 * A) * v - 4 * A  # noqa: E731
        return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]

    def padded(yy, xx):
        if padding_mode != ZEROS:
            yy = _grid_pad_index(yy, H, padding_mode, align_corners)
            xx = _grid_pad_index(xx, W, padding_mode, align_corners)
        return _tap(x, [yy, xx])

    cx, cy = coeffs(tx), coeffs(ty)
    out = 0
    for j in range(4):
        row = 0
        for i in range(4):
            row = row + padded(y0 - 1 + j, x0 - 1 + i) * cx[i][:, None]
        out = out + row * cy[j][:, None]
    return out.astype(input.dtype)


def _backward(sample, grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, vjp = jax.vjp(lambda x, g: sample(x, g, interpolation_mode, padding_mode, align_corners), input, grid)
    gi, gg = vjp(grad_output.astype(input.dtype))
    if interpolation_mode == NEAREST:
        gg = jnp.zeros_like(grid)  # torch: nearest sampling has no grid gradient
    return (gi if output_mask[0] else None), (gg if output_mask[1] else None)


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_2d(input, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _backward(_grid_sample_2d, grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                     output_mask)


@lowering(aten.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _sample_linear_or_nearest(input, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _backward(_sample_linear_or_nearest, grad_output, input, grid, interpolation_mode, padding_mode,
                     align_corners, output_mask)
