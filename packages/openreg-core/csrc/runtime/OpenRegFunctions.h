// Device management for the PyTorch layer: thin, checked wrappers over the
// runtime's device calls, in c10 types.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace c10::openreg {

c10::DeviceIndex device_count() noexcept;  // 0 if the runtime is unusable
// Why device_count() is 0: the runtime's message (a malformed OPENREG_* variable), or "".
const std::string& device_count_error();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
c10::DeviceIndex exchange_device(c10::DeviceIndex device);
// Raises a clear error unless 0 <= device < device_count().
void check_device_index(int64_t device);  // wide: an index from Python is checked before any narrowing
// Ends every graph capture still open (their streams stop capturing, as reset() of each would),
// so that a program exiting with one open can wait for its queued work (OpenRegGraph.cpp). Returns
// how many there were.
size_t abandon_open_captures();
// In a child forked after the parent used the runtime, which refuses every call there. Such a
// child must not take the PyTorch layer's locks either: a parent thread may have held one at the
// fork, and nothing in the child will ever release it (lazy-init-fork.md). Asking starts nothing.
bool in_forked_child() noexcept;
// Raises the runtime's refusal (orErrorForkedProcess, naming 'spawn') in such a child, before a lock
// is taken; nothing elsewhere.
void check_not_forked_child();

}  // namespace c10::openreg
