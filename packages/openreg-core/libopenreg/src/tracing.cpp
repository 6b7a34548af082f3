// Activity tracing: per work item timing for profilers (orTracing*).
//
// The enqueuing thread tags an item while tracing is on (trace_prepare in
// runtime_internal.h); the stream's worker times the item and appends a record
// here. Records keep a copy of the kernel name: names only have to live until
// their kernel ran.
#include <string>
#include <vector>

#include "runtime_internal.h"

namespace openreg::rt {

std::atomic<bool> g_tracing{false};

namespace {

thread_local std::vector<uint64_t> t_correlation;

struct Record {
  std::string name;
  int device;
  uintptr_t stream;
  bool is_default;
  uint64_t correlation, start_ns, end_ns, host_thread, enqueue_ns;
};

std::mutex& records_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::vector<Record>& records() {
  static auto* r = new std::vector<Record>();
  return *r;
}

}  // namespace

uint64_t current_correlation() { return t_correlation.empty() ? 0 : t_correlation.back(); }

// Bounds the memory tracing takes when nobody flushes: later activities are counted, not kept.
constexpr size_t kMaxRecords = size_t{1} << 20;
std::atomic<uint64_t> g_dropped{0};

void trace_record(const Stream& s, const WorkItem& item, uint64_t start_ns, uint64_t end_ns) {
  Record r{item.name ? item.name : "", s.device,       s.handle, s.is_default, item.correlation, start_ns, end_ns,
           item.host_thread,           item.enqueue_ns};
  std::lock_guard<std::mutex> lock(records_mu());
  if (records().size() >= kMaxRecords) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  records().push_back(std::move(r));
}

}  // namespace openreg::rt

using namespace openreg::rt;

extern "C" {

orStatus orTracingEnable(int enable) {
  if (!enable)
    if (orStatus st = refuse_wait_from_kernel("orTracingEnable(0)", nullptr)) return st;
  g_tracing.store(enable != 0, std::memory_order_relaxed);
  if (enable) return orSuccess;
  // Turning tracing off completes the trace: wait until every stream has run the work
  // traced so far. Kernel errors stay pending for the user's next synchronising call.
  wait_for_all_devices();
  return orSuccess;
}

orStatus orTracingPushCorrelationId(uint64_t id) {
  t_correlation.push_back(id);
  return orSuccess;
}

orStatus orTracingPopCorrelationId(void) {
  if (t_correlation.empty()) return fail(orErrorInvalidValue, "no correlation id to pop on this thread");
  t_correlation.pop_back();
  return orSuccess;
}

orStatus orTracingFlush(orActivityFn fn, void* user, uint64_t* dropped) {
  if (fn == nullptr) return fail(orErrorInvalidValue, "fn is NULL");
  std::vector<Record> taken;
  {
    std::lock_guard<std::mutex> lock(records_mu());
    taken.swap(records());
    const uint64_t lost = g_dropped.exchange(0);
    if (dropped != nullptr) *dropped = lost;
  }
  for (const Record& r : taken) {
    orActivity a{r.name.c_str(),
                 r.device,
                 reinterpret_cast<orStream_t>(r.stream),
                 r.is_default ? 1 : 0,
                 r.correlation,
                 r.start_ns,
                 r.end_ns,
                 r.host_thread,
                 r.enqueue_ns};
    fn(&a, user);
  }
  return orSuccess;
}

uint64_t orNowNs(void) { return openreg::platform::now_ns(); }

}  // extern "C"
