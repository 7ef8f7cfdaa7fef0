"""Lowerings: indexing family (advanced indexing, gathers, scatters, masks, embeddings).

Writes with possibly repeated targets follow torch's CPU result on every backend: a plain
write keeps the LAST update for each target (`put_flat` finds it with a scatter-max of
update positions, so XLA's unordered scatter cannot pick another one), accumulating
writes add every update. Negative indices wrap as in torch. Indices out of range are not
checked inside compiled code (XLA clamps gathers and drops scatters).

Boolean masks in `index`/`index_put` give data-dependent shapes; those lowerings are
registered with jit=False and call jitted helpers, so the common integer case is one
cached executable and a mask is turned into integer indices on concrete arrays.
"""
from __future__ import annotations
import functools
import math
import os
import sys
import warnings
import jax
import jax.numpy as jnp
import numpy as np
import torch
from .promotion import cast, promote, require_dtype
from .reductions import vector_norm
from . import index_probes as probes
from .registry import family, has_index, Padding
from .views import wrap_dim
from ..dtypes import c10_name, to_torch

lowering = family(not_paddable="no padding rule yet: its indices address positions of a possibly padded dim")

aten = torch.ops.aten
INT64 = jnp.int64


# --------------------------------------------------------------------------- helpers
def wrap_index(index, size: int):
    """Negative indices count from the end (torch semantics), as int64."""
    index = index.astype(INT64)
    return jnp.where(index < 0, index + size, index)


def put_flat(flat, targets, updates, accumulate: bool, float_accumulation: bool = False):
    """Write `updates` at flat positions `targets` of the 1-D array `flat`.

    accumulate adds every update; otherwise the last update for each target wins, as in
    torch's (serial) CPU kernels, independent of the backend's scatter order.
    float_accumulation: float16/bfloat16 sums in float32, rounded once (CPU's scatter_add;
    its index_put accumulates in the tensor's own dtype).
    """
    updates = jnp.broadcast_to(updates, targets.shape).reshape(-1).astype(flat.dtype)
    targets = targets.reshape(-1)
    if accumulate:
        if flat.dtype == jnp.bool_:
            return flat.at[targets].max(updates, mode="drop")  # bool add is logical or
        if float_accumulation and flat.dtype in (jnp.float16, jnp.bfloat16):  # as CPU's scatter_add, index_add
            return flat.astype(jnp.float32).at[targets].add(updates.astype(jnp.float32), mode="drop").astype(flat.dtype)
        return flat.at[targets].add(updates, mode="drop")
    order = jnp.arange(targets.shape[0], dtype=INT64)
    last = jnp.full(flat.shape, -1, INT64).at[targets].max(order, mode="drop")
    return jnp.where(last >= 0, updates[jnp.clip(last, 0)] if targets.shape[0] else flat, flat)


def flat_positions(shape, coords):
    """Row-major flat position from per-dim coordinate arrays (broadcast together)."""
    strides = np.cumprod((1,) + tuple(shape[::-1]))[::-1][1:]
    pos = jnp.zeros((), INT64)
    for c, s in zip(coords, strides):
        pos = pos + c.astype(INT64) * int(s)
    return pos


def _as_1d(x):
    return x.reshape(1) if x.ndim == 0 else x


# --------------------------------------------------------------------------- index / index_put
def _is_mask(i):
    return i is not None and i.dtype in (jnp.bool_, jnp.uint8)


_UINT8_INDEX = "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."
_PACKAGES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def check_index_dtypes(indices) -> None:
    """CPU's IndexError for an index tensor of another dtype than int64, int32, uint8 or bool
    (XLA would index with a float's truncation, or an int16's value)."""
    for i in indices:
        if i is not None and i.dtype not in (jnp.int64, jnp.int32, jnp.uint8, jnp.bool_):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")


def _warn_uint8_masks(indices) -> None:
    """CPU's deprecation warning, once per uint8 index tensor of the call (as expandTensors
    warns), attributed to the caller's line outside torch and torch_pjrt as a C++ warning is.
    Here, not at trace time: index and index_put are jit=False, so this runs on every call."""
    for i in indices:
        if i is not None and i.dtype == jnp.uint8:
            frame, level = sys._getframe(1), 2
            while frame is not None and frame.f_code.co_filename.startswith(_PACKAGES):
                frame, level = frame.f_back, level + 1
            warnings.warn(_UINT8_INDEX, UserWarning, stacklevel=level)


_SORT_AT_MOST = 1 << 16  # mask elements


def _selected_first(mask):
    """(flat positions of mask's nonzero elements in order, then padding positions; how many are
    nonzero): a length that does not depend on the data. A stable sort of a small mask compiles in
    about a third of jnp.nonzero(size=...)'s time (80 vs 210 ms on this CPU); a large mask is
    compacted (cumsum and scatter), which costs n rather than n log n when it runs."""
    flat = mask.reshape(-1) != 0
    if flat.size <= _SORT_AT_MOST:
        order = jnp.argsort(~flat, stable=True)
    else:
        (order,) = jnp.nonzero(flat, size=flat.size, fill_value=0)
    return order, jnp.count_nonzero(flat)


