// Generators and the PrivateUse1 hooks. A pjrt generator is torch's CPU Philox/MT state
// machine placed on the pjrt device; the Python side draws 64-bit seeds from it to derive
// JAX keys.
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <mutex>

namespace torch_pjrt {

namespace {

struct PjrtGenerator : public at::CPUGeneratorImpl {
  explicit PjrtGenerator(c10::DeviceIndex idx) {
    device_ = c10::Device(kPjrt, idx);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  static c10::DeviceType device_type() { return kPjrt; }
};

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
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& s, size_t n) const override { resize_storage_bytes(s, n); }
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex idx) {
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

uint64_t next_seed(at::Generator generator) {
  auto* impl = at::check_generator<PjrtGenerator>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return impl->random64();
}

void register_hooks() {
  static PjrtHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torch_pjrt
