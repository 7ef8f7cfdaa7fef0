"""Layer 3: storages hold one immutable JAX buffer; tensors are views of it.

A pjrt tensor is (storage, size, stride, offset) as in any PyTorch backend. The storage's
buffer lives in the C++ DataPtr context and covers the whole storage, row-major (its
shape is whatever produced it; its dtype may differ from a tensor's after view(dtype)).

* `read(t)` resolves the view: free when the tensor is exactly its buffer, otherwise one
  jit-cached executable per geometry (slice/reshape/transpose/broadcast; a gather only
  for overlapping views such as unfold with step < size).
* `write(t, value)` is a functional update that swaps the storage's buffer, so every
  view of the storage sees it. The old buffer is donated when the storage is its only
  owner, which keeps in-place updates O(written bytes) where XLA allows.
* In fused eager mode (fused.py) a buffer may be a `Pending` value: every executable here is
  a `Recordable`, so reads and writes of pending storages are recorded into the region too;
  `read` and `download` need arrays, and run the region.
* A storage that grows along one axis (a KV cache `cat` token by token) may hold a `Padded`
  buffer: its physical array is longer than the tensor along that axis, so the ops that know
  how (their entry's `grows` trait) run one executable per capacity, not per length. Every
  other reader sees the exact value (`Padded.resolve`, inside its own executable).
"""
from __future__ import annotations

from typing import NamedTuple

import collections
import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import fused, index_checks as bounds, platform
from .fused import Pending, Recordable, keyed
from .build import load as _load_runtime
from ..dtypes import JAX_TO_TORCH, TORCH_TO_JAX, astype, to_jax, to_torch

_rt = _load_runtime()
_rt.set_dtype_map(JAX_TO_TORCH)
whole_buffer = _rt.whole_buffer  # tensor -> its buffer when it is exactly the buffer, else None

# The latest results, so synchronize() also waits for work whose outputs were already
# dropped (PJRT queues work per device; a few recent results cover what is in flight).
_recent: collections.deque = collections.deque(maxlen=32)


def wrap(array, device: int) -> torch.Tensor:
    """A new pjrt tensor on `device` that owns `array`: contiguous, or for a Permuted result
    the permutation of its physical array that has torch's strides."""
    if isinstance(array, Padded):
        _note_recent(array.array)
        return _rt.wrap(array, list(array.shape), to_torch(array.dtype), device)
    if isinstance(array, Permuted):
        physical = array.array
        _note_recent(physical)
        return _rt.wrap_array(physical, device).permute(array.inverse)
    _note_recent(array)
    return _rt.wrap_array(array, device)


def _note_recent(array) -> None:
    if type(array) is not Pending:  # a pending value is waited for by running its region
        _recent.append(array)


@jax.tree_util.register_pytree_node_class
class Permuted:
    """An executable's output whose physical layout is a permutation of its logical dims:
    `array` = transpose(logical value, perm). Its tensor has the strides torch's meta kernel
    gives (channels_last and friends), while the storage stays one row-major buffer."""

    __slots__ = ("array", "perm", "inverse")

    def __init__(self, array, perm: tuple, inverse: tuple | None = None):
        # inverse: the permute() of the physical array that gives the logical tensor (the C++
        # kernel reads it on every call, so it travels precomputed)
        self.array, self.perm = array, perm
        self.inverse = inverse_permutation(perm) if inverse is None else inverse

    def logical(self) -> jax.Array:
        return _transpose(self.array, self.inverse)

    def tree_flatten(self):
        return (self.array,), (self.perm, self.inverse)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)


_transpose = Recordable(jax.jit(jnp.transpose, static_argnums=1), static=(1,), name="transpose",
                        key=f"{__name__}._transpose")


# ---------------------------------------------------------------------------------
# storages that grow along one axis
# ---------------------------------------------------------------------------------
MIN_CAPACITY = 16


def power_of_two_at_least(n: int) -> int:
    """The bucket of a size that varies: eager's growing storages and the compiler's pow2 buckets."""
    return 1 << max(n - 1, 0).bit_length()


def capacity_for(length: int) -> int:
    """The padded extent a growing axis of `length` gets: the next power of two (from 16), so
    a cache growing token by token touches log2(length) capacities."""
    return max(MIN_CAPACITY, power_of_two_at_least(length))


