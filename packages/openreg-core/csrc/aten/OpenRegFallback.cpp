// The generic path: every ATen operator without a native openreg kernel.
//
// For an op call on openreg tensors:
//  1. Output metadata comes from PyTorch's meta kernel, run on the host on
//     meta tensors that mirror the inputs (sizes, strides, offsets, dtypes);
//     for common operators whose Meta-key kernel is Python, the C++ one
//     (OpenRegNativeMeta.cpp).
//  2. Outputs are allocated on the device. View ops need no kernel at all:
//     the result aliases the input's storage with the meta result's geometry.
//  3. A kernel is launched on the current stream. On the device it turns
//     every openreg tensor into a CPU tensor over the kernel view of the
//     same memory (kernel_tensor) and runs the CPU implementation: in-place
//     and out= ops write straight into device memory; a functional op's
//     results are copied into the outputs on the device (one device-side
//     copy), except for structured ops, whose out= overload runs into the
//     outputs (see route_structured_ops). (For other ops an out= overload is
//     not a safe substitute: binary_cross_entropy.out, for one, expects its
//     output at the unreduced shape.)
//     Inputs are never copied, and the host does not wait.
//  4. Ops whose result the host must see (a Python bool or number) or whose
//     output shape depends on data (no meta kernel, e.g. nonzero) wait for
//     the kernel, as CUDA does.
// Random ops draw from a generator seeded at launch from the device's
// generator (see OpenRegGenerator.h).
#include "OpenRegFallback.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_efficientzerotensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/index_meta_dispatch.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../runtime/OpenRegCachingAllocator.h"
#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegFunctions.h"
#include "../runtime/OpenRegGenerator.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegKernelTensor.h"
#include "OpenRegNested.h"
#include "OpenRegQuantized.h"
#include "OpenRegSparse.h"

namespace c10::openreg {

namespace {

using torch::jit::Stack;

// ---- statistics and strict mode ----
// One counter per operator; each thread keeps its own map to the counters so
// that counting costs a thread-local lookup and a relaxed atomic increment.
// Never destroyed (as the meta cache below): ops may run during interpreter shutdown.
//
// Per-operator state here is keyed by the address of the operator's schema. An operator removed
// (torch.library._scoped_library, Library._destroy) and defined again often gets the same address
// with another schema, and ran with the state of the old one: a segfault, a mutation never
// launched, a count read from a freed schema. Removal drops that state (forget_operator), and bumps
// g_registry_epoch, at which each thread drops its map of OpFacts.
struct Counter {
  std::string name;
  std::atomic<int64_t> calls{0};
};
std::mutex& g_stats_mu = *new std::mutex();
auto& g_counts = *new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<Counter>>();
// Counters of removed operators: threads may still hold pointers to them, so they are never freed.
auto& g_retired_counts = *new std::vector<std::unique_ptr<Counter>>();
std::atomic<uint64_t> g_registry_epoch{0};
std::atomic<bool> g_strict{false};

const c10::OperatorHandle* out_overload(const c10::OperatorHandle& op);

// An argument or return the operator writes (in place, or out=); a return that is a view of an argument.
bool is_written(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }
bool is_view_return(const c10::Argument& ret) { return ret.alias_info() && !ret.alias_info()->isWrite(); }

// What the generic path needs to know of an operator's schema, worked out once
// per thread and operator (the map is thread-local: no lock on the hot path).
struct OpFacts {
  std::atomic<int64_t>* calls;                  // the operator's counter in g_counts
  bool tensor_returns_only = true;              // every return is a Tensor or a Tensor[]
  bool returns_object = false;                  // some return is a custom class object (a packed weight)
  bool mutates = false;                         // writes an argument, or returns nothing: always needs its kernel
  bool writes_argument = false;                 // in-place or out=: some argument is written
  const c10::OperatorHandle* out_op = nullptr;  // a routed structured op: the out= overload its kernel runs
  int fill_value = -1;                          // fill, masked_fill, index_fill: their Scalar `value` argument
  bool value_probe = false;                     // random_, bernoulli_(p), multinomial: see probe_value_checks
  bool randperm = false;                        // randperm: see check_randperm
  int std_tensor = -1;                          // normal with a tensor std: see check_normal_std
  bool multinomial = false;                     // multinomial: see check_multinomial_values
  int value_tensor = -1;                        // fill_, masked_fill_, index_fill_, index_put_: see move_value
  int probabilities = -1;                       // bernoulli's tensor p: see move_probabilities
  bool index_put = false;                       // index_put(_), _index_put_impl(_): see index_put_needs_the_host
  bool put = false;                             // put(_): see check_put
  bool unplaceable = false;                     // a return aliases a list argument: see unplaceable_alias
  bool custom_writes = false;                   // a custom operator that writes arguments: see BumpWrittenVersions
  bool bumps_versions = false;                  // ... with no ADInplaceOrView kernel to count it
};

int aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret);

// A return aliasing an element of a list argument (`Tensor(a!)[] xs -> Tensor(a!)[]`,
// `Tensor(a)[] xs -> Tensor(a)`), or no argument the generic path can find: the paths below place
// a returned alias on one tensor argument. Such an operator is refused at the call, before its
// kernel runs; until 2026-12-07 the path indexed its arguments at -1 (a read out of bounds) or read
// a list as a tensor, after the kernel had written the arguments (hunt35c).
std::optional<std::string> unplaceable_alias(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    if (!ret.alias_info()) continue;
    const int a = aliased_argument(schema, ret);
    if (a >= 0 && schema.arguments()[a].type()->kind() != c10::TypeKind::ListType) continue;
    std::string what = a >= 0 ? "its list argument '" + schema.arguments()[a].name() + "'" : "no tensor argument";
    const c10::AliasInfo* info = ret.alias_info();
    if (info->beforeSets().empty() && !info->containedTypes().empty()) info = &info->containedTypes()[0];
    for (const auto& arg : schema.arguments())  // Tensor(a!)[] xs: the alias set on the element type
      if (a < 0 && arg.alias_info() && !arg.alias_info()->containedTypes().empty() &&
          arg.alias_info()->containedTypes()[0].beforeSets() == info->beforeSets())
        what = "an element of its list argument '" + arg.name() + "'";
    return c10::str("'", schema.operator_name(), "' returns an alias of ", what,
                    ", which openreg's generic path cannot return: register an openreg "
                    "kernel for it (e.g. torch.library.custom_op with device_types=\"openreg\"), or return "
                    "new tensors");
  }
  return std::nullopt;
}

const OpFacts& facts_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, OpFacts> mine;
  thread_local uint64_t epoch = 0;
  // An operator was removed: drop them all (callers copy what they keep, see fallback).
  if (const uint64_t now = g_registry_epoch.load(std::memory_order_acquire); now != epoch) {
    mine.clear();
    epoch = now;
  }
  const auto& schema = op.schema();
  auto it = mine.find(&schema);
  if (it != mine.end()) return it->second;
  OpFacts f;
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    auto& counter = g_counts[&schema];
    if (!counter) {
      counter = std::make_unique<Counter>();
      counter->name = c10::toString(schema.operator_name());
    }
    f.calls = &counter->calls;
  }
  for (const auto& r : schema.returns()) {
    auto kind = r.type()->kind();
    f.returns_object |= kind == c10::TypeKind::ClassType || kind == c10::TypeKind::AnyClassType;
    f.tensor_returns_only &=
        kind == c10::TypeKind::TensorType ||
        (kind == c10::TypeKind::ListType &&
         r.type()->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType);
  }
  for (const auto& a : schema.arguments()) f.writes_argument |= is_written(a);
  f.mutates = f.writes_argument || schema.returns().empty();
  f.unplaceable = unplaceable_alias(schema).has_value();
  // Not ATen's: their CPU kernels write through data pointers, which bumps nothing on the CPU either
  // (batch norm's running statistics, rrelu's noise), and their in-place and out= forms have the kernel.
  f.custom_writes = f.writes_argument && schema.name().rfind("aten::", 0) != 0;
  f.bumps_versions = f.custom_writes && !op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  f.out_op = out_overload(op);
  const std::string& name = schema.name();
  if (name == "aten::fill" || name == "aten::fill_" || name == "aten::masked_fill" || name == "aten::masked_fill_" ||
      name == "aten::index_fill" || name == "aten::index_fill_")
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == "value" && schema.arguments()[i].type()->kind() == c10::TypeKind::NumberType)
        f.fill_value = static_cast<int>(i);
  if (name == "aten::fill" || name == "aten::fill_" || name == "aten::masked_fill" || name == "aten::masked_fill_" ||
      name == "aten::index_fill" || name == "aten::index_fill_" || name == "aten::index_put" ||
      name == "aten::index_put_" || name == "aten::_index_put_impl_" || name == "aten::_index_put_impl")
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto& a = schema.arguments()[i];
      if ((a.name() == "value" || a.name() == "values") && a.type()->kind() == c10::TypeKind::TensorType)
        f.value_tensor = static_cast<int>(i);
    }
  const std::string& overload = schema.overload_name();
  if (name == "aten::bernoulli" || name == "aten::bernoulli_")
    for (size_t i = 1; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == "p" && schema.arguments()[i].type()->kind() == c10::TypeKind::TensorType)
        f.probabilities = static_cast<int>(i);
  f.value_probe =
      name == "aten::random_" || name == "aten::multinomial" ||
      ((name == "aten::bernoulli_" && overload == "float") || (name == "aten::bernoulli" && overload == "p"));
  f.randperm = name == "aten::randperm";
  f.multinomial = name == "aten::multinomial";
  f.index_put = name == "aten::index_put" || name == "aten::index_put_" || name == "aten::_index_put_impl_" ||
                name == "aten::_index_put_impl";
  f.put = name == "aten::put" || name == "aten::put_";
  if (name == "aten::normal")
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == "std" && schema.arguments()[i].type()->kind() == c10::TypeKind::TensorType)
        f.std_tensor = static_cast<int>(i);
  return mine.emplace(&schema, f).first->second;
}

void count(const c10::OperatorHandle& op) { facts_of(op).calls->fetch_add(1, std::memory_order_relaxed); }

// ---- mapping over the tensors inside IValues ----
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    if (list.size() > 0 && (list.get(0).isTensor() || list.get(0).isNone())) {
      bool has_tensor = false;
      for (const c10::IValue& e : list) has_tensor |= e.isTensor();
      if (has_tensor) {
        c10::List<std::optional<at::Tensor>> out;
        for (const c10::IValue& e : list)
          out.push_back(e.isTensor() ? std::optional<at::Tensor>(f(e.toTensor())) : std::nullopt);
        return out;
      }
    }
  }
  return v;
}

template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) f(e.toTensor());
  }
}

// ---- 1. meta ----
// With the conjugate and negative bits: a view op's meta kernel passes them on, as the CPU kernel
// does (without them the asynchronous path's views of `x.conj()` dropped the bit: `unfold`,
// `view_as_real`; hunt35c).
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || !t.is_privateuseone()) return t;
  auto opts = t.options().device(c10::kMeta);
  at::Tensor m;
  if (t.storage_offset() == 0 && t.numel() > 0 && t.storage().nbytes() == t.nbytes() && t.is_contiguous()) {
    m = at::empty_strided(t.sizes(), t.strides(), opts);
  } else {
    const int64_t storage_numel = static_cast<int64_t>(t.storage().nbytes() / t.dtype().itemsize());
    m = at::empty({storage_numel}, opts).as_strided(t.sizes(), t.strides(), t.storage_offset());
  }
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

// ---- 3. the kernel ----
// Device code cannot warn (a GPU kernel has no way to): the warnings the CPU implementation raises
// while running as a kernel are dropped, as on every stream worker
// (../runtime/OpenRegStream.cpp::apply_intra_op_threads). Host-side checks (meta kernels) still warn.

// torch.use_deterministic_algorithms(True, warn_only=True): a CPU kernel warns about its
// nondeterministic algorithm (at::Context::alertNotDeterministic) where CUDA's host code warns at
// the call. The synchronous path keeps those warnings and the host issues them after the kernel
// (other device warnings are still dropped); before, openreg hid every such warning.
bool is_determinism_alert(const c10::Warning& w) {
  return w.msg().find("does not have a deterministic implementation") != std::string::npos;
}

struct KeepDeterminismAlerts final : c10::WarningHandler {
  std::vector<c10::Warning> alerts;
  void process(const c10::Warning& w) override {
    if (is_determinism_alert(w)) alerts.push_back(w);
  }
};

// The deterministic-algorithms mode a call runs under, part of every meta cache key: under a new
// mode each signature is verified again on the synchronous path, so that a kernel's refusal (or
// warning) comes at the call, as on the CPU and CUDA. A signature verified before
// use_deterministic_algorithms(True) used to stay asynchronous, and the refusal failed a later,
// unrelated synchronising call as a kernel failure.
int64_t determinism_word() {
  const auto& ctx = at::globalContext();
  return 0x5d00 | int64_t{ctx.deterministicAlgorithms()} | (int64_t{ctx.deterministicAlgorithmsWarnOnly()} << 1);
}

