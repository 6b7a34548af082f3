#include "OpenRegGenerator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>

#include "OpenRegFunctions.h"

namespace c10::openreg {

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) { cpu_.set_current_seed(seed); }
uint64_t OpenRegGeneratorImpl::current_seed() const { return cpu_.current_seed(); }
uint64_t OpenRegGeneratorImpl::seed() { return cpu_.seed(); }

// A Mersenne Twister generator's position is all in its state: its offset is always 0.
// torch.Generator.__reduce__ (pickle, deepcopy) reads the offset of every non-CPU generator
// and sets it back, so 0 must read and write.
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset == 0, "openreg generators have no offset (they are Mersenne Twister based, not Philox): got ",
              offset);
}
uint64_t OpenRegGeneratorImpl::get_offset() const { return 0; }

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  cpu_.set_state(
      at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(&new_state))));
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  return cpu_.get_state().getIntrusivePtr();
}

at::Generator OpenRegGeneratorImpl::kernel_generator() {
  const uint64_t seed = cpu_.get<at::CPUGeneratorImpl>()->random64();
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  auto* gen = new OpenRegGeneratorImpl(device().index());
  gen->cpu_ = cpu_.clone();
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
