"""A safe point: Python between two calls, outside any trace, where process-wide caches may be dropped.

Two things wait for one: the executable budget's release (executable_budget.py) and the caches of
traces made under another default dtype (default_dtype.py). Every C++ kernel's entry is one too
(fast_path.cpp's safe_point makes the same two tests natively).
"""
from __future__ import annotations

from . import default_dtype
from .executable_budget import release_if_due


def safe_point() -> None:
    release_if_due()
    default_dtype.check()
