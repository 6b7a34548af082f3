// The fused RNN cells. On an accelerator, nn.LSTM and nn.GRU compute each
// time step with aten::_thnn_fused_lstm_cell / _thnn_fused_gru_cell (and
// their backward ops), which ATen implements only for CUDA. openreg gives
// them device kernels written with ATen CPU ops: gate pre-activations in,
// new states plus a workspace of activated gates out; the backward ops read
// the workspace back. Workspace layouts: LSTM [i, f, g, o] (batch x 4H),
// GRU [r, z, n, hx, hn] (batch x 5H).
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <vector>

#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

at::Tensor with_bias(const at::Tensor& gates, const at::Tensor& bias) { return bias.defined() ? gates + bias : gates; }

// What CUDA's kernels check at the call (checkSizes, and a dispatch on floating types only): gates of
// [batch, n * hidden], biases of [n * hidden], a state of [batch, hidden], on one device. nn.LSTM and
// nn.GRU check their inputs first; a direct call with wrong sizes failed its kernel at a later call.
void check_cell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& state,
                const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb, int64_t n) {
  const auto dtype = input_gates.scalar_type();  // CUDA's dispatch: float, double, half, bfloat16
  TORCH_CHECK_NOT_IMPLEMENTED(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16, "\"", op,
      "\" not implemented for '", dtype, "'");
  TORCH_CHECK(state.dim() == 2, op, ": expected a 2-D state (batch, hidden), got sizes ", state.sym_sizes());
  // Symbolic sizes: the meta kernels below check with this too (a guard per comparison under export).
  const std::vector<c10::SymInt> gates{state.sym_size(0), n * state.sym_size(1)};
  for (const at::Tensor* t : {&input_gates, &hidden_gates}) {
    TORCH_CHECK(t->sym_sizes() == c10::SymIntArrayRef(gates), op, ": expected gates of sizes ",
                c10::SymIntArrayRef(gates), " for a state of sizes ", state.sym_sizes(), ", got ", t->sym_sizes());
    TORCH_CHECK(t->scalar_type() == state.scalar_type() && t->device() == state.device(), op,
                ": the gates and the state must have one dtype and device");
  }
  for (const auto* bias : {&ib, &hb})
    if (bias->has_value() && (*bias)->defined())
      TORCH_CHECK((*bias)->dim() == 1 && (*bias)->sym_size(0) == gates[1] && (*bias)->device() == state.device() &&
                      (*bias)->scalar_type() == dtype,
                  op, ": expected a bias of ", gates[1], " elements of ", dtype, " on ", state.device(), ", got sizes ",
                  (*bias)->sym_sizes(), " of ", (*bias)->scalar_type(), " on ", (*bias)->device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                         const at::Tensor& cx, const std::optional<at::Tensor>& ib,
                                                         const std::optional<at::Tensor>& hb) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, ib, hb, 4);
  c10::DeviceGuard guard(cx.device());
  at::Tensor hy = at::empty(cx.sizes(), cx.options()), cy = at::empty(cx.sizes(), cx.options());
  at::Tensor workspace = at::empty(input_gates.sizes(), input_gates.options());
  launch_cpu_function("aten::_thnn_fused_lstm_cell",
                      {input_gates, hidden_gates, cx, ib.value_or(at::Tensor()), hb.value_or(at::Tensor())},
                      {hy, cy, workspace}, [](const std::vector<at::Tensor>& a) {
                        at::Tensor gates = with_bias(with_bias(a[0] + a[1], a[3]), a[4]);
                        auto g = gates.chunk(4, 1);
                        at::Tensor i = g[0].sigmoid(), f = g[1].sigmoid(), c = g[2].tanh(), o = g[3].sigmoid();
                        at::Tensor cy = f * a[2] + i * c;
                        return std::vector<at::Tensor>{o * cy.tanh(), cy, at::cat({i, f, c, o}, 1)};
                      });
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  c10::DeviceGuard guard(cx.device());
  at::Tensor grad_gates = at::empty(workspace.sizes(), workspace.options());
  at::Tensor grad_cx = at::empty(cx.sizes(), cx.options());
  at::Tensor grad_bias = has_bias ? at::empty({workspace.size(1)}, workspace.options()) : at::Tensor();
  launch_cpu_function(
      "aten::_thnn_fused_lstm_cell_backward_impl",
      {grad_hy.value_or(at::Tensor()), grad_cy.value_or(at::Tensor()), cx, cy, workspace},
      {grad_gates, grad_cx, grad_bias}, [has_bias](const std::vector<at::Tensor>& a) {
        auto g = a[4].chunk(4, 1);
        const at::Tensor &i = g[0], &f = g[1], &c = g[2], &o = g[3];
        at::Tensor ghy = a[0].defined() ? a[0] : at::zeros_like(a[3]);
        at::Tensor gcy = a[1].defined() ? a[1] : at::zeros_like(a[3]);
        at::Tensor tanh_cy = a[3].tanh();
        at::Tensor gc = gcy + ghy * o * (1 - tanh_cy * tanh_cy);
        at::Tensor gates = at::cat(
            {gc * c * i * (1 - i), gc * a[2] * f * (1 - f), gc * i * (1 - c * c), ghy * tanh_cy * o * (1 - o)}, 1);
        return std::vector<at::Tensor>{gates, gc * f, has_bias ? gates.sum(0) : at::Tensor()};
      });
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& ib,
                                            const std::optional<at::Tensor>& hb) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, ib, hb, 3);
  c10::DeviceGuard guard(hx.device());
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor workspace = at::empty({hx.size(0), hx.size(1) * 5}, hx.options());
  launch_cpu_function("aten::_thnn_fused_gru_cell",
                      {input_gates, hidden_gates, hx, ib.value_or(at::Tensor()), hb.value_or(at::Tensor())},
                      {hy, workspace}, [](const std::vector<at::Tensor>& a) {
                        auto ig = with_bias(a[0], a[3]).chunk(3, 1);
                        auto hg = with_bias(a[1], a[4]).chunk(3, 1);
                        at::Tensor r = (ig[0] + hg[0]).sigmoid(), z = (ig[1] + hg[1]).sigmoid();
                        at::Tensor n = (ig[2] + r * hg[2]).tanh();
                        return std::vector<at::Tensor>{n + z * (a[2] - n), at::cat({r, z, n, a[2], hg[2]}, 1)};
                      });
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                         const at::Tensor& workspace,
                                                                                         bool has_bias) {
  c10::DeviceGuard guard(grad_hy.device());
  const int64_t h = grad_hy.size(1);
  auto opts = grad_hy.options();
  at::Tensor gi = at::empty({grad_hy.size(0), 3 * h}, opts), gh = at::empty({grad_hy.size(0), 3 * h}, opts);
  at::Tensor ghx = at::empty(grad_hy.sizes(), opts);
  at::Tensor gib = has_bias ? at::empty({3 * h}, opts) : at::Tensor();
  at::Tensor ghb = has_bias ? at::empty({3 * h}, opts) : at::Tensor();
  launch_cpu_function("aten::_thnn_fused_gru_cell_backward", {grad_hy, workspace}, {gi, gh, ghx, gib, ghb},
                      [has_bias](const std::vector<at::Tensor>& a) {
                        auto w = a[1].chunk(5, 1);
                        const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
                        const at::Tensor& g = a[0];
                        at::Tensor dn = g * (1 - z) * (1 - n * n);
                        at::Tensor dz = g * (hx - n) * z * (1 - z);
                        at::Tensor dr = dn * hn * r * (1 - r);
                        at::Tensor in = at::cat({dr, dz, dn}, 1), hid = at::cat({dr, dz, dn * r}, 1);
                        return std::vector<at::Tensor>{in, hid, g * z, has_bias ? in.sum(0) : at::Tensor(),
                                                       has_bias ? hid.sum(0) : at::Tensor()};
                      });
  return {gi, gh, ghx, gib, ghb};
}