// A stack captured at launch: plain device tensors as KernelTensorArgs (their
// slots hold None), device tensors inside lists as launch tensors. Launches are
// recycled (see Launch), so capturing into one reuses its buffers.
struct LaunchStack {
  Stack values;
  c10::SmallVector<std::pair<size_t, KernelTensorArg>, 3> tensors;  // inline: no allocation for most ops
  c10::SmallVector<LaunchBytes, 1> listed;                          // counts device tensors inside lists

  // Takes the values in [first, last) (moved from).
  void capture(c10::IValue* first, c10::IValue* last) {
    values.reserve(values.size() + (last - first));
    for (; first != last; ++first) {
      if (first->isTensor() && !is_device_tensor(first->toTensor()))
        values.push_back(host_value(std::move(*first).toTensor()));
      else
        add(*first);
    }
  }

  void add(const c10::IValue& v) {
    if (v.isTensor() && is_device_tensor(v.toTensor()))
      append(v.toTensor());
    else
      values.push_back(map_tensors(v, [this](const at::Tensor& t) {
        if (is_device_tensor(t)) listed.emplace_back(t.nbytes());
        return launch_tensor(host_value(t));
      }));
  }

  // A host tensor the operator reads (a CPU scalar tensor; common_device refuses one it writes): its
  // value at the call, as the CPU computes with it then and CUDA copies it at the launch. The kernel
  // runs later, and the caller may change its tensor meanwhile (an in-place update of a CPU step or
  // decay between steps). A wrapped number (`x * 2`) is the dispatcher's own: nobody else can
  // change it.
  static at::Tensor host_value(at::Tensor t) {
    if (!t.defined() || t.is_privateuseone() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
    return t.clone();
  }

  static bool is_device_tensor(const at::Tensor& t) { return t.defined() && t.is_privateuseone(); }

  void append(const at::Tensor& t) {
    tensors.emplace_back(std::piecewise_construct, std::forward_as_tuple(values.size()), std::forward_as_tuple(t));
    values.emplace_back();
  }

  void clear() {
    values.clear();
    tensors.clear();
    listed.clear();
  }

  // Device side: the stack with every device tensor as a kernel tensor.
  Stack materialize() const;
};

// What one generic kernel launch carries to the device. The host thread that
// made it also frees it: the stream's worker only hands it back (bury), and the
// launching thread takes back what it finds at its next launch. A free on another
// thread than the malloc contends for the allocating thread's malloc arena
// (measured: a fifth of the host's time per tiny op went to that lock). Taken-back
// launches are reused, buffers and all: a launch costs no malloc once warm.
struct Launch {
  struct Graveyard {
    std::atomic<Launch*> head{nullptr};  // buried by workers
    std::atomic<bool> orphaned{false};   // its thread has exited: workers free what they bury
    std::vector<Launch*> spare;          // the owning thread's, ready for reuse
  };
  static constexpr size_t kSpares = 128;  // spare launches kept per thread

  Launch* next = nullptr;
  Graveyard* home;
  std::optional<c10::OperatorHandle> op;
  size_t outs = 0;               // a routed structured op: its last `outs` arguments are its outputs
  bool writes_argument = false;  // in-place (or out=): the kernel checks it did not resize one
  LaunchStack args, targets;

  explicit Launch(Graveyard* home) : home(home) { alive().fetch_add(1, std::memory_order_relaxed); }
  ~Launch() { alive().fetch_sub(1, std::memory_order_relaxed); }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  static std::atomic<int64_t>& alive() {  // launches are recycled: this changes rarely
    static std::atomic<int64_t> n{0};
    return n;
  }

  static Graveyard& graveyard() {
    thread_local Graveyard* mine = adopt(new Graveyard());  // outlives the thread: buried launches point at it
    return *mine;
  }

  // At its thread's exit a graveyard gives up the launches it kept (a program that starts many
  // short-lived threads would otherwise keep every one's). The graveyard itself stays: launches
  // still queued then are buried into it later, and freed by the worker that buries them.
  static Graveyard* adopt(Graveyard* g) {
    struct Release {
      Graveyard* g;
      ~Release() {
        g->orphaned.store(true, std::memory_order_seq_cst);
        take_back(*g);
        for (Launch* l : g->spare) delete l;
        g->spare.clear();
      }
    };
    thread_local Release release{g};
    return g;
  }

  static Launch* make(const c10::OperatorHandle& op) {
    Graveyard& g = graveyard();
    // The buried list is taken back only when no spare is left, not at every launch: its head
    // is written by the worker after every kernel, and reading it (and the launches on it) cost
    // the host a cache-line transfer from the worker's core at every launch.
    if (g.spare.empty()) take_back(g);
    Launch* l = nullptr;
    if (g.spare.empty()) {
      l = new Launch(&g);
    } else {
      l = g.spare.back();
      g.spare.pop_back();
    }
    l->op.emplace(op);
    l->outs = 0;
    return l;
  }

  static void take_back(Graveyard& g) {
    for (Launch* l = g.head.exchange(nullptr, std::memory_order_seq_cst); l != nullptr;) {
      Launch* next = l->next;
      recycle(g, l);
      l = next;
    }
  }

  // Drops the arguments here, on the thread that made them, and keeps the launch for reuse.
  static void recycle(Graveyard& g, Launch* l) {
    l->args.clear();
    l->targets.clear();
    l->op.reset();
    if (g.spare.size() < kSpares)
      g.spare.push_back(l);
    else
      delete l;
  }

  // Holds a launch being filled until the runtime owns it: a throw while capturing its arguments
  // recycles it, and its arguments give back the bytes they counted (OpenRegStream.h).
  struct Unlaunched {
    void operator()(Launch* l) const { recycle(*l->home, l); }
  };

  // Device side: the kernel.
  static orStatus run(void* p);

  // The runtime's deleter: after the kernel ran (on the worker), or when the launch was refused.
  static void bury(void* p) {
    auto* l = static_cast<Launch*>(p);
    Graveyard& g = *l->home;
    l->next = g.head.load(std::memory_order_relaxed);
    while (!g.head.compare_exchange_weak(l->next, l, std::memory_order_seq_cst, std::memory_order_relaxed)) {
    }
    // The launching thread has exited: nobody takes its launches back. Sequentially consistent
    // with its exit (orphaned, then take_back): either that take_back saw this launch, or this
    // load sees orphaned and the worker frees the list.
    if (g.orphaned.load(std::memory_order_seq_cst))
      for (Launch* dead = g.head.exchange(nullptr, std::memory_order_seq_cst); dead != nullptr;) {
        Launch* next = dead->next;
        delete dead;
        dead = next;
      }
  }
};

// Arguments as the device sees them: openreg tensors become kernel tensors. A device tensor passed
// twice becomes one kernel tensor: CPU kernels tell an out= argument that is also an input by
// identity (TensorIterator's read-write operands, which may not be resized). With two kernel
// tensors, logical_and_'s composite, logical_and_out(self, self, other), resized self to the
// broadcast shape where the CPU refuses to.
void to_kernel_stack(Stack& stack, KernelStorages& storages) {
  c10::SmallVector<std::pair<const c10::TensorImpl*, at::Tensor>, 4> seen;
  for (c10::IValue& v : stack)
    v = map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_privateuseone()) return t;
      for (const auto& [impl, kernel] : seen)
        if (impl == t.unsafeGetTensorImpl()) return kernel;
      at::Tensor kernel = sparse::is_sparse(t)   ? sparse::kernel_tensor(t, &storages)
                          : nested::is_nested(t) ? nested::kernel_tensor(t, &storages)
                                                 : kernel_tensor(t, &storages);
      return seen.emplace_back(t.unsafeGetTensorImpl(), std::move(kernel)).second;
    });
}

// The CPU dispatch keys of a kernel stack: a sparse (nested) argument selects the CPU's sparse
// (nested) kernel.
c10::DispatchKeySet cpu_keys(const Stack& stack) {
  c10::DispatchKeySet keys(c10::DispatchKey::CPU);
  for (const c10::IValue& v : stack)
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.is_sparse()) keys = keys.add(c10::DispatchKey::SparseCPU);
      if (sparse::is_compressed(t)) keys = keys.add(c10::DispatchKey::SparseCsrCPU);
      if (t.is_nested()) keys = keys.add(c10::DispatchKey::NestedTensorCPU);
    });
  return keys;
}

Stack LaunchStack::materialize() const {
  KernelStorages storages;
  Stack stack = values;
  to_kernel_stack(stack, storages);
  for (const auto& [i, arg] : tensors) stack[i] = arg.materialize(&storages);
  return stack;
}

// What a launch took from a generator: the offset it moved from and to (see give_back_draws).
struct Draw {
  at::Generator generator;
  c10::intrusive_ptr<OpenRegGeneratorState> state;
  uint64_t seed, from, to;
};

// A generator argument: the per-launch generator from the device's generator. Each draw is added
// to `draws`, when given.
void seed_generators(const c10::FunctionSchema& schema, c10::IValue* args, c10::DeviceIndex device,
                     std::vector<Draw>* draws = nullptr) {
  const auto& arguments = schema.arguments();
  int64_t values = -1;  // how many values the op may draw: its largest tensor argument (computed on demand)
  for (size_t i = 0; i < arguments.size(); ++i) {
    // Generator? (ATen's) or Generator (a custom op's; it was passed on as the openreg generator,
    // which the CPU kernel refused, naming an op it called inside).
    const c10::TypePtr& type = arguments[i].type();
    const bool generator =
        type->kind() == c10::TypeKind::GeneratorType ||
        (type->kind() == c10::TypeKind::OptionalType &&
         type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType);
    if (!generator) continue;
    at::Generator gen = args[i].isNone() ? default_generator(device) : args[i].toGenerator();
    // torch's own check's words (at::check_generator), which the CPU's kernels raise.
    TORCH_CHECK(gen.device().type() == c10::DeviceType::PrivateUse1, "Expected a '", c10::DeviceType::PrivateUse1,
                "' device type for generator but found '", gen.device().type(), "'");
    if (values < 0) {
      values = 0;
      for (size_t j = 0; j < arguments.size(); ++j)
        for_each_tensor(args[j], [&](const at::Tensor& t) {
          if (t.defined()) values = std::max<int64_t>(values, t.numel());
        });
    }
    void* stream = current_stream_handle(device);
    if (random_capture_active(stream)) {
      // Captured into a graph: the kernel runs only in replays, each of which seeds it and advances
      // the offset first (reseed_for_replay). The capture takes no numbers, as a CUDA capture leaves
      // the generator's offset alone (its ops take intragraph offsets): a draw of another thread
      // meanwhile is not repeated.
      at::Generator kernel = at::make_generator<at::CPUGeneratorImpl>(0);
      c10::intrusive_ptr<OpenRegGeneratorState> state;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        state = gen.get<OpenRegGeneratorImpl>()->state();
      }
      if (note_random_launch(stream, {gen, state, kernel, static_cast<uint64_t>(values)})) {
        args[i] = kernel;
        continue;
      }
      // The capture ended meanwhile (another thread): the op runs now, seeded as any other. A
      // capture ended between here and the launch is the caller's race, as on CUDA.
    }
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = gen.get<OpenRegGeneratorImpl>();
    const uint64_t from = impl->get_offset();
    args[i] = impl->kernel_generator(static_cast<uint64_t>(values));
    if (draws != nullptr) draws->push_back({gen, impl->state(), impl->current_seed(), from, impl->get_offset()});
  }
}

// A call refused by its kernel's argument checks takes no numbers, as on the CPU and CUDA (which
// check before they draw or reserve an offset): a caught refusal (`uniform_(3, 2)`) moved every
// later number of the device (hunt36c). Unless the generator moved on meanwhile (another thread's
// draw, a reseeding), its offset goes back.
void give_back_draws(std::vector<Draw>& draws) {
  for (auto it = draws.rbegin(); it != draws.rend(); ++it) {
    std::lock_guard<std::mutex> lock(it->generator.mutex());
    if (it->state->seed == it->seed && it->state->offset == it->to) it->state->offset = it->from;
  }
}

// Arguments that name a device (factories): meta for shape inference, cpu on the device.
void replace_devices(c10::IValue* args, size_t n, c10::Device device) {
  for (size_t i = 0; i < n; ++i)
    if (args[i].isDevice() && args[i].toDevice().is_privateuseone()) args[i] = device;
}

void replace_devices(Stack& args, c10::Device device) { replace_devices(args.data(), args.size(), device); }

