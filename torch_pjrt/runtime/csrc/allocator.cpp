// The pjrt allocator: a storage's data pointer is a unique handle inside a reserved
// PROT_NONE range (never dereferenced, so a stray read faults instead of corrupting
// memory); the DataPtr's context (Holder) owns the storage's JAX buffer. Memory statistics
// and a capacity limit per device (an allocation past it raises torch.OutOfMemoryError,
// like CUDA's caching allocator), reported to torch's memory profiler. Pinned host memory.
#include "runtime.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_set>

namespace torch_pjrt {

std::array<DeviceMemory, kMaxDevices> g_memory;

namespace {

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
  bool holds(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto* c = static_cast<const char*>(p);
    return base_ && c >= base_ && c < base_ + kCapacity;
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
HandleArena g_arena;

// torch.profiler(profile_memory=True) and the memory snapshot see pjrt allocations as
// device memory; nothing is cached, so reserved is allocated.
void report_to_profiler(void* handle, int64_t delta, int64_t allocated, c10::DeviceIndex device) {
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    c10::reportMemoryUsageToProfiler(handle, delta, size_t(allocated), size_t(allocated), c10::Device(kPjrt, device));
  }
}

void release_holder(void* ctx) {
  auto* h = static_cast<Holder*>(ctx);
  if (h->buffer && Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(h->buffer);
    PyGILState_Release(gil);
  }
  auto& mem = g_memory[h->device];
  int64_t now = (mem.allocated -= int64_t(h->nbytes));
  mem.bytes_freed_total += int64_t(h->nbytes);
  mem.frees++;
  report_to_profiler(h->handle, -int64_t(h->nbytes), now, h->device);
  g_arena.give_back(h->handle, h->nbytes);
  delete h;
}

std::string format_bytes(size_t n) {
  char buf[64];
  snprintf(buf, sizeof(buf), "%.2f MiB", double(n) / (1024.0 * 1024.0));
  return buf;
}

// A DeviceAllocator, so torch.accelerator's memory functions work on pjrt too.
struct PjrtAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(g_current_device, nbytes); }

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
};
PjrtAllocator g_allocator;

// ---------------------------------------------------------------------------
// Pinned host memory: ordinary CPU memory that we remember, so is_pinned() is true
// and DataLoader(pin_memory=True) works. PJRT copies from any host memory.
// ---------------------------------------------------------------------------
std::mutex g_pinned_mu;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* p) {
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
PinnedAllocator g_pinned_allocator;

}  // namespace

REGISTER_ALLOCATOR(kPjrt, &g_allocator);

c10::Allocator* device_allocator() { return &g_allocator; }

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
  report_to_profiler(h->handle, int64_t(nbytes), now, device);
  return {h->handle, h, &release_holder, c10::Device(kPjrt, device)};
}

Holder* holder_of(const c10::Storage& s) {
  const auto& dp = s.data_ptr();
  if (dp.get_deleter() != &release_holder) return nullptr;
  return static_cast<Holder*>(dp.get_context());
}

c10::Storage sliced_storage(const c10::Storage& slice, size_t& offset) {
  offset = 0;
  c10::Storage storage = slice;
  while (storage.data_ptr().get_deleter() != &release_holder) {
    const c10::DataPtr& dp = storage.data_ptr();
    if (dp.device().type() != kPjrt || !dp.get_context() || !g_arena.holds(dp.get())) return {};
    // UntypedStorage's [start:end] (torch/csrc/Storage.cpp) keeps the storage it slices as its
    // DataPtr's context: a handle inside our arena with another deleter is such a slice
    auto* sliced = static_cast<c10::StorageImpl*>(dp.get_context());
    offset += static_cast<const char*>(dp.get()) - static_cast<const char*>(sliced->data_ptr().get());
    storage = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(sliced));
  }
  if (storage.unsafeGetStorageImpl() == slice.unsafeGetStorageImpl()) return {};  // the allocator's own
  return storage;
}

void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  Holder* old = holder_of(storage);
  auto dp = allocate_on(old ? old->device : g_current_device, new_nbytes);
  auto* fresh = static_cast<Holder*>(dp.get_context());
  if (old && old->buffer) {
    PyGILState_STATE gil = PyGILState_Ensure();  // torch releases the GIL while a kernel runs
    Py_INCREF(old->buffer);
    PyGILState_Release(gil);
    fresh->buffer = old->buffer;
    fresh->shape = old->shape;
    fresh->dtype = old->dtype;
  }
  if (old) fresh->deterministic_fill = old->deterministic_fill;
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(dp));
  storage.unsafeGetStorageImpl()->set_nbytes(new_nbytes);
}

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }

bool is_pinned_ptr(const void* p) {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  return g_pinned.count(p) > 0;
}

}  // namespace torch_pjrt
