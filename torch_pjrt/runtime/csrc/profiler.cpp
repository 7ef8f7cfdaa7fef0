// The profiler's view of pjrt: device time per op through torch's PrivateUse1 profiler
// stubs, which torch's legacy profiler calls around every op
// (torch.autograd.profiler.profile(use_device="pjrt"), state KINETO_PRIVATEUSE1_FALLBACK).
// An event is a host timestamp taken after the device has drained, as in guard.cpp, so an
// op's device time is the time from its start until its work is done. Memory events come
// from the allocator (allocator.cpp, c10::reportMemoryUsageToProfiler).
#include "runtime.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>

namespace torch_pjrt {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct PjrtProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    c10::DeviceIndex index = g_current_device;
    if (device) *device = index;
    synchronize_device(index);
    auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
    *event = std::make_shared<double>(us);
    if (cpu_ns) *cpu_ns = c10::getTime();
  }
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (!start || !*start || !end || !*end) return 0.0f;
    return float(*static_cast<const double*>(end->get()) - *static_cast<const double*>(start->get()));  // us
  }
  void mark(const char*) const override {}  // no native trace annotations: the op names are on the CPU events
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    c10::DeviceGuard guard(c10::Device(kPjrt, 0));
    for (int i = 0; i < g_device_count; i++) {
      guard.set_index(c10::DeviceIndex(i));
      op(i);
    }
  }
  void synchronize() const override {
    for (int i = 0; i < g_device_count; i++) synchronize_device(c10::DeviceIndex(i));
  }
};

}  // namespace

void register_profiler_stubs() {
  static PjrtProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
}

}  // namespace torch_pjrt
