// The pinned-host allocator: page-locked (runtime-registered) host memory
// that asynchronous copies may use while the host goes on.
#pragma once

#include <c10/core/Allocator.h>

#include "OpenRegStream.h"

namespace c10::openreg::host_allocator {

c10::Allocator* get();
bool is_pinned(const void* ptr);
// Keeps the pinned block holding host address `ptr` (a storage with context `ctx`) from reuse until
// `stream`'s work queued so far is done; pinned memory that is not a block in use here makes the
// caller wait for that work instead.
void record_stream(const void* ptr, void* ctx, OpenRegStream stream);
void empty_cache();
// As allocator::hold_lock_for_test, for the pinned cache's lock.
void hold_lock_for_test(bool hold);

}  // namespace c10::openreg::host_allocator
