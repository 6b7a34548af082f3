#include "OpenRegGenerator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GeneratorImpl.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "OpenRegException.h"
#include "OpenRegFunctions.h"
#include "openreg/runtime.hpp"

namespace c10::openreg {

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : OpenRegGeneratorImpl(device, c10::make_intrusive<OpenRegGeneratorState>(seed)) {}

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device, c10::intrusive_ptr<OpenRegGeneratorState> state)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      state_(std::move(state)) {}

void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) {
  state_->seed = seed;
  state_->offset = 0;
}
uint64_t OpenRegGeneratorImpl::current_seed() const { return state_->seed; }

uint64_t OpenRegGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(random);
  return random;
}

// CUDA's rule: a Philox counter gives four 32-bit values, so offsets are multiples of 4.
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4");
  state_->offset = offset;
}
uint64_t OpenRegGeneratorImpl::get_offset() const { return state_->offset; }

namespace {
constexpr size_t kStateBytes = 2 * sizeof(int64_t);  // seed, offset: CUDA's layout
}

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK_TYPE(new_state.layout() == c10::kStrided && new_state.device().is_cpu() &&
                       new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                   "RNG state must be a torch.ByteTensor");
  TORCH_CHECK(new_state.is_contiguous(), "RNG state must be contiguous");
  // As CUDA's: the seed and the offset, or the seed alone (offset 0).
  const auto size = static_cast<size_t>(new_state.numel());
  TORCH_CHECK(size == kStateBytes || size == sizeof(int64_t), "RNG state is wrong size: expected ", kStateBytes,
              " bytes (seed and offset) or ", sizeof(int64_t), " (seed only), as CUDA's, got ", size);
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  int64_t seed = 0, offset = 0;
  std::memcpy(&seed, bytes, sizeof(seed));
  if (size == kStateBytes) std::memcpy(&offset, bytes + sizeof(seed), sizeof(offset));
  TORCH_CHECK(offset % 4 == 0, "RNG state offset must be a multiple of 4, got ", offset);
  state_->seed = static_cast<uint64_t>(seed);
  state_->offset = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  // Allocated directly, not through the dispatcher: AOTAutograd reads the state under a fake mode,
  // which would make a dispatched empty() a tensor without data.
  at::TensorBase state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte, std::nullopt,
                                               std::nullopt, std::nullopt, std::nullopt);
  const int64_t seed = static_cast<int64_t>(state_->seed), offset = static_cast<int64_t>(state_->offset);
  std::memcpy(state.data_ptr<uint8_t>(), &seed, sizeof(seed));
  std::memcpy(state.data_ptr<uint8_t>() + sizeof(seed), &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

uint64_t OpenRegGeneratorState::kernel_seed(uint64_t values) {
  // Philox4x32-10 keyed by the seed at counter `offset / 4`: one 64-bit seed for the kernel's CPU generator.
  at::philox_engine engine(seed, /*subsequence=*/0, /*offset=*/offset / 4);
  const uint64_t high = engine(), low = engine();
  offset += OpenRegGeneratorImpl::offset_increment(values);
  return (high << 32) | low;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The kernel's CPU generator, a Mersenne Twister, takes its whole state (624 words) from the 64-bit
// kernel seed, through SplitMix64. Seeded as a CPU generator is seeded, it kept only the seed's low
// 32 bits (at::mt19937 does): with a fresh seed per launch, two launches drew the same numbers after
// about 77,000 random ops, and two manual seeds gave the same stream one time in 2^32 (hunt36c).
void seed_kernel_generator(at::CPUGeneratorImpl& kernel, uint64_t seed) {
  at::mt19937 engine = kernel.engine();
  at::mt19937_data_pod data = engine.data();
  uint64_t x = seed;
  for (size_t i = 0; i + 1 < data.state_.size(); i += 2) {
    const uint64_t z = splitmix64(x);
    data.state_[i] = static_cast<uint32_t>(z);
    data.state_[i + 1] = static_cast<uint32_t>(z >> 32);
  }
  data.seed_ = seed;
  data.seeded_ = true;
  data.left_ = 1;  // the first draw twists the state, as after at::mt19937's own seeding
  data.next_ = 0;
  engine.set_data(data);
  kernel.set_engine(engine);
  kernel.set_next_float_normal_sample(std::nullopt);  // a replay's kernel keeps no draw of the last one
  kernel.set_next_double_normal_sample(std::nullopt);
}
}  // namespace

// One of this thread's kernel generators that no launch holds any more, or a new one: making one
// (a CPUGeneratorImpl seeds its engine's 624 words on construction, then ours are written over them)
// took a tenth of a random op's host time.
at::Generator unused_kernel_generator() {
  thread_local std::array<at::Generator, 8> pool;
  for (at::Generator& g : pool) {
    if (!g.defined()) return g = at::make_generator<at::CPUGeneratorImpl>();
    // An acquire load: the draws of the kernel that dropped it last happened before its reseeding.
    if (g.getIntrusivePtr().is_uniquely_owned()) return g;
  }
  return at::make_generator<at::CPUGeneratorImpl>();  // all eight in queued launches
}

at::Generator OpenRegGeneratorImpl::kernel_generator(uint64_t values) {
  at::Generator kernel = unused_kernel_generator();
  seed_kernel_generator(*kernel.get<at::CPUGeneratorImpl>(), state_->kernel_seed(values));
  return kernel;
}

// CUDA's semantics: the two generators share one state from here on (not a copy of it).
void OpenRegGeneratorImpl::graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& new_state) {
  TORCH_CHECK(new_state, "graphsafe_set_state: expected a generator, got None");
  auto* other = dynamic_cast<OpenRegGeneratorImpl*>(new_state.get());
  TORCH_CHECK_TYPE(other != nullptr, "graphsafe_set_state: expected an openreg generator, got one for device ",
                   new_state->device());
  TORCH_CHECK(other->device() == device(), "graphsafe_set_state: the generator is for ", other->device(),
              ", this one for ", device());
  state_ = other->state_;
}

