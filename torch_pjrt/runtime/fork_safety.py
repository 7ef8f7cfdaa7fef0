"""os.fork() in a process that runs JAX: one explanation, and none where the fork is harmless.

JAX warns at every fork ("os.fork() was called. ... JAX is multithreaded, so this will likely
lead to a deadlock"): a child that uses JAX inherits a client whose threads did not survive
the fork. A DataLoader with `num_workers > 0` forks its workers (Linux's default start
method), and JAX's warning then fires for each, although such a worker normally only indexes
a dataset and collates CPU tensors, never touching JAX; the batches move to pjrt in the main
process. So, once `install()` has run:

- JAX's fork warning (that message only, no other JAX warning) is filtered during forks;
- a fork made by torch.utils.data's DataLoader says nothing;
- any other fork warns once per process, saying what is safe and what to do.

docs/training.md ("DataLoader workers") says the same for readers.
"""
from __future__ import annotations

import os
import sys
import warnings

JAX_FORK_WARNING = r"os\.fork\(\) was called\. os\.fork\(\) is incompatible with multithreaded code"
EXPLANATION = (
    "torch-pjrt: os.fork() in a process that runs JAX (the pjrt device). The child must not use the "
    "pjrt device or JAX: their threads do not survive a fork, and the child would likely deadlock. "
    "A child that computes on the CPU only is safe. Otherwise start it with multiprocessing's 'spawn' "
    "or 'forkserver' method (DataLoader(..., multiprocessing_context='spawn')); see docs/training.md. "
    "This warning replaces JAX's and is shown once.")

_installed = False
_explained = False
_silencing: list = []  # the filter that hides JAX's warning during the fork in progress


def install() -> None:
    """Once per process, after JAX's backends exist: JAX registers its fork hook then, and
    hooks run before a fork in the reverse order of registration, so ours runs first."""
    global _installed
    if _installed or not hasattr(os, "register_at_fork"):  # no fork outside Unix
        return
    _installed = True
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def _before_fork() -> None:
    # The filter is added for the fork only, not once at install: test runners and
    # `warnings.catch_warnings` blocks restore the filter list and would drop it.
    warnings.filterwarnings("ignore", message=JAX_FORK_WARNING, category=RuntimeWarning)
    _silencing.append(warnings.filters[0])
    global _explained
    if _explained or _forking_a_dataloader_worker():
        return
    _explained = True
    warnings.warn(EXPLANATION, RuntimeWarning, stacklevel=2)  # 2: the code that called os.fork()


def _after_fork() -> None:
    while _silencing:
        entry = _silencing.pop()
        if entry in warnings.filters:
            warnings.filters.remove(entry)
            warnings._filters_mutated()  # what warnings' own functions call after a change


def _forking_a_dataloader_worker() -> bool:
    """True when torch.utils.data's DataLoader is on the stack of this fork: it is starting
    its worker processes."""
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    path = getattr(dataloader, "__file__", None)
    frame = sys._getframe(1)
    while frame is not None and path is not None:
        if frame.f_code.co_filename == path:
            return True
        frame = frame.f_back
    return False
