"""An exception that interrupts fused eager (a Ctrl-C, a SIGALRM timeout's handler) between two steps
of recording a call or running a region leaves the region valid (runtime/fused.py, "Interrupted").

Each interruption is placed exactly: a trace hook raises at a given line of fused.py (or at a given
call inside JAX), or raises a signal there whose Python handler raises, as pytest harnesses'
timeouts do. Then the next, unrelated ops must compute what CPU torch computes, and the values
queued before the interruption must read as CPU torch's, or (only where a run had consumed its
inputs and its results were lost) raise an error that says so.
"""
from __future__ import annotations

import dis
import inspect
import signal
import sys

import pytest
import torch

import torch_pjrt
from torch_pjrt.runtime import executable_store, fused


class Interrupted(KeyboardInterrupt):
    pass


class Timeout(Exception):  # what a test harness's SIGALRM handler raises (an Exception, not a BaseException)
    pass


def _alarm(signum, frame):
    raise Timeout("timed out")


@pytest.fixture
def fused_mode(monkeypatch):
    """Fused mode, with first sights run op by op (the path these tests interrupt), whatever
    TORCH_PJRT_FUSED_COLD_FRACTION says."""
    monkeypatch.setattr(fused, "COLD_FRACTION", 0.0)
    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")
    yield
    torch_pjrt.set_eager_mode(before)


@pytest.fixture
def alarm_handler():
    before = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.signal(signal.SIGALRM, before)


def _hook(code, event: str, line: int | None, by_signal: bool):
    """A trace function that interrupts the frame of `code` once, at `event` ("line": the first
    time `line` is reached; "call"/"return": its entry or exit)."""
    def local(frame, ev, arg):
        if ev == event and (line is None or frame.f_lineno == line):
            sys.settrace(None)
            frame.f_trace = None
            if by_signal:
                signal.raise_signal(signal.SIGALRM)  # its handler raises Timeout here, in this frame
            raise Interrupted(f"{code.co_name}:{frame.f_lineno}")
        return local

    def tracer(frame, ev, arg):
        if frame.f_code is code:
            if event == "call":
                return local(frame, ev, arg)
            return local
        return None

    return tracer


def _interrupting(work, code, event="line", line=None, by_signal=False):
    """Run `work()` with one interruption planned; the exception it raised (None if the point was
    never reached)."""
    sys.settrace(_hook(code, event, line, by_signal))
    try:
        work()
    except (Interrupted, Timeout) as e:
        return e
    finally:
        sys.settrace(None)
    return None


def _lines(function):
    """The lines of `function`'s body where an interruption can arrive: not a line of NOPs alone (a
    `try:`), which CPython 3.11 leaves out of the exception table, so a trace function's exception
    there skips the enclosing `with`'s exit (it left fused._lock held: a hang later). A signal's
    handler never runs there: Python runs handlers at calls and jumps only."""
    source, first = inspect.getsourcelines(function)
    executable = {i.positions.lineno for i in dis.get_instructions(function) if i.opname != "NOP"}
    return [first + k for k, text in enumerate(source)
            if k and first + k in executable and text.strip() and not text.strip().startswith(("#", '"'))]


def _unrelated_ops_are_right():
    z = torch.ones(4, device="pjrt") + 1
    z[0:2] = 7
    w = torch.arange(5.0, device="pjrt").cumsum(0)
    assert z.cpu().tolist() == [7.0, 7.0, 2.0, 2.0]
    assert w.cpu().tolist() == [0.0, 1.0, 3.0, 6.0, 10.0]


def _queued(n):
    """Values queued in the region (nothing read): x, a clone written through a slice, and a sum."""
    x = torch.arange(float(n), device="pjrt") * 1
    y = x.clone()
    y[1:3] = 5
    s = (y * 2).sum()
    return x, y, s


def _expected(n):
    x = torch.arange(float(n))
    y = x.clone()
    y[1:3] = 5
    return x, y, (y * 2).sum()


def test_interrupted_recording_takes_the_call_out(fused_mode):
    """An interruption at each line of fused.record (the Python recorder: a slice write's call):
    the region's lists, structure and digest must still agree afterwards. Before the fix, an
    interruption between the outputs' and the call's append made every later op of the thread
    fail (IndexError in the region's run), and one before the digest's update could give the
    region another structure's executable."""
    hits = 0
    for line in _lines(fused.record):
        x = torch.arange(6.0, device="pjrt") * 1
        y = x.clone()

        def write():
            y[1:3] = 5

        error = _interrupting(write, fused.record.__code__, line=line)
        hits += error is not None
        assert not fused._lock._is_owned(), line  # (held, the next thread that records would wait forever)
        _unrelated_ops_are_right()
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], line
        # the interrupted write happened or not, nothing in between
        assert y.cpu().tolist() in ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 5.0, 5.0, 3.0, 4.0, 5.0]), line
    assert hits > 30


@pytest.mark.parametrize("function", ["_flush_locked", "_run", "_run_call_by_call", "_materialize"])
def test_interrupted_run_leaves_the_queued_work_valid(fused_mode, function):
    """An interruption at each line of a region's run (its first sight: call by call): the values
    queued before it read as CPU's afterwards (the region runs at the next sync point), and the
    next ops are right. Before the fix they raised "this tensor has no value"."""
    code = getattr(fused, function).__code__
    hits = 0
    for k, line in enumerate(_lines(getattr(fused, function))):
        n = 40 + k  # new shapes: the region is seen for the first time
        x, y, s = _queued(n)
        error = _interrupting(torch.pjrt.synchronize, code, line=line)
        hits += error is not None
        assert not fused._lock._is_owned(), line  # (held, the next thread that records would wait forever)
        _unrelated_ops_are_right()
        want_x, want_y, want_s = _expected(n)
        assert torch.equal(x.cpu(), want_x), line
        assert torch.equal(y.cpu(), want_y), line
        assert s.item() == want_s.item(), line
    assert hits >= 3