@jax.tree_util.register_pytree_node_class
class Padded:
    """A storage buffer longer than its tensor along `axis`: elements at and past `length`
    there are junk. `length` is static (the host knows it); an executable that reads the
    value resolves it to the exact array. The ops whose entries say they grow receive it as
    a `PaddedOperand` instead, with the length traced."""

    __slots__ = ("array", "axis", "length")

    def __init__(self, array, axis: int, length: int):
        self.array, self.axis, self.length = array, axis, length

    @property
    def shape(self) -> tuple:
        shape = list(self.array.shape)
        shape[self.axis] = self.length
        return tuple(shape)

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def capacity(self) -> int:
        return self.array.shape[self.axis]

    def resolve(self) -> jax.Array:
        return jax.lax.slice_in_dim(self.array, 0, self.length, axis=self.axis)

    def to_host(self) -> np.ndarray:
        """The exact value on the host: a slice of the transferred array (no executable)."""
        index = [slice(None)] * self.array.ndim
        index[self.axis] = slice(0, self.length)
        return np.asarray(self.array)[tuple(index)]

    def tree_flatten(self):
        return (self.array,), (self.axis, self.length)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    @classmethod
    def of(cls, value: jax.Array, axis: int, capacity: int) -> "Padded":
        """`value` (exact) padded to `capacity` along `axis`: one executable per shape."""
        return cls(_pad_to(tuple(value.shape), value.dtype, axis, capacity)(value), axis, value.shape[axis])

    def grown(self, capacity: int) -> "Padded":
        """The same value with room for `capacity` along its axis."""
        if capacity <= self.capacity:
            return self
        return Padded(_pad_to(tuple(self.array.shape), self.dtype, self.axis, capacity)(self.array), self.axis,
                      self.length)


@functools.lru_cache(1024)
@keyed
def _pad_to(shape: tuple, dtype, axis: int, capacity: int):
    widths = [(0, 0)] * len(shape)
    widths[axis] = (0, capacity - shape[axis])
    return Recordable(jax.jit(lambda x: jnp.pad(x, widths)), name="pad to capacity")


def inverse_permutation(perm: tuple) -> tuple:
    return tuple(int(i) for i in np.argsort(perm))


def laid_out(result, meta):
    """`result` (an array or a tuple of them, traced) laid out as the meta kernel's outputs:
    an output whose meta strides are a dense permutation other than row-major becomes a
    Permuted; every other output stays row-major."""
    if isinstance(result, (tuple, list)):
        metas = meta if isinstance(meta, (tuple, list)) and len(meta) == len(result) else [None] * len(result)
        return type(result)(laid_out(r, m) for r, m in zip(result, metas))
    perm = _dense_permutation(meta, result) if isinstance(result, jax.Array) else None
    return result if perm is None else Permuted(jnp.transpose(result, perm), perm)


def layout_of(t: torch.Tensor, memory_format=None) -> tuple | None:
    """The dim permutation (outermost first) of the layout torch gives a copy of `t` with
    `memory_format` (None: preserve), when that layout is dense but not row-major; else None."""
    if memory_format in (None, torch.preserve_format):
        if t.is_contiguous() and t.numel():  # (an empty tensor is "contiguous" whatever its strides)
            return None
        perm = _dense_permutation(t, t)
        return perm if perm is not None else _preserved_layout(tuple(t.shape), tuple(t.stride()))
    if memory_format == torch.contiguous_format:
        return None
    like = torch.empty_like(torch.empty(t.shape, dtype=t.dtype, device="meta"), memory_format=memory_format)
    return _dense_permutation(like, t)


@functools.lru_cache(1024)
def _preserved_layout(shape: tuple, stride: tuple) -> tuple | None:
    """layout_of a tensor that is not dense (a strided slice of a channels_last tensor): torch's
    empty_like, asked of a meta tensor with its strides, gives it a dense layout in the order of
    its strides (channels_last there)."""
    like = torch.empty_like(torch.empty_strided(shape, stride, device="meta"))
    return _dense_permutation(like, like)


def wrap_laid_out(array: jax.Array, device: int, perm: tuple | None) -> torch.Tensor:
    """wrap(array) with the layout `perm` (from layout_of): its storage holds the permuted data."""
    return wrap(array if perm is None else Permuted(_transpose(array, perm), perm), device)