// Index of the argument a returned alias belongs to.
int aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  // A list of views (`Tensor(a)[]`, unbind's) carries its alias set on the element type.
  const c10::AliasInfo* info = ret.alias_info();
  if (info->beforeSets().empty() && !info->containedTypes().empty()) info = &info->containedTypes()[0];
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (a.alias_info() && a.alias_info()->beforeSets() == info->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// ---- 2. geometry of results, and a cache of it ----
// The generic path runs CPU kernels on plain tensors: a quantized result (a QTensorImpl and its
// quantizer) has no place on it. Quantized openreg tensors are OpenRegQuantized.cpp's and openreg-quant's.
void check_not_quantized(c10::ScalarType dtype, const c10::FunctionSchema& schema) {
  if (c10::isQIntType(dtype)) reject_quantized(schema.operator_name(), dtype);
}

// What the meta kernel says about one result tensor.
struct Geometry {
  bool defined = false;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  bool conj = false, neg = false;
  // For a return the schema calls a view: whether the meta result really
  // shares its input's storage (resolve_conj, for one, only sometimes does).
  bool aliases = true;
};

// A result as the first call's check compares it: dtype and sizes (a nested result: sizes {-1}).
using ResultShape = std::pair<c10::ScalarType, std::vector<int64_t>>;

Geometry geometry_of(const at::Tensor& t) {
  Geometry g;
  if (!t.defined()) return g;
  g.defined = true;
  g.dtype = t.scalar_type();
  g.sizes = t.sizes().vec();
  g.strides = t.strides().vec();
  g.offset = t.storage_offset();
  g.conj = t.is_conj();
  g.neg = t.is_neg();
  return g;
}

// The meta kernel's verdict for one call: per return, one tensor or a list.
struct MetaResult {
  bool data_dependent = false;  // no usable meta kernel: run synchronously
  // The first call of a coarse signature (see Key) runs synchronously
  // and compares the CPU kernel's result shapes with the meta kernel's. Where
  // they disagree (some meta kernels describe CUDA's auxiliary outputs, e.g.
  // embedding_bag's), calls of that signature stay synchronous, with outputs
  // shaped as the CPU made them. The verdict is shared by every exact signature
  // of the coarse one: a new shape, offset or scalar value reruns the meta
  // kernel on the host but does not make the host wait again.
  // agrees_in_cpu_dtypes: the shapes agree but some fresh results' dtypes do not (the batch norms'
  // saved statistics in 16-bit training are float32 in their meta kernel, as on CUDA, and in the
  // input's type on the CPU): later calls stay asynchronous, with the CPU's dtypes (`dtypes`, one
  // per defined result, in the order of shapes_of).
  enum class Check { unverified, agrees, agrees_in_cpu_dtypes, disagrees };
  struct Verdict {
    std::atomic<Check> check{Check::unverified};
    std::mutex mu;                        // the first verdict is kept (two threads may verify at once)
    std::vector<c10::ScalarType> dtypes;  // written once, before check becomes agrees_in_cpu_dtypes
    void decide(Check c, std::vector<c10::ScalarType> d = {}) {
      std::lock_guard<std::mutex> lock(mu);
      if (check.load(std::memory_order_relaxed) != Check::unverified) return;
      dtypes = std::move(d);
      check.store(c, std::memory_order_release);
    }
  };
  std::shared_ptr<Verdict> verdict = std::make_shared<Verdict>();
  std::vector<bool> is_list;
  std::vector<std::vector<Geometry>> returns;
};

// A view of `base` with the geometry (and dtype) `g`.
at::Tensor view_like(const at::Tensor& base, const Geometry& g) {
  at::Tensor out;
  if (g.dtype == base.scalar_type()) {
    out = base.as_strided(g.sizes, g.strides, g.offset);
  } else {
    out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(),
                                                   c10::scalarTypeToTypeMeta(g.dtype));
    out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  }
  out._set_conj(g.conj);
  out._set_neg(g.neg);
  return out;
}

at::Tensor view_like(const at::Tensor& base, const at::Tensor& meta) { return view_like(base, geometry_of(meta)); }

// A fresh device tensor (under the caller's device guard): straight from the
// caching allocator, as openreg's empty_strided kernel would, without a dispatch.
at::Tensor alloc_like(const Geometry& g, const c10::FunctionSchema& schema) {
  if (!g.defined) return at::Tensor();
  check_not_quantized(g.dtype, schema);
  return at::detail::empty_strided_generic(g.sizes, g.strides, allocator::get(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), g.dtype);
}

// Meta results depend only on what meta tensors carry (dtype, sizes,
// strides, offset, device) and on the non-tensor arguments, so they are
// cached per operator and argument signature: a repeated call skips the
// meta kernel (which, for many ops, is Python code).
struct MetaKey {
  const void* op;
  std::vector<int64_t> words;
  bool operator==(const MetaKey& o) const { return op == o.op && words == o.words; }
};

struct MetaKeyHash {
  size_t operator()(const MetaKey& k) const {
    size_t h = std::hash<const void*>()(k.op);
    for (int64_t w : k.words) h ^= std::hash<int64_t>()(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

// A wrapped number (a Python scalar turned into a 0-dim tensor) takes part in
// type promotion as a scalar: a + 2 keeps int32 where a + torch.tensor(2) does not.
int64_t dtype_word(const at::Tensor& t) {
  return static_cast<int64_t>(t.scalar_type()) | (int64_t{t.is_conj()} << 32) | (int64_t{t.is_neg()} << 33) |
         (int64_t{t.unsafeGetTensorImpl()->is_wrapped_number()} << 34);
}

// Two keys are built from a call's arguments. The exact key is what meta can see:
// a meta result is cached under it. The coarse key is what the meta kernel and the
// CPU kernel could disagree on (the operator, dtypes, ranks, empty tensors, which
// optional arguments are given, flags and strings) without the sizes, strides,
// offsets and numbers that change from call to call (a learning rate, a slice):
// the first-call verification is shared under it. Small choices are kept in it (key_value).
enum class Key { exact, coarse };

void key_tensor(const at::Tensor& t, std::vector<int64_t>& w, Key kind) {
  if (!t.defined()) {
    w.push_back(-1);
    return;
  }
  if (kind == Key::coarse) {
    w.push_back((static_cast<int64_t>(t.device().type()) << 16) | (t.dim() << 1) | int64_t{t.numel() == 0});
    w.push_back(dtype_word(t));
    return;
  }
  w.push_back((static_cast<int64_t>(t.device().type()) << 16) | (t.device().index() + 1));
  w.push_back(dtype_word(t));
  w.push_back(t.dim());
  for (int64_t v : t.sizes()) w.push_back(v);
  for (int64_t v : t.strides()) w.push_back(v);
  w.push_back(t.storage_offset());
  w.push_back(static_cast<int64_t>(t.storage().nbytes()));
}

// The values of choices from kSmallIntLow to kSmallIntHigh - 1 are part of the coarse key (key_value).
constexpr int64_t kSmallIntLow = -16, kSmallIntHigh = 64;

// Whether the schema declares an argument a choice among a few values: an int (a reduction, a mode,
// a dim), a ScalarType, Layout or MemoryFormat, or an optional one. ATen declares sizes, offsets and
// counts SymInt: they stay out of the coarse key (a warmed-up narrow_copy captured with another
// start was a new signature, whose first call cannot be captured).
bool is_choice(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (auto optional = t->cast<c10::OptionalType>()) t = optional->getElementType();
  const c10::TypeKind k = t->kind();
  return k == c10::TypeKind::IntType || k == c10::TypeKind::ScalarTypeType || k == c10::TypeKind::LayoutType ||
         k == c10::TypeKind::MemoryFormatType;
}

// Appends `v` to a key; false when it cannot be keyed (symbolic or custom values). `choice`: the
// schema declares it one (is_choice).
bool key_value(const c10::IValue& v, std::vector<int64_t>& w, Key kind = Key::exact, bool choice = false) {
  const bool exact = kind == Key::exact;
  auto number = [&](int64_t tag, const void* bits, size_t words) {
    w.push_back(tag);  // the kind of a number promotes; its value matters to the exact key only
    for (size_t i = 0; exact && i < words; ++i) {
      int64_t word;
      std::memcpy(&word, static_cast<const char*>(bits) + i * sizeof(word), sizeof(word));
      w.push_back(word);
    }
  };
  if (v.isTensor()) {
    w.push_back(1);
    key_tensor(v.toTensor(), w, kind);
  } else if (v.isNone()) {
    w.push_back(2);
  } else if (v.isInt()) {
    const int64_t i = v.toInt();
    // The coarse key keeps the value of a small choice (a reduction, an embedding_bag mode, a dim, a
    // dtype), on which the meta and CPU kernels can disagree: a verdict for one choice is no verdict
    // for another. At most one first call per value.
    if (!exact && choice && i >= kSmallIntLow && i < kSmallIntHigh) {
      w.push_back(13);
      w.push_back(i);
    } else {
      number(3, &i, 1);
    }
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    number(4, &d, 1);
  } else if (v.isComplexDouble()) {
    const c10::complex<double> c = v.toComplexDouble();
    number(12, &c, 2);
  } else if (v.isBool()) {
    w.push_back(5);
    w.push_back(v.toBool());
  } else if (v.isIntList()) {
    w.push_back(6);
    auto l = v.toIntList();
    w.push_back(static_cast<int64_t>(l.size()));
    if (exact)
      for (int64_t x : l) w.push_back(x);
  } else if (v.isTensorList()) {
    w.push_back(7);
    auto l = v.toTensorList();
    w.push_back(static_cast<int64_t>(l.size()));
    for (const at::Tensor& t : l) key_tensor(t, w, kind);
  } else if (v.isList()) {
    w.push_back(8);
    auto l = v.toList();
    w.push_back(static_cast<int64_t>(l.size()));
    for (const c10::IValue& e : l)
      if (!key_value(e, w, kind)) return false;
  } else if (v.isDevice()) {
    w.push_back(9);
    w.push_back((static_cast<int64_t>(v.toDevice().type()) << 16) | (exact ? v.toDevice().index() + 1 : 0));
  } else if (v.isString()) {
    w.push_back(10);
    w.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else if (v.isGenerator()) {
    w.push_back(11);
  } else {
    return false;
  }
  return true;
}

// Exact signatures (shapes, offsets, scalar values) come and go: their cache is dropped when full.
// Verdicts are per coarse signature, far fewer, and survive that: a signature verified once never
// makes the host wait again (a warmed-up op captured into a graph after a flush failed to wait).
constexpr size_t kMetaCacheCapacity = 16384;
constexpr size_t kCheckCapacity = 65536;
std::mutex& g_meta_mu = *new std::mutex();
auto& g_meta_cache = *new std::unordered_map<MetaKey, std::shared_ptr<const MetaResult>, MetaKeyHash>();
auto& g_checks = *new std::unordered_map<MetaKey, std::shared_ptr<MetaResult::Verdict>, MetaKeyHash>();

std::shared_ptr<MetaResult> compute_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                         bool tensor_returns_only) {
  auto result = std::make_shared<MetaResult>();
  if (!tensor_returns_only) {
    result->data_dependent = true;
    return result;
  }
  Stack meta(args.begin(), args.end());
  for (c10::IValue& v : meta) v = map_tensors(v, to_meta);
  replace_devices(meta, c10::Device(c10::kMeta));
  for (c10::IValue& v : meta)  // meta kernels must not consume the real generator
    if (v.isGenerator()) v = c10::IValue();
  const Stack meta_args = meta;
  try {
    const c10::DispatchKeySet meta_keys(c10::DispatchKey::Meta);
    if (const c10::KernelFunction* native = native_meta_kernel(op.operator_name()))
      native->callBoxed(op, meta_keys, &meta);  // no Python on a first call (OpenRegNativeMeta.cpp)
    else
      op.redispatchBoxed(meta_keys, &meta);
  } catch (const std::exception&) {
    // No usable meta kernel (data-dependent shapes, or none registered): run
    // on the device and wait. A genuine argument error is raised there too,
    // with the message the CPU implementation gives.
    result->data_dependent = true;
    return result;
  }
  bool strided = true;
  for (const c10::IValue& r : meta)
    for_each_tensor(r, [&](const at::Tensor& t) { strided &= !t.defined() || t.layout() == c10::kStrided; });
  if (!strided) {  // a sparse result (to_sparse of a dense tensor): its nnz depends on the data
    result->data_dependent = true;
    return result;
  }
  // A result on another device because a Device argument names it (a custom op's "cpu": only
  // openreg's devices are replaced by meta above): the generic path makes every result an openreg
  // tensor, against the op's fake kernel (FakeTensorMode, torch.compile, opcheck say CPU). A result
  // that follows a CPU scalar argument (bucketize of a 0-dim CPU tensor) is left as it was.
  const bool names_another_device = std::any_of(meta_args.begin(), meta_args.end(), [](const c10::IValue& v) {
    return v.isDevice() && v.toDevice().type() != c10::kMeta;
  });
  if (names_another_device)
    for (const c10::IValue& r : meta)
      for_each_tensor(r, [&](const at::Tensor& t) {
        TORCH_CHECK_NOT_IMPLEMENTED(!t.defined() || t.is_meta(), "'", op.operator_name(), "' returns a tensor on ",
                                    t.device(),
                                    " (its meta kernel says so), and openreg's generic path returns its results on "
                                    "openreg: register an openreg kernel for it (e.g. torch.library.custom_op with "
                                    "device_types=\"openreg\") to return a tensor elsewhere");
      });
  const auto& schema = op.schema();
  for (size_t i = 0; i < meta.size(); ++i) {
    const c10::IValue& r = meta[i];
    const at::Tensor* input = nullptr;
    if (is_view_return(schema.returns()[i])) {
      const c10::IValue& a = meta_args[aliased_argument(schema, schema.returns()[i])];
      if (a.isTensor()) input = &a.toTensor();
    }
    auto describe = [&](const at::Tensor& t) {
      Geometry g = geometry_of(t);
      if (input != nullptr && t.defined()) g.aliases = t.is_alias_of(*input);
      return g;
    };
    std::vector<Geometry> gs;
    if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorList()) gs.push_back(describe(t));
      result->is_list.push_back(true);
    } else {
      gs.push_back(describe(r.isTensor() ? r.toTensor() : at::Tensor()));
      result->is_list.push_back(false);
    }
    result->returns.push_back(std::move(gs));
  }
  return result;
}

std::shared_ptr<const MetaResult> meta_for(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                           bool tensor_returns_only) {
  thread_local MetaKey key;  // reused: building a key allocates nothing once warm
  key.op = &op.schema();
  key.words.clear();
  key.words.push_back(determinism_word());
  bool cacheable = true;
  for (const c10::IValue& v : args) cacheable = cacheable && key_value(v, key.words);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(g_meta_mu);
    auto it = g_meta_cache.find(key);
    if (it != g_meta_cache.end()) return it->second;
  }
  auto result = compute_meta(op, args, tensor_returns_only);
  if (cacheable) {
    MetaKey coarse{key.op, {key.words[0]}};  // the determinism word (see determinism_word)
    const auto& declared = op.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i)
      key_value(args[i], coarse.words, Key::coarse, i < declared.size() && is_choice(declared[i]));
    std::lock_guard<std::mutex> lock(g_meta_mu);
    if (g_meta_cache.size() >= kMetaCacheCapacity) g_meta_cache.clear();
    if (g_checks.size() >= kCheckCapacity) g_checks.clear();
    auto& verdict = g_checks[std::move(coarse)];
    if (!verdict) verdict = result->verdict;
    result->verdict = verdict;
    g_meta_cache.emplace(key, result);
  }
  return result;
}

