// Streams, events and kernel launch.
//
// Each stream owns one worker thread, started at the first launch, that runs
// the stream's work items in order. The queue is a ring of kQueueDepth slots:
// a launch takes the stream's mutex (the worker only takes it to sleep),
// writes its item into the next slot and publishes it by advancing the
// `submitted` counter; the worker copies items out in order without the
// mutex, so a launch and the item's start share no lock and touch few cache
// lines. When the ring is full (more than kQueueDepth items queued), items go
// to an overflow deque, which the worker reads under the mutex: a launch never
// waits for the device. (It must not: the worker may need a lock the
// launching thread holds, e.g. the GIL for a custom op's Python kernel.)
// The worker is only woken through the condition variable when it went to
// sleep, because an idle worker first spins for OPENREG_SPIN_US microseconds
// (default 20) watching `submitted`. That spin is what makes
// launch-to-completion latency a few microseconds.
//
// Everything a stream does is a work item: kernels, copies, memsets, event
// records and waits. A destroyed stream keeps its parked worker for reuse.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime_internal.h"

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace openreg::rt {

namespace {
thread_local bool t_in_kernel = false;
thread_local const Stream* t_running_stream = nullptr;  // while t_in_kernel: the kernel's stream
// CPU threads that running kernels occupy: each running kernel counts its width, the threads
// of its parallel team (orLaunchContextApply's result; 1 without launch-context hooks). A
// waiting host thread spins only while these and the spinning waiters, itself included, fit on
// the CPUs the process may use (Progress::wait_for).
alignas(64) std::atomic<int> g_kernel_threads{0};  // a line of its own: workers write it per kernel
std::atomic<int> g_spinning_waiters{0};            // host threads in a wait's long spin
thread_local int t_applied_width = 1;              // what the launch context this worker applied last returned
constexpr uint64_t kHeldSpinNs = 5000;             // a waiter's spin with the caller's locks (the GIL) held
thread_local std::string t_kernel_error;
constexpr size_t kQueueDepth = 1024;  // ring slots per stream; more items wait in its overflow
constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;

}  // namespace

uint64_t spin_ns() { return runtime().spin_ns; }
uint64_t wait_spin_ns() { return runtime().wait_spin_ns; }

namespace {
struct WaitHooks {
  orBlockingWaitBegin begin;
  orBlockingWaitEnd end;
};
struct LaunchContextHooks {
  orLaunchContextCapture capture;
  orLaunchContextApply apply;
};

// Where a pair of hooks set through the C API lives. Replaced as a pair; a thread may still hold
// the previous one, so none is freed: all stay in `kept` (set once or twice per process: not a leak).
template <typename Pair>
struct Hooks {
  static inline std::atomic<const Pair*> current{nullptr};
  static inline auto* const kept = new std::vector<std::unique_ptr<Pair>>();
  static inline std::mutex mu;

  template <typename A, typename B>
  static orStatus set(A a, B b, const char* api) {
    if ((a == nullptr) != (b == nullptr))
      return fail(orErrorInvalidValue, std::string(api) + " needs both hooks or neither");
    const Pair* pair = nullptr;
    if (a != nullptr) {
      std::lock_guard<std::mutex> lock(mu);
      kept->push_back(std::make_unique<Pair>(Pair{a, b}));
      pair = kept->back().get();
    }
    current.store(pair, std::memory_order_release);
    return orSuccess;
  }
  static const Pair* get() { return current.load(std::memory_order_acquire); }
};

// The launch context this worker applied last.
thread_local uint64_t t_applied_context = 0;
}  // namespace

void Progress::advance_to(uint64_t v) {
  uint64_t cur = value_.load(std::memory_order_relaxed);
  while (cur < v && !value_.compare_exchange_weak(cur, v, std::memory_order_seq_cst)) {
  }
  // Pairs with wait_for's store of wake_at_ and load of value_ (all seq_cst): either this load
  // sees the sleeper's target, or the sleeper sees the new value and does not sleep.
  if (v >= wake_at_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

bool Progress::spin_for(uint64_t v, uint64_t deadline_ns, bool while_cpus_free) const {
  static const int cpus = platform::hardware_threads();
  do {
    for (int i = 0; i < 64; ++i) {
      if (value() >= v) return true;
      platform::cpu_relax();
    }
    if (while_cpus_free) {
      if (g_kernel_threads.load(std::memory_order_relaxed) + g_spinning_waiters.load(std::memory_order_relaxed) > cpus)
        return false;
      // A thread this process does not count (another process, an OpenMP helper) may want the CPU.
      std::this_thread::yield();
    }
  } while (platform::now_ns() < deadline_ns);
  return false;
}

void Progress::wait_for(uint64_t v) {
  if (value() >= v) return;
  // First a few microseconds with the caller's locks held: most waits end here.
  const uint64_t start_ns = platform::now_ns();
  const uint64_t spin_ns = wait_spin_ns();
  if (spin_for(v, start_ns + std::min(spin_ns, kHeldSpinNs), false)) return;
  // Before the lock: the hook may wait for an interpreter lock of its own when it ends.
  const WaitHooks* hooks = Hooks<WaitHooks>::get();
  void* token = hooks != nullptr ? hooks->begin() : nullptr;
  // Then a host thread spins on, with the interpreter released, as long as the kernels running
  // leave it a CPU of its own: a sleeping waiter costs a wake-up when the work completes (40 us on
  // a VM whose idle CPUs halt), a spinning one costs nothing while its CPU would be idle anyway. A
  // worker waiting for another stream does not: what it waits for may be work this count does not
  // see (a collective's peer process, whose threads need the CPUs; measured in the collectives
  // bench, 8-byte operations 50 to 120 us slower when workers spun too).
  if (!t_in_kernel && spin_ns > kHeldSpinNs) {
    g_spinning_waiters.fetch_add(1, std::memory_order_relaxed);  // counts itself: two spinners need two CPUs
    const bool done = spin_for(v, start_ns + spin_ns, true);
    g_spinning_waiters.fetch_sub(1, std::memory_order_relaxed);
    if (done) {
      if (hooks != nullptr) hooks->end(token);
      return;
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    targets_.push_back(v);
    wake_at_.store(std::min(wake_at_.load(std::memory_order_relaxed), v), std::memory_order_seq_cst);
    while (value_.load(std::memory_order_seq_cst) < v) {
      cv_.wait(lock);
      runtime().counters.wait_wakeups.fetch_add(1, std::memory_order_relaxed);
    }
    targets_.erase(std::find(targets_.begin(), targets_.end(), v));
    uint64_t lowest = UINT64_MAX;
    for (uint64_t t : targets_) lowest = std::min(lowest, t);
    wake_at_.store(lowest, std::memory_order_seq_cst);
  }
  if (hooks != nullptr) hooks->end(token);
}

namespace {
struct RecordArgs {
  Event* event;
  uint64_t generation;
};

orStatus record_kernel(void* p) {
  auto* a = static_cast<RecordArgs*>(p);
  {
    // An earlier record of the event, queued on a busier stream, may run after a later one: the
    // event's time is its last record's (cudaEventRecord overwrites the earlier state), so an
    // earlier record does not overwrite it. record_mu is never held across a wait.
    std::lock_guard<std::mutex> lock(a->event->record_mu);
    if (a->generation > a->event->time_generation) {
      a->event->time_ns.store(platform::now_ns(), std::memory_order_relaxed);
      a->event->time_generation = a->generation;
    }
  }
  a->event->completed.advance_to(a->generation);
  return orSuccess;
}

orStatus wait_kernel(void* p) {
  auto* a = static_cast<WaitTarget*>(p);
  a->progress->wait_for(a->value);
  return orSuccess;
}

void delete_record_args(void* p) { delete static_cast<RecordArgs*>(p); }
void delete_wait_args(void* p) { delete static_cast<WaitTarget*>(p); }
}  // namespace

uint64_t Stream::enqueue(const WorkItem& in, Forward* forward, const char* refusal) {
  std::unique_lock<std::mutex> lock(mu);
  if (dying) {  // orStreamDestroy drains only what was queued before it began
    lock.unlock();
    if (in.deleter) in.deleter(in.args);
    return kRefused;
  }
  if (capture != nullptr && refusal != nullptr) {
    if (capture->invalidated_by.empty()) capture->invalidated_by = refusal;
    lock.unlock();
    if (in.deleter) in.deleter(in.args);
    return kRefusedCapturing;
  }
  if (capture != nullptr) {  // recorded into the graph, which now owns the item's arguments
    capture->items.push_back(in);
    return 0;
  }
  if (!has_worker) {
    has_worker = true;
    ring.resize(kQueueDepth);
    room_until = submitted_locked + ring.size();
    std::thread([this] { worker_loop(); }).detach();
  }
  const uint64_t seq = submitted_locked + 1;
  if (seq > room_until) room_until = completed.value() + ring.size();
  WorkItem* item = nullptr;
  if (seq <= room_until) {
    item = &ring[seq % ring.size()].item;
  } else {  // the ring is full: never wait for the worker (it may need a lock this thread holds)
    overflow.emplace_back();
    item = &overflow.back();
  }
  *item = in;
  item->seq = seq;
  trace_prepare(*item);
  if (in.fn == record_kernel) {  // waits for nothing itself: what it follows, for Forward
    if (forward != nullptr) {
      forward->count = 0;
      for (size_t i = 0; i < tail_wait_count; ++i) forward->targets[forward->count++] = tail_waits[i];
      if (completed.value() < last_work_seq) forward->targets[forward->count++] = {&completed, last_work_seq};
    }
  } else if (in.fn == wait_kernel && tail_wait_count < tail_waits.size()) {
    tail_waits[tail_wait_count++] = *static_cast<const WaitTarget*>(in.args);
  } else {  // work (or one wait too many): whoever waits for what follows waits for this item
    last_work_seq = seq;
    tail_wait_count = 0;
  }
  submitted_locked = seq;
  submitted.store(seq, std::memory_order_release);
  const bool wake = sleeping;
  lock.unlock();
  if (wake) work_cv.notify_one();
  return seq;
}

void Stream::worker_loop() {
  const uint64_t spin = spin_ns();
  uint64_t next = completed.value() + 1;
  // The ring is sized before the worker starts and never after. Reading its bounds from `ring`
  // at every item would read the cache line that launches write `submitted_locked` to.
  Slot* const slots = ring.data();
  const uint64_t depth = ring.size();
  for (;;) {
    if (submitted.load(std::memory_order_acquire) < next) {
      const uint64_t deadline = platform::now_ns() + spin;
      while (submitted.load(std::memory_order_acquire) < next && platform::now_ns() < deadline) {
        for (int i = 0; i < 32; ++i) platform::cpu_relax();
      }
      if (submitted.load(std::memory_order_acquire) < next) {
        std::unique_lock<std::mutex> lock(mu);
        while (submitted.load(std::memory_order_acquire) < next) {
          sleeping = true;
          work_cv.wait(lock);
          sleeping = false;
        }
      }
    }
    // Item `next` is in its ring slot, or in the overflow when the ring was full. No launch
    // writes the slot before this item completes, so reading it needs no lock.
    WorkItem item;
    if (const WorkItem& slot = slots[next % depth].item; slot.seq == next) {
      item = slot;
    } else {
      std::lock_guard<std::mutex> lock(mu);
      item = overflow.front();
      overflow.pop_front();
    }
    ++next;
    // Device code sees the stream's device as current, as on a real device.
    current_device_index() = device;
    t_in_kernel = true;
    t_running_stream = this;
    t_kernel_error.clear();
    orStatus st = orSuccess;
    // An injected fault (faults.cpp) may delay the item or fail it instead of running it.
    const bool injected = g_faults_armed.load(std::memory_order_relaxed) && fault_on_run(*this, item, &t_kernel_error);
    const uint64_t start_ns = item.traced ? platform::now_ns() : 0;
    if (injected) {
      st = orErrorLaunchFailure;
    } else {
      try {
        if (item.context != 0 && item.context != t_applied_context) {
          if (const LaunchContextHooks* hooks = Hooks<LaunchContextHooks>::get())
            t_applied_width = std::max(1, hooks->apply(item.context));
          t_applied_context = item.context;
        }
        // An item without a context (a copy, a record, a wait) runs on this thread alone.
        const int width = item.context != 0 ? t_applied_width : 1;
        g_kernel_threads.fetch_add(width, std::memory_order_relaxed);
        struct Uncount {
          int width;
          ~Uncount() { g_kernel_threads.fetch_sub(width, std::memory_order_relaxed); }
        } uncount{width};
        st = item.fn(item.args);
      } catch (const std::exception& e) {
        t_kernel_error = e.what();
        st = orErrorLaunchFailure;
#if defined(__GLIBCXX__)
      } catch (abi::__forced_unwind&) {
        // The thread is being ended (pthread_exit: Python ends a thread that asks for the GIL
        // while the interpreter shuts down). Swallowing this would abort the process.
        throw;
#endif
      } catch (...) {
        t_kernel_error = "unknown exception";
        st = orErrorLaunchFailure;
      }
    }
    t_in_kernel = false;
    t_running_stream = nullptr;
    if (item.traced) trace_record(*this, item, start_ns, platform::now_ns());
    if (st != orSuccess)
      record_kernel_error(device, item.name, t_kernel_error.empty() ? orGetErrorName(st) : t_kernel_error.c_str());
    if (item.deleter) item.deleter(item.args);
    completed.advance_to(item.seq);
  }
}

orStatus resolve_stream(orStream_t handle, Stream** out) {
  if (handle == nullptr) {
    Device* dev = nullptr;
    if (orStatus st = current_device(&dev)) return st;
    handle = dev->default_stream;
  }
  Stream* s = runtime().streams.lookup(reinterpret_cast<uintptr_t>(handle));
  if (s == nullptr) return fail(orErrorInvalidResourceHandle, "the stream is unknown or was destroyed");
  *out = s;
  return orSuccess;
}

orStatus resolve_event(orEvent_t handle, Event** out) {
  Event* e = runtime().events.lookup(reinterpret_cast<uintptr_t>(handle));
  if (e == nullptr) return fail(orErrorInvalidResourceHandle, "the event is unknown or was destroyed");
  *out = e;
  return orSuccess;
}

std::mutex& graphs_mu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

// Live graphs by handle (under graphs_mu). A handle is a number never handed out twice (odd, so
// never NULL), not the Graph's address, which a later graph may get: a destroyed graph's handle
// must be refused, not name that graph.
std::unordered_map<uintptr_t, Graph*>& live_graphs() {
  static auto* graphs = new std::unordered_map<uintptr_t, Graph*>();
  return *graphs;
}

uintptr_t next_graph_handle() {
  static std::atomic<uintptr_t> next{1};
  return next.fetch_add(2, std::memory_order_relaxed);
}

// The graph behind `handle`, counted as in use (Graph::users) until the GraphUse goes: orGraphDestroy
// of the same graph on another thread waits for that before it deletes the graph.
struct GraphUse {
  Graph* g = nullptr;
  GraphUse() = default;
  GraphUse(const GraphUse&) = delete;
  GraphUse& operator=(const GraphUse&) = delete;
  ~GraphUse() {
    if (g != nullptr) g->users.fetch_sub(1, std::memory_order_release);
  }
};

orStatus resolve_graph(orGraph_t handle, GraphUse* use) {
  std::lock_guard<std::mutex> lock(graphs_mu());
  auto it = live_graphs().find(reinterpret_cast<uintptr_t>(handle));
  if (it == live_graphs().end()) return fail(orErrorInvalidResourceHandle, "the graph is unknown or was destroyed");
  use->g = it->second;
  use->g->users.fetch_add(1, std::memory_order_relaxed);
  return orSuccess;
}

void release_graph(Graph* g) {
  if (g->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  for (WorkItem& item : g->items)
    if (item.deleter) item.deleter(item.args);
  for (Graph* child : g->children) release_graph(child);
  delete g;
}

orStatus refuse_wait_from_kernel(const char* call, const Stream* target, int device) {
  const Stream* running = t_running_stream;
  if (running == nullptr) return orSuccess;
  const bool waits_for_itself = target != nullptr ? target == running : (device < 0 || device == running->device);
  if (!waits_for_itself) return orSuccess;
  return fail(orErrorNotPermitted, std::string(call) +
                                       " was called from a kernel and would wait for the stream running that "
                                       "kernel, which never ends while it waits: wait on the host instead");
}

orStatus finish_launch(Stream& s, uint64_t seq) {
  if (!runtime().launch_blocking || seq == 0 || t_running_stream != nullptr) return orSuccess;
  s.completed.wait_for(seq);
  return take_device_error(runtime().devices[s.device]);
}

orStatus refuse_while_capturing(Stream& s, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.capture == nullptr) return orSuccess;
    if (s.capture->invalidated_by.empty()) s.capture->invalidated_by = message;
  }
  return fail(orErrorStreamCaptureUnsupported, message);
}

namespace {

// false: the stream is being destroyed.
bool enqueue_wait(Stream& s, Progress* progress, uint64_t value) {
  WorkItem item;
  item.fn = wait_kernel;
  item.args = new WaitTarget{progress, value};
  item.deleter = delete_wait_args;
  item.name = "openreg::wait_event";
  return s.enqueue(item) != Stream::kRefused;
}

orStatus event_device_error(Event& e) {
  int device = e.device.load();
  return device < 0 ? orSuccess : take_device_error(runtime().devices[device]);
}

// The event's last record, and what it waits for (see Forward: valid if forward->generation is it).
uint64_t last_record(Event& e, Forward* forward) {
  std::lock_guard<std::mutex> lock(e.record_mu);
  const uint64_t generation = e.recorded.load(std::memory_order_acquire);
  *forward = e.forward;
  return generation;
}

// Whether the event's last record is complete. It is as soon as everything it waits for is: a
// stream that waited for the event waited for those (orStreamWaitEvent), and whoever synchronised
// that stream must find the event complete, though its own stream's worker may not have reached
// the record yet.
bool event_done(Event& e) {
  if (e.completed.value() >= e.recorded.load(std::memory_order_acquire)) return true;
  Forward forward;
  const uint64_t generation = last_record(e, &forward);
  if (e.completed.value() >= generation) return true;
  if (forward.generation != generation) return false;
  for (size_t i = 0; i < forward.count; ++i)
    if (forward.targets[i].progress->value() < forward.targets[i].value) return false;
  return true;
}

}  // namespace

}  // namespace openreg::rt

using namespace openreg::rt;

extern "C" {

orStatus orDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = kLeastPriority;
  if (greatest) *greatest = kGreatestPriority;
  return orSuccess;
}

orStatus orStreamCreate(orStream_t* stream) { return orStreamCreateWithPriority(stream, 0, 0); }

orStatus orStreamCreateWithPriority(orStream_t* stream, unsigned int flags, int priority) {
  if (stream == nullptr) return fail(orErrorInvalidValue, "stream is NULL");
  if (flags != orStreamDefault) return fail(orErrorInvalidValue, "unknown stream flags");
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = current_device(&dev)) return st;
  uintptr_t handle = 0;
  Stream* s = runtime().streams.acquire(&handle);
  if (s == nullptr) return fail(orErrorMemoryAllocation, "too many streams");
  // As on CUDA, priorities outside the range are clamped to it.
  s->init(handle, dev->index,
          priority > kLeastPriority      ? kLeastPriority
          : priority < kGreatestPriority ? kGreatestPriority
                                         : priority,
          /*default_stream=*/false);
  {
    std::lock_guard<std::mutex> lock(dev->streams_mu);
    dev->streams.push_back(s);
  }
  runtime().counters.streams_created.fetch_add(1, std::memory_order_relaxed);
  *stream = reinterpret_cast<orStream_t>(handle);
  return orSuccess;
}

orStatus orStreamDestroy(orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  if (stream == nullptr) return fail(orErrorInvalidResourceHandle, "the default stream cannot be destroyed");
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  if (s->is_default) return fail(orErrorInvalidResourceHandle, "the default stream cannot be destroyed");
  if (orStatus st = refuse_wait_from_kernel("orStreamDestroy", s)) return st;
  // From here the stream refuses launches (`dying`): work launched while it drains was left
  // behind, unlinked, and device synchronisation and orFree no longer waited for it. One destroy
  // wins: a second one (of the same handle, checked under the lock, since the slot may have been
  // recycled meanwhile) is refused.
  // A capture in progress ends with the stream, its graph discarded (as CUDA invalidates it): the
  // slot is recycled for the next stream created, which must not start out capturing.
  Graph* abandoned = nullptr;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->dying || runtime().streams.lookup(reinterpret_cast<uintptr_t>(stream)) != s)
      return fail(orErrorInvalidResourceHandle, "the stream is unknown or was destroyed");
    s->dying = true;
    std::swap(abandoned, s->capture);
  }
  // Drain and unlink the stream before its slot is released: once released, the
  // slot can be recycled by another thread for another device, and work still
  // queued here would run as that device (and s->device would be rewritten).
  s->synchronize();
  if (abandoned != nullptr) release_graph(abandoned);
  {
    Device& dev = runtime().devices[s->device];
    std::lock_guard<std::mutex> lock(dev.streams_mu);
    for (auto it = dev.streams.begin(); it != dev.streams.end(); ++it) {
      if (*it == s) {
        dev.streams.erase(it);
        break;
      }
    }
  }
  if (!runtime().streams.release(reinterpret_cast<uintptr_t>(stream)))
    return fail(orErrorInvalidResourceHandle, "the stream is unknown or was destroyed");
  runtime().counters.streams_destroyed.fetch_add(1, std::memory_order_relaxed);
  return orSuccess;
}

