"""Index bounds, checked in eager as torch's CPU kernels check them.

XLA clamps out-of-range gathers and drops out-of-range scatters; PyTorch raises. Before an
indexing op runs eagerly, a small reduction over its index tensors finds the first
out-of-range index, and torch's exception type and message are raised for it.

When: by default the reduction is only queued, as CUDA queues its device-side index
asserts, and the error is raised at the next host sync (a copy to the CPU, `.item()`,
`torch.pjrt.synchronize()`), naming the op that caused it; so indexing does not stall
the device. `TORCH_PJRT_SYNC_INDEX_CHECKS=1` waits for each check and raises at the op
itself (the analogue of `CUDA_LAUNCH_BLOCKING=1` for this error). Compiled graphs do not
check.
"""
from __future__ import annotations

import functools
import math
import os
import threading
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import torch

aten = torch.ops.aten


def _shape(value) -> tuple:
    return tuple(value.geometry[0]) if hasattr(value, "geometry") else value.shape


def _is_integer(value) -> bool:
    """An index tensor, not a mask (torch treats bool and uint8 index tensors as masks)."""
    return _is_index_dtype(value.geometry[3] if hasattr(value, "geometry") else value.dtype)


@functools.lru_cache(None)
def _is_index_dtype(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) and np.dtype(dtype) != np.uint8


@functools.lru_cache(None)
def _first_out_of_range(negative_ok: bool):
    """jit(index, size, seen) -> (seen or any out of range, any out of range, position of
    the first such index, its value); `seen` (None or an earlier check's first output)
    folds the queued checks into one flag. The size is static: a Python int argument
    would be a host-to-device copy per call."""

    def find(index, size, seen):
        flat = index.reshape(-1).astype(jnp.int64)
        bad = (flat >= size) | (flat < (-size if negative_ok else 0))
        position = jnp.argmax(bad)
        found = jnp.any(bad)
        return found if seen is None else seen | found, found, position, flat[position]

    return jax.jit(find, static_argnums=1)


# A probe: (index tensor, the size it addresses, whether negative indices count from the
# end, (flat position, value) of the first bad index -> the exception torch raises).
Probe = tuple[object, int, bool, Callable[[int, int], Exception]]

_lock = threading.Lock()
_queued: list = []  # (found, position, value, exception factory, op) per queued check, oldest first
_seen: dict[int, jax.Array] = {}  # per device: whether any of its queued checks found a bad index
_MAX_QUEUED = 4096  # then they are read, so the queue stays small in loops that never sync


def check(op, probes: Callable[[list], Iterator[Probe]], values: list, device: int) -> None:
    """Check an eager call's index tensors on `device`: queue the checks, or raise now when synchronous."""
    synchronous = os.environ.get("TORCH_PJRT_SYNC_INDEX_CHECKS", "0") not in ("", "0")
    for index, size, negative_ok, error in probes(values):
        if index is None or not _is_integer(index) or math.prod(_shape(index)) == 0:
            continue
        if hasattr(index, "resolve"):
            index = index.resolve()
        find = _first_out_of_range(negative_ok)
        if synchronous:
            _raise_first([(*find(index, size, None)[1:], error, None)])
            continue
        with _lock:
            seen, *found = find(index, size, _seen.get(device))
            _seen[device] = seen
            _queued.append((*found, error, op))
    if len(_queued) > _MAX_QUEUED:
        raise_pending()


def mark() -> tuple:
    """The queue's state now, for `forget_since`."""
    with _lock:
        return len(_queued), dict(_seen)


def forget_since(state: tuple) -> None:
    """Drop the checks queued after `mark()` returned `state`: a call that raises its own error
    (CPU's, see errors.py) leaves no check behind to raise again at the next sync."""
    length, seen = state
    with _lock:
        del _queued[length:]
        _seen.clear()
        _seen.update(seen)


def raise_pending() -> None:
    """At a host sync: raise for the first out-of-range index the queued checks found."""
    if not _queued:  # the common case, without the lock
        return
    with _lock:
        seen, queued = list(_seen.values()), _queued[:]
        _seen.clear()
        _queued.clear()
    if any(jax.device_get(seen)):
        _raise_first(queued)


def _raise_first(checks: list) -> None:
    for found, position, value, error, op in checks:
        if jax.device_get(found):
            # No local holds the exception: a frame <-> traceback cycle would keep the frames
            # alive until the next gc, and torch's tensor printing holds a guard that
            # disables functorch in its frame (vmap breaks if print raised here).
            raise _from_earlier_call(error(int(position), int(value)), op)


def _from_earlier_call(exc: Exception, op) -> Exception:
    if op is None:  # raised at the call itself
        return exc
    return type(exc)(f"{exc}\n(an earlier call of {op}: pjrt checks indices asynchronously, as CUDA does, and "
                     "raises at the next host sync; TORCH_PJRT_SYNC_INDEX_CHECKS=1 raises at the call)")


def _along_dim(exc, message, negative_ok=False):
    """Ops with (self, dim, index, ...): the index addresses self's dimension `dim`."""

    def probes(values):
        shape = _shape(values[0])
        dim = values[1] % max(len(shape), 1)
        size = shape[dim] if shape else 1
        yield values[2], size, negative_ok, lambda _, bad: exc(message.format(index=bad, dim=dim, size=size))

    return probes


def _advanced(values):
    """index / index_put: one index tensor per dimension (masks span their own dims)."""
    shape, dim = _shape(values[0]), 0
    for index in values[1]:  # None: a full slice of this dimension
        if index is not None and not _is_integer(index):  # a mask spans its own dims
            dim += max(len(_shape(index)), 1)
            continue
        if index is not None:
            yield index, shape[dim], True, functools.partial(_advanced_error, dim=dim, size=shape[dim])
        dim += 1


def _advanced_error(_, bad, dim, size):
    return IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _embedding(values):
    yield values[1], _shape(values[0])[0], False, lambda _, bad: IndexError("index out of range in self")


def _embedding_bag(values):
    size = _shape(values[0])[0]
    yield values[1], size, False, lambda position, bad: RuntimeError(
        f"Index {position} of input takes value {bad} which is not in the valid range [0, {size})")


@jax.jit
def _ascending(index):
    return jnp.sort(index.reshape(-1))


def _embedding_renorm(values):
    """CPU's embedding_renorm_ visits the rows in ascending index order and selects each
    (negative ones wrap), so the index it names is the first bad one in sorted order."""
    shape, index = _shape(values[0]), values[1]
    if len(shape) != 2 or not _is_integer(index) or math.prod(_shape(index)) == 0:
        return  # the lowering refuses other shapes and dtypes
    index = _ascending(index.resolve() if hasattr(index, "resolve") else index)
    yield index, shape[0], True, lambda _, bad: IndexError(
        f"select(): index {bad} out of range for tensor of size {list(shape)} at dimension 0")


def _take(values):
    size = math.prod(_shape(values[0]))
    yield values[1], size, True, lambda _, bad: IndexError(
        f"out of range: tried to access index {bad} on a tensor of {size} elements.")


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
    aten.embedding_renorm.default: _embedding_renorm,  # embedding_renorm_ is derived from it
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
    aten.take.default: _take,
}

# Index tensors that may live on the CPU, as with CUDA (x_cuda[cpu_indices] works).
HOST_INDICES = {aten.index.Tensor, aten.index_put.default}
