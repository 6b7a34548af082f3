// Native openreg kernels for the int8 matmuls torchao's int8 configs call:
// aten::_int_mm (int8 or uint8 x int8 -> int32, as the CPU's; CUDA's takes
// int8 only) and aten::_weight_int8pack_mm (float activations x int8 weight,
// per-channel scales).
//
// Without them both take core's generic path and run the CPU's kernels, which
// are slow on this kind of CPU (AVX2): _int_mm 32x1024x1024 takes 65-80 ms
// against 1.2 ms for a float32 mm. Both kernels here run the float32 GEMM on
// kernel views instead. For _int_mm that is exact: an int8 x int8 product is at
// most 2^14, so with K split into blocks of 1024 every partial sum of a block is
// an integer of magnitude <= 2^24, which float32 represents exactly whatever the
// GEMM's summation order; blocks are summed in int32. A uint8 x int8 product is at
// most 255 * 128 < 2^15: blocks of 512 keep the same bound.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "../QuantCommon.h"

namespace openreg_quant {
namespace {

constexpr int64_t kExactBlock = 1024;      // 1024 * 128 * 128 = 2^24
constexpr int64_t kExactBlockUint8 = 512;  // 512 * 255 * 128 < 2^24

void check_int_mm(const at::Tensor& self, const at::Tensor& mat2) {
  TORCH_CHECK(self.dim() == 2, "Expected self to be 2D, but got self.dim() == ", self.dim());
  TORCH_CHECK(mat2.dim() == 2, "Expected mat2 to be 2D, but got mat2.dim() == ", mat2.dim());
  TORCH_CHECK(self.size(1) == mat2.size(0), "self.size(1) needs to match mat2.size(0) but got ", self.size(1), " and ",
              mat2.size(0));
  TORCH_CHECK(self.scalar_type() == at::kChar || self.scalar_type() == at::kByte,
              "Expected self dtype to be int8 or uint8 but got ", self.dtype());
  TORCH_CHECK(mat2.scalar_type() == at::kChar, "Expected mat2 dtype to be of type int8 but got ", mat2.dtype());
  c10::openreg::check_same_device(self.device(), mat2.device(), "aten::_int_mm");
}

void launch_int_mm(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& out) {
  if (out.numel() == 0) return;
  OPENREG_CHECK(::openreg::launch(
      stream_of(out), "aten::_int_mm",
      [a_arg = KernelTensorArg(self), b_arg = KernelTensorArg(mat2), y_arg = KernelTensorArg(out)] {
        const at::Tensor a = a_arg.materialize(), b = b_arg.materialize();
        at::Tensor y = y_arg.materialize();
        const int64_t k = a.size(1);
        if (k == 0) {
          y.zero_();
          return;
        }
        const int64_t block = a.scalar_type() == at::kByte ? kExactBlockUint8 : kExactBlock;
        at::Tensor acc;
        for (int64_t k0 = 0; k0 < k; k0 += block) {
          const int64_t k1 = std::min(k, k0 + block);
          at::Tensor part = at::mm(a.slice(1, k0, k1).to(at::kFloat), b.slice(0, k0, k1).to(at::kFloat)).to(at::kInt);
          acc = acc.defined() ? acc.add_(part) : part;
        }
        y.copy_(acc);
      }));
}

at::Tensor int_mm(const at::Tensor& self, const at::Tensor& mat2) {
  check_int_mm(self, mat2);
  at::Tensor out = at::empty({self.size(0), mat2.size(1)}, self.options().dtype(at::kInt));
  launch_int_mm(self, mat2, out);
  return out;
}

at::Tensor& int_mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  check_int_mm(self, mat2);
  // The CPU's and CUDA's checks, in their order: an out of another shape is refused, not resized.
  TORCH_CHECK(out.dtype() == at::kInt, "Expected result dtype to be of type kInt but got ", out.dtype());
  TORCH_CHECK(out.size(0) == self.size(0), "Expected result.size(0) to be ", self.size(0), " but got ", out.size(0));
  TORCH_CHECK(out.size(1) == mat2.size(1), "Expected result.size(1) to be ", mat2.size(1), " but got ", out.size(1));
  TORCH_CHECK(out.dim() == 2, "Expected result to be of dimension 2 but got ", out.dim());
  TORCH_CHECK(out.is_contiguous(), "Expected result to be contiguous.");
  c10::openreg::check_same_device(self.device(), out.device(), "aten::_int_mm.out");
  launch_int_mm(self, mat2, out);
  return out;
}

// out[m, n] = sum_k x[m, k] * w[n, k] * scales[n], in x's dtype; the products and sums in float32.
at::Tensor weight_int8pack_mm(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& scales) {
  const char* name = "aten::_weight_int8pack_mm";
  TORCH_CHECK(self.dim() == 2, name, ": expected A to be 2D tensor, got ", self.dim(), "-D.");
  TORCH_CHECK(mat2.dim() == 2 && mat2.scalar_type() == at::kChar, name,
              ": expected B to be a 2D int8 tensor [N, K], got ", mat2.dim(), "-D ", py_dtype(mat2.scalar_type()), ".");
  TORCH_CHECK(self.size(1) == mat2.size(1), name, ": expected A and B to have the same K, got ", self.size(1), " and ",
              mat2.size(1), ".");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == mat2.size(0), name,
              ": expected scales to be 1D with one value per output channel (", mat2.size(0), ").");
  TORCH_CHECK(
      self.scalar_type() == at::kFloat || self.scalar_type() == at::kBFloat16 || self.scalar_type() == at::kHalf, name,
      ": expected A to be float32, bfloat16 or float16, got ", py_dtype(self.scalar_type()), ".");
  TORCH_CHECK(scales.scalar_type() == self.scalar_type(), name, ": expected scales to have A's dtype (",
              py_dtype(self.scalar_type()), "), got ", py_dtype(scales.scalar_type()), ".");
  c10::openreg::check_same_device(self.device(), mat2.device(), name);
  c10::openreg::check_same_device(self.device(), scales.device(), name);
  at::Tensor out = at::empty({self.size(0), mat2.size(0)}, self.options());
  if (out.numel() == 0) return out;
  OPENREG_CHECK(::openreg::launch(stream_of(out), name,
                                  [x_arg = KernelTensorArg(self), w_arg = KernelTensorArg(mat2),
                                   s_arg = KernelTensorArg(scales), y_arg = KernelTensorArg(out)] {
                                    const at::Tensor x = x_arg.materialize().to(at::kFloat);
                                    const at::Tensor w = w_arg.materialize().to(at::kFloat);
                                    const at::Tensor s = s_arg.materialize().to(at::kFloat);
                                    at::Tensor y = y_arg.materialize();
                                    y.copy_(at::mm(x, w.t()).mul_(s));
                                  }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_int_mm", TORCH_FN(int_mm));
  m.impl("_int_mm.out", TORCH_FN(int_mm_out));
  m.impl("_weight_int8pack_mm", TORCH_FN(weight_int8pack_mm));
}

}  // namespace openreg_quant
