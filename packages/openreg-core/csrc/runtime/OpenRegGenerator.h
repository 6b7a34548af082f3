// One random generator per openreg device, with CUDA's state: a Philox4x32-10 seed and offset.
//
// Kernels run later than the host launches them, so a generator cannot be consumed inside a kernel:
// a manual_seed() issued meanwhile would change numbers of work already queued. As on CUDA, each
// random op takes its position from the generator at launch, on the host: the op gets the current
// (seed, offset) and the offset advances by the number of 32-bit values the op may draw, rounded up
// to a multiple of 4 (one Philox counter gives four): max(4, numel rounded up to 4) for the op's
// largest tensor argument. The kernel then draws from a CPU generator seeded with Philox4x32-10 of
// (seed, offset), so an op's numbers depend only on (seed, offset), not on the stream, the thread
// count or what ran before on the device.
//
// The state is CUDA's: 16 bytes, the seed then the offset, each a little-endian int64
// (get_rng_state/set_rng_state), which DTensor's random-op tracker and FSDP2's meta-device
// initialisation read and write. Unlike CUDA's kernels, element i of an op is not Philox of
// (seed, offset + i / 4): the op's values come from the CPU kernel, so a tensor generated in shards
// at adjacent offsets does not equal the same tensor generated whole. Captured into a device graph,
// random ops draw fresh numbers on every replay (see CapturedRandomOp below).
//
// The (seed, offset) pair lives in an OpenRegGeneratorState that generators can share, as CUDA's
// CUDAGeneratorState: graphsafe_get_state() returns a generator drawing from the same state and
// graphsafe_set_state() points a generator at another's. AOTAutograd's graph-safe RNG
// functionalisation (activation checkpointing of random ops under torch.compile) swaps the default
// generator's state this way around each recomputed random op.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <vector>

namespace c10::openreg {

struct OpenRegGeneratorState : public c10::intrusive_ptr_target {
  explicit OpenRegGeneratorState(uint64_t seed) : seed(seed) {}
  // The seed a kernel generator gets for one launch that may draw up to `values` 32-bit values; advances
  // the offset (call with the mutex of a generator holding this state held).
  uint64_t kernel_seed(uint64_t values);

  uint64_t seed;
  uint64_t offset = 0;
};

struct OpenRegGeneratorImpl : public c10::GeneratorImpl {
  explicit OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  OpenRegGeneratorImpl(c10::DeviceIndex device, c10::intrusive_ptr<OpenRegGeneratorState> state);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& new_state) override;
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // A generator for one kernel launch that may draw up to `values` 32-bit values; advances the
  // offset (call with the generator's mutex held).
  at::Generator kernel_generator(uint64_t values);
  // The state this generator draws from now.
  const c10::intrusive_ptr<OpenRegGeneratorState>& state() const { return state_; }

  // How far one op that may draw `values` 32-bit values advances the offset.
  static uint64_t offset_increment(uint64_t values) { return values < 4 ? 4 : (values + 3) / 4 * 4; }

 private:
  OpenRegGeneratorImpl* clone_impl() const override;
  c10::intrusive_ptr<OpenRegGeneratorState> state_;
};

// Graph-safe random numbers. A random op captured into a device graph keeps the kernel generator
// it got at capture; replaying the graph would repeat its numbers. So while a stream captures, the
// kernel generators handed out for it are recorded (the capture itself leaves the generator's
// offset alone: its kernels do not run), and each replay first queues a kernel that seeds them
// from their generators' current (seed, offset), advancing the offsets as a launch would: every
// replay draws fresh numbers, reproducibly under manual_seed (CUDA graphs do the same with a
// per-replay Philox offset).
struct CapturedRandomOp {
  at::Generator source;                             // the openreg generator the op drew from (for its mutex)
  c10::intrusive_ptr<OpenRegGeneratorState> state;  // the state it drew from: replays advance this one
  at::Generator kernel;                             // the CPU generator its captured kernel reads
  uint64_t values;
};
void begin_random_capture(void* stream);
std::vector<CapturedRandomOp> end_random_capture(void* stream);
// Whether `stream` captures now (one relaxed load when no stream does).
bool random_capture_active(void* stream);
// Records `op` if `stream` is capturing (seed_generators calls it for every random launch captured);
// false if the capture ended meanwhile.
bool note_random_launch(void* stream, const CapturedRandomOp& op);
// Re-seeds a graph's captured random ops, in stream order, before its replay on `stream`.
void reseed_for_replay(void* stream, const std::vector<CapturedRandomOp>& ops);

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace c10::openreg
