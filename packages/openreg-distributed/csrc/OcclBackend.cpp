// occl's collectives: checks at the call, one kernel per operation on the comm stream, and the
// emulation of what the transport lacks (AVG on integers, PREMUL_SUM, dtypes it cannot carry).
#include "OcclBackend.hpp"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "torch_openreg/aten/OpenRegKernelTensor.h"
#include "torch_openreg/runtime/OpenRegException.h"
#include "torch_openreg/runtime/OpenRegStream.h"

namespace openreg_distributed {

namespace {

using c10::openreg::KernelTensorArg;
using Args = std::vector<KernelTensorArg>;
using ms = std::chrono::milliseconds;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
}

// TORCH_OCCL_ASYNC_ERROR_HANDLING (0-3, NCCL's values); unset: 3 (SkipCleanUp), NCCL's default.
ErrorHandling error_handling_from_env(bool blocking_wait) {
  // As NCCL: blocking wait reports errors at wait(), and the watchdog then does nothing more.
  if (blocking_wait) return ErrorHandling::kNoHandling;
  const char* v = std::getenv("TORCH_OCCL_ASYNC_ERROR_HANDLING");
  if (v == nullptr || *v == '\0') return ErrorHandling::kSkipCleanUp;
  const std::string s(v);
  TORCH_CHECK(s.size() == 1 && s[0] >= '0' && s[0] <= '3',
              "occl: TORCH_OCCL_ASYNC_ERROR_HANDLING must be 0 (no handling), 1 (tear down), 2 (clean up only) or 3 "
              "(skip clean up), got '",
              s, "'");
  return static_cast<ErrorHandling>(s[0] - '0');
}

constexpr auto kWatchdogPoll = std::chrono::milliseconds(100);  // NCCL's watchdog sleeps as long

// The key under which a rank reports its group's first failure to the peers (the group's store is
// already prefixed by the group's name).
constexpr const char* kPeerErrorKey = "occl/first_error";

std::atomic<size_t> next_pg_id{0};

// ---- checks at the call: errors name the operation and surface where the user made the call ----
// As NCCL's: ValueError for a tensor or size the operation cannot take, TypeError for mismatched dtypes.

// What layout a tensor may have: a collective's own tensors must be contiguous (in their suggested
// memory format); a send or receive takes any dense layout (as NCCL's); a member of a list form's
// per-rank list any layout at all (NCCL and Gloo copy members in and out of a flat buffer), but a
// member written to must not have elements that share memory (an expand()ed tensor), as Gloo checks
// at the call: accepted, its copy-out failed on the comm stream and took both processes down.
enum class Layout { kContiguous, kDense, kAny, kAnyWritten };

// A lazy conj() or neg() view: its memory holds the conjugate or the negation of its values.
bool has_lazy_bit(const at::Tensor& t) { return t.is_conj() || t.is_neg(); }

void check_tensor(const char* op, const at::Tensor& t, std::optional<c10::Device> device = std::nullopt,
                  Layout layout = Layout::kContiguous) {
  TORCH_CHECK_VALUE(t.defined(), "occl ", op, ": got an undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "occl ", op, ": only dense (strided) tensors are supported, got ",
                    t.layout());
  TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, "occl ", op,
                    ": tensors must be on an openreg device, got a tensor on ", t.device());
  if (device) {
    TORCH_CHECK_VALUE(t.device() == *device, "occl ", op, ": all tensors must be on one device, got ", *device, " and ",
                      t.device());
  }
  // NCCL's rule (ProcessGroupNCCL's check_gpu_single_tensor): contiguous in the tensor's suggested memory
  // format, so channels_last tensors (a channels_last conv model's gradients) are taken; send and receive
  // take any layout, moved in memory order. occl refused anything but is_contiguous(), and takes dense
  // tensors only for p2p (NCCL reads numel() elements from data_ptr() whatever the gaps).
  if (layout == Layout::kAnyWritten) at::assert_no_internal_overlap(t);  // ATen's message, as Gloo's
  // A list member's values are copied in and out by value (logical()), as NCCL and Gloo copy them.
  if (layout == Layout::kAny || layout == Layout::kAnyWritten) return;
  // A collective's own tensor moves as its memory, which a lazy conj() or neg() view does not hold
  // (its values are the memory's conjugate or negation): refused here, where it failed in the kernel
  // (Tensor.view of a conjugate view) and the async error handling ended every rank.
  TORCH_CHECK_VALUE(!has_lazy_bit(t), "occl ", op,
                    ": a tensor with its conjugate or negative bit set (a lazy conj() or neg() view) cannot be "
                    "sent as its memory: pass t.resolve_conj() or t.resolve_neg()");
  if (layout == Layout::kDense) {
    TORCH_CHECK_VALUE(t.is_non_overlapping_and_dense(), "occl ", op,
                      ": tensors must be dense (no gaps or overlaps between elements), got sizes ", t.sizes(),
                      " and strides ", t.strides());
    if (!t.is_contiguous()) {
      TORCH_WARN_ONCE("occl ", op,
                      ": a non-contiguous tensor is sent or received in memory order; the sender's and the "
                      "receiver's tensors must have the same layout (as with NCCL)");
    }
  } else {
    TORCH_CHECK_VALUE(t.is_contiguous(t.suggest_memory_format()), "occl ", op, ": tensors must be contiguous");
  }
}

c10::Device check_tensors(const char* op, const std::vector<at::Tensor>& ts, Layout layout = Layout::kContiguous) {
  TORCH_CHECK_VALUE(!ts.empty(), "occl ", op, ": expects at least one tensor");
  const c10::Device device = ts.front().defined() ? ts.front().device() : c10::Device(c10::DeviceType::CPU);
  for (const auto& t : ts) check_tensor(op, t, device, layout);
  return device;
}

void check_single(const char* op, size_t n, const char* what) {
  TORCH_CHECK_VALUE(n == 1, "occl ", op, ": expects exactly one ", what, " tensor (list) per process, got ", n);
}

void check_same_dtype(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "occl ", op, ": input and output dtypes differ (",
                   a.scalar_type(), " and ", b.scalar_type(), ")");
}

// The root's list of per-rank tensors of gather (outputs) and scatter (inputs), `role` naming them:
// one list, world size tensors on `device`, each of `like`'s dtype and element count. A non-root
// rank passes none.
std::vector<at::Tensor> root_list(const char* op, const char* role, const std::vector<std::vector<at::Tensor>>& lists,
                                  bool is_root, int root, int world_size, c10::Device device, const at::Tensor& like,
                                  const char* like_role, Layout layout) {
  if (!is_root) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(), "occl ", op, ": only the root (rank ", root, ") takes ", role,
                      " tensors");
    return {};
  }
  check_single(op, lists.size(), role);
  const std::vector<at::Tensor>& ts = lists[0];
  TORCH_CHECK_VALUE(static_cast<int>(ts.size()) == world_size, "occl ", op, ": the root expects world size (",
                    world_size, ") ", role, " tensors, got ", ts.size());
  for (const auto& t : ts) {
    check_tensor(op, t, device, layout);
    check_same_dtype(op, like, t);
    TORCH_CHECK_VALUE(t.numel() == like.numel(), "occl ", op, ": ", role, " tensors must have the ", like_role, "'s ",
                      like.numel(), " elements, got ", t.numel());
  }
  return ts;
}

// The dtypes Gloo carries and reduces natively; others move as raw bytes and cannot be reduced.
bool transport_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
    case c10::kDouble:
    case c10::kHalf:
    case c10::kBFloat16:
    case c10::kChar:
    case c10::kByte:
    case c10::kInt:
    case c10::kLong:
    case c10::kBool:
      return true;
    default:
      return false;
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

// ---- device side: the views the transport sees ----

std::vector<at::Tensor> views(const Args& args) {
  std::vector<at::Tensor> out;
  out.reserve(args.size());
  for (const auto& a : args) out.push_back(a.materialize());
  return out;
}

// The kernel's argument for a tensor check_tensor took: the tensor itself when it is contiguous, else a
// 1-D alias of its memory (a dense layout such as channels_last covers exactly numel() elements from its
// storage offset), so the transport moves and reduces it in memory order, as NCCL does. The kernel's
// view(-1) of the tensor itself failed for such layouts.
KernelTensorArg kernel_arg(const at::Tensor& t) {
  return t.is_contiguous() ? KernelTensorArg(t) : KernelTensorArg(t.as_strided({t.numel()}, {1}));
}

Args args_of(const std::vector<at::Tensor>& ts) {
  Args args;
  args.reserve(ts.size());
  for (const auto& t : ts) args.push_back(kernel_arg(t));
  return args;
}

// A 1-D view the transport can carry: the tensor itself for Gloo's dtypes, its bytes otherwise
// (float8, uint16, complex32, ...): data movement does not care what the bytes mean.
at::Tensor carried(const at::Tensor& t) {
  at::Tensor flat = t.view({-1});
  return transport_dtype(t.scalar_type()) ? flat : flat.view(at::kByte);
}

// ---- list forms: members of any layout, in logical order ----
// NCCL and Gloo copy a per-rank list's members into a flat buffer and out of it (tensor.copy_), so a
// member may have any layout (a column of a matrix); occl's kernel sees each as it is. The rank's own
// tensor of a list form (gather's and all_gather's input, scatter's and reduce_scatter's output) moves
// in logical order too: in memory order, a channels_last one met its peers' members scrambled.

Args member_args_of(const std::vector<at::Tensor>& ts) {
  Args args;
  args.reserve(ts.size());
  for (const auto& t : ts) args.emplace_back(t);
  return args;
}

// A member's values, without a lazy conjugate or negative bit (see has_lazy_bit): a copy of such a
// member, the member itself otherwise. The kernel read its memory and failed.
at::Tensor logical(const at::Tensor& t) { return t.resolve_conj().resolve_neg(); }

// A member's elements in logical order, as one 1-D tensor the transport can carry (the member itself
// when it is contiguous, else a copy).
at::Tensor flat_member(const at::Tensor& t) { return carried(logical(t).contiguous()); }

// Writes a carried 1-D tensor into a member, element by element in logical order.
void copy_into_member(const at::Tensor& member, const at::Tensor& flat) {
  const at::Tensor typed = flat.scalar_type() == member.scalar_type() ? flat : flat.view(member.scalar_type());
  member.copy_(typed.view(member.sizes()));
}

// Where the transport writes a member: the member itself when it is contiguous (and holds its values
// as they are, see logical()), else a buffer that copy_back() then copies into it.
struct MemberOutput {
  at::Tensor member, buffer;
  explicit MemberOutput(at::Tensor m)
      : member(std::move(m)),
        buffer(member.is_contiguous() && !has_lazy_bit(member) ? member : at::empty(member.sizes(), member.options())) {
  }
  at::Tensor carried_buffer() const { return carried(buffer); }
  void copy_back() const {
    if (!buffer.is_same(member)) member.copy_(buffer);
  }
};

// How a ReduceOp is carried out: the transport's op plus what occl adds before and after.
struct Reduction {
  c10d::ReduceOp op{c10d::ReduceOp::SUM};
  bool premul = false;
  double factor = 1.0;
  std::optional<KernelTensorArg> factor_tensor;  // PREMUL_SUM with a device tensor factor
  at::Tensor factor_host;                        // ... or a CPU one
  bool average = false;
  bool integral = false;
  int size = 1;