@jax.jit
def _padded_coordinates(mask):
    """The coordinates of mask's nonzero elements first (then the others'), and their count: one
    executable per mask shape."""
    order, count = _selected_first(mask)
    return jnp.unravel_index(order, mask.shape), count


@functools.partial(jax.jit, static_argnums=(1, 2))
def _head(x, axis: int, length: int):
    """x's first `length` elements along `axis`: the only executable a mask's count keys."""
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def check_mask_shapes(self, indices) -> None:
    """CPU's IndexError for a mask whose shape is not that of the dims it spans (the gather
    would read other elements than the mask names, or clamp)."""
    dim = 0
    for i in indices:
        if _is_mask(i):
            for j, n in enumerate(i.shape):
                if dim + j < self.ndim and n != self.shape[dim + j]:
                    raise IndexError(f"The shape of the mask {list(i.shape)} at index {j} does not match the shape "
                                     f"of the indexed tensor {list(self.shape)} at index {dim + j}")
            dim += i.ndim
        else:
            dim += 1


def expand_masks(self, indices):
    """Replace each bool/uint8 mask by its nonzero coordinates (concrete arrays only).
    jnp.nonzero of a concrete mask would run its dozen primitives one by one, each compiled
    again for each count; here the coordinates come padded, with their count, from one executable
    per mask shape, and only a slice is compiled per count."""
    out, pending = [], []
    for i in indices:
        if _is_mask(i) and i.ndim:
            coordinates, count = _padded_coordinates(i)
            pending.append((len(out), len(coordinates), count))
            out.extend(coordinates)
        else:
            out.extend(jnp.nonzero(i) if _is_mask(i) else (i,))  # (a 0-d mask: torch's indexing unsqueezes those)
    for (at, n, _), count in zip(pending, jax.device_get([count for *_, count in pending])):  # one host read
        out[at:at + n] = [_head(c, 0, int(count)) for c in out[at:at + n]]
    return out


def _index_key(shape, indices):
    if len(indices) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)} (got {len(indices)})")
    return tuple(slice(None) if i is None else wrap_index(i, shape[d]) for d, i in enumerate(indices))


@jax.jit
def _index_ints(self, indices):
    return self[_index_key(self.shape, indices)]


@lowering(aten.index.Tensor, jit=False, index_probes=probes.advanced, host_indices=True,
          jit_for_integer_indices=True)
@lowering(aten._unsafe_index.Tensor, jit=False, jit_for_integer_indices=True)
def index(self, indices):
    indices = list(indices)
    check_index_dtypes(indices)
    if any(_is_mask(i) for i in indices):
        _warn_uint8_masks(indices)
        check_mask_shapes(self, indices)
        given = [d for d, i in enumerate(indices) if i is not None]
        where = given[0]
        if len(given) == 1 and 0 < indices[where].ndim <= self.ndim - where:  # self[..., mask]: one executable per shape
            padded, count = _index_padded(self, indices[where], where)
            return _head(padded, where, int(count))  # the count: the one host read
        indices = expand_masks(self, indices)
    return _index_ints(self, indices)


@functools.partial(jax.jit, static_argnums=(2,))
def _index_padded(self, mask, where: int):
    """self[(:,) * where + (mask,)] with the selected elements first along dim `where`, then
    the others, and how many are selected."""
    order, count = _selected_first(mask)
    merged = self.reshape(self.shape[:where] + (-1,) + self.shape[where + mask.ndim:])
    return jnp.take(merged, order, axis=where), count


def _index_put_ints(self, indices, values, accumulate):
    """Every element the indexing selects gets its flat position; then one flat write."""
    positions = jnp.arange(self.size, dtype=INT64).reshape(self.shape)
    targets = _index_ints(positions, indices)
    values = jnp.broadcast_to(values.astype(self.dtype), targets.shape)
    return put_flat(self.reshape(-1), targets, values, accumulate).reshape(self.shape)


@functools.partial(jax.jit, static_argnums=(3,))
def _index_put_jit(self, indices, values, accumulate):
    return _index_put_ints(self, indices, values, accumulate)


def check_values_dtype(self, indices, values, accumulate) -> None:
    """CPU's error for values of another dtype than self (pjrt cast them). CPU writes one value
    through one mask with masked_fill_, which casts: that call is let through."""
    if np.dtype(values.dtype) == np.dtype(self.dtype):
        return
    given = [i for i in indices if i is not None]
    if not accumulate and math.prod(values.shape) == 1 and len(given) == 1 and _is_mask(given[0]):
        return
    raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                       f"{c10_name(to_torch(self.dtype))} for the destination and {c10_name(to_torch(values.dtype))} "
                       f"for the source.")


