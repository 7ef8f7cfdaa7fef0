// torch-pjrt runtime (DESIGN.md layer 1): the C++ half of the "pjrt" PrivateUse1 device.
//
//  * Allocator: a storage's data pointer is a unique handle inside a reserved PROT_NONE
//    range (never dereferenced, so a stray read faults instead of corrupting memory);
//    the DataPtr's context (Holder) owns the storage's JAX buffer (a Python object).
//  * Device guard with N devices, streams and timing events; PrivateUse1 hooks with
//    default and new generators and a pinned host-memory allocator.
//  * Memory statistics and a capacity limit per device (an allocation past it raises
//    torch.OutOfMemoryError, like CUDA's caching allocator).
//  * Metadata-only kernels (empty, empty_strided, as_strided, view, _reshape_alias,
//    resize_, set_): no data moves, so they never touch Python (empty of a dtype JAX
//    cannot hold raises Python's error, dtypes.raise_unsupported_dtype).
// Everything that computes lives in Python (storage.py, the op table).
#include <torch/extension.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>
#include <torch/version.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;

static int g_device_count = 0;
static thread_local c10::DeviceIndex g_current_device = 0;
static PyObject* g_synchronize = nullptr;  // Python callable(device_index)

static c10::DeviceIndex checked_index(c10::DeviceIndex idx) {
  if (idx < 0) idx = g_current_device;
  TORCH_CHECK_INDEX(idx < g_device_count, "pjrt: invalid device index ", int(idx),
                    "; this process has ", g_device_count, " pjrt device(s)");
  return idx;
}

// ---------------------------------------------------------------------------
// Memory statistics, per device
// ---------------------------------------------------------------------------
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
static std::array<DeviceMemory, kMaxDevices> g_memory;

// ---------------------------------------------------------------------------
// Handle arena: unique, non-overlapping addresses for live storages, so PyTorch's
// overlap checks stay right, but any dereference faults.
// ---------------------------------------------------------------------------
class HandleArena {
 public:
  char* take(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!base_) {
      void* p = mmap(nullptr, kCapacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "pjrt: cannot reserve address space for storage handles");
      base_ = static_cast<char*>(p);
    }
    size_t r = size_class(n);
    auto& free = free_[r];
    if (!free.empty()) {
      char* h = free.back();
      free.pop_back();
      return h;
    }
    TORCH_CHECK_WITH(OutOfMemoryError, top_ + r <= kCapacity,
                     "pjrt: out of storage handle space allocating ", n, " bytes");
    char* h = base_ + top_;
    top_ += r;
    return h;
  }
  void give_back(char* h, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size_class(n)].push_back(h);
  }

 private:
  static constexpr size_t kCapacity = size_t(1) << 46;  // 64 TiB of addresses, no memory
  static size_t size_class(size_t n) {
    size_t r = 64;
    while (r < n) r <<= 1;
    return r;
  }
  char* base_ = nullptr;
  size_t top_ = 0;
  std::map<size_t, std::vector<char*>> free_;
  std::mutex mu_;
};
static HandleArena g_arena;

// The DataPtr context of a pjrt storage: owns the storage's JAX buffer.
struct Holder {
  PyObject* buffer = nullptr;       // jax.Array, or nullptr while uninitialised
  std::vector<int64_t> shape;       // the buffer's shape and dtype, kept here so the
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // hot read path stays in C++
  char* handle = nullptr;
  size_t nbytes = 0;
  c10::DeviceIndex device = 0;
};

static void release_holder(void* ctx) {
  auto* h = static_cast<Holder*>(ctx);
  if (h->buffer && Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    Py_DECREF(h->buffer);
  }
  auto& mem = g_memory[h->device];
  mem.allocated -= int64_t(h->nbytes);
  mem.bytes_freed_total += int64_t(h->nbytes);
  mem.frees++;
  g_arena.give_back(h->handle, h->nbytes);
  delete h;
}

