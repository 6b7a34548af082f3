#include "OpenRegStream.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "OpenRegCApi.h"
#include "OpenRegException.h"
#include "OpenRegFunctions.h"

#if defined(__linux__)
// The OpenMP runtime's and MKL's per-thread setters, found in what libtorch loads; weak, so that a
// torch without MKL leaves them null (elsewhere: at::set_num_threads). Core is not compiled with
// OpenMP itself, so omp.h is not included.
extern "C" void omp_set_num_threads(int) __attribute__((weak));
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
#endif

namespace c10::openreg {

namespace {

constexpr int kMaxDevices = 64;
constexpr c10::StreamId kExternalBase = c10::StreamId{1} << 32;

struct DevicePools {
  std::atomic<bool> ready{false};  // set once the pools exist: the hot path skips the checks below
  std::once_flag once;
  orStream_t default_stream = nullptr;
  std::array<orStream_t, 2 * kStreamPoolSize> pooled{};
  std::array<std::atomic<uint32_t>, 2> next{};
};

DevicePools g_pools[kMaxDevices];

DevicePools& pools(c10::DeviceIndex device) {
  if (device >= 0 && device < kMaxDevices && g_pools[device].ready.load(std::memory_order_acquire))
    return g_pools[device];
  check_device_index(device);
  DevicePools& p = g_pools[device];
  std::call_once(p.once, [&] {
    small_kernel_bytes();  // a malformed OPENREG_SMALL_KERNEL_BYTES raises here, at a device's first use
    OPENREG_CHECK(orDeviceGetDefaultStream(device, &p.default_stream));
    int least = 0, greatest = 0;
    OPENREG_CHECK(orDeviceGetStreamPriorityRange(&least, &greatest));
    const auto previous = exchange_device(device);
    for (int i = 0; i < 2 * kStreamPoolSize; ++i)
      OPENREG_CHECK(orStreamCreateWithPriority(&p.pooled[i], 0, i < kStreamPoolSize ? least : greatest));
    exchange_device(previous);
    p.ready.store(true, std::memory_order_release);
  });
  return p;
}

thread_local std::array<c10::StreamId, kMaxDevices> t_current{};

c10::DeviceIndex resolve(c10::DeviceIndex device) { return device < 0 ? current_device() : device; }

c10::Stream make(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

orStream_t handle_of(c10::DeviceIndex device, c10::StreamId id) {
  if (id >= kExternalBase) return reinterpret_cast<orStream_t>(static_cast<uintptr_t>(id));
  DevicePools& p = pools(device);
  if (id == 0) return p.default_stream;
  TORCH_CHECK(id > 0 && id <= 2 * kStreamPoolSize, "invalid openreg stream id ", id);
  return p.pooled[id - 1];
}

// Kernels run on the streams' workers, each of which opens its own OpenMP team; ATen reads a
// thread's team size once, so torch.set_num_threads after a worker's first kernel would not
// reach it. Each launch carries the launching thread's intra-op thread count instead, and the
// worker takes it up before a kernel that brings a different one (as a CPU operator follows
// torch.set_num_threads on its own thread).
//
// A small kernel carries a count of one. The team's other threads share the cores with the host
// thread and the workers, and after each parallel region libgomp keeps them spinning for
// milliseconds; on a loaded core a woken host or worker then waits for the scheduler's next tick
// behind a spinning helper (up to 8 ms on the 2-core VM, against 0.4 ms for the same kernel on the
// CPU). Below about half a MiB of tensor arguments a kernel gains less from a second thread than
// that risk costs (docs/benchmarks.md, "Thread budget"). Launch sites count their tensor
// arguments' bytes with LaunchBytes (OpenRegStream.h) and the capture below takes them; a launch
// that counted none (a compiled kernel) keeps the host's count. A count carries a number unique in
// the process, so that a LaunchBytes dropped on another thread (a kernel's closure, on its worker)
// or after its launch took the count gives nothing back. Threads take the numbers in blocks, so
// that counting touches no memory shared with other threads.
struct PendingLaunchBytes {
  size_t bytes = 0;
  size_t arguments = 0;
  uint64_t id = 0;
  uint64_t next_id = 0, end_id = 0;  // the thread's block of unused numbers
};
thread_local PendingLaunchBytes t_pending;
constexpr uint64_t kCountIdBlock = uint64_t{1} << 20;
std::atomic<uint64_t> g_count_id_blocks{0};

size_t read_small_kernel_bytes() {
  const char* env = std::getenv("OPENREG_SMALL_KERNEL_BYTES");
  if (env == nullptr || *env == '\0') return size_t{512} * 1024;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  TORCH_CHECK(*end == '\0' && env[0] != '-', "OPENREG_SMALL_KERNEL_BYTES must be a byte count, got '", env, "'");
  return static_cast<size_t>(v);
}

uint64_t capture_intra_op_threads() {
  int n = at::get_num_threads();
  if (t_pending.arguments > 0) {
    if (t_pending.bytes < small_kernel_bytes()) n = 1;
    t_pending.bytes = 0;
    t_pending.arguments = 0;
  }
  return static_cast<uint64_t>(n);
}

// What at::set_num_threads sets for the calling thread, without its process-wide parts (the
// recorded count, and the mobile kernels' thread pool, which a different count re-creates): host
// threads that disagree (one that started before the last torch.set_num_threads, such as
// autograd's device thread) make a worker switch between their counts from kernel to kernel.
void set_this_threads_count(int n) {
#if defined(__linux__)
  if (omp_set_num_threads != nullptr) omp_set_num_threads(n);
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(n);
#else
  at::set_num_threads(n);
#endif
}

// Device code cannot warn (a GPU kernel has no way to): a warning a CPU operator raises while it runs
// as a kernel is dropped on every stream's worker, not printed to stderr where no filter reaches it
// (the generic path dropped them already; a copy kernel's complex-to-real warning was printed).
// The host warns at the call where the CPU does (copy_from). Set at a worker's first kernel.
struct DropWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

int apply_intra_op_threads(uint64_t n) {
  static thread_local const bool quiet = [] {
    static DropWarnings drop;
    c10::WarningUtils::set_warning_handler(&drop);
    return true;
  }();
  (void)quiet;
  if (at::get_num_threads() != static_cast<int>(n)) set_this_threads_count(static_cast<int>(n));
  return static_cast<int>(n);
}
struct LaunchContextRegistrar {
  LaunchContextRegistrar() {
    OPENREG_CHECK(orSetLaunchContextHooks(&capture_intra_op_threads, &apply_intra_op_threads));
  }
} g_launch_context_registrar;

}  // namespace

LaunchBytes::LaunchBytes(size_t nbytes) : nbytes_(nbytes) {
  PendingLaunchBytes& p = t_pending;
  if (p.arguments == 0) {  // a new count
    if (p.next_id == p.end_id) {
      p.next_id = g_count_id_blocks.fetch_add(1, std::memory_order_relaxed) * kCountIdBlock + 1;  // 0 means none
      p.end_id = p.next_id + kCountIdBlock - 1;
    }
    p.id = p.next_id++;
  }
  p.bytes += nbytes;
  ++p.arguments;
  count_ = p.id;
}

void LaunchBytes::give_back_counted() noexcept {
  PendingLaunchBytes& p = t_pending;
  if (p.arguments > 0 && p.id == count_) {
    p.bytes -= nbytes_;
    --p.arguments;
  }
  count_ = 0;
}

size_t small_kernel_bytes() {
  static const size_t bytes = read_small_kernel_bytes();
  return bytes;
}

OpenRegStream::OpenRegStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "expected an openreg stream, got a stream of device ", stream.device());
}

