// Internal state of the emulated runtime, shared by the files in src/.
//
// Handles. Streams and events are objects in a HandleTable: they are never
// deallocated, only recycled, and a handle carries the slot index plus a
// generation. A destroyed or made-up handle therefore gives
// orErrorInvalidResourceHandle instead of touching freed memory.
//
// Waiting. Progress is a monotonically increasing 64-bit counter (a
// Progress): a stream counts completed work items, an event counts
// completed records. Waiters spin for a while (OPENREG_WAIT_SPIN_US: a kernel
// that completes within it is seen at once, with no wake-up), as long as the
// kernels running leave the waiter a CPU, and then sleep on a condition variable.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "openreg/runtime.h"
#include "platform.h"

namespace openreg::rt {

// ---- errors ----
// Records `message` as the calling thread's last error and returns `status`.
orStatus fail(orStatus status, const std::string& message);

// ---- configuration ----
uint64_t spin_ns();       // how long an idle worker spins before sleeping (OPENREG_SPIN_US)
uint64_t wait_spin_ns();  // how long a waiter spins before sleeping (OPENREG_WAIT_SPIN_US)

// ---- waiting on a counter ----
class Progress {
 public:
  uint64_t value() const { return value_.load(std::memory_order_acquire); }
  void advance_to(uint64_t v);
  void wait_for(uint64_t v);  // until value() >= v

 private:
  // Spins until value() >= v (true) or the deadline passes; with while_cpus_free, also gives up
  // once running kernels and the caller would not fit on the CPUs.
  bool spin_for(uint64_t v, uint64_t deadline_ns, bool while_cpus_free) const;

  std::atomic<uint64_t> value_{0};
  // The lowest value a sleeping waiter waits for (none: UINT64_MAX). advance_to wakes sleepers only
  // when it reaches it, so a host waiting for the end of a long queue is woken once, not after
  // every item (each wake-up took a core from the kernels still running).
  std::atomic<uint64_t> wake_at_{UINT64_MAX};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> targets_;  // under mu_: the value each sleeper waits for
};

// ---- handle tables ----
// Whether a released object may be recycled yet (see HandleTable::release); overloaded per type.
template <typename T>
bool reusable(const T&) {
  return true;
}

template <typename T>
class HandleTable {
 public:
  static constexpr uint32_t kChunk = 256;
  static constexpr uint32_t kChunks = 4096;

  // Returns a fresh or recycled object and its handle value.
  T* acquire(uintptr_t* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) sweep_released();
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = size_;
      if (index / kChunk >= kChunks) return nullptr;
      if (index % kChunk == 0) chunks_[index / kChunk].store(new Slot[kChunk], std::memory_order_release);
      ++size_;
    }
    Slot& slot = slot_at(index);
    uint32_t gen = slot.generation.load(std::memory_order_relaxed) + 1;
    slot.generation.store(gen, std::memory_order_release);
    *handle = (static_cast<uintptr_t>(gen) << 32) | (index + 1);
    return &slot.object;
  }

  // The live object behind `handle`, or nullptr.
  T* lookup(uintptr_t handle) const {
    uint32_t index = static_cast<uint32_t>(handle & 0xffffffffu);
    uint32_t gen = static_cast<uint32_t>(handle >> 32);
    if (index == 0 || (gen & 1) == 0) return nullptr;  // odd generation = live
    --index;
    if (index / kChunk >= kChunks) return nullptr;
    Slot* chunk = chunks_[index / kChunk].load(std::memory_order_acquire);
    if (chunk == nullptr) return nullptr;
    Slot& slot = chunk[index % kChunk];
    if (slot.generation.load(std::memory_order_acquire) != gen) return nullptr;
    return &slot.object;
  }

  // Marks the handle dead at once: lookups of it fail from now on. The object is recycled by a
  // later acquire() once reusable(object) holds (a destroyed event still has records queued that
  // write to it, and waits that read it): release never waits for the device.
  bool release(uintptr_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    T* obj = lookup(handle);
    if (obj == nullptr) return false;
    uint32_t index = static_cast<uint32_t>(handle & 0xffffffffu) - 1;
    slot_at(index).generation.fetch_add(1, std::memory_order_acq_rel);
    released_.push_back(index);
    return true;
  }

 private:
  // Under mu_: moves the released objects that may be reused to the free list. Run only when the
  // free list is empty, so its cost is shared by the acquires it makes room for.
  void sweep_released() {
    size_t kept = 0;
    for (uint32_t index : released_) {
      if (reusable(slot_at(index).object))
        free_.push_back(index);
      else
        released_[kept++] = index;
    }
    released_.resize(kept);
  }

  struct Slot {
    std::atomic<uint32_t> generation{0};
    T object;
  };
  Slot& slot_at(uint32_t index) { return chunks_[index / kChunk].load()[index % kChunk]; }

  std::mutex mu_;
  std::array<std::atomic<Slot*>, kChunks> chunks_{};
  uint32_t size_ = 0;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> released_;  // dead handles whose objects may still be in use
};