def check_mask_values(self, mask, where: int, values) -> None:
    """CPU's error for values that do not broadcast to self[(:,)*where + mask]'s shape. The
    selection's length along the mask's dims is the mask's count: read (a host sync, as CPU's and
    CUDA's nonzero are) only when values has a dim there other than 1."""
    selected = self.shape[:where] + (None,) + self.shape[where + mask.ndim:]
    at = values.ndim - (len(selected) - where)  # values' dim aligned with the selection's
    if values.ndim <= len(selected) and (at < 0 or values.shape[at] == 1) and all(
            v in (1, n) for v, n in zip(values.shape[::-1], selected[::-1]) if n is not None):
        return
    if isinstance(mask, jax.core.Tracer):
        return  # compiled graphs do not check (as for index bounds)
    count = int(jnp.count_nonzero(mask))
    result = [count if n is None else n for n in selected]
    if values.ndim > len(result) or not all(v in (1, n) for v, n in zip(values.shape[::-1], result[::-1])):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {result}")


@functools.partial(jax.jit, static_argnums=(2, 4))
def _index_put_mask(self, mask, where, values, accumulate):
    """self[(:,)*where + mask] = values without a data-dependent shape.

    The selected elements, in order, are the True positions of `mask`; the k-th of them
    takes row k of `values` along the mask's dim (a cumsum says which k each position is).
    """
    k = mask.ndim
    sel_shape = self.shape[:where] + (-1,) + self.shape[where + k:]
    nd = len(sel_shape)
    values = values.astype(self.dtype)
    values = values.reshape((1,) * (nd - values.ndim) + values.shape)
    rank = (jnp.cumsum(mask.reshape(-1), dtype=INT64) - 1).reshape(mask.shape)
    rows = values.shape[where]
    if rows == 0:  # nothing selected
        return self
    gathered = jnp.take(values, jnp.clip(rank, 0, rows - 1) if rows > 1 else jnp.zeros_like(rank), axis=where)
    full = jnp.broadcast_to(gathered, self.shape)
    m = mask.reshape((1,) * where + mask.shape + (1,) * (self.ndim - where - k))
    if accumulate:
        return jnp.where(m, self + full, self) if self.dtype != jnp.bool_ else self | (m & full)
    return jnp.where(m, full, self)


@lowering(aten.index_put.default, jit=False, index_probes=probes.advanced, host_indices=True,
          jit_for_integer_indices=True)
@lowering(aten._unsafe_index_put.default, jit=False, jit_for_integer_indices=True)
def index_put(self, indices, values, accumulate=False):
    indices = list(indices)
    check_index_dtypes(indices)
    masks = [d for d, i in enumerate(indices) if _is_mask(i)]
    if masks:
        given = [i for i in indices if i is not None]
        if not accumulate and len(given) == 1 and given[0].dtype == jnp.uint8 and jnp.size(values) == 1:
            # CPU writes one value through one mask with masked_fill_, which refuses uint8 masks
            raise TypeError("index_put_: a uint8 mask with a single value")
        _warn_uint8_masks(indices)
        check_mask_shapes(self, indices)
        only = masks[0]
        if len(masks) == 1 and indices[only].ndim > 0 and all(i is None for i in indices[:only]) \
                and all(i is None for i in indices[only + 1:]):
            check_mask_values(self, indices[only], only, values)
            check_values_dtype(self, indices, values, accumulate)
            return _index_put_mask(self, indices[only].astype(jnp.bool_), only, values, accumulate)
        indices = expand_masks(self, indices)  # mixed masks and integer indices: concrete nonzero
    check_values_dtype(self, indices, values, accumulate)
    return _index_put_jit(self, indices, values, accumulate)


@lowering(aten._index_put_impl.default, jit=False, index_probes=probes.advanced, host_indices=True,
          jit_for_integer_indices=True)
def _index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    """index_put's implementation (advanced indexing's backward calls its in-place form);
    `unsafe` only skips checks torch's CPU kernel makes anyway."""
    return index_put(self, indices, values, accumulate)


def _clamp_indices(self, indices):
    return [None if i is None else jnp.clip(i, -self.shape[d], self.shape[d] - 1) for d, i in enumerate(indices)]


@lowering(aten._unsafe_masked_index.default)
def _unsafe_masked_index(self, mask, indices, fill):
    """self[indices] where mask, else fill (decompositions of padded gathers; indices are ints)."""
    picked = _index_ints(self, _clamp_indices(self, indices))  # masked-off indices may be out of range
    return jnp.where(mask, picked, cast(fill, self.dtype))


@lowering(aten._unsafe_masked_index_put_accumulate.default)
def _unsafe_masked_index_put_accumulate(self, mask, indices, values):
    values = jnp.where(mask, values.astype(self.dtype), jnp.zeros((), self.dtype))
    return _index_put_ints(self, _clamp_indices(self, indices), values, accumulate=True)


# --------------------------------------------------------------------------- gather / scatter
def _trim_to(x, shape, skip):
    """x sliced to `shape` in every dim but `skip` (torch lets index be smaller than self)."""
    key = tuple(slice(None) if d == skip else slice(0, n) for d, n in enumerate(shape))
    return x[key]


