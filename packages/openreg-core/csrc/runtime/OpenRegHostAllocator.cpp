// Pinned host memory comes from orMallocHost, which is slow, so freed
// blocks are cached by power-of-two size. A block used by an asynchronous
// copy is only reused after an event recorded behind that copy completed,
// so a `non_blocking=True` copy can never read a buffer that was reused.
#include "OpenRegHostAllocator.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "OpenRegException.h"

namespace c10::openreg::host_allocator {

namespace {

struct HostBlock {
  void* ptr;
  size_t size;
  std::vector<orEvent_t> events;  // uses by async copies
};

size_t round_pow2(size_t n) {
  size_t r = 4096;
  while (r < n) r <<= 1;
  return r;
}

class HostCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &raw_delete, c10::Device(c10::DeviceType::CPU));
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
    }
    used_[block->ptr] = block;
    return c10::DataPtr(block->ptr, block->ptr, &raw_delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != used_.end(), "openreg host allocator: unknown pointer");
    free_[it->second->size].push_back(it->second);
    used_.erase(it);
  }

  void record(void* ptr, OpenRegStream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(ptr);
    if (it == used_.end()) return;
    orEvent_t event = nullptr;
    OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
    OPENREG_CHECK(orEventRecord(event, stream.handle()));
    it->second->events.push_back(event);
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, list] : free_) {
      for (HostBlock* b : list) {
        for (orEvent_t e : b->events) {
          orEventSynchronize(e);
          orEventDestroy(e);
        }
        orFreeHost(b->ptr);
        delete b;
      }
      list.clear();
    }
  }

 private:
  static void raw_delete(void* ptr);

  // True when every async copy that used the block has completed.
  static bool ready(HostBlock* b) {
    for (auto it = b->events.begin(); it != b->events.end();) {
      if (orEventQuery(*it) == orErrorNotReady) return false;
      orEventDestroy(*it);
      it = b->events.erase(it);
    }
    return true;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<HostBlock*>> free_;
  std::unordered_map<void*, HostBlock*> used_;
};

HostCache g_host;

void HostCache::raw_delete(void* ptr) {
  if (ptr != nullptr) g_host.free(ptr);
}

}  // namespace

c10::Allocator* get() { return &g_host; }

bool is_pinned(const void* ptr) {
  orPointerAttributes attr;
  return ptr != nullptr && orPointerGetAttributes(&attr, ptr) == orSuccess && attr.type == orMemoryTypeHost;
}

void record_stream(void* ctx, OpenRegStream stream) { g_host.record(ctx, stream); }
void empty_cache() { g_host.empty(); }

}  // namespace c10::openreg::host_allocator
