// Pinned host memory comes from orMallocHost, which is slow, so freed
// blocks are cached by power-of-two size. A block used by an asynchronous
// copy is only reused after an event recorded behind that copy completed,
// so a `non_blocking=True` copy can never read a buffer that was reused.
// A block keeps one event per stream that uses it, recorded again at each use
// (a stream runs in order: its latest use follows the earlier ones), and a new
// stream takes the event of a use that is over: a staging buffer reused for a
// million copies holds one event, not a million (the runtime's event table then
// ran out, and every event creation in the process failed).
// A copy captured into a graph records no event (the capturing stream runs nothing, and every
// replay reads or writes the buffer again): such a block is never handed out again. This allocator
// does not know which graph used it, so it is kept for the process's life (torch 2.13's
// CachingHostAllocator keeps blocks allocated during a capture in that capture's pool instead).
#include "OpenRegHostAllocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "OpenRegException.h"
#include "OpenRegFunctions.h"

namespace c10::openreg::host_allocator {

namespace {

struct HostBlock {
  void* ptr;
  size_t size;
  std::vector<std::pair<orStream_t, orEvent_t>> uses;  // per stream: an event behind its latest async copy
  bool captured = false;                               // used by a copy captured into a graph
};

size_t round_pow2(size_t n) {
  size_t r = 4096;
  while (r < n) r <<= 1;
  return r;
}

class HostCache final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &raw_delete, c10::Device(c10::DeviceType::CPU));
    // A negative byte count (a pinned storage's resize_(-1)) arrives as a huge size_t: round_pow2's
    // doubling overflowed to 0 and spun for ever, with the GIL held. Refused as the CPU's alloc_cpu
    // and the device allocator refuse it.
    TORCH_CHECK(static_cast<std::ptrdiff_t>(n) >= 0,
                "openreg's pinned host allocator seems to have been called with a negative number of bytes: ", n);
    check_not_forked_child();  // before the lock, which a parent thread may have held at the fork
    const size_t size = round_pow2(n);
    std::lock_guard<std::mutex> lock(mu_);
    HostBlock* block = nullptr;
    auto& list = free_[size];
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (ready(*it)) {
        block = *it;
        list.erase(it);
        break;
      }
    }
    if (block == nullptr) {
      void* ptr = nullptr;
      OPENREG_CHECK(orMallocHost(&ptr, size));
      block = new HostBlock{ptr, size, {}};
      stats_.num_host_alloc++;
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(size);
    }
    used_[block->ptr] = block;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    return c10::DataPtr(block->ptr, block->ptr, &raw_delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != used_.end(), "openreg host allocator: unknown pointer");
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(it->second->size);
    if (it->second->captured)
      captured_.push_back(it->second);  // a replay may still use it: never reused, never freed
    else
      free_[it->second->size].push_back(it->second);
    used_.erase(it);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    record(ptr, ctx, OpenRegStream(stream));
    return true;
  }

  void empty_cache() override { empty(); }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_accumulated();
    stats_.num_host_alloc = stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_peak();
  }

  // `ptr` is the copy's host address, `ctx` its storage's context: the block's base when the
  // storage is the allocation, something else for a tensor made over pinned memory it does not own
  // (torch.from_numpy(pinned.numpy()), from_blob), whose block is then found by address.
  void record(const void* ptr, void* ctx, OpenRegStream stream) {
    check_not_forked_child();  // as allocate
    const orStream_t handle = stream.handle();
    bool kept = false;
    orStatus st = orSuccess;
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = record_locked(ptr, ctx, handle, &kept);
    }
    // Waited for without the lock, as in empty(): a kernel queued before the copy may pin memory.
    if (!kept) protect_unrecorded(handle);
    OPENREG_CHECK(st);
  }

  // Under mu_. *kept: an event now follows the copy on its block (or the block is kept for good, a
  // captured copy's); otherwise the caller waits for the copy: pinned memory that is no block in
  // use here (nothing would keep it from reuse), or an event that could not be made or recorded.
  orStatus record_locked(const void* ptr, void* ctx, orStream_t handle, bool* kept) {
    auto own = used_.find(ctx);
    HostBlock* block = own != used_.end() ? own->second : in_use(ptr);
    if (block == nullptr) return orSuccess;
    int capturing = 0;
    if (orStatus st = orStreamIsCapturing(handle, &capturing); st != orSuccess) return st;
    if (capturing != 0) {
      block->captured = true;
      *kept = true;
      return orSuccess;
    }
    auto& uses = block->uses;
    auto found = std::find_if(uses.begin(), uses.end(), [&](const auto& use) { return use.first == handle; });
    if (found == uses.end()) {
      // A new stream takes the event of a use that is over, if any: a buffer used from many
      // short-lived streams keeps as many events as streams it is used on at once.
      found = std::find_if(uses.begin(), uses.end(),
                           [](const auto& use) { return orEventQuery(use.second) != orErrorNotReady; });
      if (found != uses.end()) {
        found->first = handle;
      } else {
        orEvent_t event = nullptr;
        if (orStatus st = orEventCreateWithFlags(&event, orEventDisableTiming); st != orSuccess) return st;
        found = uses.emplace(uses.end(), handle, event);
      }
    }
    if (orStatus st = orEventRecord(found->second, handle); st != orSuccess) return st;
    *kept = true;
    return orSuccess;
  }

  void empty() {
    if (in_forked_child()) return;  // the parent's memory: as the device allocator's emptyCache
    FirstFailure failure;           // raised once the cache is empty
    // From a kernel nothing is released: orFreeHost waits for every device, the kernel's own stream
    // included, and refuses (the blocks were dropped from the cache and leaked).
    if (orInKernel() != 0) return;
    std::vector<HostBlock*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_) {
        blocks.insert(blocks.end(), list.begin(), list.end());
        list.clear();
      }
    }
    // Waited for without the lock: a kernel queued before a copy a block waits for may itself pin
    // memory (a custom operator written in Python), and every thread that frees a pinned tensor
    // would stall meanwhile. The blocks are off the free lists: nobody else can hand them out.
    for (HostBlock* b : blocks) {
      for (auto& [stream, e] : b->uses) {
        failure.note(orEventSynchronize(e));
        orEventDestroy(e);
      }
      orFreeHost(b->ptr);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (HostBlock* b : blocks) {
        stats_.num_host_free++;
        stats_.allocations.decrease(1);
        stats_.allocated_bytes.decrease(b->size);
        delete b;
      }
    }
    failure.raise();
  }

  void hold_lock_for_test(bool hold) { hold ? mu_.lock() : mu_.unlock(); }

 private:
  static void raw_delete(void* ptr);

  // The copy is queued and no event follows it: wait for it (before the caller learns of a
  // failure), so that its memory is not handed out again while the copy still reads or writes it.
  static void protect_unrecorded(orStream_t stream) { (void)orStreamSynchronize(stream); }

  // The block in use that holds address `p`, or nullptr. Under mu_.
  HostBlock* in_use(const void* p) const {
    auto it = used_.upper_bound(p);
    if (it == used_.begin()) return nullptr;
    --it;
    HostBlock* b = it->second;
    return static_cast<const char*>(p) < static_cast<const char*>(b->ptr) + b->size ? b : nullptr;
  }

  // True when every async copy that used the block has completed.
  static bool ready(HostBlock* b) {
    for (auto it = b->uses.begin(); it != b->uses.end();) {
      if (orEventQuery(it->second) == orErrorNotReady) return false;
      orEventDestroy(it->second);
      it = b->uses.erase(it);
    }
    return true;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<HostBlock*>> free_;
  std::map<const void*, HostBlock*> used_;  // by base: ordered, to find the block around an address
  std::vector<HostBlock*> captured_;        // freed, used by a captured copy: kept for the process's life
  at::HostStats stats_;
};

// Never destroyed: pinned tensors may be freed during interpreter shutdown.
HostCache& g_host = *new HostCache();

void HostCache::raw_delete(void* ptr) {
  // As the device allocator's: a forked child leaves inherited pinned memory and its locks alone.
  if (ptr != nullptr && !in_forked_child()) g_host.free(ptr);
}

}  // namespace

c10::Allocator* get() { return &g_host; }

bool is_pinned(const void* ptr) {
  orPointerAttributes attr;
  return ptr != nullptr && orPointerGetAttributes(&attr, ptr) == orSuccess && attr.type == orMemoryTypeHost;
}

void record_stream(const void* ptr, void* ctx, OpenRegStream stream) { g_host.record(ptr, ctx, stream); }

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host);
void empty_cache() { g_host.empty(); }
void hold_lock_for_test(bool hold) { g_host.hold_lock_for_test(hold); }

}  // namespace c10::openreg::host_allocator
