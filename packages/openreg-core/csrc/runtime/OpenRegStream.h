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

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <utility>

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
void setCurrentOpenRegStream(OpenRegStream stream);  // refuses a pool id out of range
// Refuses an external handle that is not a live stream of the stream's device (a pool stream passes).
void checkExternalOpenRegStream(OpenRegStream stream);
// The runtime handle of the current stream of `device` (hot path of every op).
orStream_t current_stream_handle(c10::DeviceIndex device);

// Launch sizing: a kernel whose tensor arguments total fewer than small_kernel_bytes() bytes
// (OPENREG_SMALL_KERNEL_BYTES, default 512 KiB; 0 turns it off) runs with one intra-op thread on
// its stream's worker. A launch site counts each tensor argument with a LaunchBytes (KernelTensorArg
// holds one), and the calling thread's next launch takes the count. See OpenRegStream.cpp.
size_t small_kernel_bytes();

// `nbytes` counted toward the calling thread's next launch. Dropped on that thread before any
// launch took the count (the site refused the call or returned early), it takes its bytes back: a
// site may build its arguments before its checks, and a refused call leaves no count behind. A copy
// counts nothing (a closure that copies an argument does not count it twice); a move carries the
// count.
class LaunchBytes {
 public:
  LaunchBytes() noexcept = default;
  explicit LaunchBytes(size_t nbytes);
  LaunchBytes(const LaunchBytes&) noexcept {}
  LaunchBytes(LaunchBytes&& other) noexcept : nbytes_(other.nbytes_), count_(std::exchange(other.count_, 0)) {}
  LaunchBytes& operator=(const LaunchBytes& other) noexcept {
    if (this != &other) give_back();
    return *this;
  }
  LaunchBytes& operator=(LaunchBytes&& other) noexcept {
    if (this != &other) {
      give_back();
      nbytes_ = other.nbytes_;
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~LaunchBytes() { give_back(); }

 private:
  void give_back() noexcept {
    if (count_ != 0) give_back_counted();
  }
  void give_back_counted() noexcept;
  size_t nbytes_ = 0;
  uint64_t count_ = 0;  // which thread's count, until its launch, holds nbytes_ (unique per process); 0: none
};

std::ostream& operator<<(std::ostream& os, const OpenRegStream& s);

}  // namespace c10::openreg
