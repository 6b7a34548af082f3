// Status names and the per-thread detailed error message.
#include <algorithm>
#include <cstring>

#include "runtime_internal.h"

namespace openreg::rt {

namespace {
// A plain buffer, not a std::string: the main thread's thread-locals are destroyed before the
// static destructors run, and those may still call the runtime (a forked child's exit asks it
// whether it is a forked child, which fails: c10::openreg::in_forked_child). Writing the destroyed
// string corrupted the heap. Room for a kernel's failure with a Python traceback; longer messages
// are cut.
constexpr size_t kMaxMessage = 16384;
thread_local char t_last_error[kMaxMessage];
}  // namespace

orStatus fail(orStatus status, const std::string& message) {
  const std::string full = std::string(orGetErrorName(status)) + ": " + message;
  const size_t n = std::min(full.size(), kMaxMessage - 1);
  std::memcpy(t_last_error, full.data(), n);
  t_last_error[n] = '\0';
  return status;
}

}  // namespace openreg::rt

extern "C" {

const char* orGetErrorName(orStatus status) {
  switch (status) {
    case orSuccess:
      return "orSuccess";
    case orErrorNotReady:
      return "orErrorNotReady";
    case orErrorInvalidValue:
      return "orErrorInvalidValue";
    case orErrorInvalidDevice:
      return "orErrorInvalidDevice";
    case orErrorMemoryAllocation:
      return "orErrorMemoryAllocation";
    case orErrorInvalidDevicePointer:
      return "orErrorInvalidDevicePointer";
    case orErrorInvalidResourceHandle:
      return "orErrorInvalidResourceHandle";
    case orErrorInvalidMemcpyDirection:
      return "orErrorInvalidMemcpyDirection";
    case orErrorNotPermitted:
      return "orErrorNotPermitted";
    case orErrorLaunchFailure:
      return "orErrorLaunchFailure";
    case orErrorForkedProcess:
      return "orErrorForkedProcess";
    case orErrorInitialization:
      return "orErrorInitialization";
    case orErrorStreamCaptureUnsupported:
      return "orErrorStreamCaptureUnsupported";
    case orErrorNotSupported:
      return "orErrorNotSupported";
  }
  return "orErrorUnknown";
}

const char* orGetLastErrorMessage(void) { return openreg::rt::t_last_error; }

}  // extern "C"
