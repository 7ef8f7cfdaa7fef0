"""Index bounds, checked in eager as torch's CPU kernels check them.

XLA clamps out-of-range gathers and drops out-of-range scatters; PyTorch raises. Before an
indexing op runs eagerly, a small reduction over its index tensors finds the first
out-of-range index, and torch's exception type and message are raised for it. Which
tensors an op indexes with, and what torch says, is its op table entry's `index_probes`
(ops/index_probes.py).

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

from . import fused, platform
from ..dtypes import is_index_dtype


@functools.lru_cache(None)
def _first_out_of_range(negative_ok: bool):
    """jit(index, size, seen) -> (seen or any out of range, any out of range, position of
    the first such index, its value); `seen` (an earlier check's first output, or `_nothing_seen`)
    folds the queued checks into one flag. The size is static: a Python int argument
    would be a host-to-device copy per call."""

    def find(index, size, seen):
        if hasattr(index, "resolve"):  # a strided view: resolved here, not op by op
            index = index.resolve()
        flat = index.reshape(-1).astype(jnp.int64)
        bad = (flat >= size) | (flat < (-size if negative_ok else 0))
        position = jnp.argmax(bad)
        found = jnp.any(bad)
        return seen | found, found, position, flat[position]

    return fused.Recordable(jax.jit(find, static_argnums=1), static=(1,), name="index check")


@functools.lru_cache(None)
def _nothing_seen(device: int) -> jax.Array:
    """The flag before any check (always an array, so a fused region's first check after a sync
    has the structure of the others)."""
    return jax.device_put(np.bool_(False), platform.device(device))


_lock = threading.Lock()
_queued: list = []  # (found, position, value, exception factory, op) per queued check, oldest first
_seen: dict[int, jax.Array] = {}  # per device: whether any of its queued checks found a bad index
_MAX_QUEUED = 4096  # then they are read, so the queue stays small in loops that never sync


def check(op, probes: Callable[[list], Iterator[tuple]], values: list, device: int) -> None:
    """Check an eager call's index tensors on `device` (the op entry's `index_probes` say
    which): queue the checks, or raise now when synchronous."""
    synchronous = os.environ.get("TORCH_PJRT_SYNC_INDEX_CHECKS", "0") not in ("", "0")
    for index, size, negative_ok, error in probes(values):
        if index is None or not is_index_dtype(index.dtype) or math.prod(index.shape) == 0:
            continue
        find = _first_out_of_range(negative_ok)
        if synchronous:
            _raise_first([(*find(index, size, _nothing_seen(device))[1:], error, None)])
            continue
        with _lock:
            seen = _seen.get(device)
            seen, *found = find(index, size, _nothing_seen(device) if seen is None else seen)
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
    if any(jax.device_get(fused.concrete(seen))):
        _raise_first(queued)


def _raise_first(checks: list) -> None:
    for found, position, value, error, op in checks:
        found, position, value = fused.concrete((found, position, value))
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
