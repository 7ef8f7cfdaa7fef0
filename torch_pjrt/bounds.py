"""Index bounds, checked in eager as torch's CPU kernels check them.

XLA clamps out-of-range gathers and drops out-of-range scatters; PyTorch raises. Before an
indexing op runs eagerly, its index tensors are checked here (one small reduction and a
host sync) and an out-of-range index raises torch's exception type and message. Compiled
graphs do not check.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

aten = torch.ops.aten


def _shape(value) -> tuple:
    return tuple(value.geometry[0]) if hasattr(value, "geometry") else tuple(np.shape(value))


def _is_integer(value) -> bool:
    """An index tensor, not a mask (torch treats bool and uint8 index tensors as masks)."""
    dtype = value.geometry[3] if hasattr(value, "geometry") else value.dtype
    return jnp.issubdtype(dtype, jnp.integer) and np.dtype(dtype) != np.uint8


@functools.lru_cache(None)
def _first_out_of_range(negative_ok: bool):
    """jit(index, size) -> (any out of range, position of the first such index, its value)."""

    def find(index, size):
        flat = index.reshape(-1).astype(jnp.int64)
        bad = (flat >= size) | (flat < (-size if negative_ok else 0))
        position = jnp.argmax(bad)
        return jnp.any(bad), position, flat[position] if flat.size else jnp.int64(0)

    return jax.jit(find)


def _first_offending(index, size: int, negative_ok: bool) -> tuple[int, int] | None:
    """(flat position, value) of the first out-of-range index, None when all are in range."""
    if index is None or not _is_integer(index) or int(np.prod(_shape(index))) == 0:
        return None
    if hasattr(index, "resolve"):
        index = index.resolve()
    bad, position, value = _first_out_of_range(negative_ok)(index, size)
    return (int(position), int(value)) if bool(bad) else None


def _offending(index, size: int, negative_ok: bool) -> int | None:
    found = _first_offending(index, size, negative_ok)
    return None if found is None else found[1]


def _along_dim(exc, message, negative_ok=False):
    """Ops with (self, dim, index, ...): the index addresses self's dimension `dim`."""

    def check(values):
        shape = _shape(values[0])
        dim = values[1] % max(len(shape), 1)
        size = shape[dim] if shape else 1
        bad = _offending(values[2], size, negative_ok)
        if bad is not None:
            raise exc(message.format(index=bad, dim=dim, size=size))

    return check


def _advanced(values):
    """index / index_put: one index tensor per dimension (masks span their own dims)."""
    shape, dim = _shape(values[0]), 0
    for index in values[1]:  # None: a full slice of this dimension
        if index is not None and not _is_integer(index):  # a mask spans its own dims
            dim += max(len(_shape(index)), 1)
            continue
        if index is not None:
            bad = _offending(index, shape[dim], negative_ok=True)
            if bad is not None:
                raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {shape[dim]}")
        dim += 1


def _embedding(values):
    if _offending(values[1], _shape(values[0])[0], negative_ok=False) is not None:
        raise IndexError("index out of range in self")


def _embedding_bag(values):
    size = _shape(values[0])[0]
    found = _first_offending(values[1], size, negative_ok=False)
    if found is not None:
        raise RuntimeError(f"Index {found[0]} of input takes value {found[1]} which is not in the valid range [0, {size})")


def _take(values):
    size = int(np.prod(_shape(values[0])))
    bad = _offending(values[1], size, negative_ok=True)
    if bad is not None:
        raise IndexError(f"out of range: tried to access index {bad} on a tensor of {size} elements.")


_OUT_OF_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"
_IN_SELF = "index out of range in self"

CHECKS = {
    aten.index.Tensor: _advanced,
    aten.index_put.default: _advanced,
    aten.index_select.default: _along_dim(IndexError, _IN_SELF),
    aten.index_add.default: _along_dim(IndexError, _IN_SELF),
    aten.index_copy.default: _along_dim(IndexError, "index_copy_(): " + _OUT_OF_BOUNDS),
    aten.index_fill.int_Scalar: _along_dim(IndexError, _OUT_OF_BOUNDS, negative_ok=True),
    aten.index_fill.int_Tensor: _along_dim(IndexError, _OUT_OF_BOUNDS, negative_ok=True),
    aten.gather.default: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter.src: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter.value: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter.reduce: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter.value_reduce: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter_add.default: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.scatter_reduce.two: _along_dim(RuntimeError, _OUT_OF_BOUNDS),
    aten.embedding.default: _embedding,
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
    aten.take.default: _take,
}

# Index tensors that may live on the CPU, as with CUDA (x_cuda[cpu_indices] works).
HOST_INDICES = {aten.index.Tensor, aten.index_put.default}