orStatus orStreamQuery(orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  return s->idle() ? orSuccess : orErrorNotReady;
}

orStatus orStreamSynchronize(orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  if (orStatus st = refuse_wait_from_kernel("orStreamSynchronize", s)) return st;
  if (orStatus st =
          refuse_while_capturing(*s, "cannot synchronize a stream while the stream is being captured into a graph"))
    return st;
  s->synchronize();
  return take_device_error(runtime().devices[s->device]);
}

orStatus orStreamGetDevice(orStream_t stream, int* device) {
  if (device == nullptr) return fail(orErrorInvalidValue, "device is NULL");
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  *device = s->device;
  return orSuccess;
}

orStatus orStreamGetPriority(orStream_t stream, int* priority) {
  if (priority == nullptr) return fail(orErrorInvalidValue, "priority is NULL");
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  *priority = s->priority;
  return orSuccess;
}

orStatus orDeviceGetDefaultStream(int device, orStream_t* stream) {
  if (stream == nullptr) return fail(orErrorInvalidValue, "stream is NULL");
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = get_device(device, &dev)) return st;
  *stream = dev->default_stream;
  return orSuccess;
}

orStatus orStreamWaitEvent(orStream_t stream, orEvent_t event, unsigned int flags) {
  if (flags != 0) return fail(orErrorInvalidValue, "unknown flags");
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  // No event is recorded inside a capture (see orEventRecord), so a captured wait would hold
  // today's generation and every replay would pass it at once: refused, as CUDA refuses a wait
  // on an event from outside the capture (cudaErrorStreamCaptureIsolation).
  if (orStatus st = refuse_while_capturing(
          *s,
          "a stream being captured into a graph cannot wait for an event recorded outside the capture "
          "(its replays would not wait for the event's later records); make the stream wait before "
          "the capture begins"))
    return st;
  Forward forward;
  const uint64_t generation = last_record(*e, &forward);     // that generation's record is queued
  if (e->completed.value() >= generation) return orSuccess;  // nothing to wait for
  bool queued = true;
  if (forward.generation != generation) {
    queued = enqueue_wait(*s, &e->completed, generation);
  } else {  // wait for what the record waits for, not for the record's stream to reach it (see Forward)
    for (size_t i = 0; i < forward.count && queued; ++i) {
      const WaitTarget& t = forward.targets[i];
      if (t.progress->value() < t.value) queued = enqueue_wait(*s, t.progress, t.value);
    }
  }
  return queued ? orSuccess : fail(orErrorInvalidResourceHandle, "the stream was destroyed");
}

