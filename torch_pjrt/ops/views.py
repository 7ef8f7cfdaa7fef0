"""Lowerings: views family.

The functional forms of view ops as FX graphs (torch.compile, decompositions) meet them.
A lowering sees the view's base as a logical (row-major) array, so a view is a plain
jnp reshape/transpose/slice, and `as_strided` gathers from the flattened input as if it
were the storage. The `_copy` variants and the functionalization `*_scatter` ops live
here too, beside the view they invert.

`wrap_dim` / `wrap_dims` are the one place dims are normalised for this family and for
reductions, indexing and shape (they import them from here).
"""
from __future__ import annotations
import builtins
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import to_jax
from .registry import family, Padding, SAME

lowering = family(not_paddable="no padding rule yet: a view of a padded dim's storage (as_strided, unfold, diagonal) would see the padding")


aten = torch.ops.aten


# --------------------------------------------------------------------------- helpers
def wrap_dim(dim: int, ndim: int) -> int:
    """torch's maybe_wrap_dim: negative dims count from the end; 0-d tensors accept 0 and -1."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def wrap_dims(dims, ndim: int) -> tuple:
    """Wrap a dim list; None or [] means every dim (torch's reduction convention)."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    wrapped = tuple(wrap_dim(d, ndim) for d in dims)
    if len(set(wrapped)) != len(wrapped):
        raise RuntimeError(f"dim {dims} appears multiple times in the list of dims")
    return tuple(d for d in wrapped if d < ndim)  # a 0-d tensor's dim 0 is no axis


def infer_size(size, numel: int) -> tuple:
    """A view/reshape size with at most one -1 resolved (torch's infer_size)."""
    size = tuple(int(s) for s in size)
    if size.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = math.prod(s for s in size if s != -1)
    if -1 in size:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(size)}' is invalid for input of size {numel}")
        size = tuple(numel // known if s == -1 else s for s in size)
    if math.prod(size) != numel:
        raise RuntimeError(f"shape '{list(size)}' is invalid for input of size {numel}")
    return size


def strided_indices(size, stride, offset: int):
    """Flat storage index of every element of an (size, stride, offset) view."""
    idx = jnp.full(tuple(size), offset, dtype=jnp.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (jnp.arange(n, dtype=jnp.int64) * st).reshape(shape)
    return idx


def scatter_through_view(x, src, view_fn):
    """The functionalization inverse of a view: write `src` where `view_fn(x)` reads from.

    The view is applied to the flat positions of x, which says which element of x each
    element of the view is; then one flat scatter writes src there.
    """
    pos = view_fn(jnp.arange(x.size, dtype=jnp.int64).reshape(x.shape))
    src = jnp.broadcast_to(src, pos.shape).astype(x.dtype)
    return x.reshape(-1).at[pos.reshape(-1)].set(src.reshape(-1)).reshape(x.shape)


# --------------------------------------------------------------------------- reshapes
@lowering(aten.view.default, aten.view_copy.default, aten.reshape.default, padding=Padding("view"))
@lowering(aten._unsafe_view.default, padding=Padding("view"),
          eager="torch's CompositeExplicitAutograd kernel (view_impl, in C++): an alias of the same storage where "
                "a view exists, as on the CPU (kron's out= writes through one)")
def view(self, size):
    return jnp.reshape(self, infer_size(size, self.size))


@lowering(aten._reshape_alias.default, aten._reshape_alias_copy.default)
def _reshape_alias(self, size, stride):
    # reshape only emits _reshape_alias when the view exists, so its elements are the reshape's
    return jnp.reshape(self, tuple(size))


@lowering(aten.as_strided.default, aten.as_strided_copy.default,
          eager="as_strided: a view (C++ metadata kernel); as_strided_copy: eager/view_kernels.py, which "
                "addresses self's storage as CPU does (the lowering sees self's elements)")
def as_strided(self, size, stride, storage_offset=None):
    idx = strided_indices(size, stride, storage_offset or 0)
    return jnp.take(self.reshape(-1), idx, mode="clip") if self.size else jnp.zeros(tuple(size), self.dtype)


@lowering(aten.as_strided_scatter.default,
          eager="eager/view_kernels.py: CPU's composite over a copy of self's whole storage (a view's "
                "offset counts; the lowering sees self's elements only)")
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """src written through as_strided(size, stride, storage_offset) of a copy of self. CPU
    addresses self's storage; the lowering sees self's elements, which are its storage where
    self is contiguous from offset 0 over all of it (the base tensors functionalization passes)."""
    if all(n > 0 for n in size):  # CPU's setStorage bound (an empty view needs no storage)
        needed = (storage_offset or 0) + sum((n - 1) * st for n, st in zip(size, stride)) + 1
        if needed > self.size:
            raise ValueError(f"as_strided_scatter: the view needs {needed} elements, self has {self.size}")
    if any(st == 0 and n > 1 for n, st in zip(size, stride)):  # CPU's copy_ refuses an overlapping target
        raise ValueError("as_strided_scatter: the view repeats elements")
    idx = strided_indices(size, stride, storage_offset or 0)
    flat = self.reshape(-1).at[idx.reshape(-1)].set(jnp.broadcast_to(src, idx.shape).astype(self.dtype).reshape(-1))
    return flat.reshape(self.shape)


# --------------------------------------------------------------------------- dim shuffles
@lowering(aten.t.default, aten.t_copy.default, padding=Padding("t"))
def t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.T if self.ndim == 2 else self


@lowering(aten.transpose.int, aten.transpose_copy.int, padding=Padding("transpose"))
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        wrap_dim(dim0, 0), wrap_dim(dim1, 0)
        return self
    return jnp.swapaxes(self, wrap_dim(dim0, self.ndim), wrap_dim(dim1, self.ndim))


@lowering(aten.permute.default, aten.permute_copy.default, padding=Padding("permute"))
def permute(self, dims):
    if len(dims) != self.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match "
                           f"the length of the desired ordering of dimensions i.e. input.dim() = {self.ndim} "
                           f"is not equal to len(dims) = {len(dims)}")
    return jnp.transpose(self, tuple(wrap_dim(d, self.ndim) for d in dims)) if self.ndim else self


@lowering(aten.expand.default, aten.expand_copy.default, padding=Padding("expand"))
def expand(self, size, *, implicit=False):
    lead = len(size) - self.ndim
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(size)}) must be greater or equal "
                           f"to the number of dimensions in the tensor ({self.ndim})")
    shape = tuple(self.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size))
    return jnp.broadcast_to(self, shape)


