#include "OpenRegGuard.h"

#include "OpenRegCachingAllocator.h"
#include "OpenRegException.h"
#include "OpenRegFunctions.h"
#include "OpenRegStream.h"

namespace c10::openreg {

c10::Device OpenRegGuardImpl::exchangeDevice(c10::Device d) const {
  TORCH_INTERNAL_ASSERT(d.is_privateuseone());
  return c10::Device(static_type, exchange_device(d.index()));
}

c10::Device OpenRegGuardImpl::getDevice() const { return c10::Device(static_type, current_device()); }

void OpenRegGuardImpl::setDevice(c10::Device d) const {
  TORCH_INTERNAL_ASSERT(d.is_privateuseone());
  set_device(d.index());
}

// Guards restore the device on exit, mostly to the one that is already current.
void OpenRegGuardImpl::uncheckedSetDevice(c10::Device d) const noexcept {
  int current = -1;
  if (orGetDevice(&current) != orSuccess || current != d.index()) orSetDevice(d.index());
}

c10::Stream OpenRegGuardImpl::getStream(c10::Device d) const { return getCurrentOpenRegStream(d.index()).unwrap(); }

c10::Stream OpenRegGuardImpl::getDefaultStream(c10::Device d) const {
  return getDefaultOpenRegStream(d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const {
  return getStreamFromPool(isHighPriority ? -1 : 0, d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::getNewStream(c10::Device d, int priority) const {
  return getStreamFromPool(priority, d.index()).unwrap();
}

c10::Stream OpenRegGuardImpl::exchangeStream(c10::Stream s) const {
  OpenRegStream stream(s);
  auto previous = getCurrentOpenRegStream(s.device_index());
  setCurrentOpenRegStream(stream);
  return previous.unwrap();
}

void* OpenRegGuardImpl::getStreamNativeHandle(const c10::Stream s) const { return OpenRegStream(s).handle(); }

c10::DeviceIndex OpenRegGuardImpl::deviceCount() const noexcept { return device_count(); }

c10::DeviceCapability OpenRegGuardImpl::getDeviceCapability(c10::Device d) const {
  check_device_index(d.index());
  return c10::DeviceCapability();  // every dtype: kernels run the CPU implementation
}

// Events are created lazily at first record, on the stream's device.
void OpenRegGuardImpl::record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
                              const c10::EventFlag flag) const {
  TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
              static_cast<int>(device_index), " does not match recording stream's device index ",
              static_cast<int>(stream.device_index()), ".");
  OpenRegStream s(stream);
  if (*event == nullptr) {
    orEvent_t e = nullptr;
    // As on CUDA, PyTorch's internal events skip timing; torch.Event asks for it.
    OPENREG_CHECK(
        orEventCreateWithFlags(&e, flag == c10::EventFlag::BACKEND_DEFAULT ? orEventDefault : orEventDisableTiming));
    *event = e;
  }
  OPENREG_CHECK(orEventRecord(static_cast<orEvent_t>(*event), s.handle()));
}

void OpenRegGuardImpl::block(void* event, const c10::Stream& stream) const {
  if (event == nullptr) return;
  OPENREG_CHECK(orStreamWaitEvent(OpenRegStream(stream).handle(), static_cast<orEvent_t>(event), 0));
}

bool OpenRegGuardImpl::queryEvent(void* event) const {
  if (event == nullptr) return true;
  orStatus st = orEventQuery(static_cast<orEvent_t>(event));
  if (st == orErrorNotReady) return false;
  OPENREG_CHECK(st);
  int device = -1;  // a failure pending on the record's device is reported, as OpenRegStream::query does
  OPENREG_CHECK(orEventGetDevice(static_cast<orEvent_t>(event), &device));
  if (device >= 0) OPENREG_CHECK(orDeviceTakeError(device));
  return true;
}

void OpenRegGuardImpl::destroyEvent(void* event, const c10::DeviceIndex) const noexcept {
  if (event != nullptr) orEventDestroy(static_cast<orEvent_t>(event));
}

void OpenRegGuardImpl::synchronizeEvent(void* event) const {
  if (event != nullptr) OPENREG_CHECK(orEventSynchronize(static_cast<orEvent_t>(event)));
}

double OpenRegGuardImpl::elapsedTime(void* start, void* end, const c10::DeviceIndex) const {
  TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
  float ms = 0;
  OPENREG_CHECK(orEventElapsedTime(&ms, static_cast<orEvent_t>(start), static_cast<orEvent_t>(end)));
  return ms;
}

bool OpenRegGuardImpl::queryStream(const c10::Stream& stream) const { return OpenRegStream(stream).query(); }

void OpenRegGuardImpl::synchronizeStream(const c10::Stream& stream) const { OpenRegStream(stream).synchronize(); }

// torch.Stream.is_capturing() (the interface's default answers false, also mid-capture).
bool OpenRegGuardImpl::isStreamCapturing(const c10::Stream& stream) const {
  int capturing = 0;
  OPENREG_CHECK(orStreamIsCapturing(OpenRegStream(stream).handle(), &capturing));
  return capturing != 0;
}

void OpenRegGuardImpl::synchronizeDevice(const c10::DeviceIndex device_index) const {
  const auto previous = exchange_device(device_index < 0 ? current_device() : device_index);
  orStatus st = orDeviceSynchronize();
  exchange_device(previous);
  OPENREG_CHECK(st);
}

void OpenRegGuardImpl::recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const {
  allocator::recordStream(data_ptr, OpenRegStream(stream));
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, OpenRegGuardImpl);

}  // namespace c10::openreg
