// Device memory, pinned host memory, copies and memsets.
//
// Each device's memory is one arena (see platform.h) carved by a first-fit
// allocator with 512-byte granularity. Freed blocks coalesce with their
// neighbours, and the whole pages they cover are given back to the OS, so a
// device's resident size follows what is allocated. The caching allocator of
// the PyTorch layer sits on top, so this path is not hot.
//
// Copies and memsets are work items on a stream, like kernels. A copy that
// touches pageable host memory completes before the call returns (the host
// buffer may be reused right after); one with pinned or device memory only
// is asynchronous.
#include <cstdint>
#include <cstring>
#include <sstream>

#include "runtime_internal.h"

namespace openreg::rt {

namespace {

constexpr size_t kAlignment = 512;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

std::string hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

std::string mib(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return os.str();
}

// Where a pointer lives, for copies and attributes.
struct Location {
  orMemoryType type = orMemoryTypeUnregistered;
  Device* device = nullptr;
  uintptr_t base = 0;
  size_t size = 0;
  char* kernel_base = nullptr;  // device memory: the allocation's start in the kernel view
};

// Classifies [ptr, ptr+count). Device ranges must lie inside one live allocation.
orStatus locate(const void* ptr, size_t count, Location* loc) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  if (Device* dev = device_of(ptr)) {
    std::lock_guard<std::mutex> lock(dev->mem_mu);
    size_t off = p - reinterpret_cast<uintptr_t>(dev->arena.device_view);
    auto it = dev->live_blocks.upper_bound(off);
    if (it == dev->live_blocks.begin() || (--it, off >= it->first + it->second))
      return fail(orErrorInvalidDevicePointer, "pointer " + hex(ptr) + " on openreg device " +
                                                   std::to_string(dev->index) + " is not inside a live allocation");
    if (count > it->second - (off - it->first))  // not off + count: a huge count wraps around
      return fail(orErrorInvalidValue, "range of " + std::to_string(count) + " bytes at " + hex(ptr) +
                                           " runs past the end of its allocation of " + std::to_string(it->second) +
                                           " bytes");
    loc->type = orMemoryTypeDevice;
    loc->device = dev;
    loc->base = reinterpret_cast<uintptr_t>(dev->arena.device_view) + it->first;
    loc->size = it->second;
    loc->kernel_base = dev->arena.kernel_view + it->first;
    return orSuccess;
  }
  ImportedRange imp;
  if (find_import(ptr, &imp)) {  // another process's memory, opened from an IPC handle
    if (count > imp.size - (p - reinterpret_cast<uintptr_t>(imp.base)))
      return fail(orErrorInvalidValue, "range of " + std::to_string(count) + " bytes at " + hex(ptr) +
                                           " runs past the end of its allocation of " + std::to_string(imp.size) +
                                           " bytes");
    Device* dev = nullptr;
    if (orStatus st = get_device(imp.device, &dev)) return st;
    loc->type = orMemoryTypeDevice;
    loc->device = dev;
    loc->base = reinterpret_cast<uintptr_t>(imp.base);
    loc->size = imp.size;
    loc->kernel_base = imp.kernel_base;
    return orSuccess;
  }
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.host_mu);
  auto it = rt.host_blocks.upper_bound(p);
  if (it != rt.host_blocks.begin() && (--it, p < it->first + it->second) && count <= it->first + it->second - p) {
    loc->type = orMemoryTypeHost;
    loc->base = it->first;
    loc->size = it->second;
  }
  return orSuccess;
}

char* kernel_address(const Location& loc, const void* ptr) {
  if (loc.type != orMemoryTypeDevice) return static_cast<char*>(const_cast<void*>(ptr));
  return loc.kernel_base + (reinterpret_cast<uintptr_t>(ptr) - loc.base);
}

constexpr size_t kCopyOnCallerMaxBytes = size_t{1} << 20;

struct CopyArgs {
  char* dst;
  const char* src;
  size_t count;
  const char* fault = nullptr;  // an injected failure's message (see faults.cpp)
};

orStatus copy_kernel(void* p) {
  auto* a = static_cast<CopyArgs*>(p);
  std::memcpy(a->dst, a->src, a->count);
  return orSuccess;
}

orStatus failed_copy_kernel(void* p) { return orKernelFail(static_cast<CopyArgs*>(p)->fault); }