c10::intrusive_ptr<c10::GeneratorImpl> OpenRegGeneratorImpl::graphsafe_get_state() const {
  return c10::make_intrusive<OpenRegGeneratorImpl>(device().index(), state_);
}

namespace {
std::mutex& captures_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_map<void*, std::vector<CapturedRandomOp>>& captures() {  // capturing stream -> its random ops
  static auto* map = new std::unordered_map<void*, std::vector<CapturedRandomOp>>();
  return *map;
}
std::atomic<int> g_capturing{0};  // streams capturing now: the hot path looks at nothing else
}  // namespace

void begin_random_capture(void* stream) {
  std::lock_guard<std::mutex> lock(captures_mu());
  if (captures().emplace(stream, std::vector<CapturedRandomOp>()).second) g_capturing.fetch_add(1);
}

std::vector<CapturedRandomOp> end_random_capture(void* stream) {
  std::lock_guard<std::mutex> lock(captures_mu());
  auto it = captures().find(stream);
  if (it == captures().end()) return {};
  std::vector<CapturedRandomOp> ops = std::move(it->second);
  captures().erase(it);
  g_capturing.fetch_sub(1);
  return ops;
}

bool random_capture_active(void* stream) {
  if (g_capturing.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(captures_mu());
  return captures().count(stream) != 0;
}

bool note_random_launch(void* stream, const CapturedRandomOp& op) {
  if (g_capturing.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(captures_mu());
  auto it = captures().find(stream);
  if (it == captures().end()) return false;
  it->second.push_back(op);
  return true;
}

void reseed_for_replay(void* stream, const std::vector<CapturedRandomOp>& ops) {
  if (ops.empty()) return;
  std::vector<std::pair<at::Generator, uint64_t>> seeds;
  for (const CapturedRandomOp& op : ops) {
    at::Generator source = op.source;
    std::lock_guard<std::mutex> lock(source.mutex());
    seeds.emplace_back(op.kernel, op.state->kernel_seed(op.values));
  }
  OPENREG_CHECK(
      ::openreg::launch(static_cast<orStream_t>(stream), "openreg::graph_reseed", [seeds = std::move(seeds)]() mutable {
        for (auto& [kernel, seed] : seeds) {
          std::lock_guard<std::mutex> lock(kernel.mutex());
          seed_kernel_generator(*kernel.get<at::CPUGeneratorImpl>(), seed);
        }
      }));
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {  // a copy of the state, not a share
  auto state = c10::make_intrusive<OpenRegGeneratorState>(state_->seed);
  state->offset = state_->offset;
  return new OpenRegGeneratorImpl(device().index(), std::move(state));
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
