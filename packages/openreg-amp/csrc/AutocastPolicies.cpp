// Autocast for openreg: the cast policies torch 2.13 applies on CUDA,
// registered on the AutocastPrivateUse1 dispatch key.
//
// How autocast reaches these kernels: inside torch.autocast("openreg") the
// AutocastPrivateUse1 key is active, so an operator on openreg tensors first
// dispatches here. Each wrapper casts its floating-point openreg arguments by
// its policy, excludes the key and redispatches (to autograd, then the kernel).
// Operators not listed fall through: core registers the boxed fallthrough for
// the whole key (OpenRegFallthrough.cpp), which is also what runs when this
// plugin is not loaded.
//
// The op lists are the ones ATen/autocast_mode.h publishes "so that other
// backends can reuse the policy op list": the same lists the CUDA backend
// registers, so openreg's policies follow torch's on every release.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// The fp32_append_dtype list spells its signatures with unqualified ATen types.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// Same text as CUDA's: BCE on probabilities is not safe in fp16/bf16.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // lower_precision_fp: run in the autocast dtype (matmul, linear, conv, bmm, addmm, baddbmm, SDPA, ...).
#define OPENREG_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(OPENREG_LOWER_PRECISION_FP)
  // Not in CUDA's list, because CUDA never reaches it under autocast: nn.MultiheadAttention's
  // inference fast path asks torch.is_autocast_enabled(), which is CUDA's state only, so on
  // openreg (as on the CPU, whose list has it) the fused op runs inside an autocast region.
  KERNEL_PRIVATEUSEONE(_native_multi_head_attention, lower_precision_fp)

  // fp32: numerically sensitive ops run in float32 (exp/log/pow, softmax-like, norms, losses, ...).
#define OPENREG_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(OPENREG_FP32)

  // fp32_set_opt_dtype: ops with an optional dtype argument get dtype=float32 (softmax, sum, cumsum, ...).
#define OPENREG_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENREG_FP32_SET_OPT_DTYPE)

  // fp32_append_dtype: registered with one signature, redispatched to an overload that takes a dtype (norm).
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

  // promote: mixed inputs run in the widest floating type among them.
#define OPENREG_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(OPENREG_PROMOTE)
  // cat and stack are not listed, as on CUDA (AutocastCPU lists them as promote): they promote
  // natively, and the promote policy refuses a 16-bit type other than the region's (a cat of
  // bfloat16 tensors in a float16 region raised "Unexpected floating ScalarType").

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
}

}  // namespace
