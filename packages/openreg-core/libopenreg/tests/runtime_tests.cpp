// Tests of the emulated device runtime (libopenreg), through its public C API.
//
//   openreg_runtime_tests --list        case names, one per line
//   openreg_runtime_tests --run NAME    runs one case: exit 0 pass, 77 skipped, other = fail
//   openreg_runtime_tests               runs every case, each in its own child process
//                                       (the runtime is process-wide state), and prints a summary
//
// tests/test_runtime.py runs each case under pytest, with the environment a
// case needs (OPENREG_DEVICE_COUNT, OPENREG_DEVICE_MEMORY) and sanitizer options.
// Cases that need such a variable skip (exit 77) when it is not set.
//
// Correctness never depends on timing: "work has not run yet" is established
// with a Gate the kernel waits on and the host opens; sleeps only make
// a missing wait more likely to show.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "openreg/faults.h"
#include "openreg/runtime.h"
#include "openreg/runtime.hpp"

// ---------------------------------------------------------------------------
// A tiny test registry.

namespace {

struct TestCase {
  const char* name;
  void (*fn)();
  int expected_signal;  // 0: must exit 0; otherwise must die by this signal
};

std::vector<TestCase>& registry() {
  static std::vector<TestCase> cases;
  return cases;
}

struct Registrar {
  Registrar(const char* name, void (*fn)(), int expected_signal) { registry().push_back({name, fn, expected_signal}); }
};

constexpr int kSkipExitCode = 77;

[[noreturn]] void fail_now(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FAILED: %s\n  last runtime error: %s\n", file, line, what.c_str(),
               orGetLastErrorMessage());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);  // also from worker threads; do not run static destructors under live workers
}

[[noreturn]] void skip_now(const std::string& why) {
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(kSkipExitCode);
}

// Printable form of a CHECK_EQ operand.
template <typename T>
std::string to_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>)
    return "'" + v + "'";
  else if constexpr (std::is_pointer_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(v));
    return buf;
  } else
    return std::to_string(v);
}

std::string status_str(orStatus st) { return std::string(orGetErrorName(st)) + " (" + std::to_string(st) + ")"; }

}  // namespace

#define TEST(name)                                                 \
  static void test_##name();                                       \
  static const Registrar registrar_##name(#name, &test_##name, 0); \
  static void test_##name()

// A case that passes only by dying with signal `sig`.
#define DEATH_TEST(name, sig)                                        \
  static void test_##name();                                         \
  static const Registrar registrar_##name(#name, &test_##name, sig); \
  static void test_##name()

#define FAIL(msg) fail_now(__FILE__, __LINE__, (msg))

#define CHECK(cond)                                     \
  do {                                                  \
    if (!(cond)) FAIL(std::string("CHECK(" #cond ")")); \
  } while (0)

#define CHECK_EQ(a, b)                                                                                  \
  do {                                                                                                  \
    const auto check_a_ = (a);                                                                          \
    const auto check_b_ = (b);                                                                          \
    if (!(check_a_ == check_b_))                                                                        \
      FAIL(std::string("CHECK_EQ(" #a ", " #b "): ") + to_text(check_a_) + " != " + to_text(check_b_)); \
  } while (0)

#define CHECK_STATUS(expected, call)                                                                        \
  do {                                                                                                      \
    const orStatus check_st_ = (call);                                                                      \
    if (check_st_ != (expected))                                                                            \
      FAIL(std::string(#call " returned ") + status_str(check_st_) + ", expected " + status_str(expected)); \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(orSuccess, call)

// The calling thread's last runtime error message contains `needle`.
#define CHECK_MESSAGE_HAS(needle)                                                  \
  do {                                                                             \
    const std::string check_msg_ = orGetLastErrorMessage();                        \
    if (check_msg_.find(needle) == std::string::npos)                              \
      FAIL(std::string("last error message does not contain '") + (needle) + "'"); \
  } while (0)

// ---------------------------------------------------------------------------
// Helpers.

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A kernel waits on a Gate that the host opens: proves work has not run yet
// without depending on timing. Fails the test instead of hanging forever.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> reached{false};
  void wait() {
    reached.store(true);
    const auto deadline = Clock::now() + 20s;
    while (!open.load(std::memory_order_acquire)) {
      if (Clock::now() > deadline) FAIL("gate never opened: the host call blocked on queued work");
      std::this_thread::yield();
    }
  }
  void release() { open.store(true, std::memory_order_release); }
};

namespace wait_hooks {
std::atomic<int> begun{0}, ended{0};
int token = 7;
void* begin() {
  begun.fetch_add(1);
  return &token;
}
void end(void* t) {
  if (t == &token) ended.fetch_add(1);
}
}  // namespace wait_hooks

// Opens `gate` once a host thread is waiting for the device (the blocking-wait hooks' begin ran;
// the test installs wait_hooks), or after 20 s: a test about what a waiting host does then does
// not depend on a sleep outlasting the host's way to its wait on a loaded machine.
std::thread open_once_the_host_waits(Gate& gate) {
  const int begun = wait_hooks::begun.load();
  return std::thread([&gate, begun] {
    const auto deadline = Clock::now() + 20s;
    while (wait_hooks::begun.load() == begun && Clock::now() < deadline) std::this_thread::yield();
    gate.release();
  });
}

// A one-shot barrier for host threads (C++17 has no std::barrier).
class Latch {
 public:
  explicit Latch(int n) : count_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--count_ == 0)
      cv_.notify_all();
    else
      cv_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// Parses the subset of OPENREG_DEVICE_MEMORY syntax the tests use: N, NK, NM, NG.
size_t parse_size(const char* text) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  switch (*end) {
    case 'k':
    case 'K':
      return static_cast<size_t>(v) << 10;
    case 'm':
    case 'M':
      return static_cast<size_t>(v) << 20;
    case 'g':
    case 'G':
      return static_cast<size_t>(v) << 30;
    default:
      return static_cast<size_t>(v);
  }
}

// Iteration scale for the stress case: OPENREG_TEST_SCALE, smaller under TSan.
double test_scale() {
  if (const char* env = std::getenv("OPENREG_TEST_SCALE")) return std::max(0.001, std::atof(env));
#if defined(__SANITIZE_THREAD__)
  return 0.5;
#else
  return 1.0;
#endif
}

// Kernels that appended 0, 1, ..., n-1 ran exactly once each, in launch order.
void check_ran_in_order(const std::vector<int>& seen, int n) {
  CHECK_EQ(seen.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) CHECK_EQ(seen[i], i);
}

// The stream still runs new work to completion.
void check_stream_still_runs(orStream_t s) {
  int ran = 0;
  CHECK_OK(openreg::launch(s, "test::after", [&ran] { ran = 1; }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(ran, 1);
}

// A kernel that sleeps `ms`, then counts itself in `ran` (when given).
void sleep_kernel_ms(orStream_t stream, int ms, std::atomic<int>* ran = nullptr) {
  CHECK_OK(openreg::launch(stream, "test::sleep", [ms, ran] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (ran != nullptr) ++*ran;
  }));
}

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return v;
}

size_t resident_bytes() {
  size_t bytes = 0;
  CHECK_OK(orDeviceGetResidentBytes(&bytes));
  return bytes;
}

}  // namespace

// ===========================================================================
// Devices

TEST(device_count_default) {
  if (std::getenv("OPENREG_DEVICE_COUNT")) skip_now("OPENREG_DEVICE_COUNT is set");
  int count = -1;
  CHECK_OK(orGetDeviceCount(&count));
  CHECK_EQ(count, 2);
  CHECK_STATUS(orErrorInvalidValue, orGetDeviceCount(nullptr));
}

TEST(device_count_from_env) {
  const char* env = std::getenv("OPENREG_DEVICE_COUNT");
  if (!env) skip_now("needs OPENREG_DEVICE_COUNT (test_runtime.py sets 3)");
  const int want = std::atoi(env);
  int count = -1;
  CHECK_OK(orGetDeviceCount(&count));
  CHECK_EQ(count, want);
  // The last device works, the next one does not.
  CHECK_OK(orSetDevice(want - 1));
  void* p = nullptr;
  CHECK_OK(orMalloc(&p, 1024));
  orPointerAttributes attr{};
  CHECK_OK(orPointerGetAttributes(&attr, p));
  CHECK_EQ(attr.device, want - 1);
  CHECK_OK(orFree(p));
  CHECK_STATUS(orErrorInvalidDevice, orSetDevice(want));
  CHECK_MESSAGE_HAS("there are " + std::to_string(want) + " openreg devices");
}

TEST(device_invalid_index) {
  int count = 0;
  CHECK_OK(orGetDeviceCount(&count));
  CHECK_STATUS(orErrorInvalidDevice, orSetDevice(-1));
  CHECK_MESSAGE_HAS("device index -1");
  CHECK_MESSAGE_HAS("there are " + std::to_string(count) + " openreg devices");
  CHECK_STATUS(orErrorInvalidDevice, orSetDevice(count));
  CHECK_MESSAGE_HAS("device index " + std::to_string(count));
  CHECK_MESSAGE_HAS("there are " + std::to_string(count));
  CHECK_STATUS(orErrorInvalidDevice, orSetDevice(1 << 30));
  orDeviceProp prop;
  CHECK_STATUS(orErrorInvalidDevice, orGetDeviceProperties(&prop, count));
  CHECK_STATUS(orErrorInvalidDevice, orGetDeviceProperties(&prop, -3));
  // A failed orSetDevice leaves the current device alone.
  int dev = -1;
  CHECK_OK(orGetDevice(&dev));
  CHECK_EQ(dev, 0);
}

TEST(device_current_is_per_thread) {
  int count = 0;
  CHECK_OK(orGetDeviceCount(&count));
  CHECK(count >= 2);
  CHECK_OK(orSetDevice(1));
  Latch set(4), checked(4);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      int initial = -1;
      CHECK_OK(orGetDevice(&initial));
      CHECK_EQ(initial, 0);  // a new thread starts at device 0, whatever its creator set
      const int mine = t % 2;
      CHECK_OK(orSetDevice(mine));
      set.arrive_and_wait();  // everyone has set theirs
      int now = -1;
      CHECK_OK(orGetDevice(&now));
      CHECK_EQ(now, mine);
      // Allocations land on the thread's device.
      void* p = nullptr;
      CHECK_OK(orMalloc(&p, 4096));
      orPointerAttributes attr{};
      CHECK_OK(orPointerGetAttributes(&attr, p));
      CHECK_EQ(attr.device, mine);
      CHECK_OK(orFree(p));
      checked.arrive_and_wait();
      ok++;
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(ok.load(), 4);
  int dev = -1;
  CHECK_OK(orGetDevice(&dev));
  CHECK_EQ(dev, 1);  // untouched by the other threads
  // A kernel sees its stream's device as current.
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  int seen = -1, in_kernel = -1;
  CHECK_OK(openreg::launch(s, "test::get_device", [&] {
    int d = -1;
    if (orGetDevice(&d) == orSuccess) seen = d;
    in_kernel = orInKernel();
  }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(seen, 1);
  CHECK_EQ(in_kernel, 1);
  CHECK_EQ(orInKernel(), 0);
  int sdev = -1;
  CHECK_OK(orStreamGetDevice(s, &sdev));
  CHECK_EQ(sdev, 1);
  CHECK_OK(orStreamDestroy(s));
}

TEST(device_properties) {
  size_t free_b = 0, total = 0;
  CHECK_OK(orMemGetInfo(&free_b, &total));
  if (const char* env = std::getenv("OPENREG_DEVICE_MEMORY"))
    CHECK_EQ(total, parse_size(env));
  else
    CHECK_EQ(total, size_t{8} << 30);
  int count = 0;
  CHECK_OK(orGetDeviceCount(&count));
  for (int d = 0; d < count; ++d) {
    orDeviceProp prop;
    std::memset(&prop, 0x7f, sizeof(prop));
    CHECK_OK(orGetDeviceProperties(&prop, d));
    CHECK(std::strlen(prop.name) > 0 && std::strlen(prop.name) < sizeof(prop.name));
    CHECK(contains(prop.name, "OpenReg"));
    CHECK_EQ(prop.totalGlobalMem, total);
    CHECK_EQ(prop.memoryAlignment, size_t{512});
    CHECK(prop.multiProcessorCount >= 1);
    CHECK_EQ(prop.major, 1);
  }
  CHECK_STATUS(orErrorInvalidValue, orGetDeviceProperties(nullptr, 0));
}

TEST(device_synchronize_waits_for_all_streams) {
  std::vector<orStream_t> streams(3);
  for (auto& s : streams) CHECK_OK(orStreamCreate(&s));
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) sleep_kernel_ms(streams[i], 20, &done);
  CHECK_OK(openreg::launch(nullptr, "test::slow_default", [&] {
    std::this_thread::sleep_for(20ms);
    done++;
  }));
  CHECK_OK(orDeviceSynchronize());
  CHECK_EQ(done.load(), 4);
  for (auto s : streams) {
    CHECK_OK(orStreamQuery(s));
    CHECK_OK(orStreamDestroy(s));
  }
  CHECK_OK(orDeviceSynchronize());  // idle device
}

// ===========================================================================
// Memory

TEST(memory_malloc_free_alignment) {
  std::vector<void*> ptrs;
  for (size_t size : {1, 7, 511, 512, 513, 4096, 100000, 1 << 20}) {
    void* p = nullptr;
    CHECK_OK(orMalloc(&p, size));
    CHECK(p != nullptr);
    CHECK_EQ(reinterpret_cast<uintptr_t>(p) % 512, uintptr_t{0});
    for (void* q : ptrs) CHECK(q != p);
    ptrs.push_back(p);
  }
  // Zero bytes: success and a null pointer.
  void* z = reinterpret_cast<void*>(0x1);
  CHECK_OK(orMalloc(&z, 0));
  CHECK(z == nullptr);
  CHECK_OK(orFree(nullptr));
  CHECK_STATUS(orErrorInvalidValue, orMalloc(nullptr, 16));
  for (void* p : ptrs) CHECK_OK(orFree(p));
  size_t free_b = 0, total = 0;
  CHECK_OK(orMemGetInfo(&free_b, &total));
  CHECK_EQ(free_b, total);
}

TEST(memory_memcpy_round_trips) {
  const size_t n = 3 * 4096 + 123;  // not a multiple of anything convenient
  const auto src = pattern(n, 1);
  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(orMalloc(&a, n));
  CHECK_OK(orMalloc(&b, n));
  // H2D, D2D, D2H.
  CHECK_OK(orMemcpy(a, src.data(), n, orMemcpyHostToDevice));
  CHECK_OK(orMemcpy(b, a, n, orMemcpyDeviceToDevice));
  std::vector<unsigned char> out(n, 0);
  CHECK_OK(orMemcpy(out.data(), b, n, orMemcpyDeviceToHost));
  CHECK(out == src);
  // orMemcpyDefault infers the direction; interior pointers work.
  const auto src2 = pattern(1000, 2);
  CHECK_OK(orMemcpy(static_cast<char*>(a) + 100, src2.data(), 1000, orMemcpyDefault));
  std::vector<unsigned char> out2(1200, 0);
  CHECK_OK(orMemcpy(out2.data(), a, 1200, orMemcpyDefault));
  CHECK(std::equal(out2.begin(), out2.begin() + 100, src.begin()));
  CHECK(std::equal(out2.begin() + 100, out2.begin() + 1100, src2.begin()));
  CHECK(std::equal(out2.begin() + 1100, out2.end(), src.begin() + 1100));
  // Host to host through the runtime.
  std::vector<unsigned char> h(64, 0);
  CHECK_OK(orMemcpy(h.data(), src.data(), 64, orMemcpyHostToHost));
  CHECK(std::equal(h.begin(), h.end(), src.begin()));
  // Zero bytes is a no-op.
  CHECK_OK(orMemcpy(a, src.data(), 0, orMemcpyHostToDevice));
  CHECK_OK(orFree(a));
  CHECK_OK(orFree(b));
}

TEST(memory_memcpy_cross_device) {
  const size_t n = 64 * 1024;
  const auto src = pattern(n, 3);
  void* d0 = nullptr;
  void* d1 = nullptr;
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orMalloc(&d0, n));
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orMalloc(&d1, n));
  CHECK_OK(orMemcpy(d0, src.data(), n, orMemcpyHostToDevice));  // current device 1, memory on 0
  CHECK_OK(orMemcpy(d1, d0, n, orMemcpyDeviceToDevice));
  CHECK_OK(orSetDevice(0));
  std::vector<unsigned char> out(n, 0);
  CHECK_OK(orMemcpy(out.data(), d1, n, orMemcpyDeviceToHost));
  CHECK(out == src);
  orPointerAttributes attr{};
  CHECK_OK(orPointerGetAttributes(&attr, d1));
  CHECK_EQ(attr.device, 1);
  CHECK_OK(orFree(d1));  // freeing works from any current device
  CHECK_OK(orFree(d0));
}

TEST(memory_memset) {
  const size_t n = 10000;
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  CHECK_OK(orMemset(d, 0xab, n));
  CHECK_OK(orMemset(static_cast<char*>(d) + 10, 0x01, 20));
  std::vector<unsigned char> out(n, 0);
  CHECK_OK(orMemcpy(out.data(), d, n, orMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) CHECK_EQ(out[i], (i >= 10 && i < 30) ? 0x01 : 0xab);
  // Async memset on a stream, ordered before a later copy on the same stream.
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orMemsetAsync(d, 0x5c, n, s));
  std::vector<unsigned char> out2(n, 0);
  CHECK_OK(orMemcpyAsync(out2.data(), d, n, orMemcpyDeviceToHost, s));  // pageable: done on return
  CHECK(std::all_of(out2.begin(), out2.end(), [](unsigned char c) { return c == 0x5c; }));
  // Errors: host memory, overrun.
  std::vector<char> host(16);
  CHECK_STATUS(orErrorInvalidDevicePointer, orMemset(host.data(), 0, 16));
  CHECK_STATUS(orErrorInvalidValue, orMemset(d, 0, n + 1024));
  CHECK_OK(orStreamDestroy(s));
  CHECK_OK(orFree(d));
}

TEST(memory_async_memcpy_pinned_is_async) {
  const size_t n = 1 << 20;
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  unsigned char* pinned = nullptr;
  CHECK_OK(orMallocHost(reinterpret_cast<void**>(&pinned), n));
  CHECK(pinned != nullptr);
  const auto src = pattern(n, 4);
  std::memcpy(pinned, src.data(), n);
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  CHECK_OK(orMemset(d, 0, n));

  // H2D from pinned memory behind a gated kernel: the call returns with the copy pending.
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&] { gate.wait(); }));
  CHECK_OK(orMemcpyAsync(d, pinned, n, orMemcpyHostToDevice, s));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(s));
  // D2H into pinned memory is pending too: the host buffer still holds its old bytes.
  CHECK_OK(orMemcpyAsync(pinned, d, n, orMemcpyDeviceToHost, s));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(s));
  CHECK(std::memcmp(pinned, src.data(), n) == 0);
  gate.release();
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orStreamQuery(s));
  CHECK(std::memcmp(pinned, src.data(), n) == 0);  // went there and back

  // Fresh data in from pinned memory, checked through a synchronous D2H.
  std::memset(pinned, 0x33, n);
  CHECK_OK(orMemcpyAsync(d, pinned, n, orMemcpyHostToDevice, s));
  CHECK_OK(orStreamSynchronize(s));
  std::vector<unsigned char> out(n, 0);
  CHECK_OK(orMemcpy(out.data(), d, n, orMemcpyDeviceToHost));
  CHECK(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0x33; }));

  CHECK_OK(orFree(d));
  CHECK_OK(orFreeHost(pinned));
  CHECK_OK(orStreamDestroy(s));
}