@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default, padding=Padding("unsqueeze"))
def unsqueeze(self, dim):
    return jnp.expand_dims(self, wrap_dim(dim, self.ndim + 1))


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
          aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims, padding=Padding("squeeze"))
def squeeze(self, dim=None):
    dims = wrap_dims(dim, self.ndim)
    return jnp.squeeze(self, tuple(d for d in dims if self.shape[d] == 1))


# --------------------------------------------------------------------------- slicing views
def slice_bounds(n: int, start, end, step: int) -> tuple:
    """torch's slice clamping: None is the edge, negatives count from the end, then clamp."""
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end, step


def _along(ndim: int, dim: int, key) -> tuple:
    return (builtins.slice(None),) * dim + (key,)  # `slice` here is the aten.slice lowering


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor, padding=Padding("slice"))
def slice(self, dim=0, start=None, end=None, step=1):  # noqa: A001 (named after the op)
    dim = wrap_dim(dim, self.ndim)
    s, e, st = slice_bounds(self.shape[dim], start, end, step)
    return jax.lax.slice_in_dim(self, s, e, st, axis=dim) if e > s else self[_along(self.ndim, dim, np.s_[0:0])]


def _slice_length(n: int, start, end, step: int) -> int:
    s, e, st = slice_bounds(n, start, end, step)
    return len(range(s, e, st))


def _slice_scatter_in_range(values) -> bool:
    """slice_scatter's src must be as long as the slice (start and end are traced)."""
    self, src, dim, start, end, step = values
    shape = tuple(self.shape)
    if not shape or not tuple(src.shape) or step <= 0:
        return False  # CPU decides
    d = dim % len(shape)
    return len(src.shape) == len(shape) and src.shape[d] == _slice_length(shape[d], start, end, step)


def _traced_start(n: int, start):
    """A slice's start as torch clamps it, on a traced value (None: 0)."""
    if start is None:
        return 0
    if isinstance(start, int):
        return slice_bounds(n, start, None, 1)[0]
    start = jnp.where(start < 0, start + n, start)
    return jnp.clip(start, 0, n)