orStatus orEventCreate(orEvent_t* event) { return orEventCreateWithFlags(event, orEventDefault); }

orStatus orEventCreateWithFlags(orEvent_t* event, unsigned int flags) {
  if (event == nullptr) return fail(orErrorInvalidValue, "event is NULL");
  if ((flags & ~static_cast<unsigned>(orEventDisableTiming)) != 0)
    return fail(orErrorInvalidValue, "unknown event flags");
  if (orStatus st = check_runtime()) return st;
  uintptr_t handle = 0;
  Event* e = runtime().events.acquire(&handle);
  if (e == nullptr) return fail(orErrorMemoryAllocation, "too many events");
  e->timing.store((flags & orEventDisableTiming) == 0);
  e->device.store(-1);
  // A recycled event starts "never recorded": its counters continue, equal.
  e->completed.advance_to(e->recorded.load());
  e->time_ns.store(0);
  e->stream.store(nullptr);
  runtime().counters.events_created.fetch_add(1, std::memory_order_relaxed);
  *event = reinterpret_cast<orEvent_t>(handle);
  return orSuccess;
}

orStatus orEventDestroy(orEvent_t event) {
  if (orStatus st = check_runtime()) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  // Returns at once, as cudaEventDestroy does: the handle dies now, and the slot is recycled
  // only once its queued records ran (see reusable(const Event&)), so work already queued that
  // records or waits on the event is unaffected.
  (void)e;
  if (!runtime().events.release(reinterpret_cast<uintptr_t>(event)))
    return fail(orErrorInvalidResourceHandle, "the event is unknown or was destroyed");
  runtime().counters.events_destroyed.fetch_add(1, std::memory_order_relaxed);
  return orSuccess;
}

