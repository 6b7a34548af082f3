// A caching allocator for openreg device memory, modelled on CUDA's.
//
// Device malloc/free are slow (free waits for the device), so freed blocks
// stay cached. Memory comes from the runtime in segments: requests up to
// 1 MiB are served from 2 MiB segments (the small pool), larger ones from
// 20 MiB segments or, above 10 MiB, a segment of their own rounded to 2 MiB
// (the large pool). A segment is split into blocks; a block's tail is split
// off when the remainder is worth keeping, and free neighbours coalesce.
//
// PYTORCH_ALLOC_CONF (read by torch: c10::CachingAllocator::AcceleratorAllocatorConfig, which
// torch.accelerator's allocator settings change at run time) applies as on CUDA: max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions and large_segment_size_mb. The others
// (garbage_collection_threshold, expandable_segments) are not implemented: a warning says so once.
//
// Pools are keyed by stream: a block freed on stream S is only reused by
// allocations on S, whose work is ordered after the free. A block that was
// used on other streams too (record_stream) is only returned to its pool
// after events recorded on those streams have completed.
//
// Blocks allocated during a graph capture belong to the graph's pool until the graph is reset; one
// freed meanwhile is reused only by later allocations of captures into that pool (CUDA's private
// pools).
//
// When the runtime is out of memory, the free-memory callbacks give back
// memory held outside the cache (if they hold any), then the cache is
// released and the allocation retried once; then torch.OutOfMemoryError is
// raised with the requested, allocated, reserved and capacity sizes.
#include "OpenRegCachingAllocator.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/llvmMathExtras.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "OpenRegException.h"
#include "OpenRegFunctions.h"

