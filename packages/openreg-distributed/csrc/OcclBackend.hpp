// occl: the c10d backend for openreg tensors, with NCCL's device semantics.
//
// Every collective is a kernel on a communication stream of the tensors' device:
//   1. an event recorded on the caller's current stream; the comm stream waits for it, so the
//      collective sees everything queued before it (the host does not block);
//   2. the kernel runs on the comm stream's worker over kernel views of device memory (CPU
//      tensors aliasing it: zero copy) and drives the Transport (Gloo by default) to completion;
//   3. an end event recorded after it; OcclWork::wait() makes the caller's current stream wait for
//      it (the host blocks only with TORCH_OCCL_BLOCKING_WAIT=1, or for barrier());
//   4. the tensors stay referenced by the Work, which the backend keeps in its in-flight list
//      until the end event has completed (the watchdog, later operations of the group and wait()
//      then release them), so the caching allocator cannot hand their memory to later compute
//      while the collective still reads or writes it.
// A failure (transport error, peer gone, timeout) fails the kernel: it surfaces at the next
// synchronising call on the device, naming the collective, at wait() with blocking wait or a timeout, and every
// later operation of the group fails at once with the first error (DistBackendError). A watchdog
// thread per backend times operations out from the moment they were enqueued, as NCCL's does, and
// applies TORCH_OCCL_ASYNC_ERROR_HANDLING to the first failure (see ErrorHandling).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "Trace.hpp"
#include "Transport.hpp"
#include "openreg/runtime.h"

namespace openreg_distributed {

// The first failure of a group; shared by the backend, its works and its kernels.
class GroupError {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string message() const {
    std::lock_guard<std::mutex> g(mu_);
    return message_;
  }
  // `by_user`: an abort() the user asked for, not a failure for the watchdog to handle.
  void set(const std::string& message, bool by_user = false) {
    std::lock_guard<std::mutex> g(mu_);
    if (failed_.load(std::memory_order_relaxed)) return;  // the first error is the one users need
    message_ = message;
    by_user_ = by_user;
    failed_.store(true, std::memory_order_release);
  }
  bool by_user() const {
    std::lock_guard<std::mutex> g(mu_);
    return by_user_;
  }

 private:
  mutable std::mutex mu_;
  std::string message_;
  bool by_user_ = false;
  std::atomic<bool> failed_{false};
};

// What the kernel of one Work tells the host and the watchdog: its error, whether it started and
// finished, and, for recv_anysource, the sender. Holds no tensor: the watchdog may drop the last
// reference on its own thread.
struct WorkOutcome {
  GroupError error;
  std::atomic<int> source_rank{-1};
  std::atomic<bool> started{false}, finished{false};
  // When the kernel began and ended its operation (written before `started` / `finished`).
  std::chrono::steady_clock::time_point started_at{}, finished_at{};
  std::atomic<bool> timed_out{false};  // the failure is a timeout (Work.get_future_result())
  // c10d::WorkResult once known, completed by the watchdog (an int future: no tensors).
  c10::intrusive_ptr<c10::ivalue::Future> result = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
  TracePoints* points = nullptr;  // the flight recorder's view of the kernel (null when it is off)
  ~WorkOutcome() { trace::release_points(points); }
};

// TORCH_OCCL_ASYNC_ERROR_HANDLING, with the values and meanings of TORCH_NCCL_ASYNC_ERROR_HANDLING
// (ProcessGroupNCCL.hpp's ErrorHandlingMode): what the watchdog does with a group's first failure
// (a timeout it caught, or an error a collective reported). In every mode the group refuses later
// operations with that error.
enum class ErrorHandling {
  kNoHandling = 0,   // nothing more: the error surfaces at the next synchronisation or wait()
  kTearDown = 1,     // abort the transport, then take the process down
  kCleanUpOnly = 2,  // abort the transport; the process goes on
  kSkipCleanUp = 3,  // take the process down without aborting the transport (NCCL's default)
};

// The streams of a device: collectives run in program order on one (Gloo pairs collectives by the
// order they are started). Point-to-point has, per peer and made on first use, one stream on which
// sends and receives with that peer start in program order, as NCCL keys its p2p communicators and
// streams by peer: a receive blocked until the peer sends holds back later operations with that
// peer, never those with another one. A send's start does not wait for the peer: it is waited for
// on the peer's send-completion stream, so the thread that finished a receive starts the next send
// at once (a ping-pong wakes one thread per message, not two). Receives inside a batch
// (batch_isend_irecv) run on the peer's batch receive stream, so both ranks may post a batch's
// receive before its send. recv_anysource has a stream of its own.
struct CommStreams {
  orStream_t coll = nullptr, recv_any = nullptr;
  std::map<int, orStream_t> peer, send_done, batch_recv;  // by peer
};

// Sends to and receives from the own rank, which NCCL runs as a device copy (the transport has no
// connection to its own rank): a send's kernel leaves a copy of its bytes here, and a receive's
// kernel takes the oldest one of its tag (as the transport pairs by peer and tag, in order).
struct SelfMailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::deque<at::Tensor>> by_tag;
  bool closed = false;  // abort(): a waiting receive fails (after shutdown() queued ones still run)
};