def _dense_permutation(meta, result):
    """The dim order (outermost first) of meta's strides when they are a non-row-major
    permutation of a dense layout of result's shape; else None. A size-1 dim's stride counts
    where a permutation gives it meta's: the tensor's strides are then meta's exactly."""
    if not isinstance(meta, torch.Tensor) or meta.dim() < 2 or tuple(meta.shape) != tuple(result.shape):
        return None
    shape, stride = tuple(meta.shape), tuple(meta.stride())
    # a size-1 dim goes inside the other dims of its stride: its stride is then the product of the
    # sizes inside it, as TensorIterator gives it (exp of a (1, 3, 4) view with strides (2, 2, 6) has
    # strides (1, 1, 3); outside, the result had (3, 1, 3))
    perm = tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], shape[d] == 1, d)))
    expected, exact = 1, True
    for d in reversed(perm):  # dense: each dim's stride is the product of the faster dims' sizes
        if shape[d] != 1 and stride[d] != expected:
            return None
        exact = exact and stride[d] == expected
        expected *= max(shape[d], 1)
    if perm == tuple(range(len(shape))) or (meta.is_contiguous() and not exact):
        return None  # row-major, or row-major but for size-1 dims whose strides no permutation gives
    return perm


@platform.raises_torch_errors
def synchronize(index: int = -1) -> None:
    """Block until the device (-1: every device) has finished all queued work: the recorded calls
    run, then the latest results are waited for (PJRT runs a device's work in the order it was
    queued, so the latest results cover what is in flight): the latest op-by-op results and copies
    (`_recent`) and the latest regions' outputs (`fused._recent_outputs`). Not every live array:
    a model's weights and cached scalars are hundreds of arrays long finished (80 us a call).
    What it waited for (and what is gone) leaves that bookkeeping: the next synchronize waits only
    for what came since (a step then a synchronize walks that step's results, not 256 weak references)."""
    fused.flush_all("synchronize")
    target = None if index < 0 or len(platform.devices()) == 1 else platform.device(index)
    copies, outputs = list(_recent), list(fused._recent_outputs)
    latest = copies + [a for a in (ref() for ref in outputs) if a is not None]
    pending = [a for a in latest if not a.is_deleted() and (target is None or target in a.devices())]

    def elsewhere(a) -> bool:  # a result of another device: it stays for that device's synchronize
        return target is not None and a is not None and not a.is_deleted() and target not in a.devices()

    def forget() -> None:
        _forget_oldest(_recent, copies, elsewhere)
        _forget_oldest(fused._recent_outputs, outputs, lambda ref: elsewhere(ref()))

    try:
        jax.block_until_ready(pending)
    except Exception:  # a result's error (XLA's out of memory) is raised once, not at every later synchronize
        forget()
        raise
    forget()


def _forget_oldest(recent: collections.deque, oldest: list, keep) -> None:
    """Drop the `oldest` entries (read before the wait; another thread may have appended since)
    from `recent`, but those `keep` says to keep."""
    for _ in range(min(len(oldest), len(recent))):
        recent.popleft()
    recent.extendleft(reversed([entry for entry in oldest if keep(entry)]))


def unshared(array: jax.Array, holders: int) -> bool:
    """True when only `holders` references (e.g. the storage and the caller) hold `array`,
    not counting synchronize's bookkeeping: then it can be donated to XLA."""
    bookkeeping = sum(1 for a in _recent if a is array)
    return sys.getrefcount(array) - bookkeeping <= holders + 2  # + this parameter + getrefcount's argument


# ---------------------------------------------------------------------------------
# reads
# ---------------------------------------------------------------------------------
def read(t: torch.Tensor) -> jax.Array:
    """The logical value of pjrt tensor `t` as a JAX array."""
    return fused.concrete(read_deferred(t))


def read_deferred(t: torch.Tensor):
    """The logical value of pjrt tensor `t`: a JAX array, or in fused mode a Pending value."""
    operand = read_lazily(t)
    return operand if type(operand) in (_ARRAY, Pending) else _read_view(operand)


_ARRAY = type(jnp.zeros(()))
_read_view = Recordable(jax.jit(lambda view: view.resolve()), name="read view", key=f"{__name__}._read_view")