// A DeviceAllocator, so torch.accelerator's memory functions work on pjrt too.
struct PjrtAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(g_current_device, nbytes); }

  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
    device = checked_index(device);
    auto& mem = g_memory[device];
    int64_t now = mem.allocated.load();
    if (int64_t(nbytes) > mem.limit - now) {
      mem.oom++;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "pjrt: out of memory on pjrt:", int(device),
                       ": tried to allocate ", format_bytes(nbytes), " with ", format_bytes(now),
                       " already allocated of ", format_bytes(mem.limit),
                       " device capacity. Free tensors (del, torch.pjrt.empty_cache()) or use smaller batches.");
    }
    auto* h = new Holder();
    h->nbytes = nbytes;
    h->device = device;
    h->handle = g_arena.take(nbytes);
    now = (mem.allocated += int64_t(nbytes));
    int64_t peak = mem.peak.load();
    while (now > peak && !mem.peak.compare_exchange_weak(peak, now)) {
    }
    mem.allocations++;
    mem.bytes_allocated_total += int64_t(nbytes);
    return {h->handle, h, &release_holder, c10::Device(kPjrt, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "pjrt: device memory cannot be copied byte-wise; use Tensor.copy_() or .to()");
  }

  bool initialized() override { return g_device_count > 0; }
  void emptyCache(c10::MempoolId_t) override {}  // no cache: PJRT frees a buffer with its last storage
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one queue per device

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    auto& m = g_memory[checked_index(device)];
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto& bytes = stats.allocated_bytes[0];  // index 0: the aggregate over pools
    bytes.current = m.allocated.load();
    bytes.peak = m.peak.load();
    bytes.allocated = m.bytes_allocated_total.load();
    bytes.freed = m.bytes_freed_total.load();
    stats.reserved_bytes[0] = bytes;  // nothing is cached: reserved == allocated
    stats.active_bytes[0] = bytes;
    stats.requested_bytes[0] = bytes;
    auto& count = stats.allocation[0];
    count.allocated = m.allocations.load();
    count.freed = m.frees.load();
    count.current = count.allocated - count.freed;
    count.peak = count.current;
    stats.active[0] = count;
    stats.num_ooms = m.oom.load();
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    auto& m = g_memory[checked_index(device)];
    m.bytes_allocated_total = 0;
    m.bytes_freed_total = 0;
    m.oom = 0;
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    auto& m = g_memory[checked_index(device)];
    m.peak = m.allocated.load();
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto& m = g_memory[checked_index(device)];
    return {size_t(std::max<int64_t>(0, m.limit - m.allocated.load())), size_t(m.limit)};
  }

  static std::string format_bytes(size_t n) {
    char buf[64];
    snprintf(buf, sizeof(buf), "%.2f MiB", double(n) / (1024.0 * 1024.0));
    return buf;
  }
};
static PjrtAllocator g_allocator;
REGISTER_ALLOCATOR(kPjrt, &g_allocator);

static Holder* holder_of(const c10::Storage& s) {
  const auto& dp = s.data_ptr();
  if (dp.get_deleter() != &release_holder) return nullptr;
  return static_cast<Holder*>(dp.get_context());
}

static Holder* checked_holder(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kPjrt, "pjrt: expected a pjrt tensor, got one on ", t.device());
  Holder* h = holder_of(t.storage());
  TORCH_CHECK(h, "pjrt: tensor storage was not allocated by the pjrt allocator");
  return h;
}

// ---------------------------------------------------------------------------
// Pinned host memory: ordinary CPU memory that we remember, so is_pinned() is true
// and DataLoader(pin_memory=True) works. PJRT copies from any host memory.
// ---------------------------------------------------------------------------
static std::mutex g_pinned_mu;
static std::unordered_set<const void*> g_pinned;

static void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(p);
  }
  c10::free_cpu(p);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned.insert(p);
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
static PinnedAllocator g_pinned_allocator;

static bool is_pinned_ptr(const void* p) {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  return g_pinned.count(p) > 0;
}

// ---------------------------------------------------------------------------
// Device synchronisation goes to Python (it waits on the platform's JAX arrays).
// ---------------------------------------------------------------------------
static void synchronize_device(c10::DeviceIndex idx) {
  if (!g_synchronize || !Py_IsInitialized()) return;
  pybind11::gil_scoped_acquire gil;
  pybind11::handle callback(g_synchronize);
  callback(int(idx));
}

// Events are host timestamps taken after the device has drained: exact for
// elapsed_time, and record() waits, as CUDA's does with a blocking event.
struct Event {
  double ms = 0;
  bool recorded = false;
};

static double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Streams: PJRT orders work per device, so every stream of a device is one queue;
// streams are still distinct objects so torch.Stream code runs unchanged.
static std::atomic<c10::StreamId> g_next_stream_id{1};
static thread_local std::array<c10::StreamId, kMaxDevices> g_current_stream{};

