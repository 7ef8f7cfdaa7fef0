"""Kernels that move data between devices or out of JAX: copies, .to(), clone, .item().

They are not lowerings (a lowering is a pure function inside one device) and are
registered on PrivateUse1 beside the table's kernels.
"""
from __future__ import annotations

import functools
import weakref

import jax
import numpy as np
import torch

from ..runtime import fused, index_checks as bounds, platform, storage
from ..runtime.build import load as _load_runtime
from ..runtime.fused import Recordable, keyed
from ..dtypes import to_jax
from . import errors

aten = torch.ops.aten


def _is_pjrt(t: torch.Tensor) -> bool:
    return t.device.type == "pjrt"


def _may_share(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Cheap test (copy_ is hot): can dst's elements overlap each other or src's?"""
    if not dst.is_contiguous() and errors.may_overlap_itself(dst):
        return True
    return src.device == dst.device and src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr()


def _check_broadcast(dst: torch.Tensor, src: torch.Tensor) -> None:
    """CPU's errors (its TensorIterator's, dst the output) for a src that does not broadcast to dst."""
    shape = torch._C._infer_size(dst.shape, src.shape)  # "The size of tensor a (2) must match ..."
    if shape != dst.shape:
        raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(shape)}")


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """dst.copy_(src) where either side is on pjrt (host<->pjrt, pjrt:i<->pjrt:j)."""
    if src.shape != dst.shape:
        _check_broadcast(dst, src)
    if _is_pjrt(dst) and _may_share(dst, src) and errors.may_overlap(aten.copy_.default, dst, (src,), {}):
        # torch's copy_ hands other devices to _copy_from before its TensorIterator's overlap
        # checks: an expanded dst or one sharing part of src raises here, as on CPU
        errors.check_writes(aten.copy_.default, (dst, src), {}, [dst])
    if _is_pjrt(src) and _is_pjrt(dst):
        if src.get_device() != dst.get_device():
            value = jax.device_put(storage.read(src), platform.device(dst.get_device()))
        else:
            value = storage.read_deferred(src)
        storage.write(dst, value)
    elif _is_pjrt(dst):
        if src.device.type != "cpu":
            raise RuntimeError(f"copy_: cannot copy from {src.device} to {dst.device}; copy through cpu")
        storage.write(dst, storage.upload(src, dst.get_device(), non_blocking))
    else:
        if dst.device.type != "cpu":
            raise RuntimeError(f"copy_: cannot copy from {src.device} to {dst.device}; copy through cpu")
        dst.copy_(storage.download(src))
    return dst


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    dst.resize_(src.shape)
    return copy_from(src, dst)


def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """Tensor.to(): a new tensor, on another device and/or with another dtype."""
    dtype = dtype or self.dtype
    device = torch.device(device) if device is not None else self.device
    if device.type == "pjrt":
        index = device.index if device.index is not None else torch.pjrt.current_device()
        perm = storage.layout_of(self, memory_format)  # torch keeps a dense layout (channels_last) by default
        uploaded_in_layout = False
        if _is_pjrt(self):
            if index != self.get_device():
                value = jax.device_put(storage.read(self), platform.device(index))
            else:
                value = storage.read_deferred(self)
        else:  # host -> pjrt (the dispatcher routes by the target device too), in the layout's order if any
            host = self.cpu()
            uploaded_in_layout = perm is not None
            value = storage.upload(host.permute(perm).contiguous() if uploaded_in_layout else host, index, non_blocking)
        if value.dtype != to_jax(dtype):
            value = _convert(value, to_jax(dtype))
        if uploaded_in_layout:  # the upload already is the storage's data
            return storage.wrap(storage.Permuted(value, perm), index)
        return storage.wrap_laid_out(value, index, perm)
    host = storage.download(self)
    perm = storage.layout_of(self, memory_format)
    if perm is not None:  # keep the dense layout (channels_last) on the host too, as CUDA does
        host = host.permute(perm).contiguous().permute(storage.inverse_permutation(perm))
    host = host.to(dtype=dtype)
    if pin_memory:
        host = host.pin_memory()
    return host.to(device) if device.type != "cpu" else host


def device_facts(index: int, dtype: torch.dtype) -> tuple[bool, bool]:
    """What the C++ upload (fast_path.cpp's ToCopyKernel) asks once per device and dtype:
    (whether the device's client aliases host memory, whether the device holds the dtype)."""
    try:
        platform.check_dtype(to_jax(dtype), index)
    except TypeError:
        return platform.device(index).platform == "cpu", False
    return platform.device(index).platform == "cpu", True


def _convert(value, dtype):
    return _converter(dtype)(value)


@functools.lru_cache(None)
@keyed
def _converter(dtype):
    from ..ops.shape import convert  # the op table's conversion (its `_to_copy` lowering's)

    return Recordable(jax.jit(lambda v: convert(v, dtype)), name="_to_copy")


def clone(self: torch.Tensor, memory_format=None) -> torch.Tensor:
    """Buffers are immutable, so a clone shares its source's buffer until one is written;
    it keeps a dense layout (channels_last) unless memory_format says otherwise, as torch does.
    (The C++ kernel serves a row-major copy itself: fast_path.cpp's CloneKernel; this is its
    Python path, called with positional arguments.)"""
    buf = storage.whole_buffer(self)
    if buf is not None and memory_format in (None, torch.preserve_format, torch.contiguous_format):
        return storage.wrap(buf, self.get_device())
    return storage.wrap_laid_out(storage.read_deferred(self), self.get_device(), storage.layout_of(self, memory_format))


# A scalar read (.item(), int(t[0, 0])) of a storage up to this many elements copies the whole
# storage to the host and reads the element there: no executable for the view (a decode step's
# token, a loss). Larger storages read the element's view on the device.
WHOLE_STORAGE_READ = 4096
# ... unless the same concrete buffer had an element read on the device just before: a loop over
# a tensor's elements (`all(t)`, `for x in t`, test_linspace's all() over 10^6 comparisons) then
# copies the storage to the host once (jax keeps that copy with the buffer, and frees it with
# the buffer) and reads every later element there: 276 us -> 11 us per element here. Up to
# 2^24 elements, so that two reads of a huge tensor do not copy all of it.
REPEATED_STORAGE_READ = 1 << 24
_last_device_read = None  # weakref.ref to the buffer of the latest element read on the device


def _read_before(buffer) -> bool:
    """Whether `buffer` (concrete) had the previous element read on the device; else remember it."""
    global _last_device_read
    if type(buffer) is not storage._ARRAY or buffer.size > REPEATED_STORAGE_READ:
        return False
    if _last_device_read is not None and _last_device_read() is buffer:
        return True
    _last_device_read = weakref.ref(buffer)
    return False


@platform.raises_torch_errors
def local_scalar_dense(self: torch.Tensor):
    buffer = _load_runtime().buffer(self)
    if type(buffer) in (storage._ARRAY, fused.Pending) and buffer.dtype == to_jax(self.dtype) and \
            (buffer.size <= WHOLE_STORAGE_READ or _read_before(buffer)):
        bounds.raise_pending()  # a host sync, as download's
        return np.asarray(fused.concrete(buffer)).reshape(-1)[self.storage_offset()].item()
    value = storage.read_deferred(self)  # a view's read joins the region computing its storage: one run
    bounds.raise_pending()
    return fused.concrete(value).item()


def kernels() -> dict:
    return {
        aten._copy_from.default: copy_from,
        aten._copy_from_and_resize.default: copy_from_and_resize,
        aten._to_copy.default: to_copy,
        aten.clone.default: clone,
        aten._local_scalar_dense.default: local_scalar_dense,
    }


def keep_math_bits() -> None:
    """Let pjrt copies see torch's lazy conjugate/negative bits instead of resolved clones.

    `_copy_from`'s schema does not mark `dst` as written, so torch's Conjugate and
    Negative fallbacks would hand our kernel a resolved clone of a conj()/neg view and the
    copy, and every in-place op through such a view, would be lost. storage.read and
    storage.write apply the bits themselves, so these keys can pass the call through."""
    global _math_bits_library
    _math_bits_library = torch.library.Library("aten", "IMPL")
    for key in ("Conjugate", "Negative"):
        for op in ("_copy_from", "_copy_from_and_resize"):
            _math_bits_library.impl(op, torch.library.fallthrough_kernel, key)


def refuse_dlpack(original):
    """DLPack hands out raw device pointers; pjrt data pointers are handles, so refuse clearly."""

    def to_dlpack(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "pjrt":
            raise BufferError(
                f"pjrt tensors cannot be exported through DLPack (device {tensor.device}); "
                f"use tensor.cpu() for host interop"
            )
        return original(tensor, *args, **kwargs)

    return to_dlpack


def legacy_serialization_through_cpu() -> None:
    """torch.save's legacy (non-zipfile) format writes each storage with the C++
    `UntypedStorage._write_file` and torch.load reads it back with `_set_from_file`; for a
    non-CPU storage both copy through a `from_blob` tensor over its data pointer. A pjrt
    data pointer is a handle, not device memory, so that tensor has no pjrt storage behind
    it ("not allocated by the pjrt allocator"). Route pjrt storages through a host
    storage instead, as the zipfile format does (`storage.cpu()` to save, a storage copy
    to load): same bytes in the file, and loading restores them to pjrt (or map_location)
    with views still sharing their storage, as on CUDA."""
    write_file, set_from_file = torch.UntypedStorage._write_file, torch.UntypedStorage._set_from_file
    if getattr(write_file, "_pjrt_wrapped", False):
        return

    def _write_file(self, f, is_real_file, save_size, element_size):
        return write_file(self.cpu() if self.device.type == "pjrt" else self, f, is_real_file, save_size, element_size)

    def _set_from_file(self, f, offset, is_real_file, element_size):
        if self.device.type != "pjrt":
            return set_from_file(self, f, offset, is_real_file, element_size)
        host = torch.UntypedStorage(self.nbytes())
        set_from_file(host, f, offset, is_real_file, element_size)
        self.copy_(host)
        return self

    _write_file._pjrt_wrapped = True
    torch.UntypedStorage._write_file = _write_file
    torch.UntypedStorage._set_from_file = _set_from_file


def print_through_host() -> None:
    """Print a pjrt tensor from one host copy, as torch prints XLA, lazy and MTIA tensors.

    Formatting a tensor runs a dozen ops on it (slices for summaries, masked_select of the
    finite values, abs, min, max, ...), each a new executable per shape on this device: the
    first repr of an int8 [1, 512] tensor compiled for a minute. torch copies tensors of
    those devices to the CPU before formatting them, by a device list in
    `torch._tensor_str._str_intern` with no registration hook; so the formatter of the
    tensor's contents (`_tensor_str`) gets the host copy here. The header (device, dtype,
    requires_grad, grad_fn) is still built from the pjrt tensor."""
    import torch._tensor_str as tensor_str

    format_contents = getattr(tensor_str, "_tensor_str", None)
    if format_contents is None or getattr(format_contents, "_pjrt_wrapped", False):
        return  # another torch: printing stays correct, each op runs on the device

    def _tensor_str(self, indent):
        if self.device.type == "pjrt":
            self = self.cpu()
        return format_contents(self, indent)

    _tensor_str._pjrt_wrapped = True
    tensor_str._tensor_str = _tensor_str
