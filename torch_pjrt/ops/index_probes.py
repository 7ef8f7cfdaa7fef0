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
import numpy as np
from ..dtypes import is_index_dtype
from .registry import Split, has_index


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


@jax.tree_util.register_pytree_node_class
class Derived:
    """A probe's index computed from a call's tensor inside the check's executable (a pytree
    with `resolve`, as a strided view is resolved there), for checks of data that is not an
    index itself (offsets[0], a distribution's weights): `fn(value, *params)` gives integers
    of `shape`, in range where the data is valid. `fn` and `params` key the executable: pass
    a module-level function and plain numbers."""

    def __init__(self, value, shape: tuple, fn, *params):
        self.value, self.shape, self.fn, self.params = value, tuple(shape), fn, params

    dtype = np.dtype(np.int64)

    def resolve(self):
        value = self.value.resolve() if hasattr(self.value, "resolve") else self.value
        return self.fn(value, *self.params).reshape(self.shape).astype(jnp.int64)

    def tree_flatten(self):
        return (self.value,), (self.shape, self.fn, self.params)

    @classmethod
    def tree_unflatten(cls, aux, children):
        shape, fn, params = aux
        return cls(children[0], shape, fn, *params)


def _element(value, position: int, lowest):
    """value's flat element at `position`, at least `lowest` (None: unclamped)."""
    element = value.reshape(-1)[position]
    return element if lowest is None else jnp.maximum(element, lowest)


def _embedding_bag_fast_path(weight, mode, per_sample_weights, padding_idx) -> bool:
    """Whether CPU's embedding_bag takes its fbgemm path (is_fast_path_index_select(_scale)):
    sum or mean, no padding_idx, 32/16-bit float rows with unit column stride (and unit-stride
    per-sample weights). That path and CPU's plain loop word an out-of-range index differently."""
    def unit_stride(value, dim):
        geometry = getattr(value, "geometry", None)  # a strided view; an array is contiguous
        return geometry is None or geometry.stride[dim] == 1

    has_padding = padding_idx.static if type(padding_idx) is Split else has_index(padding_idx)
    return (mode in (0, 1) and not has_padding and np.dtype(weight.dtype) in _FAST_PATH_DTYPES
            and unit_stride(weight, 1) and (per_sample_weights is None or unit_stride(per_sample_weights, 0)))


_FAST_PATH_DTYPES = (np.dtype(jnp.float32), np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def embedding_bag(values):
    """CPU's data checks of _embedding_bag, in its order: offsets[0] is 0, offsets[-1] is
    within the input (check_arguments), then every index within the weight's rows. The fbgemm
    path names the flat position of the first bad index (its report is right when one chunk of
    bags holds it, as always on one thread; on more CPU's report can misname it); the loop
    names the value only."""
    weight, indices, offsets, mode, per_sample_weights, padding_idx = (values[i] for i in (0, 1, 2, 4, 6, 8))
    length = _shape_of(indices)[0] if _shape_of(indices) else 1
    if math.prod(_shape_of(offsets)):
        # CPU prints offsets[0] as a tensor; indices and offsets are promoted to one type first
        kind = "Long" if np.dtype(jnp.int64) in (np.dtype(indices.dtype), np.dtype(offsets.dtype)) else "Int"
        yield Derived(offsets, (1,), _element, 0, None), 1, False, lambda _, bad: RuntimeError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
            f"However, got {bad}\n[ torch.{kind}Tensor{{}} ]")
        # only offsets[-1] > length is CPU's error here (clamped: a negative one reads in range)
        yield Derived(offsets, (1,), _element, -1, 0), length + 1, False, lambda _, bad: RuntimeError(
            f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {bad}")
    size = _shape_of(weight)[0]
    if _embedding_bag_fast_path(weight, mode, per_sample_weights, padding_idx):
        yield indices, size, False, lambda position, bad: RuntimeError(
            f"Index {position} of input takes value {bad} which is not in the valid range [0, {size})")
    else:
        yield indices, size, False, lambda _, bad: RuntimeError(
            f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {bad}")


def _ascending(index):
    return jnp.sort(index.reshape(-1))


def embedding_renorm(values):
    """CPU's embedding_renorm_ visits the rows in ascending index order and selects each
    (negative ones wrap), so the index it names is the first bad one in sorted order. The sort
    runs inside the check's executable (a Derived index): the index may still be pending."""
    shape, index = _shape_of(values[0]), values[1]
    if len(shape) != 2 or not is_index(index) or math.prod(_shape_of(index)) == 0:
        return  # the lowering refuses other shapes and dtypes
    yield Derived(index, (math.prod(_shape_of(index)),), _ascending), shape[0], True, lambda _, bad: IndexError(
        f"select(): index {bad} out of range for tensor of size {list(shape)} at dimension 0")


def take(values):
    size = math.prod(_shape_of(values[0]))
    yield values[1], size, True, lambda _, bad: IndexError(
        f"out of range: tried to access index {bad} on a tensor of {size} elements.")


def _more_ones_than(mask, repeat: int, limit: int):
    """1 where the mask, broadcast `repeat` times over self, has more ones than `limit`, else 0."""
    return jnp.where(jnp.sum(mask, dtype=jnp.int64) * repeat > limit, 1, 0)


def masked_scatter(values):
    """CPU's check that source has an element for every one of the mask (broadcast to self's
    shape): a count computed in the check's executable, so no host read of the mask."""
    self, mask, source = values[:3]
    shape = np.broadcast_shapes(_shape_of(self), _shape_of(mask))
    if np.dtype(mask.dtype) != np.bool_ or math.prod(shape) == 0:
        return  # the lowering refuses other masks; no elements: nothing to count
    repeat = math.prod(shape) // math.prod(_shape_of(mask))
    yield Derived(mask, (1,), _more_ones_than, repeat, math.prod(_shape_of(source))), 1, False, \
        lambda _, __: RuntimeError("Number of elements of source < number of ones in mask")
