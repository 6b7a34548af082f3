// The caching device allocator (see the comment at the top of the .cpp).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <vector>

#include "OpenRegStream.h"

namespace c10::openreg::allocator {

// The allocator registered for PrivateUse1 (c10::GetAllocator / getDeviceAllocator).
c10::DeviceAllocator* get();

void recordStream(const c10::DataPtr& data_ptr, OpenRegStream stream);
void emptyCache();
// Device memory held outside the allocator that can be given back, as CUDA's
// FreeCudaMemoryCallbacksRegistry (the storages this process sent to others whose receivers let go:
// Module.cpp::SentStorages). emptyCache, and an allocation before it reports out of memory, call
// `free_memory` with no allocator lock held; `holds_memory` is a cheap check for the latter.
struct FreeMemoryCallback {
  bool (*holds_memory)();
  bool (*free_memory)();  // whether it freed anything
};
void registerFreeMemoryCallback(FreeMemoryCallback callback);
// Graph capture (OpenRegGraph.cpp): blocks allocated on `stream` during the capture are kept for
// the graph until releaseGraph.
void beginGraphCapture(c10::DeviceIndex device, orStream_t stream, uint64_t graph);
void endGraphCapture(c10::DeviceIndex device, orStream_t stream);
void releaseGraph(c10::DeviceIndex device, uint64_t graph);
// One more holder of a graph pool (a graph that replays the pool's graph inside its capture),
// which releases it with one more releaseGraph.
void retainGraph(c10::DeviceIndex device, uint64_t graph);
c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device);
void resetPeakStats(c10::DeviceIndex device);
void resetAccumulatedStats(c10::DeviceIndex device);
std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot();
// Takes (hold) or releases the lock of a device's cache, for a test that forks while another thread
// would hold it (test_device.py::TestFork).
void hold_lock_for_test(c10::DeviceIndex device, bool hold);

}  // namespace c10::openreg::allocator