struct PjrtGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kPjrt; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kPjrt, g_current_device); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) g_current_device = checked_index(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < g_device_count) g_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    auto idx = d.index() < 0 ? g_current_device : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kPjrt, idx), g_current_stream[idx]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    auto idx = d.index() < 0 ? g_current_device : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kPjrt, idx), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int = 0) const override {
    auto idx = d.index() < 0 ? g_current_device : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kPjrt, idx), g_next_stream_id++);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    auto old = getStream(s.device());
    g_current_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (!*event) *event = new Event();
    synchronize_device(stream.device_index());
    auto* e = static_cast<Event*>(*event);
    e->ms = now_ms();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}  // one queue per device: already ordered
  bool queryEvent(void*) const override { return true; }   // record() waited for the work
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream& s) const override {
    synchronize_device(s.device_index());
    return true;
  }
  void synchronizeStream(const c10::Stream& s) const override { synchronize_device(s.device_index()); }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex idx) const override { synchronize_device(idx); }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "pjrt: elapsed_time needs both events to have been recorded");
    return b->ms - a->ms;
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuard);

// ---------------------------------------------------------------------------
// Generators: torch's CPU Philox/MT state machine, placed on the pjrt device; the
// Python side draws 64-bit seeds from it to derive JAX keys.
// ---------------------------------------------------------------------------
struct PjrtGenerator : public at::CPUGeneratorImpl {
  explicit PjrtGenerator(c10::DeviceIndex idx) {
    device_ = c10::Device(kPjrt, idx);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  static c10::DeviceType device_type() { return kPjrt; }
};

static const at::Generator& default_generator(c10::DeviceIndex idx) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> v;
    for (int i = 0; i < g_device_count; i++) {
      v.push_back(at::make_generator<PjrtGenerator>(i));
      v.back().set_current_seed(c10::default_rng_seed_val);
    }
    return v;
  }();
  return generators[checked_index(idx)];
}

// Grow a storage (resize_, set_): a larger handle range; the buffer is padded lazily.
static void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  Holder* old = holder_of(storage);
  auto dp = g_allocator.allocate_on(old ? old->device : g_current_device, new_nbytes);
  auto* fresh = static_cast<Holder*>(dp.get_context());
  if (old && old->buffer) {
    pybind11::gil_scoped_acquire gil;
    Py_INCREF(old->buffer);
    fresh->buffer = old->buffer;
    fresh->shape = old->shape;
    fresh->dtype = old->dtype;
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(dp));
  storage.unsafeGetStorageImpl()->set_nbytes(new_nbytes);
}

struct PjrtHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_device_count > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return g_device_count; }
  void setCurrentDevice(c10::DeviceIndex d) const override { g_current_device = checked_index(d); }
  c10::DeviceIndex getCurrentDevice() const override { return g_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = g_current_device;
    g_current_device = checked_index(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex idx) const override { return default_generator(idx); }
  at::Generator getNewGenerator(c10::DeviceIndex idx) const override {
    return at::make_generator<PjrtGenerator>(checked_index(idx));
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kPjrt, g_current_device); }
  bool isPinnedPtr(const void* p) const override { return is_pinned_ptr(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& s, size_t n) const override { resize_storage_bytes(s, n); }
};

// ---------------------------------------------------------------------------
// Metadata-only kernels
// ---------------------------------------------------------------------------
static c10::DispatchKeySet pjrt_keys() { return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1); }

// Dtypes a storage can hold: those with a JAX dtype (set_dtype_map). An empty tensor of
// another dtype (bits8, uint4, complex32, ...) would only fail when first read, so empty
// refuses it at creation with Python's error (g_unsupported_dtype raises it).
static std::array<bool, 256> g_dtype_supported{};
static bool g_dtype_table_set = false;
static PyObject* g_unsupported_dtype = nullptr;  // Python callable(dtype, device index) that raises

void set_unsupported_dtype_handler(py::function raise_error) {
  Py_XDECREF(g_unsupported_dtype);
  g_unsupported_dtype = raise_error.release().ptr();
}

