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

// The element loops proper, over one contiguous chunk. On x86-64 Linux with GCC they are also
// compiled for AVX-512 (x86-64-v4) and AVX2 and the loader picks the variant the CPU runs
// (target_clones): the CPU's own kernels are dispatched the same way, the baseline (SSE2) build of
// these loops is ~3x slower than the AVX2 one, and the AVX2 quantize 1.25x slower than the AVX-512.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define OPENREG_QUANT_SIMD __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define OPENREG_QUANT_SIMD
#endif

// quantize: clamp(round(x * recip) + zp, lo, hi) in T, or with kZpFirst clamp(round(x * recip + zp), ...)
// (per token, as the decomposition writes it). x is widened to float32 first, then to T.
template <bool kZpFirst, typename in_t, typename out_t, typename T>
OPENREG_QUANT_SIMD void quantize_chunk(const in_t* __restrict src, out_t* __restrict dst, int64_t n, T recip, T zp,
                                       T lo, T hi) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = static_cast<T>(static_cast<float>(src[i])) * recip;
    dst[i] = static_cast<out_t>(clamp_to(kZpFirst ? round_even(v + zp) : round_even(v) + zp, lo, hi));
  }
}

// The same with one (recip, zp) per element of the chunk (channel-fastest layouts).
template <bool kZpFirst, typename in_t, typename out_t, typename T>
OPENREG_QUANT_SIMD void quantize_chunk_params(const in_t* __restrict src, out_t* __restrict dst, int64_t n,
                                              const T* __restrict recip, const T* __restrict zp, T lo, T hi) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = static_cast<T>(static_cast<float>(src[i])) * recip[i];
    dst[i] = static_cast<out_t>(clamp_to(kZpFirst ? round_even(v + zp[i]) : round_even(v) + zp[i], lo, hi));
  }
}

// dequantize per channel / per token: ((x - zp) * scale).to(out) with the product in T.
template <typename q_t, typename o_t, typename T>
OPENREG_QUANT_SIMD void dequantize_chunk(const q_t* __restrict src, o_t* __restrict dst, int64_t n, T scale, T zp) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<o_t>((static_cast<T>(src[i]) - zp) * scale);
}

template <typename q_t, typename o_t, typename T>
OPENREG_QUANT_SIMD void dequantize_chunk_params(const q_t* __restrict src, o_t* __restrict dst, int64_t n,
                                                const T* __restrict scale, const T* __restrict zp) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<o_t>((static_cast<T>(src[i]) - zp[i]) * scale[i]);
}

// dequantize per tensor: (x.to(out) - zero_point) * scale; each step rounds to the output type
// (16-bit outputs compute in float32 and round after each op, as the CPU's kernels do).
template <typename q_t, typename o_t>
OPENREG_QUANT_SIMD void dequantize_tensor_chunk(const q_t* __restrict src, o_t* __restrict dst, int64_t n,
                                                at::opmath_type<o_t> scale, at::opmath_type<o_t> zp) {
  using op_t = at::opmath_type<o_t>;
  for (int64_t i = 0; i < n; ++i) {
    const o_t shifted = static_cast<o_t>(static_cast<op_t>(static_cast<o_t>(src[i])) - zp);
    dst[i] = static_cast<o_t>(static_cast<op_t>(shifted) * scale);
  }
}

// Per-tensor quantize, in float32 (the Python scale and zero point are float32 scalars in the
// multiply and the add).
template <typename in_t, typename out_t>
void quantize_tensor_loop(const at::Tensor& x, const at::Tensor& y, float inv, float zp, float lo, float hi) {
  const in_t* src = x.const_data_ptr<in_t>();
  out_t* dst = y.mutable_data_ptr<out_t>();
  at::parallel_for(0, x.numel(), kGrain,
                   [&](int64_t b, int64_t e) { quantize_chunk<false>(src + b, dst + b, e - b, inv, zp, lo, hi); });
}

// The CPU's kernels take the two Python scalars differently for 16-bit outputs: the subtraction
// first rounds the zero point to the output type (x.to(bf16) - 54185 subtracts 54272), the
// multiplication uses the scale in float32.
template <typename q_t, typename o_t>
void dequantize_tensor_loop(const at::Tensor& x, const at::Tensor& y, double scale, double zp) {
  using op_t = at::opmath_type<o_t>;
  const q_t* src = x.const_data_ptr<q_t>();
  o_t* dst = y.mutable_data_ptr<o_t>();
  const op_t s = static_cast<op_t>(scale), z = static_cast<op_t>(static_cast<o_t>(zp));
  at::parallel_for(0, x.numel(), kGrain,
                   [&](int64_t b, int64_t e) { dequantize_tensor_chunk(src + b, dst + b, e - b, s, z); });
}

// Runs the elements of a dense layout whose group (channel, token) of element i is
// (i / inner) % groups: blocks of `inner` elements share a group (block(i0, n, c)); with inner == 1
// the group is the fastest index and rows of `groups` elements take the parameter arrays (row(i0)).
template <typename Block, typename Row>
void for_each_group(int64_t numel, int64_t groups, int64_t inner, Block block, Row row) {
  if (numel == 0) return;
  if (groups == 1) {  // one (scale, zero point) for all: plain chunks
    at::parallel_for(0, numel, kGrain, [&](int64_t b, int64_t e) { block(b, e - b, 0); });
    return;
  }
  if (inner == 1) {
    at::parallel_for(0, numel / groups, std::max<int64_t>(1, kGrain / groups), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) row(r * groups);
    });
    return;
  }
  at::parallel_for(0, numel / inner, std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) block(blk * inner, inner, blk % groups);
  });
}

// Per-channel (kZpFirst = false) and per-token (true) quantize; `recip` and `zp` hold T values.
template <bool kZpFirst, typename in_t, typename out_t, typename T>
void quantize_group_loop(const at::Tensor& x, const at::Tensor& y, const T* recip, const T* zp, int64_t groups,
                         int64_t inner, T lo, T hi) {
  const in_t* src = x.const_data_ptr<in_t>();
  out_t* dst = y.mutable_data_ptr<out_t>();
  for_each_group(
      x.numel(), groups, inner,
      [&](int64_t i, int64_t n, int64_t c) { quantize_chunk<kZpFirst>(src + i, dst + i, n, recip[c], zp[c], lo, hi); },
      [&](int64_t i) { quantize_chunk_params<kZpFirst>(src + i, dst + i, groups, recip, zp, lo, hi); });
}

// Per-channel and per-token dequantize.
template <typename q_t, typename o_t, typename T>
void dequantize_group_loop(const at::Tensor& x, const at::Tensor& y, const T* scale, const T* zp, int64_t groups,
                           int64_t inner) {
  const q_t* src = x.const_data_ptr<q_t>();
  o_t* dst = y.mutable_data_ptr<o_t>();
  for_each_group(
      x.numel(), groups, inner,
      [&](int64_t i, int64_t n, int64_t c) { dequantize_chunk(src + i, dst + i, n, scale[c], zp[c]); },
      [&](int64_t i) { dequantize_chunk_params(src + i, dst + i, groups, scale, zp); });
}

}  // namespace openreg_quant
