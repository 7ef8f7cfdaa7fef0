"""What eager execution compiled: executables per op, compile seconds, persistent-cache hits.

An eager op's executable is traced once per signature (shapes, dtypes, static arguments);
each trace is a new executable (an XLA compile, or a load from the persistent cache). When
one op has been traced for more than TORCH_PJRT_RECOMPILE_WARN signatures (default 64: a model
with many layer shapes legitimately builds dozens) a
warning names the op and the arguments that keep changing, as Dynamo warns about
recompiles: each new value of those costs a compile.
"""
from __future__ import annotations

import collections
import os
import threading
import warnings

import jax
import jax.monitoring

from ..ops.registry import Split
from ..runtime import executable_store
from ..runtime.executable_budget import BUILD_EVENT

_lock = threading.Lock()
_by_op: collections.Counter = collections.Counter()
_last: dict = {}  # op -> the last traced signature, {argument: shape/dtype or static value}
_changing: dict = collections.defaultdict(collections.Counter)  # op -> argument -> times it changed
_warned: set = set()
# (op, signature) of every executable traced in this process, kept across resets: after
# runtime/executable_budget.py drops JAX's executables, a retrace of one of these is not new
_seen: set = set()
_totals = {"compile_seconds": 0.0, "persistent_cache_hits": 0}


def _on_duration(name: str, seconds: float, **_) -> None:
    if name == BUILD_EVENT:
        _totals["compile_seconds"] += seconds


def _on_event(name: str, **_) -> None:
    if name.endswith("compilation_cache/cache_hits") or name == executable_store.HIT_EVENT:
        _totals["persistent_cache_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def _describe(v):
    if type(v) is Split:  # a `split=` argument: its static part (its value is traced)
        return ("split", v.static)
    if isinstance(v, jax.core.Tracer) or hasattr(v, "shape") and hasattr(v, "dtype"):
        return ("array", tuple(v.shape), str(v.dtype))
    if isinstance(v, (list, tuple)):
        return tuple(_describe(x) for x in v)
    return v


def traced(op, names, values) -> None:
    """Called when an eager executable of `op` is traced (a new signature)."""
    signature = {name: _describe(v) for name, v in zip(names, values)}
    try:
        key = (str(op), tuple(signature.items()))
        hash(key)
    except TypeError:  # an unhashable static argument: count it as new
        key = None
    with _lock:
        if key is not None:
            if key in _seen:
                return
            _seen.add(key)
        _by_op[str(op)] += 1
        previous = _last.get(op)
        if previous is not None:
            for name, v in signature.items():
                if previous.get(name) != v:
                    _changing[op][name] += 1
        _last[op] = signature
        count = _by_op[str(op)]
    limit = int(os.environ.get("TORCH_PJRT_RECOMPILE_WARN", "64"))
    if count > limit and op not in _warned:
        _warned.add(op)
        varying = ", ".join(f"'{n}'" for n, _ in _changing[op].most_common(3)) or "its arguments"
        warnings.warn(
            f"pjrt: {op} has compiled {count} eager executables; {varying} changed between them. Each new "
            f"shape or static value compiles again (see torch_pjrt.eager_stats(); TORCH_PJRT_RECOMPILE_WARN "
            f"sets this threshold).", stacklevel=4)


def eager_stats() -> dict:
    """A snapshot: executables traced per op, their total, compile seconds and persistent
    cache hits of this process (the last two count every executable, compiled graphs too),
    which arguments changed between an op's executables, and fused mode's regions
    (runtime/fused.py: regions, ops per region, compiles and cache hits, why regions ended), and
    per op which path its calls took ("paths": the C++ fast path or Python, eager/paths.py)."""
    from ..runtime import executable_budget, fused
    from . import paths

    with _lock:
        return {
            "executables_released": executable_budget.released(),
            "fused": fused.stats(),
            "paths": paths.snapshot(),
            "executables": sum(_by_op.values()),
            "by_op": dict(_by_op.most_common()),
            "changing_arguments": {str(op): dict(c) for op, c in _changing.items()},
            **_totals,
        }


def reset_eager_stats() -> None:
    from ..runtime import fused
    from . import paths

    fused.reset_stats()
    paths.reset()
    with _lock:
        _by_op.clear()
        _last.clear()
        _changing.clear()
        _warned.clear()
        _totals.update(compile_seconds=0.0, persistent_cache_hits=0)
