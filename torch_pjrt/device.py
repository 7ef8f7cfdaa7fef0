"""`torch.pjrt`: the device module, mirroring `torch.cuda` where it makes sense."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .runtime import index_checks as bounds, platform, storage
from .runtime.build import load as _load_runtime

_rt = _load_runtime()
_PJRT_DEVICE_TYPE = 20  # c10::DeviceType::PrivateUse1


def _index(device=None) -> int:
    """Device index from an int, "pjrt:i", torch.device or None (the current device)."""
    if device is None:
        return _rt.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "pjrt":
        raise ValueError(f"Expected a pjrt device, but got: {device}")
    return _rt.current_device() if device.index is None else device.index


# torch.utils.checkpoint saves and restores a device's RNG state only when this is set.
_initialized = True


# -- devices ---------------------------------------------------------------------------
def is_available() -> bool:
    return _rt.device_count() > 0


def is_initialized() -> bool:
    return True


def init() -> None:
    """Devices are set up at import; kept for torch.cuda parity."""


def _is_in_bad_fork() -> bool:
    return False


def _is_compiled() -> bool:
    return True


def device_count() -> int:
    return _rt.device_count()


def current_device() -> int:
    return _rt.current_device()


def set_device(device) -> None:
    _rt.set_device(_index(device))


class device:
    """Context manager that changes the current pjrt device (like torch.cuda.device)."""

    def __init__(self, device):
        self.index = -1 if device is None else _index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = _rt.current_device()
        if self.index >= 0:
            _rt.set_device(self.index)

    def __exit__(self, *exc):
        if self.index >= 0:
            _rt.set_device(self.previous)
        return False


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    kind: str
    index: int
    total_memory: int  # bytes the allocator lets the device hold (memory_summary's capacity)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_properties(device=None) -> DeviceProperties:
    i = _index(device)
    d = platform.device(i)
    kind = getattr(d, "device_kind", d.platform)
    # the allocator's capacity: JAX's bytes_limit where the platform reports one, else (the
    # CPU platform) the host memory the runtime budgets for, never None, so that the usual
    # `props.total_memory / 2**30` works as on CUDA
    return DeviceProperties(name=f"{kind} ({d.platform}:{d.id})", platform=d.platform, kind=kind, index=i,
                            total_memory=int(memory_stats(i)["capacity_bytes"]))


def get_device_capability(device=None) -> tuple[int, int]:
    return (0, 0)


def synchronize(device=None) -> None:
    """Wait for all work queued on the device (the current one by default)."""
    storage.synchronize(_index(device))
    bounds.raise_pending()


# -- streams and events ----------------------------------------------------------------
class Stream(torch.Stream):
    """A pjrt stream. PJRT orders work per device, so streams of one device share a queue."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=torch.device("pjrt", _index(device)), priority=priority, **kwargs)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """A torch.Event on the current pjrt device; record() waits for queued work, so elapsed_time is exact."""
    return torch.Event(device=torch.device("pjrt", _rt.current_device()), enable_timing=enable_timing,
                       blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("pjrt", _index(device)))


def default_stream(device=None) -> torch.Stream:
    return torch.Stream(stream_id=0, device_index=_index(device), device_type=_PJRT_DEVICE_TYPE)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    """Make `s` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    previous = current_stream(s.device)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


# -- random ----------------------------------------------------------------------------
def _generator(device=None) -> torch.Generator:
    return _rt.default_generator(_index(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> int:
    return _generator().seed()


def seed_all() -> None:
    s = seed()
    for i in range(device_count()):
        _generator(i).manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="pjrt") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device="pjrt") -> None:
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# default_generators is filled in by torch_pjrt.__init__ once devices exist


# -- memory ----------------------------------------------------------------------------
def memory_stats(device=None) -> dict:
    """Counters in torch.cuda.memory_stats' naming (allocated bytes are live storages' bytes)."""
    stats = dict(_rt.memory_stats(_index(device)))
    stats["reserved_bytes.all.current"] = stats["allocated_bytes.all.current"]
    stats["reserved_bytes.all.peak"] = stats["allocated_bytes.all.peak"]
    return stats


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _rt.reset_peak(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """PJRT frees a buffer as soon as its last storage dies; this also drops cached executables' temporaries."""
    import gc

    gc.collect()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    i = _index(device)
    s = memory_stats(i)
    mib = 1024 * 1024
    lines = [
        f"pjrt:{i} memory summary ({get_device_name(i)})",
        f"  allocated: {s['allocated_bytes.all.current'] / mib:.2f} MiB (peak {s['allocated_bytes.all.peak'] / mib:.2f} MiB)",
        f"  live storages: {s['allocation.all.current']}, allocations: {s['allocation.all.allocated']}, "
        f"frees: {s['allocation.all.freed']}",
        f"  capacity: {s['capacity_bytes'] / mib:.0f} MiB, out-of-memory errors: {s['num_ooms']}",
    ]
    return "\n".join(lines)


# -- autocast --------------------------------------------------------------------------
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# -- legacy typed storages ---------------------------------------------------------------
class _PjrtLegacyStorage(torch.storage._LegacyStorage):
    """`torch.pjrt.FloatStorage` and its kin, as `torch.cuda.FloatStorage`: `Tensor.storage_type()`
    looks them up in the device module, and torch reads their device from their module's last name
    (`torch.pjrt`)."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        raise RuntimeError("from_buffer: Not available for pjrt storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for pjrt storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for pjrt storage")


def _legacy_storage_class(name: str, dtype: torch.dtype) -> type:
    def dtype_(cls):
        torch.storage._warn_typed_storage_removal()
        return dtype

    body = {"dtype": torch._utils.classproperty(dtype_),
            "_dtype": torch._utils.classproperty(lambda cls: dtype), "__module__": "torch.pjrt"}
    return type(name, (_PjrtLegacyStorage,), body)


for _dtype, _name in torch.storage._dtype_to_storage_type_map().items():
    if hasattr(torch.cuda, _name):  # CUDA's set: no quantized dtypes (pjrt refuses them too)
        globals()[_name] = _legacy_storage_class(_name, _dtype)
