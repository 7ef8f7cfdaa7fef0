"""Work objects of the pjrt process group.

A collective's result tensors already hold its output (on the XLA path, arrays JAX is
still computing), so every later op on them is ordered after the collective by data
dependency, as a CUDA stream orders ops after NCCL. That makes the future complete at
once; `wait()` blocks until the device has finished, with the group's timeout, because
that is where a dead or stuck peer must turn into an error instead of a hang.
"""
from __future__ import annotations

import concurrent.futures
import datetime

import jax
from torch._C._distributed_c10d import Work
from torch.futures import Future

# block_until_ready has no timeout: it runs here so that wait() can give up on it
_waiter = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pjrt-collective-wait")


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the op, the group and its ranks."""


class PjrtWork(Work):
    def __init__(self, what: str, result: list, pending: tuple = (), timeout: datetime.timedelta | None = None):
        super().__init__()
        self.what = what  # "all_reduce on group 'default' (global ranks [0, 1]), this rank 0"
        self._result = result
        self._pending = tuple(pending)  # jax arrays still being computed
        self._timeout = timeout
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        return all(a.is_ready() for a in self._pending)

    def is_success(self) -> bool:
        return self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        if not self._pending:
            return True
        limit = timeout if timeout else self._timeout  # timedelta(0): the caller gave none
        seconds = limit.total_seconds() if limit else None
        try:
            if self.is_completed():  # still surfaces a failed computation's error
                jax.block_until_ready(self._pending)
            else:
                _waiter.submit(jax.block_until_ready, self._pending).result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            self._error = CollectiveError(
                f"pjrt: {self.what} did not finish within {seconds:.0f} s; a peer rank may have died or not "
                f"called the same collective")
            raise self._error from None
        except Exception as e:  # noqa: BLE001  (XLA's error, e.g. gloo's "connection closed by peer")
            self._error = CollectiveError(f"pjrt: {self.what} failed: {e}")
            raise self._error from None
        self._pending = ()
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list:
        return self._result

    def get_future(self) -> Future:
        future = Future()
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._result)
        return future


def completed(what: str, result: list) -> PjrtWork:
    """The work of a collective that already finished (host-staged ops run synchronously)."""
    return PjrtWork(what, result)
