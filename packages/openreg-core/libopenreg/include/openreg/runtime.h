/*
 * libopenreg: the driver-level C API of the emulated openreg accelerator.
 *
 * This header is the seam a vendor replaces with their real driver. It has no
 * dependency on PyTorch. The model follows CUDA's runtime API:
 *
 *  - Devices. OPENREG_DEVICE_COUNT devices (default 2), each with a fixed
 *    capacity OPENREG_DEVICE_MEMORY (default 8 GiB, suffixes K/M/G accepted).
 *    The current device is per host thread and starts at 0.
 *
 *  - Address space. Device memory lives in its own address range. The
 *    pointers that orMalloc returns (the "device view") have no access
 *    rights: host code that dereferences one faults, as on a discrete GPU.
 *    Code running on the device (a kernel) turns a device pointer into a
 *    usable one with orKernelPointer(); that is one subtraction and one
 *    addition, no system call and no lock.
 *
 *  - Streams. Each stream runs its work in order on its own worker,
 *    asynchronously to the host: a launch returns before the work has run.
 *    The NULL stream is the current device's default stream.
 *
 *  - Events. Record a point in a stream, query or wait for it from the host,
 *    make another stream wait for it, and measure time between two of them.
 *
 *  - Errors. Every call returns an orStatus; orGetLastErrorMessage() gives
 *    the detailed message of the calling thread's last failure (at most
 *    16383 bytes; valid until the thread's next failure). A kernel
 *    that fails leaves an error on its device which the next synchronising
 *    call on that device (stream/event/device synchronize, synchronous
 *    memcpy/memset) returns, naming the kernel.
 *
 *  - Kernels may call the runtime, but not wait for their own stream: a
 *    call from a kernel that would (synchronizing its stream, its device or
 *    an event recorded after it on its stream, orFree/orFreeHost, which wait
 *    for every device, a blocking copy on its stream, destroying its stream)
 *    returns orErrorNotPermitted instead of waiting for itself forever.
 *
 * All functions are thread safe.
 */
#ifndef OPENREG_RUNTIME_H_
#define OPENREG_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(OPENREG_BUILDING_RUNTIME)
#define OPENREG_API __declspec(dllexport)
#else
#define OPENREG_API __declspec(dllimport)
#endif
#else
#define OPENREG_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum orStatus {
  orSuccess = 0,
  orErrorNotReady = 1,                  /* queried work has not completed yet */
  orErrorInvalidValue = 2,              /* a bad argument */
  orErrorInvalidDevice = 3,             /* device index out of range */
  orErrorMemoryAllocation = 4,          /* out of device or host memory */
  orErrorInvalidDevicePointer = 5,      /* not a live allocation of this runtime */
  orErrorInvalidResourceHandle = 6,     /* unknown or destroyed stream/event */
  orErrorInvalidMemcpyDirection = 7,    /* pointers do not match the copy kind */
  orErrorNotPermitted = 8,              /* e.g. kernel-only call made by the host */
  orErrorLaunchFailure = 9,             /* a kernel failed (reported later) */
  orErrorForkedProcess = 10,            /* used in a child forked after init */
  orErrorInitialization = 11,           /* bad configuration or OS failure */
  orErrorStreamCaptureUnsupported = 12, /* not allowed while the stream is being captured */
  orErrorNotSupported = 13,             /* not available on this platform */
} orStatus;

typedef enum orMemcpyKind {
  orMemcpyHostToHost = 0,
  orMemcpyHostToDevice = 1,
  orMemcpyDeviceToHost = 2,
  orMemcpyDeviceToDevice = 3,
  orMemcpyDefault = 4, /* inferred from the pointers */
} orMemcpyKind;

typedef enum orMemoryType {
  orMemoryTypeUnregistered = 0, /* ordinary (pageable) host memory */
  orMemoryTypeHost = 1,         /* pinned host memory from orMallocHost */
  orMemoryTypeDevice = 2,
} orMemoryType;

typedef struct orPointerAttributes {
  orMemoryType type;
  int device;  /* owning device, or -1 for host memory */
  void* base;  /* start of the allocation containing the pointer */
  size_t size; /* size of that allocation in bytes */
} orPointerAttributes;

typedef struct orDeviceProp {
  char name[64];
  size_t totalGlobalMem;
  int multiProcessorCount; /* host threads the device may use */
  int major;
  int minor;
  size_t memoryAlignment; /* alignment of orMalloc results */
} orDeviceProp;