static c10::ScalarType checked_dtype(std::optional<c10::ScalarType> dtype, std::optional<c10::Device> device) {
  c10::ScalarType type = c10::dtype_or_default(dtype);
  if (C10_LIKELY(!g_dtype_table_set || g_dtype_supported[static_cast<uint8_t>(type)])) return type;
  c10::DeviceIndex index = device && device->has_index() ? device->index() : g_current_device;
  if (g_unsupported_dtype) {
    py::gil_scoped_acquire gil;
    py::reinterpret_borrow<py::object>(g_unsupported_dtype)(type, index);  // raises
  }
  TORCH_CHECK(false, "pjrt: dtype ", type, " is not supported on pjrt:", int(index));
  return type;  // not reached
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &g_allocator, pjrt_keys(), checked_dtype(dtype, device), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &g_allocator, pjrt_keys(), checked_dtype(dtype, device));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Make the storage large enough for the tensor's (new) geometry.
static void fit_storage(const at::Tensor& self) {
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
  fit_storage(self);
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage storage, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
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
  auto dp = g_allocator.allocate_on(self.device().index(), 0);
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(dp), &g_allocator, true);
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

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// ---------------------------------------------------------------------------
// Python interface (used by storage.py and device.py only)
// ---------------------------------------------------------------------------
// The buffer if `t` is exactly its storage's buffer (same shape, dtype, offset 0,
// contiguous, no lazy conj/neg bit), else None: the zero-cost read of the eager hot path.
static bool is_whole_buffer(const at::Tensor& t, const Holder* h) {
  return h && h->buffer && t.storage_offset() == 0 && t.scalar_type() == h->dtype &&
         t.sizes() == c10::IntArrayRef(h->shape) && t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

py::object whole_buffer(const at::Tensor& t) {
  Holder* h = holder_of(t.storage());
  if (!is_whole_buffer(t, h)) return py::none();
  return py::reinterpret_borrow<py::object>(h->buffer);
}

py::object buffer(const at::Tensor& t) {
  Holder* h = checked_holder(t);
  if (!h->buffer) return py::none();
  return py::reinterpret_borrow<py::object>(h->buffer);
}

// Replace the storage's buffer; `shape` and `dtype` describe the new buffer.
void set_buffer(const at::Tensor& t, py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype) {
  Holder* h = checked_holder(t);
  PyObject* o = obj.release().ptr();
  std::swap(h->buffer, o);
  h->shape = std::move(shape);
  h->dtype = dtype;
  Py_XDECREF(o);
}

// A fresh contiguous pjrt tensor owning `obj` (a JAX array of that shape and dtype).
at::Tensor wrap(py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype, c10::DeviceIndex device) {
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  size_t nbytes = size_t(numel) * c10::elementSize(dtype);
  auto dp = g_allocator.allocate_on(device, nbytes);
  auto* h = static_cast<Holder*>(dp.get_context());
  h->buffer = obj.release().ptr();
  h->shape = shape;
  h->dtype = dtype;
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), &g_allocator, /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), pjrt_keys(), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

// JAX dtype -> torch dtype, given once by Python (the one mapping lives in dtypes.py).
static PyObject* g_torch_dtypes = nullptr;

void set_dtype_map(py::dict jax_to_torch) {
  g_dtype_supported.fill(false);
  for (auto item : jax_to_torch) g_dtype_supported[static_cast<uint8_t>(item.second.cast<c10::ScalarType>())] = true;
  g_dtype_table_set = true;
  Py_XDECREF(g_torch_dtypes);
  g_torch_dtypes = jax_to_torch.release().ptr();
}

// wrap() for a JAX array, reading its shape and dtype here: the eager hot path.
// A JAX array's shape and torch dtype, cached by its abstract value: an executable's
// outputs share their aval objects, so the eager hot path reads no Python attributes.
struct ArrayType {
  PyObject* aval = nullptr;  // owned
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};
static std::array<ArrayType, 256> g_array_types;

static const ArrayType& array_type(const py::object& array) {
  py::object aval = array.attr("aval");
  auto& entry = g_array_types[(reinterpret_cast<uintptr_t>(aval.ptr()) >> 4) % g_array_types.size()];
  if (entry.aval != aval.ptr()) {
    entry.shape = aval.attr("shape").cast<std::vector<int64_t>>();
    entry.dtype = py::reinterpret_borrow<py::dict>(g_torch_dtypes)[aval.attr("dtype")].cast<c10::ScalarType>();
    Py_XDECREF(entry.aval);
    entry.aval = aval.release().ptr();
  }
  return entry;
}

