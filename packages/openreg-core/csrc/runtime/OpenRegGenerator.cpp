#include "OpenRegGenerator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "OpenRegFunctions.h"

namespace c10::openreg {

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
uint64_t OpenRegGeneratorImpl::current_seed() const { return seed_; }

uint64_t OpenRegGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(random);
  return random;
}

// CUDA's rule: a Philox counter gives four 32-bit values, so offsets are multiples of 4.
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4");
  offset_ = offset;
}
uint64_t OpenRegGeneratorImpl::get_offset() const { return offset_; }

namespace {
constexpr size_t kStateBytes = 2 * sizeof(int64_t);  // seed, offset: CUDA's layout
}

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK_TYPE(new_state.layout() == c10::kStrided && new_state.device().is_cpu() &&
                       new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                   "RNG state must be a torch.ByteTensor");
  TORCH_CHECK(new_state.is_contiguous(), "RNG state must be contiguous");
  TORCH_CHECK(static_cast<size_t>(new_state.numel()) == kStateBytes, "RNG state is wrong size: expected ",
              kStateBytes, " bytes (seed and offset, as CUDA's), got ", new_state.numel());
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  int64_t seed = 0, offset = 0;
  std::memcpy(&seed, bytes, sizeof(seed));
  std::memcpy(&offset, bytes + sizeof(seed), sizeof(offset));
  TORCH_CHECK(offset % 4 == 0, "RNG state offset must be a multiple of 4, got ", offset);
  seed_ = static_cast<uint64_t>(seed);
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
  const int64_t seed = static_cast<int64_t>(seed_), offset = static_cast<int64_t>(offset_);
  std::memcpy(state.data_ptr<uint8_t>(), &seed, sizeof(seed));
  std::memcpy(state.data_ptr<uint8_t>() + sizeof(seed), &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

at::Generator OpenRegGeneratorImpl::kernel_generator(uint64_t values) {
  // Philox4x32-10 keyed by the seed at counter `offset / 4`: one 64-bit seed for the kernel's CPU generator.
  at::philox_engine engine(seed_, /*subsequence=*/0, /*offset=*/offset_ / 4);
  const uint64_t high = engine(), low = engine();
  offset_ += offset_increment(values);
  return at::make_generator<at::CPUGeneratorImpl>((high << 32) | low);
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  auto* gen = new OpenRegGeneratorImpl(device().index(), seed_);
  gen->offset_ = offset_;
  return gen;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once[64];
  static at::Generator gens[64];
  if (device < 0) device = current_device();
  check_device_index(device);
  std::call_once(once[device], [&] {
    gens[device] = at::make_generator<OpenRegGeneratorImpl>(device);
    gens[device].seed();
  });
  return gens[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<OpenRegGeneratorImpl>(device);
}

}  // namespace c10::openreg