namespace c10::openreg::allocator {

namespace {

using c10::CachingAllocator::AcceleratorAllocatorConfig;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallSize = size_t{1} << 20;
constexpr size_t kSmallSegment = size_t{2} << 20;
constexpr size_t kLargeSegment = size_t{20} << 20;
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;

struct Block {
  c10::DeviceIndex device;
  orStream_t stream;
  size_t size;
  size_t requested = 0;
  char* ptr;
  bool small;
  bool allocated = false;
  int pending_events = 0;
  uint64_t graph = 0;             // allocated during the capture of this graph: kept until the graph is reset
  bool pooled = false;            // freed, in its graph's pool (graph_free_): captures into that pool may reuse it
  bool oversize = false;          // allocated at max_split_size or above (counted in oversize_allocations)
  bool oversize_segment = false;  // a segment's head, counted in oversize_segments
  Block* prev = nullptr;          // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<c10::Stream> stream_uses;
  Block(c10::DeviceIndex d, orStream_t s, size_t sz, char* p, bool sm)
      : device(d), stream(s), size(sz), ptr(p), small(sm) {}
  bool is_segment() const { return prev == nullptr && next == nullptr; }
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using Pool = std::set<Block*, BlockOrder>;

// Up to the next of `divisions` equal steps between the powers of two around n
// (roundup_power2_divisions: fewer distinct sizes, so freed blocks fit later requests more often).
size_t next_division(size_t n, size_t divisions) {
  if (c10::llvm::isPowerOf2_64(n)) return n;
  const size_t floor = size_t{1} << (63 - c10::llvm::countLeadingZeros(static_cast<uint64_t>(n)));
  const size_t step = floor >> (63 - c10::llvm::countLeadingZeros(static_cast<uint64_t>(divisions)));
  if (step == 0) return floor << 1;
  const size_t down = n & ~(step - 1);
  return down == n ? n : down + step;
}

size_t round_size(size_t n) {
  if (n < kMinBlock) return kMinBlock;
  const size_t divisions = AcceleratorAllocatorConfig::roundup_power2_divisions(n);
  if (divisions > 1 && n > kMinBlock * divisions) return next_division(n, divisions);
  return (n + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t segment_size(size_t n) {
  if (n <= kSmallSize) return kSmallSegment;
  const size_t rounded = (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  if (n < kMinLargeAlloc) return std::max(AcceleratorAllocatorConfig::large_segment_size(), rounded);
  return rounded;
}

// The settings openreg's allocator does not implement, named once when set.
void warn_unimplemented_settings() {
  if (AcceleratorAllocatorConfig::garbage_collection_threshold() > 0)
    TORCH_WARN_ONCE("openreg's allocator ignores PYTORCH_ALLOC_CONF's garbage_collection_threshold");
  if (AcceleratorAllocatorConfig::use_expandable_segments())
    TORCH_WARN_ONCE("openreg's allocator ignores PYTORCH_ALLOC_CONF's expandable_segments (it has none)");
}

// The free-memory callbacks (registerFreeMemoryCallback). They free tensors, which takes a cache's
// lock: they run with none held. An allocation that finds the device full while one of them holds
// memory gives up with FreeMemoryFirst before it releases the cache (nothing counted) and is asked
// again once they ran; t_after_callbacks marks that second request.
// Never destroyed, as the allocator is not: an allocation during static destruction may still ask.
struct FreeMemoryCallbacks {
  std::mutex mu;
  std::vector<FreeMemoryCallback> list;
};
FreeMemoryCallbacks& free_memory_callbacks() {
  static auto* registry = new FreeMemoryCallbacks();
  return *registry;
}
thread_local bool t_after_callbacks = false;
struct FreeMemoryFirst {};
// An allocation that finds the device full gives up with ReleaseCacheFirst (its cache's lock is
// then released), allocate() empties the cache and asks again; t_after_release marks that request,
// which raises OutOfMemoryError if the device is still full.
thread_local bool t_after_release = false;
struct ReleaseCacheFirst {};

std::vector<FreeMemoryCallback> callbacks() {
  auto& registry = free_memory_callbacks();
  std::lock_guard<std::mutex> lock(registry.mu);
  return registry.list;
}

bool callbacks_hold_memory() {
  for (const auto& cb : callbacks())
    if (cb.holds_memory()) return true;
  return false;
}

bool run_free_memory_callbacks() {
  bool freed = false;
  for (const auto& cb : callbacks()) freed = cb.free_memory() || freed;
  return freed;
}

std::string format_size(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  if (bytes < (1 << 20))
    os << std::fixed << bytes / 1024.0 << " KiB";
  else if (bytes < (size_t{1} << 30))
    os << std::fixed << bytes / 1048576.0 << " MiB";
  else
    os << std::fixed << bytes / 1073741824.0 << " GiB";
  return os.str();
}

class DeviceCache {
 public:
  std::mutex& mutex_for_test() { return mu_; }
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}

  // The device's allocated and reserved bytes after a malloc or free, for the profiler's memory records.
  struct Usage {
    size_t allocated = 0, reserved = 0;
  };

  Block* malloc(size_t requested, orStream_t stream, Usage* usage) {
    std::lock_guard<std::mutex> lock(mu_);
    process_events();
    const size_t size = round_size(requested);
    const bool small = size <= kSmallSize;
    Block* block = nullptr;
    uint64_t capture = 0;
    if (!capturing_.empty())
      if (auto c = capturing_.find(stream); c != capturing_.end()) capture = c->second;
    if (capture != 0 && (block = from_graph_pool(capture, size, stream, small)) != nullptr) {
      // reused inside its graph pool (already counted inactive, see free)
    } else if (recent_ != nullptr && recent_->stream == stream && recent_->size == size) {
      std::swap(block, recent_);
    } else {
      settle();
      block = best_fit(size, requested, stream, small);
    }
    block->allocated = true;
    block->requested = requested;
    block->oversize = block->size >= AcceleratorAllocatorConfig::max_split_size();
    if (block->oversize) stats_.oversize_allocations.increase(1);
    update(stats_.allocation, small, +1);
    update(stats_.active, small, +1);
    update(stats_.allocated_bytes, small, static_cast<int64_t>(block->size));
    update(stats_.active_bytes, small, static_cast<int64_t>(block->size));
    update(stats_.requested_bytes, small, static_cast<int64_t>(requested));
    live_.emplace(block->ptr, block);
    if (capture != 0) block->graph = capture;
    *usage = current_usage();
    return block;
  }

  // Returns the freed block's size.
  size_t free(void* ptr, Usage* usage) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != live_.end(), "openreg allocator: freeing an unknown pointer");
    Block* block = it->second;
    const size_t size = block->size;
    live_.erase(it);
    block->allocated = false;
    if (block->oversize) stats_.oversize_allocations.decrease(1);
    update(stats_.allocation, block->small, -1);
    update(stats_.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
    update(stats_.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
    *usage = current_usage();
    if (block->graph != 0) {  // a captured graph may still read or write it when replayed
      if (block->stream_uses.empty()) {
        // Into the graph's pool, as CUDA's private pools: a later allocation of a capture into that
        // pool, on the same stream, may take it, since a replay runs the captured work in the
        // order it was captured. Only such allocations: any other user could run beside a replay.
        deactivate(block);
        block->pooled = true;
        graph_free_[block->graph].push_back(block);
      } else {  // used on other streams too: kept whole until the graph is reset
        retained_[block->graph].push_back(block);
      }
      return size;
    }
    if (!block->stream_uses.empty()) {  // not reusable until the other streams' work queued so far is done
      insert_events_or_hold(block);
      return size;
    }
    deactivate(block);
    Block* previous = std::exchange(recent_, block);  // first: `previous` must not merge with `block`
    if (previous != nullptr) release_to_pool(previous);
    return size;
  }

  // Device side of a free: events on every stream that used the block (record_stream), but a
  // destroyed one (see below). A stream being captured into a graph cannot record one (its work is
  // recorded, not run), on this device or another (a copy from this device queued on a stream of
  // another records its source there): the block waits in needs_events_, holding no reuse and no
  // coalescing, until that capture ends (retried by process_events and end_capture). Recording there
  // threw inside the tensor's deleter, which aborted the process.
  void insert_events(Block* block) {
    std::vector<c10::Stream> capturing;
    for (const c10::Stream& s : block->stream_uses) {
      const orStream_t stream = OpenRegStream(s).handle();
      int is_capturing = 0;
      const orStatus known = orStreamIsCapturing(stream, &is_capturing);
      // A destroyed stream (an external one: a process group's comm stream) ran all its work before
      // its handle died (orStreamDestroy drains first): nothing to wait for.
      if (known == orErrorInvalidResourceHandle) continue;
      OPENREG_CHECK(known);
      orEvent_t event = nullptr;
      if (is_capturing == 0) {
        OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
        const orStatus st = orEventRecord(event, stream);
        if (st != orSuccess) {
          orEventDestroy(event);
          if (st != orErrorStreamCaptureUnsupported && st != orErrorInvalidResourceHandle) OPENREG_CHECK(st);
          // A capture began meanwhile, on another thread, or the stream is being destroyed (it is
          // draining): retried later, as for a capture.
          event = nullptr;
        }
      }
      if (event == nullptr) {
        capturing.push_back(s);
        continue;
      }
      pending_[stream].emplace_back(event, block);
      block->pending_events++;
    }
    block->stream_uses = std::move(capturing);
    if (!block->stream_uses.empty()) {
      needs_events_.push_back(block);
      block->pending_events++;
    }
    if (block->pending_events == 0) {  // its streams were all destroyed: nothing to wait for
      deactivate(block);
      release_to_pool(block);
    }
  }

  // insert_events for a caller that must not throw: a tensor's deleter (the process would end) or
  // release_graph (midway through its blocks). If the runtime refuses the events, the block is
  // never reused (a hold nothing gives back), as nothing tells when those streams are done with
  // it. That is every such free in a child forked after the parent used the device
  // (lazy-init-fork.md): its exit freed the inherited tensors and aborted.
  void insert_events_or_hold(Block* block) noexcept {
    try {
      insert_events(block);
    } catch (const c10::Error& e) {
      block->pending_events++;
      if (!in_forked_child())
        TORCH_WARN(
            "openreg allocator: a freed block used on other streams (record_stream) could not wait for "
            "them and is not reused: ",
            e.what_without_backtrace());
    }
  }

  void retry_needs_events() {
    std::vector<Block*> blocks;
    blocks.swap(needs_events_);
    for (size_t i = 0; i < blocks.size(); ++i) {
      blocks[i]->pending_events--;
      try {
        insert_events(blocks[i]);  // back in needs_events_ if a stream of it still captures
      } catch (...) {              // e.g. no event left: this block and the rest wait for the next look
        blocks[i]->pending_events++;
        needs_events_.insert(needs_events_.end(), blocks.begin() + static_cast<std::ptrdiff_t>(i), blocks.end());
        throw;
      }
    }
  }

  void record_stream(void* ptr, const c10::Stream& stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    Block* block = it->second;
    if (OpenRegStream(stream).handle() == block->stream) return;
    for (const auto& s : block->stream_uses)
      if (s == stream) return;
    block->stream_uses.push_back(stream);
  }

  // Graph capture: blocks allocated on `stream` while it captures belong to graph `id` and are not
  // reused by anyone else until release_graph(id), because replays touch them.
  // Graphs may share a pool (torch.accelerator.Graph(pool=other.pool())): each capture that
  // begins holds the pool, and its blocks are released when the last of them is reset.
  void begin_capture(orStream_t stream, uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    // Refused before anything changes: the capture under way on the stream (another thread's)
    // keeps its pool. Overwritten, then erased by the refused capture's cleanup, it lost its
    // blocks to other users while its graph still read and wrote them.
    TORCH_CHECK(capturing_.count(stream) == 0,
                "cannot begin a graph capture: the stream is already capturing (another capture_begin() on it "
                "has not ended)");
    capturing_[stream] = id;
    ++pool_users_[id];
  }

  void end_capture(orStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_.erase(stream);
    if (!needs_events_.empty()) retry_needs_events();
  }

  // Another graph holds pool `id` too (one that replays the pool's graph inside its capture, and
  // so runs that graph's work on the pool's blocks): released by one more release_graph(id).
  void retain_graph(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    ++pool_users_[id];
  }

  void release_graph(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto users = pool_users_.find(id); users != pool_users_.end() && --users->second > 0) return;
    pool_users_.erase(id);
    for (auto& [ptr, block] : live_)
      if (block->graph == id) block->graph = 0;  // still in use by tensors: ordinary from now on
    if (auto pooled = graph_free_.find(id); pooled != graph_free_.end()) {
      for (Block* block : pooled->second) {  // inactive already
        block->graph = 0;
        block->pooled = false;
        release_to_pool(block);
      }
      graph_free_.erase(pooled);
    }
    auto it = retained_.find(id);
    if (it == retained_.end()) return;
    for (Block* block : it->second) {
      block->graph = 0;
      // Destroying a graph waits for its device, but a capture a refused call invalidated ends
      // without a graph and without a wait, and a stream of another device may have used the
      // block: the streams that used it (record_stream) get events, as at any free.
      if (!block->stream_uses.empty()) {
        insert_events_or_hold(block);
        continue;
      }
      deactivate(block);
      release_to_pool(block);
    }
    retained_.erase(it);
  }

  // A failed kernel reported by the waits is returned, for the caller to raise once every device's
  // cache is empty.
  // Nothing waits for the device under mu_: a thread that frees or allocates a tensor holding
  // Python's GIL (a storage's deallocation does) blocks on mu_, and a queued kernel written in
  // Python needs that GIL to end, so a wait under mu_ for that kernel never ended. The events of
  // record_stream frees are copied out and waited for without the lock, then the whole free
  // segments are taken out of the pools under it and returned to the runtime (orFree waits for
  // the device) without it.
  // From a kernel (a custom operator's body calling torch.openreg.empty_cache()) nothing is released:
  // giving memory back waits for every device, the kernel's own stream included.
  FirstFailure empty_cache() {
    FirstFailure failure;
    if (orInKernel() != 0) return failure;
    std::vector<orEvent_t> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      settle();
      if (!needs_events_.empty()) retry_needs_events();
      for (const auto& [stream, queue] : pending_)
        for (const auto& [event, block] : queue) events.push_back(event);
      ++waiting_;  // process_events leaves these events alone meanwhile
    }
    for (orEvent_t event : events) failure.note(orEventSynchronize(event));
    std::vector<void*> segments;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --waiting_;
      process_events();
      detach_segments(small_pool_, segments, bytes);
      detach_segments(large_pool_, segments, bytes);
      releasing_ += bytes;
    }
    free_segments(segments, failure);
    releasing_ -= bytes;
    return failure;
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    settle();
    recount_inactive_split();
    // As CUDA reports it: the setting, -1 for none (SIZE_MAX).
    stats_.max_split_size = static_cast<int64_t>(AcceleratorAllocatorConfig::max_split_size());
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    // The inactive-split counts are recounted when read (see recount_inactive_split): bring them up
    // to date first, or a peak reset now would keep the count of the last read as its peak.
    settle();
    recount_inactive_split();
    for_each_stat([](Stat& s) { s.reset_peak(); });
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mu_);
    settle();  // as reset_peak: the next read must not book what happened before the reset
    recount_inactive_split();
    for_each_stat([](Stat& s) { s.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void snapshot(std::vector<c10::CachingDeviceAllocator::SegmentInfo>& out) {
    std::lock_guard<std::mutex> lock(mu_);
    settle();
    for (Block* head : segments_) {
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = device_;
      seg.address = reinterpret_cast<size_t>(head->ptr);
      seg.stream = head->stream;
      seg.is_large = !head->small;
      for (Block* b = head; b != nullptr; b = b->next) {
        c10::CachingDeviceAllocator::BlockInfo info;
        info.size = b->size;
        info.requested_size = b->allocated ? b->requested : 0;
        info.allocated = b->allocated;
        // freed and kept for a graph: active, unless free in its graph's pool
        info.active = b->allocated || b->pending_events > 0 || (b->graph != 0 && !b->pooled);
        seg.total_size += b->size;
        if (info.allocated) {
          seg.allocated_size += b->size;
          seg.requested_size += b->requested;
        }
        if (info.active) seg.active_size += b->size;
        seg.blocks.push_back(info);
      }
      out.push_back(std::move(seg));
    }
  }

 private:
  // `requested`: the caller's byte count, which the out-of-memory message names (`size` is rounded).
  Block* new_segment(size_t size, size_t requested, orStream_t stream, bool small) {
    warn_unimplemented_settings();  // here, on the slow path: settings may change at run time
    const size_t bytes = segment_size(size);
    void* ptr = nullptr;
    const auto previous = exchange_device(device_);
    orStatus st = orMalloc(&ptr, bytes);
    if (st == orErrorMemoryAllocation && !t_after_callbacks && callbacks_hold_memory()) {
      // Memory held outside the cache goes back first, as CUDA's free-memory callbacks run before
      // its cache is released: allocate() runs them and asks again (the cache is still here).
      exchange_device(previous);
      throw FreeMemoryFirst{};
    }
    if (st == orErrorMemoryAllocation && !t_after_release) {
      // Give the cache back and try once more: allocate() empties this cache (waiting for the
      // device without mu_, see empty_cache) and asks again.
      stats_.num_alloc_retries++;
      exchange_device(previous);
      throw ReleaseCacheFirst{};
    }
    exchange_device(previous);
    if (st == orErrorMemoryAllocation) {
      stats_.num_ooms++;
      const std::string cause = orGetLastErrorMessage();  // the runtime's reason (e.g. an injected fault)
      size_t free_bytes = 0, total = 0;
      const auto prev = exchange_device(device_);
      orMemGetInfo(&free_bytes, &total);
      exchange_device(prev);
      const auto& agg = [](const StatArray& a) { return a[static_cast<size_t>(StatType::AGGREGATE)].current; };
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(bytes), agg(stats_.allocated_bytes),
                                       agg(stats_.reserved_bytes), c10::Device(c10::DeviceType::PrivateUse1, device_));
      // Freed blocks a graph may replay into are neither allocated nor releasable: only resetting
      // the graph gives them back, which the usual advice does not say.
      size_t kept_for_graphs = 0;
      for (const auto* kept : {&retained_, &graph_free_})
        for (const auto& [graph, blocks] : *kept)
          for (const Block* b : blocks) kept_for_graphs += b->size;
      const std::string graphs =
          kept_for_graphs == 0 ? std::string()
                               : format_size(kept_for_graphs) +
                                     " freed but kept for captured graphs (reset() the graphs you no longer replay), ";
      // Another thread's empty_cache gives segments back without the cache's lock (it waits for the
      // device meanwhile): this request found the device full before they were back.
      const size_t releasing = releasing_.load();
      const std::string released = releasing == 0
                                       ? std::string()
                                       : format_size(releasing) +
                                             " being given back to the device by another thread (its empty_cache() or "
                                             "out-of-memory retry; retry), ";
      TORCH_CHECK_WITH(OutOfMemoryError, false, "openreg out of memory on device ", static_cast<int>(device_),
                       ". Tried to allocate ", format_size(bytes), " (for a request of ", format_size(requested),
                       "). Device capacity ", format_size(total), ", ", format_size(free_bytes), " free; ",
                       format_size(agg(stats_.allocated_bytes)), " allocated by PyTorch, ", graphs, released,
                       format_size(agg(stats_.reserved_bytes)),
                       " reserved by PyTorch. Free tensors, call torch.openreg.empty_cache(), or raise "
                       "OPENREG_DEVICE_MEMORY. (The runtime said: ",
                       cause, ")");
    }
    OPENREG_CHECK(st);
    stats_.num_device_alloc++;
    update(stats_.segment, small, +1);
    update(stats_.reserved_bytes, small, static_cast<int64_t>(bytes));
    Block* block = new_block(stream, bytes, static_cast<char*>(ptr), small);
    block->oversize_segment = bytes >= AcceleratorAllocatorConfig::max_split_size();
    if (block->oversize_segment) stats_.oversize_segments.increase(1);
    segments_.insert(block);
    return block;
  }

  // The smallest free block of graph pool `id` on `stream` that holds `size` bytes without wasting
  // more than half of it (blocks of a graph pool are neither split nor merged), of the same pool
  // (small or large: the statistics count a block in its own); null if none.
  Block* from_graph_pool(uint64_t id, size_t size, orStream_t stream, bool small) {
    auto it = graph_free_.find(id);
    if (it == graph_free_.end()) return nullptr;
    auto& blocks = it->second;
    size_t best = blocks.size();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block* b = blocks[i];
      if (b->stream == stream && b->small == small && b->size >= size && b->size / 2 <= size &&
          (best == blocks.size() || b->size < blocks[best]->size))
        best = i;
    }
    if (best == blocks.size()) return nullptr;
    Block* block = blocks[best];
    blocks[best] = blocks.back();
    blocks.pop_back();
    block->pooled = false;
    return block;
  }

