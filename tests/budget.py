"""Counting builds in a test while the executable budget may release them."""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def measured_warm(warm: Callable[[], None], measure: Callable[[], T]) -> T:
    """`warm()` then `measure()`, both again where the executable budget
    (runtime/executable_budget.py) released every in-memory executable meanwhile: a long process
    (the whole suite) passes the budget now and then, and the executables in use are then built
    again, which says nothing about the code measured. The warm-up is inside the repeat because a
    release at its tail (its last safe point) empties the caches the measurement relies on."""
    from torch_pjrt.runtime import executable_budget

    for _ in range(3):
        released = executable_budget.released()
        warm()
        result = measure()
        if executable_budget.released() == released:
            break
    return result
