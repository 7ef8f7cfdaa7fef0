"""What the worker-side cases share: the registry, checks against references, setup."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

CASES = {}
failures: list[str] = []


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def check_equal(name: str, actual, expected, **tol) -> None:
    """Record a failure unless `actual` (pjrt or CPU) equals `expected` (CPU)."""
    actual = [a.cpu() for a in actual] if isinstance(actual, (list, tuple)) else actual.cpu()
    try:
        torch.testing.assert_close(actual, expected, **(tol or {"rtol": 0, "atol": 0}))
    except AssertionError as e:
        failures.append(f"rank {dist.get_rank()}: {name}: {e}")


def pjrt() -> torch.device:
    return torch.device("pjrt", 0)


def init(backend: str = "pjrt", timeout_s: float = 60) -> None:
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