orStatus orEventRecord(orEvent_t event, orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  // Refused inside a capture by the enqueue below (under the stream's lock, so no capture begun by
  // another thread slips in between a check and the enqueue).
  const char* const refusal = "cannot record an event while the stream is being captured into a graph";
  WorkItem item;
  item.fn = record_kernel;
  item.deleter = delete_record_args;
  item.name = "openreg::record_event";
  std::lock_guard<std::mutex> lock(e->record_mu);  // until queued: see Event::record_mu
  const int previous_device = e->device.exchange(s->device);
  Stream* const previous_stream = e->stream.load(std::memory_order_relaxed);
  const uint64_t generation = e->recorded.fetch_add(1) + 1;
  item.args = new RecordArgs{e, generation};
  // A timed event is not forwarded: its time is taken when its record runs, and a stream that
  // waited only for what the record follows could record a time of its own before it (a negative
  // elapsed time from an event to a later one). Its waiters wait for the record itself.
  Forward* forward = e->timing.load() ? nullptr : &e->forward;
  e->stream.store(s, std::memory_order_relaxed);
  // Never blocks. Refused while the stream is being captured: a record captured into its graph never
  // completed once the graph was destroyed, and the allocator's frees waiting for that event held
  // their memory for ever (hunt35b).
  const uint64_t seq = s->enqueue(item, forward, refusal);
  if (seq == Stream::kRefused || seq == Stream::kRefusedCapturing) {
    // the event stays as it was: a generation that never runs never completes
    e->recorded.store(generation - 1);
    e->stream.store(previous_stream, std::memory_order_relaxed);
    e->device.store(previous_device);
    if (seq == Stream::kRefusedCapturing) return fail(orErrorStreamCaptureUnsupported, refusal);
    return fail(orErrorInvalidResourceHandle, "the stream was destroyed");
  }
  if (seq != 0 && forward != nullptr) forward->generation = generation;
  return orSuccess;
}

