// Helpers shared by the hooks and the native operators.
#pragma once

#include <c10/core/StorageImpl.h>

namespace c10::openreg {

// Reallocates a storage to `new_bytes` on its device, keeping the common
// prefix of its contents (a device-to-device copy on the current stream).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes);

}  // namespace c10::openreg