def read_lazily(t: torch.Tensor):
    """`t`'s buffer when it is exactly the buffer, else a StridedView that the consuming
    executable resolves, so a view costs no executable of its own."""
    buf = _rt.whole_buffer(t)
    if buf is not None:
        return buf
    buf = _rt.buffer(t)
    if not (isinstance(buf, Padded) and np.prod(buf.shape) * buf.dtype.itemsize >= _rt.storage_nbytes(t)):
        buf = _materialized_buffer(t)
    return view_of(buf, (tuple(t.shape), tuple(t.stride()), t.storage_offset(), to_jax(t.dtype), t.is_conj(),
                         t.is_neg()))


def view_of(buffer, geometry: tuple) -> "StridedView":
    """The StridedView of `geometry` over a storage's buffer (the C++ fast path calls it too). Over
    a Padded buffer the geometry is carried over to the padded array where it can be, so a view
    of a growing tensor (its last token) costs one executable per capacity, not per length (the
    runtime's padded_view, which the fast path's views take too)."""
    if type(buffer) is Padded:
        return _rt.padded_view(buffer, geometry)
    return StridedView(buffer, geometry)


class Geometry(NamedTuple):
    """Where a view's elements lie in its storage's buffer (static in executables)."""

    size: tuple
    stride: tuple
    offset: int
    dtype: object  # the view's JAX dtype
    conj: bool = False  # torch's lazy conjugate bit
    neg: bool = False  # torch's lazy negative bit
    # the view is a rectangular block of the buffer laid out as a grid by its strides, at its offset
    # (no dim carries into the next): read with one N-d dynamic slice (see _is_block)
    block: bool = False


@jax.tree_util.register_pytree_node_class
class StridedView:
    """A tensor's geometry over its storage's buffer: an operand an executable resolves
    (the C++ fast path builds it too, with the geometry as a plain tuple)."""

    __slots__ = ("buffer", "_geometry")

    def __init__(self, buffer, geometry: tuple):
        self.buffer, self._geometry = buffer, geometry  # converted only when read by name (rare)

    @property
    def geometry(self) -> Geometry:
        g = self._geometry
        return g if type(g) is Geometry else Geometry(*g)

    @property
    def shape(self) -> tuple:
        return self._geometry[0]

    @property
    def dtype(self):
        return self._geometry[3]

    def tree_flatten(self):
        # the offset is traced: x[i] for every i is one executable, not one per i. Offset 0 (a
        # transpose, a reshape, an expand of a whole buffer: most views) is static instead: one
        # input less for each call and region that reads the view (a region's jitted call costs
        # about 1 us an input), for one more executable where a view's offset is 0 only sometimes
        g = self._geometry
        if type(g) is Geometry:  # unflattened from leaves (a recorded call): the offset is a value
            if type(g.offset) is int and g.offset == 0:
                return (self.buffer,), g
            return (self.buffer, offset_operand(g.offset)), g._replace(offset=None)
        static = _STATIC_GEOMETRY.get(g)
        if static is None:
            if len(_STATIC_GEOMETRY) > 4096:
                _STATIC_GEOMETRY.clear()
            static = _STATIC_GEOMETRY[g] = Geometry(*g)._replace(offset=0 if g[2] == 0 else None,
                                                                 block=_is_block(g[0], g[1], g[2]))
        if static.offset == 0:
            return (self.buffer,), static
        return (self.buffer, offset_operand(g[2])), static

    @classmethod
    def tree_unflatten(cls, static, children):
        if static.offset == 0:  # (None: traced, a leaf)
            return cls(children[0], static)
        return cls(children[0], static._replace(offset=children[1]))  # children may be tracers

    def resolve(self) -> jax.Array:
        """The view's value (traced inside the consumer's executable)."""
        return read_view(self.buffer, *self._geometry)


_STATIC_GEOMETRY: dict = {}  # a view's geometry -> its static part (the pytree's aux data), per call otherwise rebuilt
_OFFSETS: dict = {}


