// Devices: configuration, lazy initialisation, the per-thread current device,
// device-wide synchronisation, kernel error reporting and fork detection.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "runtime_internal.h"

namespace openreg::rt {

std::atomic<bool> g_forked{false};

namespace {

constexpr size_t kDefaultCapacity = size_t{8} << 30;  // 8 GiB per device
constexpr int kDefaultDeviceCount = 2;
constexpr int kMaxDeviceCount = 64;
// The device's kernels run on the same cores as the host, and a spinning thread may take a core
// from a kernel's OpenMP team: an idle worker spins briefly; a waiting host thread spins longer, but
// only while the running kernels leave it a CPU, and a worker waiting for another stream 5 us at
// most (Progress::wait_for; docs/benchmarks.md, "Thread budget").
constexpr long kDefaultSpinUs = 20;        // an idle worker, for the next launch
constexpr long kDefaultWaitSpinUs = 2000;  // a host thread waiting for progress (synchronize, a copy)
constexpr long kMaxSpinUs = 1000000;       // a second

// strtol and strtoull take leading blanks and a sign ("-1" read as 2^64 - 1 bytes wrapped to 0
// pages): a setting must start with a digit.
bool starts_with_digit(const char* text) { return *text >= '0' && *text <= '9'; }

// Parses a whole number from `lo` to `hi`. Returns false when malformed or out of range.
bool parse_whole(const char* text, long lo, long hi, long* out) {
  if (!starts_with_digit(text)) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Reads the whole number in environment variable `name`, from `lo` to `hi`, into `out` (left as
// it is when unset). A malformed value sets `error`, naming the variable; `unit` says what it counts.
void read_whole_env(const char* name, long lo, long hi, const char* unit, long* out, std::string* error) {
  const char* env = std::getenv(name);
  if (env == nullptr) return;
  if (!parse_whole(env, lo, hi, out))
    *error = std::string(name) + "='" + env + "' is not a whole number" + unit + " from " + std::to_string(lo) +
             " to " + std::to_string(hi);
}

// The largest device: each device reserves its arena twice in the address space (device and
// kernel views), and 64 devices of this size take half the 128 TiB a 64-bit process has (at 1 TiB,
// device 63 found no room left to map).
constexpr size_t kMaxCapacity = size_t{1} << 39;

// Parses "123", "512M", "4G", "64K" (binary units) up to kMaxCapacity. Returns false when malformed.
bool parse_bytes(const char* text, size_t* out) {
  if (!starts_with_digit(text)) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0':
      break;
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    default:
      return false;
  }
  if (*end == 'i' || *end == 'B') ++end;
  if (*end == 'B') ++end;
  if (*end != '\0' || v == 0 || v > (kMaxCapacity >> shift)) return false;
  *out = static_cast<size_t>(v) << shift;
  return true;
}

// Whether any call but orGetDeviceCount and orGetDevice has reached the runtime: from then on it
// may hold state of the parent's (devices, pinned memory, events, locks another thread holds at the
// fork).
std::atomic<bool> g_used{false};

// In a forked child. A runtime the parent used is the parent's: the child's refuses every call. A
// parent that had only read the configuration (the device count, as torch.openreg.device_count()
// does) or its thread's current index (torch.openreg.manual_seed before first use) used nothing,
// and its child starts afresh, as CUDA's child after an NVML device count.
void mark_forked() {
  if (g_used.load()) g_forked.store(true);
}

Runtime* create_runtime() {
  auto* rt = new Runtime();
  long count = kDefaultDeviceCount;
  read_whole_env("OPENREG_DEVICE_COUNT", 1, kMaxDeviceCount, "", &count, &rt->config_error);
  rt->device_count = static_cast<int>(count);
  rt->capacity = kDefaultCapacity;
  if (const char* env = std::getenv("OPENREG_DEVICE_MEMORY")) {
    size_t bytes = 0;
    if (!parse_bytes(env, &bytes))
      rt->config_error =
          "OPENREG_DEVICE_MEMORY='" + std::string(env) + "' is not a size such as 512M or 8G (at most 512G)";
    else
      rt->capacity = (bytes + platform::page_size() - 1) / platform::page_size() * platform::page_size();
  }
  long spin_us = kDefaultSpinUs;
  read_whole_env("OPENREG_SPIN_US", 0, kMaxSpinUs, " of microseconds", &spin_us, &rt->config_error);
  rt->spin_ns = static_cast<uint64_t>(spin_us) * 1000;
  long wait_spin_us = kDefaultWaitSpinUs;
  read_whole_env("OPENREG_WAIT_SPIN_US", 0, kMaxSpinUs, " of microseconds", &wait_spin_us, &rt->config_error);
  rt->wait_spin_ns = static_cast<uint64_t>(wait_spin_us) * 1000;
  long launch_blocking = 0;
  read_whole_env("OPENREG_LAUNCH_BLOCKING", 0, 1, "", &launch_blocking, &rt->config_error);
  rt->launch_blocking = launch_blocking != 0;
  faults_from_env(rt->device_count, &rt->config_error);
  rt->devices.reset(new Device[rt->device_count]);
  for (int i = 0; i < rt->device_count; ++i) rt->devices[i].index = i;
  platform::on_fork_child(mark_forked);
  return rt;
}

thread_local int t_current_device = 0;

}  // namespace

Runtime& runtime() {
  static Runtime* rt = create_runtime();  // intentionally leaked
  return *rt;
}

int& current_device_index() { return t_current_device; }

orStatus check_config() {
  Runtime& rt = runtime();
  if (g_forked.load(std::memory_order_relaxed))
    return fail(orErrorForkedProcess,
                "the openreg runtime was started in the parent process and cannot be used in a "
                "forked child; start worker processes with the 'spawn' method");
  if (!rt.config_error.empty()) return fail(orErrorInitialization, rt.config_error);
  return orSuccess;
}

orStatus check_runtime() {
  // Read before written: after the first call, every call only reads the flag (no cache-line
  // transfer between threads on the launch path).
  if (!g_used.load(std::memory_order_relaxed)) g_used.store(true);
  return check_config();
}

orStatus check_device_index(int index) {
  if (index >= 0 && index < runtime().device_count) return orSuccess;
  return fail(orErrorInvalidDevice, "device index " + std::to_string(index) + " is out of range: there are " +
                                        std::to_string(runtime().device_count) + " openreg devices");
}

orStatus get_device(int index, Device** out) {
  Runtime& rt = runtime();
  if (orStatus st = check_device_index(index)) return st;
  Device& dev = rt.devices[index];
  if (!dev.ready.load(std::memory_order_acquire)) {
    std::call_once(dev.init_once, [&] {
      if (!platform::create_dual_mapping(rt.capacity, &dev.arena, &dev.init_error)) {
        dev.init_status = orErrorInitialization;
        return;
      }
      dev.free_blocks[0] = rt.capacity;
      uintptr_t handle = 0;
      Stream* s = rt.streams.acquire(&handle);
      s->init(handle, index, 0, /*default_stream=*/true);
      dev.default_stream = reinterpret_cast<orStream_t>(handle);
      dev.streams.push_back(s);
      dev.ready.store(true, std::memory_order_release);
    });
    if (dev.init_status != orSuccess)
      return fail(dev.init_status, "device " + std::to_string(index) + ": " + dev.init_error);
  }
  *out = &dev;
  return orSuccess;
}

orStatus current_device(Device** out) { return get_device(t_current_device, out); }

Device* device_of(const void* ptr) {
  Runtime& rt = runtime();
  auto p = reinterpret_cast<uintptr_t>(ptr);
  for (int i = 0; i < rt.device_count; ++i) {
    Device& dev = rt.devices[i];
    if (!dev.ready.load(std::memory_order_acquire)) continue;
    auto base = reinterpret_cast<uintptr_t>(dev.arena.device_view);
    if (p >= base && p < base + dev.arena.size) return &dev;
  }
  return nullptr;
}

void record_kernel_error(int device, const char* kernel, const char* message) {
  Device& dev = runtime().devices[device];
  std::lock_guard<std::mutex> lock(dev.error_mu);
  if (dev.has_error.load()) return;  // keep the first failure
  std::string text = message ? message : "no message";
  // As CUDA's hint (CUDA_LAUNCH_BLOCKING): the failure is raised by a later call than the launch. A
  // c10::Error's what() ends in a C++ backtrace, which the PyTorch layer cuts off: the hint goes first.
  if (!runtime().launch_blocking) {
    const size_t backtrace = text.find("\nException raised from ");
    text.insert(backtrace == std::string::npos ? text.size() : backtrace,
                "\nopenreg kernel failures are reported by a later synchronizing call, so the traceback may point "
                "past the failing call; set OPENREG_LAUNCH_BLOCKING=1 to report them at the launch");
  }
  dev.error = "kernel '" + std::string(kernel ? kernel : "<unnamed>") + "' failed on openreg device " +
              std::to_string(device) + ": " + text;
  dev.has_error.store(true);
}

orStatus peek_device_error(Device& dev) {
  if (!dev.has_error.load(std::memory_order_acquire)) return orSuccess;
  std::lock_guard<std::mutex> lock(dev.error_mu);
  if (!dev.has_error.load()) return orSuccess;
  return fail(orErrorLaunchFailure, dev.error);
}

orStatus take_device_error(Device& dev) {
  if (!dev.has_error.load(std::memory_order_acquire)) return orSuccess;
  std::lock_guard<std::mutex> lock(dev.error_mu);
  if (!dev.has_error.load()) return orSuccess;
  std::string message = std::move(dev.error);
  dev.error.clear();
  dev.has_error.store(false);
  return fail(orErrorLaunchFailure, message);
}

namespace {
// A snapshot of the device's streams. Stream objects are never freed (their slots are recycled),
// so the pointers stay valid after the lock is released.
std::vector<Stream*> streams_of(Device& dev) {
  std::lock_guard<std::mutex> lock(dev.streams_mu);
  return dev.streams;
}
}  // namespace

void wait_for_streams(Device& dev) {
  for (Stream* s : streams_of(dev)) s->synchronize();
}

void wait_for_all_devices() {
  Runtime& rt = runtime();
  for (int i = 0; i < rt.device_count; ++i)
    if (rt.devices[i].ready.load(std::memory_order_acquire)) wait_for_streams(rt.devices[i]);
}

orStatus synchronize_device(Device& dev) {
  wait_for_streams(dev);
  return take_device_error(dev);
}

}  // namespace openreg::rt

using namespace openreg::rt;

extern "C" {

orStatus orGetDeviceCount(int* count) {
  if (count == nullptr) return fail(orErrorInvalidValue, "count is NULL");
  if (orStatus st = check_config()) return st;  // reads the configuration only: see mark_forked
  *count = runtime().device_count;
  return orSuccess;
}

orStatus orSetDevice(int device) {
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = get_device(device, &dev)) return st;
  current_device_index() = device;
  return orSuccess;
}

orStatus orGetDevice(int* device) {
  if (device == nullptr) return fail(orErrorInvalidValue, "device is NULL");
  if (orStatus st = check_config()) return st;  // the thread's own index: no use (see mark_forked)
  *device = current_device_index();
  return orSuccess;
}

orStatus orGetDeviceProperties(orDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(orErrorInvalidValue, "prop is NULL");
  if (orStatus st = check_runtime()) return st;
  if (orStatus st = check_device_index(device)) return st;
  Runtime& rt = runtime();
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "OpenReg Emulated Device");
  prop->totalGlobalMem = rt.capacity;
  prop->multiProcessorCount = openreg::platform::hardware_threads();
  prop->major = 1;
  prop->minor = 0;
  prop->memoryAlignment = 512;
  return orSuccess;
}

