// Sharing device memory between processes (orIpc*).
//
// A device's memory is one OS object mapped twice (platform.h). A handle names
// an allocation by its exporter (process, start time, the object's handle and
// identity) and its place in the object; the importer reaches the object
// through the exporter (openreg::platform::import_mapping), maps the allocation's pages
// twice like an arena, and records the range so that copies, attributes and
// orKernelPointer treat it as memory of the same device index.
#include <cstring>

#include "runtime_internal.h"

namespace openreg::rt {

namespace {

constexpr char kMagic[8] = {'o', 'r', 'i', 'p', 'c', 0, 0, 1};

struct Payload {
  char magic[8];
  int32_t device;
  int32_t reserved;
  uint64_t offset;  // of the allocation in the device's object
  uint64_t size;
  openreg::platform::ShareToken token;
};
static_assert(sizeof(Payload) <= OR_IPC_HANDLE_SIZE, "IPC payload must fit in orIpcMemHandle_t");

std::string import_key(const Payload& p) {
  return std::to_string(p.token.pid) + "/" + std::to_string(p.token.process_start) + "/" +
         std::to_string(p.token.object) + "/" + std::to_string(p.offset) + "/" + std::to_string(p.size);
}

}  // namespace

bool find_import(const void* ptr, ImportedRange* out) {
  Runtime& rt = runtime();
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(rt.imports_mu);
  auto it = rt.imports.upper_bound(p);
  if (it == rt.imports.begin()) return false;
  --it;
  const Import& imp = it->second;
  auto base = reinterpret_cast<uintptr_t>(imp.base);
  if (p < base || p >= base + imp.size) return false;
  out->device = imp.device;
  out->base = imp.base;
  out->size = imp.size;
  out->kernel_base = imp.mapping.kernel_view + (imp.base - imp.mapping.device_view);
  return true;
}

}  // namespace openreg::rt

using namespace openreg::rt;

extern "C" {

orStatus orIpcGetMemHandle(orIpcMemHandle_t* handle, void* dev_ptr) {
  if (handle == nullptr) return fail(orErrorInvalidValue, "handle is NULL");
  if (orStatus st = check_runtime()) return st;
  orPointerAttributes attr;
  if (orStatus st = orPointerGetAttributes(&attr, dev_ptr)) return st;
  if (attr.type != orMemoryTypeDevice) return fail(orErrorInvalidDevicePointer, "pointer is not openreg device memory");
  Device* dev = device_of(attr.base);
  if (dev == nullptr) {  // opened from another process: hand on the handle it came with
    Runtime& rt = runtime();
    std::lock_guard<std::mutex> lock(rt.imports_mu);
    for (const auto& [start, imp] : rt.imports) {
      if (imp.base == attr.base) {
        *handle = imp.handle;
        return orSuccess;
      }
    }
    return fail(orErrorInvalidDevicePointer, "the imported memory was closed concurrently");
  }
  Payload p{};
  std::memcpy(p.magic, kMagic, sizeof(kMagic));
  p.device = dev->index;
  p.offset = static_cast<char*>(attr.base) - dev->arena.device_view;
  p.size = attr.size;
  std::string error;
  if (!openreg::platform::export_mapping(dev->arena, &p.token, &error)) return fail(orErrorNotSupported, error);
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &p, sizeof(p));
  return orSuccess;
}

orStatus orIpcOpenMemHandle(void** dev_ptr, orIpcMemHandle_t handle) {
  if (dev_ptr == nullptr) return fail(orErrorInvalidValue, "dev_ptr is NULL");
  *dev_ptr = nullptr;
  if (orStatus st = check_runtime()) return st;
  Payload p;
  std::memcpy(&p, handle.reserved, sizeof(p));
  if (std::memcmp(p.magic, kMagic, sizeof(kMagic)) != 0 || p.size == 0)
    return fail(orErrorInvalidValue, "not an openreg IPC memory handle (or one from another runtime version)");
  if (p.token.pid == openreg::platform::current_pid())
    return fail(orErrorInvalidValue, "this IPC handle was made by this process: use the device pointer itself");
  Device* dev = nullptr;
  if (orStatus st = get_device(p.device, &dev)) return st;

  Runtime& rt = runtime();
  const std::string key = import_key(p);
  auto reuse = [&]() -> bool {  // the same handle opened before: count it again
    for (auto& [start, imp] : rt.imports) {
      if (imp.key == key) {
        ++imp.refs;
        *dev_ptr = imp.base;
        return true;
      }
    }
    return false;
  };
  {
    std::lock_guard<std::mutex> lock(rt.imports_mu);
    if (reuse()) return orSuccess;
  }
  // Map without the lock (it reads /proc and maps memory); a concurrent open of the same
  // handle may win the race, and then this mapping is dropped.
  const size_t page = openreg::platform::page_size();
  const size_t first = p.offset / page * page;
  const size_t last = (p.offset + p.size + page - 1) / page * page;
  Import imp;
  std::string error;
  if (!openreg::platform::import_mapping(p.token, first, last - first, &imp.mapping, &error))
    return fail(orErrorInvalidValue, "cannot open openreg IPC handle: " + error);
  imp.base = imp.mapping.device_view + (p.offset - first);
  imp.size = p.size;
  imp.device = p.device;
  imp.refs = 1;
  imp.key = key;
  imp.handle = handle;
  std::lock_guard<std::mutex> lock(rt.imports_mu);
  if (reuse()) {
    openreg::platform::unmap(imp.mapping);
    return orSuccess;
  }
  *dev_ptr = imp.base;
  rt.imports.emplace(reinterpret_cast<uintptr_t>(imp.mapping.device_view), std::move(imp));
  return orSuccess;
}

orStatus orIpcCloseMemHandle(void* dev_ptr) {
  if (orStatus st = check_runtime()) return st;
  Runtime& rt = runtime();
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(rt.imports_mu);
    for (auto& [start, imp] : rt.imports)
      if (imp.base == dev_ptr) device = imp.device;
  }
  if (device < 0) return fail(orErrorInvalidDevicePointer, "pointer was not returned by orIpcOpenMemHandle");
  Device* dev = nullptr;
  if (orStatus st = get_device(device, &dev)) return st;
  if (orStatus st = refuse_wait_from_kernel("orIpcCloseMemHandle", nullptr)) return st;
  wait_for_all_devices();  // as orFree: queued work, on any device, may still use the memory
  std::lock_guard<std::mutex> lock(rt.imports_mu);
  for (auto it = rt.imports.begin(); it != rt.imports.end(); ++it) {
    if (it->second.base != dev_ptr) continue;
    if (--it->second.refs == 0) {
      openreg::platform::unmap(it->second.mapping);
      rt.imports.erase(it);
    }
    return orSuccess;
  }
  return fail(orErrorInvalidDevicePointer, "pointer was closed concurrently");
}

}  // extern "C"
