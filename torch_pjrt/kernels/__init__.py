"""Custom kernels on pjrt: JAX functions and Pallas kernels as PyTorch custom ops.

See docs/kernels.md. `@kernel("ns::name", reference=...)` registers a function; the
shipped kernels (rms_norm, flash_attention, softmax_cross_entropy, grouped_mm) are built
the same way.
"""
from __future__ import annotations

from . import autotune
from .op import Kernel, KernelError, kernel
from .platforms import interpret, pallas_call, target

__all__ = ["kernel", "Kernel", "KernelError", "pallas_call", "interpret", "target", "autotune"]