orStatus orEventQuery(orEvent_t event) {
  if (orStatus st = check_runtime()) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  return event_done(*e) ? orSuccess : orErrorNotReady;
}

orStatus orEventGetDevice(orEvent_t event, int* device) {
  if (device == nullptr) return fail(orErrorInvalidValue, "device is NULL");
  if (orStatus st = check_runtime()) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  *device = e->device.load();
  return orSuccess;
}

orStatus orEventSynchronize(orEvent_t event) {
  if (orStatus st = check_runtime()) return st;
  Event* e = nullptr;
  if (orStatus st = resolve_event(event, &e)) return st;
  if (!event_done(*e))
    if (orStatus st = refuse_wait_from_kernel("orEventSynchronize", e->stream.load(std::memory_order_relaxed)))
      return st;
  Forward forward;
  const uint64_t generation = last_record(*e, &forward);
  if (forward.generation != generation) {
    e->completed.wait_for(generation);
  } else {  // as orEventQuery: what the record waits for, not the record itself
    for (size_t i = 0; i < forward.count; ++i) forward.targets[i].progress->wait_for(forward.targets[i].value);
  }
  return event_device_error(*e);
}

orStatus orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end) {
  if (ms == nullptr) return fail(orErrorInvalidValue, "ms is NULL");
  if (orStatus st = check_runtime()) return st;
  Event* a = nullptr;
  Event* b = nullptr;
  if (orStatus st = resolve_event(start, &a)) return st;
  if (orStatus st = resolve_event(end, &b)) return st;
  if (!a->timing.load() || !b->timing.load())
    return fail(orErrorInvalidResourceHandle, "elapsed time needs both events created with timing enabled");
  if (a->device.load() < 0 || b->device.load() < 0)
    return fail(orErrorInvalidResourceHandle, "both events must be recorded before elapsed time is measured");
  if (a->device.load() != b->device.load())
    return fail(orErrorInvalidResourceHandle,
                "the events were recorded on two devices (" + std::to_string(a->device.load()) + " and " +
                    std::to_string(b->device.load()) + "): only events of one device can be timed against each other");
  if (!event_done(*a) || !event_done(*b))
    return fail(orErrorNotReady, "an event has not completed yet; synchronize it first");
  // Done through forwarding (see event_done), a record may not have run yet: its time is due at
  // once, as nothing before it on its stream is left.
  a->completed.wait_for(a->recorded.load());
  b->completed.wait_for(b->recorded.load());
  *ms = static_cast<float>(static_cast<double>(static_cast<int64_t>(b->time_ns.load() - a->time_ns.load())) / 1e6);
  return orSuccess;
}

