/*
 * Fault injection of the emulated runtime. Not part of the driver seam (runtime.h): a vendor's
 * runtime has no such call, and nothing in the PyTorch layer depends on it except a private test
 * binding. Off by default; when off, each hook costs one relaxed atomic load and a branch.
 *
 * A spec is a comma-separated list of clauses; `@T` restricts a clause to a target T, which is a
 * device index (`@1`) or a stream handle in hex (`@0x200000003`, an orStream_t as printed):
 *
 *   alloc[@D]:N[:K]   device allocations number N .. N+K-1 (orMalloc calls counted from 1, on
 *                     device D or on every device; K defaults to 1) fail with
 *                     orErrorMemoryAllocation.
 *   kernel[@T]:NAME   the next kernel named NAME (as launched, e.g. aten::mul) to run on T fails
 *                     instead of running: a deferred kernel error, as if the kernel had called
 *                     orKernelFail. Once.
 *   copy[@T]:N[:K]    copies number N .. N+K-1 that involve device memory (counted when issued)
 *                     fail on the device instead of copying: a deferred error of the work item
 *                     'openreg::memcpy'; a synchronous copy returns it at the call.
 *   slow[@T]:MS       every work item run on T (a stream, a device's streams, or all) starts MS
 *                     milliseconds late. Re-arming or disarming ends the waits at once.
 *
 * The environment variable OPENREG_FAULTS takes the same syntax and is read when the runtime
 * starts; a malformed value makes every call fail with orErrorInitialization naming it.
 */
#ifndef OPENREG_FAULTS_H_
#define OPENREG_FAULTS_H_

#include "openreg/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Replaces the armed faults with `spec` (NULL or "" disarms) and restarts their counts.
 * A malformed spec returns orErrorInvalidValue and leaves the armed faults as they were. */
OPENREG_API orStatus orInjectFaults(const char* spec);

#ifdef __cplusplus
}
#endif

#endif /* OPENREG_FAULTS_H_ */