// ---- streams ----
// What a stream waits for before an item runs: a counter reaching a value (an event's
// generation, or another stream's item).
struct WaitTarget {
  Progress* progress = nullptr;
  uint64_t value = 0;
};

// What an event's record waits for on its stream: the stream's last kernel (or copy, ...) and the
// event waits queued after it. Another stream that waits for the event waits for these instead
// (orStreamWaitEvent), so a chain of streams that meet on an otherwise idle stream (a comm
// stream's end, waited for on the current stream, waited for by the next comm stream) skips that
// stream's worker: one thread less to wake per hop.
struct Forward {
  static constexpr size_t kMax = 4;  // more waits than this after the last kernel: not forwarded
  std::array<WaitTarget, kMax + 1> targets{};
  size_t count = 0;
  uint64_t generation = 0;  // the event's record these are for (0: none)
};

struct WorkItem {
  orKernelFn fn = nullptr;
  void* args = nullptr;
  orKernelArgsDeleter deleter = nullptr;
  const char* name = nullptr;
  uint64_t seq = 0;
  bool traced = false;       // tracing was on when it was enqueued
  uint64_t correlation = 0;  // the enqueuing thread's correlation id then
  uint64_t host_thread = 0;  // and its OS thread id,
  uint64_t enqueue_ns = 0;   // and when it started enqueuing the item
  uint64_t context = 0;      // orSetLaunchContextHooks' capture at launch (kernels only)
};

struct Graph {
  int device = 0;
  uintptr_t handle = 0;  // its orGraph_t: never reused, so a destroyed graph's handle names no other
  // Calls using the graph through its handle (orGraphLaunch, ...): orGraphDestroy waits for them.
  std::atomic<int> users{0};
  std::vector<WorkItem> items;  // owned: deleters run when the last reference goes
  // Graphs replayed while this one was captured: their items are in `items` without deleters
  // (the child keeps owning its arguments), so each child stays until this graph goes.
  std::vector<Graph*> children;
  std::atomic<int> refs{1};  // the handle's, plus one per graph that captured a replay of this one
  // What a call refused during the capture said (under the capturing stream's mu): the capture is
  // invalidated, as CUDA invalidates one, and orStreamEndCapture discards it.
  std::string invalidated_by;
};

// Drops a reference; the last one runs the items' deleters (the device must be idle for them).
void release_graph(Graph* g);

struct Stream {
  uintptr_t handle = 0;  // the orStream_t of this use of the slot
  int device = 0;
  int priority = 0;
  bool is_default = false;

  // Launching threads' side, under mu. The worker takes mu only to go to sleep.
  alignas(64) std::mutex mu;
  std::condition_variable work_cv;
  uint64_t submitted_locked = 0;
  uint64_t room_until = 0;  // items up to this sequence number fit in the ring (a cached bound)
  bool sleeping = false;    // the worker waits on work_cv
  bool has_worker = false;
  bool dying = false;        // orStreamDestroy is draining it: launches are refused (see enqueue)
  Graph* capture = nullptr;  // non-null while the stream records into a graph
  // Since the last item that is neither an event record nor a wait (its sequence number): the
  // waits queued, for Forward.
  uint64_t last_work_seq = 0;
  std::array<WaitTarget, Forward::kMax> tail_waits{};
  size_t tail_wait_count = 0;
  // The queue: item `seq` sits in ring[seq % ring.size()] until the worker copies it out;
  // that slot is free again once item seq - ring.size() has completed. Items that find
  // their slot still taken wait in `overflow` (under mu) instead.
  struct alignas(64) Slot {
    WorkItem item;
  };
  std::vector<Slot> ring;
  std::deque<WorkItem> overflow;

  alignas(64) std::atomic<uint64_t> submitted{0};  // published items: written by launching threads
  alignas(64) Progress completed;                  // written by the worker

