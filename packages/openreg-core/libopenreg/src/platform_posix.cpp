// POSIX implementation of the OS seam (Linux and macOS).
//
// The dual mapping is one shared-memory object mapped twice: PROT_NONE for the
// device view, PROT_READ|PROT_WRITE for the kernel view. Linux uses an
// anonymous memfd; elsewhere a shm object whose name is unlinked at once.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "platform.h"

namespace openreg::platform {

namespace {
int create_shared_object(size_t size, std::string* error) {
  int fd = -1;
#if defined(__linux__)
  fd = memfd_create("openreg-device", MFD_CLOEXEC);
#else
  std::random_device rd;
  std::string name = "/openreg-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) shm_unlink(name.c_str());
#endif
  if (fd < 0) {
    *error = std::string("cannot create device memory object: ") + std::strerror(errno);
    return -1;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *error = std::string("cannot size device memory object: ") + std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

bool create_dual_mapping(size_t size, DualMapping* out, std::string* error) {
  int fd = create_shared_object(size, error);
  if (fd < 0) return false;
  int flags = MAP_SHARED;
#if defined(MAP_NORESERVE)
  flags |= MAP_NORESERVE;
#endif
  void* dev = mmap(nullptr, size, PROT_NONE, flags, fd, 0);
  if (dev == MAP_FAILED) {
    *error = std::string("cannot map device view: ") + std::strerror(errno);
    close(fd);
    return false;
  }
  void* kern = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (kern == MAP_FAILED) {
    *error = std::string("cannot map kernel view: ") + std::strerror(errno);
    munmap(dev, size);
    close(fd);
    return false;
  }
  out->device_view = static_cast<char*>(dev);
  out->kernel_view = static_cast<char*>(kern);
  out->size = size;
  out->handle = fd;
  return true;
}

void release_pages(const DualMapping& m, size_t offset, size_t length) {
  if (length == 0) return;
#if defined(__linux__)
  // Punch a hole in the object: frees the pages for both views at once.
  if (fallocate(static_cast<int>(m.handle), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(length)) == 0)
    return;
  madvise(m.kernel_view + offset, length, MADV_REMOVE);
#else
  // Remapping the range drops its pages.
  mmap(m.kernel_view + offset, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, static_cast<int>(m.handle),
       static_cast<off_t>(offset));
#endif
}

size_t resident_bytes(const DualMapping& m, size_t offset, size_t length) {
  size_t page = page_size();
  size_t pages = (length + page - 1) / page;
  if (pages == 0) return 0;
#if defined(__linux__)
  std::vector<unsigned char> vec(pages);
#else
  std::vector<char> vec(pages);
#endif
  if (mincore(m.kernel_view + offset, pages * page, vec.data()) != 0) return 0;
  size_t n = 0;
  for (auto v : vec) n += (v & 1);
  return n * page;
}

void* host_alloc(size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void host_free(void* ptr, size_t size) { munmap(ptr, size); }

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void on_fork_child(void (*child)()) { pthread_atfork(nullptr, nullptr, child); }

}  // namespace openreg::platform
