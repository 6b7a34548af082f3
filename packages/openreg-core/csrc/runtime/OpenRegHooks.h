// Helpers shared by the hooks and the native operators.
#pragma once

#include <c10/core/StorageImpl.h>

namespace c10::openreg {

// Reallocates a storage to `new_bytes` on its device, keeping the common
// prefix of its contents (a device-to-device copy on the current stream).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes);

// The memory a resize lets go of may still be mapped by other processes: a storage this process
// sent through torch.multiprocessing (Module.cpp::SentStorages), resized by its sender afterwards.
// Called before the storage lets go of it, the keeper then keeps the memory until the receivers let
// go, as CUDA's sharing parks a sent storage's memory (CudaIPCSentData); otherwise it does nothing.
using SharedMemoryKeeper = void (*)(c10::StorageImpl* storage);
void set_shared_memory_keeper(SharedMemoryKeeper keeper);

}  // namespace c10::openreg