TEST(memory_async_memcpy_pageable_completes_on_return) {
  const size_t n = 1 << 20;
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  auto src = pattern(n, 5);
  sleep_kernel_ms(s, 30);  // the copy queues behind this
  CHECK_OK(orMemcpyAsync(d, src.data(), n, orMemcpyHostToDevice, s));
  CHECK_OK(orStreamQuery(s));  // everything up to and including the copy has run
  // The caller may reuse its buffer at once.
  std::fill(src.begin(), src.end(), 0);
  sleep_kernel_ms(s, 30);
  std::vector<unsigned char> out(n, 0);
  CHECK_OK(orMemcpyAsync(out.data(), d, n, orMemcpyDeviceToHost, s));
  CHECK_OK(orStreamQuery(s));
  CHECK(out == pattern(n, 5));
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

TEST(memory_blocking_copy_on_an_idle_stream_runs_on_the_caller) {
  // A small blocking copy that finds its stream idle runs on the calling thread (memcpyOnCaller);
  // one that finds work queued waits behind it, in stream order, and sees what that work wrote.
  const size_t n = 4096;
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  const auto src = pattern(n, 6);
  std::vector<unsigned char> out(n, 0);
  orRuntimeCounters c0{}, c1{}, c2{};
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orGetCounters(&c0));
  CHECK_OK(orMemcpyAsync(d, src.data(), n, orMemcpyHostToDevice, s));  // pageable: blocking
  CHECK_OK(orMemcpyAsync(out.data(), d, n, orMemcpyDeviceToHost, s));
  CHECK(out == src);
  CHECK_OK(orGetCounters(&c1));
  CHECK_EQ(c1.memcpyOnCaller - c0.memcpyOnCaller, uint64_t{2});
  CHECK_EQ(c1.memcpyHostToDevice - c0.memcpyHostToDevice, uint64_t{1});  // counted as copies too
  CHECK_EQ(c1.memcpyDeviceToHost - c0.memcpyDeviceToHost, uint64_t{1});

  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&] { gate.wait(); }));
  CHECK_OK(orMemsetAsync(d, 0x5a, n, s));
  CHECK_OK(orSetBlockingWaitHooks(&wait_hooks::begin, &wait_hooks::end));
  std::thread opener = open_once_the_host_waits(gate);
  CHECK_OK(orMemcpyAsync(out.data(), d, n, orMemcpyDeviceToHost, s));  // waits for the gate and the memset
  opener.join();
  CHECK_OK(orSetBlockingWaitHooks(nullptr, nullptr));
  CHECK(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0x5a; }));
  CHECK_OK(orGetCounters(&c2));
  CHECK_EQ(c2.memcpyOnCaller - c1.memcpyOnCaller, uint64_t{0});

  // Larger than 1 MiB: queued even on an idle stream (it would keep other launches waiting).
  const size_t big = (size_t{1} << 20) + 4096;
  void* b = nullptr;
  CHECK_OK(orMalloc(&b, big));
  std::vector<unsigned char> host_big(big, 7);
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orMemcpyAsync(b, host_big.data(), big, orMemcpyHostToDevice, s));
  orRuntimeCounters c3{};
  CHECK_OK(orGetCounters(&c3));
  CHECK_EQ(c3.memcpyOnCaller - c2.memcpyOnCaller, uint64_t{0});
  CHECK_OK(orFree(b));
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

TEST(memory_pointer_attributes) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 8192));
  orPointerAttributes attr{};
  CHECK_OK(orPointerGetAttributes(&attr, static_cast<char*>(d) + 1000));
  CHECK_EQ(static_cast<int>(attr.type), static_cast<int>(orMemoryTypeDevice));
  CHECK_EQ(attr.device, 0);
  CHECK(attr.base == d);
  CHECK_EQ(attr.size, size_t{8192});

  void* h = nullptr;
  CHECK_OK(orMallocHost(&h, 10000));
  CHECK_OK(orPointerGetAttributes(&attr, static_cast<char*>(h) + 5));
  CHECK_EQ(static_cast<int>(attr.type), static_cast<int>(orMemoryTypeHost));
  CHECK_EQ(attr.device, -1);
  CHECK(attr.base == h);
  CHECK(attr.size >= size_t{10000});

  int local = 0;
  CHECK_OK(orPointerGetAttributes(&attr, &local));
  CHECK_EQ(static_cast<int>(attr.type), static_cast<int>(orMemoryTypeUnregistered));
  CHECK_EQ(attr.device, -1);

  // orPointerGetDevice: the owning device by address range, without a liveness check.
  CHECK_EQ(orPointerGetDevice(d), 0);
  CHECK_EQ(orPointerGetDevice(static_cast<char*>(d) + 8191), 0);
  CHECK_EQ(orPointerGetDevice(h), -1);
  CHECK_EQ(orPointerGetDevice(&local), -1);
  CHECK_EQ(orPointerGetDevice(nullptr), -1);
  CHECK_OK(orSetDevice(1));
  void* d1 = nullptr;
  CHECK_OK(orMalloc(&d1, 512));
  CHECK_EQ(orPointerGetDevice(d1), 1);
  CHECK_OK(orPointerGetAttributes(&attr, d1));
  CHECK_EQ(attr.device, 1);
  CHECK_OK(orFree(d1));
  CHECK_OK(orSetDevice(0));

  // Device address range, but not inside a live allocation.
  CHECK_OK(orFree(d));
  CHECK_EQ(orPointerGetDevice(d), 0);
  CHECK_STATUS(orErrorInvalidDevicePointer, orPointerGetAttributes(&attr, d));
  CHECK_STATUS(orErrorInvalidValue, orPointerGetAttributes(nullptr, &local));
  CHECK_OK(orFreeHost(h));
}

TEST(memory_get_info) {
  size_t free0 = 0, total = 0;
  CHECK_OK(orMemGetInfo(&free0, &total));
  CHECK(total > 0);
  CHECK_EQ(free0, total);
  void* p = nullptr;
  CHECK_OK(orMalloc(&p, 1000000));
  size_t free1 = 0;
  CHECK_OK(orMemGetInfo(&free1, nullptr));
  CHECK(free0 - free1 >= size_t{1000000});
  CHECK(free0 - free1 < size_t{1000000} + 512);
  CHECK_OK(orFree(p));
  CHECK_OK(orMemGetInfo(&free1, nullptr));
  CHECK_EQ(free1, total);
  // Device 1's memory is accounted separately.
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orMalloc(&p, 4096));
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orMemGetInfo(&free1, nullptr));
  CHECK_EQ(free1, total);
  CHECK_OK(orFree(p));
}

TEST(memory_memcpy_errors) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));
  std::vector<char> host(8192);
  // Kinds that contradict the pointers.
  CHECK_STATUS(orErrorInvalidMemcpyDirection, orMemcpy(host.data(), d, 16, orMemcpyHostToDevice));
  CHECK_MESSAGE_HAS("device-to-host");
  CHECK_STATUS(orErrorInvalidMemcpyDirection, orMemcpy(d, host.data(), 16, orMemcpyDeviceToHost));
  CHECK_STATUS(orErrorInvalidMemcpyDirection, orMemcpy(d, host.data(), 16, orMemcpyDeviceToDevice));
  CHECK_STATUS(orErrorInvalidMemcpyDirection, orMemcpy(host.data(), host.data() + 100, 16, orMemcpyHostToDevice));
  // A range running past the end of its allocation.
  CHECK_STATUS(orErrorInvalidValue, orMemcpy(d, host.data(), 4097, orMemcpyHostToDevice));
  CHECK_MESSAGE_HAS("runs past the end");
  CHECK_STATUS(orErrorInvalidValue, orMemcpy(host.data(), static_cast<char*>(d) + 4000, 200, orMemcpyDeviceToHost));
  CHECK_STATUS(orErrorInvalidValue, orMemcpy(nullptr, host.data(), 16, orMemcpyDefault));
  // A count so large that pointer + count wraps around is past the end too (the check passed it,
  // and the copy ran over the arena).
  const size_t huge = SIZE_MAX - 100;
  CHECK_STATUS(orErrorInvalidValue, orMemsetAsync(static_cast<char*>(d) + 512, 0, huge, nullptr));
  CHECK_MESSAGE_HAS("runs past the end");
  CHECK_STATUS(orErrorInvalidValue, orMemcpy(host.data(), static_cast<char*>(d) + 512, huge, orMemcpyDeviceToHost));
  CHECK_OK(orDeviceSynchronize());
  // Freed memory is no longer a valid source.
  CHECK_OK(orFree(d));
  CHECK_STATUS(orErrorInvalidDevicePointer, orMemcpy(host.data(), d, 16, orMemcpyDeviceToHost));
  CHECK_MESSAGE_HAS("not inside a live allocation");
  // A pinned size that cannot be rounded to pages: refused, naming the size asked for.
  void* h = nullptr;
  CHECK_STATUS(orErrorMemoryAllocation, orMallocHost(&h, SIZE_MAX));
  CHECK(h == nullptr);
  CHECK(!contains(orGetLastErrorMessage(), " 0.00 MiB"));
}

// orFree waits for every device's queued work: a copy queued on device 1 that reads device 0's
// block read the block's next owner's data when only device 0's streams were waited for.
TEST(memory_free_waits_for_other_devices) {
  const size_t n = 1 << 16;
  void* src = nullptr;
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orMalloc(&src, n));
  CHECK_OK(orMemset(src, 0xAB, n));
  CHECK_OK(orSetDevice(1));
  void* dst = nullptr;
  CHECK_OK(orMalloc(&dst, n));
  orStream_t s1 = nullptr;
  CHECK_OK(orStreamCreate(&s1));
  CHECK_OK(orSetDevice(0));
  sleep_kernel_ms(s1, 200);
  CHECK_OK(orMemcpyAsync(dst, src, n, orMemcpyDeviceToDevice, s1));
  CHECK_OK(orFree(src));
  void* next = nullptr;
  CHECK_OK(orMalloc(&next, n));
  CHECK(next == src);  // the arena hands the same block out again
  CHECK_OK(orMemset(next, 0x11, n));
  CHECK_OK(orStreamSynchronize(s1));
  std::vector<unsigned char> out(n);
  CHECK_OK(orMemcpy(out.data(), dst, n, orMemcpyDeviceToHost));
  CHECK(out == std::vector<unsigned char>(n, 0xAB));
  CHECK_OK(orFree(next));
  CHECK_OK(orFree(dst));
  CHECK_OK(orStreamDestroy(s1));
}

TEST(memory_free_errors) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));
  // Not the start of an allocation.
  CHECK_STATUS(orErrorInvalidDevicePointer, orFree(static_cast<char*>(d) + 512));
  // Not device memory at all.
  int local = 0;
  CHECK_STATUS(orErrorInvalidDevicePointer, orFree(&local));
  CHECK_MESSAGE_HAS("not openreg device memory");
  CHECK_OK(orFree(d));
  // Double free.
  CHECK_STATUS(orErrorInvalidDevicePointer, orFree(d));
  CHECK_MESSAGE_HAS("freed twice");
  // Pinned-host frees of the wrong memory.
  CHECK_STATUS(orErrorInvalidValue, orFreeHost(&local));
  void* h = nullptr;
  CHECK_OK(orMallocHost(&h, 100));
  CHECK_STATUS(orErrorInvalidValue, orFreeHost(static_cast<char*>(h) + 1));
  CHECK_OK(orFreeHost(h));
  CHECK_STATUS(orErrorInvalidValue, orFreeHost(h));
  CHECK_OK(orFreeHost(nullptr));
  // The runtime still works.
  void* e = nullptr;
  CHECK_OK(orMalloc(&e, 4096));
  const auto src = pattern(4096, 6);
  CHECK_OK(orMemcpy(e, src.data(), 4096, orMemcpyHostToDevice));
  std::vector<unsigned char> out(4096);
  CHECK_OK(orMemcpy(out.data(), e, 4096, orMemcpyDeviceToHost));
  CHECK(out == src);
  CHECK_OK(orFree(e));
  size_t free_b = 0, total = 0;
  CHECK_OK(orMemGetInfo(&free_b, &total));
  CHECK_EQ(free_b, total);
}

// ===========================================================================
// Capacity (test_runtime.py runs this with OPENREG_DEVICE_MEMORY=64M; it works
// with any capacity since nothing is touched).

TEST(capacity_out_of_memory) {
  size_t free_b = 0, total = 0;
  CHECK_OK(orMemGetInfo(&free_b, &total));
  if (const char* env = std::getenv("OPENREG_DEVICE_MEMORY")) CHECK_EQ(total, parse_size(env));
  CHECK_EQ(free_b, total);
  const size_t quarter = total / 4;
  // One allocation larger than the device.
  void* p = reinterpret_cast<void*>(0x1);
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, total + 1));
  CHECK(p == nullptr);
  CHECK_MESSAGE_HAS("capacity");
  CHECK_MESSAGE_HAS("OPENREG_DEVICE_MEMORY");
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, SIZE_MAX));
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, SIZE_MAX - 100));
  // Fill the device exactly, then one more byte fails.
  void* q[4] = {};
  for (auto& x : q) CHECK_OK(orMalloc(&x, quarter));
  CHECK_OK(orMemGetInfo(&free_b, nullptr));
  CHECK_EQ(free_b, size_t{0});
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, 1));
  CHECK_MESSAGE_HAS("capacity");
  CHECK_MESSAGE_HAS("out of memory on openreg device 0");
  // Fragmentation: half is free, but in two separate quarters.
  CHECK_OK(orFree(q[0]));
  CHECK_OK(orFree(q[2]));
  CHECK_OK(orMemGetInfo(&free_b, nullptr));
  CHECK_EQ(free_b, 2 * quarter);
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, quarter + 512));
  CHECK_MESSAGE_HAS("largest free block");
  CHECK_OK(orMalloc(&q[0], quarter));  // an exact fit still works
  // Free everything: the free blocks coalesce, so nearly all of it fits in one piece.
  CHECK_OK(orFree(q[0]));
  CHECK_OK(orFree(q[1]));
  CHECK_OK(orFree(q[3]));
  CHECK_OK(orMemGetInfo(&free_b, nullptr));
  CHECK_EQ(free_b, total);
  void* big = nullptr;
  CHECK_OK(orMalloc(&big, total - 4096));
  void* small = nullptr;
  CHECK_OK(orMalloc(&small, 4096));
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, 1));
  CHECK_OK(orFree(big));
  CHECK_OK(orFree(small));
  CHECK_OK(orMalloc(&big, total));
  CHECK_OK(orFree(big));
  CHECK_OK(orMemGetInfo(&free_b, nullptr));
  CHECK_EQ(free_b, total);
  // The other device is not affected by device 0 being full.
  CHECK_OK(orMalloc(&big, total));
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orMalloc(&p, 4096));
  CHECK_OK(orFree(p));
  CHECK_OK(orFree(big));
}

TEST(capacity_freed_pages_return_to_os) {
  const size_t n = size_t{32} << 20;
  CHECK(resident_bytes() < (size_t{1} << 20));
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  CHECK(resident_bytes() < (size_t{1} << 20));  // reserved, not committed
  CHECK_OK(openreg::launch(nullptr, "test::fill", [d, n] { std::memset(openreg::kernel_pointer(d), 0x5a, n); }));
  CHECK_OK(orDeviceSynchronize());
  const size_t filled = resident_bytes();
  CHECK(filled >= n);
  unsigned char probe[16];
  CHECK_OK(orMemcpy(probe, static_cast<char*>(d) + n - 16, 16, orMemcpyDeviceToHost));
  CHECK(std::all_of(probe, probe + 16, [](unsigned char c) { return c == 0x5a; }));
  CHECK_OK(orFree(d));
  const size_t after = resident_bytes();
  if (after >= (size_t{1} << 20))
    FAIL("resident bytes after free: " + std::to_string(after) + " (filled: " + std::to_string(filled) + ")");
  // Released pages read as zero when allocated again.
  CHECK_OK(orMalloc(&d, n));
  CHECK_OK(orMemcpy(probe, static_cast<char*>(d) + n / 2, 16, orMemcpyDeviceToHost));
  CHECK(std::all_of(probe, probe + 16, [](unsigned char c) { return c == 0; }));
  CHECK_OK(orFree(d));
}

// ===========================================================================
// Own address space

// Host code reading device memory must fault, as on a discrete device.
DEATH_TEST(host_read_of_device_pointer_faults, SIGSEGV) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));
  CHECK_OK(orMemset(d, 1, 4096));
  std::printf("reading device pointer %p from the host; this must die by SIGSEGV\n", d);
  std::fflush(stdout);
  volatile const char* p = static_cast<volatile const char*>(d);
  const char c = *p;
  std::fprintf(stderr, "host read of a device pointer succeeded (read %d): no protection\n", c);
  std::_Exit(3);
}

