// The Python face of occl (openreg_distributed._C): the backend class handed to
// torch.distributed, and DDP's reducer timer for openreg.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
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
  // Joining a watchdog that waits for the GIL (to drop a tensor Python owned) must not hold it.
  openreg_distributed::set_without_gil([](const std::function<void()>& fn) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      fn();
    } else {
      fn();
    }
  });
  m.def("_stop_foreign_releases", &openreg_distributed::stop_foreign_releases, py::call_guard<py::gil_scoped_release>(),
        "At exit, before the interpreter finalizes: no occl thread drops a tensor from now on (it would take "
        "the GIL).");
  py::module_::import("torch._C._distributed_c10d");  // the base class c10d::Backend
  py::class_<OcclBackend, c10d::Backend, c10::intrusive_ptr<OcclBackend>>(m, "OcclBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const c10::intrusive_ptr<c10d::Backend>& transport,
                       const py::object& make_transport, std::vector<uint64_t> global_ranks,
                       const std::string& group_name) {
             auto options = c10::make_intrusive<OcclBackend::Options>(timeout);
             options->global_ranks_in_group = std::move(global_ranks);
             options->group_name = group_name;
             OcclBackend::TransportFactory factory;
             if (!make_transport.is_none()) {
               // The Python callable, released with the GIL whichever thread drops the last backend.
               std::shared_ptr<py::object> fn(new py::object(make_transport), [](py::object* o) {
                 py::gil_scoped_acquire gil;
                 delete o;
               });
               factory = [fn](const c10::intrusive_ptr<c10d::Store>& s, int r, int n, std::chrono::milliseconds t) {
                 py::gil_scoped_acquire gil;
                 auto gloo = (*fn)(s, r, n, t).cast<c10::intrusive_ptr<c10d::Backend>>();
                 return std::shared_ptr<openreg_distributed::Transport>(std::make_shared<GlooTransport>(gloo));
               };
             }
             return c10::make_intrusive<OcclBackend>(store, rank, size, options,
                                                     std::make_shared<GlooTransport>(transport), std::move(factory));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport"),
           py::arg("make_transport") = py::none(), py::arg("global_ranks") = std::vector<uint64_t>(),
           py::arg("group_name") = "",
           "An occl backend over `transport`, a c10d Gloo backend of the same ranks; `make_transport(store, rank, "
           "size, timeout)` makes the transport of a split group.")
      .def_property_readonly("transport_name", [](const OcclBackend& b) { return b.transport()->name(); })
      .def_property_readonly("timeout", [](OcclBackend& b) { return b.getBackendOptions()->timeout; })
      .def_property_readonly("first_error", &OcclBackend::first_error,
                             "The group's first failure (None while it is healthy): what later operations are "
                             "refused with.")
      // split_group deep-copies `options` of the parent backend and hands it back to split(): None
      // lets split() take the parent's (c10d's Options has no Python copy).
      .def_property_readonly("options", [](OcclBackend&) { return py::none(); })
      // A rank outside a new group of a group bound to a device: Gloo's rendezvous needs nothing from it.
      .def("perform_nocolor_split", [](OcclBackend&, const c10::Device&) {});

  // occl's flight recorder (see csrc/Trace.hpp), in the formats of torch's _dump_fr_trace(_json).
  m.def(
      "_dump_flight_recorder",
      [](bool include_collectives, bool include_stack_traces, bool only_active) {
        return py::bytes(openreg_distributed::trace::dump(include_collectives, include_stack_traces, only_active));
      },
      py::arg("include_collectives") = true, py::arg("include_stack_traces") = true, py::arg("only_active") = false);
  m.def(
      "_dump_flight_recorder_json",
      [](bool include_collectives, bool only_active) {
        return openreg_distributed::trace::dump_json(include_collectives, only_active);
      },
      py::arg("include_collectives") = true, py::arg("only_active") = false);
}
