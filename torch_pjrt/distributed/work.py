"""Work objects of the pjrt process group.

An XLA collective runs on one dispatcher thread (shared by all groups, so a process
issues its collectives in program order, which every rank must share anyway): XLA's CPU
collectives block the calling thread until every peer has joined, and a peer that died
or never calls would otherwise hang the caller for good. `wait()` takes the result with
the group's timeout, raises `CollectiveError` naming the op, group and ranks when it
fails or expires, and writes the result into the op's tensors.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import queue
import threading
from typing import Callable

from torch._C._distributed_c10d import Work
from torch.futures import Future

class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the op, the group and its ranks."""


_queue: queue.SimpleQueue = queue.SimpleQueue()
_thread: threading.Thread | None = None


def dispatch(compute: Callable[[], object]) -> concurrent.futures.Future:
    """Run `compute` (an XLA collective, blocked on until done) on the dispatcher thread.

    A daemon thread rather than a ThreadPoolExecutor: the interpreter joins an executor's
    threads at exit, and a collective whose peer died would then block the exit for good."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name="pjrt-collectives", daemon=True)
        _thread.start()
    future: concurrent.futures.Future = concurrent.futures.Future()
    _queue.put((compute, future))
    return future


def _serve() -> None:
    while True:
        compute, future = _queue.get()
        try:
            future.set_result(compute())
        except BaseException as e:  # noqa: BLE001  (delivered to whoever waits)
            future.set_exception(e)


class PjrtWork(Work):
    """A collective in flight: `future` yields its value, `finish(value)` stores it in the op's tensors."""

    def __init__(self, what: str, result: list, future: concurrent.futures.Future | None = None,
                 finish: Callable[[object], None] | None = None, timeout: datetime.timedelta | None = None):
        super().__init__()
        self.what = what  # "all_reduce on process group '0' (global ranks [0, 1]; ...)"
        self._result = result
        self._future, self._finish = future, finish
        self._timeout = timeout
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        return self._future is None or self._future.done()

    def is_success(self) -> bool:
        return self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        if self._future is None:
            return True
        limit = timeout if timeout else self._timeout  # timedelta(0): the caller gave none
        seconds = limit.total_seconds() if limit else None
        try:
            value = self._future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            self._error = CollectiveError(
                f"pjrt: {self.what} did not finish within {seconds:.0f} s; a peer rank may have died or not called "
                f"the same collective")
            raise self._error from None
        except CollectiveError as e:  # already names the op and ranks (the ranks' calls disagreed)
            self._error = e
            raise
        except Exception as e:  # noqa: BLE001  (XLA's error, e.g. gloo's "connection closed by peer")
            self._error = CollectiveError(f"pjrt: {self.what} failed: {e}")
            raise self._error from None
        finish, self._future, self._finish = self._finish, None, None
        if finish is not None:
            finish(value)
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list:
        return self._result

    def get_future(self) -> Future:
        # the result tensors hold the value only once waited for, so the future completes by waiting
        future = Future()
        try:
            self.wait()
            future.set_result(self._result)
        except CollectiveError as e:
            future.set_exception(e)
        return future