// Shape functions (the Meta key) for the GRU cell ops, which torch 2.13 lacks (it has the LSTM cell's,
// in torch/_meta_registrations.py). Fake tensors (torch.export, torch.compile, FakeTensorMode) take
// their results' shapes from these, symbolic sizes staying symbolic; without them an export with a
// dynamic batch failed, and torch.compile ran every later batch size eagerly.
std::tuple<at::Tensor, at::Tensor> gru_cell_meta(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                 const at::Tensor& hx, const std::optional<at::Tensor>& ib,
                                                 const std::optional<at::Tensor>& hb) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, ib, hb, 3);
  return {at::empty_symint(hx.sym_sizes(), hx.options()),
          at::empty_symint({hx.sym_size(0), hx.sym_size(1) * 5}, hx.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward_meta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.sym_size(0) == grad_hy.sym_size(0) &&
                  workspace.sym_size(1) == grad_hy.sym_size(1) * 5,
              "_thnn_fused_gru_cell_backward: expected a workspace of sizes [batch, 5 * hidden] for a gradient of "
              "sizes [batch, hidden], got ",
              workspace.sym_sizes(), " and ", grad_hy.sym_sizes());
  const c10::SymInt b = grad_hy.sym_size(0), h3 = grad_hy.sym_size(1) * 3;
  const auto opts = grad_hy.options();
  return {at::empty_symint({b, h3}, opts), at::empty_symint({b, h3}, opts), at::empty_symint(grad_hy.sym_sizes(), opts),
          has_bias ? at::empty_symint({h3}, opts) : at::Tensor(),
          has_bias ? at::empty_symint({h3}, opts) : at::Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_thnn_fused_gru_cell", gru_cell_meta);
  m.impl("_thnn_fused_gru_cell_backward", gru_cell_backward_meta);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", gru_cell_backward);
}

}  // namespace c10::openreg
