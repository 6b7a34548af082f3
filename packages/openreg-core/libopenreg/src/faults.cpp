// Fault injection (OPENREG_FAULTS, orInjectFaults): failing allocations, kernels and copies, and
// slowing streams, on purpose, to test how the layers above react. The syntax is documented in
// include/openreg/faults.h.
//
// Free when off: every hook sits behind one relaxed load of g_faults_armed. When armed, the hooks
// take one process-wide mutex; that serialises allocations, copies and work items a little, which
// is acceptable for a testing aid and keeps the counting exact across threads.
//
// Where each fault acts:
//   alloc   orMalloc, before the arena is searched: the call returns orErrorMemoryAllocation.
//   copy    when a copy is issued: its work item fails on the device instead of copying.
//   kernel  on the stream's worker, when the item is about to run: it fails instead of running.
//   slow    on the worker too: the item waits before it runs (a wait that re-arming cuts short).
// Nothing here is OS-specific (std::condition_variable sleeps), so the OS seam is untouched.
#include "openreg/faults.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "runtime_internal.h"

namespace openreg::rt {

std::atomic<bool> g_faults_armed{false};

namespace {

constexpr uint64_t kMaxSlowMs = 3600 * 1000;  // an hour

struct Target {
  enum Kind { kAll, kDevice, kStream } kind = kAll;
  uint64_t value = 0;
  bool matches(int device, uintptr_t stream) const {
    return kind == kAll || (kind == kDevice && value == static_cast<uint64_t>(device)) ||
           (kind == kStream && value == stream);
  }
};

struct Clause {
  enum Kind { kAlloc, kKernel, kCopy, kSlow } kind = kAlloc;
  Target target;
  std::string name;  // kernel
  uint64_t first = 1, count = 1;
  uint64_t ms = 0;    // slow
  uint64_t seen = 0;  // allocations / copies counted so far; kernel: 1 once it fired
  std::string text;   // the clause as written, for messages
  bool hit() {        // counts one more event and says whether it is in [first, first + count)
    ++seen;
    return seen >= first && seen - first < count;
  }
};

struct Faults {
  std::mutex mu;
  std::condition_variable cv;  // slow waits; notified when the faults are replaced
  uint64_t generation = 0;
  std::vector<Clause> clauses;
  std::set<std::string> messages;  // of failed copies: kept for good, queued items point at them
};

Faults& faults() {
  static Faults* f = new Faults();  // leaked: workers may use it after main() returns
  return *f;
}

const char* const kSyntax =
    "expected comma-separated clauses alloc[@DEVICE]:N[:K], kernel[@TARGET]:NAME, copy[@TARGET]:N[:K], "
    "slow[@TARGET]:MS (TARGET: a device index or a stream handle 0x...)";

bool parse_number(const std::string& text, int base, uint64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, base);
  if (errno != 0 || end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

// N or N:K, with N and K at least 1.
bool parse_range(const std::string& text, Clause* c) {
  const size_t colon = text.find(':');
  if (!parse_number(text.substr(0, colon), 10, &c->first) || c->first == 0) return false;
  if (colon == std::string::npos) return true;
  return parse_number(text.substr(colon + 1), 10, &c->count) && c->count > 0;
}

bool parse_clause(const std::string& text, int device_count, Clause* c, std::string* why) {
  c->text = text;
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return *why = "no ':' after the fault's kind", false;
  const std::string head = text.substr(0, colon), rest = text.substr(colon + 1);
  const size_t at = head.find('@');
  const std::string kind = head.substr(0, at);
  if (at != std::string::npos) {
    const std::string target = head.substr(at + 1);
    if (target.rfind("0x", 0) == 0) {
      c->target.kind = Target::kStream;
      if (!parse_number(target.substr(2), 16, &c->target.value) || c->target.value == 0)
        return *why = "'" + target + "' is not a stream handle", false;
    } else {
      c->target.kind = Target::kDevice;
      if (!parse_number(target, 10, &c->target.value) || c->target.value >= static_cast<uint64_t>(device_count))
        return *why = "'" + target + "' is not a device index from 0 to " + std::to_string(device_count - 1), false;
    }
  }
  if (kind == "alloc") {
    c->kind = Clause::kAlloc;
    if (c->target.kind == Target::kStream) return *why = "an allocation belongs to a device, not a stream", false;
    if (!parse_range(rest, c)) return *why = "'" + rest + "' is not N or N:K (whole numbers from 1)", false;
  } else if (kind == "copy") {
    c->kind = Clause::kCopy;
    if (!parse_range(rest, c)) return *why = "'" + rest + "' is not N or N:K (whole numbers from 1)", false;
  } else if (kind == "kernel") {
    c->kind = Clause::kKernel;
    c->name = rest;
    if (rest.empty()) return *why = "no kernel name", false;
    // Event records and waits are the runtime's bookkeeping: skipping one would hang its waiters.
    if (rest == "openreg::record_event" || rest == "openreg::wait_event")
      return *why = "event records and waits cannot be failed", false;
  } else if (kind == "slow") {
    c->kind = Clause::kSlow;
    if (!parse_number(rest, 10, &c->ms) || c->ms > kMaxSlowMs)
      return *why = "'" + rest + "' is not a whole number of milliseconds up to " + std::to_string(kMaxSlowMs), false;
  } else {
    return *why = "unknown fault '" + kind + "'", false;
  }
  return true;
}

bool parse_spec(const char* spec, int device_count, std::vector<Clause>* out, std::string* why) {
  const std::string s = spec ? spec : "";
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string text = s.substr(start, end - start);
    Clause c;
    if (text.empty() || !parse_clause(text, device_count, &c, why)) {
      if (text.empty()) *why = "an empty clause";
      *why = "clause '" + text + "': " + *why + "; " + kSyntax;
      return false;
    }
    out->push_back(std::move(c));
    start = end + 1;
  }
  return true;
}

void arm(std::vector<Clause> clauses) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  f.clauses = std::move(clauses);
  ++f.generation;
  g_faults_armed.store(!f.clauses.empty(), std::memory_order_relaxed);
  f.cv.notify_all();  // ends slow waits: they were for the faults armed before
}

std::string injected(const Clause& c) { return "fault injected by OPENREG_FAULTS (" + c.text + ")"; }

}  // namespace

