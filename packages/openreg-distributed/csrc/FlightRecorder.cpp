// The flight recorder instance of occl: c10d::FlightRecorder<StreamPoint> (see Trace.hpp for why
// occl instantiates the template itself).

// The recorder's helpers format with {fmt}, whose compiled part libtorch does not export: header-only.
#define FMT_HEADER_ONLY

#include <mutex>
#include <torch/csrc/distributed/c10d/FlightRecorderDetail.hpp>
#include <vector>

#include "Trace.hpp"
#include "openreg/runtime.h"

namespace c10d {
// Durations from the kernel's own marks (the runtime's clock), in milliseconds as the recorder wants.
template <>
float getDurationFromEvent<openreg_distributed::StreamPoint>(openreg_distributed::StreamPoint& start,
                                                             openreg_distributed::StreamPoint& end) {
  const uint64_t s = start.reached_ns.load(std::memory_order_acquire);
  const uint64_t e = end.reached_ns.load(std::memory_order_acquire);
  TORCH_CHECK(s != 0 && e >= s, "occl flight recorder: the collective has not run");
  return static_cast<float>(e - s) / 1.0e6f;
}
template struct FlightRecorder<openreg_distributed::StreamPoint>;
}  // namespace c10d

namespace openreg_distributed {

void StreamPoint::mark() {
  const uint64_t now = orNowNs();
  reached_ns.store(now == 0 ? 1 : now, std::memory_order_release);
}

namespace trace {
namespace {

using Recorder = c10d::FlightRecorder<StreamPoint>;

class PointPool {
 public:
  TracePoints* get() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        TracePoints* p = free_.back();
        free_.pop_back();
        p->start.reached_ns.store(0, std::memory_order_relaxed);
        p->end.reached_ns.store(0, std::memory_order_relaxed);
        return p;
      }
    }
    return new TracePoints();  // never freed (see Trace.hpp)
  }
  void put(TracePoints* p) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(p);
  }

 private:
  std::mutex mu_;
  std::vector<TracePoints*> free_;
};

PointPool& pool() {
  static PointPool* p = new PointPool();  // leaked: points may be read at exit
  return *p;
}

using Extra = std::optional<std::unordered_map<std::string, std::unordered_map<std::string, std::string>>>;

}  // namespace

bool enabled() { return Recorder::get()->enabled_; }

TracePoints* acquire_points() { return enabled() ? pool().get() : nullptr; }

void release_points(TracePoints* points) {
  if (points != nullptr) pool().put(points);
}

Id record(size_t pg_id, const PgName& pg_name, size_t collective_seq, size_t p2p_seq, size_t op_id, std::string name,
          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, TracePoints* points,
          std::chrono::milliseconds timeout, std::shared_ptr<c10d::ProcessGroupStatus> status, bool p2p) {
  if (points == nullptr) return {};
  auto r =
      Recorder::get()->recordWithResetEnabled(pg_id, pg_name, collective_seq, p2p_seq, op_id, std::move(name), inputs,
                                              outputs, &points->start, &points->end, timeout, std::move(status), p2p);
  return Id{r.id, r.reset_epoch};
}

void retire(const Id& id) { Recorder::get()->retire_id(id.id, id.epoch, /*compute_duration=*/true); }

void record_pg_ranks(const PgName& pg_name, std::vector<uint64_t> ranks) {
  Recorder::get()->record_pg_ranks(pg_name, std::move(ranks));
}

std::string dump(bool include_collectives, bool include_stack_traces, bool only_active) {
  return Recorder::get()->dump(Extra{}, include_collectives, include_stack_traces, only_active);
}

std::string dump_json(bool include_collectives, bool only_active) {
  return Recorder::get()->dump_json(Extra{}, include_collectives, only_active);
}

std::string dump_to_writer(int global_rank) {
  auto& writer = c10d::DebugInfoWriter::getWriter(global_rank);
  writer.write(dump(/*include_collectives=*/true, /*include_stack_traces=*/true, /*only_active=*/false));
  return writer.getWriterTarget();
}

}  // namespace trace
}  // namespace openreg_distributed