// An out= tensor the op resizes: restrided as the kernel laid the result out
// (ATen's structured kernels do so, e.g. channels-last for a channels-last input).
void resize_output_like(const at::Tensor& out, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  out.resize_(sizes);
  if (out.strides() != strides && out.is_non_overlapping_and_dense() &&
      at::detail::computeStorageNbytes(sizes, strides, out.itemsize(), 0) == out.numel() * out.itemsize())
    out.as_strided_(sizes, strides, out.storage_offset());
}

// dst.copy_(src) of a result into its device output, as the bits they are when the dtypes are the
// same: the CPU's copy_ has no kernel for some dtypes even between equal ones (uint1..7, int1..7,
// bits), and results the CPU's kernels made of them (torch.cat of uint4) failed to land.
//
// A CPU out= kernel may restride its output in place and write it in the new layout (the
// replication and reflection pads restride a contiguous output to channels-last): the result then
// is the output's own memory in another order, and copying it over itself element by element read
// elements it had already overwritten (hunt35d). Such a result is cloned first.
bool spans_overlap(const at::Tensor& a, const at::Tensor& b) {
  auto span = [](const at::Tensor& t) {
    const auto* lo = static_cast<const char*>(t.const_data_ptr());
    int64_t last = 0;  // the farthest element, in elements (strides of results are not negative)
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    return std::make_pair(lo, lo + (last + 1) * static_cast<int64_t>(t.itemsize()));
  };
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a_lo, a_hi] = span(a);
  const auto [b_lo, b_hi] = span(b);
  return a_lo < b_hi && b_lo < a_hi;
}

// Whether every element of `t` has memory of its own (gaps allowed), by the sufficient test ATen's
// geometry checks use: each dimension's stride, in increasing order, passes the extent of the
// dimensions below it. (at::has_internal_overlap answers "too hard" for any layout with gaps.)
bool no_two_elements_share_memory(const at::Tensor& t) {
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of the dimensions of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dimensions so far
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * (size - 1) + extent;
  }
  return true;
}

void copy_result(const at::Tensor& dst, const at::Tensor& src) {
  const bool overlap = spans_overlap(dst, src);
  const size_t size = src.itemsize();
  const c10::ScalarType bits = size == 1   ? at::kByte
                               : size == 2 ? at::kShort
                               : size == 4 ? at::kInt
                               : size == 8 ? at::kLong
                                           : c10::ScalarType::Undefined;
  if (dst.scalar_type() == src.scalar_type() && bits != c10::ScalarType::Undefined && !src.is_complex() &&
      !src.is_conj() && !dst.is_conj() && !src.is_neg() && !dst.is_neg()) {
    const at::Tensor from = src.view(bits);
    dst.view(bits).copy_(overlap ? from.clone() : from);
    return;
  }
  dst.copy_(overlap ? src.clone() : src);
}

// ---- 4. the synchronous path ----
// Runs the op on the device and waits. Tensor results that alias an input
// become views; fresh ones are copied into new device tensors by a kernel,
// laid out as `meta` says where it has a result of the same shape (so that a
// call has the same strides whether it ran here or on the asynchronous path).
// Returns the dtypes and sizes of the tensors it returned, in order.
std::vector<ResultShape> run_synchronously(const c10::OperatorHandle& op, Stack* stack, Stack args, c10::Device device,
                                           const MetaResult* meta = nullptr, bool* alerted = nullptr) {
  const auto& schema = op.schema();
  {
    // Refused before anything is launched or seeded: the kernel was captured, then the wait for it
    // was refused with a message about synchronising a stream that named no operator. The wait is
    // still asked of the runtime first, which refuses it and so invalidates the capture, as any
    // refused call does (a caller that caught this error got a graph without the operator).
    const orStream_t stream = getCurrentOpenRegStream(device.index()).handle();
    int capturing = 0;
    OPENREG_CHECK(orStreamIsCapturing(stream, &capturing));
    if (capturing != 0) (void)orStreamSynchronize(stream);
    // The first call of a signature (the caller passes `alerted`) is cured by a warm-up; the other
    // callers' operators need the host at every call, and the warm-up advice sent users in circles.
    if (alerted != nullptr)
      TORCH_CHECK(capturing == 0, schema.name(),
                  ": this call runs synchronously (the first call of an operator signature checks its result "
                  "against the meta kernel) and cannot be captured into a graph: run the captured code once "
                  "before capture_begin(), as on CUDA");
    TORCH_CHECK(capturing == 0, schema.name(),
                ": this call needs the host at every call (its results' sizes depend on the data, or openreg "
                "runs the operator synchronously), so it cannot be captured into a graph, warmed up or not; "
                "CUDA refuses such operators (nonzero, masked_select, unique, ...) in a capture too");
  }
  struct State {
    Stack results;
    std::vector<bool> moved;  // per return: a mutated argument the CPU kernel reallocated
    // Written arguments the op does not return, which the CPU kernel resized or reallocated
    // (fused_moving_avg_obs_fake_quant grows its statistics): (argument index, host result).
    std::vector<std::pair<size_t, at::Tensor>> resized;
    // Written sparse arguments (in place or out=): the argument index, the CPU sparse tensor after
    // the kernel, and per member whether it is still the kernel view of the device member.
    struct SparseWritten {
      size_t index;
      at::Tensor result;
      std::vector<bool> same;
    };
    std::vector<SparseWritten> sparse_written;
    std::exception_ptr error;
    KeepDeterminismAlerts alerts;  // the kernel's warnings about nondeterminism (warn_only)
  };
  auto state = std::make_shared<State>();
  Stack kernel_args = args;
  std::vector<Draw> draws;
  seed_generators(schema, kernel_args.data(), device.index(), &draws);
  replace_devices(kernel_args, c10::Device(c10::kCPU));
  c10::SmallVector<LaunchBytes, 4> counted;  // sizes the kernel's thread team (OpenRegStream.h)
  for (const c10::IValue& v : args)
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.is_privateuseone()) {  // as KernelTensorArg does on the fast path; sparse and nested by member
        if (sparse::is_sparse(t))
          for (const at::Tensor& m : sparse::members(t)) ready_for_launch(m);
        else if (t.is_nested())
          ready_for_launch(nested::storage_as_tensor(t));
        else if (t.layout() == c10::kStrided)
          ready_for_launch(t);
      }
      if (t.layout() == c10::kStrided && !t.is_nested()) counted.emplace_back(t.nbytes());
    });
  auto stream = getCurrentOpenRegStream(device.index());
  OPENREG_CHECK(::openreg::launch(stream.handle(), schema.name().c_str(), [op, kernel_args, state]() mutable {
    c10::WarningUtils::WarningHandlerGuard keep_alerts(&state->alerts);
    // Below autograd, where the CPU's kernels run on the CPU too (its sparse kernels assert it).
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    try {
      const Stack originals = kernel_args;  // the device tensors, before the op
      KernelStorages storages;
      to_kernel_stack(kernel_args, storages);
      const Stack kernel_inputs = kernel_args;  // the same tensors: a resize inside the op shows in them
      op.redispatchBoxed(cpu_keys(kernel_inputs), &kernel_args);
      for (c10::IValue& r : kernel_args)
        r = map_tensors(r, [](const at::Tensor& t) { return nested::is_nested(t) ? nested::owning_metadata(t) : t; });
      const auto& schema = op.schema();
      std::vector<bool> returned(kernel_inputs.size(), false);  // written arguments a return aliases (`moved`)
      for (const auto& ret : schema.returns())
        if (is_written(ret) && aliased_argument(schema, ret) >= 0) returned[aliased_argument(schema, ret)] = true;
      for (size_t i = 0; i < kernel_inputs.size(); ++i) {
        if (!is_written(schema.arguments()[i]) || !kernel_inputs[i].isTensor()) continue;
        const at::Tensor& got = kernel_inputs[i].toTensor();
        if (sparse::is_sparse(got)) {  // returned or not, its members are carried back below
          const auto device_members = sparse::members(originals[i].toTensor());
          const auto host_members = sparse::members(got);
          std::vector<bool> same;
          for (size_t j = 0; j < host_members.size(); ++j) {
            const at::Tensor want = kernel_tensor(device_members[j]);
            const at::Tensor& m = host_members[j];
            same.push_back(m.data_ptr() == want.data_ptr() && m.sizes() == want.sizes() &&
                           m.strides() == want.strides());
          }
          state->sparse_written.push_back({i, got, std::move(same)});
          continue;
        }
        if (returned[i] || !got.defined()) continue;
        if (nested::is_nested(got)) continue;  // nested kernels write in place; none resizes its argument
        const at::Tensor want = kernel_tensor(originals[i].toTensor());
        if (got.data_ptr() != want.data_ptr() || got.sizes() != want.sizes() || got.strides() != want.strides())
          state->resized.emplace_back(i, got);
      }
      for (size_t i = 0; i < kernel_args.size(); ++i) {
        const auto& ret = schema.returns()[i];
        bool moved = false;
        if (is_written(ret)) {
          const at::Tensor& base = originals[aliased_argument(schema, ret)].toTensor();
          if (!sparse::is_sparse(base) && !nested::is_nested(base)) {  // a sparse one comes back below
            const at::Tensor want = kernel_tensor(base);
            if (kernel_args[i].toTensor().is_conj() != want.is_conj() ||
                kernel_args[i].toTensor().is_neg() != want.is_neg())  // an answer given as a bit (see land)
              kernel_args[i] = kernel_args[i].toTensor().resolve_conj().resolve_neg();
            const at::Tensor& got = kernel_args[i].toTensor();
            moved = got.data_ptr() != want.data_ptr() || got.sizes() != want.sizes() || got.strides() != want.strides();
          }
        } else if (is_view_return(ret)) {  // a "view" that is not one (of a list of views: any element)
          const at::Tensor& base = originals[aliased_argument(schema, ret)].toTensor();
          for_each_tensor(kernel_args[i], [&](const at::Tensor& got) {
            // A view of or as a sparse tensor comes back as a copy (the structure views are native).
            // A nested one stays a view if it shares the kernel view of its base's storage.
            if (got.defined())
              moved = moved || sparse::is_sparse(base) || sparse::is_sparse(got) ||
                      got.storage().data() != ::openreg::kernel_pointer(base.storage().data());
          });
        }
        state->moved.push_back(moved);
      }
      state->results = std::move(kernel_args);
    } catch (const std::exception&) {  // anything else is the worker's to report (and may be a thread exit)
      state->error = std::current_exception();
    }
  }));
  stream.synchronize();
  for (const c10::Warning& w : state->alerts.alerts) c10::warn(w);  // the host waited: it warns
  if (alerted != nullptr) *alerted = !state->alerts.alerts.empty();
  if (state->error) {
    give_back_draws(draws);
    std::rethrow_exception(state->error);
  }
  Stack& results = state->results;
  std::vector<ResultShape> shapes;
  for (const c10::IValue& r : results)
    for_each_tensor(r, [&](const at::Tensor& t) {
      if (t.defined()) shapes.emplace_back(t.scalar_type(), t.is_nested() ? std::vector<int64_t>{-1} : t.sizes().vec());
    });
  // (device output as it is now, host result): described at launch, because the host may
  // resize or free the output before the copy runs.
  std::vector<std::pair<KernelTensorArg, at::Tensor>> copies;
  auto launch_copies = [&](std::vector<std::pair<KernelTensorArg, at::Tensor>> batch) {
    if (!batch.empty())
      OPENREG_CHECK(::openreg::launch(stream.handle(), "openreg::copy_results", [batch = std::move(batch)] {
        for (const auto& [out, host] : batch) copy_result(out.materialize(), host);
      }));
  };
  // A new dense device tensor for a host result, filled by `fill`'s copy kernel.
  auto empty_for = [&](const at::Tensor& h, std::vector<std::pair<KernelTensorArg, at::Tensor>>& fill) {
    at::Tensor out = h.is_non_overlapping_and_dense()
                         ? at::empty_strided(h.sizes(), h.strides(), h.options().device(device))
                         : at::empty(h.sizes(), h.options().device(device));
    fill.emplace_back(KernelTensorArg(out), h);
    return out;
  };
  // The device members of a sparse host result, filled at once: making a sparse tensor of them
  // may check its invariants on the device (torch.sparse.check_sparse_tensor_invariants).
  auto members_on_device = [&](const std::vector<at::Tensor>& host, const std::vector<bool>& keep,
                               const std::vector<at::Tensor>& kept) {
    std::vector<std::pair<KernelTensorArg, at::Tensor>> fill;
    std::vector<at::Tensor> members;
    for (size_t j = 0; j < host.size(); ++j) members.push_back(keep[j] ? kept[j] : empty_for(host[j], fill));
    launch_copies(std::move(fill));
    return members;
  };
  // A new device tensor for a host result; a sparse one is made of new device members, a nested one
  // of a new device buffer.
  auto to_device = [&](const at::Tensor& host) {
    if (nested::is_nested(host)) return nested::assemble(host, empty_for(nested::storage_as_tensor(host), copies));
    if (!sparse::is_sparse(host)) return empty_for(host, copies);
    const auto members = sparse::members(host);
    return sparse::assemble(host, members_on_device(members, std::vector<bool>(members.size(), false), {}), device);
  };
  // The meta kernel's geometry for tensor j of return i, if it describes `host`.
  auto meta_geometry = [&](size_t i, size_t j, const at::Tensor& host) -> const Geometry* {
    if (meta == nullptr || meta->data_dependent || j >= meta->returns[i].size()) return nullptr;
    const Geometry& g = meta->returns[i][j];
    return g.defined && g.dtype == host.scalar_type() && host.sizes() == c10::IntArrayRef(g.sizes) ? &g : nullptr;
  };
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& ret = schema.returns()[i];
    if (is_view_return(ret) || is_written(ret)) {
      const at::Tensor& base = args[aliased_argument(schema, ret)].toTensor();
      if (is_view_return(ret) && !state->moved[i]) {
        if (nested::is_nested(base)) {  // views of a nested tensor: nested ones, or dense ones of its storage
          const at::Tensor storage = nested::storage_as_tensor(base);
          stack->push_back(map_tensors(results[i], [&](const at::Tensor& host) {
            return nested::is_nested(host) ? nested::view_of(base, host) : view_like(storage, host);
          }));
          continue;
        }
        // A nested view of a dense buffer (_nested_view_from_buffer): a nested tensor over its storage.
        // A list of views (`Tensor(a)[]`, a custom op's) maps each (it failed with "Expected Tensor").
        stack->push_back(map_tensors(results[i], [&](const at::Tensor& host) {
          return !host.defined()           ? host
                 : nested::is_nested(host) ? nested::assemble(host, base)
                                           : view_like(base, host);
        }));
        continue;
      }
      if (is_view_return(ret)) {  // a fresh result after all: copy it into a new device tensor
        stack->push_back(map_tensors(results[i], [&](const at::Tensor& h) { return h.defined() ? to_device(h) : h; }));
        continue;
      }
      if (state->moved[i]) {  // out= resized by the CPU kernel: give the device tensor its result
        const at::Tensor& host = results[i].toTensor();
        if (base.sizes() != host.sizes()) {
          const Geometry* g = meta_geometry(i, 0, host);
          resize_output_like(base, host.sizes(), g != nullptr ? c10::IntArrayRef(g->strides) : host.strides());
        }
        copies.emplace_back(KernelTensorArg(base), host);
      }
      stack->push_back(base);
      continue;
    }
    size_t j = 0;  // which tensor of return i
    stack->push_back(map_tensors(results[i], [&](const at::Tensor& host) {
      const size_t index = j++;
      if (!host.defined()) return host;
      check_not_quantized(host.scalar_type(), schema);
      if (sparse::is_sparse(host) || nested::is_nested(host)) return to_device(host);
      at::Tensor out;
      if (const Geometry* g = meta_geometry(i, index, host)) out = alloc_like(*g, schema);
      if (!out.defined() || !no_two_elements_share_memory(out))
        out = host.is_non_overlapping_and_dense()
                  ? at::empty_strided(host.sizes(), host.strides(), host.options().device(device))
                  : at::empty(host.sizes(), host.options().device(device));
      copies.emplace_back(KernelTensorArg(out), host);
      return out;
    }));
  }
  // A written sparse argument takes its new structure; members the kernel wrote in place stay.
  for (const auto& w : state->sparse_written) {
    const at::Tensor& base = args[w.index].toTensor();
    sparse::reassign(base, w.result, members_on_device(sparse::members(w.result), w.same, sparse::members(base)));
  }
  // A written argument the kernel resized takes the new size, and its values, on the device; the
  // extra shape makes the first call's check disagree with the meta kernel, so every later call of
  // the signature also runs here (the asynchronous path could not carry the resize back).
  for (const auto& [index, host] : state->resized) {
    const at::Tensor& base = args[index].toTensor();
    if (base.sizes() != host.sizes()) resize_output_like(base, host.sizes(), host.strides());
    copies.emplace_back(KernelTensorArg(base), host);
    shapes.emplace_back(host.scalar_type(), host.sizes().vec());
  }
  launch_copies(std::move(copies));
  return shapes;
}