@lowering(aten.slice_scatter.default, traced=("start", "end"), in_range=_slice_scatter_in_range)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    """`start` and `end` are traced (a loop over starts compiles once): src's size along dim,
    which the host checks against the slice (in_range), says how many elements are written."""
    dim = wrap_dim(dim, self.ndim)
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    src = src.astype(self.dtype)
    count = src.shape[dim]
    if count == 0:
        return self
    start = _traced_start(self.shape[dim], start)
    if step == 1:
        return jax.lax.dynamic_update_slice_in_dim(self, src, start, axis=dim)
    span = (count - 1) * step + 1
    window = jax.lax.dynamic_slice_in_dim(self, start, span, axis=dim)
    window = window.at[_along(self.ndim, dim, np.s_[::step])].set(src)
    return jax.lax.dynamic_update_slice_in_dim(self, window, start, axis=dim)


def _select_index(self, dim: int, index: int) -> int:
    n = self.shape[dim]
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} at dimension {dim}")
    return index % n


@lowering(aten.select.int, aten.select_copy.int, padding=Padding("select"))
def select(self, dim, index):
    dim = wrap_dim(dim, self.ndim)
    return jax.lax.index_in_dim(self, _select_index(self, dim, index), axis=dim, keepdims=False)


def _index_in_range(sizes, dim: int, index: int) -> bool:
    sizes = tuple(sizes)
    return bool(sizes) and -sizes[dim % len(sizes)] <= index < sizes[dim % len(sizes)]


@lowering(aten.select_scatter.default, traced=("index",),
          in_range=lambda values: _index_in_range(values[0].shape, values[2], values[3]))
def select_scatter(self, src, dim, index):
    """`index` is traced (a loop over indices compiles once); the host checks its range."""
    dim = wrap_dim(dim, self.ndim)
    if isinstance(index, int):
        index = _select_index(self, dim, index)
    else:
        index = jnp.where(index < 0, index + self.shape[dim], index)
    return jax.lax.dynamic_update_index_in_dim(self, src.astype(self.dtype), index, axis=dim)


@lowering(aten.narrow.default, aten.narrow_copy.default)
def narrow(self, dim, start, length):
    dim = wrap_dim(dim, self.ndim)
    start = start + self.shape[dim] if start < 0 else start
    if not 0 <= start <= self.shape[dim] - length or length < 0:
        raise IndexError(f"start ({start}) + length ({length}) exceeds dimension size ({self.shape[dim]}).")
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


@lowering(aten.narrow.Tensor)
def narrow_tensor(self, dim, start, length):
    dim = wrap_dim(dim, self.ndim)
    start = start.reshape(()).astype(jnp.int64)
    start = jnp.where(start < 0, start + self.shape[dim], start)  # a traced start: no Python branch
    return jax.lax.dynamic_slice_in_dim(self, start, length, axis=dim)


def _diagonal_dims(ndim, offset, dim1, dim2):
    d1, d2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    d1, d2 = _diagonal_dims(self.ndim, offset, dim1, dim2)
    n1, n2 = self.shape[d1], self.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    if length == 0:  # jnp.diagonal rejects offsets past the edge; torch gives an empty diagonal
        rest = [s for i, s in enumerate(self.shape) if i not in (d1, d2)]
        return jnp.zeros((*rest, 0), self.dtype)
    return jnp.diagonal(self, offset, d1, d2)


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    return scatter_through_view(self, src, lambda pos: diagonal(pos, offset, dim1, dim2))


@lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(self, dimension, size, step):
    dim = wrap_dim(dimension, self.ndim)
    x = self.reshape(1) if self.ndim == 0 else self
    n = x.shape[dim]
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {dim} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    windows = (n - size) // step + 1
    idx = (jnp.arange(windows, dtype=jnp.int64)[:, None] * step + jnp.arange(size, dtype=jnp.int64)[None, :])
    out = jnp.take(x, idx, axis=dim)  # dims: ..., windows, size, ...
    out = jnp.moveaxis(out, dim + 1, -1)
    return out.reshape(out.shape[1:]) if self.ndim == 0 else out


# --------------------------------------------------------------------------- identities
@lowering(aten.alias.default, aten.alias_copy.default, aten.detach.default, aten.detach_copy.default,
          aten.lift_fresh.default, aten.lift_fresh_copy.default, aten.lift.default, padding=SAME)
def alias(self):
    return self