typedef struct orRuntimeCounters {
  uint64_t kernelsLaunched;
  uint64_t memcpyHostToDevice;
  uint64_t memcpyDeviceToHost;
  uint64_t memcpyDeviceToDevice;
  uint64_t bytesHostToDevice;
  uint64_t bytesDeviceToHost;
  uint64_t bytesDeviceToDevice;
  uint64_t deviceMallocs;
  uint64_t deviceFrees;
  uint64_t waitWakeups;        /* times a thread asleep in a wait for the device (a synchronize, an event, a
                                  blocking copy) was woken; a wait for the end of a queue is woken once */
  uint64_t graphsLaunched;     /* orGraphLaunch calls that enqueued a graph */
  uint64_t graphItemsLaunched; /* work items those launches enqueued (kernelsLaunched does not count them) */
  uint64_t memcpyOnCaller;     /* blocking copies that found their stream idle and ran on the calling thread
                                  (counted in memcpy* too) */
  uint64_t eventsCreated;      /* orEventCreate(WithFlags) calls that made an event */
  uint64_t eventsDestroyed;    /* orEventDestroy calls that released one (created - destroyed: alive) */
  uint64_t streamsCreated;     /* orStreamCreate(WithPriority) calls that made a stream (not default streams) */
  uint64_t streamsDestroyed;   /* orStreamDestroy calls that released one (created - destroyed: alive) */
} orRuntimeCounters;

/* An opaque handle to one device allocation, for another process (see orIpcGetMemHandle). */
#define OR_IPC_HANDLE_SIZE 64
typedef struct orIpcMemHandle {
  unsigned char reserved[OR_IPC_HANDLE_SIZE];
} orIpcMemHandle_t;

typedef struct orStream_st* orStream_t; /* NULL: current device's default stream */
typedef struct orEvent_st* orEvent_t;
typedef struct orGraph_st* orGraph_t; /* work captured from a stream, replayable; never reused */

/* A kernel: runs on a stream's worker. Return orSuccess, or the result of
 * orKernelFail(). args belongs to the kernel; deleter (may be NULL) frees it
 * after the kernel ran or when the launch is refused. */
typedef orStatus (*orKernelFn)(void* args);
typedef void (*orKernelArgsDeleter)(void* args);

enum { orEventDefault = 0, orEventDisableTiming = 1 };
enum { orStreamDefault = 0 };

/* ---- errors ---- */
OPENREG_API const char* orGetErrorName(orStatus status);
OPENREG_API const char* orGetLastErrorMessage(void);

/* ---- devices ---- */
OPENREG_API orStatus orGetDeviceCount(int* count);
OPENREG_API orStatus orSetDevice(int device);
OPENREG_API orStatus orGetDevice(int* device);
OPENREG_API orStatus orGetDeviceProperties(orDeviceProp* prop, int device);
OPENREG_API orStatus orDeviceSynchronize(void);
/* A kernel failure on `device` that no synchronizing call has reported yet: orErrorLaunchFailure
 * with its message, else orSuccess. Neither waits for the device. orDeviceTakeError reports it, as a
 * synchronizing call does (stream and event queries of the PyTorch layer report it this way);
 * orDevicePeekError leaves it to be reported (occl: a collective refusing to send a failed kernel's output). */
OPENREG_API orStatus orDeviceTakeError(int device);
OPENREG_API orStatus orDevicePeekError(int device);

/* ---- memory ---- */
OPENREG_API orStatus orMalloc(void** ptr, size_t size);
OPENREG_API orStatus orFree(void* ptr); /* waits for the queued work of every device */
OPENREG_API orStatus orMallocHost(void** ptr, size_t size);
OPENREG_API orStatus orFreeHost(void* ptr);
OPENREG_API orStatus orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind);
/* Asynchronous only when the host side is pinned (orMallocHost) or absent;
 * a copy to or from pageable memory returns once it is done, as on CUDA. */
OPENREG_API orStatus orMemcpyAsync(void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream);
OPENREG_API orStatus orMemset(void* dev_ptr, int value, size_t count);
OPENREG_API orStatus orMemsetAsync(void* dev_ptr, int value, size_t count, orStream_t stream);
OPENREG_API orStatus orPointerGetAttributes(orPointerAttributes* attr, const void* ptr);
/* The device whose memory contains ptr, or -1. No validation of liveness; no lock for the
 * process's own device memory (memory opened from an IPC handle takes a lookup under a lock). */
