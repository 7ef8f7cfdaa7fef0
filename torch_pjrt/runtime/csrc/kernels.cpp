// Metadata-only kernels (empty, empty_strided, as_strided, view, _reshape_alias, unfold,
// resize_, set_): no data moves, so they never touch Python, except that empty of a dtype JAX
// cannot hold raises Python's error (dtypes.raise_unsupported_dtype).
#include "runtime.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_pjrt {

namespace {

// Dtypes a storage can hold: those with a JAX dtype (set_supported_dtypes). An empty tensor
// of another dtype (bits8, uint4, complex32, ...) would only fail when first read, so empty
// refuses it at creation with Python's error (raise_unsupported_dtype).
std::array<bool, 256> g_dtype_supported{};
bool g_dtype_table_set = false;

c10::ScalarType checked_dtype(std::optional<c10::ScalarType> dtype, std::optional<c10::Device> device) {
  c10::ScalarType type = c10::dtype_or_default(dtype);
  if (C10_LIKELY(!g_dtype_table_set || g_dtype_supported[static_cast<uint8_t>(type)])) return type;
  c10::DeviceIndex index = device && device->has_index() ? device->index() : g_current_device;
  raise_unsupported_dtype(type, index);
  TORCH_CHECK(false, "pjrt: dtype ", type, " is not supported on pjrt:", int(index));
  return type;  // not reached
}

// CPU's empty and resize_ fill fresh memory with NaN / the largest integer in deterministic mode
// with fill_uninitialized_memory. The storage's buffer is made lazily, maybe after the mode is
// off, so its Holder remembers the decision, taken here (one look at the flags per call).
void note_deterministic_fill(const at::Tensor& t) {
  auto& context = at::globalContext();
  if (C10_UNLIKELY(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory())) {
    if (Holder* h = holder_of(t.storage())) h->deterministic_fill = true;
  }
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  at::Tensor t = at::detail::empty_generic(size, device_allocator(), pjrt_keys(), checked_dtype(dtype, device), memory_format);
  note_deterministic_fill(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  at::Tensor t = at::detail::empty_strided_generic(size, stride, device_allocator(), pjrt_keys(), checked_dtype(dtype, device));
  note_deterministic_fill(t);
  return t;
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// unfold is a view with only CPU/CUDA kernels (no composite one): without this it ran as a
// decomposition into a copy, so writes through it were lost.
at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

// Make the storage large enough for the tensor's (new) geometry.
void fit_storage(const at::Tensor& self) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->numel() == 0) return;
  int64_t extent = 1;
  for (int64_t i = 0; i < impl->dim(); i++) extent += (impl->sizes()[i] - 1) * impl->strides()[i];
  size_t need = size_t(impl->storage_offset() + extent) * self.itemsize();
  if (need > impl->storage().nbytes()) resize_storage_bytes(impl->storage(), need);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  size_t before = impl->storage().nbytes();
  fit_storage(self);
  if (impl->storage().nbytes() > before) note_deterministic_fill(self);  // the part it adds
  return self;
}

// The bytes a view of (offset, size, stride) reaches in its storage, with elements of `itemsize`.
size_t bytes_reached(int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride, size_t itemsize) {
  int64_t extent = 1;
  for (size_t i = 0; i < size.size(); i++) {
    if (size[i] == 0) return 0;
    extent += (size[i] - 1) * (stride.empty() ? c10::multiply_integers(size.slice(i + 1)) : stride[i]);
  }
  return size_t(offset + extent) * itemsize;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage storage, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  size_t sliced_at = 0;
  if (c10::Storage sliced = sliced_storage(storage, sliced_at)) {
    // a slice of an untyped pjrt storage (its data pointer is no storage of ours): the tensor
    // becomes the same view of the storage it slices, so reads and writes reach those bytes
    size_t itemsize = self.itemsize();
    TORCH_CHECK(bytes_reached(offset, size, stride, itemsize) <= storage.nbytes(),
                "Trying to resize storage that is not resizable");
    TORCH_CHECK(sliced_at % itemsize == 0, "pjrt: a ", self.scalar_type(), " tensor over a storage slice that starts ",
                sliced_at, " bytes into its storage, within an element, is not supported");
    storage = std::move(sliced);
    offset += int64_t(sliced_at / itemsize);
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(storage));
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  fit_storage(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage storage) {
  int64_t n = int64_t(storage.nbytes() / self.itemsize());
  return set_storage_offset(self, std::move(storage), 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_storage_offset(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  auto dp = allocate_on(self.device().index(), 0);
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(dp), device_allocator(), true);
  return set_storage_offset(self, std::move(storage), 0, {0}, {});
}

// Module._apply swaps parameters in place (keeping tied weights tied) only when the
// two tensors have compatible TensorImpls; pjrt tensors are plain dense TensorImpls.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    auto type = t.device().type();
    return t.layout() == c10::kStrided && !t.is_nested() &&
           (type == kPjrt || type == c10::DeviceType::CPU || type == c10::DeviceType::Meta);
  };
  return (dense(self) && dense(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes) {
  g_dtype_supported.fill(false);
  for (auto type : dtypes) g_dtype_supported[static_cast<uint8_t>(type)] = true;
  g_dtype_table_set = true;
}

}  // namespace torch_pjrt