TEST(kernel_pointer_translation) {
  const size_t count = 1000;
  int* d = nullptr;
  CHECK_OK(orMalloc(reinterpret_cast<void**>(&d), count * sizeof(int)));
  void* kp = nullptr;
  CHECK_STATUS(orErrorNotPermitted, orKernelPointer(d, &kp));
  CHECK_MESSAGE_HAS("device-side");
  CHECK_STATUS(orErrorNotPermitted, orKernelFail("from the host"));
  bool threw = false;
  try {
    openreg::kernel_pointer(d);
  } catch (const std::runtime_error&) {
    threw = true;
  }
  CHECK(threw);

  std::atomic<int> kernel_status{-1};
  std::atomic<bool> distinct{false};
  int local = 0;
  std::atomic<int> bad_pointer_status{-1};
  CHECK_OK(openreg::launch(nullptr, "test::write", [&] {
    void* raw = nullptr;
    kernel_status = orKernelPointer(d + 10, &raw);
    int* k = openreg::kernel_pointer(d);
    distinct = (static_cast<void*>(k) != static_cast<void*>(d)) && raw == static_cast<void*>(k + 10);
    for (size_t i = 0; i < count; ++i) k[i] = static_cast<int>(i * i);
    void* bogus = nullptr;
    bad_pointer_status = orKernelPointer(&local, &bogus);
  }));
  CHECK_OK(orStreamSynchronize(nullptr));
  CHECK_EQ(kernel_status.load(), static_cast<int>(orSuccess));
  CHECK_EQ(bad_pointer_status.load(), static_cast<int>(orErrorInvalidDevicePointer));
  CHECK(distinct.load());
  std::vector<int> out(count, -1);
  CHECK_OK(orMemcpy(out.data(), d, count * sizeof(int), orMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) CHECK_EQ(out[i], static_cast<int>(i * i));
  // And the other way: data copied in is visible through the kernel view.
  std::vector<int> in(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<int>(3 * i + 1);
  CHECK_OK(orMemcpy(d, in.data(), count * sizeof(int), orMemcpyHostToDevice));
  std::atomic<long> sum{0};
  CHECK_OK(openreg::launch(nullptr, "test::sum", [&] {
    const int* k = openreg::kernel_pointer(d);
    long s = 0;
    for (size_t i = 0; i < count; ++i) s += k[i];
    sum = s;
  }));
  CHECK_OK(orDeviceSynchronize());
  long want = 0;
  for (int v : in) want += v;
  CHECK_EQ(sum.load(), want);
  CHECK(openreg::kernel_pointer(static_cast<void*>(nullptr)) == nullptr);
  CHECK_OK(orFree(d));
}

// ===========================================================================
// Streams

TEST(stream_launch_returns_before_work_ran) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  Gate gate;
  std::atomic<bool> ran{false};
  CHECK_OK(openreg::launch(s, "test::gated", [&] {
    gate.wait();
    ran = true;
  }));
  // The kernel cannot finish before the gate opens: the launch returned first.
  CHECK(!ran.load());
  CHECK_STATUS(orErrorNotReady, orStreamQuery(s));
  gate.release();
  CHECK_OK(orStreamSynchronize(s));
  CHECK(ran.load());
  CHECK_OK(orStreamQuery(s));
  // Same on the default stream.
  Gate gate2;
  std::atomic<bool> ran2{false};
  CHECK_OK(openreg::launch(nullptr, "test::gated_default", [&] {
    gate2.wait();
    ran2 = true;
  }));
  CHECK(!ran2.load());
  CHECK_STATUS(orErrorNotReady, orStreamQuery(nullptr));
  gate2.release();
  CHECK_OK(orStreamSynchronize(nullptr));
  CHECK(ran2.load());
  CHECK_OK(orStreamDestroy(s));
}

// A host thread that sleeps waiting for the device calls the hooks around the sleep (an
// interpreter releases its lock there), with begin's token, and only then.
TEST(stream_blocking_wait_hooks) {
  CHECK_STATUS(orErrorInvalidValue, orSetBlockingWaitHooks(&wait_hooks::begin, nullptr));
  CHECK_OK(orSetBlockingWaitHooks(&wait_hooks::begin, &wait_hooks::end));
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  const int first = wait_hooks::begun.load();
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&] { gate.wait(); }));
  std::thread opener = open_once_the_host_waits(gate);  // after 20 s if no hook ran
  CHECK_OK(orStreamSynchronize(s));
  opener.join();
  CHECK(wait_hooks::begun.load() > first);
  CHECK_EQ(wait_hooks::begun.load(), wait_hooks::ended.load());
  const int before = wait_hooks::begun.load();
  CHECK_OK(orStreamSynchronize(s));  // nothing queued: no sleep, no hooks
  CHECK_EQ(wait_hooks::begun.load(), before);
  CHECK_OK(orSetBlockingWaitHooks(nullptr, nullptr));
  CHECK_OK(openreg::launch(s, "test::sleep", [] { std::this_thread::sleep_for(20ms); }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(wait_hooks::begun.load(), before);  // removed
  CHECK_OK(orStreamDestroy(s));
}

namespace launch_context {
thread_local uint64_t host_value = 0;    // what the launching thread's capture reports
std::atomic<int> applied{0};             // apply calls
std::atomic<int> captured{0};            // capture calls
thread_local uint64_t worker_value = 0;  // on the worker: the last value applied
uint64_t capture() {
  captured.fetch_add(1);
  return host_value;
}
int apply(uint64_t v) {
  applied.fetch_add(1);
  worker_value = v;
  return static_cast<int>(v);  // the word is the kernels' width
}
}  // namespace launch_context

// A kernel launch carries its launching thread's context word to the stream's worker, which
// applies it before the kernel, once per change, per worker; copies carry none, and graphs replay
// the words they captured.
TEST(stream_launch_context_hooks) {
  namespace lc = launch_context;
  CHECK_STATUS(orErrorInvalidValue, orSetLaunchContextHooks(&lc::capture, nullptr));
  CHECK_OK(orSetLaunchContextHooks(&lc::capture, &lc::apply));
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  std::vector<uint64_t> seen_a, seen_b;  // each written by one stream's kernels only
  auto read_a = [&seen_a] { seen_a.push_back(lc::worker_value); };
  auto read_b = [&seen_b] { seen_b.push_back(lc::worker_value); };
  lc::host_value = 3;
  CHECK_OK(openreg::launch(a, "test::ctx", read_a));
  CHECK_OK(openreg::launch(a, "test::ctx", read_a));  // unchanged: not applied again
  lc::host_value = 0;                                 // nothing to carry: the worker keeps 3
  CHECK_OK(openreg::launch(a, "test::ctx", read_a));
  lc::host_value = 1;
  CHECK_OK(openreg::launch(a, "test::ctx", read_a));
  CHECK_OK(openreg::launch(b, "test::ctx", read_b));  // another worker applies on its own
  CHECK_OK(orStreamSynchronize(a));
  CHECK_OK(orStreamSynchronize(b));
  CHECK(seen_a == (std::vector<uint64_t>{3, 3, 3, 1}));
  CHECK(seen_b == (std::vector<uint64_t>{1}));
  CHECK_EQ(lc::applied.load(), 3);
  // A launch that fails is captured too: the caller's state for it must not reach its next launch.
  const int captures = lc::captured.load();
  orStream_t gone = nullptr;
  CHECK_OK(orStreamCreate(&gone));
  CHECK_OK(orStreamDestroy(gone));
  CHECK_STATUS(orErrorInvalidResourceHandle, openreg::launch(gone, "test::ctx", read_a));
  CHECK_STATUS(orErrorInvalidValue, orLaunchKernel(a, "test::null", nullptr, nullptr, nullptr));
  CHECK_EQ(lc::captured.load(), captures + 2);
  // Another host thread launches with its own word.
  std::thread([&] {
    lc::host_value = 5;
    CHECK_OK(openreg::launch(a, "test::ctx", read_a));
  }).join();
  CHECK_OK(orStreamSynchronize(a));
  CHECK_EQ(seen_a.back(), uint64_t{5});
  // A graph replays the word captured with each kernel.
  lc::host_value = 7;
  CHECK_OK(orStreamBeginCapture(b));
  CHECK_OK(openreg::launch(b, "test::ctx", read_b));
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(b, &g));
  lc::host_value = 2;
  CHECK_OK(openreg::launch(b, "test::ctx", read_b));
  CHECK_OK(orGraphLaunch(g, b));
  CHECK_OK(orStreamSynchronize(b));
  CHECK(seen_b == (std::vector<uint64_t>{1, 2, 7}));
  CHECK_OK(orGraphDestroy(g));
  // Removed: launches carry nothing, workers keep what they applied.
  CHECK_OK(orSetLaunchContextHooks(nullptr, nullptr));
  const int before = lc::applied.load();
  lc::host_value = 9;
  CHECK_OK(openreg::launch(a, "test::ctx", read_a));
  CHECK_OK(orStreamSynchronize(a));
  CHECK_EQ(seen_a.back(), uint64_t{5});
  CHECK_EQ(lc::applied.load(), before);
  lc::host_value = 0;
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
}

TEST(stream_in_order_execution) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::vector<int> seen;  // only touched by kernels of one stream, then by the host after sync
  const int n = 2000;
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&] { gate.wait(); }));
  for (int i = 0; i < n; ++i) {
    CHECK_OK(openreg::launch(s, "test::append", [&seen, i] { seen.push_back(i); }));
    if (i == n / 2) gate.release();  // half queued while blocked, half while running
  }
  CHECK_OK(orStreamSynchronize(s));
  check_ran_in_order(seen, n);
  // Copies and kernels interleave in order too.
  int* d = nullptr;
  CHECK_OK(orMalloc(reinterpret_cast<void**>(&d), sizeof(int)));
  std::vector<int> values;
  for (int i = 0; i < 50; ++i) {
    CHECK_OK(orMemsetAsync(d, i, sizeof(int), s));
    CHECK_OK(openreg::launch(s, "test::read", [&values, d] { values.push_back(*openreg::kernel_pointer(d) & 0xff); }));
  }
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(values.size(), size_t{50});
  for (int i = 0; i < 50; ++i) CHECK_EQ(values[i], i);
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

// The ring holds 1024 items; more go to an overflow queue. A launch never waits for the device
// (the worker may need a lock the launching thread holds), and order is kept across both.
TEST(stream_queue_beyond_the_ring_keeps_order) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  const int n = 3000;
  std::vector<int> seen;
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&] { gate.wait(); }));
  for (int i = 0; i < n; ++i) {  // all queued while the worker is blocked
    CHECK_OK(openreg::launch(s, "test::append", [&seen, i] { seen.push_back(i); }));
    if (i == 2 * n / 3) CHECK_EQ(orStreamQuery(s), orErrorNotReady);
  }
  gate.release();
  // Launches while the worker drains the overflow land behind it.
  for (int i = n; i < n + 500; ++i) CHECK_OK(openreg::launch(s, "test::append", [&seen, i] { seen.push_back(i); }));
  CHECK_OK(orStreamSynchronize(s));
  check_ran_in_order(seen, n + 500);
  check_stream_still_runs(s);  // the ring is used again once the worker has caught up
  CHECK_OK(orStreamDestroy(s));
}

// A kernel that launches more than the ring holds into its own stream: nothing waits for itself.
TEST(stream_kernel_launches_into_its_own_full_stream) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  const int n = 3000;
  std::vector<int> seen;
  orStatus inner = orSuccess;
  CHECK_OK(openreg::launch(s, "test::launcher", [&] {
    for (int i = 0; i < n && inner == orSuccess; ++i)
      inner = openreg::launch(s, "test::append", [&seen, i] { seen.push_back(i); });
  }));
  CHECK_OK(orStreamSynchronize(s));  // the launcher has queued everything when it completes
  CHECK_EQ(inner, orSuccess);
  CHECK_OK(orStreamSynchronize(s));
  check_ran_in_order(seen, n);
  check_stream_still_runs(s);
  CHECK_OK(orStreamDestroy(s));
}

TEST(graph_capture_and_replay) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  int* d = nullptr;
  CHECK_OK(orMalloc(reinterpret_cast<void**>(&d), sizeof(int)));
  CHECK_OK(orMemset(d, 0, sizeof(int)));
  std::atomic<int> runs{0};
  CHECK_OK(orStreamBeginCapture(s));
  int capturing = 0;
  CHECK_OK(orStreamIsCapturing(s, &capturing));
  CHECK_EQ(capturing, 1);
  CHECK_OK(openreg::launch(s, "test::increment", [d, &runs] {
    ++*openreg::kernel_pointer(d);
    ++runs;
  }));
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g));
  CHECK_EQ(runs.load(), 0);  // recorded, not run
  // Nothing may wait for a capturing stream; each refusal invalidates the capture (no graph).
  int host = 0;
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreate(&e));
  const std::vector<std::function<orStatus()>> refused = {
      [&] { return orStreamSynchronize(s); },
      [&] { return orMemcpyAsync(&host, d, sizeof(int), orMemcpyDeviceToHost, s); },  // pageable
      [&] { return orEventRecord(e, s); },
  };
  for (const auto& call : refused) {
    CHECK_OK(orStreamBeginCapture(s));
    CHECK_STATUS(orErrorStreamCaptureUnsupported, call());
    CHECK_MESSAGE_HAS("captured into a graph");
    orGraph_t invalid = nullptr;
    CHECK_STATUS(orErrorStreamCaptureUnsupported, orStreamEndCapture(s, &invalid));
    CHECK_MESSAGE_HAS("the capture was invalidated");
    CHECK(invalid == nullptr);
  }
  CHECK_EQ(runs.load(), 0);
  size_t nodes = 0;
  CHECK_OK(orGraphGetNodeCount(g, &nodes));
  CHECK_EQ(nodes, size_t{1});
  const char* name = nullptr;
  CHECK_OK(orGraphGetNodeName(g, 0, &name));
  CHECK(std::string(name) == "test::increment");
  for (int i = 0; i < 5; ++i) CHECK_OK(orGraphLaunch(g, s));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orMemcpy(&host, d, sizeof(int), orMemcpyDeviceToHost));
  CHECK_EQ(host, 5);
  CHECK_EQ(runs.load(), 5);
  CHECK_OK(orGraphDestroy(g));
  CHECK_STATUS(orErrorInvalidResourceHandle, orGraphLaunch(g, s));  // destroyed
  CHECK_STATUS(orErrorInvalidValue, orStreamEndCapture(s, &g));     // not capturing
  CHECK_OK(orEventDestroy(e));
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

// orStreamBeginCapture returns once the work queued before it has run: a kernel of that work that
// failed is reported by it and no capture begins (the error surfaced after a later replay, as if the
// replay had failed); called from a kernel of the stream, it is refused (it would wait for itself:
// it hung, leaving the stream capturing).
TEST(graph_capture_begins_after_the_queued_work) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::atomic<int> ran{0};
  sleep_kernel_ms(s, 50, &ran);
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_EQ(ran.load(), 1);  // waited for
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g));
  CHECK_OK(orGraphDestroy(g));
  CHECK_OK(orLaunchKernel(s, "test::failing_kernel", [](void*) { return orKernelFail("boom"); }, nullptr, nullptr));
  CHECK_STATUS(orErrorLaunchFailure, orStreamBeginCapture(s));
  CHECK_MESSAGE_HAS("test::failing_kernel");
  int capturing = 1;
  CHECK_OK(orStreamIsCapturing(s, &capturing));
  CHECK_EQ(capturing, 0);
  std::atomic<orStatus> from_kernel{orSuccess};
  CHECK_OK(openreg::launch(s, "test::begins_a_capture", [&] { from_kernel = orStreamBeginCapture(s); }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(from_kernel.load(), orErrorNotPermitted);
  CHECK_OK(orStreamIsCapturing(s, &capturing));
  CHECK_EQ(capturing, 0);
  CHECK_OK(orStreamDestroy(s));
}

// An event's record racing another thread's capture_begin on its stream: the record either runs or
// is refused (voiding that capture), never recorded into the graph. It was checked before it was
// queued, and a capture begun in between recorded it: the event never completed once the graph was
// destroyed, and the allocator's frees waiting for it held their memory for ever.
TEST(graph_an_event_record_racing_a_capture_runs_or_is_refused) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreateWithFlags(&e, orEventDisableTiming));
  std::atomic<bool> stop{false};
  std::thread capturer([&] {
    while (!stop.load()) {
      if (orStreamBeginCapture(s) != orSuccess) continue;
      orGraph_t g = nullptr;
      if (orStreamEndCapture(s, &g) == orSuccess) orGraphDestroy(g);
    }
  });
  int ran = 0, refused = 0, stuck = 0;
  for (int i = 0; i < 60000 && stuck == 0; ++i) {
    const orStatus st = orEventRecord(e, s);
    if (st != orSuccess) {
      CHECK_STATUS(orErrorStreamCaptureUnsupported, st);
      ++refused;
      continue;
    }
    ++ran;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (orEventQuery(e) != orSuccess)
      if (std::chrono::steady_clock::now() > deadline) {
        ++stuck;
        break;
      }
  }
  stop.store(true);
  capturer.join();
  CHECK_EQ(stuck, 0);
  CHECK(ran > 0);
  (void)refused;
  CHECK_OK(orEventDestroy(e));
  CHECK_OK(orStreamDestroy(s));
}

// A graph handle is never reused: a destroyed graph's handle is refused, where it named the
// next graph created at the same address. One of two destroys of a graph wins.
TEST(graph_handles_are_not_reused) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::atomic<int> first{0}, second{0};
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(openreg::launch(s, "test::first", [&] { ++first; }));
  orGraph_t g1 = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g1));
  CHECK_OK(orGraphDestroy(g1));
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(openreg::launch(s, "test::second", [&] { ++second; }));
  orGraph_t g2 = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g2));
  CHECK(g2 != g1);
  CHECK_STATUS(orErrorInvalidResourceHandle, orGraphLaunch(g1, s));
  CHECK_MESSAGE_HAS("destroyed");
  CHECK_STATUS(orErrorInvalidResourceHandle, orGraphDestroy(g1));
  size_t n = 0;
  CHECK_STATUS(orErrorInvalidResourceHandle, orGraphGetNodeCount(g1, &n));
  CHECK_OK(orGraphLaunch(g2, s));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(second.load(), 1);
  CHECK_EQ(first.load(), 0);
  std::atomic<int> wins{0};
  std::vector<std::thread> destroyers;
  for (int i = 0; i < 4; ++i)
    destroyers.emplace_back([&] {
      if (orGraphDestroy(g2) == orSuccess) ++wins;
    });
  for (auto& t : destroyers) t.join();
  CHECK_EQ(wins.load(), 1);
  CHECK_OK(orStreamDestroy(s));
}

// orGraphDestroy while another thread is in orGraphLaunch of that graph waits for the launch to
// queue its items (it deleted the graph under the launching loop: a segfault).
TEST(graph_destroy_during_a_launch_waits_for_it) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::atomic<int> runs{0};
  constexpr int kItems = 20000;
  CHECK_OK(orStreamBeginCapture(s));
  for (int i = 0; i < kItems; ++i) CHECK_OK(openreg::launch(s, "test::count", [&] { ++runs; }));
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g));
  for (int round = 0; round < 3; ++round) {
    orGraph_t h = g;
    if (round > 0) {  // a fresh graph each round: the last one was destroyed
      CHECK_OK(orStreamBeginCapture(s));
      for (int i = 0; i < kItems; ++i) CHECK_OK(openreg::launch(s, "test::count", [&] { ++runs; }));
      CHECK_OK(orStreamEndCapture(s, &h));
    }
    runs = 0;
    std::atomic<bool> started{false};
    std::atomic<orStatus> launched{orErrorNotReady};  // not yet
    std::thread launcher([&] {
      started = true;
      launched = orGraphLaunch(h, s);
    });
    while (!started.load()) std::this_thread::yield();
    CHECK_OK(orGraphDestroy(h));  // waits for the launch in progress, then for its work
    launcher.join();
    CHECK_OK(orStreamSynchronize(s));
    // Either the launch came first (all its items ran) or the destroy did (refused, none ran).
    if (launched == orSuccess)
      CHECK_EQ(runs.load(), kItems);
    else
      CHECK(launched == orErrorInvalidResourceHandle && runs.load() == 0);
  }
  CHECK_OK(orStreamDestroy(s));
}

// A graph replayed while another one captures is copied into it without its arguments: the
// second keeps the first alive, so destroying the first leaves the second's replays valid.
TEST(graph_replayed_into_a_capture_outlives_its_handle) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  int* d = nullptr;
  CHECK_OK(orMalloc(reinterpret_cast<void**>(&d), sizeof(int)));
  CHECK_OK(orMemset(d, 0, sizeof(int)));
  auto token = std::make_shared<int>(0);  // owned by the kernel's arguments too
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(openreg::launch(s, "test::increment", [d, token] { ++*openreg::kernel_pointer(d); }));
  orGraph_t inner = nullptr, outer = nullptr;
  CHECK_OK(orStreamEndCapture(s, &inner));
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(orGraphLaunch(inner, s));
  CHECK_OK(orStreamEndCapture(s, &outer));
  CHECK_OK(orGraphDestroy(inner));
  CHECK_EQ(static_cast<int>(token.use_count()), 2);  // the arguments live on for the outer graph
  CHECK_OK(orGraphLaunch(outer, s));
  CHECK_OK(orGraphLaunch(outer, s));
  CHECK_OK(orStreamSynchronize(s));
  int host = 0;
  CHECK_OK(orMemcpy(&host, d, sizeof(int), orMemcpyDeviceToHost));
  CHECK_EQ(host, 2);
  CHECK_OK(orGraphDestroy(outer));
  CHECK_EQ(static_cast<int>(token.use_count()), 1);
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

