"""Live executables are a bounded resource: past a budget, JAX's in-memory executables are dropped.

JAX keeps every executable it built for as long as its jit function lives, and ours live as long
as the process (an op's lowering, a storage helper). A process that meets many shapes (eager code
with changing sizes, a test suite) so accumulates thousands of them. Each XLA:CPU executable maps
3 to 10 memory regions (code, constants, data), Linux caps a process at `vm.max_map_count`
(65530 by default), and when a map fails XLA crashes instead of raising: the process segfaults in
its next compile or persistent-cache load (tests/ops met it after about 7000 executables).

Maps also stand for memory: a small XLA:CPU program maps about 11 regions and keeps about 3 MB
resident (measured here: 300 tiny jitted programs, 3.2 MB and 11.4 maps each), so half of the map
limit is ~2900 executables and ~9 GB (a harness process of PyTorch's tests grew to 10.5 GB). The
budget is the lower of `MAX_MAP_FRACTION` of the map limit and the maps that hold
`MEMORY_FRACTION` of the machine's memory at `BYTES_PER_MAP` each (24 GiB: ~12,000 maps, ~1000
executables, ~3 GB).

So every executable built (JAX's backend-compile event: compiled, or read from the persistent
cache) is counted; every `CHECK_EVERY` builds the process's maps are counted, and past the budget,
at the next safe point (Python between calls: a fused region's run, a Python kernel, a compiled
graph's call), `jax.clear_caches()` drops every in-memory executable. Those still in use are built
again on their next call, from the persistent cache in about a millisecond each. `released()` says how many times it happened (eager_stats reports it).
"""
from __future__ import annotations

import os

import jax
import jax.monitoring

try:  # JAX's own test that no trace is in progress (clear_caches must not run inside one)
    from jax._src.core import trace_state_clean as _no_trace
except ImportError:  # our safe points are outside traces anyway
    def _no_trace() -> bool:
        return True

CHECK_EVERY = 256
MAX_MAP_FRACTION = 0.5
MEMORY_FRACTION = 1 / 8
BYTES_PER_MAP = 256 * 1024

_state = {"built": 0, "due": False, "released": 0, "looked_at": 0}
_releases: list = []  # other holders of executables (executable_store's), dropped with JAX's


def on_release(drop) -> None:
    """Call `drop()` whenever JAX's in-memory executables are dropped."""
    _releases.append(drop)


def _release() -> None:
    jax.clear_caches()
    for drop in _releases:
        drop()
    _state["released"] += 1


def _map_limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux: no such limit to stay under
        return None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _map_budget() -> int | None:
    """The maps this process may hold before it drops its executables (None: not Linux)."""
    limit = _map_limit()
    if limit is None:
        return None
    memory = _physical_memory()
    by_memory = MEMORY_FRACTION * memory / BYTES_PER_MAP if memory else limit
    return int(min(MAX_MAP_FRACTION * limit, by_memory))


_BUDGET = _map_budget()


def maps() -> int | None:
    """The memory maps this process holds now (None where the system does not say)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


# JAX's event for each executable built (compiled, or read from the persistent cache); every
# counter of builds listens for this name.
BUILD_EVENT = "/jax/core/compile/backend_compile_duration"


def _on_build(name: str, seconds: float, **_) -> None:
    if name != BUILD_EVENT:
        return
    _state["built"] += 1
    if _BUDGET is not None and _state["built"] % CHECK_EVERY == 0:
        held = maps()
        if held is not None and held > _BUDGET:
            _state["due"] = True


jax.monitoring.register_event_duration_secs_listener(_on_build)


def release_if_due() -> None:
    """At a safe point (no JAX trace in progress): drop JAX's in-memory executables if the
    process is over its budget. A bool test when it is not."""
    if not _state["due"] or not _no_trace():
        return
    _state["due"] = False
    _release()


def release_at_boundary(fraction: float) -> None:
    """Where the caller has a natural boundary (a test suite between two tests), release already
    past `fraction` of the budget, so that a release rarely falls inside a run that counts its
    builds. Reads the maps only after CHECK_EVERY/4 builds."""
    if _BUDGET is None or _state["built"] - _state["looked_at"] < CHECK_EVERY // 4:
        return
    _state["looked_at"] = _state["built"]
    held = maps()
    if held is not None and held > fraction * _BUDGET and _no_trace():
        _state["due"] = False
        _release()


def released() -> int:
    """How many times this process dropped its in-memory executables."""
    return _state["released"]