orStatus orDeviceSynchronize(void) {
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = current_device(&dev)) return st;
  if (orStatus st = refuse_wait_from_kernel("orDeviceSynchronize", nullptr, dev->index)) return st;
  // As cudaDeviceSynchronize: waiting for a stream that records into a graph cannot be done.
  orStatus refused = orSuccess;
  for (Stream* s : streams_of(*dev)) {  // every capture of the device is invalidated
    const orStatus st = refuse_while_capturing(
        *s, "cannot synchronize a device while one of its streams is being captured into a graph");
    if (refused == orSuccess) refused = st;
  }
  if (refused != orSuccess) return refused;
  return synchronize_device(*dev);
}

orStatus orDeviceTakeError(int device) {
  if (orStatus st = check_runtime()) return st;
  if (orStatus st = check_device_index(device)) return st;
  return take_device_error(runtime().devices[device]);
}

orStatus orDevicePeekError(int device) {
  if (orStatus st = check_runtime()) return st;
  if (orStatus st = check_device_index(device)) return st;
  return peek_device_error(runtime().devices[device]);
}

int orPointerGetDevice(const void* ptr) {
  if (Device* dev = device_of(ptr)) return dev->index;
  ImportedRange imp;
  return find_import(ptr, &imp) ? imp.device : -1;
}

orStatus orGetCounters(orRuntimeCounters* out) {
  if (out == nullptr) return fail(orErrorInvalidValue, "counters is NULL");
  Counters& c = runtime().counters;
  out->kernelsLaunched = c.kernels.load();
  out->memcpyHostToDevice = c.h2d.load();
  out->memcpyDeviceToHost = c.d2h.load();
  out->memcpyDeviceToDevice = c.d2d.load();
  out->bytesHostToDevice = c.bytes_h2d.load();
  out->bytesDeviceToHost = c.bytes_d2h.load();
  out->bytesDeviceToDevice = c.bytes_d2d.load();
  out->deviceMallocs = c.mallocs.load();
  out->deviceFrees = c.frees.load();
  out->waitWakeups = c.wait_wakeups.load();
  out->graphsLaunched = c.graphs.load();
  out->graphItemsLaunched = c.graph_items.load();
  out->memcpyOnCaller = c.copies_on_caller.load();
  out->eventsCreated = c.events_created.load();
  out->eventsDestroyed = c.events_destroyed.load();
  out->streamsCreated = c.streams_created.load();
  out->streamsDestroyed = c.streams_destroyed.load();
  return orSuccess;
}

}  // extern "C"