  // In place (the tensor is the output too) or into a copy (it is an input only).
  at::Tensor scaled(const at::Tensor& t, bool in_place) const {
    if (!premul) return t;
    at::Tensor f = factor_tensor ? factor_tensor->materialize() : factor_host;
    if (in_place) return f.defined() ? t.mul_(f) : t.mul_(factor);
    return f.defined() ? t.mul(f) : t.mul(factor);
  }
  void finish(const at::Tensor& t) const {
    if (!average) return;
    if (integral)
      const_cast<at::Tensor&>(t).div_(size, "trunc");  // NCCL's integer average truncates
    else
      const_cast<at::Tensor&>(t).div_(size);
  }
};

// The 1-D view a reduction works on: complex tensors as their real and imaginary parts
// (view_as_real), which SUM, AVG and PREMUL_SUM by a real factor reduce exactly.
at::Tensor reduced_view(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t).view({-1}) : t.view({-1}); }

// Refusals as NCCL's: a TypeError for what the dtype cannot take, a ValueError for an op no dtype takes.
// A device factor of PREMUL_SUM goes to `factors`, for the operation to keep (see OcclBackend::enqueue).
Reduction reduction(const char* op, const c10d::ReduceOp& rop, c10::ScalarType dtype, int size, c10::Device device,
                    std::vector<at::Tensor>& factors) {
  if (c10::isComplexType(dtype)) {
    // What Gloo and torch.distributed allow on complex tensors: the ops that act on each part alone.
    const auto o = rop.op_;
    TORCH_CHECK_VALUE(o == c10d::ReduceOp::SUM || o == c10d::ReduceOp::AVG || o == c10d::ReduceOp::PREMUL_SUM, "occl ",
                      op, ": ReduceOp.", op_name(o),
                      " is not supported on complex tensors (SUM, AVG and PREMUL_SUM are)");
    dtype = c10::toRealValueType(dtype);
  }
  TORCH_CHECK_TYPE(transport_dtype(dtype), "occl ", op, ": reductions of ", dtype,
                   " are not supported (data movement of it is)");
  const bool integral = c10::isIntegralType(dtype, /*includeBool=*/true);
  Reduction r;
  r.size = size;
  r.integral = integral;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      r.op = rop.op_;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK_TYPE(integral, "occl ", op, ": ReduceOp.", op_name(rop.op_), " needs an integer or bool tensor, got ",
                       dtype);
      r.op = rop.op_;
      break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_TYPE(dtype != c10::kBool, "occl ", op, ": ReduceOp.AVG is not defined for bool tensors");
      r.op = c10d::ReduceOp::SUM;
      if (integral) {
        r.average = true;  // a sum, then NCCL's truncating division (Gloo refuses AVG on integers)
      } else {
        // As NCCL's ncclAvg on floating types: each contribution times 1/size, then the sum, so an
        // average of values near the dtype's largest stays finite (a sum first overflowed: fp16
        // 60000 on two ranks gave inf).
        r.premul = true;
        r.factor = 1.0 / size;
      }
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK_TYPE(c10::isFloatingType(dtype), "occl ", op,
                       ": ReduceOp.PREMUL_SUM needs a floating point tensor, got ", dtype);
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "occl ", op, ": ReduceOp.PREMUL_SUM without its factor");
      r.op = c10d::ReduceOp::SUM;
      r.premul = true;
      if (sup->tensor_factor.defined()) {
        const at::Tensor& f = sup->tensor_factor;
        TORCH_CHECK_TYPE(!f.is_complex(), "occl ", op, ": ReduceOp.PREMUL_SUM with a complex factor is not supported");
        if (f.is_privateuseone()) {
          // Read by the collective's kernel on the tensors' device, as NCCL reads a device factor.
          TORCH_CHECK(f.device() == device, "occl ", op, ": the ReduceOp.PREMUL_SUM factor is on ", f.device(),
                      ", the tensors on ", device, " (a device factor must be on the tensors' device)");
          check_tensor(op, f);
          r.factor_tensor.emplace(f);
          factors.push_back(f);
        } else {
          r.factor_host = f;
        }
      } else {
        r.factor = sup->double_factor;
      }
      break;
    }
    default:
      TORCH_CHECK_VALUE(false, "occl ", op, ": unsupported ReduceOp ", op_name(rop.op_));
  }
  return r;
}