  // Free for coalescing: not allocated, not waiting for events, and not kept for a graph
  // (a retained block is in no pool and is released on its own by release_graph).
  // The recent block is free but in no pool: it is merged when it is settled.
  bool is_free(const Block* b) const {
    return b != nullptr && !b->allocated && b->pending_events == 0 && b->graph == 0 && b != recent_;
  }

  // The smallest cached block of the stream that fits, or a new segment; split. With
  // max_split_size (M) set, as CUDA's: a request below M takes no cached block of M or more, one of
  // M or more takes a cached block less than max_non_split_rounding larger, and neither splits one.
  Block* best_fit(size_t size, size_t requested, orStream_t stream, bool small) {
    Pool& pool = small ? small_pool_ : large_pool_;
    Block key(device_, stream, size, nullptr, small);
    Block* block = nullptr;
    const size_t max_split = AcceleratorAllocatorConfig::max_split_size();
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->stream == stream &&
        (size < max_split ? (*it)->size < max_split
                          : (*it)->size < size + AcceleratorAllocatorConfig::max_non_split_rounding_size())) {
      block = *it;
      take(pool, it);
    } else {
      block = new_segment(size, requested, stream, small);
    }
    // Split off the tail when it is big enough to be useful on its own.
    const size_t remaining = block->size - size;
    if ((small && remaining >= kMinBlock) || (!small && size < max_split && remaining > kSmallSize)) {
      Block* rest = new_block(stream, remaining, block->ptr + size, small);
      rest->prev = block;
      rest->next = block->next;
      if (rest->next) rest->next->prev = rest;
      block->next = rest;
      block->size = size;
      put(pool, rest);
    }
    return block;
  }

