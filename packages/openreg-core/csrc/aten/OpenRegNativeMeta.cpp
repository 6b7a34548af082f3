// Meta kernels that the generic path calls in C++ instead of through the Meta dispatch key.
//
// torch/_meta_registrations.py registers Python meta kernels on the Meta key for about 1,300 ATen
// operators, shadowing the C++ meta kernels of about 600 of them. After its first call a Python meta
// kernel is merely slower than a C++ one; its first call in a process imports sympy and torch._dynamo
// (0.5-2.5 s). A CUDA or CPU operator never runs a meta kernel, so without this table openreg's first
// randn, arange or softmax would cost seconds where the CPU's costs a millisecond, in every new
// process (DataLoader workers, distributed ranks). So the generic path calls PyTorch's own C++ meta
// functions (at::meta::*, the kernels the Python ones shadow) directly, for every operator that has
// one (the table is generated at build time from torch's headers by gen_native_meta.py), and the
// meta functions written here for common operators that have none in C++ (they mirror the checks
// and result layout of the CPU kernel). Every other operator still asks the Meta key.
#include "OpenRegNativeMeta.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>

#include <string_view>

#include "OpenRegFallback.h"

namespace c10::openreg {

namespace {

// No C++ meta kernel upstream: the CPU kernel's checks (index_select_out_cpu_) and result shape.
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  TORCH_CHECK(self.dim() > 0 || index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ",
              index.numel(), " value(s)");
  // An empty input indexed along an empty dimension: refused from the shapes alone, at the call.
  TORCH_CHECK(self.dim() <= 1 || index.numel() == 0 || self.numel() > 0 || self.size(dim) > 0,
              "index_select(): self indexing axis dim should be positive");
  auto sizes = self.sizes().vec();
  if (self.dim() > 0) sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

// No C++ meta kernel upstream: the CPU kernel's checks (_check_layer_norm_inputs) and results:
// the output like a contiguous input; mean and rstd of the statistics' dtype (float for reduced-
// precision input with float parameters, else the input's), shaped input[:axis] + [1] * normalized.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input,
                                                                 c10::IntArrayRef normalized_shape,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps) {
  const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
  at::native::_check_layer_norm_inputs(input, normalized_shape, w, b);
  const bool mixed = at::isReducedFloatingType(input.scalar_type()) &&
                     ((w.defined() && w.scalar_type() == at::kFloat) || (b.defined() && b.scalar_type() == at::kFloat));
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  const auto stats = input.options().dtype(mixed ? at::kFloat : input.scalar_type());
  return {at::empty(input.sizes(), input.options()), at::empty(stat_shape, stats), at::empty(stat_shape, stats)};
}

// No meta kernel upstream for these fused optimizer steps (torch 2.13 has Python ones for
// _fused_adam_ and _fused_adamw_ with a float lr only). They update their lists in place and return
// nothing; without a meta kernel the generic path ran every call synchronously, and refused them in
// a graph capture, where CUDA runs and captures them (hunt36a). Argument errors stay the CPU
// kernel's, raised at the call: each signature's first call runs synchronously and is verified
// (generic-path.md, step 4), the lists' lengths are part of the signature, and what it does not hold
// (a nonzero momentum without momentum buffers, a tensor lr of several elements) is refused here,
// which sends the call to the CPU kernel synchronously (review36).
void fused_optimizer_step(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const c10::IValue* first = stack->data() + stack->size() - arguments.size();
  auto argument = [&](std::string_view name) -> const c10::IValue* {
    for (size_t i = 0; i < arguments.size(); ++i)
      if (arguments[i].name() == name) return first + i;
    return nullptr;
  };
  const size_t params = argument("self")->toTensorList().size();
  const c10::IValue* momentum = argument("momentum");
  if (momentum != nullptr && momentum->toDouble() != 0.0)
    TORCH_CHECK(argument("momentum_buffer_list")->toTensorList().size() == params, "momentum without its buffers");
  const c10::IValue* lr = argument("lr");
  if (lr != nullptr && lr->isTensor()) TORCH_CHECK(lr->toTensor().numel() == 1, "a tensor lr of several elements");
  torch::jit::drop(*stack, arguments.size());
}

const NativeMetaTable& table() {
  static const NativeMetaTable* t = [] {
    auto* t = new NativeMetaTable();  // never destroyed: ops may run during interpreter shutdown
    t->emplace(c10::OperatorName("aten::index_select", ""),
               c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(index_select)));
    t->emplace(c10::OperatorName("aten::native_layer_norm", ""),
               c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(native_layer_norm)));
    for (const auto& [name, overload] : {std::pair{"aten::_fused_sgd_", ""},
                                         {"aten::_fused_sgd_", "tensor_lr"},
                                         {"aten::_fused_adagrad_", ""},
                                         {"aten::_fused_adagrad_", "tensor_lr"},
                                         {"aten::_fused_adam_", "tensor_lr"},
                                         {"aten::_fused_adamw_", "tensor_lr"}})
      t->emplace(c10::OperatorName(name, overload),
                 c10::KernelFunction::makeFromBoxedFunction<&fused_optimizer_step>());
    add_upstream_meta_kernels(*t);
    return t;
  }();
  return *t;
}

}  // namespace

const c10::KernelFunction* native_meta_kernel(const c10::OperatorName& name) {
  const NativeMetaTable& t = table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<std::string> native_meta_operators() {
  std::vector<std::string> names;
  for (const auto& [name, kernel] : table()) names.push_back(c10::toString(name));
  return names;
}

}  // namespace c10::openreg