// Returns completed events to the pool only once they have completed: destroying (or re-recording)
// an event whose stream has not reached it would block the host.
class EventPool {
 public:
  orEvent_t get() {
    std::lock_guard<std::mutex> g(mu_);
    // A few of the oldest retired events per call, the ones still pending moved to the back: O(1)
    // per operation. Scanning all of them was O(n) with n operations queued ahead of the device
    // (an asynchronous loop of sends and receives spent a third of its time here at n = 10,000).
    for (size_t i = 0; i < kChecksPerGet && !retired_.empty(); ++i) {
      orEvent_t e = retired_.front();
      retired_.pop_front();
      if (orEventQuery(e) != orErrorNotReady)
        free_.push_back(e);
      else
        retired_.push_back(e);
    }
    if (!free_.empty()) {
      orEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    orEvent_t e = nullptr;
    OPENREG_CHECK(orEventCreateWithFlags(&e, orEventDisableTiming));
    return e;
  }
  void put(orEvent_t e) {
    std::lock_guard<std::mutex> g(mu_);
    retired_.push_back(e);
  }

 private:
  static constexpr size_t kChecksPerGet = 4;  // more than an operation retires (ready, end)
  std::mutex mu_;
  std::vector<orEvent_t> free_;
  std::deque<orEvent_t> retired_;
};

// Releases off the caller's threads happen under this lock, and not once stopped (see
// stop_foreign_releases in the header).
std::mutex foreign_release_mu;
bool foreign_releases_stopped = false;

std::function<void(const std::function<void()>&)>& without_gil_hook() {
  static auto* hook = new std::function<void(const std::function<void()>&)>();
  return *hook;
}

void without_gil(const std::function<void()>& fn) {
  if (without_gil_hook())
    without_gil_hook()(fn);
  else
    fn();
}

// Comm streams of backends that went while a kernel of theirs was still queued (see ~OcclBackend),
// with that backend's kernel count: destroyed by a later backend's construction or destruction, on a
// host thread, once those kernels ran (a group destroyed right after an operation, without waiting
// for it, kept its streams and their worker threads for good otherwise).
struct OrphanStreams {
  std::shared_ptr<std::atomic<int64_t>> kernels_queued;
  std::vector<orStream_t> streams;
};
struct Orphans {
  std::mutex mu;
  std::vector<OrphanStreams> list;
};
Orphans& orphans() {  // never destroyed: a backend may go during the interpreter's exit
  static auto* o = new Orphans();
  return *o;
}

void destroy_orphans_whose_kernels_ran() {
  std::vector<orStream_t> ready;
  {
    std::lock_guard<std::mutex> g(orphans().mu);
    auto& list = orphans().list;
    for (auto it = list.begin(); it != list.end();) {
      if (it->kernels_queued->load(std::memory_order_acquire) == 0) {
        ready.insert(ready.end(), it->streams.begin(), it->streams.end());
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (orStream_t stream : ready) orStreamDestroy(stream);  // event records left at most: drained at once
}

// One pool per process: events outlive groups (a Work may outlive its backend).
EventPool& events() {
  static EventPool* pool = new EventPool();  // never destroyed: works may be freed at exit
  return *pool;
}

}  // namespace

void stop_foreign_releases() {
  std::lock_guard<std::mutex> g(foreign_release_mu);
  foreign_releases_stopped = true;
}

void set_without_gil(std::function<void(const std::function<void()>&)> hook) { without_gil_hook() = std::move(hook); }

// ---- OcclWork ----

OcclWork::OcclWork(int rank, c10d::OpType type, uint64_t seq, std::string what, c10::Device device, orEvent_t end,
                   std::shared_ptr<WorkOutcome> outcome, std::vector<at::Tensor> stash, std::vector<at::Tensor> outputs,
                   c10::intrusive_ptr<c10::ivalue::Future> future, std::chrono::milliseconds timeout,
                   bool blocking_wait, std::shared_ptr<GroupError> group)
    : Work(rank, type),
      seq_(seq),
      what_(std::move(what)),
      device_(device),
      end_(end),
      outcome_(std::move(outcome)),
      stash_(std::move(stash)),
      outputs_(std::move(outputs)),
      future_(std::move(future)),
      timeout_(timeout),
      blocking_wait_(blocking_wait),
      group_(std::move(group)) {}

OcclWork::~OcclWork() { events().put(end_); }

float OcclWork::getDuration() const {
  // A staged send's Work ends when its data is copied, before the peer took it (see send()).
  TORCH_CHECK(
      outcome_->finished.load(std::memory_order_acquire), "occl: ", what_,
      ": get_duration() is known once the operation finished",
      retrieveOpType() == c10d::OpType::SEND ? " (a small send's: once the peer received it)" : " (wait for it first)");
  TORCH_CHECK(outcome_->started.load(std::memory_order_acquire), "occl: ", what_,
              ": get_duration(): the operation never ran (it failed before it started)");
  return std::chrono::duration<float, std::milli>(outcome_->finished_at - outcome_->started_at).count();
}

bool OcclWork::isCompleted() { return outcome_->error.failed() || ended(); }

bool OcclWork::ended() const { return orEventQuery(end_) != orErrorNotReady; }

void OcclWork::release_stash() {
  std::vector<at::Tensor> dropped;  // outside the lock
  std::lock_guard<std::mutex> g(stash_mu_);
  dropped.swap(stash_);
}

c10::intrusive_ptr<c10::ivalue::Future> OcclWork::getFuture() {
  if (!outcome_->error.failed()) return future_;
  // The value future was completed at enqueue (device-aware, as NCCL's): once the failure is known,
  // callers get one that raises it.
  if (!failed_future_) {
    failed_future_ = c10::make_intrusive<c10::ivalue::Future>(future_->elementType(), future_->devices());
    failed_future_->setError(exception());
  }
  return failed_future_;
}

bool OcclWork::isSuccess() const { return !outcome_->error.failed(); }

std::exception_ptr OcclWork::exception() const {
  if (!outcome_->error.failed()) return nullptr;
  return std::make_exception_ptr(c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, outcome_->error.message()));
}

void OcclWork::throw_if_failed() const {
  if (outcome_->error.failed()) C10_THROW_ERROR(DistBackendError, outcome_->error.message());
}

int OcclWork::sourceRank() const {
  // c10d's base class refuses the others (Gloo too); a receive from a given rank knows it at once.
  const auto type = const_cast<OcclWork*>(this)->retrieveOpType();
  TORCH_CHECK(type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE,
              "sourceRank() may only be called on work objects that correspond to a recv or recv-from-any call.");
  if (type == c10d::OpType::RECV) return outcome_->source_rank.load();
  if (!const_cast<OcclWork*>(this)->host_wait(timeout_)) {
    C10_THROW_ERROR(DistBackendError, c10::str(what_, ": the sender is not known: the receive did not complete within ",
                                               timeout_.count(), " ms"));
  }
  throw_if_failed();
  return outcome_->source_rank.load();
}

void OcclWork::synchronize() {
  // The caller's current stream waits for the end of the collective; the host does not.
  OPENREG_CHECK(orStreamWaitEvent(c10::openreg::current_stream_handle(device_.index()), end_, 0));
}

bool OcclWork::host_wait(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto nap = std::chrono::microseconds(20);
  // Until the end event, or the watchdog failed the operation (its kernel may still be blocked).
  while (!ended() && !outcome_->error.failed()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
  return true;
}

void OcclWork::abort() {
  const std::string msg =
      c10::str("occl: ", c10d::opTypeToString(retrieveOpType()), " (seq ", seq_, ") was aborted by Work.abort()");
  outcome_->error.set(msg, /*by_user=*/true);
  group_->set(msg, /*by_user=*/true);
}

void OcclWork::fail_unless_finished(const std::string& why) {
  if (!outcome_->finished.load(std::memory_order_acquire)) outcome_->error.set(what_ + " failed: " + why, true);
}

bool OcclWork::wait(std::chrono::milliseconds timeout) {
  // As NCCL's: the host blocks under blocking wait, and whenever the caller gives a timeout.
  if (blocking_wait_ || timeout != kNoTimeout) {
    const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
    if (!host_wait(limit)) {
      if (timeout == kNoTimeout) {
        // The group's timeout: the watchdog fails the operation (and handles that) at the same time.
        C10_THROW_ERROR(DistBackendError, c10::str(what_, " did not complete within ", limit.count(), " ms"));
      }
      // The caller's own timeout: the operation and its group fail, as NCCL aborts the communicator
      // (a started transport operation cannot be cancelled: later ones must not pair with it). The
      // caller gets the error here: it is not handed to TORCH_OCCL_ASYNC_ERROR_HANDLING.
      const std::string msg =
          c10::str(what_, " failed: Work.wait(timeout=", limit.count(), " ms) expired before the operation completed");
      outcome_->timed_out = true;
      outcome_->error.set(msg, /*by_user=*/true);
      group_->set(msg, /*by_user=*/true);
    }
  }
  throw_if_failed();
  synchronize();  // free after completion: later work on the current stream is ordered anyway
  if (ended()) release_stash();
  return true;
}

// ---- OcclBackend ----

OcclBackend::OcclBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::intrusive_ptr<Options> options,
                         std::shared_ptr<Transport> transport, TransportFactory factory)
    : Backend(rank, size),
      store_(std::move(store)),
      options_(std::move(options)),
      transport_(std::move(transport)),
      factory_(std::move(factory)),
      blocking_wait_(env_flag("TORCH_OCCL_BLOCKING_WAIT")),
      error_handling_(error_handling_from_env(blocking_wait_)),
      dump_on_failure_(env_flag("TORCH_OCCL_DUMP_ON_TIMEOUT")),
      propagate_error_(env_flag("TORCH_OCCL_PROPAGATE_ERROR")),
      pg_id_(next_pg_id++) {
  without_gil(destroy_orphans_whose_kernels_ran);
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

OcclBackend::~OcclBackend() {
  stop_watchdog();
  stop_hooks();
  for (auto& [route, tail] : tails_) events().put(tail.event);
  // The in-flight works go with the backend (a Work the user still holds keeps its own tensors).
  // The comm streams are destroyed (the runtime recycles a destroyed stream with its worker thread
  // for the next stream created: a program that makes and destroys groups, one per test or per
  // checkpoint, kept up to three threads per group before). Destroying a stream waits for its
  // queued work: once every kernel of the backend ran, that is event records and waits (the
  // allocator records one on a stream when it frees a tensor used there), and each stream is
  // destroyed. While a kernel is left, only the idle streams are: the kernel may be a collective
  // that a dead peer never completes (until the transport's timeout), and its stream is left to
  // the next backend made or destroyed once the kernels ran (see OrphanStreams). (Only idle ones
  // were destroyed before, and the others never: a record of a tensor freed just before the
  // destructor, not run yet on a loaded machine, left its stream behind.)
  const bool kernels_left = kernels_queued_->load(std::memory_order_acquire) != 0;
  without_gil([&] {  // a stream's worker may need the GIL to drop a tensor's Python object
    destroy_orphans_whose_kernels_ran();
    std::vector<orStream_t> busy;
    for (auto& [device, set] : streams_) {
      std::vector<orStream_t> all{set.coll, set.recv_any};
      for (const auto* by_peer : {&set.peer, &set.send_done, &set.batch_recv})
        for (const auto& [peer, stream] : *by_peer) all.push_back(stream);
      for (orStream_t stream : all) {
        if (stream == nullptr) continue;
        if (!kernels_left || orStreamQuery(stream) == orSuccess)
          orStreamDestroy(stream);
        else
          busy.push_back(stream);
      }
    }
    if (!busy.empty()) {
      std::lock_guard<std::mutex> g(orphans().mu);
      orphans().list.push_back({kernels_queued_, std::move(busy)});
    }
  });
}

std::chrono::milliseconds OcclBackend::effective(std::chrono::milliseconds t) const {
  return t == c10d::kUnsetTimeout ? options_->timeout : t;
}

void OcclBackend::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  transport_->set_timeout(timeout);
}

c10d::ErrorType OcclBackend::getError() {
  return error_->failed() ? c10d::ErrorType::COMM_ERROR : c10d::ErrorType::SUCCESS;
}

void OcclBackend::abort() {
  terminating_ = true;  // the failures this causes are not handed to TORCH_OCCL_ASYNC_ERROR_HANDLING
  const std::string msg = c10::str("occl: process group (rank ", rank_, ") was aborted");
  error_->set(msg, /*by_user=*/true);
  {
    // As NCCL's abort, the operations in flight fail: their Works report it and wait() raises, where
    // they reported success and wait() chained the caller's stream onto a kernel that could only end
    // at the transport's timeout. Their tensors stay kept until the kernels end. (The in-flight list
    // holds every Work until its end, also while the watchdog looks at its operations.)
    std::lock_guard<std::mutex> g(inflight_mu_);
    for (auto& w : inflight_) w->fail_unless_finished(msg);
  }
  close_self_mailbox();
  transport_->abort();
}

void OcclBackend::shutdown() {
  // As NCCL's, whose communicator is gone after shutdown(): later operations are refused (queued ones
  // still run). Without this they went on through the transport as if nothing had happened.
  shut_down_ = true;
  terminating_ = true;
  stop_watchdog();
  transport_->shutdown();
}

// ---- the watchdog ----

namespace {

// Work.get_future_result(): NCCL's WorkResult, once the operation finished or failed.
void complete_result(WorkOutcome& o) {
  const auto result = !o.error.failed() ? c10d::WorkResult::SUCCESS
                      : o.timed_out     ? c10d::WorkResult::TIMEOUT
                                        : c10d::WorkResult::COMM_ERROR;
  std::lock_guard<std::mutex> g(foreign_release_mu);  // its callbacks may be Python's
  if (!foreign_releases_stopped) o.result->markCompleted(c10::IValue(static_cast<int64_t>(result)));
}

// Whether the operation ended (finished or failed); its result is completed then, once.
bool complete_if_ended(WorkOutcome& o) {
  const bool ended = o.finished.load(std::memory_order_acquire) || o.error.failed();
  if (ended && !o.result->completed()) complete_result(o);
  return ended;
}

}  // namespace

void OcclBackend::stop_watchdog() {
  {
    std::lock_guard<std::mutex> g(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  // The watchdog may be waiting for the GIL to drop a tensor: the caller may hold it.
  if (watchdog_.joinable()) without_gil([this] { watchdog_.join(); });
  // Operations still queued run to their end (shutdown, destroy_process_group): their results
  // (Work.get_future_result) are completed by a thread of their own, which holds only their
  // outcomes (no tensors, not the backend) and ends with the last of them, finished or timed out.
  std::deque<Watched> pending;
  {
    std::lock_guard<std::mutex> g(watch_mu_);
    pending.swap(watched_);
  }
  {
    std::lock_guard<std::mutex> g(hook_mu_);  // nothing watches them any more: no hook for them
    unretired_ = 0;
  }
  hook_cv_.notify_all();
  std::vector<std::pair<std::shared_ptr<WorkOutcome>, std::chrono::steady_clock::time_point>> left;
  for (auto& w : pending)
    if (!w.outcome->result->completed()) left.emplace_back(w.outcome, w.enqueued + w.timeout);
  if (left.empty()) return;
  std::thread([left = std::move(left)]() mutable {
    while (!left.empty()) {
      const auto now = std::chrono::steady_clock::now();
      for (auto it = left.begin(); it != left.end();) {
        WorkOutcome& o = *it->first;
        if (!o.finished.load(std::memory_order_acquire) && !o.error.failed() && now >= it->second) {
          o.timed_out = true;
          o.error.set("timed out after the process group was shut down");
        }
        it = complete_if_ended(o) ? left.erase(it) : std::next(it);
      }
      if (!left.empty()) std::this_thread::sleep_for(kWatchdogPoll);
    }
  }).detach();
}

void OcclBackend::watch(Watched w) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> g(watch_mu_);
    if (watch_stop_) return;  // shut down: nothing watches any more (the op still runs)
    was_empty = watched_.empty();
    watched_.push_back(std::move(w));
    // Counted before the watchdog can see it (it takes hook_mu_ without watch_mu_: no cycle).
    std::lock_guard<std::mutex> h(hook_mu_);
    ++unretired_;
  }
  if (was_empty) watch_cv_.notify_one();  // from sleeping until there is work to polling
}

int OcclBackend::global_rank() const {
  const auto& ranks = options_->global_ranks_in_group;
  return ranks.empty() ? rank_ : static_cast<int>(ranks.at(rank_));
}

void OcclBackend::dump_flight_recorder(const std::string& message) {
  try {
    const std::string target = trace::dump_to_writer(global_rank());
    std::fprintf(stderr, "[occl rank %d] watchdog: flight recorder dumped to %s after: %s\n", rank_, target.c_str(),
                 message.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[occl rank %d] watchdog: could not dump the flight recorder: %s\n", rank_, e.what());
  }
}

void OcclBackend::report_failure_to_peers(const std::string& message) {
  const std::string text =
      c10::str("rank ", global_rank(), " (rank ", rank_, " of ", size_, " in the group) failed: ", message);
  try {
    // The first report stays: a later one (a peer failing in turn) must not replace the cause.
    store_->compareSet(kPeerErrorKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[occl rank %d] watchdog: could not report the failure to the peers: %s\n", rank_, e.what());
  }
}

void OcclBackend::check_peer_failure(std::deque<Watched>& in_flight) {
  if (!propagate_error_ || !store_usable_ || error_->failed() || terminating_) return;
  std::string report;
  try {
    if (!store_->check({kPeerErrorKey})) return;
    const auto bytes = store_->get(kPeerErrorKey);
    report.assign(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    store_usable_ = false;  // the store is gone (its host left): nothing more to learn from it
    return;
  }
  const std::string msg = c10::str("occl: a peer reported a failure of this process group: ", report);
  for (auto& w : in_flight)
    if (!w.outcome->finished.load(std::memory_order_acquire)) w.outcome->error.set(c10::str(w.what, " failed: ", msg));
  error_->set(msg);
  handle_failure(msg, /*from_peer=*/true);
}

void OcclBackend::handle_failure(const std::string& message, bool from_peer) {
  if (failure_handled_ || terminating_) return;
  failure_handled_ = true;
  if (dump_on_failure_) dump_flight_recorder(message);
  if (propagate_error_ && !from_peer) report_failure_to_peers(message);
  const auto mode = error_handling_;
  if (mode == ErrorHandling::kNoHandling) return;
  std::fprintf(stderr, "[occl rank %d] watchdog: %s\n", rank_, message.c_str());
  if (mode == ErrorHandling::kTearDown || mode == ErrorHandling::kCleanUpOnly) transport_->abort();
  if (mode == ErrorHandling::kTearDown || mode == ErrorHandling::kSkipCleanUp) {
    std::fprintf(stderr,
                 "[occl rank %d] Some occl operations have failed or timed out: later device work might run on "
                 "incomplete data. To avoid data inconsistency, occl is taking the entire process down "
                 "(TORCH_OCCL_ASYNC_ERROR_HANDLING=%d).\n",
                 rank_, static_cast<int>(mode));
    std::fflush(stderr);
    std::abort();  // as NCCL's watchdog, whose exception terminates the process
  }
}

void OcclBackend::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    // Idle, it sleeps until there is work, unless it must keep looking for the peers' failures.
    if (watched_.empty() && !propagate_error_ && inflight_count_.load() == 0) {
      watch_cv_.wait(lock, [this] { return watch_stop_ || !watched_.empty(); });
    } else {
      watch_cv_.wait_for(lock, kWatchdogPoll, [this] { return watch_stop_; });
    }
    if (watch_stop_) break;
    std::deque<Watched> batch;
    batch.swap(watched_);
    lock.unlock();
    check_peer_failure(batch);
    const auto now = std::chrono::steady_clock::now();
    std::deque<Watched> keep;
    for (auto& w : batch) {
      WorkOutcome& o = *w.outcome;
      const bool finished = o.finished.load(std::memory_order_acquire);
      if (!finished && !o.error.failed() && now - w.enqueued >= w.timeout) {
        const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.enqueued).count();
        const std::string msg =
            c10::str(w.what, " failed: timed out after ", w.timeout.count(), " ms (not completed ", ran,
                     " ms after it was enqueued", o.started ? "" : ", and not started", "; caught by occl's watchdog)");
        o.timed_out = true;
        o.error.set(msg);
        error_->set(msg);
      }
      complete_if_ended(o);
      if (!w.started_seen && o.started.load(std::memory_order_acquire)) {
        w.started_seen = true;
        if (pg_status_->lastStartedSeq < static_cast<int64_t>(w.seq)) {
          pg_status_->lastStartedSeq = static_cast<int64_t>(w.seq);
          pg_status_->lastStartedWorkName = c10d::opTypeToString(w.type);
        }
      }
      // A failure the user caused (abort()) is not handled: later operations fail, the process goes on.
      if (o.error.failed() && !o.error.by_user() && !error_->by_user()) handle_failure(o.error.message());
      if (finished) {
        pg_status_->lastCompletedSeq = std::max(pg_status_->lastCompletedSeq, static_cast<int64_t>(w.seq));
        pg_status_->lastCompletedWorkName = c10d::opTypeToString(w.type);
        trace::retire(w.trace);
        {
          std::lock_guard<std::mutex> g(hook_mu_);
          --unretired_;
          if (onCompletionHook_) {
            const auto began = o.started.load(std::memory_order_acquire) ? o.started_at : w.enqueued;
            hook_queue_.push_back(std::make_shared<c10d::WorkInfo>(
                w.type, w.seq, began, o.finished_at, std::chrono::duration<float>(o.finished_at - began)));
          }
        }
        hook_cv_.notify_all();
      } else {
        keep.push_back(std::move(w));
      }
    }
    batch.clear();  // outcomes hold no tensors: safe to release on this thread
    release_ended();
    lock.lock();
    // Still in flight, before what was enqueued meanwhile.
    for (auto it = keep.rbegin(); it != keep.rend(); ++it) watched_.push_front(std::move(*it));
  }
}

c10::intrusive_ptr<c10d::Backend> OcclBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  TORCH_CHECK(factory_ != nullptr, "occl: this group cannot be split (it was made without a transport factory)");
  check_not_shut_down("split");
  // A rank outside the group: its members waited for it until the split's timeout (30 min).
  for (int r : ranks) check_rank("split_group", "member", r);
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;  // not a member: the members' rendezvous needs nothing from it
  auto options = c10::make_intrusive<Options>(opts ? opts->timeout : options_->timeout);
  if (opts) options->group_name = opts->group_name;
  // The members' global ranks, through this group's own (`ranks` are this group's ranks; what c10d
  // passes in `opts` is this group's list, not the child's).
  for (int r : ranks)
    options->global_ranks_in_group.push_back(
        options_->global_ranks_in_group.empty() ? static_cast<uint64_t>(r) : options_->global_ranks_in_group.at(r));
  // A fresh transport among the members (Gloo's own split needs options of its own type, which occl
  // cannot build without Gloo's headers). It rendezvouses on this group's store under a prefix that
  // every member computes alike: the store c10d passes in is named after state that differs between
  // ranks once a rank has been left out of a new_group.
  std::string prefix = "occl-split/";
  for (int r : ranks) prefix += std::to_string(r) + ",";
  prefix += "/" + std::to_string(splits_[ranks]++) + "/";
  auto own = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  const int rank = static_cast<int>(me - ranks.begin()), size = static_cast<int>(ranks.size());
  auto backend =
      c10::make_intrusive<OcclBackend>(own, rank, size, options, factory_(own, rank, size, options->timeout), factory_);
  if (auto bound = getBoundDeviceId()) backend->setBoundDeviceId(bound);
  return backend;
}

orStream_t OcclBackend::comm_stream(c10::Device device, Route route, bool completion, bool in_batch) {
  std::lock_guard<std::mutex> g(streams_mu_);
  CommStreams& s = streams_[device.index()];
  // A send is started on the peer's stream and waited for on its send-completion stream; a receive
  // runs on the peer's stream, or, inside a batch (coalescing), on the batch's receive stream, so
  // that the batch's sends, started after it, are not held back by it. A receive from this rank
  // always runs on that stream: it waits for a send of the same thread that may come after it.
  if (route.lane == Lane::kRecv && route.peer == rank_) in_batch = true;
  orStream_t* slot = route.lane == Lane::kColl      ? &s.coll
                     : route.lane == Lane::kRecvAny ? &s.recv_any
                     : route.lane == Lane::kSend    ? (completion ? &s.send_done[route.peer] : &s.peer[route.peer])
                     : in_batch                     ? &s.batch_recv[route.peer]
                                                    : &s.peer[route.peer];
  if (*slot == nullptr) {
    // Dedicated streams, not pool ones: the pool is shared round robin with users' streams, and an
    // operation occupies its stream's worker while it waits for the peers.
    c10::DeviceGuard guard(device);
    OPENREG_CHECK(orStreamCreate(slot));
  }
  return *slot;
}

void OcclBackend::check_not_shut_down(const char* op) const {
  if (shut_down_)
    C10_THROW_ERROR(DistBackendError, c10::str("occl: ", op, " refused: the process group (rank ", rank_, " of ", size_,
                                               ") was shut down (shutdown() or destroy_process_group())"));
}

void OcclBackend::check_rank(const char* op, const char* role, int64_t rank) const {
  TORCH_CHECK_VALUE(rank >= 0 && rank < size_, "occl ", op, ": ", role, " rank ", rank,
                    " is not a rank of this process group of size ", size_, " (rank ", rank_,
                    " calling; valid ranks are 0 to ", size_ - 1, ")");
}

void OcclBackend::close_self_mailbox() {
  {
    std::lock_guard<std::mutex> g(self_mailbox_->mu);
    self_mailbox_->closed = true;
  }
  self_mailbox_->cv.notify_all();
}

void OcclBackend::keep_until_done(c10::intrusive_ptr<OcclWork> work) {
  std::vector<c10::intrusive_ptr<OcclWork>> done;  // released outside the lock
  std::lock_guard<std::mutex> g(inflight_mu_);
  // Oldest first, up to the first one still running: O(1) per operation in the steady state; the
  // watchdog releases the others that ended.
  while (!inflight_.empty() && inflight_.front()->ended()) {
    done.push_back(std::move(inflight_.front()));
    inflight_.pop_front();
  }
  inflight_.push_back(std::move(work));
  inflight_count_ = inflight_.size();
}

void OcclBackend::release_ended() {
  std::vector<c10::intrusive_ptr<OcclWork>> done;
  {
    std::lock_guard<std::mutex> g(inflight_mu_);
    if (inflight_.empty()) return;
    std::deque<c10::intrusive_ptr<OcclWork>> running;
    for (auto& w : inflight_) {
      if (w->ended())
        done.push_back(std::move(w));
      else
        running.push_back(std::move(w));
    }
    inflight_.swap(running);
    inflight_count_ = inflight_.size();
  }
  // A Work the user still holds keeps its outputs (result(), its future), not the rest.
  std::lock_guard<std::mutex> g(foreign_release_mu);
  if (foreign_releases_stopped) {
    // The interpreter is exiting: hand them back, for the backend's destructor (or the exit).
    std::lock_guard<std::mutex> l(inflight_mu_);
    for (auto& w : done) inflight_.push_back(std::move(w));
    inflight_count_ = 0;  // nothing more to poll for
    return;
  }
  for (auto& w : done) w->release_stash();
  done.clear();
}

namespace {

// Travels in a collective's kernel: when the runtime discards the kernel without running it (a
// device error, or a fault injected by OPENREG_FAULTS), the collective and its group fail at once,
// as when its body raises, instead of the Work reporting success (and its peer timing out alone).
// It also counts the backend's kernels not yet run or discarded (kernels_queued_), itself included.
struct UnrunKernel {
  std::shared_ptr<WorkOutcome> outcome;
  std::shared_ptr<GroupError> group;
  std::string what;
  std::shared_ptr<std::atomic<int64_t>> queued;
  // The second kernel of a send (it ran once the operation finished), and what it would have waited
  // for: the transport may still read the data, so that is waited for before the failure is told.
  bool finishes = false;
  std::function<void()> drain;
  UnrunKernel(std::shared_ptr<WorkOutcome> o, std::shared_ptr<GroupError> g, std::string w,
              std::shared_ptr<std::atomic<int64_t>> q, bool f = false, std::function<void()> d = {})
      : outcome(std::move(o)),
        group(std::move(g)),
        what(std::move(w)),
        queued(std::move(q)),
        finishes(f),
        drain(std::move(d)) {
    queued->fetch_add(1, std::memory_order_relaxed);
  }
  UnrunKernel(UnrunKernel&&) = default;
  UnrunKernel(const UnrunKernel&) = delete;
  ~UnrunKernel() {
    if (!outcome) return;                                                                      // moved from
    if (!(finishes ? outcome->finished : outcome->started).load(std::memory_order_acquire)) {  // not run
      if (drain) drain();
      outcome->error.set(what + (finishes ? " not waited for: the device failed its kernel before it completed"
                                          : " not run: the device failed its kernel before it started"));
      group->set(outcome->error.message());
      outcome->finished_at = std::chrono::steady_clock::now();
      outcome->finished.store(true, std::memory_order_release);  // over: the watchdog retires it
    }
    queued->fetch_sub(1, std::memory_order_release);
  }
};

}  // namespace

c10::intrusive_ptr<Work> OcclBackend::enqueue(c10d::OpType type, const char* kernel, Route route, c10::Device device,
                                              std::vector<at::Tensor> stash, std::vector<at::Tensor> outputs,
                                              Start start, std::chrono::milliseconds timeout, bool blocking,
                                              std::vector<at::Tensor> also_read) {
  timeout = effective(timeout);
  if (!at::hasCallbacks()) {
    return enqueue_impl(type, kernel, route, device, std::move(stash), std::move(outputs), std::move(start), timeout,
                        blocking, std::move(also_read));
  }
  // Profiling (or another RecordFunction observer): the host-side record of the collective, with
  // its metadata, as NCCL's; the kernel it launches is correlated with it on the comm stream's track.
  int64_t in_numel = 0, out_numel = 0;
  for (const auto& t : outputs) out_numel += t.numel();
  for (const auto& t : stash) in_numel += t.numel();
  if (stash.empty()) in_numel = out_numel;  // in place
  const at::ScalarType dtype =
      !outputs.empty() ? outputs[0].scalar_type() : (!stash.empty() ? stash[0].scalar_type() : at::kByte);
  const bool p2p = route.lane != Lane::kColl;
  const std::string coll_name(kernel + std::string("occl::").size());
  const auto& ranks = options_->global_ranks_in_group;
  const int rank_start = ranks.empty() ? 0 : static_cast<int>(ranks[0]);
  const int rank_stride = ranks.size() > 1 ? static_cast<int>(ranks[1] - ranks[0]) : 1;
  RECORD_PARAM_COMMS(std::make_tuple(static_cast<int64_t>(seq_.load() + 1), p2p), pg_name(), rank_, coll_name.c_str(),
                     in_numel, out_numel, dtype, std::vector<int64_t>(), std::vector<int64_t>(), rank_start,
                     rank_stride, size_);
  return enqueue_impl(type, kernel, route, device, std::move(stash), std::move(outputs), std::move(start), timeout,
                      blocking, std::move(also_read));
}

c10::intrusive_ptr<Work> OcclBackend::enqueue_impl(c10d::OpType type, const char* kernel, Route route,
                                                   c10::Device device, std::vector<at::Tensor> stash,
                                                   std::vector<at::Tensor> outputs, Start start,
                                                   std::chrono::milliseconds timeout, bool blocking,
                                                   std::vector<at::Tensor> also_read) {
  const auto enqueued = std::chrono::steady_clock::now();
  if (error_->failed()) {
    C10_THROW_ERROR(DistBackendError, c10::str("occl: ", c10d::opTypeToString(type),
                                               " refused: the process group failed earlier: ", error_->message()));
  }
  check_not_shut_down(c10d::opTypeToString(type).c_str());
  // Coalescing is the calling thread's state, as c10d's coalescing manager is (read once here).
  const bool coalescing = coalescing_;
  orStream_t comm = comm_stream(device, route, /*completion=*/false, coalescing);
  // A send returns from its start before the peer took the data: it is waited for on a stream of
  // its own, so that the peer's stream goes on to what follows (see CommStreams).
  orStream_t done = route.lane == Lane::kSend ? comm_stream(device, route, /*completion=*/true) : comm;
  // Where the Work ends: a staged send's once it started (its data copied), the others' once done.
  orStream_t ends_on = route.staged ? comm : done;
  orStream_t current = c10::openreg::current_stream_handle(device.index());
  // Refused before it takes a sequence number (the ranks' numbers must stay in step). The runtime
  // refused the ordering event's record, in words that named neither occl nor the operation.
  int capturing = 0;
  OPENREG_CHECK(orStreamIsCapturing(current, &capturing));
  TORCH_CHECK(capturing == 0, "occl: ", c10d::opTypeToString(type),
              " cannot be captured into a device graph: its operations run on occl's communication streams, "
              "which a capture of the current stream does not record (NCCL's collectives can be captured; "
              "occl's cannot yet)");
  const uint64_t seq = ++seq_;
  const bool p2p = route.lane != Lane::kColl;
  if (p2p)
    ++p2p_seq_;
  else
    ++collective_seq_;

  // 1. The comm stream waits for what the caller queued before the collective, and for the route's
  //    previous operation if that ran on another stream (another device's, see RouteTail; or a
  //    batch's receive stream).
  orEvent_t ready = events().get();
  OPENREG_CHECK(orEventRecord(ready, current));
  OPENREG_CHECK(orStreamWaitEvent(comm, ready, 0));
  events().put(ready);
  const std::pair<int, int> route_key{static_cast<int>(route.lane), route.peer};
  {
    std::lock_guard<std::mutex> g(streams_mu_);
    auto it = tails_.find(route_key);
    if (it != tails_.end() && it->second.stream != comm) OPENREG_CHECK(orStreamWaitEvent(comm, it->second.event, 0));
  }

  // 2. The collective, on the comm stream's worker.
  auto outcome = std::make_shared<WorkOutcome>();
  const std::string what =
      c10::str("occl ", c10d::opTypeToString(type), " (seq ", seq, ", rank ", rank_, " of ", size_, ")");

  // The flight recorder's entry (with the Python stack of the call), before the kernel can run.
  trace::Id trace_id;
  if ((outcome->points = trace::acquire_points()) != nullptr) {
    if (!pg_ranks_recorded_) {
      pg_ranks_recorded_ = true;
      std::vector<uint64_t> ranks = options_->global_ranks_in_group;
      if (ranks.empty())
        for (int r = 0; r < size_; ++r) ranks.push_back(static_cast<uint64_t>(r));
      trace::record_pg_ranks(pg_name(), std::move(ranks));
    }
    trace_id = trace::record(pg_id_, pg_name(), collective_seq_, p2p_seq_, seq,
                             std::string("occl:") + (kernel + std::string("occl::").size()),
                             stash.empty() ? outputs : stash, outputs, outcome->points, timeout, pg_status_, p2p);
  }
  pg_status_->lastEnqueuedSeq = static_cast<int64_t>(seq);
  pg_status_->lastEnqueuedWorkName = c10d::opTypeToString(type);

  // The kernel: it starts the transport's operations, waits for them and finishes the result. A
  // send's kernel only starts them; a second kernel, on the send's completion stream, waits.
  auto running = std::make_shared<Started>();  // what the start began, for the wait
  auto begin = [start = std::move(start), outcome, running, group = error_, what, index = device.index()] {
    if (outcome->points) outcome->points->start.mark();
    outcome->started_at = std::chrono::steady_clock::now();
    outcome->started.store(true, std::memory_order_release);
    if (outcome->error.failed()) throw std::runtime_error(outcome->error.message());  // timed out while queued
    if (group->failed()) {
      const std::string msg = what + " not run: the process group failed earlier: " + group->message();
      outcome->error.set(msg);
      throw std::runtime_error(msg);
    }
    // A kernel of the device failed and no call has reported it yet: its output may be among the
    // inputs (made on any stream the caller's waited for), which the peers must not receive as
    // data (they summed it in silence). The operation fails, and with it the group, as NCCL's
    // kernels do not run after a CUDA error; the failure itself is left for the user's next
    // synchronising call. A failure of occl's own kernels (another group's timed-out operation) is
    // its group's, not this operation's.
    if (orDevicePeekError(index) == orErrorLaunchFailure) {
      std::string failure = c10::openreg::last_error_message();
      if (failure.find("kernel 'occl::") != failure.find("kernel '"))
        throw std::runtime_error(
            "not run: a kernel failed earlier on the device, and its output may be among "
            "this operation's inputs: " +
            failure);
    }
    *running = start();
  };
  auto finish = [outcome, running] {
    Started& st = *running;
    for (auto& w : st.works) w->wait();
    if (st.anysource) outcome->source_rank = st.works.at(0)->sourceRank();  // known once done
    if (st.post) st.post();
  };
  // Runs `body` on a worker. A failure becomes the operation's and the group's first error (the
  // watchdog's timeout, if it caught the operation first) and ends the operation; so does the
  // `last` kernel of an operation.
  auto run = [outcome, group = error_, what](bool last, const auto& body) {
    struct End {  // also on an unwind that is not an exception (a thread cancelled at exit)
      WorkOutcome& o;
      bool ends = true;
      ~End() {
        if (!ends) return;
        if (o.points) o.points->end.mark();
        o.finished_at = std::chrono::steady_clock::now();
        o.finished.store(true, std::memory_order_release);
      }
    } end{*outcome};
    try {
      body();
    } catch (const std::exception& e) {
      // A c10::Error's what() ends in a C++ backtrace: the message is what users read.
      const auto* error = dynamic_cast<const c10::Error*>(&e);
      outcome->error.set(what + " failed: " + (error != nullptr ? error->what_without_backtrace() : e.what()));
      group->set(outcome->error.message());
      throw std::runtime_error(outcome->error.message());
    }
    end.ends = last;
  };
  if (done == comm) {
    OPENREG_CHECK(::openreg::launch(comm, kernel,
                                    [begin = std::move(begin), finish = std::move(finish), run,
                                     unrun = UnrunKernel{outcome, error_, what, kernels_queued_}]() mutable {
                                      run(/*last=*/true, [&] {
                                        begin();
                                        finish();
                                      });
                                    }));
  } else {
    OPENREG_CHECK(::openreg::launch(
        comm, kernel,
        [begin = std::move(begin), run, unrun = UnrunKernel{outcome, error_, what, kernels_queued_}]() mutable {
          run(false, begin);
        }));
    orEvent_t started = events().get();
    OPENREG_CHECK(orEventRecord(started, comm));
    OPENREG_CHECK(orStreamWaitEvent(done, started, 0));
    events().put(started);
    // What a discarded second kernel would have waited for (see UnrunKernel).
    auto drain = [running] {
      for (auto& w : running->works) {
        try {
          w->wait();
        } catch (const std::exception&) {  // the failure told next is the one that counts
        }
      }
    };
    OPENREG_CHECK(::openreg::launch(
        done, "occl::send_wait",
        [finish = std::move(finish), run, outcome,
         unrun = UnrunKernel{outcome, error_, what, kernels_queued_, /*finishes=*/true, std::move(drain)}] {
          // A start that failed ended the operation: nothing to wait for.
          if (!outcome->finished.load(std::memory_order_acquire)) run(true, finish);
        }));
  }

  // 3. Its end, and a future completed on the comm stream (as NCCL's: callbacks and waits are
  //    ordered after the collective by device events, not by the host).
  orEvent_t end = events().get();
  OPENREG_CHECK(orEventRecord(end, ends_on));
  {
    // The route orders starts: a send's tail is its start on the peer's stream.
    std::lock_guard<std::mutex> g(streams_mu_);
    RouteTail& tail = tails_[route_key];
    if (tail.event == nullptr) tail.event = events().get();
    tail.stream = comm;
    OPENREG_CHECK(orEventRecord(tail.event, comm));
  }
  std::vector<c10::Device> devices{device};
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  {
    c10::StreamGuard on_comm(c10::openreg::getStreamFromExternal(ends_on, device.index()));
    future->markCompleted(c10::IValue(outputs));
  }

  // 4. The tensors stay referenced until the end event completed. The inputs are also recorded on
  //    the stream where the Work ends (a staged send's once its data is copied), as NCCL records
  //    them on its stream: a Work the backend drops while its kernel still runs
  //    (destroy_process_group) no longer frees them to the caller's next allocation, which the peer
  //    then received instead (outputs are recorded by the future, above).
  if (route.lane == Lane::kRecv) outcome->source_rank = route.peer;  // a receive from a given rank
  const c10::Stream end_stream = c10::openreg::getStreamFromExternal(ends_on, device.index()).unwrap();
  c10::DeviceAllocator* allocator = c10::getDeviceAllocator(c10::DeviceType::PrivateUse1);
  stash.insert(stash.end(), also_read.begin(), also_read.end());
  for (const auto& t : stash)
    if (t.defined() && t.is_privateuseone() && t.has_storage() && t.storage().data() != nullptr)
      allocator->recordStream(t.storage().data_ptr(), end_stream);
  for (auto& t : outputs) stash.push_back(t);
  if (coalescing) coalesced_outputs_.insert(coalesced_outputs_.end(), outputs.begin(), outputs.end());
  auto work =
      c10::make_intrusive<OcclWork>(rank_, type, seq, what, device, end, outcome, std::move(stash), std::move(outputs),
                                    std::move(future), timeout, blocking_wait_ || blocking, error_);
  keep_until_done(work);
  watch(Watched{outcome, enqueued, timeout, what, seq, type, trace_id});
  if (coalescing) {
    if (!coalesced_device_) coalesced_device_ = device;
    if (p2p && std::find(coalesced_streams_.begin(), coalesced_streams_.end(), ends_on) == coalesced_streams_.end())
      coalesced_streams_.push_back(ends_on);
  }
  return work;
}

void OcclBackend::startCoalescing() {
  coalescing_ = true;
  coalescing_abandoned_ = false;
  coalesced_device_.reset();
  coalesced_streams_.clear();
  coalesced_outputs_.clear();
}

void OcclBackend::abandon_coalescing() {
  coalescing_ = false;
  coalescing_abandoned_ = true;
  coalesced_device_.reset();
  coalesced_streams_.clear();
  coalesced_outputs_.clear();  // each operation's own Work keeps its tensors until it ends
}

c10::intrusive_ptr<Work> OcclBackend::endCoalescing() {
  TORCH_CHECK(!coalescing_abandoned_,
              "occl: this coalescing block (batch_isend_irecv or _coalescing_manager) was ended when an operation "
              "in it was refused at its call; the operations queued before it run on their own, those after it "
              "were not part of the block: wait for their own Works");
  coalescing_ = false;
  int current = 0;
  OPENREG_CHECK(orGetDevice(&current));
  const c10::Device device =
      coalesced_device_.value_or(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current)));
  orStream_t coll = comm_stream(device, Lane::kColl);
  // The coalesced Work ends on the collective stream once every send and receive stream used
  // meanwhile has run what was queued on it.
  for (orStream_t used : coalesced_streams_) {
    orEvent_t e = events().get();
    OPENREG_CHECK(orEventRecord(e, used));
    OPENREG_CHECK(orStreamWaitEvent(coll, e, 0));
    events().put(e);
  }
  coalesced_streams_.clear();
  // The future of a Work without tensors would order nothing: it carries the operations' outputs.
  std::vector<at::Tensor> outputs = std::move(coalesced_outputs_);
  coalesced_outputs_.clear();
  return enqueue(c10d::OpType::COALESCED, "occl::coalesced", Lane::kColl, device, {}, std::move(outputs),
                 [] { return Started{}; });
}