orStatus orLaunchKernel(orStream_t stream, const char* name, orKernelFn fn, void* args, orKernelArgsDeleter deleter) {
  // Captured first, for a launch that fails too: what the launching thread gathered for this
  // launch (torch_openreg's count of its tensors' bytes) must not carry over to its next one.
  const LaunchContextHooks* hooks = Hooks<LaunchContextHooks>::get();
  const uint64_t context = hooks != nullptr ? hooks->capture() : 0;
  orStatus st = check_runtime();
  Stream* s = nullptr;
  if (st == orSuccess && fn == nullptr) st = fail(orErrorInvalidValue, "kernel function is NULL");
  if (st == orSuccess) st = resolve_stream(stream, &s);
  if (st != orSuccess) {
    if (deleter) deleter(args);
    return st;
  }
  WorkItem item;
  item.fn = fn;
  item.args = args;
  item.deleter = deleter;
  item.name = name;
  item.context = context;
  const uint64_t seq = s->enqueue(item);
  if (seq == Stream::kRefused) return fail(orErrorInvalidResourceHandle, "the stream was destroyed");
  runtime().counters.kernels.fetch_add(1, std::memory_order_relaxed);
  return finish_launch(*s, seq);
}

orStatus orKernelPointer(const void* dev_ptr, void** kernel_ptr) {
  if (kernel_ptr == nullptr) return fail(orErrorInvalidValue, "kernel_ptr is NULL");
  if (!t_in_kernel) return fail(orErrorNotPermitted, "orKernelPointer is device-side: call it from a running kernel");
  if (Device* dev = device_of(dev_ptr)) {  // one subtraction, one addition: the hot case
    *kernel_ptr = dev->arena.kernel_view + (static_cast<const char*>(dev_ptr) - dev->arena.device_view);
    return orSuccess;
  }
  ImportedRange imp;
  if (find_import(dev_ptr, &imp)) {
    *kernel_ptr = imp.kernel_base + (static_cast<const char*>(dev_ptr) - imp.base);
    return orSuccess;
  }
  return fail(orErrorInvalidDevicePointer, "pointer is not openreg device memory");
}