at::Tensor wrap_array(py::object array, c10::DeviceIndex device) {
  const ArrayType& type = array_type(array);
  return wrap(std::move(array), type.shape, type.dtype, device);
}

// ---------------------------------------------------------------------------
// Eager fast path: the PrivateUse1 kernel of a table op, in C++
// ---------------------------------------------------------------------------
// Crossing from the dispatcher into a Python kernel converts every argument and
// costs about as much as the XLA call itself. For the common call (tensor operands
// that are pjrt tensors on one device, Python numbers, plain static arguments) this
// kernel builds the op's executable arguments and wraps its results here; every other
// call goes to the op's Python kernel (eager.Kernel), which owns the full semantics.
enum ArgKind : int { kTensor = 0, kScalar = 1, kStatic = 2, kDtype = 3, kLayout = 4, kMemoryFormat = 5 };

struct EagerHelpers {
  PyObject* weak_scalar = nullptr;   // eager._weak_scalar: a Python number as a cached weakly typed JAX scalar
  PyObject* read_lazily = nullptr;   // storage.read_lazily: a view's operand
  PyObject* record = nullptr;        // storage._recent.append: synchronize's bookkeeping
  PyObject* array_type = nullptr;    // jax's concrete array class
  PyObject* strided_view = nullptr;  // storage.StridedView
  std::array<PyObject*, 64> jax_dtypes{};  // by torch ScalarType; nullptr where JAX has none
};
static EagerHelpers g_eager;

static py::tuple int_tuple(c10::IntArrayRef values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); i++) PyTuple_SET_ITEM(out.ptr(), i, PyLong_FromLongLong(values[i]));
  return out;
}

// storage.read_lazily in C++ for a view whose storage buffer is already there: a
// StridedView with the geometry storage.py builds (the consuming executable resolves it).
static py::object lazy_view(const at::Tensor& t, const Holder* h) {
  auto dtype_index = static_cast<size_t>(t.scalar_type());
  PyObject* dtype = dtype_index < g_eager.jax_dtypes.size() ? g_eager.jax_dtypes[dtype_index] : nullptr;
  if (dtype && h && h->buffer &&
      c10::multiply_integers(h->shape) * int64_t(c10::elementSize(h->dtype)) >= int64_t(t.storage().nbytes())) {
    py::tuple geometry = py::make_tuple(int_tuple(t.sizes()), int_tuple(t.strides()), t.storage_offset(),
                                        py::handle(dtype), py::bool_(t.is_conj()), py::bool_(t.is_neg()));
    PyObject* view = PyObject_CallFunctionObjArgs(g_eager.strided_view, h->buffer, geometry.ptr(), nullptr);
    if (!view) throw python_error();
    return py::reinterpret_steal<py::object>(view);
  }
  PyObject* view = PyObject_CallOneArg(g_eager.read_lazily, py::cast(t).ptr());  // creates or grows the buffer
  if (!view) throw python_error();
  return py::reinterpret_steal<py::object>(view);
}

// Weak scalars by (kind, bits): converting a Python number costs a host-to-device copy.
static std::unordered_map<uint64_t, PyObject*> g_weak_scalars[3];  // int, double, bool

static PyObject* weak_scalar(const c10::Scalar& s) {
  int kind;
  uint64_t bits;
  py::object value;
  if (s.isBoolean()) {
    kind = 2, bits = s.toBool(), value = py::bool_(s.toBool());
  } else if (s.isIntegral(false)) {
    int64_t v = s.toLong();
    kind = 0, bits = uint64_t(v), value = py::int_(v);
  } else if (s.isFloatingPoint()) {
    double v = s.toDouble();
    std::memcpy(&bits, &v, sizeof(v));
    kind = 1, value = py::float_(v);
  } else {
    return nullptr;  // complex and symbolic: the Python kernel
  }
  auto& cache = g_weak_scalars[kind];
  auto it = cache.find(bits);
  if (it != cache.end()) return it->second;
  PyObject* array = PyObject_CallOneArg(g_eager.weak_scalar, value.ptr());
  if (!array) throw python_error();
  if (cache.size() > 4096) {
    for (auto& [_, v] : cache) Py_DECREF(v);
    cache.clear();
  }
  cache.emplace(bits, array);
  return array;
}

