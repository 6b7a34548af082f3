// Turning runtime statuses into PyTorch errors.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <c10/util/env.h>

#include <string>

#include "openreg/runtime.h"

namespace c10::openreg {

// The runtime's message for the call that just failed. A kernel that failed with a c10::Error
// reported its what(), which ends in a C++ backtrace; Python shows PyTorch's own errors without
// theirs unless TORCH_SHOW_CPP_STACKTRACES=1, and so does this.
inline std::string last_error_message() {
  std::string msg = orGetLastErrorMessage();
  const size_t backtrace = msg.find("\nException raised from ");
  if (backtrace != std::string::npos && !c10::utils::check_env("TORCH_SHOW_CPP_STACKTRACES").value_or(false))
    msg.erase(backtrace);
  return msg;
}

}  // namespace c10::openreg

// Checks an orStatus; on failure raises with the runtime's detailed message
// (it names the device, sizes and limits). Out of memory becomes
// torch.OutOfMemoryError, anything else RuntimeError.
#define OPENREG_CHECK(expr)                                                                     \
  do {                                                                                          \
    orStatus __or_status = (expr);                                                              \
    if (C10_UNLIKELY(__or_status != orSuccess)) {                                               \
      const std::string __or_message = ::c10::openreg::last_error_message();                    \
      TORCH_CHECK_WITH(OutOfMemoryError, __or_status != orErrorMemoryAllocation, __or_message); \
      TORCH_CHECK(false, __or_message);                                                         \
    }                                                                                           \
  } while (0)

namespace c10::openreg {

// For the allocators' own waits (freeing cached memory): such a wait is a synchronising call, so it
// returns a failed kernel's error, once. The first one is kept while the cleanup goes on, then
// raised, so that neither the user's error nor the rest of the cleanup is lost.
class FirstFailure {
 public:
  void note(orStatus st) {
    if (st == orSuccess || status_ != orSuccess) return;
    status_ = st;
    message_ = last_error_message();
  }
  void note(const FirstFailure& other) {
    if (status_ != orSuccess) return;
    status_ = other.status_;
    message_ = other.message_;
  }
  void raise() const {
    if (status_ == orSuccess) return;
    TORCH_CHECK_WITH(OutOfMemoryError, status_ != orErrorMemoryAllocation, message_);
    TORCH_CHECK(false, message_);
  }

 private:
  orStatus status_ = orSuccess;
  std::string message_;
};

// The error CPU and CUDA give when an operator's tensors are on two devices; `op` names the operator.
template <typename Op>
void check_same_device(const c10::Device& a, const c10::Device& b, const Op& op) {
  TORCH_CHECK(a == b, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
              "! (in ", op, ")");
}

}  // namespace c10::openreg