// What the meta kernel says the first call's results are. The dtypes count too: a meta kernel that
// describes another device's dtypes (the batch norms' saved statistics in float16 training are
// float32 on CUDA, float16 on the CPU) made later calls return what the CPU's backward refuses.
std::vector<ResultShape> shapes_of(const MetaResult& meta) {
  std::vector<ResultShape> shapes;
  for (const auto& geometries : meta.returns)
    for (const Geometry& g : geometries)
      if (g.defined) shapes.emplace_back(g.dtype, g.sizes);
  return shapes;
}

// The first call's verdict (see MetaResult::Check) from the CPU kernel's results `got`. Where only
// the dtypes of fresh results differ, *dtypes receives the CPU's, one per defined result; a view or
// a written argument in another dtype than the meta kernel's is a disagreement.
MetaResult::Check compare_with_meta(const c10::FunctionSchema& schema, const MetaResult& meta,
                                    const std::vector<ResultShape>& got, std::vector<c10::ScalarType>* dtypes) {
  using Check = MetaResult::Check;
  const std::vector<ResultShape> want = shapes_of(meta);
  if (got == want) return Check::agrees;
  if (got.size() != want.size()) return Check::disagrees;
  size_t k = 0;
  for (size_t i = 0; i < meta.returns.size(); ++i) {
    const auto& ret = schema.returns()[i];
    const bool fresh = !is_view_return(ret) && !is_written(ret);
    for (const Geometry& g : meta.returns[i]) {
      if (!g.defined) continue;
      if (got[k].second != want[k].second || (!fresh && got[k].first != want[k].first)) return Check::disagrees;
      dtypes->push_back(got[k].first);
      ++k;
    }
  }
  return Check::agrees_in_cpu_dtypes;
}

// Device side: makes a result land in its device output. A CPU kernel may
// have written elsewhere (a functional op allocates its result; an out=
// kernel may reallocate its output): then the result is copied over, on
// the device. Returns false if the shapes disagree.
// A kernel may also answer with a conjugate or negative view instead of values (ATen's
// linalg_lu_solve with left=False flips its output's conj bit): the bit stays on the CPU side, so the
// values are resolved into the device output (they were the conjugate of the answer).
bool land(const at::Tensor& got, const at::Tensor& want) {
  if (!want.defined()) return true;  // an output the call did not ask for (output_mask): nothing to land
  const bool same_bits = got.is_conj() == want.is_conj() && got.is_neg() == want.is_neg();
  if (got.data_ptr() == want.data_ptr() && got.sizes() == want.sizes() && got.strides() == want.strides() && same_bits)
    return true;
  // A result in another dtype than the meta kernel's was cast silently (a wrong shape failed).
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  copy_result(want, same_bits ? got : got.resolve_conj().resolve_neg());
  return true;
}

bool land_all(const Stack& returns, const Stack& targets) {
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].isTensor()) {
      if (!land(returns[i].toTensor(), targets[i].toTensor())) return false;
    } else if (targets[i].isTensorList()) {
      auto outs = targets[i].toTensorList();
      auto got = returns[i].toTensorList();
      if (got.size() != outs.size()) return false;
      for (size_t j = 0; j < outs.size(); ++j)
        if (!land(got.get(j), outs.get(j))) return false;
    }
  }
  return true;
}

// Device side: runs one launch. `args` holds the launch-time arguments,
// `targets` the device outputs per return (None for views). A functional op
// allocates its results on the CPU side; they are copied into the outputs
// (one device-side copy). In-place and out= ops write device memory
// directly, unless their CPU kernel reallocated an output. A routed structured
// op runs its out= overload, whose outputs are its last arguments.
void run_kernel(const Launch& l) {
  const c10::OperatorHandle& op = *l.op;
  Stack args = l.args.materialize();
  bool landed = true;
  if (l.outs > 0) {
    // The out= kernel writes its outputs in place unless it resizes or restrides one (it
    // then writes host memory): compare with the outputs' memory and geometry as launched.
    c10::SmallVector<const void*, 2> launched;
    for (size_t i = args.size() - l.outs; i < args.size(); ++i) launched.push_back(args[i].toTensor().data_ptr());
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &args);
    landed = args.size() == l.outs;
    const size_t first_out = l.args.tensors.size() - l.outs;  // the outputs are the last kernel tensors
    for (size_t i = 0; landed && i < l.outs; ++i) {
      const at::Tensor& got = args[i].toTensor();
      const KernelTensorArg& out = l.args.tensors[first_out + i].second;
      if (got.data_ptr() == launched[i] && got.sizes() == c10::IntArrayRef(out.sizes) &&
          got.strides() == c10::IntArrayRef(out.strides) && got.is_conj() == out.conj && got.is_neg() == out.neg)
        continue;
      landed = land(got, out.materialize());
    }
  } else {
    // Fresh views of the device outputs that the CPU kernel never sees.
    const Stack targets = l.targets.materialize();
    // An argument the kernel writes in place must keep its memory and size: a CPU kernel that
    // resizes one (fused_moving_avg_obs_fake_quant grows its per-channel statistics) writes host
    // memory, and the device argument would silently keep its old size and values.
    struct Written {
      at::Tensor tensor;
      const void* data;
      c10::SmallVector<int64_t, 4> sizes;
      size_t index;
    };
    c10::SmallVector<Written, 2> written;
    if (l.writes_argument) {
      const auto& arguments = op.schema().arguments();
      for (size_t i = 0; i < args.size() && i < arguments.size(); ++i)
        if (is_written(arguments[i]) && args[i].isTensor() && args[i].toTensor().defined()) {
          const at::Tensor& t = args[i].toTensor();
          written.push_back({t, t.data_ptr(), c10::SmallVector<int64_t, 4>(t.sizes().begin(), t.sizes().end()), i});
        }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &args);
    for (const Written& w : written)
      TORCH_CHECK(w.tensor.data_ptr() == w.data && w.tensor.sizes() == c10::IntArrayRef(w.sizes), "the CPU kernel of ",
                  op.schema().operator_name(), " resized its argument '", op.schema().arguments()[w.index].name(),
                  "' in place (from ", c10::IntArrayRef(w.sizes), " to ", w.tensor.sizes(),
                  "), which openreg's generic path cannot carry back to the device: pass it at its final size");
    landed = land_all(args, targets);
  }
  TORCH_CHECK(landed, "the CPU kernel of ", op.schema().operator_name(),
              " produced results whose shapes or dtypes differ from its meta kernel's");
}

orStatus Launch::run(void* p) {
  try {
    run_kernel(*static_cast<Launch*>(p));
    return orSuccess;
  } catch (const std::exception& e) {
    return orKernelFail(e.what());
  }  // anything else reaches the stream's worker, which reports it (or lets a thread exit unwind)
}

// Advanced indexing takes index tensors from the CPU or the indexed tensor's device and moves them
// there (ATen's AdvancedIndex does, on CUDA too): `indices` arguments. Any other device is refused as
// ATen refuses it (check_indices_on_cpu_or_selfdevice): an IndexError that names the indexed tensor's.
bool is_index_list(const c10::Argument& a) {
  return a.name() == "indices" && a.type()->kind() == c10::TypeKind::ListType;
}

// On the error path only (the hot path looks at no argument names).
[[noreturn]] void refuse_index_device(const c10::Device& self) {
  TORCH_CHECK_INDEX(false, "indices should be either on cpu or on the same device as the indexed tensor (", self, ")");
}

bool has_index_list(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments())
    if (is_index_list(a)) return true;
  return false;
}

