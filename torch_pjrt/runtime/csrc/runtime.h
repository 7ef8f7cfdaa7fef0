// torch-pjrt runtime (DESIGN.md layer 1): the C++ half of the "pjrt" PrivateUse1 device.
//
// One translation unit per piece, built in parallel (build.py), each including only the
// torch headers it needs. This header is what they share; it includes c10 and Python.h
// only, so no unit pays for ATen's, torch's or pybind's headers through it. The units
// that talk to Python objects share bindings.h as well.
//
//   allocator.cpp   storage handles, the device allocator and its memory statistics,
//                   pinned host memory, storage growth
//   guard.cpp       device guard, streams and timing events
//   hooks.cpp       generators and the PrivateUse1 hooks
//   kernels.cpp     metadata-only kernels (empty, empty_strided, as_strided, view,
//                   _reshape_alias, resize_, set_) and the dtypes a storage may hold
//   profiler.cpp    device time per op for torch's profiler (memory: allocator.cpp)
//   fast_path.cpp   the eager fast path (FastKernel) and SDPA's backend choice
//   recorder.cpp    fused eager's recorder of fast kernels' calls (CallRecorder)
//   module.cpp      the Python module (used by torch_pjrt/*.py): a storage's JAX buffer
//                   as storage.py sees it, and the runtime's calls into Python
//   sparse.cpp      ATen's device-generic sparse COO kernels on SparsePrivateUse1
//   nested.cpp      ATen's device-generic nested tensor kernels (the transformer fast path)
//
// Everything that computes lives in Python (storage.py, the op table).
#pragma once

#include <Python.h>  // first, as Python requires

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

namespace at {
class Generator;
class Tensor;
}  // namespace at

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;

inline c10::DispatchKeySet pjrt_keys() { return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1); }

// ---- devices (guard.cpp) ----
extern int g_device_count;
extern thread_local c10::DeviceIndex g_current_device;
// `idx`, or the current device when negative; raises IndexError past the device count.
c10::DeviceIndex checked_index(c10::DeviceIndex idx);

// ---- allocator.cpp ----
struct DeviceMemory {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> bytes_allocated_total{0};
  std::atomic<int64_t> bytes_freed_total{0};
  std::atomic<int64_t> oom{0};
  int64_t limit = INT64_MAX;
};
extern std::array<DeviceMemory, kMaxDevices> g_memory;

// The DataPtr context of a pjrt storage: owns the storage's JAX buffer.
struct Holder {
  PyObject* buffer = nullptr;       // jax.Array, or nullptr while uninitialised
  std::vector<int64_t> shape;       // the buffer's shape and dtype, kept here so the
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // hot read path stays in C++
  char* handle = nullptr;
  size_t nbytes = 0;
  c10::DeviceIndex device = 0;
  // its buffer is an append's exact result (ops/growth.py): appended to again, the storage grows
  // (padded); a new buffer clears it
  bool appended = false;
  // made (empty) or grown (resize_) in deterministic mode with fill_uninitialized_memory: its
  // memory past its buffer (all of it, without one) reads as NaN / the largest integer, as CPU
  // fills it then; decided here, as the buffer is made lazily, maybe after the mode is off
  bool deterministic_fill = false;
};

c10::Allocator* device_allocator();
// A DataPtr of `nbytes` on `device` whose context is a fresh Holder without a buffer.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
// The storage's Holder, or nullptr when the pjrt allocator did not allocate it.
Holder* holder_of(const c10::Storage& storage);
// The pjrt storage that `slice` (UntypedStorage's [start:end] of a pjrt storage, maybe of a
// slice) is a byte range of, and where that range starts (`offset`); an empty Storage when
// `slice` is no such slice.
c10::Storage sliced_storage(const c10::Storage& slice, size_t& offset);
// Grow a storage (resize_, set_): a larger handle range; the buffer is padded lazily.
void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes);
c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* p);

// ---- hooks.cpp ----
const at::Generator& default_generator(c10::DeviceIndex idx);
uint64_t next_seed(at::Generator generator);  // 64 random bits from a pjrt generator
void register_hooks();

// ---- profiler.cpp ----
void register_profiler_stubs();  // device time per op for torch's profiler

// ---- kernels.cpp ----
void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes);

// ---- module.cpp: calls into Python, which waits and raises there ----
// Wait for the device's work (storage.synchronize); raises what it raises (index_checks.py).
void synchronize_device(c10::DeviceIndex idx);
// Raise Python's error for a dtype no storage can hold (dtypes.raise_unsupported_dtype);
// returns only before Python has set a handler.
void raise_unsupported_dtype(c10::ScalarType dtype, c10::DeviceIndex device);

}  // namespace torch_pjrt