// As CUDA: no capture on the default stream (other threads' work would land in the graph), and
// no device-wide synchronize while a stream of the device captures.
TEST(graph_capture_refusals) {
  CHECK_STATUS(orErrorStreamCaptureUnsupported, orStreamBeginCapture(nullptr));
  CHECK_MESSAGE_HAS("default stream");
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreate(&e));
  CHECK_OK(orEventRecord(e, nullptr));
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_STATUS(orErrorStreamCaptureUnsupported, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("cannot synchronize a device");
  // A captured wait would hold the event's present generation: replays would never wait (an
  // event already complete, and one still pending, alike).
  CHECK_STATUS(orErrorStreamCaptureUnsupported, orStreamWaitEvent(s, e, 0));
  CHECK_MESSAGE_HAS("cannot wait for an event recorded outside the capture");
  // A refused call invalidates the capture, as on CUDA: its end fails and there is no graph (it
  // was launchable, with the work captured around the refused call).
  orGraph_t g = nullptr;
  CHECK_STATUS(orErrorStreamCaptureUnsupported, orStreamEndCapture(s, &g));
  CHECK_MESSAGE_HAS("the capture was invalidated by a call it refused (cannot synchronize a device");
  CHECK(g == nullptr);
  int capturing = 1;
  CHECK_OK(orStreamIsCapturing(s, &capturing));
  CHECK(capturing == 0);
  CHECK_OK(orStreamBeginCapture(s));  // a capture without refusals ends with a graph
  CHECK_OK(orStreamEndCapture(s, &g));
  size_t nodes = 1;
  CHECK_OK(orGraphGetNodeCount(g, &nodes));
  CHECK(nodes == 0);
  CHECK_OK(orGraphDestroy(g));
  CHECK_OK(orStreamWaitEvent(s, e, 0));  // outside the capture, as before
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orEventDestroy(e));
  CHECK_OK(orStreamDestroy(s));
}

// A stream destroyed while it captures takes the capture with it: the next stream created, which
// reuses its slot, started out capturing, and its kernels were recorded, never run.
TEST(graph_capture_ends_with_its_stream) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(openreg::launch(s, "test::captured", [] {}));
  CHECK_OK(orStreamDestroy(s));
  orStream_t t = nullptr;
  CHECK_OK(orStreamCreate(&t));
  int capturing = 1;
  CHECK_OK(orStreamIsCapturing(t, &capturing));
  CHECK_EQ(capturing, 0);
  std::atomic<int> ran{0};
  CHECK_OK(openreg::launch(t, "test::runs", [&] { ran++; }));
  CHECK_OK(orStreamSynchronize(t));
  CHECK_EQ(ran.load(), 1);
  CHECK_OK(orStreamDestroy(t));
}

// Destroying a graph waits for its replays without taking a failed kernel's error: the user's
// next synchronising call still reports it.
TEST(graph_destroy_leaves_kernel_errors_to_the_user) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(openreg::launch(s, "test::captured", [] {}));
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g));
  CHECK_OK(orGraphLaunch(g, s));
  CHECK_OK(orLaunchKernel(s, "test::fails", [](void*) { return orKernelFail("lost?"); }, nullptr, nullptr));
  CHECK_OK(orGraphDestroy(g));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("test::fails");
  CHECK_OK(orStreamDestroy(s));
}

// A host asleep in a synchronize is woken when the work it waits for is done, not after every
// item before it: each wake-up takes a core from the kernels still running.
TEST(stream_synchronize_is_woken_once) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gate", [&gate] { gate.wait(); }));
  const int n = 200;
  std::vector<int> seen;
  for (int i = 0; i < n; ++i) {
    CHECK_OK(openreg::launch(s, "test::append", [&seen, i] {
      std::this_thread::sleep_for(100us);  // long enough for a woken host to be back asleep
      seen.push_back(i);
    }));
  }
  orRuntimeCounters before{}, after{};
  CHECK_OK(orGetCounters(&before));
  CHECK_OK(orSetBlockingWaitHooks(&wait_hooks::begin, &wait_hooks::end));
  std::thread opener = open_once_the_host_waits(gate);  // the 200 items then outlast the host's spin
  CHECK_OK(orStreamSynchronize(s));
  opener.join();
  CHECK_OK(orSetBlockingWaitHooks(nullptr, nullptr));
  CHECK_OK(orGetCounters(&after));
  check_ran_in_order(seen, n);
  // One wake-up at the end of the queue, a couple more if the condition variable wakes spuriously;
  // a host woken per item would count about n.
  CHECK(after.waitWakeups - before.waitWakeups >= 1);
  CHECK(after.waitWakeups - before.waitWakeups <= 3);
  CHECK_OK(orStreamDestroy(s));
}

TEST(stream_priorities) {
  int least = 99, greatest = 99;
  CHECK_OK(orDeviceGetStreamPriorityRange(&least, &greatest));
  CHECK_EQ(least, 0);
  CHECK_EQ(greatest, -1);
  CHECK(greatest <= least);  // lower number = higher priority, as on CUDA
  CHECK_OK(orDeviceGetStreamPriorityRange(nullptr, nullptr));
  struct Case {
    int requested, expected;
  };
  for (Case c : {Case{0, 0}, Case{-1, -1}, Case{-7, -1}, Case{5, 0}, Case{least, least}, Case{greatest, greatest}}) {
    orStream_t s = nullptr;
    CHECK_OK(orStreamCreateWithPriority(&s, orStreamDefault, c.requested));
    int p = 42;
    CHECK_OK(orStreamGetPriority(s, &p));
    CHECK_EQ(p, c.expected);
    std::atomic<bool> ran{false};
    CHECK_OK(openreg::launch(s, "test::prio", [&] { ran = true; }));
    CHECK_OK(orStreamSynchronize(s));
    CHECK(ran.load());
    CHECK_OK(orStreamDestroy(s));
  }
  int p = 42;
  CHECK_OK(orStreamGetPriority(nullptr, &p));
  CHECK_EQ(p, 0);
  orStream_t s = nullptr;
  CHECK_STATUS(orErrorInvalidValue, orStreamCreateWithPriority(&s, 12345, 0));
  CHECK_STATUS(orErrorInvalidValue, orStreamCreate(nullptr));
}

TEST(stream_destroy_and_invalid_handles) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  // Destroy waits for the queued work.
  std::atomic<bool> ran{false};
  CHECK_OK(openreg::launch(s, "test::slow", [&] {
    std::this_thread::sleep_for(30ms);
    ran = true;
  }));
  CHECK_OK(orStreamDestroy(s));
  CHECK(ran.load());
  // Every use of the destroyed handle is refused.
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamQuery(s));
  CHECK_MESSAGE_HAS("destroyed");
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamSynchronize(s));
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamDestroy(s));
  int dev = -1;
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamGetDevice(s, &dev));
  char buf[16];
  CHECK_STATUS(orErrorInvalidResourceHandle, orMemcpyAsync(buf, buf + 8, 8, orMemcpyHostToHost, s));
  // A refused launch still frees the kernel's arguments.
  static std::atomic<int> deleted{0};
  std::atomic<bool> ran2{false};
  CHECK_STATUS(orErrorInvalidResourceHandle,
               orLaunchKernel(s, "test::refused", [](void*) { return orSuccess; }, &ran2, [](void*) { deleted++; }));
  CHECK_EQ(deleted.load(), 1);
  CHECK_STATUS(orErrorInvalidResourceHandle, openreg::launch(s, "test::refused", [&] { ran2 = true; }));
  // The slot is recycled, the old handle stays dead.
  orStream_t s2 = nullptr;
  CHECK_OK(orStreamCreate(&s2));
  CHECK(s2 != s);
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamQuery(s));
  CHECK_OK(openreg::launch(s2, "test::after", [&] { ran2 = true; }));
  CHECK_OK(orStreamSynchronize(s2));
  CHECK(ran2.load());
  // Made-up handles.
  for (uintptr_t bogus : {uintptr_t{0x1}, uintptr_t{0x12345678}, (uintptr_t{0xdeadbeef} << 32) | 1,
                          (uintptr_t{3} << 32) | 0xfffff, ~uintptr_t{0}}) {
    auto h = reinterpret_cast<orStream_t>(bogus);
    CHECK_STATUS(orErrorInvalidResourceHandle, orStreamQuery(h));
    CHECK_STATUS(orErrorInvalidResourceHandle, orStreamSynchronize(h));
    CHECK_STATUS(orErrorInvalidResourceHandle, orStreamDestroy(h));
  }
  // The default stream cannot be destroyed.
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamDestroy(nullptr));
  CHECK_MESSAGE_HAS("default stream");
  CHECK_OK(orStreamQuery(nullptr));
  CHECK_OK(orStreamDestroy(s2));
}

// A launch that comes while orStreamDestroy drains the stream is refused (its arguments freed):
// accepted, it ran unlinked from its device, and neither device synchronisation nor orFree waited
// for it (it wrote into memory handed out again). A second destroy of the handle is refused.
TEST(stream_destroy_refuses_work_launched_while_it_drains) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::held", [&] { gate.wait(); }));
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    CHECK_OK(orStreamDestroy(s));
    destroyed = true;
  });
  // Launches while the destroy drains: refused once it began. Until then they are accepted and
  // drained with the rest; either way none is left behind.
  std::atomic<int> ran{0}, deleted{0};
  int refused = 0;
  const auto deadline = Clock::now() + 20s;
  while (refused == 0) {
    if (Clock::now() > deadline) FAIL("a launch during the destroy was never refused");
    struct Args {
      std::atomic<int>* ran;
      std::atomic<int>* deleted;
    };
    const orStatus st = orLaunchKernel(
        s, "test::late",
        [](void* p) {
          static_cast<Args*>(p)->ran->fetch_add(1);
          return orSuccess;
        },
        new Args{&ran, &deleted},
        [](void* p) {
          static_cast<Args*>(p)->deleted->fetch_add(1);
          delete static_cast<Args*>(p);
        });
    if (st != orSuccess) {
      CHECK_EQ(st, orErrorInvalidResourceHandle);
      CHECK_MESSAGE_HAS("destroyed");
      ++refused;
    }
    std::this_thread::yield();
  }
  CHECK(!destroyed.load());  // still draining: the gate holds the stream
  // A record is refused too, and leaves its event as it was (a generation that never ran left it
  // not ready for good).
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreate(&e));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventRecord(e, s));
  CHECK_OK(orEventQuery(e));
  CHECK_OK(orEventSynchronize(e));
  CHECK_OK(orEventDestroy(e));
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamDestroy(s));  // one destroy wins
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamBeginCapture(s));
  gate.release();
  destroyer.join();
  CHECK_OK(orDeviceSynchronize());
  // Every accepted launch ran before the destroy returned; every launch's arguments were freed.
  const int accepted = deleted.load() - refused;
  CHECK_EQ(ran.load(), accepted);
  // The recycled slot starts out usable, whoever gets it: here device 1's default stream, made
  // when device 1 is first used (it refused every launch while the slot kept `dying`).
  CHECK_OK(orSetDevice(1));
  check_stream_still_runs(nullptr);
  CHECK_OK(orSetDevice(0));
  orStream_t again = nullptr;
  CHECK_OK(orStreamCreate(&again));
  check_stream_still_runs(again);
  CHECK_OK(orStreamDestroy(again));
}

// A kernel that calls a synchronising function which would wait for its own stream is refused
// with orErrorNotPermitted (as CUDA refuses runtime calls from a host function): it waited for
// itself forever. Waits that do not include its stream still work.
TEST(waits_from_a_kernel_for_its_own_stream_are_refused) {
  orStream_t s = nullptr, other = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orStreamCreate(&other));
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 64));
  orEvent_t e = nullptr, done = nullptr;
  CHECK_OK(orEventCreate(&e));
  CHECK_OK(orEventCreate(&done));
  CHECK_OK(openreg::launch(other, "test::other", [] {}));
  CHECK_OK(orEventRecord(done, other));
  CHECK_OK(orStreamSynchronize(other));
  std::vector<std::pair<std::string, orStatus>> got;
  std::string message;
  Gate recorded;
  CHECK_OK(openreg::launch(s, "test::waits", [&] {
    recorded.wait();  // e's record is queued behind this kernel
    got.emplace_back("stream", orStreamSynchronize(s));
    message = orGetLastErrorMessage();
    got.emplace_back("device", orDeviceSynchronize());
    got.emplace_back("event", orEventSynchronize(e));
    got.emplace_back("free", orFree(d));
    char pageable[8];  // a copy to pageable memory returns once done: on s, it would wait for s
    got.emplace_back("copy", orMemcpyAsync(pageable, d, 8, orMemcpyDeviceToHost, s));
    got.emplace_back("memset", orMemset(d, 0, 64));  // on the default stream: not this kernel's
    got.emplace_back("destroy", orStreamDestroy(s));
    got.emplace_back("other stream", orStreamSynchronize(other));
    got.emplace_back("done event", orEventSynchronize(done));
  }));
  CHECK_OK(orEventRecord(e, s));
  recorded.release();
  CHECK_OK(orStreamSynchronize(s));
  const std::vector<std::pair<std::string, orStatus>> want = {
      {"stream", orErrorNotPermitted},  {"device", orErrorNotPermitted}, {"event", orErrorNotPermitted},
      {"free", orErrorNotPermitted},    {"copy", orErrorNotPermitted},   {"memset", orSuccess},
      {"destroy", orErrorNotPermitted}, {"other stream", orSuccess},     {"done event", orSuccess}};
  CHECK_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) FAIL(want[i].first + ": " + status_str(got[i].second));
  CHECK(contains(message, "orStreamSynchronize was called from a kernel"));
  CHECK_OK(orFree(d));  // nothing was freed or destroyed by the refused calls
  check_stream_still_runs(s);
  CHECK_OK(orEventDestroy(e));
  CHECK_OK(orEventDestroy(done));
  CHECK_OK(orStreamDestroy(s));
  CHECK_OK(orStreamDestroy(other));
}

TEST(stream_default_stream_handles) {
  orStream_t d0 = nullptr, d1 = nullptr;
  CHECK_OK(orDeviceGetDefaultStream(0, &d0));
  CHECK_OK(orDeviceGetDefaultStream(1, &d1));
  CHECK(d0 != nullptr && d1 != nullptr && d0 != d1);
  orStream_t again = nullptr;
  CHECK_OK(orDeviceGetDefaultStream(0, &again));
  CHECK(again == d0);
  int dev = -1;
  CHECK_OK(orStreamGetDevice(d1, &dev));
  CHECK_EQ(dev, 1);
  // The handle is the same queue as NULL on that device.
  Gate gate;
  CHECK_OK(openreg::launch(nullptr, "test::gated_null", [&] { gate.wait(); }));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(d0));
  gate.release();
  CHECK_OK(orStreamSynchronize(d0));
  CHECK_OK(orStreamQuery(nullptr));
  // NULL means the current device's default stream; device 1's is usable from device 0.
  std::atomic<int> seen{-1};
  CHECK_OK(openreg::launch(d1, "test::on_dev1", [&] {
    int d = -1;
    orGetDevice(&d);
    seen = d;
  }));
  CHECK_OK(orStreamSynchronize(d1));
  CHECK_EQ(seen.load(), 1);
  // Default streams cannot be destroyed, by handle either.
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamDestroy(d0));
  CHECK_MESSAGE_HAS("default stream");
  CHECK_OK(orStreamQuery(d0));
  int count = 0;
  CHECK_OK(orGetDeviceCount(&count));
  CHECK_STATUS(orErrorInvalidDevice, orDeviceGetDefaultStream(count, &again));
  CHECK_STATUS(orErrorInvalidDevice, orDeviceGetDefaultStream(-1, &again));
  CHECK_STATUS(orErrorInvalidValue, orDeviceGetDefaultStream(0, nullptr));
}

// One thread records an event on a stream while another makes the same stream wait for it: the
// wait must never land in the queue before the record whose generation it waits for.
TEST(stream_wait_for_an_event_recorded_concurrently_on_it) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreateWithFlags(&e, orEventDisableTiming));
  const int n = static_cast<int>(20000 * test_scale());
  std::atomic<bool> go{false};
  std::thread recorder([&] {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < n; ++i) CHECK_OK(orEventRecord(e, s));
  });
  std::thread waiter([&] {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < n; ++i) CHECK_OK(orStreamWaitEvent(s, e, 0));
  });
  go.store(true);
  recorder.join();
  waiter.join();
  CHECK_OK(orStreamSynchronize(s));  // hangs (test timeout) if a wait was queued before its record
  CHECK_OK(orEventQuery(e));
  CHECK_OK(orEventDestroy(e));
  CHECK_OK(orStreamDestroy(s));
}

TEST(stream_wait_event_orders_across_streams) {
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreateWithFlags(&ev, orEventDisableTiming));
  int shared_value = 0;  // plain int: the event is the only ordering between the streams
  int observed = -1;
  Gate gate;
  CHECK_OK(openreg::launch(a, "test::producer", [&] {
    gate.wait();
    std::this_thread::sleep_for(20ms);
    shared_value = 42;
  }));
  CHECK_OK(orEventRecord(ev, a));
  CHECK_OK(orStreamWaitEvent(b, ev, 0));
  CHECK_OK(openreg::launch(b, "test::consumer", [&] { observed = shared_value; }));
  CHECK_STATUS(orErrorNotReady, orEventQuery(ev));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(b));  // b is blocked behind a's event
  gate.release();
  CHECK_OK(orStreamSynchronize(b));
  CHECK_EQ(observed, 42);
  CHECK_OK(orEventQuery(ev));

  // Across devices: a stream on device 1 waits for an event recorded on device 0.
  CHECK_OK(orSetDevice(1));
  orStream_t c = nullptr;
  CHECK_OK(orStreamCreate(&c));
  CHECK_OK(orSetDevice(0));
  Gate gate2;
  CHECK_OK(openreg::launch(a, "test::producer2", [&] {
    gate2.wait();
    shared_value = 7;
  }));
  CHECK_OK(orEventRecord(ev, a));
  CHECK_OK(orStreamWaitEvent(c, ev, 0));
  CHECK_OK(openreg::launch(c, "test::consumer2", [&] { observed = shared_value; }));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(c));
  gate2.release();
  CHECK_OK(orStreamSynchronize(c));
  CHECK_EQ(observed, 7);

  // Waiting on a never-recorded or completed event does not block.
  orEvent_t fresh = nullptr;
  CHECK_OK(orEventCreate(&fresh));
  CHECK_OK(orStreamWaitEvent(b, fresh, 0));
  CHECK_OK(orStreamWaitEvent(b, ev, 0));
  CHECK_OK(orStreamSynchronize(b));
  CHECK_STATUS(orErrorInvalidValue, orStreamWaitEvent(b, ev, 7));
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamWaitEvent(b, reinterpret_cast<orEvent_t>(uintptr_t{0x77}), 0));
  CHECK_OK(orEventDestroy(fresh));
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
  CHECK_OK(orStreamDestroy(c));
}

// ===========================================================================
// Events

