#include "OpenRegFunctions.h"

#include <c10/util/Exception.h>

#include "OpenRegException.h"

namespace c10::openreg {

namespace {
struct DeviceCount {
  c10::DeviceIndex n = 0;
  std::string error;  // why there is no device, when the runtime refused
};

const DeviceCount& counted() {
  // Fixed for the life of the process (the environment is read once).
  static const DeviceCount count = [] {
    DeviceCount c;
    int n = 0;
    if (orGetDeviceCount(&n) == orSuccess)
      c.n = static_cast<c10::DeviceIndex>(n);
    else
      c.error = orGetLastErrorMessage();
    return c;
  }();
  return count;
}
}  // namespace

c10::DeviceIndex device_count() noexcept { return counted().n; }
const std::string& device_count_error() { return counted().error; }

void check_device_index(int64_t device) {
  const auto count = device_count();
  TORCH_CHECK(device >= 0 && device < count, "Invalid openreg device index ", device, ": there are ",
              static_cast<int>(count), " openreg devices (valid indices 0..", static_cast<int>(count) - 1,
              "; OPENREG_DEVICE_COUNT sets the count)");
}

c10::DeviceIndex current_device() {
  int device = 0;
  OPENREG_CHECK(orGetDevice(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  OPENREG_CHECK(orSetDevice(device));
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  const auto previous = current_device();
  if (device != previous) set_device(device);
  return previous;
}

bool in_forked_child() noexcept {
  int device = 0;
  return orGetDevice(&device) == orErrorForkedProcess;
}

void check_not_forked_child() {
  int device = 0;
  if (in_forked_child()) OPENREG_CHECK(orGetDevice(&device));
}

}  // namespace c10::openreg
