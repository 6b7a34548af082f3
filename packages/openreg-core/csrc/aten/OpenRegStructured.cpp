// Registration form: a structured kernel.
//
// Structured operators split into a meta function (checks, output shape and
// dtype; at::meta::structured_<op>) and an implementation. A backend
// subclasses the meta class, says how outputs are created (set_output_*),
// runs meta() on the host and launches its own implementation. openreg does
// this for aten::mm and aten::mm.out: no meta tensors and no boxing, so
// matmul skips the generic path.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mm_meta.h>
#include <torch/library.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegKernelTensor.h"
#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

// Outputs are allocated on the device (functional form).
struct StructuredMmFunctional final : at::meta::structured_mm {
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          at::TensorOptions options) override {
    // An empty stride list means "contiguous".
    outputs_[idx] = strides.empty() ? at::empty(sizes, options) : at::empty_strided(sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              at::TensorOptions options) override {
    set_output_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t idx) override { return outputs_[idx]; }
  std::array<at::Tensor, 1> outputs_;
};

// Outputs are the caller's (out= form), resized if their shape is wrong.
struct StructuredMmOut final : at::meta::structured_mm {
  explicit StructuredMmOut(const at::Tensor& out) : outputs_{out} {}
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef, at::TensorOptions options) override {
    TORCH_CHECK(options.dtype() == outputs_[idx].dtype(), "Expected out tensor to have dtype ", options.dtype(),
                ", but got ", outputs_[idx].dtype(), " instead");
    TORCH_CHECK(outputs_[idx].device() == options.device(),
                "Expected out tensor to be on the same device as the inputs");
    at::native::resize_output(outputs_[idx], sizes);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              at::TensorOptions options) override {
    set_output_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t idx) override { return outputs_[idx]; }
  std::array<at::Tensor, 1> outputs_;
};

// The checks the CPU implementation makes after meta(), here on the host with its messages and
// exception types: found in the kernel, they surfaced at a later synchronising call instead of at
// the call (as on the CPU and CUDA). The CPU returns before its dtype dispatch when the result or
// the inner dimension is empty.
void check_mm_dtypes(const at::Tensor& self, const at::Tensor& mat2) {
  TORCH_CHECK(self.dtype() == mat2.dtype(), "expected m1 and m2 to have the same dtype, but got: ", self.dtype(),
              " != ", mat2.dtype());
  if (self.size(0) == 0 || mat2.size(1) == 0 || self.size(1) == 0) return;
  // The CPU's mm on 1x1 matrices of the dtype (a list of refused dtypes missed float8_e8m0fnu, the
  // bits and the sub-byte types).
  const c10::ScalarType dtype = self.scalar_type();
  static std::atomic<bool> known[static_cast<int>(c10::ScalarType::NumOptions)] = {};
  check_cpu_accepts(known[static_cast<int>(dtype)], [&] {
    const at::Tensor one = at::empty({1, 1}, at::TensorOptions().dtype(dtype));
    at::mm(one, one);
  });
}

void launch_mm(const at::Tensor& out, const at::Tensor& self, const at::Tensor& mat2) {
  check_same_device(self.device(), mat2.device(), "aten::mm");
  check_same_device(self.device(), out.device(), "aten::mm");
  check_mm_dtypes(self, mat2);
  OPENREG_CHECK(::openreg::launch(current_stream_handle(out.device().index()), "aten::mm",
                                  [out = KernelTensorArg(out), a = KernelTensorArg(self), b = KernelTensorArg(mat2)] {
                                    at::Tensor o = out.materialize();
                                    at::mm_out(o, a.materialize(), b.materialize());
                                  }));
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  StructuredMmFunctional op;
  op.meta(self, mat2);
  launch_mm(op.outputs_[0], self, mat2);
  return op.outputs_[0];
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  StructuredMmOut op(out);
  op.meta(self, mat2);
  at::assert_no_internal_overlap(out);  // the CPU's check, at the call (the kernel's came at a later sync)
  launch_mm(out, self, mat2);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", mm);
  m.impl("mm.out", mm_out);
}

}  // namespace c10::openreg
