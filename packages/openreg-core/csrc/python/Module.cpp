// torch_openreg._C: the Python binding of the runtime and the PyTorch layer.
// The only translation unit that includes torch's Python headers (pybind.h, not the whole
// <torch/extension.h>: a third of the unit's compile time); everything it exposes is used by
// torch_openreg/openreg/*.py, and by code openreg-inductor generates (_empty_strided,
// _current_raw_stream).
#include <ATen/ops/empty.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/COW.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "aten/OpenRegFallback.h"
#include "aten/OpenRegNativeOps.h"
#include "aten/OpenRegNested.h"
#include "aten/OpenRegSparse.h"
#include "openreg/faults.h"
#include "runtime/OpenRegCachingAllocator.h"
#include "runtime/OpenRegException.h"
#include "runtime/OpenRegFunctions.h"
#include "runtime/OpenRegGenerator.h"
#include "runtime/OpenRegHooks.h"
#include "runtime/OpenRegHostAllocator.h"
#include "runtime/OpenRegStream.h"
#include "tensor/OpenRegBackendMeta.h"

namespace py = pybind11;
using namespace c10::openreg;

namespace {

// A device index from Python, checked as the int it is: cast first to the 8-bit DeviceIndex,
// 257 would become 1 and pass the check.
c10::DeviceIndex device_index(int64_t d) {
  check_device_index(d);
  return static_cast<c10::DeviceIndex>(d);
}

// The stream a Python stream names (its id and device index).
OpenRegStream stream_of(int64_t id, int64_t d) {
  return OpenRegStream(
      c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_index(d)), id));
}

py::tuple pack(const OpenRegStream& s) {
  return py::make_tuple(s.id(), s.device_index(), static_cast<int>(c10::DeviceType::PrivateUse1));
}

// Readers of the allocator release the GIL before they take its lock: a thread holding that lock
// may be waiting for the device, whose queued Python kernels need the GIL.
py::dict stats_dict(c10::DeviceIndex device) {
  const auto stats = [&] {
    py::gil_scoped_release no_gil;
    return allocator::getDeviceStats(device);
  }();
  py::dict out;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  auto add = [&](const char* name, const c10::CachingAllocator::StatArray& a) {
    for (size_t i = 0; i < 3; ++i) {
      const std::string prefix = std::string(name) + "." + pools[i] + ".";
      out[py::str(prefix + "current")] = a[i].current;
      out[py::str(prefix + "peak")] = a[i].peak;
      out[py::str(prefix + "allocated")] = a[i].allocated;
      out[py::str(prefix + "freed")] = a[i].freed;
    }
  };
  add("allocation", stats.allocation);
  add("segment", stats.segment);
  add("active", stats.active);
  add("inactive_split", stats.inactive_split);
  add("allocated_bytes", stats.allocated_bytes);
  add("reserved_bytes", stats.reserved_bytes);
  add("active_bytes", stats.active_bytes);
  add("inactive_split_bytes", stats.inactive_split_bytes);
  add("requested_bytes", stats.requested_bytes);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  // The other keys torch.accelerator.memory_stats() gives, from the same stats (openreg's allocator
  // has no split-size limit and never synchronises all streams: these stay 0).
  auto add_stat = [&](const std::string& name, const c10::CachingAllocator::Stat& stat) {
    out[py::str(name + ".current")] = stat.current;
    out[py::str(name + ".peak")] = stat.peak;
    out[py::str(name + ".allocated")] = stat.allocated;
    out[py::str(name + ".freed")] = stat.freed;
  };
  add_stat("oversize_allocations", stats.oversize_allocations);
  add_stat("oversize_segments", stats.oversize_segments);
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["max_split_size"] = stats.max_split_size;
  return out;
}

py::list snapshot_list() {
  const auto snapshot = [] {
    py::gil_scoped_release no_gil;
    return allocator::snapshot();
  }();
  py::list segments;
  for (const auto& seg : snapshot) {
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = reinterpret_cast<uintptr_t>(seg.stream);
    d["segment_type"] = seg.is_large ? "large" : "small";
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
      blocks.append(bd);
    }
    d["blocks"] = blocks;
    segments.append(d);
  }
  return segments;
}

