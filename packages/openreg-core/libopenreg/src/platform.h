// The OS seam of the runtime: everything that differs between Linux, macOS
// and Windows sits behind these few functions. A port implements this header
// in one file (platform_posix.cpp serves Linux and macOS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#if defined(_MSC_VER)
#include <intrin.h>
#endif

namespace openreg::platform {

// One block of memory mapped twice: `device_view` has no access rights (what
// the host and PyTorch see), `kernel_view` is readable and writable (what
// kernels use). Both views alias the same pages.
struct DualMapping {
  char* device_view = nullptr;
  char* kernel_view = nullptr;
  size_t size = 0;
  intptr_t handle = -1;  // OS object backing both views
};

// Reserves `size` bytes of sparse memory in two views. Pages are committed on
// first touch. Returns false and fills `error` on failure.
bool create_dual_mapping(size_t size, DualMapping* out, std::string* error);

// Gives the pages of [offset, offset+length) back to the OS; they read as zero
// afterwards. Offsets are multiples of page_size().
void release_pages(const DualMapping& mapping, size_t offset, size_t length);

// Bytes of [offset, offset+length) currently resident in RAM.
size_t resident_bytes(const DualMapping& mapping, size_t offset, size_t length);

// ---- sharing a dual mapping's pages with another process (IPC) ----
// What another process of the same user needs to open the OS object behind a
// mapping. Carries no name: the object is reached through the exporting
// process, so it is private to that user and cannot be guessed or leaked.
struct ShareToken {
  int64_t pid = 0;             // the exporting process
  uint64_t process_start = 0;  // its start time: tells a reused pid apart
  int64_t object = -1;         // the object's handle inside that process
  uint64_t object_id = 0;      // the object's identity (inode), checked after opening
};
bool export_mapping(const DualMapping& mapping, ShareToken* out, std::string* error);
// Maps [offset, offset+length) of the token's object twice (device and kernel
// views) into `out`; offset and length are multiples of page_size(). Fails with
// a message naming the cause (exporter exited, other user, ...).
bool import_mapping(const ShareToken& token, size_t offset, size_t length, DualMapping* out, std::string* error);
void unmap(const DualMapping& mapping);  // an imported mapping (owns no object handle)
int64_t current_pid();

// Page-aligned, readable and writable host memory (the pinned-host pool).
void* host_alloc(size_t size);
void host_free(void* ptr, size_t size);

size_t page_size();
int hardware_threads();  // the CPUs this process may run on (its affinity where the OS has one)
uint64_t now_ns();       // monotonic clock
uint64_t thread_id();    // the calling thread's OS id (what profilers show)
inline void cpu_relax() {
#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
  _mm_pause();
#elif defined(_MSC_VER) && defined(_M_ARM64)
  __yield();
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Runs `child` in the child process after fork() (no-op where fork does not exist).
void on_fork_child(void (*child)());

}  // namespace openreg::platform
