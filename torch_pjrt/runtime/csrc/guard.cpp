// Device guard with N devices, streams and timing events. PJRT orders work per device,
// so every stream of a device is one queue; streams are still distinct objects so
// torch.Stream code runs unchanged.
#include "runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <chrono>

namespace torch_pjrt {

int g_device_count = 0;
thread_local c10::DeviceIndex g_current_device = 0;

c10::DeviceIndex checked_index(c10::DeviceIndex idx) {
  if (idx < 0) idx = g_current_device;
  TORCH_CHECK_INDEX(idx < g_device_count, "pjrt: invalid device index ", int(idx),
                    "; this process has ", g_device_count, " pjrt device(s)");
  return idx;
}

namespace {

// Events are host timestamps taken after the device has drained: exact for
// elapsed_time, and record() waits, as CUDA's does with a blocking event.
struct Event {
  double ms = 0;
  bool recorded = false;
};

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::atomic<c10::StreamId> g_next_stream_id{1};
thread_local std::array<c10::StreamId, kMaxDevices> g_current_stream{};

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

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuard);

}  // namespace torch_pjrt
