"""Custom kernels on pjrt: JAX functions and Pallas kernels as PyTorch custom ops.

See docs/kernels.md. `@kernel("ns::name", reference=...)` registers a function; the
shipped kernels (rms_norm, flash_attention, softmax_cross_entropy, grouped_mm) are built
the same way and load on first access, so `import torch_pjrt` does not define them.
"""
from __future__ import annotations

import importlib

from . import autotune
from .op import Kernel, KernelError, kernel
from .platforms import interpret, pallas_call, target

__all__ = ["kernel", "Kernel", "KernelError", "pallas_call", "interpret", "target", "autotune", "check",
           "rms_norm", "flash_attention", "softmax_cross_entropy", "grouped_mm"]

_SHIPPED = {
    "rms_norm": ("norm", "rms_norm"),
    "flash_attention": ("attention", "flash_attention"),
    "softmax_cross_entropy": ("cross_entropy", "softmax_cross_entropy"),
    "grouped_mm": ("moe", "grouped_mm"),
    "check": ("testing", "check"),
}


def __getattr__(name: str):
    if name in _SHIPPED:
        module, attr = _SHIPPED[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