  // Returns the item's sequence number; while capturing, records the item instead and returns 0.
  // `forward` (for an event record) receives what the item waits for on this stream. A stream being
  // destroyed refuses it: its deleter runs at once and kRefused is returned.
  // `refusal`: an item that must not be captured (an event's record): while the stream captures it is
  // refused with kRefusedCapturing instead (its deleter runs), and the capture is voided with that
  // message. Checked under the lock that orders captures: a check before enqueue left a window in
  // which another thread's capture_begin recorded the item into its graph.
  static constexpr uint64_t kRefused = UINT64_MAX;
  static constexpr uint64_t kRefusedCapturing = UINT64_MAX - 1;
  uint64_t enqueue(const WorkItem& item, Forward* forward = nullptr, const char* refusal = nullptr);
  bool capturing() {
    std::lock_guard<std::mutex> lock(mu);
    return capture != nullptr;
  }
  void synchronize() { completed.wait_for(submitted.load(std::memory_order_acquire)); }
  bool idle() const { return completed.value() >= submitted.load(std::memory_order_acquire); }
  // Runs f on the calling thread if nothing is queued or running on the stream, and returns true;
  // the lock keeps launches out until f returns, so f takes the place of an item in stream order.
  template <typename F>
  bool run_if_idle(F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    // (A dying stream: the caller then enqueues, which refuses, as any launch on it.)
    if (dying || capture != nullptr || completed.value() < submitted_locked) return false;
    f();
    return true;
  }

  // Sets up a fresh or recycled slot (orStreamCreate*, a device's default stream). A recycled slot's
  // destroy has ended: its `dying` is cleared here, or the stream would refuse every launch.
  void init(uintptr_t h, int dev, int prio, bool default_stream) {
    handle = h;
    device = dev;
    priority = prio;
    is_default = default_stream;
    std::lock_guard<std::mutex> lock(mu);
    dying = false;
  }

 private:
  void worker_loop();
};

// ---- events ----
struct Event {
  // Held by orEventRecord from taking a generation until its record is queued, and by
  // orStreamWaitEvent to read the generation: a wait never lands before its record.
  std::mutex record_mu;
  std::atomic<bool> timing{true};
  std::atomic<int> device{-1};
  std::atomic<uint64_t> recorded{0};     // generation of the last orEventRecord
  Progress completed;                    // generation that last ran
  std::atomic<uint64_t> time_ns{0};      // when the last record ran
  Forward forward;                       // under record_mu: what the last record waits for
  std::atomic<Stream*> stream{nullptr};  // where the last record was queued
  uint64_t time_generation = 0;          // under record_mu: the record whose time time_ns is
};

// A destroyed event's slot is recycled only after its queued records ran: orEventCreate marks a
// recycled slot complete, which would release waiters on a record that has not run yet.
inline bool reusable(const Event& e) { return e.completed.value() >= e.recorded.load(); }

// ---- devices ----
struct Device {
  int index = 0;
  std::once_flag init_once;
  orStatus init_status = orSuccess;
  std::string init_error;
  std::atomic<bool> ready{false};

  platform::DualMapping arena;

  // Sub-allocator of the arena (first fit on an ordered free list).
  std::mutex mem_mu;
  std::map<size_t, size_t> free_blocks;  // offset -> size
  std::map<size_t, size_t> live_blocks;  // offset -> size
  size_t allocated = 0;

  std::mutex streams_mu;
  std::vector<Stream*> streams;  // every live stream of the device
  orStream_t default_stream = nullptr;

  // The first kernel failure not yet reported by a synchronising call.
  std::mutex error_mu;
  std::atomic<bool> has_error{false};
  std::string error;
};

struct Counters {
  std::atomic<uint64_t> kernels{0}, h2d{0}, d2h{0}, d2d{0}, bytes_h2d{0}, bytes_d2h{0}, bytes_d2d{0}, mallocs{0},
      frees{0}, wait_wakeups{0}, graphs{0}, graph_items{0}, copies_on_caller{0}, events_created{0}, events_destroyed{0},
      streams_created{0}, streams_destroyed{0};
};

// Device memory of another process, mapped here by orIpcOpenMemHandle.
struct Import {
  platform::DualMapping mapping;  // page-aligned cover of the allocation
  char* base = nullptr;           // the allocation's start in the device view
  size_t size = 0;
  int device = 0;
  int refs = 0;
  std::string key;          // exporter and allocation: the same handle opens the same import
  orIpcMemHandle_t handle;  // as opened: exporting the memory again hands this on
};

struct Runtime {
  int device_count = 0;
  size_t capacity = 0;
  uint64_t spin_ns = 0;          // how long an idle worker spins before it sleeps (OPENREG_SPIN_US)
  uint64_t wait_spin_ns = 0;     // how long a waiting thread spins before it sleeps (OPENREG_WAIT_SPIN_US)
  bool launch_blocking = false;  // each launch returns once its work is done (OPENREG_LAUNCH_BLOCKING)
  std::string config_error;
  std::unique_ptr<Device[]> devices;
  HandleTable<Stream> streams;
  HandleTable<Event> events;
  Counters counters;