  // The block freed last is not put back in its pool at once: a loop that frees a block
  // and asks for the same size on the same stream again (the common case) gets it back
  // without a split and a merge. Every other request, and everything that reads the
  // pools (stats, snapshot, empty_cache), settles it first, so nothing else can tell.
  void settle() {
    if (recent_ == nullptr) return;
    Block* block = recent_;
    recent_ = nullptr;
    release_to_pool(block);
  }

  void deactivate(Block* block) {
    update(stats_.active, block->small, -1);
    update(stats_.active_bytes, block->small, -static_cast<int64_t>(block->size));
  }

  void release_to_pool(Block* block) {
    Pool& pool = block->small ? small_pool_ : large_pool_;
    // Coalesce with free neighbours; a segment's first block stays its head.
    if (Block* next = block->next; is_free(next)) {
      take(pool, pool.find(next));
      block->size += next->size;
      block->next = next->next;
      if (block->next) block->next->prev = block;
      recycle(next);
    }
    if (Block* prev = block->prev; is_free(prev)) {
      take(pool, pool.find(prev));
      prev->size += block->size;
      prev->next = block->next;
      if (prev->next) prev->next->prev = prev;
      recycle(block);
      block = prev;
    }
    put(pool, block);
  }

  // One queue per stream, as CUDA's allocator keeps: a stream runs in order, so its events
  // complete in order and a query stops at its first pending one; a single queue stopped there
  // for every stream, and one slow stream kept all blocks freed after it from reuse.
  void process_events() {
    // An empty_cache waits for copies of these events' handles without the lock: none is destroyed
    // (and its slot recycled for another event) meanwhile.
    if (waiting_ > 0) return;
    if (!needs_events_.empty()) retry_needs_events();
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto& queue = it->second;
      while (!queue.empty()) {
        auto [event, block] = queue.front();
        if (orEventQuery(event) == orErrorNotReady) break;
        orEventDestroy(event);
        queue.pop_front();
        if (--block->pending_events == 0) {
          deactivate(block);
          release_to_pool(block);
        }
      }
      it = queue.empty() ? pending_.erase(it) : std::next(it);
    }
  }

