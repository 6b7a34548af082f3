// occl's flight recorder: PyTorch's templated c10d::FlightRecorder (FlightRecorder.hpp), instantiated
// in this extension over the points of a collective's kernel on its comm stream.
//
// torch 2.13 instantiates FlightRecorder<c10::Event> inside libtorch_cpu (Gloo records there) but
// exports none of its symbols, so an extension cannot write into the instance that
// torch._C._distributed_c10d._dump_fr_trace() reads, and FlightRecorderDetail.hpp includes
// <nlohmann/json.hpp>, which torch does not ship (the nlohmann-json package provides it at build
// time). occl keeps its own instance and dumps it in the same formats (openreg_distributed.flight_recorder).
// Only this header is seen by the rest of occl: the template's headers stay in FlightRecorder.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <tuple>
#include <vector>

namespace openreg_distributed {

// A point of a comm stream that the recorder asks about (its EventType): the collective's kernel
// marks it when the stream's worker reaches it, with the runtime's clock (durations come from two).
struct StreamPoint {
  std::atomic<uint64_t> reached_ns{0};
  bool query() const { return reached_ns.load(std::memory_order_acquire) != 0; }
  void mark();
};

// The start and end of one collective. Taken from a pool that never frees them: the recorder
// borrows the pointers until the entry is retired, and a dump may read a point it copied just
// before (a recycled point then gives a stale state, never a dangling read).
struct TracePoints {
  StreamPoint start, end;
};

namespace trace {

// The recorder is on unless TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) is 0.
bool enabled();
TracePoints* acquire_points();
void release_points(TracePoints* points);

struct Id {
  std::optional<size_t> id, epoch;
};
using PgName = std::tuple<std::string, std::string>;  // (group name, group description)

Id record(size_t pg_id, const PgName& pg_name, size_t collective_seq, size_t p2p_seq, size_t op_id, std::string name,
          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, TracePoints* points,
          std::chrono::milliseconds timeout, std::shared_ptr<c10d::ProcessGroupStatus> status, bool p2p);
void retire(const Id& id);
void record_pg_ranks(const PgName& pg_name, std::vector<uint64_t> ranks);
// The formats of torch's dump_fr_trace (pickle) and dump_fr_trace_json.
std::string dump(bool include_collectives, bool include_stack_traces, bool only_active);
std::string dump_json(bool include_collectives, bool only_active);
// Writes dump(true, true, false) through torch's c10d::DebugInfoWriter for `global_rank` (the file
// $TORCH_FR_DUMP_TEMP_FILE<rank>, or a writer the program registered); returns the writer's target.
std::string dump_to_writer(int global_rank);

}  // namespace trace
}  // namespace openreg_distributed
