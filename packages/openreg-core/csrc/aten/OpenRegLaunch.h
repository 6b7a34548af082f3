// Launching a piece of CPU code as an openreg kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegKernelTensor.h"

namespace c10::openreg {

// Raises at the call the error the CPU's kernel gives to what `probe` asks of it on the host (a
// dtype it is not compiled for: its NotImplementedError, with its message), once per `known` flag
// that it accepts. Found in the device kernel, the error surfaced at a later, unrelated
// synchronisation. The probe's warnings are dropped (not the user's call).
template <typename Probe>
void check_cpu_accepts(std::atomic<bool>& known, Probe&& probe) {
  if (known.load(std::memory_order_relaxed)) return;
  struct Quiet final : c10::WarningHandler {  // "ComplexHalf support is experimental"...
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard keep_quiet(&quiet);
  probe();
  known.store(true, std::memory_order_relaxed);  // not reached when the CPU refuses
}

// The CPU's abs on one element of `dtype` (a list of refused dtypes missed float8_e8m0fnu, the bits
// and the sub-byte types).
inline void check_abs_dtype(c10::ScalarType dtype) {
  static std::atomic<bool> known[static_cast<int>(c10::ScalarType::NumOptions)] = {};
  check_cpu_accepts(known[static_cast<int>(dtype)], [&] { at::abs(at::empty({1}, at::TensorOptions().dtype(dtype))); });
}

// Launches `fn` on the current stream of the outputs' device. On the device
// `fn` receives kernel tensors for `inputs` (undefined ones stay undefined)
// and returns CPU results, which land in `outputs` (device tensors of the
// same shapes; undefined outputs are skipped, and with none defined nothing
// runs). Every defined input must be on the outputs' device, checked here, at
// the call: a kernel cannot read another device's memory or the host's. Costs
// one device-side copy of the results; for kernels that write their outputs in
// place use ::openreg::launch with KernelTensorArg directly.
template <typename F>
void launch_cpu_function(const char* name, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs, F fn) {
  const at::Tensor* first = nullptr;
  for (const auto& t : outputs)
    if (t.defined() && first == nullptr) first = &t;
  if (first == nullptr) return;
  const c10::Device device = first->device();
  for (const auto& t : inputs)
    if (t.defined()) check_same_device(device, t.device(), name);
  std::vector<std::optional<KernelTensorArg>> in, out;
  for (const auto& t : inputs) in.emplace_back(t.defined() ? std::optional<KernelTensorArg>(t) : std::nullopt);
  for (const auto& t : outputs) out.emplace_back(t.defined() ? std::optional<KernelTensorArg>(t) : std::nullopt);
  OPENREG_CHECK(::openreg::launch(current_stream_handle(device.index()), name,
                                  [in = std::move(in), out = std::move(out), fn = std::move(fn)] {
                                    std::vector<at::Tensor> args;
                                    for (const auto& a : in) args.push_back(a ? a->materialize() : at::Tensor());
                                    std::vector<at::Tensor> results = fn(args);
                                    for (size_t i = 0; i < out.size(); ++i)
                                      if (out[i] && results.at(i).defined()) out[i]->materialize().copy_(results[i]);
                                  }));
}

// launch_cpu_function whose first call of each `signature` (what the CPU kernel's refusals depend
// on besides the data: dtypes, dimensions, argument values) runs synchronously and raises the
// kernel's own error at the call, as the generic path's first calls do: a CPU kernel that refuses
// a dtype or an argument its meta kernel does not check (a convolution's dilation of 0) fails the
// user's call, as on the CPU and CUDA, not some later synchronising call. A signature whose first
// call failed is verified again next time.
template <typename F>
void launch_cpu_function_verified(const char* name, const std::string& signature, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& outputs, F fn) {
  static std::mutex mu;
  static auto* verified = new std::unordered_set<std::string>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (verified->count(signature) != 0) return launch_cpu_function(name, inputs, outputs, std::move(fn));
  }
  const at::Tensor* first = nullptr;
  for (const auto& t : outputs)
    if (t.defined() && first == nullptr) first = &t;
  if (first == nullptr) return;
  const c10::DeviceIndex device = first->device().index();
  auto error = std::make_shared<std::exception_ptr>();
  launch_cpu_function(name, inputs, outputs,
                      [fn = std::move(fn), error, n = outputs.size()](const std::vector<at::Tensor>& args) {
                        try {
                          return fn(args);
                        } catch (...) {
                          *error = std::current_exception();  // raised at the call below, not by the stream
                          return std::vector<at::Tensor>(n);
                        }
                      });
  getCurrentOpenRegStream(device).synchronize();
  if (*error) std::rethrow_exception(*error);
  std::lock_guard<std::mutex> lock(mu);
  verified->insert(signature);
}

}  // namespace c10::openreg