  // Takes the pool's whole free segments out of the cache (under mu_) and appends their addresses
  // to `out`, for free_segments to give back to the runtime once mu_ is released.
  void detach_segments(Pool& pool, std::vector<void*>& out, size_t& bytes) {
    for (auto it = pool.begin(); it != pool.end();) {
      Block* block = *it;
      if (!block->is_segment()) {
        ++it;
        continue;
      }
      it = pool.erase(it);
      segments_.erase(block);
      out.push_back(block->ptr);
      bytes += block->size;
      stats_.num_device_free++;
      if (block->oversize_segment) stats_.oversize_segments.decrease(1);
      update(stats_.segment, block->small, -1);
      update(stats_.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
      recycle(block);
    }
  }

  // Without mu_: orFree waits for the device.
  void free_segments(const std::vector<void*>& segments, FirstFailure& failure) {
    if (segments.empty()) return;
    const auto previous = exchange_device(device_);
    for (void* ptr : segments) failure.note(orFree(ptr));
    exchange_device(previous);
  }

  // Block records and pool nodes are recycled: splitting a block and merging it back is
  // the steady state of many loops, and should not cost mallocs and frees each time.
  void take(Pool& pool, Pool::iterator it) {
    auto node = pool.extract(it);
    if (nodes_.size() < 256) nodes_.push_back(std::move(node));
  }

  void put(Pool& pool, Block* block) {
    if (nodes_.empty()) {
      pool.insert(block);
      return;
    }
    Pool::node_type node = std::move(nodes_.back());
    nodes_.pop_back();
    node.value() = block;
    pool.insert(std::move(node));
  }

  Block* new_block(orStream_t stream, size_t size, char* ptr, bool small) {
    if (spare_.empty()) return new Block(device_, stream, size, ptr, small);
    Block* b = spare_.back();
    spare_.pop_back();
    *b = Block(device_, stream, size, ptr, small);
    return b;
  }

  void recycle(Block* b) {
    if (spare_.size() < 256)
      spare_.push_back(b);
    else
      delete b;
  }

  // Inactive split blocks: free blocks that are part of a larger segment.
  // Counted when stats are read, to keep malloc and free O(log n).
  void recount_inactive_split() {
    int64_t count[3] = {0, 0, 0}, bytes[3] = {0, 0, 0};
    auto count_block = [&](const Block* b) {
      if (b->is_segment()) return;
      const size_t t = b->small ? 1 : 2;
      count[0]++, count[t]++, bytes[0] += b->size, bytes[t] += b->size;
    };
    for (Pool* pool : {&small_pool_, &large_pool_})
      for (Block* b : *pool) count_block(b);
    // Freed blocks of graph pools too, as CUDA counts a private pool's (and the snapshot shows them
    // inactive): they were left out.
    for (const auto& [graph, blocks] : graph_free_)
      for (const Block* b : blocks) count_block(b);
    set_current(stats_.inactive_split, count);
    set_current(stats_.inactive_split_bytes, bytes);
  }

  static void set_current(StatArray& a, const int64_t values[3]) {
    for (size_t i = 0; i < 3; ++i) {
      const int64_t delta = values[i] - a[i].current;
      if (delta > 0)
        a[i].increase(delta);
      else if (delta < 0)
        a[i].decrease(-delta);
    }
  }

  Usage current_usage() const {
    constexpr auto kAll = static_cast<size_t>(StatType::AGGREGATE);
    return {static_cast<size_t>(stats_.allocated_bytes[kAll].current),
            static_cast<size_t>(stats_.reserved_bytes[kAll].current)};
  }

  static void update(StatArray& a, bool small, int64_t delta) {
    for (size_t i : {static_cast<size_t>(StatType::AGGREGATE),
                     static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)}) {
      if (delta >= 0)
        a[i].increase(static_cast<size_t>(delta));
      else
        a[i].decrease(static_cast<size_t>(-delta));
    }
  }

