"""Which index tensors an op addresses, for eager's bounds checks (runtime/index_checks.py).

An indexing op's entry in the table names its probes (`index_probes=`): given the call's
values in schema order, they yield (index, the size it addresses, whether negative indices
count from the end, (flat position, value) of the first bad index -> the exception torch
raises). Values are arrays or storage views; both have `.shape` and `.dtype`.
"""
from __future__ import annotations
import functools
import math

import jax
import jax.numpy as jnp
from ..dtypes import is_index_dtype


def _shape_of(value) -> tuple:
    return tuple(value.shape)


def is_index(value) -> bool:
    """An index tensor, not a mask."""
    return is_index_dtype(value.dtype)


OUT_OF_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"
IN_SELF = "index out of range in self"


def along_dim(exc, message, negative_ok=False):
    """Ops with (self, dim, index, ...): the index addresses self's dimension `dim`."""

    def probes(values):
        shape = _shape_of(values[0])
        dim = values[1] % max(len(shape), 1)
        size = shape[dim] if shape else 1
        yield values[2], size, negative_ok, lambda _, bad: exc(message.format(index=bad, dim=dim, size=size))

    return probes


def advanced(values):
    """index / index_put: one index tensor per dimension (masks span their own dims)."""
    shape, dim = _shape_of(values[0]), 0
    for index in values[1]:  # None: a full slice of this dimension
        if index is not None and not is_index(index):  # a mask spans its own dims
            dim += max(len(_shape_of(index)), 1)
            continue
        if index is not None:
            yield index, shape[dim], True, functools.partial(_advanced_error, dim=dim, size=shape[dim])
        dim += 1


def _advanced_error(_, bad, dim, size):
    return IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def embedding(values):
    yield values[1], _shape_of(values[0])[0], False, lambda _, bad: IndexError("index out of range in self")


def embedding_bag(values):
    size = _shape_of(values[0])[0]
    yield values[1], size, False, lambda position, bad: RuntimeError(
        f"Index {position} of input takes value {bad} which is not in the valid range [0, {size})")


@jax.jit
def _ascending(index):
    return jnp.sort(index.reshape(-1))


def embedding_renorm(values):
    """CPU's embedding_renorm_ visits the rows in ascending index order and selects each
    (negative ones wrap), so the index it names is the first bad one in sorted order."""
    shape, index = _shape_of(values[0]), values[1]
    if len(shape) != 2 or not is_index(index) or math.prod(_shape_of(index)) == 0:
        return  # the lowering refuses other shapes and dtypes
    index = _ascending(index.resolve() if hasattr(index, "resolve") else index)
    yield index, shape[0], True, lambda _, bad: IndexError(
        f"select(): index {bad} out of range for tensor of size {list(shape)} at dimension 0")


def take(values):
    size = math.prod(_shape_of(values[0]))
    yield values[1], size, True, lambda _, bad: IndexError(
        f"out of range: tried to access index {bad} on a tensor of {size} elements.")