struct SetArgs {
  char* dst;
  int value;
  size_t count;
};

orStatus set_kernel(void* p) {
  auto* a = static_cast<SetArgs*>(p);
  std::memset(a->dst, a->value, a->count);
  return orSuccess;
}

template <typename T>
void delete_args(void* p) {
  delete static_cast<T*>(p);
}

// Enqueues a copy. `blocking`: wait for it; `sync`: also report device errors.
orStatus copy(void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream, bool sync) {
  if (orStatus st = check_runtime()) return st;
  if (kind < orMemcpyHostToHost || kind > orMemcpyDefault)
    return fail(orErrorInvalidMemcpyDirection, "unknown copy kind " + std::to_string(static_cast<int>(kind)));
  if (count == 0) return orSuccess;
  if (dst == nullptr || src == nullptr) return fail(orErrorInvalidValue, "NULL pointer in memcpy");
  Location d, s;
  if (orStatus st = locate(dst, count, &d)) return st;
  if (orStatus st = locate(src, count, &s)) return st;
  const bool dd = d.type == orMemoryTypeDevice, sd = s.type == orMemoryTypeDevice;
  orMemcpyKind actual =
      dd ? (sd ? orMemcpyDeviceToDevice : orMemcpyHostToDevice) : (sd ? orMemcpyDeviceToHost : orMemcpyHostToHost);
  if (kind != orMemcpyDefault && kind != actual)
    return fail(orErrorInvalidMemcpyDirection, std::string("the pointers describe a ") +
                                                   (actual == orMemcpyHostToHost     ? "host-to-host"
                                                    : actual == orMemcpyHostToDevice ? "host-to-device"
                                                    : actual == orMemcpyDeviceToHost ? "device-to-host"
                                                                                     : "device-to-device") +
                                                   " copy, which does not match the requested kind");
  Stream* str = nullptr;
  if (orStatus st = resolve_stream(stream, &str)) return st;
  const bool pageable = (!dd && d.type == orMemoryTypeUnregistered) || (!sd && s.type == orMemoryTypeUnregistered);
  const bool blocking = sync || pageable;  // the call returns once the copy is done
  if (blocking) {
    if (orStatus st = refuse_while_capturing(
            *str,
            "a copy that must finish before the call returns (synchronous, or to/from pageable host memory) "
            "cannot be captured into a graph; use pinned memory and an asynchronous copy"))
      return st;
    if (orStatus st = refuse_wait_from_kernel("orMemcpy", str)) return st;
  }
  Counters& c = runtime().counters;
  switch (actual) {
    case orMemcpyHostToDevice:
      c.h2d++;
      c.bytes_h2d += count;
      break;
    case orMemcpyDeviceToHost:
      c.d2h++;
      c.bytes_d2h += count;
      break;
    case orMemcpyDeviceToDevice:
      c.d2d++;
      c.bytes_d2d += count;
      break;
    default:
      break;
  }
  // A blocking copy that finds its stream idle runs on the calling thread: nothing is queued before
  // it, and the stream's lock keeps launches out until it is done, so stream order holds. It saves
  // waking the worker and then the caller, about 50 us on the 2-core VM once the worker has gone to
  // sleep, against about 2 us for a small copy (`.item()`, `.cpu()` of a loss, torch.save's
  // storages). Small copies only: a large one would keep other threads' launches waiting, and the
  // wake-ups are small beside it. Not while faults or tracing are armed: they act on queued items.
  char* const to = kernel_address(d, dst);
  const char* const from = kernel_address(s, src);
  if (blocking && count <= kCopyOnCallerMaxBytes && !g_faults_armed.load(std::memory_order_relaxed) &&
      !g_tracing.load(std::memory_order_relaxed)) {
    if (str->run_if_idle([&] { std::memcpy(to, from, count); })) {
      c.copies_on_caller.fetch_add(1, std::memory_order_relaxed);
      return blocking ? take_device_error(runtime().devices[str->device]) : orSuccess;
    }
  }
  WorkItem item;
  item.fn = copy_kernel;
  item.args = new CopyArgs{to, from, count};
  item.deleter = delete_args<CopyArgs>;
  item.name = "openreg::memcpy";
  if (g_faults_armed.load(std::memory_order_relaxed))
    if (const char* fault = fault_on_copy(*str)) {
      static_cast<CopyArgs*>(item.args)->fault = fault;
      item.fn = failed_copy_kernel;
    }
  uint64_t seq = str->enqueue(item);
  if (seq == Stream::kRefused) return fail(orErrorInvalidResourceHandle, "the stream was destroyed");
  if (!blocking) return finish_launch(*str, seq);  // OPENREG_LAUNCH_BLOCKING: a copy too
  str->completed.wait_for(seq);
  return take_device_error(runtime().devices[str->device]);
}