  template <typename F>
  void for_each_stat(F f) {
    for (StatArray* a :
         {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split, &stats_.allocated_bytes,
          &stats_.reserved_bytes, &stats_.active_bytes, &stats_.inactive_split_bytes, &stats_.requested_bytes})
      for (Stat& s : *a) f(s);
    f(stats_.oversize_allocations);  // one Stat each, not one per pool
    f(stats_.oversize_segments);
  }

  c10::DeviceIndex device_;
  std::mutex mu_;
  Pool small_pool_, large_pool_;
  std::vector<Block*> spare_;           // recycled block records
  std::vector<Pool::node_type> nodes_;  // recycled pool nodes
  Block* recent_ = nullptr;             // freed last, not yet in its pool (see settle)
  std::set<Block*> segments_;           // first block of every segment
  // record_stream events, one queue per stream (see process_events)
  std::unordered_map<orStream_t, std::deque<std::pair<orEvent_t, Block*>>> pending_;
  ska::flat_hash_map<void*, Block*> live_;  // allocated blocks by address
  std::unordered_map<orStream_t, uint64_t> capturing_;
  std::unordered_map<uint64_t, std::vector<Block*>> retained_;    // freed blocks a graph may still use
  std::unordered_map<uint64_t, std::vector<Block*>> graph_free_;  // freed blocks of a graph pool (see free)
  std::unordered_map<uint64_t, int> pool_users_;  // graph pool -> captures begun on it and not yet reset
  std::vector<Block*> needs_events_;              // freed while a stream that used them captures (see insert_events)
  int waiting_ = 0;                   // empty_cache calls waiting for pending_'s events (see process_events)
  std::atomic<size_t> releasing_{0};  // bytes taken out by empty_cache, not given back to the runtime yet
  DeviceStats stats_;
};

class OpenRegCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device dev(c10::DeviceType::PrivateUse1, device);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &raw_delete, dev);
    // A negative byte count (UntypedStorage(-1), storage.resize_(-1)) arrives as a huge size_t, whose
    // rounding overflowed to a 0-byte block at the address of the next allocation: a write through it
    // overwrote another tensor, and the two frees aborted the process. Refused as the CPU's
    // alloc_cpu refuses it.
    TORCH_CHECK(static_cast<std::ptrdiff_t>(n) >= 0,
                "openreg's allocator seems to have been called with a negative number of bytes: ", n);
    DeviceCache::Usage usage;
    Block* block = nullptr;
    // At most three requests: the free-memory callbacks run first if they hold memory, then the
    // cache is emptied (see new_segment).
    struct Flag {  // set for the rest of this allocation, then as it was
      bool& flag;
      const bool before;
      explicit Flag(bool& f) : flag(f), before(f) {}
      void set() { flag = true; }
      ~Flag() { flag = before; }
    } after_callbacks(t_after_callbacks), after_release(t_after_release);
    while (block == nullptr) {
      try {
        block = cache(device).malloc(n, current_stream_handle(device), &usage);
      } catch (const FreeMemoryFirst&) {
        run_free_memory_callbacks();
        after_callbacks.set();
      } catch (const ReleaseCacheFirst&) {
        // A kernel that failed meanwhile is reported here, as by any synchronising call.
        cache(device).empty_cache().raise();
        after_release.set();
      }
    }
    // As CUDA's allocator: torch.profiler(profile_memory=True) records each allocation and free
    // (a no-op unless this thread is being profiled). Outside the cache's lock.
    c10::reportMemoryUsageToProfiler(block->ptr, static_cast<int64_t>(block->size), usage.allocated, usage.reserved,
                                     dev);
    return c10::DataPtr(block->ptr, block->ptr, &raw_delete, dev);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }

  // Host code cannot touch device memory: copies go through the runtime. torch calls it to give a
  // copy-on-write storage its own memory (Allocator::clone): on the current stream (its caller,
  // ready_for_launch, guards the storage's device), after the work queued there, as a kernel
  // writing the storage would run. It was a synchronous orMemcpy: the host waited for the device,
  // and the copy was not ordered with writes queued on a side stream.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    OPENREG_CHECK(orMemcpyAsync(dest, src, count, orMemcpyDeviceToDevice, current_stream_handle(current_device())));
  }

  // Whether a device's cache exists (something was allocated on it, or asked of it): before,
  // torch.accelerator's memory functions answer {} or 0 without initialising openreg, as
  // torch.openreg's and torch.cuda's do, so that a process may still fork.
  bool initialized() override {
    for (const auto& cache : ready_)
      if (cache.load(std::memory_order_acquire) != nullptr) return true;
    return false;
  }

  void emptyCache(c10::MempoolId_t) override {
    // A forked child's cache holds the parent's memory, which the runtime refuses to take back there:
    // nothing to give, as torch.cuda.empty_cache() in a child does nothing (torch.accelerator's too).
    if (in_forked_child()) return;
    run_free_memory_callbacks();
    FirstFailure failure;
    for (auto& c : caches_)
      if (c) failure.note(c->empty_cache());
    failure.raise();
  }

  // In a child forked after the parent used the device, none of these takes a cache's lock, which a
  // parent thread may have held at the fork (lazy-init-fork.md): the statistics and the snapshot are
  // empty there (the child allocated nothing), a reset does nothing, a record is refused.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &raw_delete) return;  // not ours
    check_not_forked_child();
    cache(ptr.device().index()).record_stream(ptr.get(), stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return in_forked_child() ? DeviceStats() : cache(device).stats();
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (!in_forked_child()) cache(device).reset_accumulated();
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    if (!in_forked_child()) cache(device).reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    size_t free_bytes = 0, total = 0;
    const auto previous = exchange_device(device);
    orStatus st = orMemGetInfo(&free_bytes, &total);
    exchange_device(previous);
    OPENREG_CHECK(st);
    return {free_bytes, total};
  }

  DeviceCache& cache(c10::DeviceIndex device) {
    if (device >= 0 && device < 64) {  // hot path: one acquire load once the cache exists
      if (DeviceCache* c = ready_[device].load(std::memory_order_acquire)) return *c;
    }
    check_device_index(device);
    std::call_once(once_[device], [&] {
      caches_[device] = std::make_unique<DeviceCache>(device);
      ready_[device].store(caches_[device].get(), std::memory_order_release);
    });
    return *caches_[device];
  }

  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments() {
    std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
    if (in_forked_child()) return out;  // as getDeviceStats
    for (auto& c : caches_)
      if (c) c->snapshot(out);
    return out;
  }

 private:
  static void raw_delete(void* ptr);

  std::unique_ptr<DeviceCache> caches_[64];
  std::atomic<DeviceCache*> ready_[64] = {};
  std::once_flag once_[64];
};

