// The legacy profiler path: torch.autograd.profiler.profile(use_device="openreg")
// without Kineto (ProfilerState::KINETO_PRIVATEUSE1_FALLBACK) times each op on
// the device with a pair of events recorded on the current stream, through the
// ProfilerStubs a backend registers for PrivateUse1.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegFunctions.h"
#include "../runtime/OpenRegStream.h"

namespace c10::openreg {
namespace {

orEvent_t as_event(const torch::profiler::impl::ProfilerVoidEventStub* stub) {
  return static_cast<orEvent_t>(stub->get());
}

struct OpenRegProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex d = current_device();
    if (device != nullptr) *device = d;
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    // An event recorded on a capturing stream is refused and invalidates the capture: an operator
    // captured into a graph gets no device time (elapsed() answers 0 for it), as torch.profiler
    // profiles the same capture.
    int capturing = 0;
    OPENREG_CHECK(orStreamIsCapturing(current_stream_handle(d), &capturing));
    if (capturing != 0) {
      *event = nullptr;
      return;
    }
    orEvent_t ev = nullptr;
    OPENREG_CHECK(orEventCreate(&ev));
    *event = std::shared_ptr<void>(ev, [](void* e) { orEventDestroy(static_cast<orEvent_t>(e)); });
    OPENREG_CHECK(orEventRecord(ev, current_stream_handle(d)));
  }

  // Microseconds between two records (the unit the profiler expects).
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    if (*start == nullptr || *end == nullptr) return 0;  // recorded during a graph capture
    OPENREG_CHECK(orEventSynchronize(as_event(start)));
    OPENREG_CHECK(orEventSynchronize(as_event(end)));
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, as_event(start), as_event(end)));
    return ms * 1000.0f;
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = current_device();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      set_device(d);
      op(d);
    }
    set_device(previous);
  }

  void synchronize() const override {
    onEachDevice([](int) { OPENREG_CHECK(orDeviceSynchronize()); });
  }
};

const bool stubs_registered = [] {
  static OpenRegProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace c10::openreg
