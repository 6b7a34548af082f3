// Micro-benchmarks of the emulated runtime. Prints one JSON object on stdout.
//
//   openreg_runtime_bench [--iterations N] [--reps N] [--size-mib N]
//
// launch_latency_us_*: an empty kernel launched and then waited for with
//   orStreamSynchronize (launch until completion observed by the host), after
//   warm-up, on a created stream.
// launch_enqueue_us:  cost of orLaunchKernel alone, averaged over a burst.
// h2d_* / d2h_*:      64 MiB copies between a pre-touched device buffer and a
//   pageable (malloc'd, pre-touched) or pinned (orMallocHost) host buffer,
//   median GB/s (1e9 bytes/s) over repetitions; *_ratio is relative to a plain
//   host memcpy of the same size into a pre-touched buffer (memcpy_gbps).
// h2d_cold_gbps:      the first copy into freshly allocated device memory
//   (includes the page faults of first touch), for information.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "openreg/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what, orStatus st) {
  std::fprintf(stderr, "%s failed: %s: %s\n", what, orGetErrorName(st), orGetLastErrorMessage());
  std::exit(1);
}

#define OK(call)                           \
  do {                                     \
    orStatus st_ = (call);                 \
    if (st_ != orSuccess) die(#call, st_); \
  } while (0)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

orStatus empty_kernel(void*) { return orSuccess; }

// Median GB/s of `reps` runs of fn (after one warm-up run).
double bandwidth_gbps(size_t bytes, int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    gbps.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  return percentile(gbps, 0.5);
}

void* touched_host_buffer(size_t bytes, int fill) {
  void* p = std::aligned_alloc(4096, bytes);
  if (!p) {
    std::fprintf(stderr, "out of host memory\n");
    std::exit(1);
  }
  std::memset(p, fill, bytes);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000;
  int reps = 15;
  size_t size_mib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iterations")
      iterations = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--size-mib")
      size_mib = static_cast<size_t>(std::max(1, std::atoi(argv[i + 1])));
    else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--reps N] [--size-mib N]\n", argv[0]);
      return 2;
    }
  }

  // ---- launch latency ----
  orStream_t stream = nullptr;
  OK(orStreamCreate(&stream));
  const int warmup = std::max(100, iterations / 10);
  for (int i = 0; i < warmup; ++i) {
    OK(orLaunchKernel(stream, "bench::empty", empty_kernel, nullptr, nullptr));
    OK(orStreamSynchronize(stream));
  }
  std::vector<double> latency_us;
  latency_us.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    OK(orLaunchKernel(stream, "bench::empty", empty_kernel, nullptr, nullptr));
    OK(orStreamSynchronize(stream));
    latency_us.push_back(seconds_since(t0) * 1e6);
  }
  double mean_us = 0;
  for (double v : latency_us) mean_us += v;
  mean_us /= static_cast<double>(latency_us.size());
  // Enqueue cost: a burst of launches, then one synchronize (not timed).
  const int burst = std::min(iterations, 10000);
  const auto tb = Clock::now();
  for (int i = 0; i < burst; ++i) OK(orLaunchKernel(stream, "bench::empty", empty_kernel, nullptr, nullptr));
  const double enqueue_us = seconds_since(tb) * 1e6 / burst;
  OK(orStreamSynchronize(stream));

  // ---- a chain of streams through a stream that only waits ----
  // Side streams a and c take turns with an empty kernel each, ordered through stream m (as
  // `wait_stream` through the current stream does): a -> m -> c -> m -> a. Each step depends on the
  // previous one, so the time per step is the chain's latency (docs/mechanisms/streams-events.md).
  orStream_t side_a = nullptr, middle = nullptr, side_c = nullptr;
  OK(orStreamCreate(&side_a));
  OK(orStreamCreate(&middle));
  OK(orStreamCreate(&side_c));
  orEvent_t hop[4] = {};
  for (auto& e : hop) OK(orEventCreateWithFlags(&e, orEventDisableTiming));
  auto chain_step = [&] {
    OK(orLaunchKernel(side_a, "bench::side_a", empty_kernel, nullptr, nullptr));
    OK(orEventRecord(hop[0], side_a));
    OK(orStreamWaitEvent(middle, hop[0], 0));
    OK(orEventRecord(hop[1], middle));
    OK(orStreamWaitEvent(side_c, hop[1], 0));
    OK(orLaunchKernel(side_c, "bench::side_c", empty_kernel, nullptr, nullptr));
    OK(orEventRecord(hop[2], side_c));
    OK(orStreamWaitEvent(middle, hop[2], 0));
    OK(orEventRecord(hop[3], middle));
    OK(orStreamWaitEvent(side_a, hop[3], 0));
  };
  const int chain_steps = std::max(100, iterations / 10);
  for (int i = 0; i < 100; ++i) chain_step();
  OK(orDeviceSynchronize());
  std::vector<double> chain_us;
  for (int r = 0; r < std::max(3, reps / 3); ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < chain_steps; ++i) chain_step();
    OK(orDeviceSynchronize());
    chain_us.push_back(seconds_since(t0) * 1e6 / chain_steps);
  }
  for (auto& e : hop) OK(orEventDestroy(e));
  OK(orStreamDestroy(side_a));
  OK(orStreamDestroy(middle));
  OK(orStreamDestroy(side_c));

  // ---- copies ----
  const size_t bytes = size_mib << 20;
  void* pageable = touched_host_buffer(bytes, 1);
  void* host_dst = touched_host_buffer(bytes, 2);
  void* pinned = nullptr;
  OK(orMallocHost(&pinned, bytes));
  std::memset(pinned, 3, bytes);
  void* dev = nullptr;
  OK(orMalloc(&dev, bytes));

  const auto tc = Clock::now();
  OK(orMemcpy(dev, pageable, bytes, orMemcpyHostToDevice));  // first touch of the device pages
  const double cold_gbps = static_cast<double>(bytes) / seconds_since(tc) / 1e9;

  const double memcpy_gbps = bandwidth_gbps(bytes, reps, [&] { std::memcpy(host_dst, pageable, bytes); });
  const double h2d_pageable =
      bandwidth_gbps(bytes, reps, [&] { OK(orMemcpy(dev, pageable, bytes, orMemcpyHostToDevice)); });
  const double d2h_pageable =
      bandwidth_gbps(bytes, reps, [&] { OK(orMemcpy(host_dst, dev, bytes, orMemcpyDeviceToHost)); });
  const double h2d_pinned = bandwidth_gbps(bytes, reps, [&] {
    OK(orMemcpyAsync(dev, pinned, bytes, orMemcpyHostToDevice, stream));
    OK(orStreamSynchronize(stream));
  });
  const double d2h_pinned = bandwidth_gbps(bytes, reps, [&] {
    OK(orMemcpyAsync(pinned, dev, bytes, orMemcpyDeviceToHost, stream));
    OK(orStreamSynchronize(stream));
  });

  OK(orFree(dev));
  OK(orFreeHost(pinned));
  std::free(pageable);
  std::free(host_dst);
  OK(orStreamDestroy(stream));

  const char* spin = std::getenv("OPENREG_SPIN_US");
  const char* wait_spin = std::getenv("OPENREG_WAIT_SPIN_US");
  std::printf(
      "{\"launch_iterations\": %d, \"launch_latency_us_median\": %.3f, \"launch_latency_us_p90\": %.3f, "
      "\"launch_latency_us_p99\": %.3f, \"launch_latency_us_min\": %.3f, \"launch_latency_us_mean\": %.3f, "
      "\"launch_enqueue_us\": %.3f, \"stream_chain_us_median\": %.3f, \"stream_chain_steps\": %d, "
      "\"copy_bytes\": %zu, \"copy_reps\": %d, \"memcpy_gbps\": %.3f, "
      "\"h2d_pageable_gbps\": %.3f, \"h2d_pinned_gbps\": %.3f, \"d2h_pageable_gbps\": %.3f, \"d2h_pinned_gbps\": %.3f, "
      "\"h2d_pageable_ratio\": %.3f, \"h2d_pinned_ratio\": %.3f, \"d2h_pageable_ratio\": %.3f, \"d2h_pinned_ratio\": "
      "%.3f, "
      "\"h2d_cold_gbps\": %.3f, \"spin_us\": %s, \"wait_spin_us\": %s}\n",
      iterations, percentile(latency_us, 0.5), percentile(latency_us, 0.9), percentile(latency_us, 0.99),
      percentile(latency_us, 0.0), mean_us, enqueue_us, percentile(chain_us, 0.5), chain_steps, bytes, reps,
      memcpy_gbps, h2d_pageable, h2d_pinned, d2h_pageable, d2h_pinned, h2d_pageable / memcpy_gbps,
      h2d_pinned / memcpy_gbps, d2h_pageable / memcpy_gbps, d2h_pinned / memcpy_gbps, cold_gbps, spin ? spin : "20",
      wait_spin ? wait_spin : "2000");
  return 0;
}
