"""Work objects of the pjrt process group.

An XLA collective runs on one dispatcher thread (shared by all groups, so a process
issues its collectives in program order, which every rank must share anyway): XLA's CPU
collectives block the calling thread until every peer has joined, and a peer that died
or never calls would otherwise hang the caller for good. `wait()` takes the result with
the group's timeout, raises `CollectiveError` naming the op, group and ranks when it
fails or expires, and writes the result into the op's tensors.

`get_future()` does not wait: a completion thread waits for the work (with the group's
timeout), writes the result into the tensors and then completes the torch future, which
runs its `.then()` callbacks there. So DDP's backward pass goes on while the buckets it
has handed over are reduced, as with NCCL. A separate thread rather than the dispatcher:
callbacks may issue and wait for collectives themselves (PowerSGD's hook does), which the
dispatcher must be free to run. Eager pjrt ops from several threads are safe (the runtime's
shared state is atomic or behind the GIL, as for the autograd engine's device threads);
the work's tensors belong to the collective until it completes, as c10d requires. In fused
eager mode what a future's callbacks record on the completion thread is one region of its own,
run once they return (the completion thread's regions then end at the same calls on every rank).

Collectives issued by such a callback keep one order on every rank: `get_future()` puts a
`_Slot` in the dispatcher's queue, and when the dispatcher reaches it, it runs the
collectives the future's callbacks issue, and nothing else, until they have returned. So
they take the place where `get_future()` was called, as NCCL's callbacks do (they run at
once there), whichever rank's collective finishes first.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import queue
import threading
from typing import Callable

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from ..runtime import fused


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the op, the group and its ranks."""


_queue: queue.SimpleQueue = queue.SimpleQueue()  # the dispatcher's: (compute, future) or a _Slot
_threads: dict[str, threading.Thread] = {}
_threads_lock = threading.Lock()
_here = threading.local()  # .slot: on a completion thread, the slot of the future being completed


def _started(name: str, target: Callable[[], None]) -> None:
    """Start daemon thread `name` once. Daemon threads rather than executors: the interpreter
    joins an executor's threads at exit, and a collective whose peer died would then block
    the exit for good."""
    if name in _threads:
        return
    with _threads_lock:  # collectives are issued from several threads (autograd's, callbacks')
        if name not in _threads:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            _threads[name] = thread