// A static argument as the Python value the executable keys on (lists become tuples).
static py::object static_value(const c10::IValue& v, int kind) {
  if (v.isNone()) return py::none();
  switch (kind) {
    case kDtype:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(c10::ScalarType(v.toInt()))));
    case kLayout:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(c10::Layout(v.toInt()))));
    case kMemoryFormat:
      return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(c10::MemoryFormat(v.toInt())));
  }
  py::object o = torch::jit::toPyObject(v);
  if (PyList_Check(o.ptr())) return py::reinterpret_steal<py::object>(PyList_AsTuple(o.ptr()));
  return o;
}

class FastKernel : public c10::OperatorKernel {
 public:
  // `store` is None for a functional op; for an in-place op (self first), the Python
  // function that writes a result into self when it is not simply self's new buffer.
  FastKernel(py::object run, py::object slow, py::object store, std::vector<int> kinds)
      : run_(run.release().ptr()), slow_(slow.release().ptr()),
        store_(store.is_none() ? nullptr : store.release().ptr()), kinds_(std::move(kinds)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = kinds_.size();
    py::gil_scoped_acquire gil;
    py::object result;
    int device = -1;
    {
      auto args = torch::jit::last(*stack, n);
      py::tuple values(n);
      bool fast = true;
      for (size_t i = 0; i < n && fast; i++) {
        py::object value = operand(args[i], kinds_[i], device, fast, store_ && i == 0);
        if (fast) PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
      }
      if (!fast || device < 0) return slow(op, stack, n);
      PyObject* out = PyObject_Call(run_, values.ptr(), nullptr);
      if (!out) {
        // A failed call: the Python kernel runs it again and raises what CPU torch raises (errors.py).
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw python_error();
        PyErr_Clear();
        return slow(op, stack, n);
      }
      result = py::reinterpret_steal<py::object>(out);
    }
    if (store_) {
      at::Tensor self = (*stack)[stack->size() - n].toTensor();
      torch::jit::drop(*stack, n);
      store(self, result);
      torch::jit::push(*stack, std::move(self));
      return;
    }
    torch::jit::drop(*stack, n);
    push_results(op, stack, result, c10::DeviceIndex(device));
  }

