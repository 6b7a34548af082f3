// POSIX implementation of the OS seam (Linux and macOS).
//
// The dual mapping is one shared-memory object mapped twice: PROT_NONE for the
// device view, PROT_READ|PROT_WRITE for the kernel view. Linux uses an
// anonymous memfd; elsewhere a shm object whose name is unlinked at once.
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
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
#if defined(__linux__)
  // The CPUs this process may run on (taskset, a container's cpuset), as PyTorch's thread count.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void on_fork_child(void (*child)()) { pthread_atfork(nullptr, nullptr, child); }

int64_t current_pid() { return static_cast<int64_t>(getpid()); }

uint64_t thread_id() {
#if defined(__linux__)
  return static_cast<uint64_t>(syscall(SYS_gettid));
#else
  uint64_t id = 0;
  pthread_threadid_np(nullptr, &id);
  return id;
#endif
}

#if defined(__linux__)
namespace {
// Start time of a process (field 22 of /proc/<pid>/stat, in clock ticks since boot), or 0 if it is gone.
uint64_t process_start_time(int64_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return 0;
  unsigned long long start = 0;
  // After ")": state is field 3, starttime field 22: skip 19 fields.
  if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &start) !=
      1)
    return 0;
  return start;
}
}  // namespace

bool export_mapping(const DualMapping& m, ShareToken* out, std::string* error) {
  struct stat st;
  if (fstat(static_cast<int>(m.handle), &st) != 0) {
    *error = std::string("cannot inspect device memory object: ") + std::strerror(errno);
    return false;
  }
  out->pid = current_pid();
  out->process_start = process_start_time(out->pid);
  out->object = m.handle;
  out->object_id = static_cast<uint64_t>(st.st_ino);
  return true;
}

bool import_mapping(const ShareToken& t, size_t offset, size_t length, DualMapping* out, std::string* error) {
  const std::string who = "the process that exported it (pid " + std::to_string(t.pid) + ")";
  const uint64_t start = process_start_time(t.pid);
  if (start == 0 || start != t.process_start) {
    *error = who + " has exited; an IPC handle is valid only while its exporter lives";
    return false;
  }
  // The exporter's descriptor, reopened through /proc: allowed for processes of the same user only.
  const std::string path = "/proc/" + std::to_string(t.pid) + "/fd/" + std::to_string(t.object);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *error = errno == EACCES || errno == EPERM
                 ? "permission denied opening the memory of " + who + ": IPC handles work between processes of one user"
             : errno == ENOENT ? who + " has exited or no longer holds the memory"
                               : "cannot open the memory of " + who + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != t.object_id) {
    close(fd);
    *error = "the IPC handle does not name device memory of " + who + " (stale or forged handle)";
    return false;
  }
  void* dev = mmap(nullptr, length, PROT_NONE, MAP_SHARED, fd, static_cast<off_t>(offset));
  void* kern = dev == MAP_FAILED
                   ? MAP_FAILED
                   : mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  close(fd);  // the mappings keep the object alive
  if (kern == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, length);
    *error = std::string("cannot map the shared device memory: ") + std::strerror(errno);
    return false;
  }
  out->device_view = static_cast<char*>(dev);
  out->kernel_view = static_cast<char*>(kern);
  out->size = length;
  out->handle = -1;
  return true;
}
#else
// Other POSIX systems have no /proc/<pid>/fd: a port passes the descriptor over a Unix
// socket (SCM_RIGHTS) instead. Until then IPC reports that it is unavailable.
bool export_mapping(const DualMapping&, ShareToken*, std::string* error) {
  *error = "IPC handles are not implemented for this operating system (see platform_posix.cpp)";
  return false;
}
bool import_mapping(const ShareToken&, size_t, size_t, DualMapping*, std::string* error) {
  *error = "IPC handles are not implemented for this operating system (see platform_posix.cpp)";
  return false;
}
#endif

void unmap(const DualMapping& m) {
  munmap(m.device_view, m.size);
  munmap(m.kernel_view, m.size);
}

}  // namespace openreg::platform