TEST(event_record_query_synchronize) {
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreate(&ev));
  CHECK_OK(orEventQuery(ev));        // never recorded: complete
  CHECK_OK(orEventSynchronize(ev));  // and does not block
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  Gate gate;
  std::atomic<bool> ran{false};
  CHECK_OK(openreg::launch(s, "test::gated", [&] {
    gate.wait();
    ran = true;
  }));
  CHECK_OK(orEventRecord(ev, s));
  CHECK_STATUS(orErrorNotReady, orEventQuery(ev));
  gate.release();
  CHECK_OK(orEventSynchronize(ev));
  CHECK(ran.load());
  CHECK_OK(orEventQuery(ev));
  // Re-recording moves the event to the new point.
  Gate gate2;
  CHECK_OK(openreg::launch(s, "test::gated2", [&] { gate2.wait(); }));
  CHECK_OK(orEventRecord(ev, s));
  CHECK_STATUS(orErrorNotReady, orEventQuery(ev));
  gate2.release();
  CHECK_OK(orEventSynchronize(ev));
  // Recording on the default stream.
  CHECK_OK(orEventRecord(ev, nullptr));
  CHECK_OK(orEventSynchronize(ev));
  CHECK_OK(orEventQuery(ev));
  CHECK_STATUS(orErrorInvalidValue, orEventCreate(nullptr));
  CHECK_STATUS(orErrorInvalidValue, orEventCreateWithFlags(&ev, 0x100));
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orStreamDestroy(s));
}

// A copy kind that is no orMemcpyKind is named as such, not blamed on the pointers.
TEST(memcpy_unknown_kind) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 8));
  char host[8] = {};
  for (int kind : {99, -5}) {
    CHECK_STATUS(orErrorInvalidMemcpyDirection, orMemcpy(d, host, 8, static_cast<orMemcpyKind>(kind)));
    CHECK_MESSAGE_HAS("unknown copy kind " + std::to_string(kind));
  }
  CHECK_OK(orFree(d));
}

// An event's time is its last record's: an earlier record, queued behind work on another stream,
// that runs later does not overwrite it (the elapsed time changed sign after the fact).
TEST(event_time_is_the_last_records) {
  orStream_t busy = nullptr, s = nullptr;
  CHECK_OK(orStreamCreate(&busy));
  CHECK_OK(orStreamCreate(&s));
  orEvent_t a = nullptr, b = nullptr;
  CHECK_OK(orEventCreate(&a));
  CHECK_OK(orEventCreate(&b));
  Gate gate;
  CHECK_OK(openreg::launch(busy, "test::held", [&] { gate.wait(); }));
  CHECK_OK(orEventRecord(a, busy));  // superseded by the record below, runs after it
  CHECK_OK(orEventRecord(a, s));
  sleep_kernel_ms(s, 20);
  CHECK_OK(orEventRecord(b, s));
  CHECK_OK(orEventSynchronize(b));
  float before = -1, after = -1;
  CHECK_OK(orEventElapsedTime(&before, a, b));
  if (!(before >= 20.0f * 0.999f)) FAIL("elapsed " + std::to_string(before) + " ms < 20 ms");
  std::this_thread::sleep_for(30ms);
  gate.release();
  CHECK_OK(orStreamSynchronize(busy));  // the superseded record has run now
  CHECK_OK(orEventElapsedTime(&after, a, b));
  CHECK_EQ(after, before);
  CHECK_OK(orEventDestroy(a));
  CHECK_OK(orEventDestroy(b));
  CHECK_OK(orStreamDestroy(busy));
  CHECK_OK(orStreamDestroy(s));
}

TEST(event_elapsed_time) {
  orEvent_t start = nullptr, end = nullptr;
  CHECK_OK(orEventCreate(&start));
  CHECK_OK(orEventCreate(&end));
  float ms = -1;
  // Never recorded.
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, start, end));
  CHECK_MESSAGE_HAS("recorded");
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orEventRecord(start, s));
  sleep_kernel_ms(s, 20);
  CHECK_OK(orEventRecord(end, s));
  CHECK_OK(orEventSynchronize(end));
  CHECK_OK(orEventElapsedTime(&ms, start, end));
  // Lower bound only: the sleep ran between the two records.
  if (!(ms >= 20.0f * 0.999f)) FAIL("elapsed " + std::to_string(ms) + " ms < 20 ms");
  CHECK(ms < 10000.0f);
  CHECK_OK(orEventElapsedTime(&ms, end, start));
  CHECK(ms <= -20.0f * 0.999f);
  // One of the two not recorded.
  orEvent_t unrecorded = nullptr;
  CHECK_OK(orEventCreate(&unrecorded));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, start, unrecorded));
  // Not complete yet.
  Gate gate;
  CHECK_OK(openreg::launch(s, "test::gated", [&] { gate.wait(); }));
  CHECK_OK(orEventRecord(end, s));
  CHECK_STATUS(orErrorNotReady, orEventElapsedTime(&ms, start, end));
  gate.release();
  CHECK_OK(orEventSynchronize(end));
  CHECK_OK(orEventElapsedTime(&ms, start, end));
  // Timing disabled.
  orEvent_t quiet = nullptr;
  CHECK_OK(orEventCreateWithFlags(&quiet, orEventDisableTiming));
  CHECK_OK(orEventRecord(quiet, s));
  CHECK_OK(orEventSynchronize(quiet));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, start, quiet));
  CHECK_MESSAGE_HAS("timing");
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, quiet, end));
  CHECK_STATUS(orErrorInvalidValue, orEventElapsedTime(nullptr, start, end));
  // Events of two devices.
  orEvent_t elsewhere = nullptr;
  CHECK_OK(orEventCreate(&elsewhere));
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orEventRecord(elsewhere, nullptr));
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orEventSynchronize(elsewhere));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, start, elsewhere));
  CHECK_MESSAGE_HAS("two devices");
  for (auto e : {start, end, unrecorded, quiet, elsewhere}) CHECK_OK(orEventDestroy(e));
  CHECK_OK(orStreamDestroy(s));
}

TEST(event_destroyed_and_invalid_handles) {
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreate(&ev));
  CHECK_OK(orEventRecord(ev, nullptr));
  CHECK_OK(orEventDestroy(ev));
  float ms = 0;
  orEvent_t other = nullptr;
  CHECK_OK(orEventCreate(&other));  // probably reuses the slot
  CHECK(other != ev);
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventQuery(ev));
  CHECK_MESSAGE_HAS("event");
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventSynchronize(ev));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventRecord(ev, nullptr));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventDestroy(ev));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, ev, other));
  CHECK_STATUS(orErrorInvalidResourceHandle, orStreamWaitEvent(nullptr, ev, 0));
  // The recycled slot starts as a fresh, never-recorded event.
  CHECK_OK(orEventQuery(other));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventElapsedTime(&ms, other, other));
  for (uintptr_t bogus : {uintptr_t{0}, uintptr_t{0x2}, (uintptr_t{0xabcdef01} << 32) | 1, ~uintptr_t{0}}) {
    auto h = reinterpret_cast<orEvent_t>(bogus);
    CHECK_STATUS(orErrorInvalidResourceHandle, orEventQuery(h));
    CHECK_STATUS(orErrorInvalidResourceHandle, orEventDestroy(h));
  }
  CHECK_OK(orEventDestroy(other));
}

TEST(event_destroy_does_not_wait_for_its_records) {
  // cudaEventDestroy returns at once and the event's resources go when its recorded work is done;
  // collective backends create and drop events per operation, so a waiting destroy would make every
  // collective synchronous. If orEventDestroy waited here, the gate would fail the test.
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  Gate gate;
  int shared_value = 0;
  int observed = -1;
  CHECK_OK(openreg::launch(a, "test::producer", [&] {
    gate.wait();
    shared_value = 7;
  }));
  orEvent_t waited = nullptr;
  CHECK_OK(orEventCreateWithFlags(&waited, orEventDisableTiming));
  CHECK_OK(orEventRecord(waited, a));
  CHECK_OK(orStreamWaitEvent(b, waited, 0));
  CHECK_OK(openreg::launch(b, "test::consumer", [&] { observed = shared_value; }));
  CHECK_OK(orEventDestroy(waited));
  std::vector<orEvent_t> events(1000);
  for (orEvent_t& ev : events) {
    CHECK_OK(orEventCreate(&ev));
    CHECK_OK(orEventRecord(ev, a));
  }
  for (orEvent_t ev : events) CHECK_OK(orEventDestroy(ev));
  // The destroyed handles are dead at once, and their slots are not recycled while records are
  // queued: a recycled slot is marked complete, which would let b's wait run early.
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventQuery(waited));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventQuery(events[0]));
  std::vector<orEvent_t> fresh(1001);
  for (orEvent_t& ev : fresh) {
    CHECK_OK(orEventCreate(&ev));
    CHECK_OK(orEventQuery(ev));  // never recorded
  }
  CHECK_STATUS(orErrorNotReady, orStreamQuery(b));
  gate.release();
  CHECK_OK(orStreamSynchronize(b));
  CHECK_EQ(observed, 7);
  // Once the records ran, the slots are recycled as fresh events.
  for (orEvent_t ev : fresh) CHECK_OK(orEventDestroy(ev));
  for (int i = 0; i < 3000; ++i) {
    orEvent_t ev = nullptr;
    CHECK_OK(orEventCreate(&ev));
    CHECK_OK(orEventQuery(ev));
    CHECK_OK(orEventDestroy(ev));
  }
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
}

// ===========================================================================
// Errors

TEST(error_kernel_fail_reported_once) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orLaunchKernel(s, "test::failing_kernel", [](void*) { return orKernelFail("boom"); }, nullptr, nullptr));
  // The launch itself succeeded; the failure arrives with the next synchronising call.
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(s));
  CHECK_MESSAGE_HAS("test::failing_kernel");
  CHECK_MESSAGE_HAS("boom");
  CHECK_MESSAGE_HAS("device 0");
  // Reported once; the device keeps working.
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orDeviceSynchronize());
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) CHECK_OK(openreg::launch(s, "test::after", [&] { ran++; }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(ran.load(), 10);

  // Reported by orDeviceSynchronize as well, and through another stream of the device.
  CHECK_OK(
      orLaunchKernel(s, "test::failing_again", [](void*) { return orKernelFail("boom again"); }, nullptr, nullptr));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("test::failing_again");
  CHECK_MESSAGE_HAS("boom again");
  CHECK_OK(orDeviceSynchronize());

  // Only the first failure is kept until it is reported.
  CHECK_OK(orLaunchKernel(s, "test::first", [](void*) { return orKernelFail("first"); }, nullptr, nullptr));
  CHECK_OK(orLaunchKernel(s, "test::second", [](void*) { return orKernelFail("second"); }, nullptr, nullptr));
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(s));
  CHECK_MESSAGE_HAS("test::first");
  CHECK(!contains(orGetLastErrorMessage(), "test::second"));
  CHECK_OK(orStreamSynchronize(s));

  // A failure on device 1 is not reported on device 0.
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orLaunchKernel(nullptr, "test::dev1_fail", [](void*) { return orKernelFail("dev1"); }, nullptr, nullptr));
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orSetDevice(1));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("device 1");
  CHECK_MESSAGE_HAS("dev1");
  CHECK_OK(orSetDevice(0));

  // orEventSynchronize reports the error of the event's device.
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreate(&ev));
  CHECK_OK(orLaunchKernel(s, "test::before_event", [](void*) { return orKernelFail("evt"); }, nullptr, nullptr));
  CHECK_OK(orEventRecord(ev, s));
  CHECK_STATUS(orErrorLaunchFailure, orEventSynchronize(ev));
  CHECK_MESSAGE_HAS("test::before_event");
  CHECK_OK(orEventSynchronize(ev));

  // And a synchronous memcpy.
  int* d = nullptr;
  CHECK_OK(orMalloc(reinterpret_cast<void**>(&d), sizeof(int)));
  CHECK_OK(orLaunchKernel(nullptr, "test::before_copy", [](void*) { return orKernelFail("cpy"); }, nullptr, nullptr));
  int v = 0;
  CHECK_STATUS(orErrorLaunchFailure, orMemcpy(&v, d, sizeof(int), orMemcpyDeviceToHost));
  CHECK_MESSAGE_HAS("test::before_copy");
  CHECK_OK(orMemcpy(&v, d, sizeof(int), orMemcpyDeviceToHost));
  CHECK_OK(orFree(d));
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orStreamDestroy(s));
}

// A failure the device holds can be asked for without waiting: peeked (left for the next
// synchronising call) or taken (reported now). A copy that returns once it is done (to pageable
// memory, even asynchronous) reports it as a synchronous copy does. The message says how to have
// it reported at the launch.
TEST(error_take_and_peek_without_waiting) {
  if (std::getenv("OPENREG_LAUNCH_BLOCKING")) skip_now("OPENREG_LAUNCH_BLOCKING is set");
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  auto fail_and_finish = [&](const char* name) {
    CHECK_OK(orLaunchKernel(s, name, [](void*) { return orKernelFail("boom"); }, nullptr, nullptr));
    while (orStreamQuery(s) == orErrorNotReady) std::this_thread::yield();  // the runtime's query reports nothing
  };
  CHECK_OK(orDevicePeekError(0));
  CHECK_OK(orDeviceTakeError(0));
  fail_and_finish("test::held");
  CHECK_OK(orDevicePeekError(1));  // another device's
  for (int i = 0; i < 2; ++i) {
    CHECK_STATUS(orErrorLaunchFailure, orDevicePeekError(0));
    CHECK_MESSAGE_HAS("kernel 'test::held' failed on openreg device 0: boom");
    CHECK_MESSAGE_HAS("set OPENREG_LAUNCH_BLOCKING=1 to report them at the launch");
  }
  CHECK_STATUS(orErrorLaunchFailure, orDeviceTakeError(0));
  CHECK_MESSAGE_HAS("test::held");
  CHECK_OK(orDeviceTakeError(0));  // reported once
  CHECK_OK(orDevicePeekError(0));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_STATUS(orErrorInvalidDevice, orDeviceTakeError(64));
  CHECK_MESSAGE_HAS("device index 64 is out of range");
  CHECK_STATUS(orErrorInvalidDevice, orDevicePeekError(-1));

  const size_t n = 64;
  std::vector<unsigned char> host(n, 7);
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, n));
  fail_and_finish("test::before_a_pageable_copy");
  CHECK_STATUS(orErrorLaunchFailure, orMemcpyAsync(host.data(), d, n, orMemcpyDeviceToHost, s));
  CHECK_MESSAGE_HAS("test::before_a_pageable_copy");
  fail_and_finish("test::before_a_pageable_upload");
  CHECK_STATUS(orErrorLaunchFailure, orMemcpyAsync(d, host.data(), n, orMemcpyHostToDevice, s));
  CHECK_OK(orStreamSynchronize(s));
  void* pinned = nullptr;
  CHECK_OK(orMallocHost(&pinned, n));
  fail_and_finish("test::before_a_pinned_copy");
  CHECK_OK(orMemcpyAsync(pinned, d, n, orMemcpyDeviceToHost, s));  // asynchronous: left to the sync
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(s));
  CHECK_MESSAGE_HAS("test::before_a_pinned_copy");

  // The device of an event's last record (-1 before any).
  orEvent_t e = nullptr;
  CHECK_OK(orEventCreate(&e));
  int device = 0;
  CHECK_OK(orEventGetDevice(e, &device));
  CHECK_EQ(device, -1);
  CHECK_OK(orSetDevice(1));
  CHECK_OK(orEventRecord(e, nullptr));
  CHECK_OK(orSetDevice(0));
  CHECK_OK(orEventGetDevice(e, &device));
  CHECK_EQ(device, 1);
  CHECK_STATUS(orErrorInvalidValue, orEventGetDevice(e, nullptr));
  CHECK_OK(orEventSynchronize(e));
  CHECK_OK(orEventDestroy(e));
  CHECK_STATUS(orErrorInvalidResourceHandle, orEventGetDevice(e, &device));
  CHECK_OK(orFreeHost(pinned));
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(s));
}

// OPENREG_LAUNCH_BLOCKING=1 (test_runtime.py sets it): each launch returns once its work is done,
// with the failure of the device, so the caller that launched a failing kernel gets the error.
// A launch recorded into a graph, or made from a kernel, does not wait.
TEST(launch_blocking_reports_at_the_launch) {
  const char* env = std::getenv("OPENREG_LAUNCH_BLOCKING");
  if (!env || std::string(env) != "1") skip_now("needs OPENREG_LAUNCH_BLOCKING=1 (test_runtime.py sets it)");
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::atomic<int> ran{0};
  sleep_kernel_ms(s, 50, &ran);
  CHECK_EQ(ran.load(), 1);  // done when the launch returned
  CHECK_STATUS(orErrorLaunchFailure,
               orLaunchKernel(s, "test::failing", [](void*) { return orKernelFail("at once"); }, nullptr, nullptr));
  CHECK_MESSAGE_HAS("kernel 'test::failing' failed on openreg device 0: at once");
  CHECK(!contains(orGetLastErrorMessage(), "OPENREG_LAUNCH_BLOCKING"));  // no hint: it is reported at the launch
  CHECK_OK(orStreamSynchronize(s));                                      // reported once
  // A graph: capturing returns at once, a replay once it ran, with its failure.
  CHECK_OK(orStreamBeginCapture(s));
  CHECK_OK(orLaunchKernel(s, "test::captured", [](void*) { return orKernelFail("replayed"); }, nullptr, nullptr));
  orGraph_t g = nullptr;
  CHECK_OK(orStreamEndCapture(s, &g));
  CHECK_STATUS(orErrorLaunchFailure, orGraphLaunch(g, s));
  CHECK_MESSAGE_HAS("test::captured");
  CHECK_OK(orGraphDestroy(g));
  // Asynchronous copies and memsets too: a copy that fails on the device fails its call.
  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(orMalloc(&a, 256));
  CHECK_OK(orMalloc(&b, 256));
  CHECK_OK(orMemsetAsync(a, 1, 256, s));
  CHECK_OK(orInjectFaults("copy:1"));
  CHECK_STATUS(orErrorLaunchFailure, orMemcpyAsync(b, a, 256, orMemcpyDeviceToDevice, s));
  CHECK_MESSAGE_HAS("kernel 'openreg::memcpy' failed");
  CHECK_OK(orInjectFaults(""));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orFree(a));
  CHECK_OK(orFree(b));
  // A kernel launching on its own stream does not wait for itself.
  std::atomic<int> inner{0};
  CHECK_OK(openreg::launch(s, "test::outer", [&] { CHECK_OK(openreg::launch(s, "test::inner", [&] { ++inner; })); }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(inner.load(), 1);
  CHECK_OK(orStreamDestroy(s));
}

TEST(error_kernel_exception) {
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  std::atomic<bool> after{false};
  CHECK_OK(openreg::launch(s, "test::throwing", [] { throw std::runtime_error("kaboom: bad input"); }));
  CHECK_OK(openreg::launch(s, "test::after_throw", [&] { after = true; }));
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(s));
  CHECK_MESSAGE_HAS("test::throwing");
  CHECK_MESSAGE_HAS("kaboom: bad input");
  CHECK(after.load());  // later work on the stream still ran
  CHECK_OK(orStreamSynchronize(s));
  // A raw kernel function that throws is caught by the worker as well.
  CHECK_OK(orLaunchKernel(
      s, "test::raw_throw", [](void*) -> orStatus { throw std::logic_error("raw failure"); }, nullptr, nullptr));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("test::raw_throw");
  CHECK_MESSAGE_HAS("raw failure");
  // A kernel returning an error status without a message names the status.
  CHECK_OK(orLaunchKernel(s, "test::status_only", [](void*) { return orErrorInvalidValue; }, nullptr, nullptr));
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(s));
  CHECK_MESSAGE_HAS("test::status_only");
  CHECK_MESSAGE_HAS("orErrorInvalidValue");
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i) CHECK_OK(openreg::launch(s, "test::ok", [&] { ran++; }));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_EQ(ran.load(), 5);
  // Launch argument validation.
  CHECK_STATUS(orErrorInvalidValue, orLaunchKernel(s, "test::null", nullptr, nullptr, nullptr));
  CHECK_OK(orStreamDestroy(s));
}

