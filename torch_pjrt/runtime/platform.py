"""Layer 2: which PJRT platform and devices back "pjrt:0", "pjrt:1", ...

TORCH_PJRT_PLATFORM picks the platform (cpu, gpu/cuda, rocm, tpu, neuron, ...; default:
JAX's default backend). TORCH_PJRT_CPU_DEVICES=N gives N virtual CPU devices. JAX is
configured here once, before its backends start: x64 on (int64 and float64 are real), and
XLA's excess precision off (`--xla_allow_excess_precision=false`, unless XLA_FLAGS names it):
with it, XLA drops the rounding to bfloat16/float16 between fused ops, so a fused eager region
computed `a + b` from a freshly made bfloat16 `a` before its rounding, while `a` itself holds
the rounded value (CPU and op-by-op round each op's result).
"""
from __future__ import annotations

import functools
import os
import re

import jax
import numpy as np
import torch

jax.config.update("jax_enable_x64", True)
if "xla_allow_excess_precision" not in os.environ.get("XLA_FLAGS", ""):  # read when XLA first compiles
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_allow_excess_precision=false").strip()
if os.environ.get("TORCH_PJRT_CPU_ASYNC_DISPATCH", "1") == "0":
    # XLA:CPU runs a single-device program on the calling thread, as torch CPU runs its kernels: no
    # hand-off to XLA's pool (~10 us a run), but no overlap of the host's work with XLA's (docs/eager.md)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
if os.environ.get("TORCH_PJRT_CPU_DEVICES"):
    jax.config.update("jax_num_cpu_devices", int(os.environ["TORCH_PJRT_CPU_DEVICES"]))
if os.environ.get("TORCH_PJRT_PLATFORM", "").lower() == "cpu" and not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")  # don't start (and preallocate) an unused GPU

from .multiprocess import initialize_from_environment  # noqa: E402

initialize_from_environment()  # a torchrun worker joins JAX's multi-process runtime before its backends start


@functools.lru_cache(None)
def devices() -> tuple:
    """The JAX devices behind pjrt:0..N-1."""
    name = os.environ.get("TORCH_PJRT_PLATFORM", "").lower() or None
    if name in ("gpu", "cuda", "rocm"):
        name = "gpu"
    try:
        found = jax.local_devices(backend=name)  # in a multi-process job jax.devices() also lists other processes' devices
    except RuntimeError as e:
        raise RuntimeError(
            f"pjrt: platform '{name}' (TORCH_PJRT_PLATFORM) is not available to JAX: {e}. "
            f"Install its PJRT plugin (for example jax[cuda13]) or choose another platform."
        ) from None
    return tuple(found)


@functools.lru_cache(None)
def device(index: int):
    return devices()[index]


def name() -> str:
    return devices()[0].platform


def memory_capacity(index: int) -> int:
    """Bytes the device can hold: the runtime refuses larger allocations up front."""
    stats = _jax_memory_stats(index)
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    # host platform: the machine's physical memory, shared by its virtual devices
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.9)


def _jax_memory_stats(index: int) -> dict | None:
    try:
        return device(index).memory_stats()
    except Exception:  # not every PJRT plugin reports memory
        return None


# XLA's own (RESOURCE_EXHAUSTED), and as a later executable reports an input that failed so (INTERNAL: ...)
_XLA_OUT_OF_MEMORY = re.compile(r"^RESOURCE_EXHAUSTED|Out of memory (allocating|while trying)")


def torch_error(error: BaseException) -> BaseException:
    """What torch raises for `error`, a failure of XLA's: its RESOURCE_EXHAUSTED (an executable's
    buffers or temporaries do not fit; the allocator's own check sees only tensors) is
    torch.OutOfMemoryError, CUDA's type, with XLA's message and `error` as its cause; else `error`.
    Where the platform runs programs asynchronously (XLA:CPU unless TORCH_PJRT_CPU_ASYNC_DISPATCH=0)
    it may come at the host read of the result, not the call."""
    if type(error).__name__ not in ("JaxRuntimeError", "XlaRuntimeError") or not _XLA_OUT_OF_MEMORY.search(str(error)):
        return error
    oom = torch.OutOfMemoryError(
        f"pjrt: out of memory on {name()}: XLA could not allocate what an executable needs ({error}). "
        "Free tensors (del, torch.pjrt.empty_cache()) or use smaller batches or shapes.")
    oom.__cause__ = error
    return oom


def raises_torch_errors(fn):
    """`fn`, raising torch's exception where XLA's names the device's failure (`torch_error`):
    for the places where results are run or read (host reads, synchronize, compiled calls)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (the failure path only)
            # no local holds the exception: a frame <-> traceback cycle would keep the frames alive
            # (index_checks' raise in torch's printing, under a guard that disables functorch)
            if torch_error(e) is e:
                raise
            raise torch_error(e) from e
    return wrapper


@raises_torch_errors
def host_value(array) -> np.ndarray:
    """`array`'s value on the host, C-contiguous (a host sync)."""
    return np.ascontiguousarray(array)


# Platforms whose XLA backend lacks a dtype (TPUs have no 64-bit floats).
_MISSING_DTYPES = {"tpu": {"float64", "complex128"}}


def check_dtype(dtype, index: int) -> None:
    """TypeError naming the dtype and platform when the device cannot hold `dtype`."""
    plat = device(index).platform
    if str(dtype) in _MISSING_DTYPES.get(plat, ()):
        raise TypeError(f"pjrt: dtype {dtype} is not supported on platform '{plat}' (pjrt:{index}); "
                        f"use a 32-bit type, e.g. tensor.float()")


def put(host, index: int):
    """A host numpy array as a committed array on pjrt:index: jax.device_put's work for one array
    on one device, without its per-call Python (pytree, sharding and layout handling): 30 us a
    call here against 4. JAX's internal batched_device_put, which device_put ends in; where a JAX
    version lacks it or changed it, jax.device_put."""
    target = device(index)
    if _batched_device_put is not None:
        try:
            return _batched_device_put(_aval(host.shape, host.dtype), _sharding(target), [host], [target])
        except Exception:  # noqa: BLE001  (another JAX's internals, or a real error: the public call says which)
            pass
    return jax.device_put(host, target)


try:  # jax._src is JAX's internal API: used where present, checked by tests/test_storage_views.py
    from jax._src.interpreters.pxla import batched_device_put as _batched_device_put
    from jax._src.core import ShapedArray as _ShapedArray
except ImportError:
    _batched_device_put = None


@functools.lru_cache(1024)
def _aval(shape: tuple, dtype):
    return _ShapedArray(shape, dtype)


@functools.lru_cache(None)
def _sharding(target):
    return jax.sharding.SingleDeviceSharding(target)
