"""Lowerings: fft family.

torch.fft's functions reach three core ops (torch/_refs/fft.py builds every one of them,
hfft and ihfft included, from these plus conj): `_fft_r2c` (real to complex), `_fft_c2r`
(complex to real) and `_fft_c2c`. Their `normalization` is the scale applied to the
transform whatever its direction: 0 none, 1 by 1/sqrt(n), 2 by 1/n, n the product of the
signal sizes over `dim` (for c2r, the real output's). The transforms below are therefore
unnormalized (jnp's inverse with norm="forward" is the unscaled one) and scaled here.
XLA's FFT takes at most three axes, so longer `dim` lists run as successive transforms.
"""
from __future__ import annotations
import math

import jax.numpy as jnp
import torch
from .registry import family

lowering = family(not_paddable="a transform mixes every element along its dims: padding would change it")


aten = torch.ops.aten


def _scale(x, n, normalization):
    if normalization == 0:
        return x
    factor = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return x * jnp.asarray(factor, dtype=x.real.dtype)


def _c2c(x, dims, forward):
    """Unnormalized complex transform over `dims`, at most three axes per XLA FFT."""
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    norm = "backward" if forward else "forward"
    for start in range(0, len(dims), 3):
        x = transform(x, axes=dims[start:start + 3], norm=norm)
    return x


def _signal_size(shape, dims):
    return math.prod(shape[d] for d in dims)


@lowering(aten._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
    dims = list(dim)
    if not dims:
        return self
    return _scale(_c2c(self, dims, forward), _signal_size(self.shape, dims), normalization)


@lowering(aten._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
    dims = list(dim)
    n = _signal_size(self.shape, dims)
    if not onesided:
        return _scale(_c2c(self.astype(jnp.result_type(self.dtype, jnp.complex64)), dims, True), n, normalization)
    out = jnp.fft.rfft(self, axis=dims[-1], norm="backward")
    return _scale(_c2c(out, dims[:-1], True), n, normalization)


@lowering(aten._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
    dims = list(dim)
    x = _c2c(self, dims[:-1], False)
    out = jnp.fft.irfft(x, n=last_dim_size, axis=dims[-1], norm="forward")
    n = _signal_size(self.shape, dims[:-1]) * last_dim_size
    return _scale(out, n, normalization)