TEST(error_names_and_messages_are_per_thread) {
  CHECK(std::strcmp(orGetErrorName(orSuccess), "orSuccess") == 0);
  CHECK(std::strcmp(orGetErrorName(orErrorLaunchFailure), "orErrorLaunchFailure") == 0);
  CHECK(std::strcmp(orGetErrorName(orErrorForkedProcess), "orErrorForkedProcess") == 0);
  CHECK(std::strcmp(orGetErrorName(static_cast<orStatus>(999)), "orErrorUnknown") == 0);
  CHECK_STATUS(orErrorInvalidDevice, orSetDevice(-5));
  const std::string mine = orGetLastErrorMessage();
  CHECK(contains(mine, "orErrorInvalidDevice"));
  std::string theirs;
  std::thread([&] {
    theirs = orGetLastErrorMessage();  // a fresh thread has no error yet
    orStatus st = orFree(reinterpret_cast<void*>(0x1000));
    if (st != orErrorInvalidDevicePointer) theirs = "wrong status";
  }).join();
  CHECK(theirs.empty());
  CHECK_EQ(std::string(orGetLastErrorMessage()), mine);  // unchanged by the other thread
}

uint64_t wait_wakeups() {
  orRuntimeCounters c;
  CHECK_OK(orGetCounters(&c));
  return c.waitWakeups;
}

// A host thread waiting for the device spins on, without sleeping, while the running kernels leave
// it a CPU: a sleeper pays a wake-up when the work completes. Once the kernels' threads (their
// launch contexts' widths, orLaunchContextApply) take every CPU it sleeps, and gives its CPU to
// them. Its interpreter hooks run around the spin as around a sleep. Needs a spin longer than the
// kernels (OPENREG_WAIT_SPIN_US=1000000, test_runtime.py sets it).
TEST(stream_waiter_spins_while_cpus_are_free) {
  const char* env = std::getenv("OPENREG_WAIT_SPIN_US");
  if (!env || std::string(env) != "1000000") skip_now("needs OPENREG_WAIT_SPIN_US=1000000 (test_runtime.py sets it)");
  namespace lc = launch_context;
  CHECK_OK(orSetLaunchContextHooks(&lc::capture, &lc::apply));  // the word is the width
  CHECK_OK(orSetBlockingWaitHooks(&wait_hooks::begin, &wait_hooks::end));
  orDeviceProp prop;  // the CPUs the runtime counts (those the process may use)
  CHECK_OK(orGetDeviceProperties(&prop, 0));
  const int cpus = prop.multiProcessorCount;
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  // One thread's kernel: on two CPUs or more, the host keeps one.
  // Each kernel waits until the host is in its wait (the hook's begin), so that a late host does not
  // find it done already.
  lc::host_value = 1;
  uint64_t before = wait_wakeups();
  int begun = wait_hooks::begun.load();
  Gate narrow;
  CHECK_OK(openreg::launch(s, "test::narrow", [&] { narrow.wait(); }));
  std::thread opener = open_once_the_host_waits(narrow);
  CHECK_OK(orStreamSynchronize(s));
  opener.join();
  CHECK(cpus >= 2 ? wait_wakeups() == before : wait_wakeups() > before);
  CHECK_EQ(wait_hooks::begun.load(), begun + 1);
  CHECK_EQ(wait_hooks::ended.load(), wait_hooks::begun.load());
  // A kernel as wide as the machine: the host sleeps until it completes (30 ms after the host's
  // wait began, for its way from the hook to its sleep).
  lc::host_value = static_cast<uint64_t>(cpus);
  before = wait_wakeups();
  Gate wide;
  CHECK_OK(openreg::launch(s, "test::wide", [&] {
    wide.wait();
    std::this_thread::sleep_for(30ms);
  }));
  opener = open_once_the_host_waits(wide);
  CHECK_OK(orStreamSynchronize(s));
  opener.join();
  CHECK(wait_wakeups() - before >= 1);
  // An event wait behaves alike; a copy (no launch context) is one thread wide.
  lc::host_value = 1;
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreateWithFlags(&ev, orEventDisableTiming));
  before = wait_wakeups();
  Gate narrow_again;
  CHECK_OK(openreg::launch(s, "test::narrow", [&] { narrow_again.wait(); }));
  CHECK_OK(orEventRecord(ev, s));
  opener = open_once_the_host_waits(narrow_again);
  CHECK_OK(orEventSynchronize(ev));
  opener.join();
  CHECK(cpus >= 2 ? wait_wakeups() == before : wait_wakeups() > before);
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orSetLaunchContextHooks(nullptr, nullptr));
  CHECK_OK(orSetBlockingWaitHooks(nullptr, nullptr));
  CHECK_OK(orStreamDestroy(s));
}

// With OPENREG_SPIN_US=0 and OPENREG_WAIT_SPIN_US=0 every waiter and idle worker goes straight to sleep,
// so each launch and each wait exercises the condition-variable hand-off: a
// lost wake-up would hang here (the pytest timeout catches it).
TEST(stream_wakeups_without_spinning) {
  const char* env = std::getenv("OPENREG_SPIN_US");
  const char* wait_env = std::getenv("OPENREG_WAIT_SPIN_US");
  if (!env || std::atoi(env) != 0 || !wait_env || std::atoi(wait_env) != 0)
    skip_now("needs OPENREG_SPIN_US=0 and OPENREG_WAIT_SPIN_US=0 (test_runtime.py sets them)");
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  orEvent_t ev = nullptr;
  CHECK_OK(orEventCreateWithFlags(&ev, orEventDisableTiming));
  long value = 0;  // written on a, read on b: ordered only by the event
  long observed = 0;
  const int n = static_cast<int>(2000 * test_scale());
  for (int i = 1; i <= n; ++i) {
    CHECK_OK(openreg::launch(a, "test::write", [&value, i] { value = i; }));
    CHECK_OK(orEventRecord(ev, a));
    CHECK_OK(orStreamWaitEvent(b, ev, 0));
    CHECK_OK(openreg::launch(b, "test::read", [&] { observed = value; }));
    if (i % 3 == 0) CHECK_OK(orEventSynchronize(ev));
    CHECK_OK(orStreamSynchronize(b));
    CHECK_EQ(observed, static_cast<long>(i));
  }
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
}

// A malformed configuration is reported by every call, naming the variable. Each case runs
// with one malformed variable (test_runtime.py::CASE_ENV).
void check_config_rejected(const std::string& var, const std::string& value) {
  const char* env = std::getenv(var.c_str());
  if (!env || env != value) skip_now("needs " + var + "=" + value + " (test_runtime.py sets it)");
  int count = 0;
  CHECK_STATUS(orErrorInitialization, orGetDeviceCount(&count));
  CHECK_MESSAGE_HAS(var + "='" + value + "'");
  void* p = nullptr;
  CHECK_STATUS(orErrorInitialization, orMalloc(&p, 16));
  orStream_t s = nullptr;
  CHECK_STATUS(orErrorInitialization, orStreamCreate(&s));
  CHECK_STATUS(orErrorInitialization, orDeviceSynchronize());
}

TEST(config_invalid_environment) { check_config_rejected("OPENREG_DEVICE_MEMORY", "12X"); }
// 2^34 GiB does not fit in 64 bits: it used to wrap around to 0 bytes.
TEST(config_device_memory_overflow) { check_config_rejected("OPENREG_DEVICE_MEMORY", "17179869184G"); }
// It used to be read as 0 (no spinning).
TEST(config_invalid_spin) { check_config_rejected("OPENREG_SPIN_US", "abc"); }
TEST(config_invalid_wait_spin) { check_config_rejected("OPENREG_WAIT_SPIN_US", "-1"); }
TEST(config_invalid_launch_blocking) { check_config_rejected("OPENREG_LAUNCH_BLOCKING", "2"); }

// ===========================================================================
// Thread safety stress: host threads x streams, kernels with per-stream
// non-atomic counters (checks in-order, exclusive execution), events between
// streams, allocations, and stream/event handle recycling, all at once.

TEST(stress_threads_streams) {
  const double scale = test_scale();
  const int kThreads = 8;
  const int kStreams = 3;
  const int iters = std::max(20, static_cast<int>(4000 * scale));  // kernels per stream
  const int kEventEvery = 16;
  const int kMallocEvery = 128;
  int device_count = 0;
  CHECK_OK(orGetDeviceCount(&device_count));
  orRuntimeCounters before{};
  CHECK_OK(orGetCounters(&before));
  std::atomic<uint64_t> launched{0};
  std::atomic<uint64_t> cross_checks{0};
  std::atomic<int> finished{0};
  Latch start(kThreads);

  auto worker = [&](int t) {
    CHECK_OK(orSetDevice(t % device_count));
    struct PerStream {
      orStream_t stream = nullptr;
      long counter = 0;  // only touched by this stream's kernels (and the host after sync)
      std::vector<long> snapshots;
    };
    std::vector<PerStream> ps(kStreams);
    for (auto& p : ps) {
      CHECK_OK(orStreamCreateWithPriority(&p.stream, 0, (t & 1) ? -1 : 0));
      p.snapshots.assign(iters / kEventEvery + 1, -1);
    }
    start.arrive_and_wait();
    for (int i = 0; i < iters; ++i) {
      for (int k = 0; k < kStreams; ++k) {
        PerStream* p = &ps[k];
        CHECK_OK(openreg::launch(p->stream, "stress::increment", [p, i] {
          if (p->counter != i)
            FAIL("stream ran out of order: counter " + std::to_string(p->counter) + ", expected " + std::to_string(i));
          p->counter = i + 1;
        }));
        launched++;
      }
      if (i % kEventEvery == kEventEvery - 1) {
        // Stream k publishes its counter; stream k+1 waits for it and checks it.
        const int slot = i / kEventEvery;
        for (int k = 0; k < kStreams; ++k) {
          PerStream* src = &ps[k];
          PerStream* dst = &ps[(k + 1) % kStreams];
          CHECK_OK(
              openreg::launch(src->stream, "stress::publish", [src, slot] { src->snapshots[slot] = src->counter; }));
          orEvent_t ev = nullptr;
          CHECK_OK(orEventCreateWithFlags(&ev, (i & 1) ? orEventDisableTiming : orEventDefault));
          CHECK_OK(orEventRecord(ev, src->stream));
          CHECK_OK(orStreamWaitEvent(dst->stream, ev, 0));
          CHECK_OK(openreg::launch(dst->stream, "stress::observe", [src, slot, i, &cross_checks] {
            if (src->snapshots[slot] != i + 1)
              FAIL("event did not order streams: saw " + std::to_string(src->snapshots[slot]) + ", expected " +
                   std::to_string(i + 1));
            cross_checks++;
          }));
          launched += 2;
          CHECK_OK(orEventDestroy(ev));  // while the wait may still be queued
        }
      }
      if (i % kMallocEvery == kMallocEvery / 2) {
        const size_t n = 4096 + 512 * t + 8 * i;
        void* d = nullptr;
        CHECK_OK(orMalloc(&d, n));
        orStream_t s = ps[i % kStreams].stream;
        CHECK_OK(orMemsetAsync(d, t + 1, n, s));
        CHECK_OK(openreg::launch(s, "stress::touch", [d, n, t] {
          auto* k = static_cast<unsigned char*>(openreg::kernel_pointer(d));
          for (size_t j = 0; j < n; j += 97)
            if (k[j] != t + 1) FAIL("device memory was overwritten by someone else");
          k[0] = static_cast<unsigned char>(t + 100);
        }));
        launched++;
        std::vector<unsigned char> out(n);
        CHECK_OK(orMemcpyAsync(out.data(), d, n, orMemcpyDeviceToHost, s));  // pageable: blocking
        CHECK_EQ(static_cast<int>(out[0]), t + 100);
        CHECK_EQ(static_cast<int>(out[n - 1]), t + 1);
        CHECK_OK(orFree(d));
      }
      if (i % 32 == 7) {
        // Short-lived streams on both devices: handle slots recycle across threads.
        const int dev = (t + i / 32) % device_count;
        CHECK_OK(orSetDevice(dev));
        orStream_t tmp = nullptr;
        CHECK_OK(orStreamCreate(&tmp));
        int tmp_dev = -1;
        CHECK_OK(orStreamGetDevice(tmp, &tmp_dev));
        CHECK_EQ(tmp_dev, dev);
        std::atomic<int>* seen = new std::atomic<int>(-1);
        CHECK_OK(openreg::launch(tmp, "stress::tmp", [seen] {
          int d = -1;
          orGetDevice(&d);
          seen->store(d);
        }));
        launched++;
        CHECK_OK(orStreamDestroy(tmp));  // waits for the kernel
        CHECK_EQ(seen->load(), dev);
        delete seen;
        CHECK_OK(orSetDevice(t % device_count));
      }
      if (i == iters / 2) {
        // Recycle a stream handle mid-flight (the counter carries over).
        PerStream& p = ps[kStreams - 1];
        CHECK_OK(orStreamDestroy(p.stream));
        CHECK_OK(orStreamCreate(&p.stream));
      }
    }
    for (auto& p : ps) CHECK_OK(orStreamSynchronize(p.stream));
    for (auto& p : ps) {
      CHECK_EQ(p.counter, static_cast<long>(iters));
      CHECK_OK(orStreamDestroy(p.stream));
    }
    finished++;
  };
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK_EQ(finished.load(), kThreads);
  CHECK_EQ(cross_checks.load(), static_cast<uint64_t>(kThreads) * kStreams * (iters / kEventEvery));
  orRuntimeCounters after{};
  CHECK_OK(orGetCounters(&after));
  CHECK_EQ(after.kernelsLaunched - before.kernelsLaunched, launched.load());
  CHECK_EQ(after.deviceMallocs - before.deviceMallocs, after.deviceFrees - before.deviceFrees);
  for (int d = 0; d < device_count; ++d) {
    CHECK_OK(orSetDevice(d));
    size_t free_b = 0, total = 0;
    CHECK_OK(orMemGetInfo(&free_b, &total));
    CHECK_EQ(free_b, total);
    CHECK_OK(orDeviceSynchronize());
  }
  std::printf("%d threads x %d streams x %d iterations: %llu kernels in %.2f s\n", kThreads, kStreams, iters,
              static_cast<unsigned long long>(launched.load()), secs);
}

// ===========================================================================
// fork: a child forked after the runtime started must not use it.

TEST(fork_child_is_refused) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));  // the runtime is up, with a worker thread running
  CHECK_OK(openreg::launch(nullptr, "test::warm", [] {}));
  CHECK_OK(orDeviceSynchronize());
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    // Child: report through the exit code (1: wrong status, 2: wrong message).
    void* p = nullptr;
    const orStatus st = orMalloc(&p, 4096);
    if (st != orErrorForkedProcess) {
      std::fprintf(stderr, "child: orMalloc returned %s\n", orGetErrorName(st));
      std::_Exit(1);
    }
    const std::string msg = orGetLastErrorMessage();
    if (msg.find("spawn") == std::string::npos || msg.find("fork") == std::string::npos) {
      std::fprintf(stderr, "child: unexpected message: %s\n", msg.c_str());
      std::_Exit(2);
    }
    int count = 0;
    if (orGetDeviceCount(&count) != orErrorForkedProcess) std::_Exit(3);
    if (orStreamSynchronize(nullptr) != orErrorForkedProcess) std::_Exit(4);
    std::_Exit(0);
  }
  int wstatus = 0;
  CHECK_EQ(waitpid(pid, &wstatus, 0), pid);
  if (!WIFEXITED(wstatus)) FAIL("forked child did not exit normally (status " + std::to_string(wstatus) + ")");
  if (WEXITSTATUS(wstatus) != 0)
    FAIL("forked child reported failure code " + std::to_string(WEXITSTATUS(wstatus)) +
         " (1: status was not orErrorForkedProcess, 2: message lacks 'spawn')");
  // The parent is unaffected.
  CHECK_OK(orFree(d));
  CHECK_OK(orMalloc(&d, 4096));
  CHECK_OK(orFree(d));
}

// ===========================================================================
// IPC: device memory shared between processes. The second process is forked
// before this one starts its runtime, so it is a fresh process for openreg.

namespace {

bool read_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = write(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Forks a process that runs `body(read_fd, write_fd)` and exits with its result.
pid_t fork_peer(int* to_peer, int* from_peer, const std::function<int(int, int)>& body) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return -1;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    std::_Exit(body(down[0], up[1]));
  }
  close(down[0]);
  close(up[1]);
  *to_peer = down[1];
  *from_peer = up[0];
  return pid;
}