  std::mutex host_mu;
  std::map<uintptr_t, size_t> host_blocks;  // pinned base -> size

  std::mutex imports_mu;
  std::map<uintptr_t, Import> imports;  // device-view start of the mapping -> import
};

// The process-wide runtime; never destroyed so worker threads may outlive main().
Runtime& runtime();
extern std::atomic<bool> g_forked;

// Validates the configuration (once) and the fork state. Every API entry calls it, and the runtime
// counts as used from then on (a forked child's is refused: see device.cpp::mark_forked).
orStatus check_runtime();
// The same checks for a call that only reads the configuration (orGetDeviceCount).
orStatus check_config();
// Initialises device `index` if needed.
orStatus get_device(int index, Device** out);
// The current device of this host thread, initialised.
orStatus current_device(Device** out);
int& current_device_index();

// Resolves a stream handle (NULL: the current device's default stream).
orStatus resolve_stream(orStream_t handle, Stream** out);
// While `s` captures: invalidates its capture (see Graph::invalidated_by) and returns the refusal,
// orErrorStreamCaptureUnsupported with `message`; otherwise orSuccess.
orStatus refuse_while_capturing(Stream& s, const std::string& message);
// A call from a kernel that would wait for the stream running that kernel (`target`, or with
// target null every stream of `device`, or of every device if device < 0) would wait for itself:
// refused with orErrorNotPermitted, as CUDA refuses runtime calls from a host function on a stream.
orStatus refuse_wait_from_kernel(const char* call, const Stream* target, int device = -1);
orStatus resolve_event(orEvent_t handle, Event** out);

// Records a kernel failure on its device.
void record_kernel_error(int device, const char* kernel, const char* message);
// Returns and clears the device's pending kernel error (orSuccess if none).
orStatus take_device_error(Device& dev);
orStatus peek_device_error(Device& dev);  // as take_device_error, leaving the failure to be reported
// What a launch returns: under OPENREG_LAUNCH_BLOCKING, once the work queued as `seq` on `s` is done,
// with the device's failure (0: recorded into a graph; from a kernel: it is not waited for).
orStatus finish_launch(Stream& s, uint64_t seq);
orStatus synchronize_device(Device& dev);
// Waits until every stream of the device (or of every initialised device) has run the work
// queued so far. Unlike synchronize_device, leaves pending kernel errors for the user.
void wait_for_streams(Device& dev);
void wait_for_all_devices();

// ---- activity tracing (tracing.cpp) ----
extern std::atomic<bool> g_tracing;
// Host side, at enqueue: marks the item for tracing (one relaxed load when off).
inline void trace_prepare(WorkItem& item);
// Device side: records a traced item that ran on `stream` from `start_ns` to `end_ns`.
void trace_record(const Stream& stream, const WorkItem& item, uint64_t start_ns, uint64_t end_ns);
uint64_t current_correlation();

inline void trace_prepare(WorkItem& item) {
  if (!g_tracing.load(std::memory_order_relaxed)) return;
  item.traced = true;
  item.correlation = current_correlation();
  item.host_thread = platform::thread_id();
  item.enqueue_ns = platform::now_ns();
}

// ---- fault injection (faults.cpp; syntax in include/openreg/faults.h) ----
// Set while faults are armed: each hook below is called only then (one relaxed load when off).
extern std::atomic<bool> g_faults_armed;
// Arms the faults in OPENREG_FAULTS (read when the runtime is created); a malformed value sets `error`.
void faults_from_env(int device_count, std::string* error);
// orMalloc on `device`: an injected failure (fail() called), or orSuccess.
orStatus fault_on_malloc(int device);
// A copy issued on `stream`: the failure message its work item reports instead of copying, or nullptr.
const char* fault_on_copy(Stream& stream);
// On the worker, before `item` runs on `stream`: waits for slow clauses; true (and `message`) when
// the item is to fail instead of running.
bool fault_on_run(const Stream& stream, const WorkItem& item, std::string* message);

// Device whose arena contains `ptr`, or nullptr.
Device* device_of(const void* ptr);

// Imported (IPC) device memory containing `ptr`: fills the allocation's device
// index, start, size and kernel-view start; false if `ptr` is not imported.
struct ImportedRange {
  int device = -1;
  char* base = nullptr;
  size_t size = 0;
  char* kernel_base = nullptr;
};
bool find_import(const void* ptr, ImportedRange* out);

}  // namespace openreg::rt