// A nested tensor's sizes, strides and offsets are CPU tensors on every device, as arguments too.
bool is_nested_metadata(const c10::FunctionSchema& schema, size_t i) {
  const std::string& n = schema.name();
  return i > 0 && (n == "aten::_nested_from_padded" || n == "aten::_nested_view_from_buffer" ||
                   n == "aten::_nested_view_from_buffer_copy");
}

// The device of an op call: every openreg tensor must be on the same one, and any
// other tensor may only be a CPU scalar (0-dim) that the op reads, as on CUDA. A call that reached
// openreg only through its generator (torch.randn(3, generator=openreg_generator))
// is a CPU call with the wrong generator.
c10::Device common_device(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device, other, named;  // named: an openreg Device argument
  bool openreg_generator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const bool written = is_written(schema.arguments()[i]);
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (!t.is_privateuseone()) {
        if (!other && (!t.is_cpu() || t.dim() > 0 || written) && !is_index_list(schema.arguments()[i]) &&
            !is_nested_metadata(schema, i))
          other = t.device();
        return;
      }
      if (!device) device = t.device();
      if (*device != t.device() && i > 0 && is_index_list(schema.arguments()[i])) refuse_index_device(*device);
      check_same_device(*device, t.device(), schema.operator_name());
    });
    if (v.isDevice() && v.toDevice().is_privateuseone() && !named) named = v.toDevice();
    if (v.isGenerator() && v.toGenerator().device().is_privateuseone()) openreg_generator = true;
  }
  TORCH_CHECK(device || !openreg_generator, "Expected a 'cpu' device type for generator but found 'openreg' (in ",
              schema.operator_name(), ")");
  if (device && other) {
    // A host tensor indexed by openreg indices: ATen's refusal, naming the indexed tensor's device.
    if (!args.empty() && args[0].isTensor() && args[0].toTensor().device() == *other && has_index_list(schema))
      refuse_index_device(*other);
    check_same_device(*device, *other, schema.operator_name());
  }
  // The call runs on its tensors' device and its results land there (the kernel's Device arguments
  // are the CPU): a Device argument naming another openreg device (a custom op's `.to(dev)`, whose
  // fake kernel says `dev`) gave a result on the tensors' device (hunt35c).
  if (device && named && named->has_index())
    TORCH_CHECK_NOT_IMPLEMENTED(named->index() == device->index(), "'", schema.operator_name(), "' names device ",
                                *named, " and its tensors are on ", *device,
                                ": openreg's generic path runs an operator on its tensors' device and returns its "
                                "results there; register an openreg kernel for it (e.g. torch.library.custom_op "
                                "with device_types=\"openreg\") to return a tensor on another device");
  if (!device) device = named;
  if (!device) device = c10::Device(c10::DeviceType::PrivateUse1);
  if (!device->has_index())
    device = c10::Device(c10::DeviceType::PrivateUse1, getCurrentOpenRegStream().device_index());
  return *device;
}

// fill_, masked_fill_, index_fill_ and index_put_ take a 0-dim value tensor from any device
// (device_check: NoCheck; CUDA's kernels read it with item() or move it), and a CPU one worked here
// already: a 0-dim value on another openreg device moves to self's, ordered by the copy's events.
void move_value(c10::IValue* args, int value) {
  if (!args[0].isTensor() || !args[value].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& v = args[value].toTensor();
  if (self.defined() && v.defined() && self.is_privateuseone() && v.is_privateuseone() && v.dim() == 0 &&
      v.device() != self.device())
    args[value] = v.to(self.device());
}

// bernoulli's tensor p may be on any device (device_check: NoCheck): the CPU's and CUDA's kernels
// move it to self's device first. It was refused as a tensor on another device (hunt36c).
void move_probabilities(c10::IValue* args, int p) {
  if (!args[0].isTensor() || !args[p].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& probabilities = args[p].toTensor();
  if (self.defined() && probabilities.defined() && self.is_privateuseone() && probabilities.device() != self.device())
    args[p] = probabilities.to(self.device());
}

// Copies the host tensors of `indices` arguments to `device` (see is_index_list).
void move_indices_to(const c10::FunctionSchema& schema, c10::IValue* args, size_t n, c10::Device device) {
  for (size_t i = 0; i < n; ++i) {
    if (!args[i].isList() || !is_index_list(schema.arguments()[i])) continue;
    bool on_host = false;
    for_each_tensor(args[i], [&](const at::Tensor& t) { on_host |= t.defined() && !t.is_privateuseone(); });
    if (on_host)
      args[i] = map_tensors(
          args[i], [&](const at::Tensor& t) { return !t.defined() || t.is_privateuseone() ? t : t.to(device); });
  }
}

// ---- structured ops, straight to the generic path ----
// Without a kernel of its own, a structured op (add, mul, addmm, ...) runs on a
// backend through its CompositeExplicitAutogradNonFunctional wrapper: the op's
// meta function on the host (a whole TensorIterator for elementwise ops), an
// empty output, then the out= overload, which reaches the generic path and its
// meta cache anyway. route_structured_ops() registers the generic path itself
// for the functional and in-place overloads of those ops: their metadata then
// comes from the cache, and the device kernel of a functional one runs its out=
// overload into the device outputs (no extra copy). The table maps each routed
// functional overload to that out= overload.
std::unordered_map<const c10::FunctionSchema*, c10::OperatorHandle>& out_overloads() {
  static auto* table = new std::unordered_map<const c10::FunctionSchema*, c10::OperatorHandle>();
  return *table;  // filled once, before any op is routed; read-only afterwards
}

const c10::OperatorHandle* out_overload(const c10::OperatorHandle& op) {
  auto& table = out_overloads();
  auto it = table.find(&op.schema());
  return it == table.end() ? nullptr : &it->second;
}

// The last `n` values of `stack`, taken off it.
Stack take_arguments(Stack* stack, size_t n) {
  Stack args(std::make_move_iterator(stack->end() - n), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n, stack->end());
  return args;
}

// Whether an argument the op writes (in place, or out=) partly overlaps another
// tensor argument (a[1:] += a[:-1]). Whether that is allowed is the CPU kernel's
// decision, and its error belongs to the call, as on the CPU and CUDA: such calls
// run synchronously. Exactly the same memory and geometry (x.mul_(x),
// torch.add(x, y, out=x)) stays asynchronous: elementwise kernels allow it, and a
// kernel that does not (index_select into its own input) fails on the device, which
// the next synchronising call reports.
bool written_memory_overlaps(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  c10::SmallVector<std::pair<const void*, c10::TensorImpl*>, 4> written;  // by storage address
  bool self_overlap = false;  // a written tensor whose elements share memory (expanded): the CPU refuses most
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_written(schema.arguments()[i]))
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        if (t.defined() && t.has_storage() && t.storage().data() != nullptr) {
          written.emplace_back(t.storage().data(), t.unsafeGetTensorImpl());
          self_overlap |= at::has_internal_overlap(t) == at::MemOverlap::Yes;
        }
      });
  }
  if (self_overlap) return true;  // the synchronous path: the CPU's verdict at the call
  if (written.empty()) return false;
  std::sort(written.begin(), written.end());
  bool overlaps = false;
  for (size_t i = 0; i < args.size() && !overlaps; ++i) {
    if (is_written(schema.arguments()[i])) continue;
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (overlaps || !t.defined() || !t.has_storage()) return;
      const auto same_storage =
          std::equal_range(written.begin(), written.end(), std::make_pair(t.storage().data(), nullptr),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto it = same_storage.first; it != same_storage.second && !overlaps; ++it) {
        const auto status = at::get_overlap_status(it->second, t.unsafeGetTensorImpl());
        overlaps = status == at::MemOverlapStatus::Partial || status == at::MemOverlapStatus::TooHard;
      }
    });
  }
  return overlaps;
}

// Whether an out= argument that must be resized shares memory with one of the call's inputs.
// Itself (torch.logical_and(a, b, out=a) with b broadcasting a, as logical_and_ calls it): whether
// the CPU kernel resizes it or refuses depends on the two being one tensor, which only the
// synchronous path shows the kernel (to_kernel_stack); the meta kernel saw two tensors and resized.
// A view of it (torch.eq(x, a.t(), out=a)): the CPU checks the overlap before it resizes, and the
// asynchronous path resized first, so the kernel refused an overlap the CPU allows.
// An in-place operator's self (any written argument that is not a keyword-only out=) is an input
// too: the CPU and CUDA refuse to resize it ("output with shape [10, 1, 5] doesn't match the
// broadcast shape [10, 10, 5]"), and a meta kernel that does not check it (floor_divide_'s) had
// the asynchronous path resize self once the signature was verified with a matching shape.
bool resizes_an_input(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, const MetaResult& meta) {
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    const auto& ret = schema.returns()[i];
    const int a = is_written(ret) && !meta.is_list[i] ? aliased_argument(schema, ret) : -1;
    if (a < 0 || !args[a].isTensor()) continue;
    const at::Tensor& out = args[a].toTensor();
    if (out.sizes() == c10::IntArrayRef(meta.returns[i][0].sizes)) continue;
    if (!schema.arguments()[a].kwarg_only()) return true;  // in place: the CPU kernel's verdict
    bool input = false;
    for (size_t j = 0; j < args.size(); ++j)
      if (static_cast<int>(j) != a)
        for_each_tensor(args[j], [&](const at::Tensor& t) {
          input |= t.defined() && t.has_storage() && out.has_storage() && t.storage().is_alias_of(out.storage());
        });
    if (input) return true;
  }
  return false;
}

// fill_, masked_fill_ and index_fill_ convert their `value` to self's dtype in the CPU kernel,
// which refuses one out of range ("value cannot be converted to type uint8_t without overflow"),
// even when nothing is filled. Checked here, on the host, so that the error comes at the call as
// on the CPU and CUDA, not at a later synchronising call.
void check_fill_value(const c10::IValue& value, const c10::IValue& self) {
  if (!value.isScalar() || !self.isTensor() || !self.toTensor().defined()) return;
  const c10::Scalar s = value.toScalar();
  try {
    AT_DISPATCH_V2(self.toTensor().scalar_type(), "fill", AT_WRAP([&] { (void)s.to<scalar_t>(); }),
                   AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), c10::kBool, c10::kHalf, c10::kBFloat16, c10::kComplexHalf,
                   AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
  } catch (const c10::NotImplementedError&) {  // a dtype the CPU kernel refuses by itself
  }
}

// random_'s range, bernoulli_'s probability and multinomial's sample count are checked by the CPU
// kernel against the values of scalar arguments, which the meta kernels do not look at, and the
// signature cache does not key on: after one good call of a signature a bad one went to the
// device, and its error surfaced at some later synchronising call. The CPU op run on an empty
// CPU tensor of the same dtype (and last dim, which multinomial reads) makes the same checks at the
// call, for a few microseconds, and touches no generator.
// multinomial (`rank_checked`) refuses a 0-dim input by its rank, before it draws: the probe keeps
// that rank (an empty 1-D probe was refused by its size, with another message). random_ and
// bernoulli_ would fill a 0-dim probe, drawing from the CPU generator.
void probe_value_checks(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool rank_checked) {
  Stack probe;
  probe.reserve(args.size());
  for (const c10::IValue& a : args) {
    if (a.isTensor() && a.toTensor().defined()) {
      const at::Tensor& t = a.toTensor();
      c10::SmallVector<int64_t, 2> shape;
      if (t.dim() >= 1 || !rank_checked) shape.push_back(0);
      if (t.dim() >= 1) shape.push_back(t.size(-1));
      probe.emplace_back(at::empty(shape, t.options().device(c10::kCPU)));
    } else if (a.isGenerator()) {
      probe.emplace_back();  // the device's generator: the CPU kernel would refuse it, and draws nothing
    } else {
      probe.push_back(a);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &probe);
}

// index_put_ with a single mask (after Nones) and a one-element value, not accumulating: a masked fill,
// whose only check is the mask's shape (ATen's words).
bool one_mask_fills(const at::Tensor& self, c10::ArrayRef<c10::IValue> indices, const at::Tensor& values,
                    bool accumulate) {
  if (accumulate || values.numel() != 1) return false;
  int64_t position = -1;
  at::Tensor mask;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i].isNone() || !indices[i].toTensor().defined()) continue;
    if (mask.defined()) return false;  // a second index
    mask = indices[i].toTensor();
    position = static_cast<int64_t>(i);
  }
  if (!mask.defined() || (mask.scalar_type() != at::kBool && mask.scalar_type() != at::kByte) ||
      mask.layout() != c10::kStrided || position + mask.dim() > self.dim())
    return false;
  for (int64_t d = 0; d < mask.dim(); ++d)
    TORCH_CHECK_INDEX(mask.size(d) == self.size(position + d), "The shape of the mask ", mask.sizes(), " at index ", d,
                      " does not match the shape of the indexed tensor ", self.sizes(), " at index ", position + d);
  return true;
}