int wait_exit_code(pid_t pid) {
  int wstatus = 0;
  if (waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

}  // namespace

TEST(ipc_share_memory_between_processes) {
  constexpr size_t kBytes = 10000;
  int to_peer = -1, from_peer = -1;
  // The importer: opens the handle (twice), checks the exporter's bytes, then
  // writes through a copy and through a kernel, and reports back.
  const pid_t pid = fork_peer(&to_peer, &from_peer, [](int in, int out) -> int {
    orIpcMemHandle_t h;
    size_t offset = 0;
    if (!read_all(in, &h, sizeof(h)) || !read_all(in, &offset, sizeof(offset))) return 10;
    CHECK_OK(orSetDevice(1));
    void* base = nullptr;
    CHECK_OK(orIpcOpenMemHandle(&base, h));
    void* again = nullptr;
    CHECK_OK(orIpcOpenMemHandle(&again, h));
    CHECK_EQ(again, base);  // the same mapping, counted twice
    orIpcMemHandle_t passed_on;
    CHECK_OK(orIpcGetMemHandle(&passed_on, static_cast<char*>(base) + 5));  // to a third process
    CHECK(std::memcmp(&passed_on, &h, sizeof(h)) == 0);
    CHECK_EQ(orPointerGetDevice(base), 1);
    orPointerAttributes attr{};
    CHECK_OK(orPointerGetAttributes(&attr, static_cast<char*>(base) + 5));
    CHECK_EQ(attr.base, base);
    CHECK_EQ(attr.size, size_t{10240});  // the whole allocation (512-byte granularity)
    std::vector<unsigned char> host(kBytes);
    CHECK_OK(orMemcpy(host.data(), static_cast<char*>(base) + offset, kBytes, orMemcpyDeviceToHost));
    for (size_t i = 0; i < kBytes; ++i)
      if (host[i] != static_cast<unsigned char>(i * 7)) return 11;
    CHECK_OK(orMemset(static_cast<char*>(base) + offset, 0x5a, 100));
    auto* target = static_cast<unsigned char*>(base) + offset + 100;
    CHECK_OK(openreg::launch(nullptr, "test::ipc_write", [target] { *openreg::kernel_pointer(target) = 0xee; }));
    CHECK_OK(orDeviceSynchronize());
    CHECK_STATUS(orErrorInvalidDevicePointer, orFree(base));
    CHECK_MESSAGE_HAS("orIpcCloseMemHandle");
    CHECK_OK(orIpcCloseMemHandle(base));
    CHECK_OK(orIpcCloseMemHandle(base));
    CHECK_STATUS(orErrorInvalidDevicePointer, orIpcCloseMemHandle(base));
    const char done = 1;
    return write_all(out, &done, 1) ? 0 : 12;
  });
  CHECK(pid > 0);
  CHECK_OK(orSetDevice(1));
  void* before = nullptr;
  void* d = nullptr;
  CHECK_OK(orMalloc(&before, 4096));  // so the shared allocation does not start the arena
  CHECK_OK(orMalloc(&d, kBytes + 100));
  std::vector<unsigned char> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<unsigned char>(i * 7);
  const size_t offset = 64;
  CHECK_OK(orMemcpy(static_cast<char*>(d) + offset, host.data(), kBytes, orMemcpyHostToDevice));
  orIpcMemHandle_t h;
  CHECK_OK(orIpcGetMemHandle(&h, static_cast<char*>(d) + offset));  // an inner pointer names its allocation
  CHECK(write_all(to_peer, &h, sizeof(h)));
  CHECK(write_all(to_peer, &offset, sizeof(offset)));
  char done = 0;
  CHECK(read_all(from_peer, &done, 1));
  CHECK_EQ(wait_exit_code(pid), 0);
  // The peer's writes are in this process's memory: one memory, two processes.
  CHECK_OK(orMemcpy(host.data(), static_cast<char*>(d) + offset, kBytes, orMemcpyDeviceToHost));
  CHECK_EQ(static_cast<int>(host[0]), 0x5a);
  CHECK_EQ(static_cast<int>(host[99]), 0x5a);
  CHECK_EQ(static_cast<int>(host[100]), 0xee);
  CHECK_EQ(static_cast<int>(host[101]), static_cast<int>(static_cast<unsigned char>(101 * 7)));
  CHECK_OK(orFree(d));
  CHECK_OK(orFree(before));
  close(to_peer);
  close(from_peer);
}

TEST(ipc_bad_handles) {
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));
  orIpcMemHandle_t h;
  CHECK_OK(orIpcGetMemHandle(&h, d));
  void* p = nullptr;
  CHECK_STATUS(orErrorInvalidValue, orIpcOpenMemHandle(&p, h));
  CHECK_MESSAGE_HAS("made by this process");
  orIpcMemHandle_t junk;
  std::memset(&junk, 0x42, sizeof(junk));
  CHECK_STATUS(orErrorInvalidValue, orIpcOpenMemHandle(&p, junk));
  CHECK_MESSAGE_HAS("not an openreg IPC memory handle");
  int on_stack = 0;
  CHECK_STATUS(orErrorInvalidDevicePointer, orIpcGetMemHandle(&h, &on_stack));
  CHECK_STATUS(orErrorInvalidValue, orIpcGetMemHandle(nullptr, d));
  CHECK_STATUS(orErrorInvalidDevicePointer, orIpcCloseMemHandle(d));
  CHECK_OK(orFree(d));
}

TEST(ipc_handle_of_an_exited_process) {
  int to_peer = -1, from_peer = -1;
  // The exporter sends a handle and exits: the handle must then fail clearly.
  const pid_t pid = fork_peer(&to_peer, &from_peer, [](int, int out) -> int {
    void* d = nullptr;
    if (orMalloc(&d, 4096) != orSuccess) return 10;
    orIpcMemHandle_t h;
    if (orIpcGetMemHandle(&h, d) != orSuccess) return 11;
    return write_all(out, &h, sizeof(h)) ? 0 : 12;
  });
  CHECK(pid > 0);
  orIpcMemHandle_t h;
  CHECK(read_all(from_peer, &h, sizeof(h)));
  CHECK_EQ(wait_exit_code(pid), 0);
  void* p = nullptr;
  CHECK_STATUS(orErrorInvalidValue, orIpcOpenMemHandle(&p, h));
  CHECK_MESSAGE_HAS("has exited");
  CHECK(p == nullptr);
  close(to_peer);
  close(from_peer);
}

// ===========================================================================
// Fault injection (include/openreg/faults.h): each fault acts where documented,
// names itself, and leaves the runtime working; other streams and devices run on.

namespace {

std::string hex_handle(orStream_t s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(s)));
  return buf;
}

void check_all_memory_free() {
  int count = 0;
  CHECK_OK(orGetDeviceCount(&count));
  int previous = 0;
  CHECK_OK(orGetDevice(&previous));
  for (int d = 0; d < count; ++d) {
    CHECK_OK(orSetDevice(d));
    size_t free_b = 0, total = 0;
    CHECK_OK(orMemGetInfo(&free_b, &total));
    CHECK_EQ(free_b, total);
  }
  CHECK_OK(orSetDevice(previous));
}

}  // namespace

// The last error message is a fixed per-thread buffer (safe to write during static destruction):
// a longer message is cut, whole up to the limit, and the next failure replaces it.
TEST(a_long_error_message_is_cut_and_replaced_by_the_next) {
  const std::string name(20000, 'k');
  CHECK_STATUS(orErrorInvalidValue, orInjectFaults((name + ":1").c_str()));  // an unknown fault, named twice
  const std::string cut = orGetLastErrorMessage();
  CHECK(cut.size() == 16383);
  CHECK(cut.rfind("orErrorInvalidValue: ", 0) == 0);
  CHECK(cut.find(std::string(1000, 'k')) != std::string::npos);
  CHECK_STATUS(orErrorInvalidValue, orInjectFaults("bogus:1"));
  CHECK_MESSAGE_HAS("unknown fault 'bogus'");
  CHECK(std::string(orGetLastErrorMessage()).size() < 1000);  // none of the first message is left
}

TEST(faults_malformed_specs_are_refused) {
  const char* bad[][2] = {
      {"bogus:1", "unknown fault 'bogus'"},
      {"alloc", "no ':'"},
      {"alloc:0", "not N or N:K"},
      {"alloc:1:0", "not N or N:K"},
      {"alloc:-1", "not N or N:K"},
      {"alloc@7:1", "not a device index from 0 to 1"},
      {"alloc@0x200000001:1", "not a stream"},
      {"copy:x", "not N or N:K"},
      {"kernel:", "no kernel name"},
      {"kernel:openreg::wait_event", "cannot be failed"},
      {"slow:abc", "milliseconds"},
      {"slow@0x:5", "not a stream handle"},
      {"alloc:1,,copy:1", "an empty clause"},
  };
  for (auto& b : bad) {
    CHECK_STATUS(orErrorInvalidValue, orInjectFaults(b[0]));
    CHECK_MESSAGE_HAS(b[1]);
    CHECK_MESSAGE_HAS(std::string("clause '"));
  }
  // A refused spec leaves the armed faults as they were.
  CHECK_OK(orInjectFaults("alloc:1"));
  CHECK_STATUS(orErrorInvalidValue, orInjectFaults("alloc:zero"));
  void* p = nullptr;
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, 4096));
  CHECK_OK(orInjectFaults(nullptr));
  CHECK_OK(orMalloc(&p, 4096));
  CHECK_OK(orFree(p));
}

TEST(faults_alloc_fails_the_nth_allocation) {
  CHECK_OK(orInjectFaults("alloc@1:2:2"));  // the 2nd and 3rd allocations on device 1
  void* on0[4] = {};
  for (auto& p : on0) CHECK_OK(orMalloc(&p, 4096));  // device 0 is not counted
  CHECK_OK(orSetDevice(1));
  void* a = nullptr;
  void* b = reinterpret_cast<void*>(0x1);
  CHECK_OK(orMalloc(&a, 4096));
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&b, 4096));
  CHECK(b == nullptr);
  CHECK_MESSAGE_HAS("fault injected by OPENREG_FAULTS (alloc@1:2:2): allocation 2 on openreg device 1");
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&b, 4096));
  CHECK_MESSAGE_HAS("allocation 3");
  CHECK_OK(orMalloc(&b, 4096));  // the 4th works again
  CHECK_OK(orFree(a));
  CHECK_OK(orFree(b));
  // Counts restart when armed again; an unqualified clause counts every device's allocations.
  CHECK_OK(orInjectFaults("alloc:2"));
  CHECK_OK(orMalloc(&a, 512));
  CHECK_OK(orSetDevice(0));
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&b, 512));
  CHECK_OK(orMalloc(&b, 512));
  CHECK_OK(orFree(a));
  CHECK_OK(orFree(b));
  for (auto& p : on0) CHECK_OK(orFree(p));
  CHECK_OK(orInjectFaults(""));
  check_all_memory_free();
}

TEST(faults_kernel_fails_by_name_once) {
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  CHECK_OK(orInjectFaults(("kernel@" + hex_handle(a) + ":test::doomed").c_str()));
  std::atomic<int> ran_a{0}, ran_b{0}, other{0};
  CHECK_OK(openreg::launch(b, "test::doomed", [&] { ran_b++; }));  // another stream: not targeted
  CHECK_OK(orStreamSynchronize(b));
  CHECK_EQ(ran_b.load(), 1);
  CHECK_OK(openreg::launch(a, "test::before", [&] { other++; }));
  CHECK_OK(openreg::launch(a, "test::doomed", [&] { ran_a++; }));
  CHECK_OK(openreg::launch(a, "test::after", [&] { other++; }));
  // Device 1 is not affected.
  CHECK_OK(orSetDevice(1));
  CHECK_OK(openreg::launch(nullptr, "test::doomed", [&] { other++; }));
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orSetDevice(0));
  // Deferred: the launch succeeded, the next synchronising call reports it, naming the kernel.
  CHECK_STATUS(orErrorLaunchFailure, orStreamSynchronize(a));
  CHECK_MESSAGE_HAS("kernel 'test::doomed' failed on openreg device 0: fault injected by OPENREG_FAULTS (kernel@");
  CHECK_EQ(ran_a.load(), 0);  // it did not run
  CHECK_EQ(other.load(), 3);  // the work around it did
  CHECK_OK(orStreamSynchronize(a));
  // Once: the next one runs.
  CHECK_OK(openreg::launch(a, "test::doomed", [&] { ran_a++; }));
  CHECK_OK(orStreamSynchronize(a));
  CHECK_EQ(ran_a.load(), 1);
  // Untargeted: the first kernel of that name on any stream; arming again re-arms it.
  CHECK_OK(orInjectFaults("kernel:test::doomed"));
  CHECK_OK(openreg::launch(b, "test::doomed", [&] { ran_b++; }));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_EQ(ran_b.load(), 1);
  CHECK_OK(orInjectFaults(""));
  check_stream_still_runs(a);
  check_stream_still_runs(b);
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
}

TEST(faults_copy_fails_on_the_device) {
  const size_t n = 4096;
  std::vector<unsigned char> host = pattern(n, 3), back(n, 0);
  void* d = nullptr;
  void* d2 = nullptr;
  CHECK_OK(orMalloc(&d, n));
  CHECK_OK(orMalloc(&d2, n));
  CHECK_OK(orMemset(d2, 0, n));  // a memset is not a copy
  CHECK_OK(orInjectFaults("copy:2"));
  CHECK_OK(orMemcpy(d, host.data(), n, orMemcpyHostToDevice));  // copy 1
  // Copy 2, synchronous: reported at the call, naming the copy; the host buffer is not written.
  CHECK_STATUS(orErrorLaunchFailure, orMemcpy(back.data(), d, n, orMemcpyDeviceToHost));
  CHECK_MESSAGE_HAS("kernel 'openreg::memcpy' failed on openreg device 0: fault injected by OPENREG_FAULTS (copy:2)");
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 0; }));
  CHECK_OK(orMemcpy(back.data(), d, n, orMemcpyDeviceToHost));  // copy 3 works
  CHECK(back == host);
  // On a targeted stream.
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orInjectFaults(("copy@" + hex_handle(s) + ":1").c_str()));
  CHECK_OK(orMemcpyAsync(d2, d, n, orMemcpyDeviceToDevice, nullptr));  // another stream: copies
  CHECK_OK(orStreamSynchronize(nullptr));
  // From pageable memory the copy is done when the call returns, which reports its failure.
  CHECK_STATUS(orErrorLaunchFailure, orMemcpyAsync(d2, host.data(), 16, orMemcpyHostToDevice, s));
  CHECK_MESSAGE_HAS("openreg::memcpy");
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orMemcpy(back.data(), d2, n, orMemcpyDeviceToHost));
  CHECK(back == host);  // the D2D copy landed, the failed H2D did not overwrite it
  CHECK_OK(orInjectFaults(""));
  CHECK_OK(orStreamDestroy(s));
  CHECK_OK(orFree(d));
  CHECK_OK(orFree(d2));
  check_all_memory_free();
}

// A stream that waits for an event recorded on a stream with no work of its own left (only waits
// since its last kernel) waits for those waits' events, not for that stream's worker to reach the
// record (Forward in runtime_internal.h). Stream b below is slowed by a minute per item, so c can
// only finish early if its wait skipped b's worker; once b has a kernel of its own, c must wait
// for it. No timing assumption: the slowed items wait until disarming ends them.
// A timed event is not forwarded: a stream that waits for it waits for its record, so the times of
// the records that follow are not earlier than its own. Forwarded, c finished as soon as a's
// producer had, and b's record (after its wait for on_a) could take its time before a's worker
// reached on_a's record: orEventElapsedTime(on_a, on_b) was negative in one CI run. Here a's
// worker is slowed before that record, and c must not finish until it runs.
TEST(stream_wait_event_on_a_timed_event_waits_for_its_record) {
  orStream_t a = nullptr, b = nullptr, c = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  CHECK_OK(orStreamCreate(&c));
  orEvent_t on_a = nullptr, on_b = nullptr;
  CHECK_OK(orEventCreate(&on_a));  // timing enabled, as CUDA's default
  CHECK_OK(orEventCreate(&on_b));
  std::atomic<bool> produced{false};
  Gate gate;
  CHECK_OK(openreg::launch(a, "test::producer", [&] {
    gate.wait();
    produced.store(true);
  }));
  CHECK_OK(orEventRecord(on_a, a));
  CHECK_OK(orStreamWaitEvent(b, on_a, 0));
  CHECK_OK(orEventRecord(on_b, b));
  CHECK_OK(orStreamWaitEvent(c, on_b, 0));
  CHECK_OK(openreg::launch(c, "test::consumer", [] {}));
  while (!gate.reached.load()) std::this_thread::yield();                  // a's worker is in the producer
  CHECK_OK(orInjectFaults(("slow@" + hex_handle(a) + ":60000").c_str()));  // its next item: the record
  gate.release();
  while (!produced.load()) std::this_thread::yield();
  // Forwarded, c would finish within microseconds of the producer; it must wait for the record.
  const auto until = Clock::now() + 200ms;
  while (Clock::now() < until) CHECK_STATUS(orErrorNotReady, orStreamQuery(c));
  CHECK_STATUS(orErrorNotReady, orEventQuery(on_a));
  CHECK_OK(orInjectFaults(""));
  CHECK_OK(orStreamSynchronize(c));
  float ms = -1;
  CHECK_OK(orEventElapsedTime(&ms, on_a, on_b));
  CHECK(ms >= 0);
  CHECK_OK(orEventDestroy(on_a));
  CHECK_OK(orEventDestroy(on_b));
  for (orStream_t s : {a, b, c}) CHECK_OK(orStreamDestroy(s));
}

TEST(stream_wait_event_forwards_through_a_waiting_stream) {
  orStream_t a = nullptr, b = nullptr, c = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  CHECK_OK(orStreamCreate(&c));
  orEvent_t on_a = nullptr, on_b = nullptr;
  CHECK_OK(orEventCreateWithFlags(&on_a, orEventDisableTiming));  // a timed event is not forwarded
  CHECK_OK(orEventCreateWithFlags(&on_b, orEventDisableTiming));
  int produced = 0, observed = -1;  // plain ints: the events are the only ordering
  Gate gate;
  CHECK_OK(openreg::launch(a, "test::producer", [&] {
    gate.wait();
    produced = 42;
  }));
  CHECK_OK(orEventRecord(on_a, a));
  CHECK_OK(orInjectFaults(("slow@" + hex_handle(b) + ":60000").c_str()));
  CHECK_OK(orStreamWaitEvent(b, on_a, 0));
  CHECK_OK(orEventRecord(on_b, b));
  CHECK_OK(orStreamWaitEvent(c, on_b, 0));
  CHECK_OK(openreg::launch(c, "test::consumer", [&] { observed = produced; }));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(c));  // a's producer has not run
  gate.release();
  const auto deadline = Clock::now() + 20s;
  while (orStreamQuery(c) == orErrorNotReady && Clock::now() < deadline) std::this_thread::yield();
  CHECK_OK(orStreamQuery(c));
  CHECK_EQ(observed, 42);
  // c is past its wait for on_b, so on_b is complete, though b's own worker has not reached its
  // record yet: the event answers for what it waits for, as c did.
  CHECK_OK(orEventQuery(on_b));
  CHECK_OK(orEventSynchronize(on_b));  // returns without b's worker (a minute away)
  CHECK_STATUS(orErrorNotReady, orStreamQuery(b));
  CHECK_OK(orInjectFaults(""));
  CHECK_OK(orStreamSynchronize(b));
  CHECK_OK(orEventQuery(on_b));

  // b's kernel comes before its record: c waits for it, slowed as it is.
  CHECK_OK(orInjectFaults(("slow@" + hex_handle(b) + ":60000").c_str()));
  int from_b = 0;
  CHECK_OK(openreg::launch(b, "test::b_work", [&] { from_b = 7; }));
  CHECK_OK(orStreamWaitEvent(b, on_a, 0));  // a is done: queues nothing
  CHECK_OK(orEventRecord(on_b, b));
  CHECK_OK(orStreamWaitEvent(c, on_b, 0));
  CHECK_OK(openreg::launch(c, "test::consumer2", [&] { observed = from_b; }));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(c));
  CHECK_OK(orInjectFaults(""));
  CHECK_OK(orStreamSynchronize(c));
  CHECK_EQ(observed, 7);

  // More waits after b's last kernel than are forwarded: the fifth counts as b's work (c waits for
  // b to get past it), the sixth is forwarded; the result is the same.
  Gate gate3;
  CHECK_OK(openreg::launch(a, "test::producer3", [&] {
    gate3.wait();
    produced = 3;
  }));
  std::vector<orEvent_t> events(6);
  for (auto& e : events) {
    CHECK_OK(orEventCreateWithFlags(&e, orEventDisableTiming));
    CHECK_OK(orEventRecord(e, a));
    CHECK_OK(orStreamWaitEvent(b, e, 0));
  }
  CHECK_OK(orEventRecord(on_b, b));
  CHECK_OK(orStreamWaitEvent(c, on_b, 0));
  CHECK_OK(openreg::launch(c, "test::consumer3", [&] { observed = produced; }));
  CHECK_STATUS(orErrorNotReady, orStreamQuery(c));
  gate3.release();
  CHECK_OK(orStreamSynchronize(c));
  CHECK_EQ(observed, 3);
  CHECK_OK(orEventSynchronize(on_b));
  for (auto& e : events) CHECK_OK(orEventDestroy(e));
  CHECK_OK(orEventDestroy(on_a));
  CHECK_OK(orEventDestroy(on_b));
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
  CHECK_OK(orStreamDestroy(c));
}