def offset_operand(offset):
    """A storage offset as a cached int64 device scalar (a Python int would be converted,
    a host-to-device copy, on every call)."""
    if not isinstance(offset, int):
        return offset  # already traced
    array = _OFFSETS.get(offset)
    if array is None:
        # a transfer, not jnp.asarray: outside a trace that runs JAX's eager convert, an
        # executable found through JAX's least-recently-used caches (built again once a long
        # process has evicted it: a build in a loop that builds nothing)
        array = jax.device_put(np.int64(offset))
        if isinstance(array, jax.core.Tracer):
            # made inside a trace: cached, that trace's tracer would leak into the next trace,
            # whose executable would then take it as an input no caller passes
            return array
        if len(_OFFSETS) > 4096:
            _OFFSETS.clear()
        _OFFSETS[offset] = array
    return array


def _materialized_buffer(t: torch.Tensor) -> jax.Array:
    """The storage's buffer, created (zeros: fresh memory) or grown (after resize_) as needed."""
    buf = _rt.buffer(t)
    nbytes = _rt.storage_nbytes(t)
    if isinstance(buf, Padded):  # a write or a resize: the storage takes its exact value
        buf = _resolve_padded(buf)
        _rt.set_buffer(t, buf, buf.shape, to_torch(buf.dtype))
    if buf is None:
        dtype = to_jax(t.dtype)
        buf = _fresh(nbytes // dtype.itemsize, dtype, _uninitialized(t, dtype), t.get_device())()
        _rt.set_buffer(t, buf, buf.shape, t.dtype)
    elif buf.size * buf.dtype.itemsize < nbytes:
        grown = _grow(buf.size, nbytes // buf.dtype.itemsize, buf.dtype, _uninitialized(t, buf.dtype))(buf)
        _rt.set_buffer(t, grown, grown.shape, to_torch(grown.dtype))
        buf = grown
    return buf


_resolve_padded = Recordable(jax.jit(lambda padded: padded.resolve()), name="resolve padding",
                             key=f"{__name__}._resolve_padded")


@functools.lru_cache(256)
@keyed
def _fresh(n: int, dtype, fill, device: int):
    """jit(() -> fresh memory of n elements on pjrt:device): torch.empty(...).fill_(v) reads
    its target, and an op-by-op jnp.full costs ten times a cached executable. Its first run on
    its own fills on the host and copies (`_filled_on_host`)."""
    sharding = jax.sharding.SingleDeviceSharding(platform.device(device))

    def fresh_memory():
        return jnp.full((n,), fill, dtype)

    return Recordable(jax.jit(fresh_memory, out_shardings=sharding), name="fresh memory", device=device,
                      alone=_filled_on_host(n, dtype, fill, device))


HOST_FILLS = 64  # fresh memories of one size filled on the host before its executable is built
HOST_FILL_BYTES = 16 << 20  # and at most this many bytes filled on the host for one size


def _filled_on_host(n: int, dtype, fill, device: int):
    """Fresh memory run on its own, filled on the host and copied (about 40 us here for a small
    one) rather than by an executable compiled for this one size (about 30 ms, then 4 us a run):
    the first HOST_FILLS runs of a size (fewer for big ones, HOST_FILL_BYTES in all), so a size
    seen a few times (a test's random shapes, make_tensor's empty-then-fill) compiles nothing and
    one that keeps coming back builds its executable (in a compiled region it is part of the
    region's program and this never runs)."""
    left = min(HOST_FILLS, HOST_FILL_BYTES // max(n * np.dtype(dtype).itemsize, 1))
    if left == 0:
        return None

    def alone():
        nonlocal left
        if left <= 0:
            return None
        left -= 1
        return jax.device_put(np.full((n,), fill, dtype), platform.device(device))

    return alone


@functools.lru_cache(256)
@keyed
def _grow(old: int, new: int, dtype, fill):
    return Recordable(jax.jit(lambda b: jnp.concatenate([b.reshape(-1), jnp.full((new - old,), fill, dtype)])),
                      name="grow storage")


_NAN = float("nan")  # one object: a cache key holding it equals itself


def _uninitialized(t: torch.Tensor, dtype):
    """What the fresh memory of t's storage reads as: zeros, or NaN / the largest integer where it
    was made in deterministic mode with torch.utils.deterministic.fill_uninitialized_memory (empty,
    resize_: the C++ kernels note it then), as torch fills it."""
    if not _rt.deterministic_fill(t):
        return 0
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):  # bfloat16 and the float8s too (numpy's kind 'V')
        return _NAN
    if dtype == np.bool_:
        return True
    return np.iinfo(dtype).max


def _flat_as(buf: jax.Array, dtype) -> jax.Array:
    """The buffer as a flat array of `dtype`, reinterpreting bytes (Tensor.view(dtype))."""
    flat = buf.reshape(-1)
    src, dst = np.dtype(flat.dtype), np.dtype(dtype)
    if src == dst:
        return flat
    if src.kind == "c":  # complex -> its (real, imag) float pairs first
        flat, src = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1), np.dtype(f"f{src.itemsize // 2}")
        if src == dst:
            return flat
    if dst.kind == "c":
        parts = _flat_as(flat, np.dtype(f"f{dst.itemsize // 2}")).reshape(-1, 2)
        return jax.lax.complex(parts[:, 0], parts[:, 1])
    if src == np.bool_:
        flat, src = flat.astype(jnp.uint8), np.dtype(np.uint8)
    target = np.dtype(np.uint8) if dst == np.bool_ else dst
    if src.itemsize < target.itemsize:
        flat = flat.reshape(-1, target.itemsize // src.itemsize)
    out = jax.lax.bitcast_convert_type(flat, target).reshape(-1)
    return out.astype(jnp.bool_) if dst == np.bool_ else out


def _memory_order(size, stride):
    """Non-broadcast dims as (dim, size, stride), outermost first, or None if they overlap."""
    dims = sorted(((d, n, s) for d, (n, s) in enumerate(zip(size, stride)) if n != 1 and s != 0), key=lambda x: -x[2])
    for (_, _, s_outer), (_, n, s) in zip(dims, dims[1:]):
        if s_outer < n * s:
            return None
    return dims


def read_view(buf, size, stride, offset, dtype, conj=False, neg=False, block=False):
    """The value of the view (size, stride, offset, dtype) of a storage buffer, with
    torch's lazy conjugate and negative bits applied."""
    x = _strided(buf, size, stride, offset, dtype, block)
    x = jnp.conj(x) if conj else x
    return -x if neg else x


def _strided(buf, size, stride, offset, dtype, block=False):
    """The view's elements; `offset` may be traced (the geometry's other parts are static)."""
    if isinstance(buf, Padded):
        buf = buf.resolve()
    flat = _flat_as(buf, dtype)
    if 0 in size:  # no elements (its storage may be empty too)
        return jnp.zeros(size, flat.dtype)
    dims = _memory_order(size, stride)
    if dims is None:  # overlapping windows: gather
        return flat[_element_indices(size, stride, 0) + offset]
    if not dims:
        x = jax.lax.dynamic_index_in_dim(flat, offset, keepdims=False)
    elif block and flat.size % dims[0][2] == 0:
        # the buffer as a grid whose axes step by the view's strides; the view is one block of it,
        # at the offset's digits. XLA fuses this slice into its producer and consumer, where the
        # flat slice below materializes whole rows of the outermost span.
        grid, starts, box = _block_in_grid(flat.size, dims, offset)
        x = jax.lax.dynamic_slice(flat.reshape(grid), starts, box)
        x = x.reshape(x.shape[:len(dims)])
    else:  # slice the outermost span, then peel each inner dimension off by reshape + slice
        _, n0, s0 = dims[0]
        extent = 1 + sum((n - 1) * s for _, n, s in dims)  # the elements from the first to the last
        x = jax.lax.dynamic_slice_in_dim(flat, offset, extent)
        x = jnp.pad(x, (0, n0 * s0 - extent)).reshape(n0, s0)  # the last row's padding, past the view
        for _, n, s in dims[1:]:
            x = x[..., : n * s].reshape(*x.shape[:-1], n, s)
        x = x[..., 0]
    if dims:  # memory order -> logical order
        logical = [d for d, _, _ in dims]
        x = jnp.transpose(x, np.argsort(logical)) if logical != sorted(logical) else x
    kept = {d for d, _, _ in dims}
    x = x.reshape([size[d] if d in kept else 1 for d in range(len(size))])
    return jnp.broadcast_to(x, size)


def _block_in_grid(flat_size: int, dims: list, offset):
    """A block view (_is_block) as a box of its buffer seen as a grid whose axes step by the view's
    strides: (the grid's shape, the box's start on each axis: the offset's digits, the box's shape).
    `dims` is _memory_order's; `offset` may be traced. Reads slice the box, writes update it."""
    strides = [s for _, _, s in dims] + ([1] if dims[-1][2] > 1 else [])
    grid = [flat_size // strides[0]] + [outer // inner for outer, inner in zip(strides, strides[1:])]
    starts = [offset // strides[0]] + [(offset // s) % n for s, n in zip(strides[1:], grid[1:])]
    return grid, starts, [n for _, n, _ in dims] + [1] * (len(grid) - len(dims))


def _is_block(size, stride, offset: int) -> bool:
    """Whether the view is a block of its buffer seen as a grid whose axes step by the view's
    strides (each stride a multiple of the next): true when, at this offset, no dim runs past
    its grid axis into the next (the q, k and v thirds of a fused projection, x[i], x[:, 2:5];
    not a flat window that wraps across rows). Part of the static geometry, so every offset an
    executable meets is a block if one is."""
    dims = _memory_order(size, stride)
    if not dims:
        return False
    for (_, _, outer), (_, n, s) in zip(dims, dims[1:]):
        if outer % s or (offset // s) % (outer // s) + n > outer // s:
            return False
    return True


def _is_contiguous(size, stride) -> bool:
    expected = 1
    for n, s in reversed(list(zip(size, stride))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _element_indices(size, stride, offset) -> np.ndarray:
    idx = np.full(size, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return idx


# ---------------------------------------------------------------------------------
# writes
# ---------------------------------------------------------------------------------
def write(t: torch.Tensor, value) -> None:
    """Store `value` (broadcastable to t, any dtype: converted like copy_) into pjrt tensor t."""
    dtype = to_jax(t.dtype)
    shape = tuple(t.shape)
    if t.is_conj() or t.is_neg():  # store what the lazy bits will turn back into `value`
        value = _unbit(t.is_conj(), t.is_neg())(value)
    if t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == _rt.storage_nbytes(t):
        if not (type(value) in (_ARRAY, Pending) and value.shape == shape and value.dtype == dtype):
            value = _converter(shape, dtype)(value)
        _note_recent(value)
        _rt.set_buffer(t, value, shape, t.dtype)
        return
    buf = _materialized_buffer(t)
    if buf.dtype != dtype:  # a view with another dtype: make the buffer that dtype first
        flat = _reinterpret(buf, dtype)
        _rt.set_buffer(t, flat, flat.shape, t.dtype)
        buf = flat
    # the storage and `buf`: nobody else sees the old value (a fused region donates its own inputs)
    donate = not fused.active() and unshared(buf, holders=2)
    stride = tuple(t.stride())
    block = not _is_contiguous(shape, stride) and _is_block(shape, stride, t.storage_offset())
    new = _writer(shape, stride, buf.shape, dtype, donate, block)(buf, value, offset_operand(t.storage_offset()))
    del buf
    _note_recent(new)
    _rt.set_buffer(t, new, new.shape, t.dtype)


_reinterpret = Recordable(jax.jit(_flat_as, static_argnums=1), static=(1,), name="view(dtype)",
                          key=f"{__name__}._reinterpret")


@functools.lru_cache(4)
@keyed
def _unbit(conj: bool, neg: bool):
    return Recordable(jax.jit(lambda v: -(jnp.conj(v) if conj else v) if neg else (jnp.conj(v) if conj else v)),
                      name="conj/neg bits")


@functools.lru_cache(1024)
@keyed
def _converter(shape, dtype):
    return Recordable(jax.jit(lambda v: jnp.broadcast_to(astype(jnp.asarray(v), dtype), shape)), name="convert")


def _write_box(grid, box, starts):
    """`box` written into `grid` at `starts`: dynamic_update_slice's result, as a scatter of one
    window. XLA:CPU (jax 0.10.2) computed dynamic_update_slice on a reshaped grid wrongly when the
    box's values were read from the same buffer and another output read the result: a duplicated
    in-place update read elements it had already written (`b[1:9:2] = b[1:5] * 2` in one region
    gave 4 * b[2] where 2 * b[3] belongs; tests/test_write_overlaps.py)."""
    dims = tuple(range(grid.ndim))
    numbers = jax.lax.ScatterDimensionNumbers(update_window_dims=tuple(d + 1 for d in dims), inserted_window_dims=(),
                                              scatter_dims_to_operand_dims=dims)
    index = jnp.stack([jnp.asarray(start, jnp.int64) for start in starts])[None]
    return jax.lax.scatter(grid, index, box[None], numbers, indices_are_sorted=True, unique_indices=True,
                           mode=jax.lax.GatherScatterMode.CLIP)


@functools.lru_cache(4096)
@keyed
def _writer(size, stride, buf_shape, dtype, donate, block=False):
    """jit(buffer, value, offset -> new buffer) for one geometry; the offset is traced, so
    `x[i] = v` for every i is one executable. `block`: the view is a block of the buffer seen as a
    grid (_is_block at the view's offset, as reads take it)."""
    contiguous = _is_contiguous(size, stride)
    dims = _memory_order(size, stride)
    # a block every element of which is a distinct element of the view (no broadcast dim): written
    # as one box of the grid, the value transposed to memory order. A scatter to the view's element
    # positions would carry those positions as a constant of the view's size (a channels_last tensor
    # of 80M elements: a 640 MB constant, 20 s to compile, 6 s to load from the persistent cache)
    as_box = (block and dims and math.prod(buf_shape) % dims[0][2] == 0
              and len(dims) == sum(1 for n in size if n != 1))

    def write_view(buf, value, offset):
        value = jnp.broadcast_to(astype(jnp.asarray(value), dtype), size)
        flat = buf.reshape(-1)
        if contiguous:
            flat = jax.lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
        elif as_box:  # the inverse of _strided's block read
            grid, starts, box = _block_in_grid(flat.size, dims, offset)
            kept = sorted(d for d, _, _ in dims)  # the view's dims in logical order, size-1 dims dropped
            in_memory_order = jnp.transpose(value.reshape([size[d] for d in kept]),
                                            [kept.index(d) for d, _, _ in dims])
            flat = _write_box(flat.reshape(grid), in_memory_order.reshape(box), starts).reshape(-1)
        else:  # strided: scatter to the view's element positions (last write wins, as on CPU)
            flat = flat.at[(_element_indices(size, stride, 0) + offset).reshape(-1)].set(value.reshape(-1))
        return flat.reshape(buf_shape)

    return Recordable(jax.jit(write_view, donate_argnums=(0,) if donate else ()), name="write view")


# ---------------------------------------------------------------------------------
# host transfers
# ---------------------------------------------------------------------------------
# numpy lacks these dtypes; ml_dtypes provides them, same bits as torch.
_VIA_BITS = {torch.bfloat16: torch.int16} | {dt: torch.uint8 for dt in TORCH_TO_JAX if "float8" in str(dt)}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values as a numpy array (no copy where possible)."""
    if t._is_zerotensor():  # autograd's efficient zeros have no memory
        t = torch.zeros(t.shape, dtype=t.dtype)
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    bits = _VIA_BITS.get(t.dtype)
    if bits is not None:
        return t.view(bits).numpy().view(to_jax(t.dtype))
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A fresh, writable, resizable host tensor holding a copy of `a` (torch.tensor copies)."""
    dtype = to_torch(a.dtype)
    bits = _VIA_BITS.get(dtype)
    if bits is not None:
        return torch.tensor(a.view(to_jax(bits))).view(dtype)
    return torch.tensor(a)


@platform.raises_torch_errors
def upload(cpu: torch.Tensor, device: int, non_blocking: bool = False) -> jax.Array:
    """Copy a host tensor to pjrt:device; the host tensor stays the user's to change."""
    target = platform.device(device)
    platform.check_dtype(to_jax(cpu.dtype), device)
    host = to_numpy(cpu)
    if target.platform == "cpu":  # the CPU client aliases numpy memory instead of copying
        return platform.put(np.array(host), device)
    array = platform.put(host, device)
    return array if non_blocking else array.block_until_ready()


@platform.raises_torch_errors
def download(t: torch.Tensor) -> torch.Tensor:
    """A pjrt tensor's value as a new host tensor (a host sync: queued index checks raise)."""
    padded = _rt.whole_buffer(t)
    value = None if isinstance(padded, Padded) else read_deferred(t)  # a view's read joins the region: one run
    fused.flush("host read")
    bounds.raise_pending()
    if value is None:
        return from_numpy(padded.to_host())
    return from_numpy(np.asarray(fused.concrete(value)))
