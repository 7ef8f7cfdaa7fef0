"""histogram and histogramdd, as torch's CPU kernels count (aten/src/ATen/native/Histogram.cpp).

Each dimension's edges are torch's linspace between the range's ends (the data's min and max
when no range is given, 0 and 1 for no data; equal ends widen by 0.5 each way) or the given
edge tensors. An element counts in the bin whose edges hold it, the right end in the last
bin; elements outside the range or NaN count nowhere. Data with an infinite or NaN value and no
range raises CPU's error: eager reads the data's range on the host for that (`_range_as_cpu`).
"""
from __future__ import annotations

import builtins
import math

import jax.numpy as jnp
import torch

from ..dtypes import to_torch
from .registry import family
from .shape import linspace

lowering = family(not_paddable="counts every element into bins")

aten = torch.ops.aten
INT64 = jnp.int64


def _samples(self, ndim: int):
    """self as (N, D): histogramdd's last dim is the coordinate, histogram's input is flat."""
    return self.reshape(-1, ndim)


def _linear_edges(samples, bins, range_):
    edges = []
    for d, count in enumerate(bins):
        if range_ is not None:
            lo, hi = jnp.asarray(range_[2 * d], jnp.float64), jnp.asarray(range_[2 * d + 1], jnp.float64)
        elif samples.shape[0]:
            lo, hi = jnp.min(samples[:, d]).astype(jnp.float64), jnp.max(samples[:, d]).astype(jnp.float64)
        else:
            lo, hi = jnp.zeros((), jnp.float64), jnp.ones((), jnp.float64)
        equal = lo == hi
        lo, hi = jnp.where(equal, lo - 0.5, lo), jnp.where(equal, hi + 0.5, hi)
        edges.append(linspace(lo, hi, count + 1, dtype=to_torch(samples.dtype)))
    return edges


def _count(samples, edges, weight, density: bool):
    """The (bins...) histogram of samples (N, D) over per-dimension edges."""
    bins = [e.shape[0] - 1 for e in edges]
    inside = jnp.ones(samples.shape[:1], jnp.bool_)
    flat = jnp.zeros(samples.shape[:1], INT64)
    for d, e in enumerate(edges):
        x = samples[:, d]
        inside = inside & (x >= e[0]) & (x <= e[-1])  # NaN is outside
        position = jnp.clip(jnp.searchsorted(e, x, side="right") - 1, 0, bins[d] - 1)  # the right end: last bin
        flat = flat * bins[d] + position
    ones = jnp.ones(samples.shape[:1], samples.dtype)
    values = jnp.where(inside, ones if weight is None else weight.reshape(-1).astype(samples.dtype),
                       jnp.zeros((), samples.dtype))
    hist = jnp.zeros((math.prod(bins),), samples.dtype).at[flat].add(values).reshape(bins)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape((1,) * d + (-1,) + (1,) * (len(edges) - d - 1))
    return hist


def _range_as_cpu(dd: bool):
    """An `in_range`: CPU refuses a range that is not finite or whose max is below its min (in its
    words, per dimension). Without a range it is the data's (histogramdd's coordinates along the
    last dim), read on the host to check it: a sync only then."""

    def check(values) -> bool:
        self, range_ = values[0], values[2]
        if range_ is None:
            if not self.numel() or not self.dtype.is_floating_point:
                return True
            low, high = torch.aminmax(self.reshape(-1, self.shape[-1] if dd else 1), dim=0)
            range_ = [v for pair in zip(low.tolist(), high.tolist()) for v in pair]
        return all(math.isfinite(v) for v in range_) and all(
            range_[i] <= range_[i + 1] for i in builtins.range(0, len(range_), 2))

    return check


@lowering(aten.histogram.bin_ct, in_range=_range_as_cpu(dd=False))
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    samples = _samples(self, 1)
    (edges,) = _linear_edges(samples, [bins], range)
    return _count(samples, [edges], weight, density), edges


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    samples = _samples(self, 1)
    return _count(samples, [bins.astype(self.dtype)], weight, density), bins


@lowering(aten._histogramdd_bin_edges.default, in_range=_range_as_cpu(dd=True))
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return _linear_edges(_samples(self, self.shape[-1]), bins, range)


@lowering(aten._histogramdd_from_bin_cts.default, in_range=_range_as_cpu(dd=True))
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    samples = _samples(self, self.shape[-1])
    return _count(samples, _linear_edges(samples, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _count(_samples(self, self.shape[-1]), [b.astype(self.dtype) for b in bins], weight, density)