 private:
  // One argument as the executable takes it; clears `fast` where the Python kernel must decide.
  // `written`: self of an in-place op.
  py::object operand(const c10::IValue& v, int kind, int& device, bool& fast, bool written) {
    if (kind == kScalar) {
      if (v.isNone()) return py::none();
      PyObject* s = v.isScalar() ? weak_scalar(v.toScalar()) : nullptr;
      if (!s) fast = false;
      return py::reinterpret_borrow<py::object>(s ? s : Py_None);
    }
    if (kind != kTensor) return static_value(v, kind);
    if (v.isNone()) return py::none();
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return py::none();
    if (t.device().type() == kPjrt) {
      int index = t.device().index();
      if (device >= 0 && device != index) {
        fast = false;  // the Python kernel raises the device-mismatch error
        return py::none();
      }
      device = index;
      Holder* h = holder_of(t.storage());
      if (is_whole_buffer(t, h)) return py::reinterpret_borrow<py::object>(h->buffer);
      if (written) {  // an in-place write through a view: the Python kernel checks for overlaps
        fast = false;
        return py::none();
      }
      return lazy_view(t, h);
    }
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number: promotes as a Scalar
      PyObject* s = weak_scalar(t.item());
      if (s) return py::reinterpret_borrow<py::object>(s);
    }
    fast = false;  // CPU tensors: the Python kernel allows scalars and raises for the rest
    return py::none();
  }

  at::Tensor wrap_result(const c10::OperatorHandle& op, PyObject* array, c10::DeviceIndex device) {
    if (array == Py_None) return at::Tensor();  // an output the op leaves undefined
    if (Py_TYPE(array) != reinterpret_cast<PyTypeObject*>(g_eager.array_type)) {
      // a storage.Permuted (an output laid out by torch's strides): wrap its physical array, permute the view
      py::object permuted = py::reinterpret_borrow<py::object>(array);
      py::object physical = permuted.attr("array");
      TORCH_CHECK(Py_TYPE(physical.ptr()) == reinterpret_cast<PyTypeObject*>(g_eager.array_type), "pjrt: the lowering of ",
                  op.schema().operator_name(), " returned a ", Py_TYPE(array)->tp_name, " instead of a jax array");
      record(physical.ptr());
      std::vector<int64_t> dims;
      for (auto d : permuted.attr("inverse")) dims.push_back(d.cast<int64_t>());
      return wrap_array(physical, device).permute(dims);
    }
    record(array);
    return wrap_array(py::reinterpret_borrow<py::object>(array), device);
  }

  // self's storage takes the result as its buffer when it is exactly self's new value.
  void store(const at::Tensor& self, const py::object& result) {
    Holder* h = holder_of(self.storage());
    if (Py_TYPE(result.ptr()) == reinterpret_cast<PyTypeObject*>(g_eager.array_type) && is_whole_buffer(self, h) &&
        self.storage().nbytes() == size_t(self.numel()) * self.element_size()) {
      const ArrayType& type = array_type(result);
      if (type.shape != h->shape || type.dtype != h->dtype) return store_in_python(self, result);
      record(result.ptr());
      PyObject* old = h->buffer;
      h->buffer = py::object(result).release().ptr();
      Py_DECREF(old);
      return;
    }
    store_in_python(self, result);
  }

  void store_in_python(const at::Tensor& self, const py::object& result) {
    PyObject* out = PyObject_CallFunctionObjArgs(store_, py::cast(self).ptr(), result.ptr(), nullptr);
    if (!out) throw python_error();
    Py_DECREF(out);
  }

  // synchronize()'s bookkeeping of recent results (storage._recent)
  static void record(PyObject* array) {
    PyObject* ok = PyObject_CallOneArg(g_eager.record, array);
    if (!ok) throw python_error();
    Py_DECREF(ok);
  }

  void push_results(const c10::OperatorHandle& op, torch::jit::Stack* stack, const py::object& result,
                    c10::DeviceIndex device) {
    if (op.schema().returns().size() == 1) {
      torch::jit::push(*stack, wrap_result(op, result.ptr(), device));
      return;
    }
    for (auto item : result) torch::jit::push(*stack, wrap_result(op, item.ptr(), device));
  }

  // The Python kernel with the arguments as Python objects (all positional: it binds by schema order).
  void slow(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n) {
    auto args = torch::jit::last(*stack, n);
    py::tuple values(n);
    for (size_t i = 0; i < n; i++) {
      py::object value = (kinds_[i] == kTensor || kinds_[i] == kScalar) ? torch::jit::toPyObject(args[i])
                                                                          : static_value(args[i], kinds_[i]);
      PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
    }
    torch::jit::drop(*stack, n);
    PyObject* out = PyObject_Call(slow_, values.ptr(), nullptr);
    if (!out) throw python_error();
    py::object result = py::reinterpret_steal<py::object>(out);
    if (op.schema().returns().size() == 1) {
      torch::jit::push(*stack, unpack(op, result.ptr()));
      return;
    }
    for (auto item : result) torch::jit::push(*stack, unpack(op, item.ptr()));
  }

  static at::Tensor unpack(const c10::OperatorHandle& op, PyObject* obj) {
    if (obj == Py_None) return at::Tensor();
    TORCH_CHECK(THPVariable_Check(obj), "pjrt: the kernel of ", op.schema().operator_name(), " returned a ",
                Py_TYPE(obj)->tp_name, " instead of a tensor");
    return THPVariable_Unpack(obj);
  }

  PyObject* run_;   // the op's executable (never freed: kernels live as long as the process)
  PyObject* slow_;  // the op's Python kernel
  PyObject* store_;  // in-place ops: storage write of a result into self
  std::vector<int> kinds_;
};

static std::map<std::string, std::unique_ptr<torch::Library>> g_fast_libraries;  // by op namespace

void set_eager_helpers(py::object weak_scalar, py::object read_lazily, py::object record, py::object array_type,
                       py::object strided_view, py::dict torch_to_jax) {
  g_eager = {weak_scalar.release().ptr(), read_lazily.release().ptr(), record.release().ptr(),
             array_type.release().ptr(), strided_view.release().ptr()};
  for (auto [torch_dtype, jax_dtype] : torch_to_jax) {
    auto index = static_cast<size_t>(reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type);
    if (index < g_eager.jax_dtypes.size()) g_eager.jax_dtypes[index] = jax_dtype.inc_ref().ptr();
  }
}