// ---- completion hooks ----

void OcclBackend::registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  std::lock_guard<std::mutex> g(hook_mu_);
  TORCH_CHECK(!onCompletionHook_, "occl: an on-completion hook is already registered for this process group");
  TORCH_CHECK(!hook_stop_, "occl: the process group was shut down");
  onCompletionHook_ = std::move(hook);  // c10d's member (hasHooks() reads it), set under hook_mu_
  hook_thread_ = std::thread([this] { hook_loop(); });
}

void OcclBackend::hook_loop() {
  std::unique_lock<std::mutex> lock(hook_mu_);
  for (;;) {
    hook_cv_.wait(lock, [this] { return hook_stop_ || !hook_queue_.empty(); });
    if (hook_stop_) return;  // what is left is dropped: the interpreter may be gone
    std::shared_ptr<c10d::WorkInfo> info = std::move(hook_queue_.front());
    hook_queue_.pop_front();
    hook_busy_ = true;
    lock.unlock();
    try {
      // A Python hook takes the GIL: not once the interpreter is exiting (see stop_foreign_releases).
      std::lock_guard<std::mutex> g(foreign_release_mu);
      if (!foreign_releases_stopped) onCompletionHook_(info);
    } catch (const std::exception& e) {  // as NCCL's: reported, and the next operations go on
      std::fprintf(stderr, "[occl rank %d] the on-completion hook raised for %s (seq %llu): %s\n", rank_,
                   c10d::opTypeToString(info->opType).c_str(), static_cast<unsigned long long>(info->seq), e.what());
    }
    info.reset();
    lock.lock();
    hook_busy_ = false;
    hook_cv_.notify_all();
  }
}