orStatus set(void* dev_ptr, int value, size_t count, orStream_t stream, bool sync) {
  if (orStatus st = check_runtime()) return st;
  if (count == 0) return orSuccess;
  Location d;
  if (orStatus st = locate(dev_ptr, count, &d)) return st;
  if (d.type != orMemoryTypeDevice) return fail(orErrorInvalidDevicePointer, "memset needs device memory");
  Stream* str = nullptr;
  if (orStatus st = resolve_stream(stream, &str)) return st;
  if (sync) {
    if (orStatus st = refuse_while_capturing(*str, "a synchronous memset cannot be captured into a graph")) return st;
    if (orStatus st = refuse_wait_from_kernel("orMemset", str)) return st;
  }
  WorkItem item;
  item.fn = set_kernel;
  item.args = new SetArgs{kernel_address(d, dev_ptr), value, count};
  item.deleter = delete_args<SetArgs>;
  item.name = "openreg::memset";
  uint64_t seq = str->enqueue(item);
  if (seq == Stream::kRefused) return fail(orErrorInvalidResourceHandle, "the stream was destroyed");
  if (!sync) return finish_launch(*str, seq);
  str->completed.wait_for(seq);
  return take_device_error(runtime().devices[str->device]);
}

}  // namespace
}  // namespace openreg::rt

using namespace openreg::rt;

extern "C" {

orStatus orMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(orErrorInvalidValue, "ptr is NULL");
  *ptr = nullptr;
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = current_device(&dev)) return st;
  if (size == 0) return orSuccess;
  if (g_faults_armed.load(std::memory_order_relaxed))
    if (orStatus st = fault_on_malloc(dev->index)) return st;
  const size_t requested = size;                           // the message names it, not the clamped size
  if (size > dev->arena.size) size = dev->arena.size + 1;  // fails below, without overflow
  const size_t need = round_up(size, kAlignment);
  std::lock_guard<std::mutex> lock(dev->mem_mu);
  size_t largest = 0;
  for (auto it = dev->free_blocks.begin(); it != dev->free_blocks.end(); ++it) {
    if (it->second < need) {
      largest = std::max(largest, it->second);
      continue;
    }
    const size_t off = it->first, block = it->second;
    dev->free_blocks.erase(it);
    if (block > need) dev->free_blocks[off + need] = block - need;
    dev->live_blocks[off] = need;
    dev->allocated += need;
    runtime().counters.mallocs++;
    *ptr = dev->arena.device_view + off;
    return orSuccess;
  }
  return fail(orErrorMemoryAllocation,
              "out of memory on openreg device " + std::to_string(dev->index) + ": tried to allocate " +
                  mib(requested > dev->arena.size ? requested : need) + "; " + mib(dev->allocated) + " allocated, " +
                  mib(largest) + " largest free block, " + mib(dev->arena.size) +
                  " capacity (set OPENREG_DEVICE_MEMORY to change it)");
}