// Register the C++ kernel of `ns`::`name` (e.g. "aten", "add.Tensor") on PrivateUse1.
void register_fast_kernel(const std::string& ns, const std::string& name, py::object run, py::object slow,
                          py::object store, std::vector<int> kinds) {
  auto& library = g_fast_libraries[ns];
  if (!library) {
    library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
                                               __LINE__);
  }
  library->impl(name.c_str(),
                torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FastKernel>(run, slow, store, std::move(kinds))));
}

// ---------------------------------------------------------------------------
// scaled_dot_product_attention's backend choice for pjrt tensors
// ---------------------------------------------------------------------------
// torch's SDPA asks `_fused_sdp_choice_stub` which backend serves the query's device, and
// a PrivateUse1 backend can only register that stub from C++. It asks a Python callable
// (torch_pjrt.kernels.sdpa.choose), so the rule lives beside the kernel it selects.
static PyObject* g_sdp_choice = nullptr;

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  if (!g_sdp_choice) return static_cast<int64_t>(sdp::SDPBackend::math);
  py::gil_scoped_acquire gil;
  return py::reinterpret_borrow<py::function>(g_sdp_choice)(query, key, value, attn_mask, dropout_p, is_causal,
                                                            scale, enable_gqa)
      .cast<int64_t>();
}

void set_sdp_choice(py::function choose) {
  Py_XDECREF(g_sdp_choice);
  g_sdp_choice = choose.release().ptr();
}

int64_t storage_nbytes(const at::Tensor& t) { return int64_t(t.storage().nbytes()); }

// 64 random bits from a pjrt generator (the default one of `device` when None).
uint64_t next_seed(py::object generator, c10::DeviceIndex device) {
  at::Generator gen = generator.is_none() ? default_generator(device) : THPGenerator_Unwrap(generator.ptr());
  auto* impl = at::check_generator<PjrtGenerator>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return impl->random64();
}

py::object py_default_generator(int idx) {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(idx)));
}

void init(int device_count, std::vector<int64_t> limits, py::object synchronize) {
  TORCH_CHECK(device_count > 0 && device_count <= kMaxDevices, "pjrt: unsupported device count ", device_count);
  g_device_count = device_count;
  for (int i = 0; i < device_count && i < int(limits.size()); i++) g_memory[i].limit = limits[i];
  Py_XDECREF(g_synchronize);
  g_synchronize = synchronize.release().ptr();
  static PjrtHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

py::dict memory_stats(int device) {
  auto& m = g_memory[checked_index(device)];
  py::dict d;
  d["allocated_bytes.all.current"] = m.allocated.load();
  d["allocated_bytes.all.peak"] = m.peak.load();
  d["allocation.all.allocated"] = m.allocations.load();
  d["allocation.all.freed"] = m.frees.load();
  d["allocation.all.current"] = m.allocations.load() - m.frees.load();
  d["num_ooms"] = m.oom.load();
  d["capacity_bytes"] = m.limit;
  return d;
}

void reset_peak(int device) {
  auto& m = g_memory[checked_index(device)];
  m.peak = m.allocated.load();
}

}  // namespace torch_pjrt

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_pjrt::sdp_choice);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace tp = torch_pjrt;
  m.def("init", &tp::init);
  m.def("whole_buffer", &tp::whole_buffer);
  m.def("buffer", &tp::buffer);
  m.def("set_buffer", &tp::set_buffer);
  m.def("wrap", &tp::wrap);
  m.def("wrap_array", &tp::wrap_array);
  m.def("set_dtype_map", &tp::set_dtype_map);
  m.def("set_unsupported_dtype_handler", &tp::set_unsupported_dtype_handler);
  m.def("storage_nbytes", &tp::storage_nbytes);
  m.def("set_eager_helpers", &tp::set_eager_helpers);
  m.def("register_fast_kernel", &tp::register_fast_kernel);
  m.def("set_sdp_choice", &tp::set_sdp_choice);
  // a Python number the arg parser wrapped into a CPU tensor: promotes as a Scalar
  m.def("is_wrapped_number", [](const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); });
  m.def("next_seed", &tp::next_seed);
  m.def("default_generator", &tp::py_default_generator);
  m.def("memory_stats", &tp::memory_stats);
  m.def("reset_peak", &tp::reset_peak);
  m.def("current_device", []() { return int(tp::g_current_device); });
  m.def("set_device", [](int d) { tp::g_current_device = tp::checked_index(d); });
  m.def("device_count", []() { return tp::g_device_count; });
  m.attr("torch_version") = TORCH_VERSION;
}