def dispatch(compute: Callable[[], object]) -> concurrent.futures.Future:
    """Run `compute` (an XLA collective, blocked on until done) on the dispatcher thread."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    slot = getattr(_here, "slot", None)
    (slot.nested if slot is not None else _queue).put((compute, future))
    _started("pjrt-collectives", _serve)
    return future


def _serve() -> None:
    while True:
        item = _queue.get()
        if isinstance(item, _Slot):
            item.hold()
        else:
            _run(*item)


def _run(compute, future: concurrent.futures.Future) -> None:
    try:
        future.set_result(compute())
    except BaseException as e:  # noqa: BLE001  (delivered to whoever waits)
        future.set_exception(e)


class _Slot:
    """Where in the dispatcher's order a work's `get_future()` was called: the collectives
    its callbacks issue run there (see the module's docstring)."""

    def __init__(self):
        self.nested: queue.SimpleQueue = queue.SimpleQueue()

    def hold(self) -> None:
        """On the dispatcher: run the callbacks' collectives until the future is completed."""
        while (item := self.nested.get()) is not None:
            _run(*item)

    def release(self) -> None:
        self.nested.put(None)


# Two completion threads, each completing its futures in the order they were asked for:
# XLA works finish in the dispatcher's order, so one thread serves them; host-staged works
# finish whenever gloo does, and must not hold up the XLA ones (or their slots) meanwhile.
_completions = {"pjrt-futures": queue.SimpleQueue(), "pjrt-host-futures": queue.SimpleQueue()}


def _complete_in_order(name: str) -> None:
    pending = _completions[name]
    while True:
        work, future, device, slot = pending.get()
        _here.slot = slot
        try:
            _complete(work, future, device)
            _run_callbacks_region()
        finally:
            _here.slot = None
            if slot is not None:
                slot.release()


class _Failed:
    """An outcome future's value when the work failed (see PjrtWork.get_future)."""

    def __init__(self, error: BaseException):
        self.error = error


def _outcome_value(outcome: Future):
    """The `.then` callback that turns an outcome into get_future()'s result or error."""
    value = outcome.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


def _complete(work: PjrtWork, outcome: Future, device: int | None = None) -> None:
    """Wait for `work` (its result is then in its tensors) and complete `outcome` with it."""
    try:
        if device is not None:
            torch.pjrt.set_device(device)  # the current device of get_future's caller, for the callbacks
        work.wait()
    except Exception as e:  # noqa: BLE001  (CollectiveError, or a failed write of the result)
        outcome.set_result(_Failed(e))
        return
    outcome.set_result(work.result())


def _run_callbacks_region() -> None:
    """Run what a future's callbacks recorded (fused eager) as one region, whenever the next
    future comes. A failure is logged, not raised: this thread must go on completing futures,
    and a reader of the region's tensors gets an error naming it."""
    try:
        fused.flush("future callbacks")
    except Exception:  # noqa: BLE001
        fused.log.exception("pjrt fused eager: the region recorded by a collective future's callbacks failed")


def _on_completion_thread() -> bool:
    thread = threading.current_thread()
    return thread.name in _completions and _threads.get(thread.name) is thread


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
        self._finished = future is None  # the result is in the tensors
        self._dispatched = future is not None  # run by the dispatcher (kept once the work is finished)
        self._lock = threading.Lock()  # finish runs once, whichever thread waits first

    # -- what a kind of work defines
    def _ready(self) -> bool:
        """The collective is over (waiting would not block)."""
        future = self._future  # None once another thread has finished the work
        return future is None or future.done()

    def _value(self, timeout: datetime.timedelta | None):
        """Block until the collective is over; its value, or CollectiveError."""
        limit = timeout if timeout else self._timeout  # timedelta(0): the caller gave none
        seconds = limit.total_seconds() if limit else None
        future = self._future
        if future is None:  # another thread has finished the work meanwhile
            return None
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise CollectiveError(
                f"pjrt: {self.what} did not finish within {seconds:.0f} s; a peer rank may have died or not called "
                f"the same collective") from None
        except CollectiveError:  # already names the op and ranks (the ranks' calls disagreed)
            raise
        except Exception as e:  # noqa: BLE001  (XLA's error, e.g. gloo's "connection closed by peer")
            raise CollectiveError(f"pjrt: {self.what} failed: {e}") from None

    def _ordered_by_dispatcher(self) -> bool:
        """Whether the dispatcher ran this work, so that its callbacks' collectives get a slot there
        (whether or not a wait() finished it before get_future())."""
        return self._dispatched

    # -- c10d's Work
    def is_completed(self) -> bool:
        if self._finished or self._error is not None:
            return True
        if not self._ready():
            return False
        try:  # over: store the result now, so that a completed work's tensors hold it
            self.wait()
        except CollectiveError:
            pass
        return True

    def is_success(self) -> bool:
        return self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        if self._finished:
            return True
        try:
            value = self._value(timeout)
        except CollectiveError as e:
            with self._lock:
                if self._finished:  # another thread finished it meanwhile (a race with a short `timeout`)
                    return True
                self._error = self._error or e
            raise self._error from None
        with self._lock:  # the completion thread and the caller may both wait
            if self._error is not None:
                raise self._error
            if not self._finished:
                if self._finish is not None:
                    self._finish(value)
                # drop the value: a reference here would keep the tensors' new buffer from being donated
                self._finished, self._future, self._finish = True, None, None
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list:
        return self._result

    def get_future(self) -> Future:
        """A future of `result()` that completes (or fails with the CollectiveError, wrapped
        in the RuntimeError a failed torch future raises) once the collective is over and its
        result is in the tensors; the caller does not wait.

        It fails in C++ too: it is the `.then()` of an outcome future, whose callback raises
        the error. torch's Python `Future.set_exception` completes a future *successfully* with
        the exception as its value (only Python's wait() raises it), so C++ readers such as
        DDP's reducer took the exception for the reduced bucket (and crashed, in
        parseCppCommHookResult, when a peer died mid-step)."""
        outcome = Future()
        future = outcome.then(_outcome_value)
        if _on_completion_thread():
            # a callback asking for another collective's future: complete it here, this thread
            # cannot wait for itself
            _complete(self, outcome)
            return future
        # Even when the work is over already, its callbacks run on the completion thread, in its
        # slot: run here at once, they would record into the caller's fused region (another
        # region boundary, so other rounding, on the ranks whose collective finished first).
        ordered = self._ordered_by_dispatcher()
        name, slot = ("pjrt-futures", _Slot()) if ordered else ("pjrt-host-futures", None)
        _started(name, lambda: _complete_in_order(name))
        with _threads_lock:  # slots in the order of their futures, even when two threads ask at once
            _completions[name].put((self, outcome, torch.pjrt.current_device(), slot))
            if slot is not None:
                _queue.put(slot)
        return future