// A host thread that sleeps waiting for the device lets go of the GIL: kernels written in Python
// (torch.library custom ops on the generic path) take it on the stream's worker, and a wait made
// with the GIL held (torch's storage copy, behind torch.save) would otherwise never end.
void* release_gil_while_waiting() {
  return Py_IsInitialized() && PyGILState_Check() ? static_cast<void*>(PyEval_SaveThread()) : nullptr;
}

void take_gil_back(void* state) {
  if (state != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(state));
}

// torch_openreg._C._empty_strided(size, stride, dtype, device index; -1: the current device).
// openreg-inductor's wrapper allocates its buffers with it, as CUDA's wrapper with
// torch._C._dynamo.guards._empty_strided_cuda: a fast-call function that reads its tuples
// directly, a quarter of the Python call of torch.empty_strided (Python's argument parser and
// the dispatcher) and half of a pybind11 binding.
bool read_ints(PyObject* seq, c10::SmallVector<int64_t, 8>& out, const char* what) {
  TORCH_CHECK_TYPE(PyTuple_Check(seq) || PyList_Check(seq), "_empty_strided: ", what, " must be a tuple of ints");
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    TORCH_CHECK_TYPE(PyLong_Check(items[i]), "_empty_strided: ", what, " must be a tuple of ints");
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

PyObject* empty_strided_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs == 4, "_empty_strided(size, stride, dtype, device_index) takes 4 arguments, got ", nargs);
  c10::SmallVector<int64_t, 8> size, stride;
  if (!read_ints(args[0], size, "size") || !read_ints(args[1], stride, "stride")) return nullptr;
  TORCH_CHECK_VALUE(size.size() == stride.size(), "_empty_strided: ", size.size(), " sizes but ", stride.size(),
                    " strides");
  TORCH_CHECK_TYPE(THPDtype_Check(args[2]), "_empty_strided: dtype must be a torch.dtype");
  TORCH_CHECK_TYPE(PyLong_Check(args[3]), "_empty_strided: device_index must be an int");
  const long long d = PyLong_AsLongLong(args[3]);
  if (d == -1 && PyErr_Occurred()) return nullptr;
  if (d != -1) check_device_index(d);  // before narrowing; -1 alone means the current device
  const c10::DeviceIndex device = d == -1 ? current_device() : static_cast<c10::DeviceIndex>(d);
  const c10::ScalarType dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  at::Tensor out;
  {
    // As every reader of the allocator (see stats_dict), and as torch.empty_strided's binding.
    py::gil_scoped_release no_gil;
    out = empty_strided_on(size, stride, dtype, device);
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

PyMethodDef kEmptyStridedDef = {"_empty_strided",
                                reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(empty_strided_fast)),
                                METH_FASTCALL, nullptr};

// torch_openreg._C._DeviceGuard(index) (torch.openreg._DeviceGuard): the device guard
// openreg-inductor's wrappers enter around a graph (`with torch.openreg._DeviceGuard(0):`), as
// torch.cuda._DeviceGuard is CUDA's. A C type: as a Python class calling two bindings it cost 0.65
// us per compiled call, a third of what the wrapper may spend above CPU Inductor's (issue #16).
// A negative index leaves the device alone; an index past the devices raises at __enter__.
struct DeviceGuardObject {
  PyObject ob_base;  // PyObject_HEAD
  int64_t index;
  int previous;  // the device current at __enter__, restored at __exit__; -1: none
};

PyObject* device_guard_new(PyObject* type, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  TORCH_CHECK_TYPE(nargs == 1 && kwnames == nullptr, "_DeviceGuard(index) takes 1 positional argument");
  TORCH_CHECK_TYPE(PyLong_Check(args[0]), "_DeviceGuard: the device index must be an int");
  const long long d = PyLong_AsLongLong(args[0]);
  if (d == -1 && PyErr_Occurred()) return nullptr;
  auto* self = PyObject_New(DeviceGuardObject, reinterpret_cast<PyTypeObject*>(type));
  if (self == nullptr) return nullptr;
  self->index = d;
  self->previous = -1;
  return reinterpret_cast<PyObject*>(self);
  END_HANDLE_TH_ERRORS
}

