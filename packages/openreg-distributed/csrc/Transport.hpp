// The transport seam: where a vendor's fabric goes.
//
// occl owns the device side of a collective (which stream it runs on, how it
// is ordered with compute, when its memory may be reused, how errors surface);
// a Transport only moves and reduces bytes. Its methods are called on the
// communication stream's worker with CPU tensors over the kernel views of
// device memory (contiguous, already checked by occl), start the operation and
// return a c10d::Work that occl waits on from the same worker. Collectives of
// one transport are started in program order, from one stream per group, so
// pairing stays consistent between ranks; sends and receives with one peer are
// started in program order, on one stream per peer. send() must return without
// waiting for the peer (occl waits for its Work on another stream, so that the
// peer's stream goes on to the receive that follows).
//
// GlooTransport drives a c10d Gloo backend (TCP, multi-node). A vendor with an
// RDMA or NVLink-like fabric implements this class over their library and
// passes it to OcclBackend instead; nothing else in occl changes.
#pragma once

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <utility>
#include <vector>

namespace openreg_distributed {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // Reductions take SUM, PRODUCT, MIN, MAX, AVG (floating point) and BAND/BOR/BXOR (integers);
  // occl emulates the rest (PREMUL_SUM, AVG on integers) around these.
  virtual WorkPtr broadcast(at::Tensor& t, int root, std::chrono::milliseconds timeout) = 0;
  virtual WorkPtr allreduce(std::vector<at::Tensor>& ts, c10d::ReduceOp op, std::chrono::milliseconds timeout) = 0;
  virtual WorkPtr reduce(at::Tensor& t, int root, c10d::ReduceOp op, std::chrono::milliseconds timeout) = 0;
  // out holds size() chunks of in's shape, rank order.
  virtual WorkPtr allgather(at::Tensor& out, at::Tensor& in, std::chrono::milliseconds timeout) = 0;
  // in holds size() chunks of out's shape; chunk r is reduced into rank r's out.
  virtual WorkPtr reduce_scatter(at::Tensor& out, at::Tensor& in, c10d::ReduceOp op,
                                 std::chrono::milliseconds timeout) = 0;
  // Splits are counts along dim 0 (empty: even).
  virtual WorkPtr alltoall(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits,
                           std::vector<int64_t> in_splits, std::chrono::milliseconds timeout) = 0;
  // outs: one tensor per rank on the root, empty elsewhere (same for scatter's ins).
  virtual WorkPtr gather(std::vector<at::Tensor>& outs, at::Tensor& in, int root,
                         std::chrono::milliseconds timeout) = 0;
  virtual WorkPtr scatter(at::Tensor& out, std::vector<at::Tensor>& ins, int root,
                          std::chrono::milliseconds timeout) = 0;
  virtual WorkPtr send(at::Tensor& t, int dst, int tag) = 0;
  virtual WorkPtr recv(at::Tensor& t, int src, int tag) = 0;
  virtual WorkPtr recv_anysource(at::Tensor& t, int tag) = 0;  // its Work's sourceRank() names the sender
  virtual WorkPtr barrier(std::chrono::milliseconds timeout) = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  // Stop: in-flight operations fail instead of waiting for peers that will not come.
  virtual void abort() = 0;
  virtual void shutdown() = 0;
};

// The transport occl ships: a c10d Gloo backend created in Python with torch.distributed's public
// API (ProcessGroupGloo) and handed over as a c10d::Backend.
class GlooTransport final : public Transport {
 public:
  explicit GlooTransport(c10::intrusive_ptr<c10d::Backend> gloo) : gloo_(std::move(gloo)) {}

  std::string name() const override { return gloo_->getBackendName(); }
  const c10::intrusive_ptr<c10d::Backend>& backend() const { return gloo_; }

  WorkPtr broadcast(at::Tensor& t, int root, std::chrono::milliseconds timeout) override {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout;
    return gloo_->broadcast(ts, o);
  }
  WorkPtr allreduce(std::vector<at::Tensor>& ts, c10d::ReduceOp op, std::chrono::milliseconds timeout) override {
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    o.timeout = timeout;
    if (ts.size() == 1) return gloo_->allreduce(ts, o);
    c10d::AllreduceCoalescedOptions c;
    c.reduceOp = op;
    c.timeout = timeout;
    return gloo_->allreduce_coalesced(ts, c);
  }
  WorkPtr reduce(at::Tensor& t, int root, c10d::ReduceOp op, std::chrono::milliseconds timeout) override {
    std::vector<at::Tensor> ts{t};
    c10d::ReduceOptions o;
    o.rootRank = root;
    o.reduceOp = op;
    o.timeout = timeout;
    return gloo_->reduce(ts, o);
  }
  WorkPtr allgather(at::Tensor& out, at::Tensor& in, std::chrono::milliseconds timeout) override {
    c10d::AllgatherOptions o;
    o.timeout = timeout;
    return gloo_->_allgather_base(out, in, o);
  }
  WorkPtr reduce_scatter(at::Tensor& out, at::Tensor& in, c10d::ReduceOp op,
                         std::chrono::milliseconds timeout) override {
    c10d::ReduceScatterOptions o;
    o.reduceOp = op;
    o.timeout = timeout;
    return gloo_->_reduce_scatter_base(out, in, o);
  }
  WorkPtr alltoall(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                   std::chrono::milliseconds timeout) override {
    c10d::AllToAllOptions o;
    o.timeout = timeout;
    return gloo_->alltoall_base(out, in, out_splits, in_splits, o);
  }
  WorkPtr gather(std::vector<at::Tensor>& outs, at::Tensor& in, int root, std::chrono::milliseconds timeout) override {
    std::vector<std::vector<at::Tensor>> o_list;
    if (!outs.empty()) o_list.push_back(outs);
    std::vector<at::Tensor> ins{in};
    c10d::GatherOptions o;
    o.rootRank = root;
    o.timeout = timeout;
    return gloo_->gather(o_list, ins, o);
  }
  WorkPtr scatter(at::Tensor& out, std::vector<at::Tensor>& ins, int root, std::chrono::milliseconds timeout) override {
    std::vector<std::vector<at::Tensor>> i_list;
    if (!ins.empty()) i_list.push_back(ins);
    std::vector<at::Tensor> outs{out};
    c10d::ScatterOptions o;
    o.rootRank = root;
    o.timeout = timeout;
    return gloo_->scatter(outs, i_list, o);
  }
  WorkPtr send(at::Tensor& t, int dst, int tag) override {
    std::vector<at::Tensor> ts{t};
    return gloo_->send(ts, dst, tag);
  }
  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    std::vector<at::Tensor> ts{t};
    return gloo_->recv(ts, src, tag);
  }
  WorkPtr recv_anysource(at::Tensor& t, int tag) override {
    std::vector<at::Tensor> ts{t};
    return gloo_->recvAnysource(ts, tag);
  }
  WorkPtr barrier(std::chrono::milliseconds timeout) override {
    c10d::BarrierOptions o;
    o.timeout = timeout;
    return gloo_->barrier(o);
  }
  void set_timeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }
  void abort() override { gloo_->abort(); }
  void shutdown() override { gloo_->shutdown(); }

 private:
  c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace openreg_distributed