OPENREG_API int orPointerGetDevice(const void* ptr);
OPENREG_API orStatus orMemGetInfo(size_t* free_bytes, size_t* total_bytes);
/* Bytes of the current device's memory held in host RAM right now. */
OPENREG_API orStatus orDeviceGetResidentBytes(size_t* bytes);

/* ---- sharing device memory between processes ----
 * orIpcGetMemHandle describes the allocation (from orMalloc) that contains
 * dev_ptr; another process of the same user opens it with orIpcOpenMemHandle
 * and gets the allocation's start, mapped into its own address space on the
 * same device index: both processes then read and write the same memory. The
 * handle names no shared object (nothing in /dev/shm, nothing to guess); it is
 * valid while the exporting process lives and keeps the allocation. Opening it
 * twice returns the same pointer (reference counted); a handle from a process
 * that has exited fails with orErrorInvalidValue and says so. Opening a handle
 * in the process that made it fails (use the pointer). Memory opened from a
 * handle can be exported again: the new handle is the one it was opened with,
 * so the original exporter must still live. orIpcCloseMemHandle waits for the
 * queued work of every device, like orFree, then unmaps. */
OPENREG_API orStatus orIpcGetMemHandle(orIpcMemHandle_t* handle, void* dev_ptr);
OPENREG_API orStatus orIpcOpenMemHandle(void** dev_ptr, orIpcMemHandle_t handle);
OPENREG_API orStatus orIpcCloseMemHandle(void* dev_ptr);

/* ---- streams ---- */
OPENREG_API orStatus orDeviceGetStreamPriorityRange(int* least, int* greatest);
OPENREG_API orStatus orStreamCreate(orStream_t* stream);
OPENREG_API orStatus orStreamCreateWithPriority(orStream_t* stream, unsigned int flags, int priority);
/* After queued work is done; a capture in progress is discarded with the stream. From the call on,
 * launches on the stream (from other threads) are refused with orErrorInvalidResourceHandle. */
OPENREG_API orStatus orStreamDestroy(orStream_t stream);
OPENREG_API orStatus orStreamQuery(orStream_t stream);
OPENREG_API orStatus orStreamSynchronize(orStream_t stream);
OPENREG_API orStatus orStreamWaitEvent(orStream_t stream, orEvent_t event, unsigned int flags);
OPENREG_API orStatus orStreamGetDevice(orStream_t stream, int* device);
OPENREG_API orStatus orStreamGetPriority(orStream_t stream, int* priority);
/* The default stream of a given device (what NULL means on that device). */
OPENREG_API orStatus orDeviceGetDefaultStream(int device, orStream_t* stream);

/* Called around every wait of a host thread that outlasts its first few microseconds (stream,
 * event and device synchronisation, synchronous copies, frees that wait for queued work):
 * begin() before it spins on or sleeps, end(its result) when the wait is over. An embedding interpreter releases its
 * lock there, so that kernels which need it can run meanwhile (torch_openreg's kernels written in Python take the GIL).
 * NULL, NULL removes them. */
typedef void* (*orBlockingWaitBegin)(void);
typedef void (*orBlockingWaitEnd)(void* token);
OPENREG_API orStatus orSetBlockingWaitHooks(orBlockingWaitBegin begin, orBlockingWaitEnd end);

/* Host state a kernel launch carries to the device. capture() runs on the launching thread at
 * every orLaunchKernel, one that fails included, and returns a word (0: nothing); before a kernel
 * runs, its stream's worker calls apply(word) when the word differs from the last one it applied.
 * apply returns how many CPU threads the kernels carrying that word run on (their parallel team;
 * below 1 counts as 1): a thread waiting for the device spins only while the running kernels'
 * threads leave it a CPU. Kernels here run on the host's CPUs: torch_openreg carries the host's
 * intra-op thread count (one for a small kernel), so that torch.set_num_threads reaches the
 * workers' parallel regions as it reaches CPU operators. Both or neither; NULL, NULL removes them. */
typedef uint64_t (*orLaunchContextCapture)(void);
typedef int (*orLaunchContextApply)(uint64_t context);
OPENREG_API orStatus orSetLaunchContextHooks(orLaunchContextCapture capture, orLaunchContextApply apply);

/* ---- events ---- */
OPENREG_API orStatus orEventCreate(orEvent_t* event);
OPENREG_API orStatus orEventCreateWithFlags(orEvent_t* event, unsigned int flags);
OPENREG_API orStatus orEventDestroy(orEvent_t event);
OPENREG_API orStatus orEventRecord(orEvent_t event, orStream_t stream);
OPENREG_API orStatus orEventQuery(orEvent_t event); /* orSuccess if never recorded */
/* The device of the event's last record, -1 if it was never recorded. */
OPENREG_API orStatus orEventGetDevice(orEvent_t event, int* device);
OPENREG_API orStatus orEventSynchronize(orEvent_t event);
/* Times of the events' last records (an earlier record that runs later does not change it). */
OPENREG_API orStatus orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end);

