// Status names and the per-thread detailed error message.
#include "runtime_internal.h"

namespace openreg::rt {

namespace {
thread_local std::string t_last_error;
}

orStatus fail(orStatus status, const std::string& message) {
  t_last_error = std::string(orGetErrorName(status)) + ": " + message;
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

const char* orGetLastErrorMessage(void) { return openreg::rt::t_last_error.c_str(); }

}  // extern "C"