PyObject* device_guard_enter(PyObject* self, PyObject*) {
  HANDLE_TH_ERRORS
  auto* guard = reinterpret_cast<DeviceGuardObject*>(self);
  if (guard->index >= 0) {
    check_device_index(guard->index);
    guard->previous = exchange_device(static_cast<c10::DeviceIndex>(guard->index));
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* device_guard_exit(PyObject* self, PyObject* const*, Py_ssize_t) {
  HANDLE_TH_ERRORS
  auto* guard = reinterpret_cast<DeviceGuardObject*>(self);
  if (guard->previous >= 0) set_device(static_cast<c10::DeviceIndex>(guard->previous));
  guard->previous = -1;
  Py_RETURN_NONE;  // falsy: an exception raised inside goes on
  END_HANDLE_TH_ERRORS
}

PyMethodDef kDeviceGuardMethods[] = {
    {"__enter__", device_guard_enter, METH_NOARGS, nullptr},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(device_guard_exit)), METH_FASTCALL,
     nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject* device_guard_type() {
  static PyTypeObject type = [] {
    PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
    t.tp_name = "torch_openreg._C._DeviceGuard";
    t.tp_basicsize = sizeof(DeviceGuardObject);
    t.tp_flags = Py_TPFLAGS_DEFAULT;
    t.tp_doc = "Makes an openreg device current for a with block (compiled code's device guard).";
    t.tp_methods = kDeviceGuardMethods;
    t.tp_vectorcall = device_guard_new;  // the constructor: `_DeviceGuard(0)` calls the type
    return t;
  }();
  return &type;
}

// The storages this process sent through torch.multiprocessing, each kept until its receivers' copies
// are gone, as torch keeps a CUDA storage it sent (CudaIPCSentData). A send takes a slot: an int64 in
// a slab of CPU memory shared with the receivers (made by ipc.py; it travels with the message), which
// holds the send's generation and how many receivers hold the storage (ipc_slot below); the last
// receiver's storage to die zeroes it (_ipc_open). The storages whose slot is 0 again are dropped at
// each send, and by the allocator before it empties its cache or reports out of memory (a free-memory
// callback, as CUDA's CudaIPCCollectCallback): torch.accelerator.empty_cache() gives them back too.
// Slots change by compare-and-swap: the sender (take) and receivers may meet on one. Storages are
// dropped after the lock is released: the last reference to one may free device memory or release
// its Python object.
namespace ipc_slot {
// A kept slot: the generation above bit 21, bit 20 once a receiver opened it, the receivers that
// hold it in the bits below. 0: released (or free).
constexpr int kGenerationShift = 21;
constexpr int64_t kOpened = int64_t{1} << 20;
constexpr int64_t kHolders = kOpened - 1;
inline int64_t kept(int64_t generation) { return generation << kGenerationShift; }
inline bool of(int64_t value, int64_t generation) { return value != 0 && (value >> kGenerationShift) == generation; }

// A receiver lets go of the storage: the last one releases the slot (0), and the sender may free it.
// A slot already released, or taken by a later send, is left alone.
inline void release_hold(std::atomic<int64_t>* slot, int64_t generation) {
  int64_t value = slot->load(std::memory_order_relaxed);
  int64_t next = 0;
  do {
    if (!of(value, generation) || (value & kHolders) == 0) return;
    next = (value & kHolders) == 1 ? 0 : value - 1;
  } while (!slot->compare_exchange_weak(value, next, std::memory_order_acq_rel, std::memory_order_relaxed));
}
}  // namespace ipc_slot

class SentStorages {
 public:
  static constexpr int64_t kSlots = 1024;

  // The (slab, slot) the receiver zeroes and the send's generation, or nothing when every slab of
  // the sharing strategy is full (add_slab, then again). The slot holds the generation while the
  // storage is kept: a message read after its slot went to a later send finds another number there
  // (_ipc_open, take). Slabs are per torch.multiprocessing sharing strategy: a slab shared by file
  // name cannot travel as a file descriptor, nor the other way round (torch aborted the process).
  std::optional<std::tuple<int64_t, int64_t, int64_t>> keep(c10::Storage storage, const std::string& strategy) {
    std::vector<Kept> released;
    std::lock_guard<std::mutex> lock(mu_);
    released = take_released();
    auto& free = free_[strategy];
    if (free.empty()) return std::nullopt;
    const auto key = free.back();
    free.pop_back();
    const int64_t generation = ++generation_;
    slot(key).store(ipc_slot::kept(generation), std::memory_order_relaxed);  // read by receivers after the message
    const void* memory = storage.data();
    kept_.emplace(key, Kept{std::move(storage), generation, memory, c10::Storage()});
    count_.store(kept_.size(), std::memory_order_relaxed);
    return std::make_tuple(key.first, key.second, generation);
  }

  void add_slab(const at::Tensor& slab, const std::string& strategy) {
    TORCH_CHECK(slab.device().is_cpu() && slab.scalar_type() == at::kLong && slab.dim() == 1 && slab.is_contiguous() &&
                    slab.numel() == kSlots,
                "_ipc_add_slab: a slab is a contiguous 1-D int64 CPU tensor of ", kSlots, " elements");
    std::lock_guard<std::mutex> lock(mu_);
    slabs_.push_back(slab);
    strategies_.push_back(strategy);
    const auto index = static_cast<int64_t>(slabs_.size()) - 1;
    for (int64_t i = kSlots - 1; i >= 0; --i) free_[strategy].emplace_back(index, i);
  }

  at::Tensor slab(int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(slabs_.size()), "no IPC slab ", index);
    return slabs_[index];
  }

  // A message read back in the process that sent it: the storage kept for that send. Its slot is
  // freed unless a receiver holds the storage too: then it stays kept for that receiver (the
  // reading's storage shares it), and the sender's tensor dying frees nothing under the receiver.
  // Nothing when the slot was released since, or went to a later send.
  std::optional<c10::Storage> take(int64_t slab, int64_t index, int64_t generation) {
    c10::Storage parked;  // dropped after the lock
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.find({slab, index});
    if (it == kept_.end() || it->second.generation != generation) return std::nullopt;
    auto& value = slot({slab, index});
    int64_t expected = ipc_slot::kept(generation);  // no receiver has opened it
    if (!value.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
      if (!ipc_slot::of(expected, generation)) return std::nullopt;  // released meanwhile
      return it->second.storage;                                     // a receiver holds it: still kept for it
    }
    c10::Storage storage = std::move(it->second.storage);
    parked = std::move(it->second.parked);
    kept_.erase(it);
    count_.store(kept_.size(), std::memory_order_relaxed);
    free_[strategies_[slab]].emplace_back(slab, index);
    return storage;
  }

  // Whether anything was dropped.
  bool collect() {
    std::vector<Kept> released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      released = take_released();
    }
    return !released.empty();
  }

  size_t size() const { return count_.load(std::memory_order_relaxed); }

  // The sender resizes a storage (resize_storage_bytes, before the storage lets go of its memory):
  // the memory stays allocated while a send of it is kept, and is freed with the last such send.
  // Before, the allocator took the block back at once and gave it to the sender's next tensor,
  // which the receivers then read and wrote. The memory is kept by a copy-on-write alias of the
  // storage (c10's lazy clone: a reference to the memory, no copy), so a storage that shares its
  // memory with a lazy clone of its own is kept right too. Only the memory a send shared is kept
  // (a storage sent, resized and sent again keeps its first memory for the first send).
  void park(c10::StorageImpl* storage) {
    if (size() == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    c10::Storage parked;
    for (auto& [key, kept] : kept_) {
      if (kept.storage.unsafeGetStorageImpl() != storage || kept.memory != storage->data()) continue;
      if (!parked) {
        auto alias = c10::impl::cow::lazy_clone_storage(*storage);
        TORCH_INTERNAL_ASSERT(alias, "openreg's device memory is a plain allocation: it has a lazy clone");
        parked = c10::Storage(std::move(alias));
      }
      kept.parked = parked;
    }
  }

 private:
  using Key = std::pair<int64_t, int64_t>;
  struct Kept {
    c10::Storage storage;
    int64_t generation;
    const void* memory;   // what the send shared
    c10::Storage parked;  // that memory, once the storage let go of it (park)
  };

  std::atomic<int64_t>& slot(Key key) {
    static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t));
    return *reinterpret_cast<std::atomic<int64_t>*>(slabs_[key.first].data_ptr<int64_t>() + key.second);
  }

  std::vector<Kept> take_released() {
    std::vector<Kept> out;
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (slot(it->first).load(std::memory_order_acquire) == 0) {  // the receiver's deleter is done
        out.push_back(std::move(it->second));
        free_[strategies_[it->first.first]].push_back(it->first);
        it = kept_.erase(it);
      } else {
        ++it;
      }
    }
    count_.store(kept_.size(), std::memory_order_relaxed);
    return out;
  }

  std::mutex mu_;
  std::vector<at::Tensor> slabs_;
  std::vector<std::string> strategies_;           // of each slab
  std::map<std::string, std::vector<Key>> free_;  // by strategy
  std::map<Key, Kept> kept_;
  int64_t generation_ = 0;
  std::atomic<size_t> count_{0};
};