/* ---- graphs ----
 * Between orStreamBeginCapture and orStreamEndCapture, work launched on the
 * stream is recorded instead of run. orGraphLaunch enqueues the recorded work
 * again, in order, on any stream of the same device; kernels see the same
 * arguments each time. While a stream captures, calls that would wait for it
 * (synchronize, blocking copies, event records) fail with
 * orErrorStreamCaptureUnsupported, and so does a wait of the capturing stream
 * for an event (recorded outside the capture, its replays would not wait).
 * orStreamBeginCapture returns once the work queued on the stream before it has
 * run: a capture may be given memory that work freed and still used, and a
 * replay on another stream would race it (CUDA's captures allocate from a
 * private pool instead). A kernel of that work that failed is reported by it,
 * as by a synchronisation, and no capture begins; called from a kernel of the
 * stream it fails with orErrorNotPermitted (it would wait for itself). */
OPENREG_API orStatus orStreamBeginCapture(orStream_t stream);
OPENREG_API orStatus orStreamEndCapture(orStream_t stream, orGraph_t* graph);
OPENREG_API orStatus orStreamIsCapturing(orStream_t stream, int* capturing);
OPENREG_API orStatus orGraphLaunch(orGraph_t graph, orStream_t stream);
OPENREG_API orStatus orGraphGetNodeCount(orGraph_t graph, size_t* count);
OPENREG_API orStatus orGraphGetNodeName(orGraph_t graph, size_t index, const char** name);
/* Waits for launches of the graph in progress on other threads, then for its queued work. */
OPENREG_API orStatus orGraphDestroy(orGraph_t graph);

/* ---- kernels ---- */
/* name must stay valid until the kernel ran (a literal or an interned name). */
OPENREG_API orStatus orLaunchKernel(orStream_t stream, const char* name, orKernelFn fn, void* args,
                                    orKernelArgsDeleter deleter);
/* Device side only: translate a device pointer into one the kernel can use. */
OPENREG_API orStatus orKernelPointer(const void* dev_ptr, void** kernel_ptr);
/* Device side only: record why the running kernel failed; returns orErrorLaunchFailure. */
OPENREG_API orStatus orKernelFail(const char* message);
/* 1 when the calling thread is running a kernel. */
OPENREG_API int orInKernel(void);

/* ---- observability ---- */
OPENREG_API orStatus orGetCounters(orRuntimeCounters* counters);

/* Activity tracing, what a profiler reads. While tracing is enabled, every
 * work item enqueued (kernel, copy, memset, event record or wait) is timed on
 * its stream and remembered with the correlation id that was current on the
 * enqueuing host thread. orTracingFlush hands the activities to `fn` (in
 * completion order per stream) and forgets them; at most 2^20 are kept between
 * flushes, and `dropped` (may be NULL) receives how many were not. Disabling
 * tracing waits until every stream has run the work traced so far (without
 * consuming kernel errors), so a flush after it returns the whole trace.
 * Disabled, tracing costs one relaxed atomic load per enqueue. Times are
 * orNowNs() values. */
typedef struct orActivity {
  const char* name; /* the kernel name; "openreg::memcpy", "openreg::memset", ... for runtime work */
  int device;
  orStream_t stream;
  int is_default_stream;
  uint64_t correlation; /* 0 when none was pushed */
  uint64_t start_ns;    /* when the device started it */
  uint64_t end_ns;      /* and finished it */
  uint64_t host_thread; /* OS id of the host thread that enqueued it */
  uint64_t enqueue_ns;  /* when that thread started enqueuing it */
} orActivity;
typedef void (*orActivityFn)(const orActivity* activity, void* user);
OPENREG_API orStatus orTracingEnable(int enable);
OPENREG_API orStatus orTracingPushCorrelationId(uint64_t id); /* per host thread, nested */
OPENREG_API orStatus orTracingPopCorrelationId(void);
OPENREG_API orStatus orTracingFlush(orActivityFn fn, void* user, uint64_t* dropped);
OPENREG_API uint64_t orNowNs(void); /* the runtime's monotonic clock, in nanoseconds */

#ifdef __cplusplus
}
#endif

#endif /* OPENREG_RUNTIME_H_ */