void OcclBackend::waitForPendingWorks() {
  // The hook thread takes the GIL to run a Python hook: the caller may hold it.
  without_gil([this] {
    std::unique_lock<std::mutex> lock(hook_mu_);
    hook_cv_.wait(lock, [this] { return unretired_ == 0 && hook_queue_.empty() && !hook_busy_; });
  });
}

void OcclBackend::stop_hooks() {
  {
    std::lock_guard<std::mutex> g(hook_mu_);
    hook_stop_ = true;
  }
  hook_cv_.notify_all();
  if (hook_thread_.joinable()) without_gil([this] { hook_thread_.join(); });
}

// ---- the operations ----

c10::intrusive_ptr<Work> OcclBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  check_single("broadcast", tensors.size(), "");
  const auto device = check_tensors("broadcast", tensors);
  check_rank("broadcast", "root", opts.rootRank);
  auto t = transport_;
  const int root = static_cast<int>(opts.rootRank);
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::BROADCAST, "occl::broadcast", Lane::kColl, device, {}, tensors,
      [t, a = args_of(tensors), root, timeout] {
        at::Tensor v = carried(a[0].materialize());
        return Started{{t->broadcast(v, root, timeout)}, {}};
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const auto device = check_tensors("all_reduce", tensors);
  std::vector<at::Tensor> factors;
  // A coalesced all-reduce may mix dtypes; the transport reduces one dtype at a time: one of its
  // all-reduces per dtype, in order of first appearance (the same on every rank).
  std::vector<c10::ScalarType> dtypes;
  std::vector<std::vector<size_t>> members;
  std::vector<Reduction> reductions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto dtype = tensors[i].scalar_type();
    const size_t k = std::find(dtypes.begin(), dtypes.end(), dtype) - dtypes.begin();
    if (k == dtypes.size()) {
      dtypes.push_back(dtype);
      members.emplace_back();
      reductions.push_back(reduction("all_reduce", opts.reduceOp, dtype, size_, device, factors));
    }
    members[k].push_back(i);
  }
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::ALLREDUCE, "occl::all_reduce", Lane::kColl, device, {}, tensors,
      [t, a = args_of(tensors), members, reductions, timeout] {
        std::vector<at::Tensor> v = views(a);
        Started st;
        std::vector<std::vector<at::Tensor>> parts(members.size());
        for (size_t k = 0; k < members.size(); ++k) {
          for (size_t i : members[k]) parts[k].push_back(reductions[k].scaled(reduced_view(v[i]), /*in_place=*/true));
          st.works.push_back(t->allreduce(parts[k], reductions[k].op, timeout));
        }
        st.post = [parts, reductions] {
          for (size_t k = 0; k < parts.size(); ++k)
            for (const auto& x : parts[k]) reductions[k].finish(x);
        };
        return st;
      },
      timeout, /*blocking=*/false, factors);
}