@lowering(aten.gather.default, index_probes=probes.along_dim(RuntimeError, probes.OUT_OF_BOUNDS))
def gather(self, dim, index, *, sparse_grad=False):
    dim = wrap_dim(dim, self.ndim)
    if index.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    x, idx = _as_1d(self), _as_1d(index)
    x = _trim_to(x, idx.shape, dim)
    out = jnp.take_along_axis(x, wrap_index(idx, x.shape[dim]), axis=dim, mode="clip")
    return out.reshape(index.shape)


def scatter_targets(self, dim, index):
    """Flat position in self of each element of `index` along `dim`."""
    x, idx = _as_1d(self), _as_1d(index)
    coords = [wrap_index(idx, x.shape[dim]) if d == dim else jax.lax.broadcasted_iota(INT64, idx.shape, d)
              for d in range(idx.ndim)]
    return flat_positions(x.shape, coords)


def _scatter(self, dim, index, src, reduce=None):
    dim = wrap_dim(dim, self.ndim)
    if index.size == 0:
        return self
    targets = scatter_targets(self, dim, index)
    updates = _trim_to(_as_1d(src), _as_1d(index).shape, -1) if jnp.ndim(src) else src
    flat = self.reshape(-1)
    if reduce is None:
        out = put_flat(flat, targets, updates, accumulate=False)
    elif reduce in ("add", "sum"):
        out = put_flat(flat, targets, updates, accumulate=True, float_accumulation=True)
    elif reduce == "multiply":
        out = flat.at[targets.reshape(-1)].multiply(jnp.broadcast_to(updates, targets.shape).reshape(-1)
                                                    .astype(flat.dtype), mode="drop")
    else:
        raise RuntimeError(f"reduce argument must be either add or multiply. Got {reduce}")
    return out.reshape(self.shape)


@lowering(aten.scatter.src, aten.scatter.value, scalar_fits="value", index_probes=probes.along_dim(RuntimeError, probes.OUT_OF_BOUNDS))
def scatter(self, dim, index, src):
    src = src if jnp.ndim(src) else cast(src, self.dtype)
    return _scatter(self, dim, index, src)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce, scalar_fits="value",
          index_probes=probes.along_dim(RuntimeError, probes.OUT_OF_BOUNDS))
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    src = src if jnp.ndim(src) else cast(src, self.dtype)
    return _scatter(self, dim, index, src, reduce)


@lowering(aten.scatter_add.default, index_probes=probes.along_dim(RuntimeError, probes.OUT_OF_BOUNDS))
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


def _identity(op, dtype):
    if op == "amax":
        return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else (jnp.iinfo(dtype).min if dtype != jnp.bool_ else False)
    if op == "amin":
        return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else (jnp.iinfo(dtype).max if dtype != jnp.bool_ else True)
    return 1 if op == "prod" else 0


@lowering(aten.scatter_reduce.two, index_probes=probes.along_dim(RuntimeError, probes.OUT_OF_BOUNDS))
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _scatter_reduce(self, dim, index, src, reduce, include_self, float_accumulation=True)


def _scatter_reduce(self, dim, index, src, reduce, include_self, float_accumulation):
    """float_accumulation: float16/bfloat16 sums (and means) in float32, rounded once, as CPU's
    scatter_reduce; else in the dtype, update by update, as CPU's index_reduce."""
    dim = wrap_dim(dim, self.ndim)
    if index.size == 0:
        return self
    if self.dtype == jnp.bool_ and reduce in ("sum", "prod"):  # bool + is or, bool * is and
        reduce = "amax" if reduce == "sum" else "amin"
    targets = scatter_targets(self, dim, index).reshape(-1)
    updates = _trim_to(_as_1d(src), _as_1d(index).shape, -1).reshape(-1).astype(self.dtype)
    flat = self.reshape(-1)
    hit = jnp.zeros(flat.shape, jnp.bool_).at[targets].set(True, mode="drop")
    base = flat if include_self else jnp.where(hit, jnp.asarray(_identity(reduce, self.dtype), self.dtype), flat)
    if reduce in ("sum", "mean"):
        out = put_flat(base, targets, updates, accumulate=True, float_accumulation=float_accumulation)
    elif reduce == "prod":
        out = base.at[targets].multiply(updates, mode="drop")
    else:
        nan = jnp.zeros(flat.shape, jnp.bool_)
        if jnp.issubdtype(self.dtype, jnp.floating):  # torch propagates NaN; XLA's max may not
            nan = jnp.zeros(flat.shape, jnp.bool_).at[targets].max(jnp.isnan(updates), mode="drop")
            nan = nan | jnp.isnan(base)
        out = (base.at[targets].max if reduce == "amax" else base.at[targets].min)(updates, mode="drop")
        out = jnp.where(nan, jnp.asarray(jnp.nan, self.dtype), out) if jnp.issubdtype(self.dtype, jnp.floating) \
            else out
    if reduce == "mean":
        count = jnp.zeros(flat.shape, INT64).at[targets].add(1, mode="drop") + int(include_self)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(self.dtype, jnp.inexact):
            out = out / count.astype(self.dtype)
        else:
            out = jnp.floor_divide(out, count.astype(self.dtype))
        out = jnp.where(hit, out, flat)
    return out.reshape(self.shape).astype(self.dtype)