// Releasing tensors off the caller's threads (the watchdog does, once their operation ended).
// Dropping a tensor Python owned takes the GIL; once the interpreter finalizes, a foreign thread that
// takes it aborts the process, so Python's atexit stops such releases first (what remains is left
// to the backend's destructor).
void stop_foreign_releases();
// How occl runs `fn` without holding the GIL when its caller may hold it (set by the Python module):
// joining the watchdog while it waits for the GIL would deadlock.
void set_without_gil(std::function<void(const std::function<void()>&)> hook);

class OcclWork : public c10d::Work {
 public:
  OcclWork(int rank, c10d::OpType type, uint64_t seq, std::string what, c10::Device device, orEvent_t end,
           std::shared_ptr<WorkOutcome> outcome, std::vector<at::Tensor> stash, std::vector<at::Tensor> outputs,
           c10::intrusive_ptr<c10::ivalue::Future> future, std::chrono::milliseconds timeout, bool blocking_wait,
           std::shared_ptr<GroupError> group);
  ~OcclWork() override;

  // True once the end event completed, or once the operation failed (as NCCL's, once its exception
  // is set: the kernel may still be blocked in the transport).
  bool isCompleted() override;
  // The end event completed: the device is done with the tensors.
  bool ended() const;
  // Drops the tensors kept only for the allocator's sake (not result()'s); after ended() only.
  void release_stash();
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Completed at enqueue on the comm stream, as NCCL's; fetched after the operation failed, a future
  // holding its error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return outcome_->result; }
  uint64_t getSequencenumber() const override { return seq_; }
  // Milliseconds from the operation's start on the device side to its end, once it finished. occl
  // always times its operations (two clock reads each), so NCCL's TORCH_NCCL_ENABLE_TIMING has no
  // counterpart.
  float getDuration() const override;
  // Fails this operation and its group (NCCL's Work.abort() aborts the communicator).
  void abort() override;
  // Fails this operation with `why` unless it finished (its group's abort()).
  void fail_unless_finished(const std::string& why);

 private:
  void throw_if_failed() const;
  // Blocks the host until the operation ended or failed; false if `limit` passed first.
  bool host_wait(std::chrono::milliseconds limit);

  uint64_t seq_;
  std::string what_;  // "occl ALLREDUCE (seq 3, rank 0 of 2)"
  c10::Device device_;
  orEvent_t end_;
  std::shared_ptr<WorkOutcome> outcome_;
  std::mutex stash_mu_;  // release_stash() runs on the watchdog and on callers' threads
  std::vector<at::Tensor> stash_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_, failed_future_;
  std::chrono::milliseconds timeout_;
  bool blocking_wait_;
  std::shared_ptr<GroupError> group_;
};

