"""Which platform a kernel is being traced for, and Pallas calls that follow it.

A kernel's JAX function is traced for one platform at a time: the pjrt platform for
pjrt tensors (eager and compiled), "cpu" for host tensors (opcheck's CPU samples, the
reference checks). `target()` says which while tracing, so `pallas_call` can pick
interpret mode on the CPU (no Pallas backend there) and native lowering on GPU and TPU
without the kernel author passing a flag.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable

# Platform names as JAX reports them (jax.Device.platform), with the aliases users type.
_ALIASES = {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu", "neuron": "neuron"}
# Platforms where Pallas compiles natively; elsewhere it runs in interpret mode.
PALLAS_NATIVE = frozenset({"gpu", "tpu"})

_target: contextvars.ContextVar[str | None] = contextvars.ContextVar("torch_pjrt_kernel_platform", default=None)


def canonical(name: str) -> str:
    """'cuda' -> 'gpu' etc.; unknown names (a new PJRT plugin) pass through lowercased."""
    name = name.lower()
    return _ALIASES.get(name, name)


def pjrt_platform() -> str:
    """The platform behind the pjrt device (TORCH_PJRT_PLATFORM or JAX's default)."""
    from ..runtime import platform

    return canonical(platform.name())


def target() -> str:
    """The platform the kernel now being traced runs on (the pjrt platform outside a kernel call)."""
    return _target.get() or pjrt_platform()


@contextlib.contextmanager
def tracing_for(platform_name: str):
    token = _target.set(canonical(platform_name))
    try:
        yield
    finally:
        _target.reset(token)


def interpret() -> bool:
    """True where Pallas kernels must run in interpret mode (no native Pallas lowering)."""
    return target() not in PALLAS_NATIVE


def pallas_call(kernel: Callable, out_shape: Any, **kwargs) -> Callable:
    """`jax.experimental.pallas.pallas_call` with `interpret=` chosen for the target platform,
    and on GPUs the Triton backend (the kernel language these kernels are written in: grids of
    blocks, `pl.ds` loads, loops; jax's default GPU backend is Mosaic GPU, which lowers none of
    them: every kernel failed on the first H200 session).

    Pass `interpret=` or `compiler_params=` explicitly to override (for example to debug a GPU
    kernel on CPU)."""
    from jax.experimental import pallas as pl

    kwargs.setdefault("interpret", interpret())
    if target() == "gpu" and not kwargs["interpret"] and "compiler_params" not in kwargs:
        from jax.experimental.pallas import triton as pltriton

        kwargs["compiler_params"] = pltriton.CompilerParams()
    return pl.pallas_call(kernel, out_shape=out_shape, **kwargs)


@functools.lru_cache(None)
def host_device():
    """The JAX CPU device host tensors are computed on."""
    import jax

    return jax.devices("cpu")[0]