# --------------------------------------------------------------------------- index_* along a dim
def _along(ndim, dim, key):
    return (slice(None),) * dim + (key,)


# The index dtypes each index_* op takes, and CPU's error for another (promotion.require_dtype).
_INDEX_DTYPES = {
    "index_select": ((np.int32, np.int64), RuntimeError, "index_select(): Expected dtype int32 or int64 for index"),
    "index_add": ((np.int32, np.int64), RuntimeError, "index_add_(): Expected dtype int32/int64 for index but got: {}"),
    "index_reduce": ((np.int32, np.int64), RuntimeError,
                     "index_reduce_(): Expected dtype int32/int64 for index but got: {}"),
    "index_copy": ((np.int64,), RuntimeError, "index_copy_(): Expected a long tensor for index, but got {}"),
    "index_fill": ((np.int64,), IndexError, "index_fill_(): Expected dtype int64 for index."),
}


def _dim_index(op: str, self, dim, index):
    """(dim wrapped, the index flat and wrapped) for index_<op>, whose index dtype is checked."""
    require_dtype(index, *_INDEX_DTYPES[op])
    dim = wrap_dim(dim, self.ndim)
    n = self.shape[dim] if self.ndim else 1
    return dim, wrap_index(index.reshape(-1), n)


@lowering(aten.index_select.default, index_probes=probes.along_dim(IndexError, probes.IN_SELF))
def index_select(self, dim, index):
    dim, idx = _dim_index("index_select", self, dim, index)
    if self.ndim == 0:  # a 0-d self gives a 0-d result
        return jnp.take(self.reshape(1), idx, mode="clip").reshape(())
    return jnp.take(self, idx, axis=dim, mode="clip")


@lowering(aten.index_add.default, scalar_fits="alpha", index_probes=probes.along_dim(IndexError, probes.IN_SELF))
def index_add(self, dim, index, source, *, alpha=1):
    dim, idx = _dim_index("index_add", self, dim, index)
    compute, _ = promote(source, alpha)
    scaled = (cast(source, compute) * alpha).astype(self.dtype) if self.dtype != jnp.bool_ \
        else source.astype(jnp.bool_)
    x = _as_1d(self)
    scaled = scaled.reshape(x.shape[:dim] + (idx.shape[0],) + x.shape[dim + 1:])
    if self.dtype == jnp.bool_:
        out = x.at[_along(x.ndim, dim, idx)].max(scaled, mode="drop")
    else:
        out = x.at[_along(x.ndim, dim, idx)].add(scaled, mode="drop")
    return out.reshape(self.shape)


@lowering(aten.index_reduce.default, index_probes=probes.along_dim(IndexError, probes.IN_SELF))
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """scatter_reduce with the index repeated along source's other dimensions."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    require_dtype(index, *_INDEX_DTYPES["index_reduce"])
    dim = wrap_dim(dim, self.ndim)
    source = _as_1d(source)
    index = index.reshape(-1).reshape((1,) * dim + (-1,) + (1,) * (source.ndim - dim - 1))
    index = jnp.broadcast_to(wrap_index(index, self.shape[dim] if self.ndim else 1), source.shape)
    return _scatter_reduce(_as_1d(self), dim, index, source, reduce, include_self,
                           float_accumulation=False).reshape(self.shape)


@lowering(aten.index_copy.default, index_probes=probes.along_dim(IndexError, "index_copy_(): " + probes.OUT_OF_BOUNDS))
def index_copy(self, dim, index, source):
    """Rows of source copied to rows `index` of self along dim; the last duplicate wins."""
    dim, idx = _dim_index("index_copy", self, dim, index)
    x = _as_1d(self)
    n = x.shape[dim]
    source = source.astype(self.dtype).reshape(x.shape[:dim] + (idx.shape[0],) + x.shape[dim + 1:])
    last = jnp.full((n,), -1, INT64).at[idx].max(jnp.arange(idx.shape[0], dtype=INT64), mode="drop")
    rows = jnp.take(source, jnp.clip(last, 0), axis=dim, mode="clip") if idx.shape[0] else x
    hit = (last >= 0).reshape((1,) * dim + (n,) + (1,) * (x.ndim - dim - 1))
    return jnp.where(hit, rows, x).reshape(self.shape)


def _index_fill(self, dim, index, value):
    if jnp.iscomplexobj(value) and not jnp.iscomplexobj(self):  # (a dtype: known while tracing)
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    dim, idx = _dim_index("index_fill", self, dim, index)
    x = _as_1d(self)
    n = x.shape[dim]
    hit = jnp.zeros((n,), jnp.bool_).at[idx].set(True, mode="drop")
    hit = hit.reshape((1,) * dim + (n,) + (1,) * (x.ndim - dim - 1))
    return jnp.where(hit, cast(value, self.dtype), x).reshape(self.shape)


@lowering(aten.index_fill.int_Scalar, scalar_fits="value",
          index_probes=probes.along_dim(IndexError, probes.OUT_OF_BOUNDS, negative_ok=True))
def index_fill(self, dim, index, value):
    return _index_fill(self, dim, index, value)


@lowering(aten.index_fill.int_Tensor,
          index_probes=probes.along_dim(IndexError, probes.OUT_OF_BOUNDS, negative_ok=True))
def index_fill_tensor(self, dim, index, value):
    if value.ndim != 0:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    return _index_fill(self, dim, index, value)


# --------------------------------------------------------------------------- masks
@lowering(aten.masked_fill.Scalar, scalar_fits="value")
def masked_fill(self, mask, value):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    return jnp.where(mask, cast(value, self.dtype), jnp.broadcast_to(self, shape))


@lowering(aten.masked_fill.Tensor)
def masked_fill_tensor(self, mask, value):
    if value.ndim != 0:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    return masked_fill(self, mask, value)


@lowering(aten.masked_scatter.default, index_probes=probes.masked_scatter)
def masked_scatter(self, mask, source):
    """The k-th True position of mask takes source's k-th element (k from a cumsum)."""
    if mask.dtype != jnp.bool_:
        raise TypeError(f"masked_scatter: a {np.dtype(mask.dtype).name} mask")  # CPU names the refusal
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    x, m = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
    rank = jnp.cumsum(m.reshape(-1), dtype=INT64) - 1
    src = source.reshape(-1).astype(self.dtype)
    if src.shape[0] == 0:
        return x
    picked = jnp.take(src, jnp.clip(rank, 0, src.shape[0] - 1)).reshape(shape)
    return jnp.where(m, picked, x)


