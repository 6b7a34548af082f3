// The Python face of occl (openreg_distributed._C): the backend class handed to
// torch.distributed, and DDP's reducer timer for openreg.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <array>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "OcclBackend.hpp"
#include "torch_openreg/runtime/OpenRegException.h"
#include "torch_openreg/runtime/OpenRegStream.h"

namespace openreg_distributed {

// DDP's Timer for openreg (Reducer looks it up by device type; without one it warns that time
// stats are only for CPU and CUDA). Events with timing on the current stream, as CUDA's timer.
class OpenRegTimer final : public c10d::Timer {
 public:
  explicit OpenRegTimer(c10::Device device) : device_(device) {}
  ~OpenRegTimer() override {
    for (auto e : events_)
      if (e != nullptr) orEventDestroy(e);
  }

  void record(Event event) override {
    Timer::record(event);  // the host-side timestamp
    orEvent_t& e = events_[static_cast<size_t>(event)];
    if (e == nullptr) OPENREG_CHECK(orEventCreateWithFlags(&e, orEventDefault));
    OPENREG_CHECK(orEventRecord(e, c10::openreg::current_stream_handle(device_.index())));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    orEvent_t s = events_[static_cast<size_t>(start)], e = events_[static_cast<size_t>(end)];
    // Not recorded (no backward yet, or a no_sync iteration): no measurement.
    if (s == nullptr || e == nullptr) return std::nullopt;
    OPENREG_CHECK(orEventSynchronize(s));
    OPENREG_CHECK(orEventSynchronize(e));
    float ms = 0;
    if (orEventElapsedTime(&ms, s, e) != orSuccess || ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1000000.0);
  }

 private:
  c10::Device device_;
  std::array<orEvent_t, 5> events_{};
};

}  // namespace openreg_distributed

namespace c10d {
// The registry's macros name its types unqualified: the registration lives in its namespace.
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, openreg_distributed::OpenRegTimer);
}  // namespace c10d

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using openreg_distributed::GlooTransport;
  using openreg_distributed::OcclBackend;
  m.doc() = "occl, the c10d backend for openreg tensors";
  py::module_::import("torch._C._distributed_c10d");  // the base class c10d::Backend
  py::class_<OcclBackend, c10d::Backend, c10::intrusive_ptr<OcclBackend>>(m, "OcclBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const c10::intrusive_ptr<c10d::Backend>& transport) {
             auto options = c10::make_intrusive<OcclBackend::Options>(timeout);
             return c10::make_intrusive<OcclBackend>(store, rank, size, options,
                                                     std::make_shared<GlooTransport>(transport));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport"),
           "An occl backend over `transport`, a c10d Gloo backend of the same ranks.")
      .def_property_readonly("transport_name", [](const OcclBackend& b) { return b.transport()->name(); })
      .def_property_readonly("timeout", [](OcclBackend& b) { return b.getBackendOptions()->timeout; });
}
