// One random generator per openreg device.
//
// Kernels run later than the host launches them, so a generator cannot be
// consumed inside a kernel: a manual_seed() issued meanwhile would change
// numbers of work already queued. Instead, like CUDA's Philox offsets, each
// random op takes a fresh 64-bit seed from the device generator at launch
// (on the host) and its kernel draws from a CPU generator seeded with it.
// Results are reproducible under manual_seed and the state is host-side.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace c10::openreg {

struct OpenRegGeneratorImpl : public c10::GeneratorImpl {
  explicit OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // A generator for one kernel launch (call with the generator's mutex held).
  at::Generator kernel_generator();

 private:
  OpenRegGeneratorImpl* clone_impl() const override;
  at::Generator cpu_;  // the host-side state: a CPU generator
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace c10::openreg
