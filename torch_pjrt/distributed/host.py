"""The host-staged path: pjrt tensors are copied to host memory, the collective runs on
the gloo group the pjrt process group owns, and the results are copied back.

It serves every op where the XLA path does not (single sends and receives, and a
coalesced block's where the two ends disagree: p2p.py; uneven all_to_all,
gather, scatter, list-of-tensor forms, processes without JAX's multi-process runtime)
and every CPU tensor given to a pjrt group. Gloo runs the op asynchronously; `HostWork`
copies the results back into the pjrt tensors when it is waited on.
"""
from __future__ import annotations

import datetime
from typing import Callable

import torch

from .work import CollectiveError, PjrtWork


def to_host(x):
    """A host mirror of a tensor or (nested) list of tensors; CPU tensors are their own mirror."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.device.type == "pjrt" else x
    return [to_host(e) for e in x]


def copy_back(originals, mirrors) -> None:
    """Write host results into the pjrt tensors they mirror."""
    if isinstance(originals, torch.Tensor):
        if originals is not mirrors:
            with torch.no_grad():
                originals.copy_(mirrors)
        return
    for o, m in zip(originals, mirrors):
        copy_back(o, m)


class HostWork(PjrtWork):
    """A gloo work on host mirrors; `finish` copies results back once the work is done.
    Waiting, `get_future()` and the once-only copy back are PjrtWork's (work.py)."""

    def __init__(self, what: str, result: list, gloo_work, finish: Callable[[], None],
                 timeout: datetime.timedelta | None = None):
        super().__init__(what, result, finish=lambda _: finish(), timeout=timeout)
        self._gloo = gloo_work
        self._finished = False

    def _ready(self) -> bool:
        return self._gloo.is_completed()

    def _value(self, timeout: datetime.timedelta | None):
        try:
            self._gloo.wait(timeout) if timeout else self._gloo.wait()  # gloo's own timeout: the group's
        except Exception as e:  # noqa: BLE001  (gloo's timeout or "connection closed by peer")
            raise CollectiveError(f"pjrt: {self.what} failed: {e}") from None

    def _ordered_by_dispatcher(self) -> bool:
        return False  # gloo runs it, in the order it was issued
