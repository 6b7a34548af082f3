// Device graphs (torch.accelerator.Graph): capture the work launched on a
// stream once, replay it many times without the host dispatching each op.
//
// The runtime records the work items launched on the capturing stream
// (orStreamBeginCapture) and enqueues them again on replay (orGraphLaunch).
// Kernels of the generic path capture tensor descriptors, not tensors, so a
// replay reads and writes the same device memory as the capture did; the
// caching allocator keeps every block allocated during the capture away from
// other users until the graph is reset. As on CUDA, run the work once before
// capturing it: the first call of an operator signature synchronises (meta
// verification), and nothing may wait for a capturing stream.
#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "OpenRegCachingAllocator.h"
#include "OpenRegException.h"
#include "OpenRegFunctions.h"
#include "OpenRegGenerator.h"
#include "OpenRegStream.h"

namespace c10::openreg {

std::atomic<uint64_t> g_next_pool{1};

struct OpenRegGraphImpl;

// Graphs whose capture is open, for abandon_open_captures (at exit). The mutex also orders a
// graph's own capture_begin / capture_end / reset against that.
std::mutex& open_captures_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_set<OpenRegGraphImpl*>& open_captures() {
  static auto* graphs = new std::unordered_set<OpenRegGraphImpl*>();
  return *graphs;
}

struct OpenRegGraphImpl final : public at::GraphImplInterface {
  explicit OpenRegGraphImpl(const at::GraphImplArgs& args = {}) : keep_graph_(args.keep_graph) {}
  ~OpenRegGraphImpl() override {
    try {
      reset();
    } catch (...) {
    }
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode) override {
    {
      std::lock_guard<std::mutex> lock(open_captures_mu());
      TORCH_CHECK(graph_ == nullptr && !capturing_,
                  "This openreg graph has already been captured; call reset() before capturing again.");
      captured_ = false;
      device_ = current_device();
      stream_ = getCurrentOpenRegStream(device_).handle();
      pool_ = pool.first != 0 ? static_cast<uint64_t>(pool.first) : g_next_pool.fetch_add(1);
      // Refuses a stream another capture holds, before anything else changes.
      allocator::beginGraphCapture(device_, stream_, pool_);
      // Capturing from here on, for this graph's other callers and for graphs replayed into it
      // (replay finds it among the open captures) while the runtime waits below.
      capturing_ = true;
      open_captures().insert(this);
    }
    // Returns once the stream's queued work has run (runtime.h): the capture may take blocks that work
    // freed and still read or wrote, and a replay on another stream, or inside another graph, raced it
    // until 2026-12-07 (hunt35b). As torch.accelerator.Graph's `with` form synchronises the device.
    // No lock held while it waits (queued kernels may need the GIL of a thread that replays).
    const orStatus st = orStreamBeginCapture(stream_);
    std::lock_guard<std::mutex> lock(open_captures_mu());
    if (st == orSuccess && !capturing_) {  // reset() (another thread's, or exit's) abandoned it meanwhile
      orGraph_t abandoned = nullptr;
      if (orStreamEndCapture(stream_, &abandoned) == orSuccess && abandoned != nullptr) orGraphDestroy(abandoned);
      TORCH_CHECK(false, "capture_begin(): the capture was abandoned (reset()) while it began");
    }
    if (st != orSuccess) {
      capturing_ = false;
      open_captures().erase(this);
      allocator::endGraphCapture(device_, stream_);
      release_pools();
      pool_ = 0;  // no pool to share (pool())
    }
    OPENREG_CHECK(st);
    begin_random_capture(stream_);
  }

  void capture_end() override {
    std::lock_guard<std::mutex> lock(open_captures_mu());
    TORCH_CHECK(capturing_, "capture_end() called without capture_begin()");
    TORCH_CHECK(getCurrentOpenRegStream(device_).handle() == stream_,
                "capture_end() must be called on the stream capture_begin() was called on");
    std::string refusal;
    if (end_capture_locked(&graph_, &refusal) != orSuccess) {  // a refused call invalidated it: no graph
      graph_ = nullptr;
      random_ops_.clear();
      release_pools();  // its memory goes back
      TORCH_CHECK(false, refusal);
    }
    captured_ = true;
  }

  void instantiate() override {
    TORCH_CHECK(graph_ != nullptr, "instantiate() needs a captured graph: call capture_begin() and capture_end()");
  }

  void replay() override {
    TORCH_CHECK(graph_ != nullptr, "replay() needs a captured graph: call capture_begin() and capture_end()");
    const orStream_t stream = getCurrentOpenRegStream(device_).handle();
    // Its random ops are re-seeded by the host before each replay: captured into another graph, the
    // seeds would be that graph's constants (the same numbers at every replay of it). CUDA refuses too.
    int capturing = 0;
    OPENREG_CHECK(orStreamIsCapturing(stream, &capturing));
    TORCH_CHECK(capturing == 0 || random_ops_.empty(),
                "Cannot prepare for replay during capturing stage: this graph has random operators, whose "
                "numbers are chosen at each replay, and the current stream is being captured into another graph");
    // Replays are ordered, as CUDA orders the launches of one graph exec: a replay on another
    // stream waits for the previous one, before its re-seeding too (which writes the seeds the
    // previous replay's random ops read). Unordered, two replays on two streams ran at once on the
    // same memory: read-modify-writes lost updates, and random ops drew the next replay's numbers.
    // A replay captured into another graph is ordered by that graph's replays.
    std::lock_guard<std::mutex> lock(replay_mu_);
    if (capturing == 0 && last_replay_stream_ != nullptr && last_replay_stream_ != stream)
      OPENREG_CHECK(orStreamWaitEvent(stream, last_replay_, 0));
    reseed_for_replay(stream, random_ops_);  // fresh numbers for the captured random ops
    // Captured into another graph, whose replays run this one's work on this one's pool: that graph
    // holds the pool too, until it is reset. Until 2026-12-07 resetting this graph gave the pool's
    // blocks to new tensors, which the other graph's replays overwrote (hunt35b).
    if (capturing != 0) {
      std::lock_guard<std::mutex> captures(open_captures_mu());
      for (OpenRegGraphImpl* outer : open_captures())
        if (outer->stream_ == stream) {  // this one's pool, and those of the graphs it replays in turn
          for (const uint64_t pool : held_pools_) {
            allocator::retainGraph(device_, pool);
            outer->held_pools_.push_back(pool);
          }
          allocator::retainGraph(device_, pool_);
          outer->held_pools_.push_back(pool_);
        }
    }
    OPENREG_CHECK(orGraphLaunch(graph_, stream));
    if (capturing == 0) {
      if (last_replay_ == nullptr) OPENREG_CHECK(orEventCreateWithFlags(&last_replay_, orEventDisableTiming));
      OPENREG_CHECK(orEventRecord(last_replay_, stream));
      last_replay_stream_ = stream;
    }
  }