c10::intrusive_ptr<Work> OcclBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<Work> OcclBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  check_single("reduce", tensors.size(), "");
  const auto device = check_tensors("reduce", tensors);
  check_rank("reduce", "root", opts.rootRank);
  std::vector<at::Tensor> factors;
  Reduction r = reduction("reduce", opts.reduceOp, tensors[0].scalar_type(), size_, device, factors);
  auto t = transport_;
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == rank_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::REDUCE, "occl::reduce", Lane::kColl, device, {}, tensors,
      [t, a = args_of(tensors), r, root, is_root, timeout] {
        // Off the root the tensor is an input only, left as it was (as NCCL's): the transport reduces
        // into its buffer, so it gets a copy there (which PREMUL_SUM scales).
        at::Tensor in = reduced_view(a[0].materialize());
        at::Tensor v = r.scaled(is_root ? in : in.clone(), /*in_place=*/true);
        WorkPtr w = t->reduce(v, root, r.op, timeout);
        return Started{{w}, [v, r, is_root] {
                         if (is_root) r.finish(v);
                       }};
      },
      timeout, /*blocking=*/false, factors);
}

c10::intrusive_ptr<Work> OcclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<Work> OcclBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "all_gather_into_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "occl ", op, ": ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  const auto device = check_tensors(op, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(op, outputs[i], device);
    check_same_dtype(op, inputs[i], outputs[i]);
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, "occl ", op, ": output has ", outputs[i].numel(),
                      " elements, expected input's ", inputs[i].numel(), " x world size ", size_, " = ",
                      inputs[i].numel() * size_);
  }
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, "occl::all_gather_into_tensor", Lane::kColl, device, inputs, outputs,
      [t, in = args_of(inputs), out = args_of(outputs), timeout] {
        Started st;
        for (size_t i = 0; i < in.size(); ++i) {
          at::Tensor o = carried(out[i].materialize()), x = carried(in[i].materialize());
          st.works.push_back(t->allgather(o, x, timeout));
        }
        return st;
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "all_gather";
  check_single(op, inputs.size(), "input");
  check_single(op, outputs.size(), "output");
  const auto device = check_tensors(op, inputs);
  auto& outs = outputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size_, "occl ", op, ": expects world size (", size_,
                    ") output tensors, got ", outs.size());
  bool even = true;
  for (const auto& o : outs) {
    check_tensor(op, o, device, Layout::kAnyWritten);
    check_same_dtype(op, inputs[0], o);
    even = even && o.numel() == inputs[0].numel();
  }
  // Output i holds rank i's input: this rank's own must be the input's size.
  TORCH_CHECK_VALUE(outs[rank_].numel() == inputs[0].numel(), "occl ", op, ": output tensor ", rank_,
                    " (this rank's) must have the input's ", inputs[0].numel(), " elements, got ", outs[rank_].numel());
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  const int n = size_;
  if (!even) {
    // Inputs of different sizes, as NCCL takes them: one broadcast from each rank into its output
    // (the transport's all-gather takes one size). Each rank's output i must have rank i's size.
    return enqueue(
        c10d::OpType::ALLGATHER, "occl::all_gather", Lane::kColl, device, inputs, outs,
        [t, in = member_args_of(inputs), out = member_args_of(outs), me = rank_, timeout] {
          Started st;
          std::vector<MemberOutput> os;
          for (size_t i = 0; i < out.size(); ++i) {
            os.emplace_back(out[i].materialize());
            at::Tensor o = os.back().carried_buffer();
            if (static_cast<int>(i) == me) o.copy_(flat_member(in[0].materialize()));
            st.works.push_back(t->broadcast(o, static_cast<int>(i), timeout));
          }
          st.post = [os] {
            for (const auto& o : os) o.copy_back();
          };
          return st;
        },
        timeout);
  }
  return enqueue(
      c10d::OpType::ALLGATHER, "occl::all_gather", Lane::kColl, device, inputs, outs,
      [t, in = member_args_of(inputs), out = member_args_of(outs), n, timeout] {
        // Gathered into one staging buffer on the device side, then copied out.
        at::Tensor x = in[0].materialize();
        at::Tensor staging = at::empty({n * x.numel()}, x.options());
        at::Tensor s = carried(staging), cx = flat_member(x);
        WorkPtr w = t->allgather(s, cx, timeout);
        return Started{{w}, [staging, out, n] {
                         const int64_t k = staging.numel() / n;
                         for (int i = 0; i < n; ++i)
                           copy_into_member(out[i].materialize(), staging.narrow(0, i * k, k));
                       }};
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_, "occl all_gather_coalesced: expects world size (", size_,
                    ") output lists, got ", outputs.size());
  for (const auto& list : outputs)
    TORCH_CHECK_VALUE(list.size() == inputs.size(),
                      "occl all_gather_coalesced: each output list must have one tensor per "
                      "input (",
                      inputs.size(), "), got ", list.size());
  // One all_gather per input, ended together as a coalesced group (one Work), as Gloo's is one call.
  const bool outer = !coalescing_;
  if (outer) startCoalescing();
  c10::intrusive_ptr<Work> last;
  try {
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> out(1);
      for (const auto& list : outputs) out[0].push_back(list[i]);
      std::vector<at::Tensor> in{inputs[i]};
      last = allgather(out, in, opts);
    }
  } catch (...) {
    if (outer) coalescing_ = false;
    throw;
  }
  if (outer) return endCoalescing();
  TORCH_CHECK_VALUE(last, "occl all_gather_coalesced: no input tensors");
  return last;
}