// index_put_ (x[idx] = v) checks the shapes of its indices and values on the host on the CPU and on
// CUDA; its meta kernel checks none, so once a signature was verified a bad call went to the device
// and failed a later, unrelated call. ATen's own meta function of indexing (at::meta::index, on meta
// tensors) checks the indices (IndexError: indexing tensors that do not broadcast, indices of a bad
// dtype) and gives the indexed shape, to which the values must broadcast. A boolean mask's indexed
// shape depends on its values: such a call takes the synchronous path (true), as CUDA synchronises for
// the mask's nonzero(), except with one mask and one value without accumulation (x[x < 0] = 0), which
// ATen turns into masked_fill_ on every device: only the mask's shape is checked, and it stays
// asynchronous (and capturable): one_mask_fills, above.
bool index_put_needs_the_host(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !args[1].isList() || !args[2].isTensor()) return false;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& values = args[2].toTensor();
  if (!self.defined() || !values.defined() || self.layout() != c10::kStrided || self.is_nested()) return false;
  auto meta = [](const at::Tensor& t) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  if (one_mask_fills(self, args[1].toListRef(), values, args.size() > 3 && args[3].isBool() && args[3].toBool()))
    return false;
  c10::List<std::optional<at::Tensor>> indices;
  for (const c10::IValue& v : args[1].toListRef()) {
    if (v.isNone() || !v.toTensor().defined()) {
      indices.push_back(std::nullopt);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    if (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte || t.layout() != c10::kStrided) return true;
    indices.push_back(meta(t));
  }
  const at::Tensor indexed = at::meta::index(meta(self), indices);
  TORCH_CHECK(at::is_expandable_to(values.sizes(), indexed.sizes()), "shape mismatch: value tensor of shape ",
              values.sizes(), " cannot be broadcast to indexing result of shape ", indexed.sizes());
  return false;
}

// put_ checks its counts on the host on the CPU and on CUDA (its meta kernel does not).
void check_put(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[1].isTensor() || !args[2].isTensor()) return;
  const at::Tensor &index = args[1].toTensor(), &source = args[2].toTensor();
  if (!index.defined() || !source.defined()) return;
  TORCH_CHECK_INDEX(source.numel() == index.numel(),
                    "put_(): Expected source and index to have the same number of elements, but got source.numel() = ",
                    source.numel(), ", index.numel() = ", index.numel());
}

// randperm's n against the result's dtype (a uint8 result holds 0..255, a half one counts exactly to
// 2049): ATen's check, made by the CPU kernel and by CUDA's host code at the call, on an empty CPU
// tensor of the dtype. The signature cache does not key on n: after one good call the kernel failed
// on the device, at a later synchronising call.
void check_randperm(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isInt()) return;
  c10::ScalarType dtype = c10::kLong;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    if (name == "out" && args[i].isTensor())
      dtype = args[i].toTensor().scalar_type();
    else if (name == "dtype" && args[i].isInt())
      dtype = static_cast<c10::ScalarType>(args[i].toInt());
  }
  at::native::check_supported_max_int_with_precision(args[0].toInt(), at::empty({0}, at::TensorOptions().dtype(dtype)));
}

// normal with a tensor std: its values must be >= 0. CUDA's host code checks them at the call
// (ATen's CHECK_NORMAL_TENSOR_STD: a reduction on the device and a synchronisation), and so does
// this; the CPU kernel's check ran on the device, and its error surfaced at a later call.
void check_normal_std(const c10::IValue& std) {
  if (!std.isTensor() || !std.toTensor().defined()) return;
  const at::Tensor& t = std.toTensor();
  if (t.is_complex() || t.numel() == 0 || !t.is_privateuseone())
    return;  // the kernel's own refusal, or nothing to check
  TORCH_CHECK(t.min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
}

// multinomial without replacement, or of one sample, checks the probabilities' values on the host at
// the call, on the CPU and on CUDA (ATen's multinomial: a reduction and a synchronisation); with
// replacement and more samples the kernel checks them (a device-side assertion on CUDA). The first
// case, as ATen does it; its errors surfaced at a later synchronising call.
void check_multinomial_values(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !args[1].isInt() || !args[2].isBool()) return;
  const at::Tensor& self = args[0].toTensor();
  if (!self.defined() || !self.is_privateuseone() || self.numel() == 0 || (self.dim() != 1 && self.dim() != 2) ||
      !self.is_floating_point() || (args[2].toBool() && args[1].toInt() != 1))
    return;  // the CPU kernel's own checks, at the call (the probe), or the kernel's
  TORCH_CHECK(((self.max() < INFINITY) & (self.min() >= 0)).item<bool>(),
              "probability tensor contains either `inf`, `nan` or element < 0");
  const bool zero = self.dim() == 1 ? (self.sum() == 0).item<bool>() : (self.sum(1) == 0).sum().item<int64_t>() > 0;
  TORCH_CHECK(!zero, "invalid multinomial distribution (sum of probabilities <= 0)");
}

void check_not_strict(const c10::FunctionSchema& schema) {
  TORCH_CHECK(!g_strict.load(std::memory_order_relaxed), "openreg strict mode: '", schema.operator_name(),
              "' has no native openreg kernel (torch.openreg.set_strict_mode(False) allows the generic path)");
}

// ---- 5. ops that return an object ----
// An object a CPU kernel returns (the packed weight of quantized::linear_prepack_fp16) may keep its
// tensor arguments, and a kernel view of device memory is valid only while its kernel runs: the
// fp16-packed weight's bias was read from freed memory afterwards, and its linear gave garbage.
// Such ops run as the CPU op, over host copies of their arguments: the object holds host memory,
// as a weight a CPU engine packed does, and tensor results come back to the device.
void run_on_host_copies(const c10::OperatorHandle& op, Stack* stack, Stack args, c10::Device device) {
  const auto& schema = op.schema();
  for (const auto& a : schema.arguments())
    TORCH_CHECK(!is_written(a), schema.name(), " has no openreg kernel, and openreg cannot run it on host copies: it ",
                "returns an object and writes its argument '", a.name(), "'");
  for (c10::IValue& a : args)
    a = map_tensors(a, [](const at::Tensor& t) { return t.defined() && t.is_privateuseone() ? t.cpu() : t; });
  replace_devices(args, c10::Device(c10::kCPU));
  op.callBoxed(args);
  for (const c10::IValue& r : args)
    stack->push_back(map_tensors(r, [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; }));
}

// ZeroTensors (forward AD's stand-ins for missing tangents: no storage, see OpenRegNativeOps.cpp)
// come here only through the operators torch's ZeroTensor fallback lets through to the backend (dot,
// vdot, views), whose CPU and CUDA kernels test for them; a kernel view of one read host memory that
// was never written. dot and vdot answer a ZeroTensor, as there; elsewhere it becomes real zeros.
// Returns true when the call is answered.
bool answer_zero_tensors(const c10::OperatorHandle& op, Stack* stack, size_t num_args) {
  c10::IValue* const first = stack->data() + stack->size() - num_args;
  bool any = false;
  for (size_t i = 0; i < num_args && !any; ++i) any = first[i].isTensor() && first[i].toTensor()._is_zerotensor();
  if (!any) return false;
  const auto& name = op.schema().operator_name().name;
  if ((name == "aten::dot" || name == "aten::vdot") && op.schema().overload_name().empty()) {
    const at::Tensor &a = first[0].toTensor(), &b = first[1].toTensor();  // ATen's dot_check, in its words
    TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
                a.scalar_type(), " and ", b.scalar_type());
    TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [",
                b.numel(), "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(),
                " elements respectively");
    const at::Tensor answer = at::_efficientzerotensor({}, a.options());
    torch::jit::drop(*stack, num_args);
    stack->emplace_back(answer);
    return true;
  }
  for (size_t i = 0; i < num_args; ++i)
    if (first[i].isTensor() && first[i].toTensor()._is_zerotensor()) {
      const at::Tensor& z = first[i].toTensor();
      first[i] = at::zeros(z.sizes(), z.options());
    }
  return false;
}

// A custom operator's written arguments: an inference tensor among them is refused at once, before
// anything runs, with the error the CPU kernel's in-place op gives (a torch.library.custom_op's
// ADInplaceOrView kernel does not refuse it either); with `bump`, their versions are bumped once the
// call returns without an error (a refused call changes nothing, as on the CPU).
class BumpWrittenVersions {
 public:
  BumpWrittenVersions(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, bool bump) {
    for (size_t i = 0; i < args.size(); ++i)
      if (is_written(schema.arguments()[i]))
        for_each_tensor(args[i], [&](const at::Tensor& t) {
          if (!t.defined()) return;
          TORCH_CHECK(!t.is_inference() || c10::InferenceMode::is_enabled(),
                      "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a "
                      "clone to get a normal tensor before doing inplace update.See "
                      "https://github.com/pytorch/rfcs/pull/17 for more details.");
          if (bump) written_.push_back(t);
        });
  }
  ~BumpWrittenVersions() {
    if (std::uncaught_exceptions() > exceptions_) return;
    for (const at::Tensor& t : written_) t.unsafeGetTensorImpl()->bump_version();  // checked above: no throw
  }

 private:
  c10::SmallVector<at::Tensor, 2> written_;
  const int exceptions_ = std::uncaught_exceptions();
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack) {
  const auto& schema = op.schema();
  check_not_strict(schema);
  // An inherited tensor in a forked child: the runtime's refusal before the locks below (a parent
  // thread may have held them at the fork), not at the launch after them.
  check_not_forked_child();
  if (answer_zero_tensors(op, stack, schema.arguments().size())) return;
  // A copy: the kernels below may remove operators (a meta kernel that defines and destroys a
  // library), after which facts_of drops the map this would refer to.
  const OpFacts facts = facts_of(op);
  facts.calls->fetch_add(1, std::memory_order_relaxed);
  if (facts.unplaceable) TORCH_CHECK_NOT_IMPLEMENTED(false, *unplaceable_alias(schema));
  // The dispatcher's own error described the inner CPU redispatch ("from the 'CPU' backend ...
  // available for: [..., PrivateUse1, ...]") to a caller who passed openreg tensors.
  // (Asked at each call: a CPU kernel may be registered after a refused call.)
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), "'", schema.operator_name(),
                              "' has no openreg kernel, and no CPU kernel for openreg's generic path to run on the "
                              "device: register a kernel for it on 'openreg' (e.g. torch.library.custom_op with "
                              "device_types=\"openreg\") or on the CPU");
  // The arguments stay on the stack until the launch takes them.
  const size_t num_args = schema.arguments().size();
  c10::IValue* const first = stack->data() + stack->size() - num_args;
  const c10::ArrayRef<c10::IValue> args(first, num_args);

  if (facts.value_tensor >= 0) move_value(first, facts.value_tensor);
  if (facts.probabilities >= 0) move_probabilities(first, facts.probabilities);
  const c10::Device device = common_device(schema, args);
  c10::DeviceGuard guard(device);
  move_indices_to(schema, first, num_args, device);
  // What a custom operator's CPU kernel does to the real tensors when it writes them with in-place
  // ops (ADInplaceOrView kernels do it for torch.library.custom_op's): its write through a kernel view
  // counted nothing, so autograd used a saved tensor it had overwritten, and an inference tensor was
  // written outside inference mode (hunt35c). Counted once the call returns, the latter refused first.
  std::optional<BumpWrittenVersions> bump;
  if (facts.custom_writes) bump.emplace(schema, args, facts.bumps_versions);
  if (facts.returns_object) {
    run_on_host_copies(op, stack, take_arguments(stack, num_args), device);
    return;
  }
  if (facts.fill_value >= 0) check_fill_value(args[facts.fill_value], args[0]);
  if (facts.value_probe) probe_value_checks(op, args, facts.multinomial);
  if (facts.randperm) check_randperm(schema, args);
  if (facts.std_tensor >= 0) check_normal_std(args[facts.std_tensor]);
  if (facts.multinomial) check_multinomial_values(args);
  if (facts.put) check_put(args);
  if (facts.index_put && index_put_needs_the_host(args)) {
    run_synchronously(op, stack, take_arguments(stack, num_args), device);
    return;
  }

  // 1. Output metadata from the meta kernels (cached).
  const auto meta = meta_for(op, args, facts.tensor_returns_only);
  using Check = MetaResult::Check;
  const Check check = meta->verdict->check.load(std::memory_order_acquire);
  if (meta->data_dependent || check == Check::disagrees ||
      (facts.writes_argument && (written_memory_overlaps(schema, args) || resizes_an_input(schema, args, *meta)))) {
    run_synchronously(op, stack, take_arguments(stack, num_args), device);
    return;
  }
  if (check == Check::unverified) {
    bool alerted = false;
    const std::vector<ResultShape> got =
        run_synchronously(op, stack, take_arguments(stack, num_args), device, meta.get(), &alerted);
    // A kernel that warned about its nondeterminism (warn_only) stays on the synchronous path, where
    // the host issues the warning at every call, as the CPU does; the asynchronous path would drop it.
    std::vector<c10::ScalarType> dtypes;
    const Check verdict = alerted ? Check::disagrees : compare_with_meta(schema, *meta, got, &dtypes);
    meta->verdict->decide(verdict, std::move(dtypes));
    return;
  }

  // 2. Outputs on the device.
  Stack outputs;
  outputs.reserve(schema.returns().size());
  // Fresh results in the CPU kernel's dtypes where the meta kernel's differ (see Check).
  const std::vector<c10::ScalarType>* cpu_dtypes =
      check == Check::agrees_in_cpu_dtypes ? &meta->verdict->dtypes : nullptr;
  size_t result_index = 0;  // of the defined results, as shapes_of counts them
  auto fresh = [&](const Geometry& g) {
    if (!g.defined) return at::Tensor();
    const size_t k = result_index++;
    at::Tensor out;
    if (cpu_dtypes == nullptr || (*cpu_dtypes)[k] == g.dtype) {
      out = alloc_like(g, schema);  // (no copy of the geometry on the hot path)
    } else {
      Geometry in_cpu_dtype = g;
      in_cpu_dtype.dtype = (*cpu_dtypes)[k];
      out = alloc_like(in_cpu_dtype, schema);
    }
    // A fake kernel may describe an overlapping layout (an expand()ed result); the kernel could not
    // write it. Such a result is allocated contiguous (a layout with gaps stays as described).
    return no_two_elements_share_memory(out) ? out : at::empty(out.sizes(), out.options());
  };
  c10::SmallVector<bool, 4> true_view;  // per return: aliases its input, needs no kernel
  bool needs_kernel = facts.mutates;    // foreach ops, fused optimizers, AMP's unscale: no returns to compute
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    const auto& ret = schema.returns()[i];
    const auto& geometries = meta->returns[i];
    bool aliases = true;
    for (const Geometry& g : geometries) aliases &= g.aliases;
    true_view.push_back(is_view_return(ret) && aliases);
    if (cpu_dtypes != nullptr && (true_view.back() || is_written(ret)))
      for (const Geometry& g : geometries) result_index += g.defined ? 1 : 0;  // not fresh: same dtype
    if (true_view.back()) {
      const at::Tensor& base = args[aliased_argument(schema, ret)].toTensor();
      if (!meta->is_list[i]) {
        outputs.push_back(view_like(base, geometries[0]));
      } else {  // a list of views (split, unbind, ...)
        c10::List<at::Tensor> views;
        for (const Geometry& g : geometries) views.push_back(view_like(base, g));
        outputs.push_back(views);
      }
    } else if (is_written(ret)) {
      needs_kernel = true;
      const at::Tensor& target = args[aliased_argument(schema, ret)].toTensor();
      if (target.sizes() != c10::IntArrayRef(geometries[0].sizes))  // out= resized: as the meta kernel laid it out
        resize_output_like(target, geometries[0].sizes, geometries[0].strides);
      outputs.push_back(target);
    } else {
      needs_kernel = true;
      if (!meta->is_list[i]) {
        outputs.push_back(fresh(geometries[0]));
      } else {
        c10::List<at::Tensor> made;
        for (const Geometry& g : geometries) made.push_back(fresh(g));
        outputs.push_back(made);
      }
    }
  }

  // 3. The kernel: it takes the arguments (the host needs them no more).
  if (needs_kernel) {
    seed_generators(schema, first, device.index());
    replace_devices(first, num_args, c10::Device(c10::kCPU));
    bool routed = facts.out_op != nullptr;  // a structured op: its out= overload writes the outputs in place
    for (const c10::IValue& o : outputs) routed &= o.isTensor() && o.toTensor().defined();
    const orStream_t stream = current_stream_handle(device.index());
    std::unique_ptr<Launch, Launch::Unlaunched> launch(Launch::make(routed ? *facts.out_op : op));
    launch->writes_argument = facts.writes_argument && !routed;
    launch->args.capture(first, first + num_args);
    if (routed) {
      for (const c10::IValue& o : outputs) launch->args.append(o.toTensor());
      launch->outs = outputs.size();
    } else {  // where each result must land: not for true views
      for (size_t i = 0; i < outputs.size(); ++i) launch->targets.add(true_view[i] ? c10::IValue() : outputs[i]);
    }
    OPENREG_CHECK(orLaunchKernel(stream, schema.name().c_str(), &Launch::run, launch.release(), &Launch::bury));
  }
  stack->erase(stack->end() - num_args, stack->end());
  for (c10::IValue& o : outputs) stack->push_back(std::move(o));
}

}  // namespace