  void reset() override {
    {
      std::lock_guard<std::mutex> lock(open_captures_mu());
      abandon_capture_locked();
    }
    if (graph_ != nullptr) {
      OPENREG_CHECK(orGraphDestroy(graph_));
      graph_ = nullptr;
      if (last_replay_ != nullptr) orEventDestroy(last_replay_);
      last_replay_ = nullptr;
      last_replay_stream_ = nullptr;
      random_ops_.clear();
      release_pools();
      captured_ = false;  // pool() is refused again, as CUDA's after reset()
    }
  }

  // Its pool, and the pools of the graphs it replayed inside its capture.
  void release_pools() {
    allocator::releaseGraph(device_, pool_);
    for (uint64_t held : std::exchange(held_pools_, {})) allocator::releaseGraph(device_, held);
  }

  // An abandoned capture (reset() before capture_end(), or a program that exits with its capture
  // open): the stream stops capturing, and the blocks go back as a finished graph's do.
  void abandon_capture_locked() {
    if (!capturing_) return;
    orGraph_t abandoned = nullptr;
    end_capture_locked(&abandoned, nullptr);
    if (abandoned) orGraphDestroy(abandoned);
    random_ops_.clear();
    release_pools();
  }

  // Ends the open capture: the stream stops capturing (first: the allocator then records the events
  // that frees during the capture put off, which a capturing stream cannot record), and the
  // allocator stops giving blocks from this graph's pool. The stream's refusal message, if any, in
  // *refusal (read before anything else can overwrite the thread's last error).
  orStatus end_capture_locked(orGraph_t* graph, std::string* refusal) {
    capturing_ = false;
    open_captures().erase(this);
    const orStatus st = orStreamEndCapture(stream_, graph);
    if (st != orSuccess && refusal != nullptr) *refusal = last_error_message();
    random_ops_ = end_random_capture(stream_);
    allocator::endGraphCapture(device_, stream_);
    return st;
  }

  // As CUDA's: a pool is known once a capture has ended, until reset() (it was {0, 0}, which
  // capture_begin reads as "a pool of its own": a graph meant to share another's silently did not;
  // hunt35b).
  at::MempoolId_t pool() const override {
    TORCH_CHECK(captured_,
                "Called pool() without a preceding successful capture: capture a graph before sharing its pool");
    return {static_cast<at::CaptureId_t>(pool_), 0};
  }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "debug_dump() needs enable_debug_mode() before the capture");
    TORCH_CHECK(graph_ != nullptr, "debug_dump() needs a captured graph");
    size_t n = 0;
    OPENREG_CHECK(orGraphGetNodeCount(graph_, &n));
    std::ofstream out(path);
    TORCH_CHECK(out.good(), "cannot open ", path, " for writing");
    out << "openreg graph on device " << static_cast<int>(device_) << ": " << n << " work items\n";
    for (size_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      OPENREG_CHECK(orGraphGetNodeName(graph_, i, &name));
      out << i << " " << name << "\n";
    }
  }

 private:
  bool keep_graph_;
  bool capturing_ = false;
  bool debug_ = false;
  c10::DeviceIndex device_ = 0;
  orStream_t stream_ = nullptr;
  orGraph_t graph_ = nullptr;
  uint64_t pool_ = 0;
  bool captured_ = false;                     // a capture ended with a graph, not reset since (pool() answers)
  std::vector<uint64_t> held_pools_;          // of graphs replayed inside its capture (see replay)
  std::vector<CapturedRandomOp> random_ops_;  // re-seeded before each replay
  std::mutex replay_mu_;                      // replays from several threads are ordered too
  orEvent_t last_replay_ = nullptr;           // recorded after the last replay (see replay)
  orStream_t last_replay_stream_ = nullptr;
};

size_t abandon_open_captures() {
  std::lock_guard<std::mutex> lock(open_captures_mu());
  const std::vector<OpenRegGraphImpl*> open(open_captures().begin(), open_captures().end());
  for (OpenRegGraphImpl* graph : open) graph->abandon_capture_locked();
  return open.size();
}

}  // namespace c10::openreg

namespace at {
// The registry is keyed by the device type's upper-case name, which is the
// renamed backend's ("OPENREG") once torch_openreg has run, "PRIVATEUSEONE" before.
C10_REGISTER_CLASS(GraphImplRegistry, OPENREG, c10::openreg::OpenRegGraphImpl)
C10_REGISTER_CLASS(GraphImplRegistry, PRIVATEUSEONE, c10::openreg::OpenRegGraphImpl)
}  // namespace at