c10::intrusive_ptr<Work> OcclBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<Work> OcclBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::ReduceScatterOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "reduce_scatter_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "occl ", op, ": ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  const auto device = check_tensors(op, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(op, outputs[i], device);
    check_same_dtype(op, inputs[i], outputs[i]);
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, "occl ", op, ": input has ", inputs[i].numel(),
                      " elements, expected output's ", outputs[i].numel(), " x world size ", size_, " = ",
                      outputs[i].numel() * size_);
  }
  // A coalesced reduce-scatter may mix dtypes (as NCCL's, and occl's coalesced all-reduce and all-gather):
  // each tensor has the reduction of its own dtype (AVG truncates integers). One Reduction for inputs[0]'s
  // dtype refused the mix ("input and output dtypes differ").
  std::vector<Reduction> rs;
  std::vector<at::Tensor> factors;
  for (const auto& x : inputs) rs.push_back(reduction(op, opts.reduceOp, x.scalar_type(), size_, device, factors));
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, "occl::reduce_scatter_tensor", Lane::kColl, device, inputs, outputs,
      [t, in = args_of(inputs), out = args_of(outputs), rs, timeout] {
        Started st;
        std::vector<at::Tensor> results;
        for (size_t i = 0; i < in.size(); ++i) {
          at::Tensor o = reduced_view(out[i].materialize());
          at::Tensor x = rs[i].scaled(reduced_view(in[i].materialize()), /*in_place=*/false);
          st.works.push_back(t->reduce_scatter(o, x, rs[i].op, timeout));
          results.push_back(o);
        }
        st.post = [results, rs] {
          for (size_t i = 0; i < results.size(); ++i) rs[i].finish(results[i]);
        };
        return st;
      },
      timeout, /*blocking=*/false, factors);
}

c10::intrusive_ptr<Work> OcclBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ReduceScatterOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "reduce_scatter";
  check_single(op, outputs.size(), "output");
  check_single(op, inputs.size(), "input");
  const auto device = check_tensors(op, outputs);
  auto& ins = inputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == size_, "occl ", op, ": expects world size (", size_,
                    ") input tensors, got ", ins.size());
  bool even = true;
  for (const auto& x : ins) {
    check_tensor(op, x, device, Layout::kAny);
    check_same_dtype(op, x, outputs[0]);
    even = even && x.numel() == outputs[0].numel();
  }
  // Input i is reduced into rank i's output: this rank's own must be the output's size.
  TORCH_CHECK_VALUE(ins[rank_].numel() == outputs[0].numel(), "occl ", op, ": input tensor ", rank_,
                    " (for this rank's output) must have the output's ", outputs[0].numel(), " elements, got ",
                    ins[rank_].numel());
  std::vector<at::Tensor> factors;
  Reduction r = reduction(op, opts.reduceOp, outputs[0].scalar_type(), size_, device, factors);
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  if (!even) {
    // Inputs of different sizes, as NCCL takes them: one reduce to each rank (the transport's
    // reduce-scatter takes one size), each into a copy, the inputs being inputs only.
    return enqueue(
        c10d::OpType::REDUCE_SCATTER, "occl::reduce_scatter", Lane::kColl, device, ins, outputs,
        [t, in = member_args_of(ins), out = member_args_of(outputs), r, me = rank_, timeout] {
          Started st;
          std::vector<at::Tensor> copies;
          for (size_t i = 0; i < in.size(); ++i) {
            copies.push_back(
                r.scaled(reduced_view(logical(in[i].materialize()).contiguous()).clone(), /*in_place=*/true));
            st.works.push_back(t->reduce(copies.back(), static_cast<int>(i), r.op, timeout));
          }
          st.post = [copies, out, r, me] {
            const MemberOutput mine(out[0].materialize());
            at::Tensor o = reduced_view(mine.buffer);
            o.copy_(copies[me]);
            r.finish(o);
            mine.copy_back();
          };
          return st;
        },
        timeout, /*blocking=*/false, factors);
  }
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, "occl::reduce_scatter", Lane::kColl, device, ins, outputs,
      [t, in = member_args_of(ins), out = member_args_of(outputs), r, timeout] {
        std::vector<at::Tensor> parts;
        for (const auto& x : views(in)) parts.push_back(reduced_view(logical(x).contiguous()));
        at::Tensor staging = r.scaled(at::cat(parts), /*in_place=*/true);
        const MemberOutput mine(out[0].materialize());  // in logical order, as the inputs' parts
        at::Tensor o = reduced_view(mine.buffer);
        WorkPtr w = t->reduce_scatter(o, staging, r.op, timeout);
        return Started{{w}, [o, r, staging, mine] {
                         r.finish(o);
                         mine.copy_back();
                       }};
      },
      timeout, /*blocking=*/false, factors);
}

c10::intrusive_ptr<Work> OcclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                    std::vector<int64_t>& outputSplitSizes,
                                                    std::vector<int64_t>& inputSplitSizes,
                                                    const c10d::AllToAllOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "all_to_all_single";
  const auto device = check_tensors(op, {input});
  check_tensor(op, output, device);
  check_same_dtype(op, input, output);
  auto check_splits = [&](const at::Tensor& x, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = x.dim() == 0 ? 1 : x.size(0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "occl ", op, ": the ", which, "'s dim 0 (", rows,
                        ") is not divisible by world size ", size_, " and no split sizes were given");
      return;
    }
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size_, "occl ", op, ": ", which,
                      " split sizes need world size (", size_, ") entries, got ", splits.size());
    int64_t sum = 0;
    for (auto s : splits) {
      TORCH_CHECK_VALUE(s >= 0, "occl ", op, ": negative split size ", s);
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == rows, "occl ", op, ": ", which, " split sizes add up to ", sum, " but its dim 0 is ",
                      rows);
  };
  check_splits(input, inputSplitSizes, "input");
  check_splits(output, outputSplitSizes, "output");
  const int64_t in_row = input.dim() == 0 || input.size(0) == 0 ? 1 : input.numel() / input.size(0);
  const int64_t out_row = output.dim() == 0 || output.size(0) == 0 ? 1 : output.numel() / output.size(0);
  TORCH_CHECK_VALUE(input.numel() == 0 || output.numel() == 0 || in_row == out_row, "occl ", op,
                    ": input and output rows differ in size (", in_row, " and ", out_row, " elements)");
  // The part a rank sends itself is the part it receives from itself: a local mismatch, refused
  // here as Gloo refuses it at the call (it failed the kernel, and the group with it; hunt35a).
  auto own_rows = [&](const at::Tensor& x, const std::vector<int64_t>& splits) {
    return splits.empty() ? (x.dim() == 0 ? 1 : x.size(0)) / size_ : splits[rank_];
  };
  const int64_t sent_self = own_rows(input, inputSplitSizes) * in_row;
  const int64_t got_self = own_rows(output, outputSplitSizes) * out_row;
  TORCH_CHECK_VALUE(sent_self == got_self, "occl ", op, ": rank ", rank_, " sends itself ", sent_self,
                    " elements but expects ", got_self, " from itself (its input and output split sizes at index ",
                    rank_, " disagree)");
  // Splits in elements of the 1-D views the transport sees (bytes for dtypes it cannot carry).
  const int64_t unit = transport_dtype(input.scalar_type()) ? 1 : input.element_size();
  std::vector<int64_t> in_splits, out_splits;
  for (auto s : inputSplitSizes) in_splits.push_back(s * in_row * unit);
  for (auto s : outputSplitSizes) out_splits.push_back(s * out_row * unit);
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, "occl::all_to_all_single", Lane::kColl, device, {input}, {output},
      [t, in = kernel_arg(input), out = kernel_arg(output), in_splits, out_splits, timeout] {
        at::Tensor o = carried(out.materialize()), x = carried(in.materialize());
        return Started{{t->alltoall(o, x, out_splits, in_splits, timeout)}, {}};
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                               const c10d::AllToAllOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "all_to_all";
  const auto device = check_tensors(op, inputs, Layout::kAny);
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, "occl ", op,
                    ": expects world size (", size_, ") input and output tensors, got ", inputs.size(), " and ",
                    outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_tensor(op, outputs[i], device, Layout::kAnyWritten);
    check_same_dtype(op, inputs[0], outputs[i]);
    check_same_dtype(op, inputs[0], inputs[i]);
  }
  TORCH_CHECK_VALUE(inputs[rank_].numel() == outputs[rank_].numel(), "occl ", op, ": rank ", rank_, " sends itself ",
                    inputs[rank_].numel(), " elements but expects ", outputs[rank_].numel(),
                    " from itself (its input and output tensors at index ", rank_, " differ in size)");
  // One staging buffer each way: rank r's part is outputs[r] / inputs[r], flattened.
  const int64_t unit = transport_dtype(inputs[0].scalar_type()) ? 1 : inputs[0].element_size();
  std::vector<int64_t> in_splits, out_splits;
  for (const auto& x : inputs) in_splits.push_back(x.numel() * unit);
  for (const auto& o : outputs) out_splits.push_back(o.numel() * unit);
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::ALLTOALL, "occl::all_to_all", Lane::kColl, device, inputs, outputs,
      [t, in = member_args_of(inputs), out = member_args_of(outputs), in_splits, out_splits, timeout] {
        std::vector<at::Tensor> parts;
        for (const auto& x : views(in)) parts.push_back(flat_member(x));
        at::Tensor send = at::cat(parts);
        int64_t total = 0;
        for (auto s : out_splits) total += s;
        at::Tensor recv = at::empty({total}, send.options());
        WorkPtr w = t->alltoall(recv, send, out_splits, in_splits, timeout);
        return Started{{w}, [recv, send, out, out_splits] {
                         int64_t at = 0;
                         for (size_t i = 0; i < out.size(); ++i) {
                           copy_into_member(out[i].materialize(), recv.narrow(0, at, out_splits[i]));
                           at += out_splits[i];
                         }
                       }};
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "gather";
  check_single(op, inputs.size(), "input");
  const auto device = check_tensors(op, inputs);
  check_rank(op, "root", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs =
      root_list(op, "output", outputs, rank_ == root, root, size_, device, inputs[0], "input", Layout::kAnyWritten);
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::GATHER, "occl::gather", Lane::kColl, device, inputs, outs,
      [t, in = member_args_of(inputs), out = member_args_of(outs), root, timeout] {
        std::vector<MemberOutput> os;
        std::vector<at::Tensor> o;
        for (const auto& v : views(out)) {
          os.emplace_back(v);
          o.push_back(os.back().carried_buffer());
        }
        at::Tensor x = flat_member(in[0].materialize());  // in logical order, as the root's members
        return Started{{t->gather(o, x, root, timeout)}, [os] {
                         for (const auto& m : os) m.copy_back();
                       }};
      },
      timeout);
}