orStream_t OpenRegStream::handle() const { return handle_of(device_index(), id()); }

int OpenRegStream::priority() const {
  int priority = 0;
  OPENREG_CHECK(orStreamGetPriority(handle(), &priority));
  return priority;
}

// A query that finds the work done reports a kernel failure of the device not yet reported, as
// CUDA's does (cudaStreamQuery returns the pending error): a program that polls before it reads a
// copy's result learns that the result is a failed kernel's. The runtime's own query leaves the
// failure to such calls (the allocators and occl poll with it).
bool OpenRegStream::query() const {
  // A stream being captured holds work that runs only at the graph's replays: "all done" was the
  // wrong answer, and a thread polling for the captured outputs read them unwritten. Refused, as
  // CUDA refuses the query (cudaErrorStreamCaptureUnsupported); the capture goes on.
  int capturing = 0;
  OPENREG_CHECK(orStreamIsCapturing(handle(), &capturing));
  TORCH_CHECK(capturing == 0,
              "cannot query an openreg stream while it is being captured into a graph: its captured work "
              "runs when the graph is replayed; query after capture_end()");
  orStatus st = orStreamQuery(handle());
  if (st == orErrorNotReady) return false;
  OPENREG_CHECK(st);
  OPENREG_CHECK(orDeviceTakeError(device_index()));
  return true;
}

