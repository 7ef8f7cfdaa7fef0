"""segment_reduce and its backward, as torch's CPU kernels compute them (SegmentReduce.cpp).

Segments run along the data's dim `lengths.dim() - 1` (torch forces that axis), given by
lengths or offsets with data's leading dims before them. Each position gets its segment's
id (positions past the last segment get none) and XLA's segment reductions do the rest.
CPU's quirks are kept: NaN wins max and min, an empty mean is NaN (or `initial`), the max/min
gradient is shared among ties only where it is positive, and a product's gradient at a zero
or NaN is the product of the others. The data checks of a safe call (no negative length,
lengths summing to the axis) run where the values are on the host: these lowerings are not
jitted in eager (a sync point, like unique's).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .promotion import require_dtype
from .registry import family

lowering = family(not_paddable="segments are given by data")

aten = torch.ops.aten
INT64 = jnp.int64
REDUCTIONS = ("max", "mean", "min", "sum", "prod")


def _layout(data, lengths, offsets, unsafe: bool = True):
    """data as (outer, N, inner), and per outer row the segments' starts and lengths (outer, S)."""
    bounds = lengths if lengths is not None else offsets
    if bounds is None:
        raise RuntimeError("segment_reduce(): Either lengths or offsets must be defined")
    require_dtype(bounds, (np.int32, np.int64), NotImplementedError, "\"segment_reduce\" not implemented for '{}'")
    axis = bounds.ndim - 1
    outer = int(np.prod(data.shape[:axis], dtype=np.int64))
    x = data.reshape(outer, data.shape[axis], -1)
    bounds = bounds.reshape(outer, -1).astype(INT64)
    if lengths is not None:
        starts, counts = jnp.cumsum(bounds, axis=1) - bounds, bounds
    else:
        starts, counts = bounds[:, :-1], jnp.diff(bounds, axis=1)
    if not unsafe and not isinstance(counts, jax.core.Tracer):
        if bool(jnp.any(counts < 0)):
            raise RuntimeError("lengths contains negative value!")
        if lengths is not None and bool(jnp.any(jnp.sum(counts, axis=1) != data.shape[axis])):
            raise RuntimeError("segment_reduce(): Expected all rows of lengths along axis to sum to "
                               "data.size(lengths.dim()-1) when !unsafe.")
    return x, starts, counts, axis


def _segment_ids(starts, counts, n: int):
    """(outer, N): each position's segment, or S where it is in none."""
    positions = jnp.arange(n, dtype=INT64)

    def row(start, count):
        s = jnp.clip(jnp.searchsorted(start, positions, side="right") - 1, 0, max(start.shape[0] - 1, 0))
        inside = (positions >= jnp.take(start, s)) & (positions < jnp.take(start + count, s))
        return jnp.where(inside & (start.shape[0] > 0), s, start.shape[0])

    return jax.vmap(row)(starts, counts)


def _per_row(fn, x, ids, segments: int):
    return jax.vmap(lambda v, i: fn(v, i, num_segments=segments))(x, ids)


def _initial(reduce: str, initial, dtype):
    if initial is not None:
        return jnp.asarray(initial, dtype)
    return jnp.asarray({"max": -jnp.inf, "min": jnp.inf, "prod": 1, "sum": 0, "mean": 0}[reduce], dtype)


@lowering(aten.segment_reduce.default, jit=False)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if reduce not in REDUCTIONS:
        raise RuntimeError(f"unsupported reduction given! {reduce}")
    x, starts, counts, axis = _layout(data, lengths, offsets, unsafe)
    segments = starts.shape[1]
    ids = _segment_ids(starts, counts, x.shape[1])
    start = _initial(reduce, initial, data.dtype)
    if reduce in ("sum", "mean"):
        out = _per_row(jax.ops.segment_sum, x, ids, segments) + start
    elif reduce == "prod":
        out = _per_row(jax.ops.segment_prod, x, ids, segments) * start
    else:
        best = _per_row(jax.ops.segment_max if reduce == "max" else jax.ops.segment_min, x, ids, segments)
        best = (jnp.maximum if reduce == "max" else jnp.minimum)(best, start)
        nan = _per_row(jax.ops.segment_max, jnp.isnan(x), ids, segments)
        out = jnp.where(nan, jnp.full((), jnp.nan, data.dtype), best)
    if reduce == "mean":
        n = counts[:, :, None].astype(data.dtype)
        empty = counts[:, :, None] == 0
        mean = jnp.where(jnp.isnan(out), out, out / jnp.where(empty, 1, n))
        out = jnp.where(empty, start if initial is not None else jnp.full((), jnp.nan, data.dtype), mean)
    shape = data.shape[:axis] + (segments,) + data.shape[axis + 1:]
    return out.astype(data.dtype).reshape(shape)


@lowering(aten._segment_reduce_backward.default, jit=False)
def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    x, starts, counts, _ = _layout(data, lengths, offsets)
    segments = starts.shape[1]
    ids = _segment_ids(starts, counts, x.shape[1])
    inside = (ids < segments)[:, :, None]
    zero = jnp.zeros((), data.dtype)

    def at_positions(per_segment):
        """(outer, S, inner) -> each position's segment value (outer, N, inner)."""
        return jnp.take_along_axis(per_segment.reshape(x.shape[0], segments, -1),
                                   jnp.minimum(ids, max(segments - 1, 0))[:, :, None], axis=1)

    g, out = at_positions(grad), at_positions(output)
    if reduce == "sum":
        result = g
    elif reduce == "mean":
        result = g / at_positions(counts[:, :, None].astype(data.dtype))
    elif reduce in ("max", "min"):
        tie = jnp.isnan(x) | (x == out)
        ties = at_positions(_per_row(jax.ops.segment_sum, tie.astype(INT64), ids, segments))
        result = jnp.where(tie, g, zero)
        result = jnp.where((ties >= 2) & (result > 0), result / ties.astype(data.dtype), result)
    else:  # prod
        start = _initial("prod", initial, data.dtype)
        special = jnp.isnan(x) | (x == 0)
        rest = _per_row(jax.ops.segment_prod, jnp.where(special, jnp.ones((), data.dtype), x), ids, segments)
        zeros = _per_row(jax.ops.segment_sum, (x == 0).astype(INT64), ids, segments)
        nans = _per_row(jax.ops.segment_sum, jnp.isnan(x).astype(INT64), ids, segments)
        other_zeros = at_positions(zeros) - (x == 0)
        other_nans = at_positions(nans) - jnp.isnan(x)
        exclusive = jnp.where(other_nans > 0, jnp.full((), jnp.nan, data.dtype),
                              jnp.where(other_zeros > 0, zero, at_positions(rest))) * start
        result = jnp.where(special, g * exclusive, g * out / jnp.where(special, 1, x))
    return jnp.where(inside, result, zero).astype(data.dtype).reshape(data.shape)
