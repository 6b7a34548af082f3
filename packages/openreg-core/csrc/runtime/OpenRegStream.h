// Streams as PyTorch sees them (c10::Stream) mapped onto runtime streams.
//
// A c10::Stream is (device, id). The id encodes which runtime stream it is:
//   0                 the device's default stream
//   1 .. 2*kPoolSize  a pooled stream: low priority pool first, then high
//   >= 2^32           an external runtime handle (orStream_t) used as is
// The pools are created per device on first use and handed out round robin,
// as CUDA does, because creating a stream per torch.Stream() would be slow.
// The current stream is per host thread and per device.
#pragma once

#include <c10/core/Stream.h>

#include <ostream>

#include "openreg/runtime.h"

namespace c10::openreg {

constexpr int kStreamPoolSize = 32;

class OpenRegStream {
 public:
  explicit OpenRegStream(c10::Stream stream);  // raises unless an openreg stream

  c10::Stream unwrap() const { return stream_; }
  operator c10::Stream() const { return stream_; }
  c10::Device device() const { return stream_.device(); }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::StreamId id() const { return stream_.id(); }
  orStream_t handle() const;
  int priority() const;
  bool query() const;
  void synchronize() const;
  bool operator==(const OpenRegStream& other) const { return stream_ == other.stream_; }

 private:
  c10::Stream stream_;
};

// device -1 means the current device.
OpenRegStream getDefaultOpenRegStream(c10::DeviceIndex device = -1);
OpenRegStream getCurrentOpenRegStream(c10::DeviceIndex device = -1);
// priority: 0 (low, default) or negative (high), as torch.cuda.Stream.
OpenRegStream getStreamFromPool(int priority = 0, c10::DeviceIndex device = -1);
OpenRegStream getStreamFromExternal(orStream_t handle, c10::DeviceIndex device);
void setCurrentOpenRegStream(OpenRegStream stream);
// The runtime handle of the current stream of `device` (hot path of every op).
orStream_t current_stream_handle(c10::DeviceIndex device);

// Launch sizing: a kernel whose tensor arguments total fewer than small_kernel_bytes() bytes
// (OPENREG_SMALL_KERNEL_BYTES, default 512 KiB; 0 turns it off) runs with one intra-op thread on
// its stream's worker. Launch sites count the bytes with note_kernel_bytes (KernelTensorArg and
// launch_tensor do so); the launch takes the count. See OpenRegStream.cpp.
size_t small_kernel_bytes();
void note_kernel_bytes(size_t nbytes);
// Drops the calling thread's count: for a launch site that built kernel arguments and then did
// not launch (a refused call, an early return), so that the thread's next launch is not sized by
// them. Such a site holds a KernelBytesScope, which drops the count when it returns or throws (a
// launch has taken it by then).
void discard_kernel_bytes();
struct KernelBytesScope {
  KernelBytesScope() = default;
  KernelBytesScope(const KernelBytesScope&) = delete;
  KernelBytesScope& operator=(const KernelBytesScope&) = delete;
  ~KernelBytesScope() { discard_kernel_bytes(); }
};

std::ostream& operator<<(std::ostream& os, const OpenRegStream& s);

}  // namespace c10::openreg
