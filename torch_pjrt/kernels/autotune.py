"""A small autotuner: the fastest tunable configuration (block sizes) per op and shape.

A kernel declares `tune={"block_q": (64, 128), ...}`; the product of the choices is the
candidate list, its first entry the default. On the first call for a new key (op,
platform, device kind, argument shapes and dtypes, static arguments) the tuner compiles
each candidate on random inputs of those shapes, times a few runs and keeps the fastest.
Choices live in memory and in a JSON file, `$TORCH_PJRT_CACHE_DIR/autotune.json`
(default ~/.cache/torch_pjrt/autotune.json), so a new process does not tune again.

When it runs: TORCH_PJRT_AUTOTUNE=1 always, =0 never; unset, on GPU and TPU only. On the
CPU Pallas runs in interpret mode, whose timings say nothing about real hardware, so the
default candidate is used there.
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

_lock = threading.Lock()
_memory: dict[str, dict] = {}
_failed: dict[str, str] = {}  # key -> why no candidate worked (this process only)
_loaded_from: Path | None = None
TIMED_RUNS = 5


def candidates(tune: dict[str, Sequence] | None) -> list[dict]:
    """Every combination of the tunable values; the first is the default."""
    if not tune:
        return [{}]
    names = list(tune)
    return [dict(zip(names, values)) for values in itertools.product(*(tune[n] for n in names))]


def enabled(platform_name: str) -> bool:
    flag = os.environ.get("TORCH_PJRT_AUTOTUNE")
    if flag is not None:
        return flag not in ("0", "", "false", "False")
    return platform_name in ("gpu", "tpu")


def cache_path() -> Path:
    from ..runtime.build import cache_dir

    return cache_dir() / "autotune.json"


def _load() -> None:
    global _loaded_from
    path = cache_path()
    if _loaded_from == path:
        return
    _loaded_from = path
    try:
        _memory.update(json.loads(path.read_text()))
    except (OSError, ValueError):  # no file yet, or a damaged one: tune again
        pass


def _save() -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(_memory, f, indent=1, sort_keys=True)
        os.replace(f.name, path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache directory only costs tuning again next process


def key(op_name: str, platform_name: str, device_kind: str, arrays, static) -> str:
    shapes = ",".join(f"{a.dtype}{list(a.shape)}" if a is not None else "None" for a in arrays)
    return f"{op_name}|{platform_name}|{device_kind}|{shapes}|{static!r}"


def lookup(k: str) -> dict | None:
    with _lock:
        _load()
        return _memory.get(k)


class NoWorkingConfig(RuntimeError):
    """Every candidate configuration failed to compile or run for one key."""


def best(k: str, configs: list[dict], measure: Callable[[dict], float]) -> dict:
    """The config with the lowest `measure(config)` (seconds); candidates that fail are skipped.
    Raises NoWorkingConfig (remembered for the process: no second round of failing compiles)."""
    found = lookup(k)
    if found is not None:
        return found
    if k in _failed:
        raise NoWorkingConfig(_failed[k])
    timings, first_error = [], None
    for config in configs:
        try:
            timings.append((measure(config), config))
        except Exception as e:  # noqa: BLE001  (a block size the hardware rejects is just not a candidate)
            first_error = first_error or e
    if not timings:
        _failed[k] = (f"pjrt kernel autotune: every candidate failed for {k}: {configs}; the first one with "
                      f"{type(first_error).__name__}: {str(first_error)[:2000]}")
        raise NoWorkingConfig(_failed[k]) from first_error
    choice = min(timings, key=lambda t: t[0])[1]
    with _lock:
        _memory[k] = choice
        _save()
    return choice


def clear(disk: bool = False) -> None:
    """Forget tuned choices (and delete the cache file with disk=True)."""
    global _loaded_from
    with _lock:
        _memory.clear()
        _failed.clear()
        _loaded_from = None  # the next lookup reads the file again
        if disk:
            try:
                cache_path().unlink()
            except OSError:
                pass


def time_call(fn: Callable, shapes_dtypes, device) -> float:
    """Best-of-N seconds of compiled `fn` on random inputs with the given shapes and dtypes."""
    import jax

    with jax.ensure_compile_time_eval():  # may be called while an outer jit traces: run, don't stage
        rng = np.random.default_rng(0)
        args = [None if s is None else jax.device_put(_random(rng, s), device) for s in shapes_dtypes]
        compiled = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        best_time = float("inf")
        for _ in range(TIMED_RUNS):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            best_time = min(best_time, time.perf_counter() - start)
    return best_time


def _random(rng, spec):
    dtype = np.dtype(spec.dtype)
    if np.issubdtype(dtype, np.integer):
        return np.zeros(spec.shape, dtype)  # index-like inputs: zeros are always in range
    return rng.standard_normal(spec.shape).astype(dtype)