def test_timeout_during_a_compile_is_raised_and_the_region_runs_later(fused_mode, alarm_handler):
    """A SIGALRM handler's exception (an Exception, as test harnesses raise) inside JAX's compile of a
    region: it reaches the caller as it is (not run again call by call, not wrapped as an op's
    failure), and the region's values read as CPU's afterwards."""
    from jax._src import compiler

    def queued():  # a call sequence of its own (one that other tests compiled 8 times runs call by call)
        x = torch.arange(23.0, device="pjrt").exp()
        y = x.clone()
        y[1:3] = 5
        return x, y, y.neg().amax()

    keep = queued()
    torch.pjrt.synchronize()  # first sight: the same structure next time compiles
    x, y, m = queued()
    error = _interrupting(torch.pjrt.synchronize, compiler.compile_or_get_cached.__code__, event="call",
                          by_signal=True)
    assert type(error) is Timeout
    _unrelated_ops_are_right()
    want_x = torch.arange(23.0).exp()
    want_y = want_x.clone()
    want_y[1:3] = 5
    torch.testing.assert_close(x.cpu(), want_x)
    torch.testing.assert_close(y.cpu(), want_y)
    torch.testing.assert_close(m.cpu(), want_y.neg().amax())
    del keep


def test_timeout_in_a_kernel_is_not_taken_for_the_ops_error(fused_mode, alarm_handler):
    """A timeout inside a Python kernel's computation: the kernel must not take it for the op's
    failure (before the fix it asked CPU torch, which accepts the call, and raised "the pjrt
    lowering failed ... please report it" in its place)."""
    from torch_pjrt.eager.kernels import Kernel

    x = torch.arange(12.0, device="pjrt").reshape(3, 4) * 1

    def index():
        x[torch.tensor([2, 0], device="pjrt")]  # a Python kernel (index.Tensor)

    error = _interrupting(index, Kernel._compute.__code__, event="call", by_signal=True)
    assert type(error) is Timeout, repr(error)
    _unrelated_ops_are_right()
    assert torch.equal(x[torch.tensor([2, 0], device="pjrt")].cpu(), torch.arange(12.0).reshape(3, 4)[[2, 0]])


def test_results_lost_after_donated_inputs_say_so(fused_mode, monkeypatch):
    """The one case a region cannot run again: its run consumed donated inputs (an in-place update
    of a tensor only the region holds) and the interruption came before its results were kept. Its
    values then raise an error naming what happened, never garbage; other tensors are unaffected."""
    from jax._src.interpreters import pxla

    n = 29

    def step():
        t = torch.arange(float(n), device="pjrt") * 1
        torch.pjrt.synchronize()
        t.add_(1)
        t.mul_(2)
        return t

    keep = step()
    torch.pjrt.synchronize()  # first sight
    keep2 = step()
    torch.pjrt.synchronize()  # compiled
    # the cached run goes through C++ (no Python frame to stop in): forget the executable so the run
    # is Python's again (first sight, then compiled), and stop it as JAX returns the results; without
    # the executable store, whose copy of the region would run at its first sight, compiled in C++
    monkeypatch.setattr(executable_store, "on", lambda: False)
    fused._executables.clear()
    fused._seen.clear()
    keep3 = step()
    torch.pjrt.synchronize()  # first sight again
    t = step()
    execute = pxla.ExecuteReplicated.__call__.__wrapped__.__code__  # (under JAX's profiler wrapper)
    error = _interrupting(torch.pjrt.synchronize, execute, event="return")
    assert error is not None
    _unrelated_ops_are_right()
    with pytest.raises(RuntimeError, match=r"was interrupted \(Interrupted\) after its run had consumed its "
                                           r"inputs \(donated buffers\): its results are lost"):
        t.cpu()
    del keep, keep2, keep3


def test_interrupted_cached_run_from_cpp_leaves_the_queued_work_valid(fused_mode):
    """The steady path: C++ runs a cached region's executable (run_cached_region). An interruption
    there, before the results came (here the cached executable is wrapped so that its call raises
    first, as a signal's handler would if the call entered Python), gives the region back to its
    thread: its values read as CPU's at the next sync point. Before the fix C++ let the region's
    outputs go, and they read as "this tensor has no value"."""
    def queued(device="pjrt"):  # a call sequence of its own (the tests above compile _queued's 8 times)
        x = torch.arange(31.0, device=device) * 3
        y = x.clone()
        y[2:4] = -1
        return x, y, y.exp().sum()

    for _ in range(2):  # first sight, then compiled and cached
        keep = queued()
        torch.pjrt.synchronize()
    x, y, s = queued()
    cached = dict(fused._executables)
    called = []

    def interrupting(*inputs):
        called.append(len(inputs))
        fused._executables.update(cached)  # once
        raise Interrupted("cached run")

    fused._executables.update({key: interrupting for key in cached})
    try:
        with pytest.raises(Interrupted):
            torch.pjrt.synchronize()
    finally:
        fused._executables.update(cached)
    assert called, "the region did not run from the cache (nothing was interrupted)"
    _unrelated_ops_are_right()
    want_x, want_y, want_s = queued("cpu")
    assert torch.equal(x.cpu(), want_x)
    assert torch.equal(y.cpu(), want_y)
    torch.testing.assert_close(s.cpu(), want_s)
    del keep