// Never destroyed: tensors and graphs may be freed during interpreter shutdown, after
// static destructors would have run.
OpenRegCachingAllocator& g_allocator = *new OpenRegCachingAllocator();

void OpenRegCachingAllocator::raw_delete(void* ptr) {
  // A child's inherited tensor is the parent's memory: leave it, and the cache's lock, which a
  // parent thread may have held at the fork, alone.
  if (ptr == nullptr || in_forked_child()) return;
  const int device = orPointerGetDevice(ptr);
  TORCH_INTERNAL_ASSERT(device >= 0, "openreg allocator: freeing a pointer that is not device memory");
  DeviceCache::Usage usage;
  const size_t size = g_allocator.cache(static_cast<c10::DeviceIndex>(device)).free(ptr, &usage);
  c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(size), usage.allocated, usage.reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

c10::DeviceAllocator* get() { return &g_allocator; }
void recordStream(const c10::DataPtr& data_ptr, OpenRegStream stream) { g_allocator.recordStream(data_ptr, stream); }
void emptyCache() { g_allocator.emptyCache({0, 0}); }
void registerFreeMemoryCallback(FreeMemoryCallback callback) {
  auto& registry = free_memory_callbacks();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.list.push_back(callback);
}
void beginGraphCapture(c10::DeviceIndex device, orStream_t stream, uint64_t graph) {
  g_allocator.cache(device).begin_capture(stream, graph);
}
void endGraphCapture(c10::DeviceIndex device, orStream_t stream) { g_allocator.cache(device).end_capture(stream); }
void releaseGraph(c10::DeviceIndex device, uint64_t graph) { g_allocator.cache(device).release_graph(graph); }
void retainGraph(c10::DeviceIndex device, uint64_t graph) { g_allocator.cache(device).retain_graph(graph); }
c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) {
  return g_allocator.getDeviceStats(device);
}
void resetPeakStats(c10::DeviceIndex device) { g_allocator.resetPeakStats(device); }
void resetAccumulatedStats(c10::DeviceIndex device) { g_allocator.resetAccumulatedStats(device); }
std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot() { return g_allocator.segments(); }
void hold_lock_for_test(c10::DeviceIndex device, bool hold) {
  std::mutex& mu = g_allocator.cache(device).mutex_for_test();
  hold ? mu.lock() : mu.unlock();
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace c10::openreg::allocator
