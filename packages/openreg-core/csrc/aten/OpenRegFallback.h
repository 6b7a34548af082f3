// Introspection of the generic operator path (OpenRegFallback.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace c10::openreg {

// The generic path as a boxed kernel (registered as the global PrivateUse1 fallback).
void generic_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// Runs the CPU implementation on the device and waits, for outputs whose
// shapes depend on the data (registered per operator).
void synchronous_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// The sparse path: the synchronous path for operators with sparse openreg arguments, which run the
// CPU's sparse kernels on the device (registered as the fallback of the sparse keys; OpenRegSparse.cpp).
void sparse_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// The nested path: the synchronous path for operators with nested openreg arguments, which run the
// CPU's nested kernels on the device (registered as the fallback of NestedTensorPrivateUse1;
// OpenRegNested.cpp).
void nested_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// The aten operators ("name" or "name.overload") that have a kernel for `cpu_key`, none for
// `own_key`, and one for any of `composites`. A composite kernel outranks a backend's fallback, so
// the sparse and nested paths register these for their key by name (once, after every static
// registration of the backend ran).
std::vector<std::string> shadowed_by_composite(c10::DispatchKey cpu_key, c10::DispatchKey own_key,
                                               std::initializer_list<c10::DispatchKey> composites);
// Registers the generic path for the functional and in-place overloads of structured ops
// (once, after every static registration of the backend ran); returns how many.
size_t route_structured_ops();
// The out= overload ("aten::add.out") whose kernel a functional operator ("aten::add.Tensor") runs
// on the device, or "" when its results are copied from the CPU kernel's own allocation.
std::string routed_out_overload(const std::string& name);

// The C++ meta kernel the generic path uses for `name` instead of the Meta dispatch key (whose
// kernel may be Python), or nullptr (OpenRegNativeMeta.cpp); and the names it has one for.
const c10::KernelFunction* native_meta_kernel(const c10::OperatorName& name);
std::vector<std::string> native_meta_operators();

// How many times each operator ("name.overload") went through the generic path.
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void reset_fallback_counts();
// Launch records of the generic path that exist (queued, or kept by a thread for reuse).
int64_t generic_launches_alive();
// Takes (hold) or releases the generic path's locks, for a test that forks while another thread
// would hold them (test_device.py::TestFork).
void hold_locks_for_test(bool hold);
// In strict mode an operator without a native openreg kernel raises.
void set_strict_mode(bool strict);
bool strict_mode();

}  // namespace c10::openreg
