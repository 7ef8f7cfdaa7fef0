"""Which path each eager call took, per op: what still leaves the C++ fast path.

An eager call of a table op enters its C++ kernel (runtime/csrc/fast_path.cpp, FastKernel),
which either serves it (its executable run from C++, or its call handed to the recorder) or
gives it to the op's Python kernel (kernels.py). Other ops have Python kernels only
(transfer.py, view_kernels.py, the boxed fallback). In fused mode a fast call of a signature
seen before is recorded in C++ (runtime/csrc/recorder.cpp); the rest go through the Python
recorder (runtime/fused.py, `record`). The counts:

  fast             calls the C++ kernel served without a Python kernel
  python_kernel    calls that entered a Python kernel (FastKernel's slow path, a Python-registered
                   kernel, the fallback: decompositions and CPU fallback)
  python_recorder  calls recorded by fused.record, by the name of what was recorded (an op, or a
                   storage step such as "read view" or "write view")
  cpp_recorder     fast calls recorded by the C++ recorder (runtime/csrc/recorder.cpp): no Python ran

The C++ kernels count in C++ (two integers per kernel); the rest count where Python already runs.
"""
from __future__ import annotations

import collections
import functools
from typing import Callable

from ..runtime import fused
from ..runtime.safe_point import safe_point
from ..runtime.build import load as _load_runtime
from .errors import op_label

_python_kernels: collections.Counter = collections.Counter()


def entered(name: str) -> None:
    """A call entered a Python kernel of op `name`."""
    _python_kernels[name] += 1
    safe_point()  # Python between calls: a safe point


def counted(op, kernel: Callable) -> Callable:
    """`kernel` (a Python kernel of `op`), counting its calls under the dispatcher's name of the op
    ("aten::add.Tensor", as the C++ kernels count)."""
    name = op_label(op)

    @functools.wraps(kernel)
    def python_kernel(*args, **kwargs):
        _python_kernels[name] += 1
        safe_point()  # Python between calls: a safe point
        return kernel(*args, **kwargs)

    return python_kernel


def snapshot() -> dict:
    """{name: {"fast": n, "python_kernel": n, "python_recorder": n, "cpp_recorder": n}} for every name
    with a count."""
    out: dict = collections.defaultdict(lambda: {"fast": 0, "python_kernel": 0, "python_recorder": 0,
                                                 "cpp_recorder": 0})
    for name, (fast, slow, recorded) in _load_runtime().fast_path_counts().items():
        out[name]["fast"] += fast
        out[name]["python_kernel"] += slow
        out[name]["cpp_recorder"] += recorded
    for name, n in _python_kernels.items():
        out[name]["python_kernel"] += n
    for name, n in fused.recorded_counts().items():
        out[name]["python_recorder"] += n
    return dict(sorted(out.items()))


def leaving_fast_path(counts: dict | None = None) -> dict:
    """{name: "python_kernel" / "python_recorder" / both} for the names whose calls enter Python."""
    counts = snapshot() if counts is None else counts
    return {name: "+".join(k for k in ("python_kernel", "python_recorder") if c[k])
            for name, c in counts.items() if c["python_kernel"] or c["python_recorder"]}


def reset() -> None:
    """Zero the kernels' counts (fused.reset_stats zeroes the recorder's)."""
    _load_runtime().reset_fast_path_counts()
    _python_kernels.clear()