@lowering(aten.masked_select.default, jit=False)
def masked_select(self, mask):
    if mask.dtype != jnp.bool_:
        raise TypeError(f"masked_select: a {np.dtype(mask.dtype).name} mask")  # CPU names the refusal
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    if not shape:  # 0-d: (at most) one element
        return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]
    padded, count = _masked_select_padded(self, mask, shape)
    return _head(padded, 0, int(count))  # the count: the one host read


@functools.partial(jax.jit, static_argnums=(2,))
def _masked_select_padded(self, mask, shape):
    """masked_select's elements first, then the others, and how many are selected (see index)."""
    mask = jnp.broadcast_to(mask, shape)
    order, count = _selected_first(mask)
    return jnp.broadcast_to(self, shape).reshape(-1)[order], count


@lowering(aten.take.default, index_probes=probes.take)
def take(self, index):
    return jnp.take(self.reshape(-1), wrap_index(index, self.size), mode="clip") if self.size else \
        jnp.zeros(index.shape, self.dtype)


@lowering(aten.put.default, index_probes=probes.take)  # the same flat index into self as take
def put(self, index, source, accumulate=False):
    # CPU's put_ checks, which its meta kernel does not make (a float index would be truncated)
    if index.dtype != jnp.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got {c10_name(to_torch(index.dtype))}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{c10_name(to_torch(self.dtype))} and source.dtype = {c10_name(to_torch(source.dtype))}")
    targets = wrap_index(index, self.size)
    return put_flat(self.reshape(-1), targets, source.reshape(targets.shape), accumulate).reshape(self.shape)


@lowering(aten.nonzero.default, jit=False)
def nonzero(self):
    if self.ndim == 0:
        return jnp.zeros((int(self != 0), 0), INT64)
    padded, count = _nonzero_padded(self)
    return _head(padded, 0, int(count))  # the count: the one host read


@jax.jit
def _nonzero_padded(self):
    """nonzero's rows first, then the other elements' coordinates, and how many are nonzero (see index)."""
    coordinates, count = _padded_coordinates(self)
    return jnp.stack(coordinates, axis=1).astype(INT64), count


@lowering(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    if self.size == 0:  # jnp.nonzero ignores fill_value for an empty input
        return jnp.full((size, self.ndim), fill_value, INT64)
    x = self.reshape(1) if self.ndim == 0 else self
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    out = jnp.stack(coords, axis=1).astype(INT64)
    return out[:, :0] if self.ndim == 0 else out


# --------------------------------------------------------------------------- where
def _where(condition, a, b):
    _, dtype = promote(a, b)
    return jnp.where(condition.astype(jnp.bool_), cast(a, dtype), cast(b, dtype))


@lowering(aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)  # where.self: elementwise.py
def where(condition, self, other):
    return _where(condition, self, other)


# --------------------------------------------------------------------------- embeddings
# padding_idx is traced: the forward ignores it, the backward compares indices with it (-1, no
# padding index, equals no index), so its values share one executable.
@lowering(aten.embedding.default, padding=Padding("embedding"), index_probes=probes.embedding, traced=("padding_idx",))
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices.astype(INT64), axis=0, mode="clip")


