"""The host-staged path: pjrt tensors are copied to host memory, the collective runs on
the gloo group the pjrt process group owns, and the results are copied back.

It serves every op where the XLA path does not (point-to-point, uneven all_to_all,
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
    """A gloo work on host mirrors; `finish` copies results back once the work is done."""

    def __init__(self, what: str, result: list, gloo_work, finish: Callable[[], None],
                 timeout: datetime.timedelta | None = None):
        super().__init__(what, result, timeout=timeout)
        self._gloo, self._finish = gloo_work, finish

    def is_completed(self) -> bool:
        return self._finish is None or self._gloo.is_completed()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        if self._finish is None:
            return True
        try:
            self._gloo.wait(timeout) if timeout else self._gloo.wait()
        except Exception as e:  # noqa: BLE001  (gloo's timeout or "connection closed by peer")
            self._error = CollectiveError(f"pjrt: {self.what} failed: {e}")
            raise self._error from None
        finish, self._finish = self._finish, None
        finish()
        return True