class OcclBackend : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout) : Backend::Options("occl", timeout) {}
  };

  // Makes the transport of a split group: (store, rank, size, timeout) -> a connected Gloo backend.
  using TransportFactory = std::function<std::shared_ptr<Transport>(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                                    std::chrono::milliseconds)>;

  OcclBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::intrusive_ptr<Options> options,
              std::shared_ptr<Transport> transport, TransportFactory factory = nullptr);
  ~OcclBackend() override;

  const std::string getBackendName() const override { return "occl"; }
  // A copy: c10d's splitGroup writes the child's name, timeout and description into the options it
  // gets here before it calls split(), which changed the parent's own timeout (its watchdog's).
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return c10::make_intrusive<Options>(*options_);
  }
  const std::shared_ptr<Transport>& transport() const { return transport_; }
  bool supportsCoalescing() const override { return true; }
  // split_group and 2-D DeviceMesh: a sub-backend with a transport of its own among the members.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  c10d::ErrorType getError() override;
  // The group's first failure, if it failed (what later operations are refused with).
  std::optional<std::string> first_error() const {
    return error_->failed() ? std::optional<std::string>(error_->message()) : std::nullopt;
  }
  void abort() override;
  void shutdown() override;

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::AllgatherOptions& opts) override;
  // all_gather_coalesced: outputs[r][i] receives rank r's inputs[i].
  c10::intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs,
                                               const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
                                         std::vector<int64_t>& inputSplitSizes,
                                         const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // NCCL's completion hooks: `hook` gets a WorkInfo for every operation that finished (or failed),
  // on a thread of its own, after the watchdog saw it end. One hook per group, as NCCL's.
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  // Returns once every operation enqueued so far ended and the hook ran for it (destroy_process_group
  // calls it when a hook is registered, so that no hook runs after the interpreter is gone).
  void waitForPendingWorks() override;
  // Operations are always timed (see OcclWork::getDuration): nothing to switch on.
  void enableCollectivesTiming() override {}

  // What runs on the worker: starts the transport operations (returns their works) and, once they
  // completed, `post` finishes the result (an emulated reduction's last step, copies out of a
  // staging buffer).
  struct Started {
    std::vector<WorkPtr> works;
    std::function<void()> post;
    bool anysource = false;  // record works[0]->sourceRank() in the work's outcome
  };
  using Start = std::function<Started()>;
  enum class Lane { kColl, kSend, kRecv, kRecvAny };
  // Which operations start in program order with one another: the lane, and the peer of a send or
  // receive (the streams they run on: see CommStreams).
  struct Route {
    Lane lane;
    int peer = -1;
    bool staged = false;  // a send whose Work ends once it started (see send())
    Route(Lane l, int p = -1, bool s = false) : lane(l), peer(p), staged(s) {}  // NOLINT: a lane alone is a route
  };
  // Sends up to this size are staged (NCCL's small-message protocols cover about this much).
  static constexpr int64_t kStagedSendBytes = 64 << 10;
  // At most this much staged data per peer waits for delivery at once: past it (a producer far
  // ahead of a peer that does not receive yet) a send to that peer is not staged, and its Work ends
  // at delivery.
  static constexpr int64_t kStagedBytesLimit = 4 << 20;

 private:
  // `stash`: the operation's inputs (empty: in place), `outputs` its outputs, both kept until it
  // completes and reported to the flight recorder and the profiler; `also_read`: other tensors its
  // kernel reads (a PREMUL_SUM device factor), kept as the inputs are, not reported as inputs.
  c10::intrusive_ptr<Work> enqueue(c10d::OpType type, const char* kernel, Route route, c10::Device device,
                                   std::vector<at::Tensor> stash, std::vector<at::Tensor> outputs, Start start,
                                   std::chrono::milliseconds timeout = c10d::kUnsetTimeout, bool blocking = false,
                                   std::vector<at::Tensor> also_read = {});
  c10::intrusive_ptr<Work> enqueue_impl(c10d::OpType type, const char* kernel, Route route, c10::Device device,
                                        std::vector<at::Tensor> stash, std::vector<at::Tensor> outputs, Start start,
                                        std::chrono::milliseconds timeout, bool blocking,
                                        std::vector<at::Tensor> also_read);
  // The stream an operation of `route` starts on, or, with `completion`, the one a send is waited for on.
  // `in_batch`: inside a coalescing manager (a receive then runs on the peer's batch receive stream).
  orStream_t comm_stream(c10::Device device, Route route, bool completion = false, bool in_batch = false);
  // Raises DistBackendError naming `op` once shutdown() was called.
  void check_not_shut_down(const char* op) const;
  // A root or peer rank given to `op`: raises ValueError at the call when it is not in the group.
  void check_rank(const char* op, const char* role, int64_t rank) const;
  std::chrono::milliseconds effective(std::chrono::milliseconds t) const;
  void keep_until_done(c10::intrusive_ptr<OcclWork> work);
  // The watchdog's part: releases every in-flight Work whose end event completed, and its tensors.
  void release_ended();
  trace::PgName pg_name() const { return {getGroupUid(), getGroupDesc()}; }

  // The watchdog (one thread per backend, as NCCL's): every 100 ms it looks at the operations in
  // flight, times out those not finished `timeout` after they were enqueued (their Work and the
  // group fail with a message naming the collective), hands the group's first failure to
  // TORCH_OCCL_ASYNC_ERROR_HANDLING, retires finished operations from the flight recorder, and
  // releases the in-flight Works (and tensors) whose end event completed. Its own list holds no
  // tensor.
  struct Watched {
    std::shared_ptr<WorkOutcome> outcome;
    std::chrono::steady_clock::time_point enqueued;
    std::chrono::milliseconds timeout;
    std::string what;
    uint64_t seq;
    c10d::OpType type;
    trace::Id trace;
    bool started_seen = false;
  };
  void watch(Watched w);
  void watchdog_loop();
  // The group's first failure, once: dump the flight recorder (TORCH_OCCL_DUMP_ON_TIMEOUT), tell the
  // peers (TORCH_OCCL_PROPAGATE_ERROR; not for a failure a peer reported), then apply
  // TORCH_OCCL_ASYNC_ERROR_HANDLING.
  void handle_failure(const std::string& message, bool from_peer = false);
  void stop_watchdog();
  // TORCH_OCCL_PROPAGATE_ERROR: a failure of this group that a peer wrote to the group's store, if
  // any (watchdog thread only). Fails the group and the operations in `in_flight` with it.
  void check_peer_failure(std::deque<Watched>& in_flight);
  void report_failure_to_peers(const std::string& message);
  void dump_flight_recorder(const std::string& message);
  int global_rank() const;

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  std::shared_ptr<Transport> transport_;
  TransportFactory factory_;
  std::map<std::vector<int>, int> splits_;  // how often each rank list was split off this backend
  std::shared_ptr<GroupError> error_ = std::make_shared<GroupError>();
  std::atomic<uint64_t> seq_{0};
  // The sends to one peer not delivered yet (see send()): the bytes of the staged ones' copies, and
  // the count of the unstaged ones. Shared with the reservations the queued send kernels hold, which
  // may outlive the backend.
  struct PeerStaging {
    std::atomic<int64_t> staged_bytes{0};
    std::atomic<int> unstaged{0};
  };
  std::shared_ptr<PeerStaging> peer_staging(int peer);
  std::map<int, std::shared_ptr<PeerStaging>> staging_;  // under streams_mu_
  std::shared_ptr<SelfMailbox> self_mailbox_ = std::make_shared<SelfMailbox>();
  void close_self_mailbox();
  uint64_t collective_seq_ = 0, p2p_seq_ = 0;  // the flight recorder's counters
  bool blocking_wait_;
  ErrorHandling error_handling_;
  bool dump_on_failure_;      // TORCH_OCCL_DUMP_ON_TIMEOUT
  bool propagate_error_;      // TORCH_OCCL_PROPAGATE_ERROR
  bool store_usable_ = true;  // watchdog thread only: false once the store failed a check

  // Flight recorder: this backend's id in the process, and its status (last enqueued, started,
  // completed operation).
  size_t pg_id_;
  bool pg_ranks_recorded_ = false;
  std::shared_ptr<c10d::ProcessGroupStatus> pg_status_ = std::make_shared<c10d::ProcessGroupStatus>();

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::deque<Watched> watched_;
  bool watch_stop_ = false;
  std::atomic<bool> terminating_{false};  // abort()/shutdown(): failures are no longer handled
  std::atomic<bool> shut_down_{false};    // shutdown(): new operations are refused
  bool failure_handled_ = false;          // watchdog thread only
  std::thread watchdog_;

  // Completion hooks (registerOnCompletionHook): the watchdog queues a WorkInfo per finished
  // operation; the hook thread calls the hook. `unretired_` counts the operations watched and not
  // yet seen ended, for waitForPendingWorks.
  std::mutex hook_mu_;
  std::condition_variable hook_cv_;
  std::deque<std::shared_ptr<c10d::WorkInfo>> hook_queue_;
  int64_t unretired_ = 0;
  bool hook_busy_ = false, hook_stop_ = false;
  std::thread hook_thread_;
  void hook_loop();
  void stop_hooks();

  std::mutex streams_mu_;
  std::map<c10::DeviceIndex, CommStreams> streams_;
  // The backend's kernels queued or running on its streams (each kernel's UnrunKernel counts itself
  // until the runtime ran or discarded it). None left: what the streams still hold are event records
  // and waits, which the destructor can drain (see ~OcclBackend).
  std::shared_ptr<std::atomic<int64_t>> kernels_queued_ = std::make_shared<std::atomic<int64_t>>(0);
  // Per route (lane, peer): the stream its last operation started on and an event recorded after
  // its kernel there (a send's start; a receive or collective whole). Gloo pairs a group's
  // operations by the order each rank starts them on a route, and one transport serves all the
  // group's devices: an operation on another stream than the route's last one (another device's,
  // or a batch's receive stream) waits for that one, so a rank whose devices are busy differently
  // cannot start its collectives in another order than its peers (they paired with the wrong peer
  // operation).
  struct RouteTail {
    orStream_t stream = nullptr;
    orEvent_t event = nullptr;
  };
  std::map<std::pair<int, int>, RouteTail> tails_;  // guarded by streams_mu_

  // Coalescing (torch.distributed._coalescing_manager, batch_isend_irecv): operations are
  // enqueued as they come; endCoalescing returns one Work that completes after all of them.
  bool coalescing_ = false;
  // An operation refused at its call inside a block (torch's coalescing manager then never ends the
  // block): the block ends there, or every later operation's outputs were kept until the next block.
  bool coalescing_abandoned_ = false;
  void abandon_coalescing();
  class RefusalEndsCoalescing {
   public:
    explicit RefusalEndsCoalescing(OcclBackend* b) : b_(b), exceptions_(std::uncaught_exceptions()) {}
    ~RefusalEndsCoalescing() {
      if (b_->coalescing_ && std::uncaught_exceptions() > exceptions_) b_->abandon_coalescing();
    }
    RefusalEndsCoalescing(const RefusalEndsCoalescing&) = delete;
    RefusalEndsCoalescing& operator=(const RefusalEndsCoalescing&) = delete;

   private:
    OcclBackend* b_;
    int exceptions_;
  };
  std::optional<c10::Device> coalesced_device_;
  std::vector<orStream_t> coalesced_streams_;  // the p2p streams used meanwhile
  std::vector<at::Tensor> coalesced_outputs_;  // the outputs of the operations meanwhile: the coalesced
                                               // Work's future holds them, so waiting for it orders them

  // Works (with their tensors) until their end event completed. The watchdog releases the ended
  // ones every poll (see stop_foreign_releases), later operations of the group those at the front,
  // and the rest go with the backend.
  std::mutex inflight_mu_;
  std::deque<c10::intrusive_ptr<OcclWork>> inflight_;
  std::atomic<size_t> inflight_count_{0};  // the watchdog polls while it is not 0
};

}  // namespace openreg_distributed
