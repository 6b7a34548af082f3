// Device activity for torch.profiler: a Kineto child profiler for PrivateUse1.
//
// torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1]) starts
// Kineto in the KINETO_PRIVATEUSE1 state, which hands Kineto the factory
// registered below (REGISTER_PRIVATEUSE1_PROFILER). Kineto then
//   - configures a session when device activity is requested, start()s it,
//   - forwards the correlation id of every CPU op the profiler records to
//     pushCorrelationId/popCorrelationId on the thread running the op,
//   - stop()s the session and asks processTrace() for the device activities.
// The session drives libopenreg's activity tracing (orTracing*): the runtime
// times every work item on its stream and remembers the correlation id that was
// current when the host enqueued it. Each becomes a GenericTraceActivity on the
// device (Chrome-trace process) and stream (thread) it ran on, linked to the CPU
// op that launched it, so torch attaches its time to that op (key_averages'
// device time). A PRIVATEUSE1_RUNTIME activity marks the launch on the host
// thread (like cudaLaunchKernel rows); a flow joins it to the device activity.
//
// This unit is built with USE_KINETO (privateuse1_profiler.h is empty without
// it) and Kineto's headers; Kineto itself is linked into libtorch_cpu.
#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "openreg/runtime.h"

namespace c10::openreg {
namespace {

using libkineto::ActivityType;

// Runtime work that is not worth a row: event records and waits.
bool is_bookkeeping(const std::string& name) {
  return name == "openreg::record_event" || name == "openreg::wait_event";
}

ActivityType type_of(const std::string& name) {
  if (name == "openreg::memcpy") return ActivityType::GPU_MEMCPY;
  if (name == "openreg::memset") return ActivityType::GPU_MEMSET;
  return ActivityType::CONCURRENT_KERNEL;
}

const char* launch_name(ActivityType type) {
  switch (type) {
    case ActivityType::GPU_MEMCPY:
      return "orMemcpyAsync";
    case ActivityType::GPU_MEMSET:
      return "orMemsetAsync";
    default:
      return "orLaunchKernel";
  }
}

int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class OpenRegSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    // Kineto's times are nanoseconds since the system-clock epoch; the runtime's are steady.
    clock_offset_ = system_now_ns() - static_cast<int64_t>(orNowNs());
    orTracingFlush([](const orActivity*, void*) {}, nullptr, nullptr);  // drop what a previous session left
    orTracingEnable(1);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    // Also waits for work of the session still queued on any device (torch.profiler only
    // synchronises the current one), so it lands in this trace, not the next.
    orTracingEnable(0);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  void pushCorrelationId(uint64_t id) override { orTracingPushCorrelationId(id); }
  void popCorrelationId() override { orTracingPopCorrelationId(); }

  std::vector<std::string> errors() override {
    if (dropped_ == 0) return {};
    return {"openreg: " + std::to_string(dropped_) + " device activities were not recorded (more than 2^20 per trace)"};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start,
                    int64_t end) override {
    span_ = std::make_unique<libkineto::TraceSpan>(start, end, "openreg");
    struct Raw {
      std::string name;
      int device;
      uintptr_t stream;
      bool is_default;
      uint64_t correlation;
      int64_t start, end;
      uint64_t host_thread;
      int64_t enqueue;
    };
    std::vector<Raw> raw;
    orTracingFlush(
        [](const orActivity* a, void* user) {
          static_cast<std::vector<Raw>*>(user)->push_back(
              {a->name, a->device, reinterpret_cast<uintptr_t>(a->stream), a->is_default_stream != 0, a->correlation,
               static_cast<int64_t>(a->start_ns), static_cast<int64_t>(a->end_ns), a->host_thread,
               static_cast<int64_t>(a->enqueue_ns)});
        },
        &raw, &dropped_);
    // An operator may queue several work items (a copy, then a kernel): its correlation id starts
    // one flow, at its first launch, which every item ends (Kineto warns about a second start).
    std::unordered_set<uint64_t> flow_started;
    for (const Raw& r : raw) {
      if (is_bookkeeping(r.name)) continue;
      auto act = std::make_unique<libkineto::GenericTraceActivity>(*span_, type_of(r.name), r.name);
      act->startTime = r.start + clock_offset_;
      act->endTime = r.end + clock_offset_;
      act->device = r.device;
      act->resource = resource_of(r.device, r.stream, r.is_default);
      act->id = static_cast<int32_t>(r.correlation);
      act->addMetadataQuoted("device", "openreg:" + std::to_string(r.device));
      act->addMetadataQuoted("stream", stream_names_[{r.device, act->resource}]);
      if (r.correlation != 0) {
        // The launch, on the host thread that enqueued the work, inside the CPU op.
        auto launch = std::make_unique<libkineto::GenericTraceActivity>(*span_, ActivityType::PRIVATEUSE1_RUNTIME,
                                                                        launch_name(act->type()));
        launch->startTime = launch->endTime = r.enqueue + clock_offset_;
        launch->device = static_cast<int32_t>(libkineto::processId());
        launch->resource = static_cast<int32_t>(r.host_thread);
        launch->threadId = static_cast<int32_t>(r.host_thread);
        for (auto* a : {launch.get(), act.get()}) {
          a->id = static_cast<int32_t>(r.correlation);
          a->linked = linked(static_cast<int32_t>(r.correlation));
          a->flow.id = static_cast<uint32_t>(r.correlation);
          a->flow.type = libkineto::kLinkAsyncCpuGpu;
        }
        const bool first = flow_started.insert(r.correlation).second;
        if (!first) launch->flow = {};  // no second start: this launch draws no arrow
        launch->flow.start = first;
        act->flow.start = false;
        logger.handleGenericActivity(*launch);
        activities_.push_back(std::move(launch));
      }
      logger.handleGenericActivity(*act);
      activities_.push_back(std::move(act));  // Kineto keeps pointers until the session dies
    }
    status_ = libkineto::TraceStatus::READY;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [key, name] : stream_names_) out.push_back({key.second, key.second, key.first, name});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  // Streams become trace rows numbered per device in order of appearance; the default stream is row 0.
  int32_t resource_of(int device, uintptr_t stream, bool is_default) {
    if (is_default) {
      stream_names_.emplace(std::make_pair(device, 0), "default stream");
      return 0;
    }
    auto [it, inserted] = stream_ids_.emplace(std::make_pair(device, stream), 0);
    if (inserted) {
      it->second = ++next_id_[device];
      stream_names_.emplace(std::make_pair(device, it->second), "stream " + std::to_string(it->second));
    }
    return it->second;
  }

  int64_t clock_offset_ = 0;
  uint64_t dropped_ = 0;
  std::unique_ptr<libkineto::TraceSpan> span_;
  std::vector<std::unique_ptr<libkineto::GenericTraceActivity>> activities_;
  std::map<std::pair<int, uintptr_t>, int32_t> stream_ids_;
  std::map<int, int32_t> next_id_;
  std::map<std::pair<int64_t, int64_t>, std::string> stream_names_;
};

class OpenRegActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& requested,
                                                                 const libkineto::Config&) override {
    for (ActivityType t : requested)
      if (types_.count(t)) return std::make_unique<OpenRegSession>();
    return nullptr;  // no device activity asked for
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& requested,
                                                                 const libkineto::Config& config) override {
    return configure(requested, config);
  }

 private:
  std::string name_{"openreg"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY, ActivityType::GPU_MEMSET};
};

REGISTER_PRIVATEUSE1_PROFILER(OpenRegActivityProfiler);

}  // namespace
}  // namespace c10::openreg