void generic_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  fallback(op, keys, stack);
}

namespace {

bool same_argument(const c10::Argument& a, const c10::Argument& b) {
  return a.name() == b.name() && a.type()->str() == b.type()->str() && a.kwarg_only() == b.kwarg_only();
}

// The out= overload of a functional op among the overloads of its name: the same arguments,
// then one out tensor per return.
std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op,
                                                     const std::vector<c10::OperatorHandle>& overloads) {
  const auto& f = op.schema();
  for (const c10::OperatorHandle& candidate : overloads) {
    const auto& o = candidate.schema();
    if (o.arguments().size() != f.arguments().size() + f.returns().size()) continue;
    bool match = true;
    for (size_t i = 0; match && i < f.arguments().size(); ++i)
      match = same_argument(f.arguments()[i], o.arguments()[i]);
    for (size_t i = f.arguments().size(); match && i < o.arguments().size(); ++i) {
      const auto& a = o.arguments()[i];
      match = a.kwarg_only() && is_written(a) && a.type()->str() == "Tensor";
    }
    if (match) return candidate;
  }
  return std::nullopt;
}

}  // namespace

// Functional operators that are not structured but whose CPU kernel is "allocate the result, then
// run the out= kernel into it" (checked in ATen's source, e.g. index_select_cpu_ and
// index_select_out_cpu_): their out= overload is as exact a substitute as a structured op's, and
// saves the functional result's host allocation and its copy into the device output (index_select
// of 1024 rows of 128 floats, an embedding's forward: 36 to 47 us before, 16 to 17 us after).
// The generic path reaches them through the fallback; only the out= overload is recorded.
constexpr const char* kOutKernelOps[] = {"aten::index_select"};

size_t route_structured_ops() {
  static size_t routed = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    // The aten operators, grouped by name (the candidates for each one's out= overload).
    std::unordered_map<std::string, std::vector<c10::OperatorHandle>> by_name;
    for (const c10::OperatorName& name : dispatcher.getAllOpNames())
      if (name.name.rfind("aten::", 0) == 0)
        if (auto op = dispatcher.findOp(name)) by_name[name.name].push_back(*op);
    size_t n = 0;
    for (const char* name : kOutKernelOps) {
      const auto& overloads = by_name.at(name);
      for (const c10::OperatorHandle& op : overloads) {
        if (!op.schema().overload_name().empty()) continue;  // the functional overload
        auto out = find_out_overload(op, overloads);
        TORCH_INTERNAL_ASSERT(out && !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1), name);
        out_overloads().emplace(&op.schema(), *out);
      }
    }
    for (const auto& [base, overloads] : by_name) {
      for (const c10::OperatorHandle& op : overloads) {
        const std::string qualified =
            base.substr(6) + (op.schema().overload_name().empty() ? "" : "." + op.schema().overload_name());
        // A CompositeExplicitAutograd kernel outranks the backend fallback, so for the few ops that
        // also have a CPU kernel (native_layer_norm, native_group_norm, addr, ...) openreg would
        // run the decomposition, whose rounding differs from the CPU kernel's (layer norm over one
        // element: 1e-4 instead of 0). Registered for openreg, the generic path runs the CPU kernel.
        if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
            op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
            !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
          lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&generic_kernel>());
          ++n;
          continue;
        }
        if (!op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
            op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
          continue;                                      // not structured, or openreg has a kernel of its own
        if (op.hasTag(at::Tag::inplace_view)) continue;  // transpose_, as_strided_, ...: metadata only
        // Ops whose composite ends in copy_(src), which copies from another device (the CPU, the
        // other openreg device) as CUDA's does. Routed, the generic path's device check refused such
        // a source: functionalization turns x[0] = cpu_tensor into aten::copy, so it failed under
        // torch.func.functionalize and torch.compile(backend="aot_eager") where eager worked.
        static const std::unordered_set<std::string> kCopiesAcrossDevices = {"copy", "slice_scatter", "select_scatter",
                                                                             "diagonal_scatter", "as_strided_scatter"};
        if (kCopiesAcrossDevices.count(base.substr(6)) != 0) continue;
        const auto& schema = op.schema();
        bool in_place = schema.returns().size() == 1 && is_written(schema.returns()[0]);
        bool tensor_returns = !schema.returns().empty();
        for (const auto& r : schema.returns())
          tensor_returns &= r.type()->kind() == c10::TypeKind::TensorType && r.alias_info() == nullptr;
        if (!in_place) {
          if (!tensor_returns) continue;
          auto out = find_out_overload(op, overloads);
          if (!out || out->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
          out_overloads().emplace(&schema, *out);
        }
        lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&generic_kernel>());
        ++n;
      }
    }
    return n;
  }();
  return routed;
}

std::string routed_out_overload(const std::string& name) {
  const auto dot = name.find('.');
  const auto op =
      c10::Dispatcher::singleton().findOp({name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1)});
  TORCH_CHECK(op.has_value(), "no operator named ", name);
  const c10::OperatorHandle* out = out_overload(*op);
  return out == nullptr ? "" : c10::toString(out->schema().operator_name());
}

void synchronous_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  check_not_strict(op.schema());
  Stack args = take_arguments(stack, op.schema().arguments().size());
  count(op);
  const c10::Device device = common_device(op.schema(), args);
  c10::DeviceGuard guard(device);
  move_indices_to(op.schema(), args.data(), args.size(), device);
  run_synchronously(op, stack, std::move(args), device);
}

void sparse_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  check_not_strict(schema);
  const size_t n = schema.arguments().size();
  sparse::check_cpu_kernel(op, c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - n, n));
  Stack args = take_arguments(stack, n);
  count(op);
  const c10::Device device = common_device(schema, args);
  c10::DeviceGuard guard(device);
  run_synchronously(op, stack, std::move(args), device);
}

void nested_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  check_not_strict(schema);
  nested::check_cpu_kernel(op);
  Stack args = take_arguments(stack, schema.arguments().size());
  count(op);
  // (_to_copy, empty_like and copy_ never come here: ATen's device-generic nested kernels serve
  // them, OpenRegNested.cpp)
  const c10::Device device = common_device(schema, args);
  c10::DeviceGuard guard(device);
  run_synchronously(op, stack, std::move(args), device);
}

std::vector<std::string> shadowed_by_composite(c10::DispatchKey cpu_key, c10::DispatchKey own_key,
                                               std::initializer_list<c10::DispatchKey> composites) {
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<std::string> names;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(cpu_key) || op->hasKernelForDispatchKey(own_key)) continue;
    bool composite = false;
    for (c10::DispatchKey k : composites) composite |= op->hasKernelForDispatchKey(k);
    if (composite) names.push_back(name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name));
  }
  return names;
}

// In a forked child nothing ran on the device, and g_stats_mu may be held by a parent thread that
// no longer exists there (lazy-init-fork.md): no counts, nothing to reset.
std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::vector<std::pair<std::string, int64_t>> out;
  if (in_forked_child()) return out;
  std::lock_guard<std::mutex> lock(g_stats_mu);
  for (const auto& [schema, counter] : g_counts) {
    const int64_t n = counter->calls.load(std::memory_order_relaxed);
    if (n != 0) out.emplace_back(counter->name, n);  // not schema->name(): see forget_operator
  }
  return out;
}

void reset_fallback_counts() {
  if (in_forked_child()) return;
  std::lock_guard<std::mutex> lock(g_stats_mu);
  for (auto& [schema, counter] : g_counts) counter->calls.store(0, std::memory_order_relaxed);  // threads keep pointers
}

namespace {
// Drops what the generic path keeps for an operator being removed (see g_counts).
// An operator that never reached the generic path has nothing here (a counter comes first): every
// library's operators are removed at exit, and scanning the meta cache for each cost a quarter of a
// second there. out_overloads (aten's structured operators, read without a lock) is left alone.
// A forked child forgets nothing: a parent thread may have held these locks at the fork, and a
// child's exit removes every operator (lazy-init-fork.md).
void forget_operator(const c10::OperatorHandle& op) {
  if (c10::openreg::in_forked_child()) return;
  const c10::FunctionSchema* schema = &op.schema();
  {
    std::lock_guard<std::mutex> lock(g_stats_mu);
    auto it = g_counts.find(schema);
    if (it == g_counts.end()) return;
    g_retired_counts.push_back(std::move(it->second));
    g_counts.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(g_meta_mu);
    auto drop = [&](auto& cache) {
      for (auto it = cache.begin(); it != cache.end();) it = it->first.op == schema ? cache.erase(it) : std::next(it);
    };
    drop(g_meta_cache);
    drop(g_checks);
  }
  g_registry_epoch.fetch_add(1, std::memory_order_release);
}

struct ForgetRemovedOperators final : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& op) override { forget_operator(op); }
};

// Registered when the library loads; kept for the life of the process.
[[maybe_unused]] const auto* g_forget_listener = new c10::RegistrationHandleRAII(
    c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<ForgetRemovedOperators>()));
}  // namespace

int64_t generic_launches_alive() { return Launch::alive().load(); }

void hold_locks_for_test(bool hold) {
  if (hold) {
    g_stats_mu.lock();
    g_meta_mu.lock();
  } else {
    g_meta_mu.unlock();
    g_stats_mu.unlock();
  }
}

void set_strict_mode(bool strict) { g_strict.store(strict); }
bool strict_mode() { return g_strict.load(); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

}  // namespace c10::openreg
