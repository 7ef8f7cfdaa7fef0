"""Block-size arithmetic shared by the shipped kernels: ragged sizes are padded up to a
whole number of blocks, and blocks shrink for small inputs instead of padding them a lot."""
from __future__ import annotations

import jax.numpy as jnp


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def row_block(n: int, block: int, minimum: int = 8) -> int:
    """`block`, or the smallest power of two >= max(n, minimum) when n is smaller (GPU
    Pallas wants power-of-two block shapes; 8 rows is a sublane tile on TPU)."""
    if n >= block:
        return block
    size = minimum
    while size < n:
        size *= 2
    return size


def pad_rows(a, block: int, axis: int = 0, value=0):
    """`a` padded with `value` along `axis` to a multiple of `block`."""
    n = a.shape[axis]
    extra = round_up(n, block) - n
    if extra == 0:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths, constant_values=value)


def accumulator(dtype):
    """The type statistics are computed in: float32 for half types, else the input's own."""
    return jnp.promote_types(dtype, jnp.float32)


def power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def triton_friendly(platform_name: str, *sizes: int) -> bool:
    """Whether dimensions a kernel takes whole suit the platform: Pallas on GPUs (Triton)
    wants power-of-two block shapes of at least 16; elsewhere anything goes."""
    return platform_name != "gpu" or all(power_of_two(n) and n >= 16 for n in sizes)
