// PrivateUse1 hooks: what ATen asks of the backend outside of operators
// (availability, generators, pinned memory, device of a pointer, storage
// resize). Registered at load time of libtorch_openreg.
#include "OpenRegHooks.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include "OpenRegException.h"
#include "OpenRegFunctions.h"
#include "OpenRegGenerator.h"
#include "OpenRegHostAllocator.h"

namespace c10::openreg {

namespace {

struct OpenRegHooksInterface final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  void init() const override {
    int count = 0;
    OPENREG_CHECK(orGetDeviceCount(&count));
  }
  bool hasPrimaryContext(c10::DeviceIndex device) const override { return device >= 0 && device < device_count(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override { return exchange_device(device); }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchange_device(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }

  at::Device getDeviceFromPtr(void* data) const override {
    orPointerAttributes attr;
    OPENREG_CHECK(orPointerGetAttributes(&attr, data));
    TORCH_CHECK(attr.type == orMemoryTypeDevice, "pointer ", data, " is not openreg device memory");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(attr.device));
  }

  bool isPinnedPtr(const void* data) const override { return host_allocator::is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return host_allocator::get(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), new_bytes);
  }
};

struct Registrar {
  Registrar() { at::RegisterPrivateUse1HooksInterface(new OpenRegHooksInterface()); }
} g_registrar;

}  // namespace
}  // namespace c10::openreg