@lowering(aten.embedding_dense_backward.default, padding=Padding("embedding_backward"), traced=("padding_idx",))
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1).astype(INT64)
    grad = grad_output.reshape(idx.shape[0], -1)
    keep = (idx != padding_idx)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), INT64).at[idx].add(1, mode="drop")
        grad = grad / jnp.take(counts, idx, mode="clip")[:, None].astype(grad.dtype)
    grad = jnp.where(keep, grad, jnp.zeros((), grad.dtype))
    acc = grad.astype(jnp.float32) if grad.dtype in (jnp.float16, jnp.bfloat16) else grad
    out = jnp.zeros((num_weights, acc.shape[1]), acc.dtype).at[idx].add(acc, mode="drop")
    return out.astype(grad_output.dtype).reshape(num_weights, *grad_output.shape[indices.ndim:])


@lowering(aten.embedding_renorm.default, index_probes=probes.embedding_renorm)  # embedding_renorm_ is derived from it
def embedding_renorm(self, indices, max_norm, norm_type):
    """embedding_renorm_'s functional form (the in-place op is derived from it): each row named
    by `indices` (once, however often it repeats) whose norm exceeds max_norm is scaled by
    max_norm / (norm + 1e-7), as CPU does: the norm in self's dtype, the scale in double and
    then rounded to self's dtype, the product in float32 for float16/bfloat16."""
    if self.ndim != 2:
        raise RuntimeError(f"embedding_renorm_: Expected 2-dimensional tensor, but got {self.ndim}-dimensional "
                           f"tensor for argument #1 'self' (while checking arguments for embedding_renorm_)")
    if np.dtype(indices.dtype) not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise RuntimeError("embedding_renorm_: Expected tensor for argument #2 'indices' to have one of the following "
                           f"scalar types: Long, Int; but got {np.dtype(indices.dtype).name} instead "
                           "(while checking arguments for embedding_renorm_)")
    rows = jnp.zeros((self.shape[0],), jnp.bool_).at[wrap_index(indices.reshape(-1), self.shape[0])].set(
        True, mode="drop")
    norm = vector_norm(self, norm_type, [1], False, None).astype(jnp.float64)
    scale = max_norm / (norm + 1e-7)
    compute = jnp.float32 if self.dtype in (jnp.float16, jnp.bfloat16) else self.dtype
    scaled = (self.astype(compute) * scale.astype(self.dtype).astype(compute)[:, None]).astype(self.dtype)
    return jnp.where((rows & (norm > max_norm))[:, None], scaled, self)


# ----------------------------------------------------------------------- embedding bags
# mode: 0 sum, 1 mean, 2 max. A bag's rows are indices[offsets[b]:offsets[b+1]] (the last bag
# runs to the end, even with include_last_offset); rows equal to padding_idx (>= 0) count
# in no bag. half/bf16 accumulate in float32 as CPU's kernels do. The auxiliary outputs are
# CPU's: offset2bag is empty on CPU's fast sum path (float/half/bf16 weights, no padding),
# bag_size holds the bag lengths except for sum (zeros), max_indices the weight rows that
# gave each maximum (mode max), bag_size again (mean) or zeros (sum). The backward
# lowerings recompute each position's bag from offsets, so an empty offset2bag is fine.
# padding_idx (-1: none; F.embedding_bag makes a negative one count from the end) is a traced
# value: indices are >= 0, so `idx != padding_idx` keeps every row without one. Only whether
# there is one fixes a shape (offset2bag's), so the forward takes it split (registry.Split:
# that part static), the backward lowerings plain traced; ~50 values share one executable.
# CPU reads indices (and per-sample weights) by their flat positions whatever their shape.
def _position_bags(indices, offsets, num_bags):
    """The bag of each position of the 1-D `indices`."""
    starts = offsets[:num_bags].astype(INT64)
    return jnp.searchsorted(starts, jnp.arange(indices.shape[0], dtype=INT64), side="right") - 1