orStatus orKernelFail(const char* message) {
  if (!t_in_kernel) return fail(orErrorNotPermitted, "orKernelFail is device-side: call it from a running kernel");
  t_kernel_error = message ? message : "";
  return orErrorLaunchFailure;
}

int orInKernel(void) { return t_in_kernel ? 1 : 0; }

orStatus orSetBlockingWaitHooks(orBlockingWaitBegin begin, orBlockingWaitEnd end) {
  return openreg::rt::Hooks<openreg::rt::WaitHooks>::set(begin, end, "orSetBlockingWaitHooks");
}

orStatus orSetLaunchContextHooks(orLaunchContextCapture capture, orLaunchContextApply apply) {
  return openreg::rt::Hooks<openreg::rt::LaunchContextHooks>::set(capture, apply, "orSetLaunchContextHooks");
}

orStatus orStreamBeginCapture(orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  if (s->is_default)  // as CUDA's legacy default stream: other threads' work would be captured too
    return fail(orErrorStreamCaptureUnsupported,
                "a graph cannot be captured on a device's default stream; capture on a stream of your own "
                "(a captured graph may be replayed on the default stream)");
  // It waits for the stream (below): from a kernel of that stream it would wait for itself.
  if (orStatus st = refuse_wait_from_kernel("orStreamBeginCapture", s)) return st;
  uint64_t queued = 0;
  Graph* capture = nullptr;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->dying) return fail(orErrorInvalidResourceHandle, "the stream is being destroyed");
    if (s->capture != nullptr) return fail(orErrorStreamCaptureUnsupported, "the stream is already capturing");
    capture = s->capture = new Graph();
    s->capture->device = s->device;
    queued = s->submitted_locked;
  }
  // The work queued before the capture runs first (see runtime.h). Waited for once the capture is
  // set, so that another thread's capture_begin on the stream meanwhile is refused as above; a wait
  // before it raced that capture and was refused, voiding the other thread's capture (review35).
  s->completed.wait_for(queued);
  // A kernel of that work that failed is reported here, as by a synchronisation, and no capture
  // begins: the error surfaced after a later replay, as if the replay had failed (review35b).
  if (orStatus st = take_device_error(runtime().devices[s->device])) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->capture == capture)
        s->capture = nullptr;
      else
        capture = nullptr;  // (ended by another thread meanwhile: it is that thread's now)
    }
    if (capture != nullptr) release_graph(capture);
    return st;
  }
  return orSuccess;
}

