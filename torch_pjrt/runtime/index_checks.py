"""Index bounds, checked in eager as torch's CPU kernels check them.

XLA clamps out-of-range gathers and drops out-of-range scatters; PyTorch raises. An indexing
op's eager executable also reduces its index tensors to the first out-of-range index
(`folded`: the op and its checks are one call, recorded or run, from the Python kernel or the
C++ one), and torch's exception type and message are raised for it. Which tensors an op
indexes with, and what torch says, is its op table entry's `index_probes`
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


@functools.partial(jax.jit, static_argnums=(1, 2))
def _first_out_of_range(index, size: int, negative_ok: bool, seen):
    """(seen or any out of range, any out of range, position of the first such index, its
    value); `seen` (an earlier check's first output, or `_nothing_seen`) folds the queued
    checks into one flag. Inlined into the checked call's executable (see `folded`); its own
    executable after a data-dependent op, which runs at once."""
    if hasattr(index, "resolve"):  # a strided view: resolved here, not op by op
        index = index.resolve()
    flat = index.reshape(-1).astype(jnp.int64)
    bad = (flat >= size) | (flat < (-size if negative_ok else 0))
    position = jnp.argmax(bad)
    found = jnp.any(bad)
    return seen | found, found, position, flat[position]


def _probes_with_data(probes: Callable[[list], Iterator[tuple]], values) -> list:
    """The probes of a call that check something: index tensors (not masks) with elements. A
    function of the values' shapes, dtypes and static values only: a call signature has one list."""
    return [probe for probe in probes(list(values)) if probe[0] is not None and is_index_dtype(probe[0].dtype)
            and math.prod(probe[0].shape) != 0]


def folded(executable: Callable, probes: Callable[[list], Iterator[tuple]]) -> Callable:
    """`executable(*values)` with the call's bounds checks in the same function:
    f(*values, seen) -> (result, seen', ((found, position, value) per probe)). One call then
    serves the op and its checks, recorded or run, from the Python kernel or the C++ one."""

    def checked(*values_and_seen):
        *values, seen = values_and_seen
        result = executable(*values)
        found = []
        for index, size, negative_ok, _ in _probes_with_data(probes, values):
            seen, *first = _first_out_of_range(index, size, negative_ok, seen)
            found.append(tuple(first))
        return result, seen, tuple(found)

    return checked


def errors_of(probes: Callable[[list], Iterator[tuple]], op, values) -> tuple:
    """(exception factory, op) per probe of a `folded` call on `values`: what the queue keeps
    beside each probe's findings. The C++ kernel asks once per call signature."""
    return tuple((probe[3], op) for probe in _probes_with_data(probes, values))


@functools.lru_cache(None)
def _nothing_seen(device: int) -> jax.Array:
    """The flag before any check (always an array, so a fused region's first check after a sync
    has the structure of the others)."""
    return jax.device_put(np.bool_(False), platform.device(device))


_lock = threading.Lock()
_queued: list = []  # (found, position, value, exception factory, op) per queued check, oldest first
_seen: dict[int, jax.Array] = {}  # per device: whether any of its queued checks found a bad index
_MAX_QUEUED = 4096  # then they are read, so the queue stays small in loops that never sync


def synchronous() -> bool:
    """TORCH_PJRT_SYNC_INDEX_CHECKS=1: each check is read at its call (read per call: a test may set it)."""
    return os.environ.get("TORCH_PJRT_SYNC_INDEX_CHECKS", "0") not in ("", "0")


def run_checked(checked: Callable, probes: Callable[[list], Iterator[tuple]], op, values: list, device: int):
    """Call `checked` (a `folded` executable, maybe recorded) on an eager call's prepared
    `values` on `device`: queue its checks, or raise now when synchronous. Its result."""
    errors = errors_of(probes, op, values)
    if synchronous():
        result, _, found = checked(*values, _nothing_seen(device))
        _raise_first([(*first, error, None) for first, (error, _) in zip(found, errors)])
        return result
    with _lock:
        seen = _seen.get(device)
        result, seen, found = checked(*values, _nothing_seen(device) if seen is None else seen)
        _seen[device] = seen
        _queued.extend((*first, error, call) for first, (error, call) in zip(found, errors))
    if len(_queued) > _MAX_QUEUED:
        raise_pending()
    return result


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
    raise_if_found(seen, queued)


@platform.raises_torch_errors
def raise_if_found(seen: list, queued: list) -> None:
    """Raise for the first of `queued` (checks taken off the queue) that found an out-of-range
    index, if any device's `seen` flag says one did. (The C++ scalar read reads the flags itself and
    calls this only when one is set, or is a flag it cannot read.)"""
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