def _accumulation_dtype(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _bag_rows(values, bags, num_bags, reduce):
    return reduce(values, bags, num_segments=num_bags, indices_are_sorted=True)


def _embedding_bag_max(rows, keep, idx, bags, num_bags):
    """Per bag and column: the maximum (0 for an empty bag) and the weight row holding it (first)."""
    lowest = jnp.array(-jnp.inf, rows.dtype)
    best = _bag_rows(jnp.where(keep[:, None], rows, lowest), bags, num_bags, jax.ops.segment_max)
    hit = keep[:, None] & (rows == jnp.take(best, bags, axis=0))
    positions = jnp.where(hit, jnp.arange(idx.shape[0], dtype=INT64)[:, None], idx.shape[0])
    first = _bag_rows(positions, bags, num_bags, jax.ops.segment_min)
    found = first < idx.shape[0]
    if idx.shape[0] == 0:  # no index at all: every bag is empty
        return jnp.zeros(best.shape, rows.dtype), jnp.zeros(best.shape, INT64)
    rows_of_max = jnp.where(found, jnp.take(idx, jnp.minimum(first, idx.shape[0] - 1), mode="clip"), 0)
    return jnp.where(found, best, jnp.zeros((), rows.dtype)), rows_of_max


def _embedding_bag_outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                           sum_aux_size):
    if weight.ndim != 2 or mode not in (0, 1, 2):  # meta checks neither: CPU names the error (eager's oracle)
        raise ValueError(f"embedding_bag: weight of {weight.ndim} dims, mode {mode}")
    if per_sample_weights is not None and per_sample_weights.dtype != weight.dtype:  # nor this (CPU and CUDA refuse)
        raise ValueError(f"embedding_bag: per_sample_weights of {per_sample_weights.dtype}, weight of {weight.dtype}")
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    idx = indices.reshape(-1).astype(INT64)
    bags = _position_bags(idx, offsets, num_bags)
    keep = idx != padding_idx.value
    acc = _accumulation_dtype(weight.dtype)
    rows = jnp.take(weight, idx, axis=0, mode="clip").astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1).astype(acc)[:, None]
    counts = _bag_rows(keep.astype(INT64), bags, num_bags, jax.ops.segment_sum).astype(offsets.dtype)
    if mode == 2:
        out, max_indices = _embedding_bag_max(rows, keep, idx, bags, num_bags)
        max_indices = max_indices.astype(offsets.dtype)
    else:
        out = _bag_rows(jnp.where(keep[:, None], rows, jnp.zeros((), acc)), bags, num_bags, jax.ops.segment_sum)
        if mode == 1:
            out = out / jnp.maximum(counts, 1).astype(acc)[:, None]
        max_indices = counts if mode == 1 else jnp.zeros((sum_aux_size,), offsets.dtype)
    fast_sum = mode == 0 and weight.dtype in (jnp.float32, jnp.float16, jnp.bfloat16) and not padding_idx.static
    offset2bag = jnp.zeros((0,), offsets.dtype) if fast_sum else bags.astype(offsets.dtype)
    bag_size = jnp.zeros((sum_aux_size,), offsets.dtype) if mode == 0 else counts
    return out.astype(weight.dtype), offset2bag, bag_size, max_indices


@lowering(aten._embedding_bag.default, index_probes=probes.embedding_bag, split={"padding_idx": has_index})
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    return _embedding_bag_outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                  padding_idx, num_bags)


@lowering(aten._embedding_bag_forward_only.default, index_probes=probes.embedding_bag,
          split={"padding_idx": has_index})
def _embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                                per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """As _embedding_bag, but CPU sizes sum mode's (zero) bag_size and max_indices like offsets."""
    return _embedding_bag_outputs(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                  padding_idx, offsets.shape[0])


@lowering(aten._embedding_bag_backward.default, traced=("padding_idx",),
          eager="eager/sparse.py: sparse=True builds a COO gradient with torch's composite; else this lowering")
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:  # a traced graph holds dense arrays only; eager serves sparse=True (eager/sparse.py)
        raise NotImplementedError("pjrt: embedding_bag(sparse=True) under torch.compile: its COO gradient has no "
                                  "compiled form on pjrt; run it eagerly, or use sparse=False")
    indices = indices.reshape(-1)
    bags = _position_bags(indices, offsets, grad.shape[0])
    return _embedding_bag_dense_backward(grad, indices, bags, bag_size, maximum_indices, num_weights,
                                         scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowering(aten._embedding_bag_dense_backward.default, traced=("padding_idx",))
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                  scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    acc = _accumulation_dtype(grad.dtype)
    g = grad.astype(acc)
    if mode == 2:
        rows = jnp.where((bag_size > 0)[:, None], maximum_indices.astype(INT64), num_weights)
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        out = jnp.zeros((num_weights, g.shape[1]), acc).at[rows, cols].add(g, mode="drop")
        return out.astype(grad.dtype)
    idx = indices.reshape(-1).astype(INT64)
    bags = offset2bag.astype(INT64)
    if mode == 1:
        g = g / jnp.maximum(bag_size, 1).astype(acc)[:, None]
    per_position = jnp.take(g, bags, axis=0)
    if per_sample_weights is not None:
        per_position = per_position * per_sample_weights.reshape(-1).astype(acc)[:, None]
    keep = idx != padding_idx
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), INT64).at[idx].add(1, mode="drop")
        per_position = per_position / jnp.take(counts, idx, mode="clip").astype(acc)[:, None]
    per_position = jnp.where(keep[:, None], per_position, jnp.zeros((), acc))
    out = jnp.zeros((num_weights, g.shape[1]), acc).at[idx].add(per_position, mode="drop")
    return out.astype(grad.dtype)


@lowering(aten._embedding_bag_per_sample_weights_backward.default, traced=("padding_idx",))
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    idx = indices.reshape(-1).astype(INT64)
    bags = _position_bags(idx, offsets, grad.shape[0])
    acc = _accumulation_dtype(grad.dtype)
    rows = jnp.take(weight, idx, axis=0, mode="clip").astype(acc)
    out = jnp.sum(jnp.take(grad, bags, axis=0).astype(acc) * rows, axis=1)
    keep = idx != padding_idx
    return jnp.where(keep, out, jnp.zeros((), acc)).astype(grad.dtype)