orStatus orStreamEndCapture(orStream_t stream, orGraph_t* graph) {
  if (graph == nullptr) return fail(orErrorInvalidValue, "graph is NULL");
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  std::unique_lock<std::mutex> lock(s->mu);
  if (s->capture == nullptr) return fail(orErrorInvalidValue, "the stream is not capturing");
  Graph* g = s->capture;
  s->capture = nullptr;
  if (!g->invalidated_by.empty()) {
    const std::string why = "the capture was invalidated by a call it refused (" + g->invalidated_by +
                            "); its graph is discarded: capture again without that call";
    lock.unlock();     // the items' deleters may take other locks (an allocator's)
    release_graph(g);  // nothing ran or will run them: no wait
    *graph = nullptr;
    return fail(orErrorStreamCaptureUnsupported, why);
  }
  g->handle = next_graph_handle();
  {
    std::lock_guard<std::mutex> registry(graphs_mu());
    live_graphs().emplace(g->handle, g);
  }
  *graph = reinterpret_cast<orGraph_t>(g->handle);
  return orSuccess;
}

orStatus orStreamIsCapturing(orStream_t stream, int* capturing) {
  if (capturing == nullptr) return fail(orErrorInvalidValue, "capturing is NULL");
  if (orStatus st = check_runtime()) return st;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  *capturing = s->capturing() ? 1 : 0;
  return orSuccess;
}

orStatus orGraphLaunch(orGraph_t graph, orStream_t stream) {
  if (orStatus st = check_runtime()) return st;
  GraphUse use;
  if (orStatus st = resolve_graph(graph, &use)) return st;
  Graph* g = use.g;
  Stream* s = nullptr;
  if (orStatus st = resolve_stream(stream, &s)) return st;
  if (s->device != g->device)
    return fail(orErrorInvalidDevice, "graph captured on device " + std::to_string(g->device) +
                                          " launched on a stream of device " + std::to_string(s->device));
  {
    // Replayed into another graph's capture: that graph will replay these items, so it keeps
    // this one (and the arguments it owns) until it goes itself.
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->capture != nullptr) {
      g->refs.fetch_add(1, std::memory_order_relaxed);
      s->capture->children.push_back(g);
    }
  }
  uint64_t seq = 0;
  for (const WorkItem& captured : g->items) {
    WorkItem item = captured;
    item.deleter = nullptr;  // the graph keeps owning the arguments
    seq = s->enqueue(item);
    if (seq == Stream::kRefused) return fail(orErrorInvalidResourceHandle, "the stream was destroyed");
  }
  runtime().counters.graphs.fetch_add(1, std::memory_order_relaxed);
  runtime().counters.graph_items.fetch_add(g->items.size(), std::memory_order_relaxed);
  return finish_launch(*s, seq);
}

orStatus orGraphGetNodeCount(orGraph_t graph, size_t* count) {
  if (count == nullptr) return fail(orErrorInvalidValue, "count is NULL");
  GraphUse use;
  if (orStatus st = resolve_graph(graph, &use)) return st;
  *count = use.g->items.size();
  return orSuccess;
}

orStatus orGraphGetNodeName(orGraph_t graph, size_t index, const char** name) {
  if (name == nullptr) return fail(orErrorInvalidValue, "name is NULL");
  GraphUse use;
  if (orStatus st = resolve_graph(graph, &use)) return st;
  const Graph* g = use.g;
  if (index >= g->items.size()) return fail(orErrorInvalidValue, "node index out of range");
  *name = g->items[index].name ? g->items[index].name : "<unnamed>";
  return orSuccess;
}

orStatus orGraphDestroy(orGraph_t graph) {
  if (orStatus st = check_runtime()) return st;
  Graph* g = nullptr;
  {
    std::lock_guard<std::mutex> registry(graphs_mu());
    auto it = live_graphs().find(reinterpret_cast<uintptr_t>(graph));
    if (it == live_graphs().end()) return fail(orErrorInvalidResourceHandle, "the graph is unknown or was destroyed");
    g = it->second;
    if (orStatus st = refuse_wait_from_kernel("orGraphDestroy", nullptr, g->device)) return st;
    live_graphs().erase(it);  // one destroy wins; no new use begins
  }
  // A launch of the graph on another thread may still be queuing its items, reading g->items.
  while (g->users.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  // Launches of the graph may still be queued: they read its arguments. A kernel's failure stays
  // for the user's next synchronising call.
  wait_for_streams(runtime().devices[g->device]);
  release_graph(g);
  return orSuccess;
}

}  // extern "C"