void OpenRegStream::synchronize() const { OPENREG_CHECK(orStreamSynchronize(handle())); }

OpenRegStream getDefaultOpenRegStream(c10::DeviceIndex device) {
  device = resolve(device);
  check_device_index(device);
  return OpenRegStream(make(device, 0));
}

OpenRegStream getCurrentOpenRegStream(c10::DeviceIndex device) {
  device = resolve(device);
  check_device_index(device);
  return OpenRegStream(make(device, t_current[device]));
}

OpenRegStream getStreamFromPool(int priority, c10::DeviceIndex device) {
  device = resolve(device);
  DevicePools& p = pools(device);
  const int band = priority < 0 ? 1 : 0;
  const uint32_t i = p.next[band].fetch_add(1, std::memory_order_relaxed) % kStreamPoolSize;
  return OpenRegStream(make(device, 1 + band * kStreamPoolSize + i));
}

OpenRegStream getStreamFromExternal(orStream_t handle, c10::DeviceIndex device) {
  OpenRegStream stream(make(device, static_cast<c10::StreamId>(reinterpret_cast<uintptr_t>(handle))));
  checkExternalOpenRegStream(stream);
  return stream;
}

void checkExternalOpenRegStream(OpenRegStream stream) {
  const c10::StreamId id = stream.id();
  if (id < kExternalBase) return;
  int owner = -1;
  OPENREG_CHECK(orStreamGetDevice(handle_of(stream.device_index(), id), &owner));
  TORCH_CHECK(owner == stream.device_index(), "openreg stream ",
              reinterpret_cast<void*>(handle_of(stream.device_index(), id)), " belongs to openreg device ", owner,
              ", not ", static_cast<int>(stream.device_index()));
}

// Every way a stream becomes current comes here (torch.openreg.set_stream, and through the device
// guard torch.accelerator.set_stream, `with torch.Stream(...)` and c10::StreamGuard). It refuses
// what can never be valid, a pool id out of range, so that a made-up id fails here and not at every
// later op on the thread. It takes an external handle as it is: a guard's destructor restores the
// stream it replaced through this call and must not throw, and that stream may have been destroyed
// meanwhile (a destroyed handle then fails the thread's next op, as on CUDA).
// torch.openreg.set_stream checks an external handle first (checkExternalOpenRegStream).
void setCurrentOpenRegStream(OpenRegStream stream) {
  const c10::DeviceIndex device = stream.device_index();
  check_device_index(device);
  const c10::StreamId id = stream.id();
  TORCH_CHECK(id >= kExternalBase || (id >= 0 && id <= 2 * kStreamPoolSize), "invalid openreg stream id ", id);
  t_current[device] = id;
}

orStream_t current_stream_handle(c10::DeviceIndex device) { return handle_of(device, t_current[device]); }

std::ostream& operator<<(std::ostream& os, const OpenRegStream& s) { return os << s.unwrap(); }

}  // namespace c10::openreg

extern "C" orStream_t openregCurrentStream(int device) {
  try {
    return c10::openreg::getCurrentOpenRegStream(static_cast<c10::DeviceIndex>(device)).handle();
  } catch (...) {  // a C caller cannot catch: an invalid device gives NULL
    return nullptr;
  }
}