void faults_from_env(int device_count, std::string* error) {
  const char* env = std::getenv("OPENREG_FAULTS");
  if (env == nullptr || *env == '\0') return;
  std::vector<Clause> clauses;
  std::string why;
  if (!parse_spec(env, device_count, &clauses, &why)) {
    *error = "OPENREG_FAULTS='" + std::string(env) + "' is malformed: " + why;
    return;
  }
  arm(std::move(clauses));
}

orStatus fault_on_malloc(int device) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  for (Clause& c : f.clauses)
    if (c.kind == Clause::kAlloc && c.target.matches(device, 0) && c.hit())
      return fail(orErrorMemoryAllocation, injected(c) + ": allocation " + std::to_string(c.seen) +
                                               " on openreg device " + std::to_string(device) + " fails");
  return orSuccess;
}

const char* fault_on_copy(Stream& stream) {
  if (stream.capturing()) return nullptr;  // a captured copy would fail at every replay
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  const char* message = nullptr;
  for (Clause& c : f.clauses)
    if (c.kind == Clause::kCopy && c.target.matches(stream.device, stream.handle) && c.hit())
      message = f.messages.insert(injected(c)).first->c_str();
  return message;
}

bool fault_on_run(const Stream& stream, const WorkItem& item, std::string* message) {
  Faults& f = faults();
  std::unique_lock<std::mutex> lock(f.mu);
  bool failing = false;
  uint64_t delay_ms = 0;
  for (Clause& c : f.clauses) {
    if (!c.target.matches(stream.device, stream.handle)) continue;
    if (c.kind == Clause::kSlow) delay_ms = std::max(delay_ms, c.ms);
    if (c.kind == Clause::kKernel && c.seen == 0 && item.name != nullptr && c.name == item.name) {
      c.seen = 1;
      *message = injected(c);
      failing = true;
    }
  }
  if (delay_ms > 0) {
    const uint64_t generation = f.generation;
    f.cv.wait_for(lock, std::chrono::milliseconds(delay_ms), [&] { return f.generation != generation; });
  }
  return failing;
}

}  // namespace openreg::rt

extern "C" {

orStatus orInjectFaults(const char* spec) {
  using namespace openreg::rt;
  if (orStatus st = check_runtime()) return st;
  std::vector<Clause> clauses;
  std::string why;
  if (!parse_spec(spec, runtime().device_count, &clauses, &why)) return fail(orErrorInvalidValue, why);
  arm(std::move(clauses));
  return orSuccess;
}

}  // extern "C"
