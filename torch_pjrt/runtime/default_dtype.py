"""`torch.set_default_dtype` after the first call: every cache of traces is dropped.

Traces read torch's default dtype (an int division's or an int `sqrt`'s float result, `arange`
over floats, a make_fx trace of a decomposition), while every cache of traced results is keyed by
shapes, dtypes and static arguments only: JAX's jit caches, the output shapes of recorded calls
(fused._shapes and the C++ recorders' signatures), decomposed ops' programs. CPU torch decides at
each call, so a change must reach every trace made after it.

So the default dtype that traces were made with is watched at the safe points (every kernel's
entry, a region's run, a compiled graph's call; a pointer compare): when it changed, the regions
recorded before the change run under the dtype they were recorded with, then every cache of traces
is dropped (the modules holding one register their `clear` here) and later calls trace again.
torch's default dtype is one per process, so the old one is set back for those regions' run.
"""
from __future__ import annotations

from typing import Callable

import jax
import torch

from .build import load as _load_runtime

_state = {"traced_with": torch.get_default_dtype(), "changes": 0}
_clears: list[Callable[[], None]] = []


def on_change(clear: Callable[[], None]) -> Callable[[], None]:
    """Register `clear`, which drops a cache of traced results; returns it (usable as a decorator)."""
    _clears.append(clear)
    return clear


def check() -> None:
    """At a safe point (no trace in progress): drop every cache of traces if the default dtype changed
    since they were made. A pointer compare when it did not."""
    if torch.get_default_dtype() is not _state["traced_with"]:
        _changed()


def _changed() -> None:
    from . import fused  # (fused imports this module)

    new, old = torch.get_default_dtype(), _state["traced_with"]
    torch.set_default_dtype(old)  # pending calls were recorded (their output dtypes fixed) under the old dtype
    try:
        fused.flush_all("default dtype changed")
    finally:
        torch.set_default_dtype(new)
    _state["traced_with"] = new
    _state["changes"] += 1
    for clear in _clears:
        clear()
    _load_runtime().forget_recorded_signatures()
    jax.clear_caches()


def changes() -> int:
    """How many times this process saw the default dtype change after a trace."""
    return _state["changes"]