// Never destroyed: storages may be dropped during interpreter shutdown.
SentStorages& sent_storages() {
  static auto* sent = new SentStorages();
  return *sent;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  // After every static registration of libtorch_openreg (and before any op runs).
  route_structured_ops();
  sparse::route_sparse_ops();
  nested::route_nested_ops();
  OPENREG_CHECK(orSetBlockingWaitHooks(&release_gil_while_waiting, &take_gil_back));
  allocator::registerFreeMemoryCallback(
      {+[] { return sent_storages().size() > 0; }, +[] { return sent_storages().collect(); }});
  set_shared_memory_keeper(+[](c10::StorageImpl* storage) { sent_storages().park(storage); });
  m.doc() = "openreg runtime and PyTorch integration (internal; use torch.openreg)";

  // devices
  m.def("_device_count", [] { return static_cast<int>(device_count()); });
  m.def("_device_count_error", [] { return device_count_error(); });
  // As CUDA's initialisation does: in a child forked after it, torch forgets that openreg was
  // initialised, so the next factory calls torch.openreg._lazy_init() again, which refuses the bad
  // fork in its own words (the runtime's guard would answer otherwise, naming 'spawn' too).
  m.def("_register_fork_handler",
        [] { torch::utils::register_fork_handler_for_device_init(c10::DeviceType::PrivateUse1); });
  m.def("_get_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int64_t d) { set_device(device_index(d)); });
  m.def("_exchange_device", [](int64_t d) {
    if (d < 0) return -1;
    return static_cast<int>(exchange_device(device_index(d)));
  });
  m.def("_check_device_index", [](int64_t d) { check_device_index(d); });
  m.def("_abandon_open_captures", [] {
    py::gil_scoped_release no_gil;
    return abandon_open_captures();
  });
  // A one-element backward per device, queued behind what autograd's device threads still hold of
  // earlier passes (see torch_openreg/openreg/__init__.py::_finish_queued_work_at_exit). Built in
  // C++, without the GIL, so that none of its tensors has a Python object for a device thread to
  // release in turn. Of a view of an empty tensor: it allocates nothing and launches no kernel, so
  // the user's strict mode and armed faults (core's own work at exit is not theirs) cannot refuse
  // it; with zeros and mul it failed under strict mode, naming an 'aten::zero_' the program never
  // called.
  m.def("_settle_autograd_device_threads", [](int count) {
    py::gil_scoped_release no_gil;
    c10::InferenceMode no_inference(false);
    at::AutoGradMode grad(true);
    const std::vector<int64_t> empty{0};
    for (int d = 0; d < count; ++d) {
      at::Tensor leaf = at::empty(empty, at::TensorOptions().device(c10::DeviceType::PrivateUse1, device_index(d)))
                            .requires_grad_(true);
      at::Tensor out = leaf.view(empty);
      torch::autograd::backward({out}, {at::empty_like(out)});
    }
  });
  m.def("_synchronize", [](int64_t d) {
    py::gil_scoped_release no_gil;
    const auto previous = exchange_device(device_index(d));
    orStatus st = orDeviceSynchronize();
    exchange_device(previous);
    OPENREG_CHECK(st);
  });
  m.def("_get_device_properties", [](int64_t d) {
    orDeviceProp prop;
    OPENREG_CHECK(orGetDeviceProperties(&prop, d));
    py::dict out;
    out["name"] = std::string(prop.name);
    out["total_memory"] = prop.totalGlobalMem;
    out["multi_processor_count"] = prop.multiProcessorCount;
    out["major"] = prop.major;
    out["minor"] = prop.minor;
    return out;
  });
  m.def("_mem_get_info", [](int64_t d) {
    const auto previous = exchange_device(device_index(d));
    size_t free_bytes = 0, total = 0;
    orStatus st = orMemGetInfo(&free_bytes, &total);
    exchange_device(previous);
    OPENREG_CHECK(st);
    return py::make_tuple(free_bytes, total);
  });
  m.def("_runtime_counters", [] {
    orRuntimeCounters c;
    OPENREG_CHECK(orGetCounters(&c));
    py::dict out;
    out["kernels_launched"] = c.kernelsLaunched;
    out["memcpy_h2d"] = c.memcpyHostToDevice;
    out["memcpy_d2h"] = c.memcpyDeviceToHost;
    out["memcpy_d2d"] = c.memcpyDeviceToDevice;
    out["bytes_h2d"] = c.bytesHostToDevice;
    out["bytes_d2h"] = c.bytesDeviceToHost;
    out["bytes_d2d"] = c.bytesDeviceToDevice;
    out["device_mallocs"] = c.deviceMallocs;
    out["device_frees"] = c.deviceFrees;
    out["wait_wakeups"] = c.waitWakeups;
    out["graphs_launched"] = c.graphsLaunched;
    out["graph_items_launched"] = c.graphItemsLaunched;
    out["memcpy_on_caller"] = c.memcpyOnCaller;
    out["events_created"] = c.eventsCreated;
    out["events_destroyed"] = c.eventsDestroyed;
    out["streams_created"] = c.streamsCreated;
    out["streams_destroyed"] = c.streamsDestroyed;
    return out;
  });

  // fault injection (tests): the OPENREG_FAULTS syntax, "" disarms
  m.def("_inject_faults", [](const std::string& spec) { OPENREG_CHECK(orInjectFaults(spec.c_str())); });

  // streams
  m.def("_get_current_stream", [](int64_t d) { return pack(getCurrentOpenRegStream(device_index(d))); });
  m.def("_get_default_stream", [](int64_t d) { return pack(getDefaultOpenRegStream(device_index(d))); });
  m.def("_set_current_stream", [](int64_t id, int64_t d, int) {
    const OpenRegStream stream = stream_of(id, d);
    // First: a made-up, destroyed or another device's stream is refused here, not by every later op
    // on the thread (another device's stream would escape this device's synchronize).
    checkExternalOpenRegStream(stream);
    setCurrentOpenRegStream(stream);
    // As torch.cuda.set_stream: the stream's device becomes current too, so that the work that
    // follows on the current device goes to the stream.
    exchange_device(stream.device_index());
  });
  // The runtime handle (orStream_t as an integer) of a stream and of the current one: what compiled
  // code passes to orLaunchKernel (openreg-inductor's wrapper asks once per graph).
  m.def("_stream_handle", [](int64_t id, int64_t d) { return reinterpret_cast<uintptr_t>(stream_of(id, d).handle()); });
  m.def("_current_raw_stream",
        [](int64_t d) { return reinterpret_cast<uintptr_t>(getCurrentOpenRegStream(device_index(d)).handle()); });
  if (PyType_Ready(device_guard_type()) < 0) throw py::error_already_set();
  m.attr("_DeviceGuard") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(device_guard_type()));
  m.attr("_empty_strided") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kEmptyStridedDef, nullptr, m.attr("__name__").ptr()));
  m.def("_stream_priority", [](int64_t id, int64_t d) { return stream_of(id, d).priority(); });
  m.def("_stream_priority_range", [] {
    int least = 0, greatest = 0;
    OPENREG_CHECK(orDeviceGetStreamPriorityRange(&least, &greatest));
    return py::make_tuple(least, greatest);
  });

  m.def("_event_elapsed_time", [](uintptr_t start, uintptr_t end) {
    TORCH_CHECK(start != 0 && end != 0, "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, reinterpret_cast<orEvent_t>(start), reinterpret_cast<orEvent_t>(end)));
    return ms;
  });

  // memory
  m.def("_memory_stats", [](int64_t d) { return stats_dict(device_index(d)); });
  m.def("_memory_snapshot", [] { return snapshot_list(); });
  m.def("_empty_cache", [] {
    py::gil_scoped_release no_gil;
    // Both caches are emptied, also when the first one's waits report a failed kernel; each failure
    // was taken from its device once, so both are reported.
    std::vector<std::string> failures;
    for (auto* empty : {&allocator::emptyCache, &host_allocator::empty_cache}) {
      try {
        empty();
      } catch (const c10::Error& e) {
        failures.push_back(e.what_without_backtrace());
      }
    }
    TORCH_CHECK(failures.empty(), c10::Join("; and ", failures));
  });
  m.def(
      "_reset_peak_memory_stats", [](int64_t d) { allocator::resetPeakStats(device_index(d)); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_reset_accumulated_memory_stats", [](int64_t d) { allocator::resetAccumulatedStats(device_index(d)); },
      py::call_guard<py::gil_scoped_release>());

  // launch sizing: kernels below this many bytes of tensor arguments run with one thread
  m.def("_small_kernel_bytes", [] { return small_kernel_bytes(); });

  // random
  m.def("_get_default_generator", [](int64_t d) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(device_index(d))));
  });

  // the generic operator path
  m.def("_fallback_counts", [] { return fallback_counts(); });
  m.def("_reset_fallback_counts", [] { reset_fallback_counts(); });
  m.def("_native_meta_operators", [] { return native_meta_operators(); });
  m.def("_routed_out_overload", [](const std::string& name) { return routed_out_overload(name); });
  m.def("_generic_launches_alive", [] { return generic_launches_alive(); });
  // For a test only: the locks a forked child must leave alone (lazy-init-fork.md), taken by this
  // thread as if another thread held them at a fork; released by the same thread.
  m.def("_hold_locks_for_fork_test", [](bool hold) {
    if (hold) {
      c10::openreg::allocator::hold_lock_for_test(0, true);
      c10::openreg::host_allocator::hold_lock_for_test(true);
      hold_locks_for_test(true);
    } else {
      hold_locks_for_test(false);
      c10::openreg::host_allocator::hold_lock_for_test(false);
      c10::openreg::allocator::hold_lock_for_test(0, false);
    }
  });
  m.def("_set_strict_mode", [](bool s) { set_strict_mode(s); });
  m.def("_get_strict_mode", [] { return strict_mode(); });

  // backend metadata on tensors
  m.def("_set_backend_meta",
        [](const at::Tensor& t, int64_t format, bool compressed) { set_backend_meta(t, format, compressed); });
  m.def("_get_backend_meta", [](const at::Tensor& t) -> py::object {
    const auto* meta = get_backend_meta(t);
    if (meta == nullptr) return py::none();
    return py::make_tuple(meta->format, meta->compressed);
  });
  m.def("_clear_backend_meta", [](const at::Tensor& t) { clear_backend_meta(t); });

  // sharing device memory with other processes (runtime IPC handles)
  m.def("_ipc_export", [](uintptr_t ptr) {
    orIpcMemHandle_t handle;
    OPENREG_CHECK(orIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)));
    orPointerAttributes attr;
    OPENREG_CHECK(orPointerGetAttributes(&attr, reinterpret_cast<void*>(ptr)));
    const auto offset = ptr - reinterpret_cast<uintptr_t>(attr.base);
    return py::make_tuple(py::bytes(reinterpret_cast<const char*>(handle.reserved), sizeof(handle.reserved)), offset,
                          attr.size);
  });
  // what this process sent (SentStorages); a storage travels as a uint8 tensor over it
  m.attr("_IPC_SLOTS") = SentStorages::kSlots;
  m.def("_ipc_keep", [](const at::Tensor& over, const std::string& strategy) {
    return sent_storages().keep(over.storage(), strategy);
  });
  m.def("_ipc_add_slab",
        [](const at::Tensor& slab, const std::string& strategy) { sent_storages().add_slab(slab, strategy); });
  m.def("_ipc_slab", [](int64_t index) { return sent_storages().slab(index); });
  m.def("_ipc_take", [](int64_t slab, int64_t slot, int64_t generation) -> std::optional<at::Tensor> {
    auto storage = sent_storages().take(slab, slot, generation);
    if (!storage) return std::nullopt;
    return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage->device()))
        .set_(*storage, 0, {static_cast<int64_t>(storage->nbytes())}, {1});
  });
  m.def("_ipc_kept_count", [] { return sent_storages().size(); });
  // A uint8 tensor over `nbytes` at `offset` in the allocation the handle names;
  // its storage closes the mapping when it dies, then, given a `release` slot (an int64 element of
  // memory shared with the sender, see SentStorages) that holds the send's `generation`, counts this
  // receiver among its holders until then: the last one zeroes it, and the sender may free its
  // storage from then on. A slot that no longer holds the generation was released already: the
  // sender may have freed or reused the memory, which is refused.
  m.def("_ipc_open", [](const py::bytes& data, int64_t device, size_t offset, size_t nbytes,
                        std::optional<at::Tensor> release, int64_t slot, int64_t generation) {
    const std::string raw = data;
    TORCH_CHECK(raw.size() == sizeof(orIpcMemHandle_t), "an openreg IPC handle has ", sizeof(orIpcMemHandle_t),
                " bytes, got ", raw.size());
    check_device_index(device);
    static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t));
    std::atomic<int64_t>* release_slot = nullptr;
    c10::Storage release_storage;
    if (release) {
      TORCH_CHECK(release->device().is_cpu() && release->scalar_type() == at::kLong && release->dim() == 1 &&
                      release->is_contiguous() && slot >= 0 && slot < release->numel(),
                  "_ipc_open: the release slot must be an element of a 1-D int64 CPU tensor");
      release_storage = release->storage();
      release_slot = reinterpret_cast<std::atomic<int64_t>*>(release->data_ptr<int64_t>() + slot);
      // This receiver holds the storage from now on (released below if the open fails).
      int64_t value = release_slot->load(std::memory_order_acquire);
      do {
        TORCH_CHECK(
            generation > 0 && ipc_slot::of(value, generation) && (value & ipc_slot::kHolders) < ipc_slot::kHolders,
            "this openreg tensor was received before and released since: its sender may have freed its "
            "memory (a torch.multiprocessing message is read once, or again while a tensor read from it "
            "lives)");
      } while (!release_slot->compare_exchange_weak(value, (value + 1) | ipc_slot::kOpened, std::memory_order_acq_rel));
    }
    orIpcMemHandle_t handle;
    std::memcpy(handle.reserved, raw.data(), raw.size());
    void* base = nullptr;
    try {
      OPENREG_CHECK(orIpcOpenMemHandle(&base, handle));
      orPointerAttributes attr;
      OPENREG_CHECK(orPointerGetAttributes(&attr, base));
      if (attr.device != device || offset > attr.size || nbytes > attr.size - offset) {  // no wrap-around
        orIpcCloseMemHandle(base);
        TORCH_CHECK(false, "IPC handle does not match the tensor: allocation of ", attr.size,
                    " bytes on openreg:", attr.device, ", asked for ", nbytes, " bytes at offset ", offset,
                    " on openreg:", device);
      }
    } catch (...) {
      if (release_slot != nullptr) ipc_slot::release_hold(release_slot, generation);
      throw;
    }
    struct Opened {
      void* base;
      c10::Storage release;  // keeps the shared slot mapped until it is written
      std::atomic<int64_t>* slot;
      int64_t generation;
    };
    auto* opened = new Opened{base, std::move(release_storage), release_slot, generation};
    return at::for_blob(static_cast<char*>(base) + offset, {static_cast<int64_t>(nbytes)})
        .context(opened,
                 [](void* ctx) {
                   std::unique_ptr<Opened> o(static_cast<Opened*>(ctx));
                   // A child forked from the receiver inherits the storage, and the runtime refuses
                   // its calls: its copy dying must not release the sender's memory while the
                   // receiver still reads it. The hold is released only after a successful close,
                   // and only on this send's slot (one released and taken by a later send keeps
                   // that send's storage).
                   const orStatus closed = orIpcCloseMemHandle(o->base);
                   if (o->slot != nullptr && closed == orSuccess) ipc_slot::release_hold(o->slot, o->generation);
                 })
        .options(at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::DeviceType::PrivateUse1, device)))
        .make_tensor();
  });
}