c10::intrusive_ptr<Work> OcclBackend::scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              const c10d::ScatterOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  const char* op = "scatter";
  check_single(op, outputs.size(), "output");
  const auto device = check_tensors(op, outputs);
  check_rank(op, "root", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins =
      root_list(op, "input", inputs, rank_ == root, root, size_, device, outputs[0], "output", Layout::kAny);
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  return enqueue(
      c10d::OpType::SCATTER, "occl::scatter", Lane::kColl, device, ins, outputs,
      [t, in = member_args_of(ins), out = member_args_of(outputs), root, timeout] {
        std::vector<at::Tensor> x;
        for (const auto& v : views(in)) x.push_back(flat_member(v));
        const MemberOutput mine(out[0].materialize());  // in logical order, as the root's members
        at::Tensor o = mine.carried_buffer();
        return Started{{t->scatter(o, x, root, timeout)}, [mine] { mine.copy_back(); }};
      },
      timeout);
}

std::shared_ptr<OcclBackend::PeerStaging> OcclBackend::peer_staging(int peer) {
  std::lock_guard<std::mutex> g(streams_mu_);
  auto& staging = staging_[peer];
  if (!staging) staging = std::make_shared<PeerStaging>();
  return staging;
}

namespace {

// A tensor's bytes, in memory order: what a send to this rank leaves and its receive takes (NCCL
// moves bytes too: the two tensors need the same size in bytes, not the same dtype).
at::Tensor bytes_of(const at::Tensor& t) { return t.view({-1}).view(at::kByte); }

// A receive from this rank: waits on the worker for the send of its tag, then copies it.
class SelfReceive final : public c10d::Work {
 public:
  SelfReceive(std::shared_ptr<SelfMailbox> box, int tag, at::Tensor into, std::shared_ptr<GroupError> group, ms timeout)
      : box_(std::move(box)), tag_(tag), into_(std::move(into)), group_(std::move(group)), timeout_(timeout) {}

  bool wait(ms /*unused: the operation's own timeout applies*/) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    at::Tensor got;
    {
      std::unique_lock<std::mutex> l(box_->mu);
      for (;;) {
        auto it = box_->by_tag.find(tag_);
        if (it != box_->by_tag.end() && !it->second.empty()) {
          got = std::move(it->second.front());
          it->second.pop_front();
          if (it->second.empty()) box_->by_tag.erase(it);
          break;
        }
        // The group's failure (the watchdog's timeout of this receive, a peer's error) or its end.
        TORCH_CHECK(!group_->failed(), "the process group failed: ", group_->message());
        TORCH_CHECK(!box_->closed, "the process group was aborted before a send from this rank (tag ", tag_, ") came");
        TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "no send from this rank with tag ", tag_, " within ",
                    timeout_.count(), " ms");
        box_->cv.wait_for(l, kWatchdogPoll);
      }
    }
    TORCH_CHECK(got.numel() == into_.numel(), "the send from this rank (tag ", tag_, ") has ", got.numel(),
                " bytes, the receiving tensor ", into_.numel());
    into_.copy_(got);
    return true;
  }

 private:
  std::shared_ptr<SelfMailbox> box_;
  int tag_;
  at::Tensor into_;
  std::shared_ptr<GroupError> group_;
  ms timeout_;
};

}  // namespace

c10::intrusive_ptr<Work> OcclBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  check_single("send", tensors.size(), "");
  const auto device = check_tensors("send", tensors, Layout::kDense);
  check_rank("send", "destination", dstRank);
  auto t = transport_;
  if (dstRank == rank_) {
    // A device copy, as NCCL's: the copy is taken when the send starts, so its Work ends there.
    return enqueue(c10d::OpType::SEND, "occl::send", Route(Lane::kSend, dstRank, /*staged=*/true), device, tensors, {},
                   [box = self_mailbox_, a = kernel_arg(tensors[0]), tag] {
                     at::Tensor copy = bytes_of(a.materialize()).clone();
                     {
                       std::lock_guard<std::mutex> g(box->mu);
                       box->by_tag[tag].push_back(std::move(copy));
                     }
                     box->cv.notify_all();
                     return Started{};
                   });
  }
  // A small send is staged: copied when it starts, so that its Work ends there, once the tensor may
  // be reused, instead of when the peer has received it (as small messages on NCCL and MPI). Its
  // completion is still waited for (a failure or timeout fails the group), off the peer's stream.
  // Per peer, the copies waiting for delivery are bounded (kStagedBytesLimit), and no send is
  // staged while an unstaged one is not delivered yet, so that the Works of the sends to a peer
  // end in order (waiting for the last one covers them all, as on NCCL's one stream per peer).
  // Each send holds a reservation until its operation is over (delivered, failed or discarded).
  const int64_t nbytes = static_cast<int64_t>(tensors[0].nbytes());
  std::shared_ptr<PeerStaging> peer = peer_staging(dstRank);
  bool staged = false;
  if (nbytes <= kStagedSendBytes && peer->unstaged.load() == 0) {
    int64_t held = peer->staged_bytes.load();
    while (held + nbytes <= kStagedBytesLimit && !peer->staged_bytes.compare_exchange_weak(held, held + nbytes)) {
    }
    staged = held + nbytes <= kStagedBytesLimit;
  }
  std::shared_ptr<void> reservation;
  if (staged) {
    reservation = std::shared_ptr<void>(peer.get(), [peer, nbytes](void*) { peer->staged_bytes.fetch_sub(nbytes); });
  } else {
    peer->unstaged.fetch_add(1);
    reservation = std::shared_ptr<void>(peer.get(), [peer](void*) { peer->unstaged.fetch_sub(1); });
  }
  return enqueue(c10d::OpType::SEND, "occl::send", Route(Lane::kSend, dstRank, staged), device, tensors, {},
                 [t, a = kernel_arg(tensors[0]), dstRank, tag, staged, reservation] {
                   at::Tensor v = carried(a.materialize());
                   if (staged) v = v.clone();  // the transport's Work holds it until sent
                   return Started{{t->send(v, dstRank, tag)}, [reservation] {}};
                 });
}

c10::intrusive_ptr<Work> OcclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  check_single("recv", tensors.size(), "");
  const auto device = check_tensors("recv", tensors, Layout::kDense);
  check_rank("recv", "source", srcRank);
  auto t = transport_;
  if (srcRank == rank_) {
    const ms timeout = effective(c10d::kUnsetTimeout);
    return enqueue(c10d::OpType::RECV, "occl::recv", Route(Lane::kRecv, srcRank), device, {}, tensors,
                   [box = self_mailbox_, group = error_, a = kernel_arg(tensors[0]), tag, timeout] {
                     WorkPtr w = c10::make_intrusive<SelfReceive>(box, tag, bytes_of(a.materialize()), group, timeout);
                     return Started{{w}, {}};
                   });
  }
  return enqueue(c10d::OpType::RECV, "occl::recv", Route(Lane::kRecv, srcRank), device, {}, tensors,
                 [t, a = kernel_arg(tensors[0]), srcRank, tag] {
                   at::Tensor v = carried(a.materialize());
                   return Started{{t->recv(v, srcRank, tag)}, [] {}};
                 });
}

c10::intrusive_ptr<Work> OcclBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  check_single("recv", tensors.size(), "");
  const auto device = check_tensors("recv", tensors, Layout::kDense);
  auto t = transport_;
  return enqueue(c10d::OpType::RECVANYSOURCE, "occl::recv_anysource", Lane::kRecvAny, device, {}, tensors,
                 [t, a = kernel_arg(tensors[0]), tag] {
                   at::Tensor v = carried(a.materialize());
                   return Started{{t->recv_anysource(v, tag)}, {}, /*anysource=*/true};
                 });
}

c10::intrusive_ptr<Work> OcclBackend::barrier(const c10d::BarrierOptions& opts) {
  const RefusalEndsCoalescing refusal_ends_coalescing(this);
  c10::Device device(c10::DeviceType::PrivateUse1, 0);
  if (opts.device && opts.device->type() == c10::DeviceType::PrivateUse1 && opts.device->has_index()) {
    device = *opts.device;
  } else if (!opts.device_ids.empty()) {
    device = c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(opts.device_ids[0]));
  } else if (auto bound = getBoundDeviceId()) {
    device = *bound;
  } else {
    int current = 0;
    OPENREG_CHECK(orGetDevice(&current));
    device = c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current));
  }
  auto t = transport_;
  const ms timeout = effective(opts.timeout);
  // A barrier blocks the host in wait(), as NCCL's does: that is what callers use it for.
  return enqueue(
      c10d::OpType::BARRIER, "occl::barrier", Lane::kColl, device, {}, {},
      [t, timeout] { return Started{{t->barrier(timeout)}, [] {}}; }, timeout, /*blocking=*/true);
}

void OcclBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // A host-side check of who reached the barrier: the transport's own (Gloo's) when it has one.
  check_not_shut_down("MONITORED_BARRIER");
  auto* gloo = dynamic_cast<GlooTransport*>(transport_.get());
  TORCH_CHECK(gloo != nullptr, "occl: monitored_barrier needs a Gloo transport, this group uses ", transport_->name());
  c10d::BarrierOptions o = opts;
  o.timeout = effective(opts.timeout);
  gloo->backend()->monitoredBarrier(o, waitAllRanks);
}

}  // namespace openreg_distributed