// No timing assumption: the slowed item waits a minute unless disarming ends the wait, and the
// test disarms as soon as it has seen the other stream and device finish meanwhile.
TEST(faults_slow_stream_delays_only_its_stream) {
  orStream_t a = nullptr, b = nullptr;
  CHECK_OK(orStreamCreate(&a));
  CHECK_OK(orStreamCreate(&b));
  CHECK_OK(orInjectFaults(("slow@" + hex_handle(a) + ":60000").c_str()));
  std::atomic<int> ran_a{0}, ran_b{0}, ran_1{0};
  CHECK_OK(openreg::launch(a, "test::slowed", [&] { ran_a++; }));
  CHECK_OK(openreg::launch(b, "test::quick", [&] { ran_b++; }));
  CHECK_OK(orStreamSynchronize(b));
  CHECK_OK(orSetDevice(1));
  CHECK_OK(openreg::launch(nullptr, "test::quick", [&] { ran_1++; }));
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orSetDevice(0));
  CHECK_EQ(ran_b.load(), 1);
  CHECK_EQ(ran_1.load(), 1);
  CHECK_STATUS(orErrorNotReady, orStreamQuery(a));
  CHECK_EQ(ran_a.load(), 0);
  CHECK_OK(orInjectFaults(""));  // ends the wait
  CHECK_OK(orStreamSynchronize(a));
  CHECK_EQ(ran_a.load(), 1);
  CHECK_OK(orStreamDestroy(a));
  CHECK_OK(orStreamDestroy(b));
}

// OPENREG_FAULTS is read when the runtime starts (test_runtime.py::CASE_ENV sets it).
TEST(faults_from_environment) {
  const char* env = std::getenv("OPENREG_FAULTS");
  if (!env || std::string(env) != "alloc@0:1,kernel:test::from_env")
    skip_now("needs OPENREG_FAULTS=alloc@0:1,kernel:test::from_env (test_runtime.py sets it)");
  void* p = nullptr;
  CHECK_STATUS(orErrorMemoryAllocation, orMalloc(&p, 512));
  CHECK_MESSAGE_HAS("(alloc@0:1)");
  CHECK_OK(orMalloc(&p, 512));
  CHECK_OK(openreg::launch(nullptr, "test::from_env", [] {}));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("test::from_env");
  CHECK_OK(orFree(p));
  check_all_memory_free();
}

TEST(config_invalid_faults) { check_config_rejected("OPENREG_FAULTS", "alloc:zero"); }

// ===========================================================================
// Soak: host threads on both devices issue random work (allocations, memsets, copies in every
// direction, kernels, events, short-lived streams) while a controller thread keeps arming and
// disarming faults (a named kernel, allocations, slow streams). Every result that no fault
// touched is checked; every error must be an injected one; at the end all memory is free and
// every stream runs. Short under the sanitizers (OPENREG_TEST_SCALE scales it).

TEST(soak_random_work_under_faults) {
  const double scale = test_scale();
  const int kThreads = 4;
  const int iters = std::max(50, static_cast<int>(8000 * scale));
  int device_count = 0;
  CHECK_OK(orGetDeviceCount(&device_count));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> injected_errors{0}, checked{0};
  // An error must be one the controller injected; the work that got it is redone or dropped.
  auto tolerate = [&](orStatus st) {
    if (st == orSuccess) return true;
    const std::string msg = orGetLastErrorMessage();
    if ((st == orErrorLaunchFailure || st == orErrorMemoryAllocation) &&
        contains(msg, "fault injected by OPENREG_FAULTS")) {
      injected_errors++;
      return false;
    }
    FAIL("an error no fault explains: " + status_str(st) + ": " + msg);
  };
  std::thread controller([&] {
    const char* specs[] = {"kernel:soak::doomed",       "alloc:3", "slow@0:1", "kernel@1:soak::doomed,alloc@0:2:2", "",
                           "slow:0,kernel:soak::doomed"};
    unsigned k = 0;
    while (!stop.load()) {
      CHECK_OK(orInjectFaults(specs[k++ % (sizeof(specs) / sizeof(specs[0]))]));
      std::this_thread::sleep_for(2ms);
    }
    CHECK_OK(orInjectFaults(""));
  });
  auto worker = [&](int t) {
    unsigned rng = 12345u + 977u * static_cast<unsigned>(t);
    auto next = [&rng] { return rng = rng * 1103515245u + 12345u, (rng >> 8) & 0xffffff; };
    const int dev = t % device_count;
    CHECK_OK(orSetDevice(dev));
    orStream_t streams[2] = {};
    for (auto& s : streams) CHECK_OK(orStreamCreate(&s));
    for (int i = 0; i < iters; ++i) {
      orStream_t s = streams[next() % 2];
      switch (next() % 5) {
        case 0: {  // a round trip through device memory, checked
          const size_t n = 512 + next() % 65536;
          void* d = nullptr;
          if (!tolerate(orMalloc(&d, n))) break;
          std::vector<unsigned char> in = pattern(n, next()), out(n);
          bool ok = tolerate(orMemcpyAsync(d, in.data(), n, orMemcpyHostToDevice, s));
          ok = tolerate(orMemcpyAsync(out.data(), d, n, orMemcpyDeviceToHost, s)) && ok;
          // Pageable copies are done on return; a failed kernel's error may surface at this sync.
          tolerate(orStreamSynchronize(s));
          if (ok) {
            if (out != in) FAIL("a round trip through device memory changed the data");
            checked++;
          }
          CHECK_OK(orFree(d));
          break;
        }
        case 1: {  // a device-to-device copy and a memset, checked by a kernel
          const size_t n = 4096;
          void* a = nullptr;
          void* b = nullptr;
          if (!tolerate(orMalloc(&a, n))) break;
          if (!tolerate(orMalloc(&b, n))) {
            CHECK_OK(orFree(a));
            break;
          }
          const int v = static_cast<int>(next() % 250) + 1;
          std::atomic<int>* seen = new std::atomic<int>(-1);
          CHECK_OK(orMemsetAsync(a, v, n, s));
          CHECK_OK(orMemcpyAsync(b, a, n, orMemcpyDeviceToDevice, s));
          CHECK_OK(openreg::launch(s, "soak::check", [b, n, seen] {
            auto* k = static_cast<unsigned char*>(openreg::kernel_pointer(b));
            seen->store(k[0] == k[n - 1] ? k[0] : -2);
          }));
          tolerate(orStreamSynchronize(s));
          if (seen->load() != v) FAIL("memset + copy on the device gave " + std::to_string(seen->load()));
          checked++;
          delete seen;
          CHECK_OK(orFree(a));
          CHECK_OK(orFree(b));
          break;
        }
        case 2:  // a kernel the controller may fail: its result is not checked
          CHECK_OK(openreg::launch(s, "soak::doomed", [] {}));
          break;
        case 3: {  // ordering between the two streams through an event
          orEvent_t ev = nullptr;
          CHECK_OK(orEventCreateWithFlags(&ev, orEventDisableTiming));
          CHECK_OK(orEventRecord(ev, streams[0]));
          CHECK_OK(orStreamWaitEvent(streams[1], ev, 0));
          CHECK_OK(orEventDestroy(ev));
          break;
        }
        default: {  // a short-lived stream
          orStream_t tmp = nullptr;
          CHECK_OK(orStreamCreate(&tmp));
          CHECK_OK(openreg::launch(tmp, "soak::tmp", [] {}));
          CHECK_OK(orStreamDestroy(tmp));
          break;
        }
      }
    }
    for (auto& s : streams) {
      tolerate(orStreamSynchronize(s));
      CHECK_OK(orStreamDestroy(s));
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  stop = true;
  controller.join();
  for (int d = 0; d < device_count; ++d) {  // report what is left, then every device is clean
    CHECK_OK(orSetDevice(d));
    tolerate(orDeviceSynchronize());
    CHECK_OK(orDeviceSynchronize());
    check_stream_still_runs(nullptr);
  }
  check_all_memory_free();
  CHECK(checked.load() > 0);
  std::printf("%d threads x %d iterations: %llu results checked, %llu injected errors reported\n", kThreads, iters,
              static_cast<unsigned long long>(checked.load()), static_cast<unsigned long long>(injected_errors.load()));
}

// ===========================================================================
// Activity tracing (what the profiler reads)

TEST(tracing_records_work_with_correlation) {
  struct Seen {
    std::string name;
    int device;
    orStream_t stream;
    int is_default;
    uint64_t correlation, start, end, enqueue;
  };
  auto flush = [] {
    std::vector<Seen> seen;
    uint64_t dropped = 99;
    CHECK_OK(orTracingFlush(
        [](const orActivity* a, void* user) {
          static_cast<std::vector<Seen>*>(user)->push_back({a->name, a->device, a->stream, a->is_default_stream,
                                                            a->correlation, a->start_ns, a->end_ns, a->enqueue_ns});
        },
        &seen, &dropped));
    CHECK_EQ(dropped, uint64_t{0});
    return seen;
  };
  CHECK_OK(orSetDevice(1));
  orStream_t side = nullptr;
  CHECK_OK(orStreamCreate(&side));
  void* d = nullptr;
  CHECK_OK(orMalloc(&d, 4096));
  CHECK_OK(openreg::launch(nullptr, "test::untraced", [] {}));
  CHECK_OK(orDeviceSynchronize());
  const uint64_t t0 = orNowNs();
  CHECK_OK(orTracingEnable(1));
  CHECK_OK(orTracingPushCorrelationId(41));
  CHECK_OK(orTracingPushCorrelationId(42));  // nested: the innermost counts
  CHECK_OK(openreg::launch(side, "test::traced", [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }));
  CHECK_OK(orTracingPopCorrelationId());
  CHECK_OK(orMemsetAsync(d, 0, 4096, nullptr));
  CHECK_OK(orTracingPopCorrelationId());
  CHECK_OK(openreg::launch(nullptr, "test::no_correlation", [] {}));
  CHECK_STATUS(orErrorInvalidValue, orTracingPopCorrelationId());
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orTracingEnable(0));
  CHECK_OK(openreg::launch(nullptr, "test::after", [] {}));
  CHECK_OK(orDeviceSynchronize());
  const uint64_t t1 = orNowNs();
  std::vector<Seen> seen = flush();
  CHECK_EQ(seen.size(), size_t{3});
  std::sort(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.name < b.name; });
  CHECK_EQ(seen[0].name, std::string("openreg::memset"));
  CHECK_EQ(seen[0].correlation, uint64_t{41});
  CHECK_EQ(seen[0].is_default, 1);
  CHECK_EQ(seen[1].name, std::string("test::no_correlation"));
  CHECK_EQ(seen[1].correlation, uint64_t{0});
  CHECK_EQ(seen[2].name, std::string("test::traced"));
  CHECK_EQ(seen[2].correlation, uint64_t{42});
  CHECK_EQ(seen[2].stream, side);
  CHECK_EQ(seen[2].is_default, 0);
  CHECK_EQ(seen[2].device, 1);
  CHECK(seen[2].end - seen[2].start >= uint64_t{2000000});
  for (const Seen& s : seen) CHECK(t0 <= s.enqueue && s.enqueue <= s.start && s.start <= s.end && s.end <= t1);
  CHECK_EQ(flush().size(), size_t{0});  // flushed activities are forgotten
  CHECK_STATUS(orErrorInvalidValue, orTracingFlush(nullptr, nullptr, nullptr));
  CHECK_OK(orFree(d));
  CHECK_OK(orStreamDestroy(side));
}

TEST(tracing_disable_completes_the_trace) {
  CHECK_OK(orTracingEnable(1));
  CHECK_OK(openreg::launch(nullptr, "test::slow", [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }));
  CHECK_OK(orTracingEnable(0));  // waits for the slow kernel: no synchronise call needed
  size_t n = 0;
  CHECK_OK(orTracingFlush([](const orActivity*, void* user) { ++*static_cast<size_t*>(user); }, &n, nullptr));
  CHECK_EQ(n, size_t{1});
  // A kernel error stays pending for the next synchronising call.
  CHECK_OK(orTracingEnable(1));
  CHECK_OK(openreg::launch(nullptr, "test::failing", [] { throw std::runtime_error("boom"); }));
  CHECK_OK(orTracingEnable(0));
  CHECK_STATUS(orErrorLaunchFailure, orDeviceSynchronize());
  CHECK_MESSAGE_HAS("boom");
  CHECK_OK(orTracingFlush([](const orActivity*, void*) {}, nullptr, nullptr));
}

// ===========================================================================
// Counters

TEST(counters_are_exact) {
  orRuntimeCounters c0{}, c1{};
  CHECK_OK(orGetCounters(&c0));
  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(orMalloc(&a, 4096));
  CHECK_OK(orMalloc(&b, 4096));
  std::vector<char> host(4096, 1);
  void* pinned = nullptr;
  CHECK_OK(orMallocHost(&pinned, 4096));
  orStream_t s = nullptr;
  CHECK_OK(orStreamCreate(&s));
  CHECK_OK(orMemcpy(a, host.data(), 100, orMemcpyHostToDevice));
  CHECK_OK(orMemcpy(a, host.data(), 200, orMemcpyDefault));
  CHECK_OK(orMemcpyAsync(a, pinned, 300, orMemcpyHostToDevice, s));  // 3 H2D, 600 bytes
  CHECK_OK(orStreamSynchronize(s));                                  // the default stream does not order itself after s
  CHECK_OK(orMemcpy(host.data(), a, 1000, orMemcpyDeviceToHost));
  CHECK_OK(orMemcpyAsync(pinned, b, 24, orMemcpyDefault, s));  // 2 D2H, 1024 bytes
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orMemcpy(b, a, 4096, orMemcpyDeviceToDevice));                                   // 1 D2D, 4096 bytes
  CHECK_OK(orMemcpy(host.data(), host.data() + 2048, 10, orMemcpyHostToHost));              // not counted
  CHECK_OK(orMemcpy(a, host.data(), 0, orMemcpyHostToDevice));                              // not counted
  CHECK_STATUS(orErrorInvalidValue, orMemcpy(a, host.data(), 5000, orMemcpyHostToDevice));  // refused
  CHECK_OK(orMemset(a, 0, 16));                                                             // not a copy
  for (int i = 0; i < 7; ++i) CHECK_OK(openreg::launch(s, "test::count", [] {}));
  CHECK_OK(orLaunchKernel(s, "test::count_raw", [](void*) { return orSuccess; }, nullptr, nullptr));
  orEvent_t ev = nullptr;  // event records and waits are not kernel launches
  CHECK_OK(orEventCreate(&ev));
  CHECK_OK(orEventRecord(ev, s));
  CHECK_OK(orStreamWaitEvent(nullptr, ev, 0));
  CHECK_OK(orStreamSynchronize(s));
  CHECK_OK(orDeviceSynchronize());
  CHECK_OK(orFree(a));
  CHECK_OK(orFree(b));
  CHECK_OK(orGetCounters(&c1));
  CHECK_EQ(c1.memcpyHostToDevice - c0.memcpyHostToDevice, uint64_t{3});
  CHECK_EQ(c1.bytesHostToDevice - c0.bytesHostToDevice, uint64_t{600});
  CHECK_EQ(c1.memcpyDeviceToHost - c0.memcpyDeviceToHost, uint64_t{2});
  CHECK_EQ(c1.bytesDeviceToHost - c0.bytesDeviceToHost, uint64_t{1024});
  CHECK_EQ(c1.memcpyDeviceToDevice - c0.memcpyDeviceToDevice, uint64_t{1});
  CHECK_EQ(c1.bytesDeviceToDevice - c0.bytesDeviceToDevice, uint64_t{4096});
  CHECK_EQ(c1.kernelsLaunched - c0.kernelsLaunched, uint64_t{8});
  CHECK_EQ(c1.deviceMallocs - c0.deviceMallocs, uint64_t{2});
  CHECK_EQ(c1.deviceFrees - c0.deviceFrees, uint64_t{2});
  CHECK_STATUS(orErrorInvalidValue, orGetCounters(nullptr));
  CHECK_OK(orEventDestroy(ev));
  CHECK_OK(orStreamDestroy(s));
  CHECK_OK(orFreeHost(pinned));
}

// ===========================================================================
// Driver

namespace {

const TestCase* find_case(const std::string& name) {
  for (const auto& c : registry())
    if (name == c.name) return &c;
  return nullptr;
}

// Runs every case in a child process (fork + exec of this program with --run).
int run_all(const char* self) {
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failures;
  for (const auto& c : registry()) {
    std::fflush(stdout);
    const auto t0 = Clock::now();
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      if (c.expected_signal != 0) {
        // Sanitizers catch SIGSEGV and exit instead; let the signal through.
        for (const char* var : {"ASAN_OPTIONS", "TSAN_OPTIONS"}) {
          const char* old = std::getenv(var);
          setenv(var, (std::string(old ? old : "") + ":handle_segv=0").c_str(), 1);
        }
      }
      execl(self, self, "--run", c.name, static_cast<char*>(nullptr));
      std::perror("execl");
      std::_Exit(127);
    }
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const char* verdict;
    if (c.expected_signal != 0) {
      // macOS may deliver a protection fault as SIGBUS (mprotect(2)).
      const bool fault_as_bus = c.expected_signal == SIGSEGV && WTERMSIG(wstatus) == SIGBUS;
      const bool ok = WIFSIGNALED(wstatus) && (WTERMSIG(wstatus) == c.expected_signal || fault_as_bus);
      verdict = ok ? "PASS" : "FAIL";
    } else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kSkipExitCode) {
      verdict = "SKIP";
    } else {
      verdict = (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) ? "PASS" : "FAIL";
    }
    if (verdict[0] == 'P')
      ++passed;
    else if (verdict[0] == 'S')
      ++skipped;
    else {
      ++failed;
      failures.push_back(c.name);
    }
    std::printf("%-48s %s (%.2f s)\n", c.name, verdict, secs);
    std::fflush(stdout);
  }
  std::printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  for (const auto& f : failures) std::printf("FAILED: %s\n", f.c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::sort(registry().begin(), registry().end(),
            [](const TestCase& a, const TestCase& b) { return std::strcmp(a.name, b.name) < 0; });
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const auto& c : registry()) std::printf("%s\n", c.name);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--run") == 0) {
    const TestCase* c = find_case(argv[2]);
    if (c == nullptr) {
      std::fprintf(stderr, "unknown test case '%s' (see --list)\n", argv[2]);
      return 2;
    }
    c->fn();
    if (c->expected_signal != 0) {
      std::fprintf(stderr, "%s returned, but it must die by signal %d\n", c->name, c->expected_signal);
      return 1;
    }
    return 0;
  }
#if defined(__linux__)
  if (argc == 1) return run_all("/proc/self/exe");
#else
  if (argc == 1) return run_all(argv[0]);
#endif
  std::fprintf(stderr, "usage: %s [--list | --run NAME]\n", argv[0]);
  return 2;
}
