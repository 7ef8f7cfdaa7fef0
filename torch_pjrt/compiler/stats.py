"""What the pjrt compile backend did: graphs, executables, cache hits, recompiles, seconds.

`compile_stats()` returns a snapshot dict; `reset_compile_stats()` clears it. Compile
seconds come from JAX's own monitoring events (tracing, lowering to StableHLO, XLA
compilation), attributed to the graph whose call triggered them.
"""
from __future__ import annotations

import threading
import time

import jax

from ..runtime.executable_budget import BUILD_EVENT

_lock = threading.Lock()
_state: dict = {}
_current = threading.local()  # the graph name whose executable is being built on this thread

_JAX_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_seconds",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_seconds",
    BUILD_EVENT: "xla_compile_seconds",
}


def reset_compile_stats() -> None:
    """Forget everything counted so far (executables already built stay cached)."""
    with _lock:
        _state.clear()
        _state.update(
            graphs=0,  # FX graphs handed to the backend (forward, backward and inference graphs each count)
            executables=0,  # XLA executables built for those graphs (one per graph and input signature)
            calls=0,  # executions of compiled graphs
            cache_hits=0,  # executions that reused an executable already built in this process
            persistent_cache_hits=0,  # executables loaded from JAX's persistent compilation cache
            recompiles=[],  # {"graph", "reason"}: Dynamo guard failures and new executable signatures
            compile_seconds=0.0,  # trace + lower + XLA compile of our executables
            trace_seconds=0.0,
            lower_seconds=0.0,
            xla_compile_seconds=0.0,
            backend_seconds=0.0,  # time in the backend itself (graph analysis, eager-fallback checks)
            eager_fallbacks=[],  # {"graph", "error"}: graphs that failed to lower and run eagerly (opt-in)
            dynamic_graphs=[],  # {"graph", "bucketed", "reason"}: graphs with symbolic sizes, padded per bucket or not
            collective_graphs=[],  # {"graph", "path", "collectives", "why"}: graphs with collectives; path "xla"
            # (one SPMD program over the group's mesh) or "host" (ordered host callbacks), with why
            graph_names=[],  # "graph<N>_<forward|backward|inference>", N counting Dynamo graphs since the reset
            dynamo_graphs=0,
        )


reset_compile_stats()


def compile_stats() -> dict:
    """A snapshot of the compile backend's counters (see reset_compile_stats for the keys)."""
    with _lock:
        snap = {k: list(v) if isinstance(v, list) else v for k, v in _state.items()}
    return snap


def next_graph_id() -> int:
    with _lock:
        _state["dynamo_graphs"] += 1
        return _state["dynamo_graphs"] - 1


def marker() -> tuple:
    """Changes whenever an executable is compiled or loaded from the persistent cache."""
    return _state["xla_compile_seconds"], _state["persistent_cache_hits"]


def add(key: str, amount=1) -> None:
    with _lock:
        _state[key] += amount


def add_unlocked(key: str, amount=1) -> None:
    """`add` without the lock, for mode="reduce-overhead"'s per-call counter: a GIL-atomic
    enough increment, no lock on the hot path."""
    _state[key] += amount


def append(key: str, item) -> None:
    with _lock:
        _state[key].append(item)


class building:
    """Context: JAX compile events inside belong to graph `name`."""

    __slots__ = ("name", "start")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _current.name = self.name
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        _current.name = None


def _on_duration(event: str, duration: float, **_) -> None:
    key = _JAX_COMPILE_EVENTS.get(event)
    if key is not None and getattr(_current, "name", None) is not None:
        with _lock:
            _state[key] += duration
            _state["compile_seconds"] += duration


def _on_event(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits" and getattr(_current, "name", None) is not None:
        add("persistent_cache_hits")


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)
