// GradScaler's two device kernels, as native openreg kernels.
//
// torch.amp.GradScaler("openreg") calls
//   _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
//   _amp_update_scale_(scale, growth_tracker, found_inf, growth, backoff, interval)
// with every tensor on the device. Like CUDA, both run asynchronously: the host
// checks arguments and launches one kernel on the current stream; found_inf and
// the scale never travel to the host (the optimizer step reads found_inf later).
//
// A kernel is plain CPU code over kernel-view pointers (see core's
// OpenRegKernelTensor.h): this is how a vendor's hand-written kernel plugs in,
// instead of the generic path that would run the CPU operator.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "openreg/runtime.hpp"
#include "torch_openreg/aten/OpenRegKernelTensor.h"
#include "torch_openreg/runtime/OpenRegException.h"
#include "torch_openreg/runtime/OpenRegStream.h"

namespace {

using c10::openreg::KernelTensorArg;

// `reference`: the argument whose device the others must share.
void check_device_scalar(const at::Tensor& t, const char* name, at::ScalarType dtype, const char* dtype_name,
                         const at::Device& device, const char* reference) {
  TORCH_CHECK(t.is_privateuseone(), name, " must be an openreg tensor, got one on ", t.device(), ".");
  TORCH_CHECK(t.device() == device, name, " must be on ", device, " (where ", reference, " is), got ", t.device(), ".");
  TORCH_CHECK(t.numel() == 1, name, " must be a 1-element tensor, got ", t.numel(), " elements.");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype_name, " tensor, got ", t.scalar_type(), ".");
}

// Multiplies `n` contiguous values by inv_scale in place (in the type's math
// precision, as CUDA does) and reports whether any was inf or nan.
template <typename scalar_t>
bool unscale_contiguous(scalar_t* data, int64_t n, float inv_scale) {
  using opmath_t = at::opmath_type<scalar_t>;
  std::atomic<bool> non_finite{false};
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) {
      opmath_t v = static_cast<opmath_t>(data[i]);
      local |= !std::isfinite(v);
      data[i] = static_cast<scalar_t>(inv_scale == 1.f ? v : v * static_cast<opmath_t>(inv_scale));
    }
    if (local) non_finite.store(true, std::memory_order_relaxed);
  });
  return non_finite.load();
}

void non_finite_check_and_unscale(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.is_privateuseone(), "found_inf must be an openreg tensor, got one on ", found_inf.device(),
              ".");
  const at::Device device = found_inf.device();
  check_device_scalar(found_inf, "found_inf", at::kFloat, "a float", device, "found_inf");
  check_device_scalar(inv_scale, "inv_scale", at::kFloat, "a float", device, "found_inf");
  for (const auto& g : scaled_grads) {
    TORCH_CHECK(g.device() == device, "every scaled grad must be on ", device, " (where found_inf is), got one on ",
                g.device(), ".");
    TORCH_CHECK(g.layout() == at::kStrided, "scaled grads must be strided tensors, got ", g.layout(), ".");
    // The kernel's types, checked here as the CPU's dispatch checks them at the call, with its
    // exception type (an integer or complex grad raised RuntimeError here, NotImplementedError on
    // the CPU and CUDA): a float8 grad failed in the kernel and surfaced at a later, unrelated
    // synchronisation.
    const at::ScalarType type = g.scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16,
                                "\"_amp_foreach_non_finite_check_and_unscale_\" not implemented for '",
                                c10::toString(type), "'");
    // The kernel writes each grad: an overlapping one (expanded) is refused at the call, with the
    // CPU's error, not by the kernel after earlier grads were unscaled.
    at::assert_no_internal_overlap(g);
  }
  if (scaled_grads.empty()) return;
  std::vector<KernelTensorArg> grads(scaled_grads.begin(), scaled_grads.end());
  OPENREG_CHECK(::openreg::launch(
      c10::openreg::current_stream_handle(device.index()), "_amp_foreach_non_finite_check_and_unscale_",
      [grads = std::move(grads), found = KernelTensorArg(found_inf), inv = KernelTensorArg(inv_scale)] {
        const at::Tensor inv_view = inv.materialize();
        at::Tensor found_view = found.materialize();
        const float inv_scale = *inv_view.data_ptr<float>();
        bool non_finite = false;
        for (const auto& arg : grads) {
          at::Tensor g = arg.materialize();
          if (!g.is_contiguous()) {
            // Rare: the CPU's own kernel on the kernel view, in place and strided, so a view whose
            // elements share memory in a way the overlap check cannot prove (as_strided) is unscaled
            // as on the CPU (a contiguous copy multiplied a shared element once, the CPU once per
            // reference). It sets found_inf itself.
            at::_amp_foreach_non_finite_check_and_unscale_(g, found_view, inv_view);
            continue;
          }
          AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "openreg_amp_unscale", [&] {
            non_finite |= unscale_contiguous(g.data_ptr<scalar_t>(), g.numel(), inv_scale);
          });
        }
        if (non_finite) *found_view.data_ptr<float>() = 1.f;
      }));
}

at::Tensor& update_scale(at::Tensor& current_scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                         double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(current_scale.is_privateuseone(), "current_scale must be an openreg tensor, got one on ",
              current_scale.device(), ".");
  const at::Device device = current_scale.device();
  check_device_scalar(current_scale, "current_scale", at::kFloat, "a float", device, "current_scale");
  check_device_scalar(growth_tracker, "growth_tracker", at::kInt, "an int", device, "current_scale");
  check_device_scalar(found_inf, "found_inf", at::kFloat, "a float", device, "current_scale");
  OPENREG_CHECK(
      ::openreg::launch(c10::openreg::current_stream_handle(device.index()), "_amp_update_scale_",
                        [scale_arg = KernelTensorArg(current_scale), tracker_arg = KernelTensorArg(growth_tracker),
                         found_arg = KernelTensorArg(found_inf), growth = growth_factor, backoff = backoff_factor,
                         interval = growth_interval] {
                          // The float scale times the double factor, rounded once, as the CPU's and
                          // CUDA's kernels compute it (float factors drifted with e.g. 1.1 or 0.3).
                          float* scale = scale_arg.materialize().data_ptr<float>();
                          int32_t* tracker = tracker_arg.materialize().data_ptr<int32_t>();
                          const float found = *found_arg.materialize().data_ptr<float>();
                          if (found != 0.f) {  // an inf/nan step: back off and restart the growth count
                            *scale = static_cast<float>(*scale * backoff);
                            *tracker = 0;
                            return;
                          }
                          const int32_t successful = *tracker + 1;
                          if (successful == interval) {
                            const float grown = static_cast<float>(*scale * growth);
                            if (std::isfinite(grown)) *scale = grown;  // never grow the scale to inf
                            *tracker = 0;
                          } else {
                            *tracker = successful;
                          }
                        }));
  return current_scale;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(non_finite_check_and_unscale));
  m.impl("_amp_update_scale_", TORCH_FN(update_scale));
}

}  // namespace
