// Backend metadata: storage on the TensorImpl, and the serialization hooks that
// carry it through torch.save / torch.load.
//
// torch.save asks torch::jit::getTensorMetadata(t) for a dict of bools and stores
// it with the tensor; torch.load passes the dict to setTensorMetadata(t, dict)
// once the tensor is rebuilt on its target device. Both consult the functions
// registered here for PrivateUse1 (the only device type torch allows). A tensor
// loaded onto the CPU (map_location="cpu") has no such functions: its openreg
// keys are dropped, which is what a machine without openreg needs.
#include "OpenRegBackendMeta.h"

#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <string>
#include <unordered_map>

namespace c10::openreg {

namespace {

constexpr const char* kCompressedKey = "openreg.compressed";
constexpr int kFormatBits = 4;  // values are bools only: the format travels as bits
std::string format_key(int bit) { return "openreg.format.bit" + std::to_string(bit); }

void to_serialized(const at::Tensor& t, std::unordered_map<std::string, bool>& out) {
  const auto* meta = get_backend_meta(t);
  if (meta == nullptr) return;
  for (int bit = 0; bit < kFormatBits; ++bit) out[format_key(bit)] = (meta->format >> bit) & 1;
  out[kCompressedKey] = meta->compressed;
}

void from_serialized(const at::Tensor& t, std::unordered_map<std::string, bool>& in) {
  auto compressed = in.find(kCompressedKey);
  if (compressed == in.end()) return;  // saved without openreg metadata
  int64_t format = 0;
  for (int bit = 0; bit < kFormatBits; ++bit) {
    auto it = in.find(format_key(bit));
    TORCH_CHECK(it != in.end(), "corrupt openreg backend metadata in checkpoint: '", format_key(bit), "' is missing");
    if (it->second) format |= int64_t{1} << bit;
  }
  set_backend_meta(t, format, compressed->second);
}

const bool serialization_registered = [] {
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &to_serialized, &from_serialized);
  return true;
}();

}  // namespace

void set_backend_meta(const at::Tensor& t, int64_t format, bool compressed) {
  TORCH_CHECK(t.defined(), "set_backend_meta: the tensor is undefined");
  TORCH_CHECK(t.device().is_privateuseone(), "backend metadata belongs to openreg tensors, got a tensor on ",
              t.device());
  TORCH_CHECK(format >= 0 && format <= OpenRegBackendMeta::kMaxFormat, "backend metadata format must be in 0..",
              OpenRegBackendMeta::kMaxFormat, ", got ", format);
  t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<OpenRegBackendMeta>(format, compressed));
}

const OpenRegBackendMeta* get_backend_meta(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  return dynamic_cast<const OpenRegBackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

void clear_backend_meta(const at::Tensor& t) {
  if (t.defined()) t.unsafeGetTensorImpl()->set_backend_meta(nullptr);
}

}  // namespace c10::openreg