orStatus orFree(void* ptr) {
  if (ptr == nullptr) return orSuccess;
  if (orStatus st = check_runtime()) return st;
  Device* dev = device_of(ptr);
  ImportedRange imported;
  if (dev == nullptr && find_import(ptr, &imported))
    return fail(orErrorInvalidDevicePointer,
                "pointer " + hex(ptr) + " was opened from an IPC handle: release it with orIpcCloseMemHandle");
  if (dev == nullptr) return fail(orErrorInvalidDevicePointer, "pointer " + hex(ptr) + " is not openreg device memory");
  // As cudaFree: queued work may still use the memory, also on another device's streams (a
  // device-to-device copy queued there reads or writes it).
  if (orStatus st = refuse_wait_from_kernel("orFree", nullptr)) return st;
  wait_for_all_devices();
  std::lock_guard<std::mutex> lock(dev->mem_mu);
  size_t off = static_cast<char*>(ptr) - dev->arena.device_view;
  auto live = dev->live_blocks.find(off);
  if (live == dev->live_blocks.end())
    return fail(orErrorInvalidDevicePointer,
                "pointer " + hex(ptr) + " is not the start of a live allocation on openreg device " +
                    std::to_string(dev->index) + " (freed twice, or not returned by orMalloc)");
  const size_t size = live->second;
  dev->live_blocks.erase(live);
  dev->allocated -= size;
  runtime().counters.frees++;
  // Coalesce with free neighbours.
  size_t start = off, end = off + size;
  auto next = dev->free_blocks.lower_bound(off);
  if (next != dev->free_blocks.end() && next->first == end) {
    end += next->second;
    next = dev->free_blocks.erase(next);
  }
  if (next != dev->free_blocks.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      dev->free_blocks.erase(prev);
    }
  }
  dev->free_blocks[start] = end - start;
  // Return the pages that are now wholly free and that this block touched.
  const size_t page = openreg::platform::page_size();
  const size_t lo = std::max(round_up(start, page), off / page * page);
  const size_t hi = std::min(end / page * page, round_up(off + size, page));
  if (hi > lo) openreg::platform::release_pages(dev->arena, lo, hi - lo);
  return orSuccess;
}

orStatus orMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(orErrorInvalidValue, "ptr is NULL");
  *ptr = nullptr;
  if (orStatus st = check_runtime()) return st;
  if (size == 0) return orSuccess;
  const size_t page = openreg::platform::page_size();
  const size_t bytes = size > SIZE_MAX - page ? 0 : round_up(size, page);  // 0: rounding would wrap
  void* p = bytes == 0 ? nullptr : openreg::platform::host_alloc(bytes);
  if (p == nullptr) return fail(orErrorMemoryAllocation, "cannot allocate " + mib(size) + " of pinned host memory");
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.host_mu);
  rt.host_blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return orSuccess;
}

orStatus orFreeHost(void* ptr) {
  if (ptr == nullptr) return orSuccess;
  if (orStatus st = check_runtime()) return st;
  Runtime& rt = runtime();
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(rt.host_mu);
    auto it = rt.host_blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == rt.host_blocks.end())
      return fail(orErrorInvalidValue,
                  "pointer " + hex(ptr) + " is not pinned memory from orMallocHost (freed twice?)");
    if (orStatus st = refuse_wait_from_kernel("orFreeHost", nullptr)) return st;
    bytes = it->second;
    rt.host_blocks.erase(it);
  }
  wait_for_all_devices();  // asynchronous copies may still read or write the buffer
  openreg::platform::host_free(ptr, bytes);
  return orSuccess;
}

orStatus orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, /*sync=*/true);
}

orStatus orMemcpyAsync(void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream) {
  return copy(dst, src, count, kind, stream, /*sync=*/false);
}

orStatus orMemset(void* dev_ptr, int value, size_t count) { return set(dev_ptr, value, count, nullptr, /*sync=*/true); }

orStatus orMemsetAsync(void* dev_ptr, int value, size_t count, orStream_t stream) {
  return set(dev_ptr, value, count, stream, /*sync=*/false);
}

orStatus orPointerGetAttributes(orPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return fail(orErrorInvalidValue, "attr is NULL");
  if (orStatus st = check_runtime()) return st;
  Location loc;
  if (orStatus st = locate(ptr, 0, &loc)) return st;
  attr->type = loc.type;
  attr->device = loc.device ? loc.device->index : -1;
  attr->base = reinterpret_cast<void*>(loc.base);
  attr->size = loc.size;
  return orSuccess;
}

orStatus orMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = current_device(&dev)) return st;
  std::lock_guard<std::mutex> lock(dev->mem_mu);
  if (free_bytes) *free_bytes = dev->arena.size - dev->allocated;
  if (total_bytes) *total_bytes = dev->arena.size;
  return orSuccess;
}

orStatus orDeviceGetResidentBytes(size_t* bytes) {
  if (bytes == nullptr) return fail(orErrorInvalidValue, "bytes is NULL");
  if (orStatus st = check_runtime()) return st;
  Device* dev = nullptr;
  if (orStatus st = current_device(&dev)) return st;
  *bytes = openreg::platform::resident_bytes(dev->arena, 0, dev->arena.size);
  return orSuccess;
}

}  // extern "C"
