// Element loops of the decomposed quantize/dequantize kernels, run on the
// device over kernel views.
//
// Each loop reproduces the decomposition's arithmetic step by step (see
// torch/ao/quantization/fx/_decomposed.py): the same types for each step, the
// same rounding (half to even), clamp after the zero point, no fused
// multiply-add (setup.py compiles with -ffp-contract=off). One pass over memory
// replaces the decomposition's four or five.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <utility>

#include "../QuantCommon.h"

namespace openreg_quant {

constexpr int64_t kGrain = 32768;

// Calls f(T{}) with the C++ type of a quantized (integer) dtype the loops handle.
template <typename F>
bool visit_qtype(c10::ScalarType t, F&& f) {
  switch (t) {
    case c10::kByte:
      f(uint8_t{});
      return true;
    case c10::kChar:
      f(int8_t{});
      return true;
    case c10::kShort:
      f(int16_t{});
      return true;
    case c10::kUInt16:
      f(uint16_t{});
      return true;
    default:
      return false;
  }
}

// ... of a floating dtype a quantize reads or a dequantize writes.
template <typename F>
bool visit_ftype(c10::ScalarType t, F&& f, bool with_double) {
  switch (t) {
    case c10::kFloat:
      f(float{});
      return true;
    case c10::kBFloat16:
      f(c10::BFloat16{});
      return true;
    case c10::kHalf:
      f(c10::Half{});
      return true;
    case c10::kDouble:
      if (!with_double) return false;
      f(double{});
      return true;
    default:
      return false;
  }
}

// The input and output of a loop as two arrays in the same memory order: a dense input
// with the output's strides is used as it is; any other input is made contiguous on the
// device (its output, from empty_like, is then contiguous too, or written through a
// contiguous buffer).
struct FlatPair {
  at::Tensor x, y, y_final;
  // contiguous: the loop needs the logical (row-major) order, not just a dense one.
  FlatPair(at::Tensor in, at::Tensor out, bool contiguous = false) {
    if ((contiguous ? in.is_contiguous() : in.is_non_overlapping_and_dense()) && in.strides() == out.strides()) {
      x = std::move(in), y = std::move(out);
      return;
    }
    x = in.contiguous();
    if (out.is_contiguous()) {
      y = std::move(out);
    } else {
      y = at::empty(out.sizes(), out.options());
      y_final = std::move(out);
    }
  }
  void finish() {
    if (y_final.defined()) y_final.copy_(y);
  }
};

// Per-tensor quantize: clamp(round(x * inv_scale) + zero_point, lo, hi), in float32
// (16-bit inputs are widened first; the Python scale and zero point are float32 scalars
// in the multiply and the add).
template <typename in_t, typename out_t>
void quantize_tensor_loop(const at::Tensor& x, const at::Tensor& y, float inv, float zp, float lo, float hi) {
  const in_t* src = x.const_data_ptr<in_t>();
  out_t* dst = y.mutable_data_ptr<out_t>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      dst[i] = static_cast<out_t>(clamp_to(round_even(static_cast<float>(src[i]) * inv) + zp, lo, hi));
  });
}

// Per-tensor dequantize: (x.to(out) - zero_point) * scale; each step rounds to the output
// type (16-bit outputs compute in float32 and round after each op, as the CPU's kernels do).
template <typename q_t, typename o_t>
void dequantize_tensor_loop(const at::Tensor& x, const at::Tensor& y, double scale, double zp) {
  using op_t = at::opmath_type<o_t>;
  const op_t s = static_cast<op_t>(scale), z = static_cast<op_t>(zp);
  const q_t* src = x.const_data_ptr<q_t>();
  o_t* dst = y.mutable_data_ptr<o_t>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const o_t shifted = static_cast<o_t>(static_cast<op_t>(static_cast<o_t>(src[i])) - z);
      dst[i] = static_cast<o_t>(static_cast<op_t>(shifted) * s);
    }
  });
}

// Runs f(i, c) for every element i of a dense layout whose group index c (channel, token)
// is (i / inner) % groups: blocks of `inner` elements share a group. Parallel over blocks.
template <typename F>
void for_each_group(int64_t numel, int64_t groups, int64_t inner, F&& f) {
  if (numel == 0) return;
  if (inner == 1) {  // the group is the fastest index (channels-last, per token of width 1...)
    at::parallel_for(0, numel / groups, std::max<int64_t>(1, kGrain / groups), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < groups; ++c) f(r * groups + c, c);
    });
    return;
  }
  at::parallel_for(0, numel / inner, std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t c = blk % groups;
      for (int64_t i = blk * inner, end = i + inner; i < end; ++i) f(i, c);
    }
  });
}

// Per-channel quantize: clamp(round(x * (1 / scale_c)) + zero_point_c, lo, hi) in T, the
// scales' type (x is widened to float32, then to T). `recip` and `zp` hold T values.
template <typename in_t, typename out_t, typename T>
void quantize_channel_loop(const at::Tensor& x, const at::Tensor& y, const T* recip, const T* zp, int64_t groups,
                           int64_t inner, T lo, T hi) {
  const in_t* src = x.const_data_ptr<in_t>();
  out_t* dst = y.mutable_data_ptr<out_t>();
  for_each_group(x.numel(), groups, inner, [&](int64_t i, int64_t c) {
    const T v = static_cast<T>(static_cast<float>(src[i]));
    dst[i] = static_cast<out_t>(clamp_to(round_even(v * recip[c]) + zp[c], lo, hi));
  });
}

// Per-token quantize: clamp(round(x * (1 / scale_t) + zero_point_t), lo, hi) in T: the
// rounding comes after the zero point here, as in the decomposition.
template <typename in_t, typename out_t, typename T>
void quantize_token_loop(const at::Tensor& x, const at::Tensor& y, const T* recip, const T* zp, int64_t groups,
                         int64_t inner, T lo, T hi) {
  const in_t* src = x.const_data_ptr<in_t>();
  out_t* dst = y.mutable_data_ptr<out_t>();
  for_each_group(x.numel(), groups, inner, [&](int64_t i, int64_t c) {
    const T v = static_cast<T>(static_cast<float>(src[i]));
    dst[i] = static_cast<out_t>(clamp_to(round_even(v * recip[c] + zp[c]), lo, hi));
  });
}

// Per-channel and per-token dequantize: ((x - zero_point_c) * scale_c).to(out) with the
// product in T, the scales' type (integer zero points subtract exactly).
template <typename q_t, typename o_t, typename T>
void dequantize_group_loop(const at::Tensor& x, const at::Tensor& y, const T* scale, const T* zp, int64_t groups,
                           int64_t inner) {
  const q_t* src = x.const_data_ptr<q_t>();
  o_t* dst = y.mutable_data_ptr<o_t>();
  for_each_group(x.numel(), groups, inner,
                 [&](int64_t i, int64_t c) { dst[i] = static_cast<o_t>((static_cast<T>(src[i]) - zp[c]) * scale[c]); });
}

}  // namespace openreg_quant