# --------------------------------------------------------------------------- dtype views
@lowering(aten.view_as_real_copy.default)
@lowering(aten.view_as_real.default, eager="eager/view_kernels.py: a view of the storage with another element type")
def view_as_real(self):
    # torch's meta kernel has checked the input before any trace (eager and compile alike)
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowering(aten.view_as_complex_copy.default)
@lowering(aten.view_as_complex.default, eager="eager/view_kernels.py: a view of the storage with another element type")
def view_as_complex(self):
    # torch's meta kernel has checked the input before any trace (eager and compile alike)
    return jax.lax.complex(self[..., 0], self[..., 1])


def _bitcast_same_size(x, dtype):
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if dtype == jnp.bool_:
        return jax.lax.bitcast_convert_type(x, jnp.uint8) != 0
    return jax.lax.bitcast_convert_type(x, dtype)


@lowering(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(self, dtype):
    new = to_jax(dtype)
    old_size, new_size = np.dtype(self.dtype).itemsize, np.dtype(new).itemsize
    if old_size == new_size:
        return _bitcast_same_size(self, new)
    if self.ndim == 0:
        raise RuntimeError("self.dim() cannot be 0 to view a tensor as a dtype with a different itemsize")
    if old_size > new_size:  # each element becomes ratio narrower ones along the last dim
        out = jax.lax.bitcast_convert_type(self, new)
        return out.reshape(*self.shape[:-1], self.shape[-1] * (old_size // new_size))
    ratio = new_size // old_size
    if self.shape[-1] % ratio:
        raise RuntimeError(f"self.size(-1) must be divisible by {ratio} to view {self.dtype} as {dtype}")
    x = self.reshape(*self.shape[:-1], self.shape[-1] // ratio, ratio)
    return jax.lax.bitcast_convert_type(x, new)


# --------------------------------------------------------------------------- splits (tuples)
@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default, aten.split.sizes,
          aten.split.default, padding=Padding("split"))
def split_with_sizes(self, split_sizes, dim=0):
    dim = wrap_dim(dim, self.ndim)
    if sum(split_sizes) != self.shape[dim]:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {self.shape[dim]} "
                           f"(input tensor's size at dimension {dim}), but got split_sizes={list(split_sizes)}")
    starts = np.cumsum([0, *split_sizes])
    return tuple(jax.lax.slice_in_dim(self, int(s), int(s) + n, axis=dim) for s, n in zip(starts, split_sizes))


@lowering(aten.split.Tensor, aten.split_copy.Tensor, padding=Padding("split"))
def split(self, split_size, dim=0):
    dim = wrap_dim(dim, self.ndim)
    n = self.shape[dim]
    if split_size == 0 and n != 0:
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else []
    return split_with_sizes(self, sizes or [n], dim)


@lowering(aten.chunk.default)
def chunk(self, chunks, dim=0):
    dim = wrap_dim(dim, self.ndim)
    if self.shape[dim] == 0:  # torch gives `chunks` empty pieces
        return split_with_sizes(self, [0] * chunks, dim)
    return split(self, -(-self.shape[dim] // chunks), dim)


@lowering(aten.unbind.int, aten.unbind_copy.int, padding=Padding("split"))
def unbind(self, dim=0):
    dim = wrap_dim(dim, self.ndim)
    return tuple(jax.lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim]))


# --------------------------------------------------------------------------- view backward ops
# AOTAutograd's backward graphs scatter a view's gradient into zeros of the input's size.
def _slice_backward_in_range(values) -> bool:
    grad, sizes, dim, start, end, step = values
    sizes = tuple(sizes)
    if not sizes or step <= 0 or len(grad.shape) != len(sizes):
        return False  # CPU decides
    d = dim % len(sizes)
    return grad.shape[d] == _slice_length(sizes[d], start, end, step)


@lowering(aten.slice_backward.default, traced=("start", "end"), in_range=_slice_backward_in_range)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, start, end, step)


@lowering(aten.select_backward.default, traced=("index",),
          in_range=lambda values: _index_in_range(values[1], values[2], values[3]))
def select_backward(grad_output, input_sizes, dim, index):
    return select_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, index)


@lowering(aten.diagonal_backward.default)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, offset, dim1, dim2)


@lowering(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    """Overlapping windows add up: the transpose of unfold, taken with jax.vjp."""
    _, vjp = jax.vjp(lambda x: unfold(x, dim, size, step), jnp.zeros(tuple(input_sizes), grad_in.dtype))
    return vjp(grad_in)[0]
