// The C++ meta kernels of the generic path (see OpenRegNativeMeta.cpp).
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/operator_name.h>

#include <type_traits>
#include <unordered_map>

namespace c10::openreg {

using NativeMetaTable = std::unordered_map<c10::OperatorName, c10::KernelFunction>;

// Adds PyTorch's C++ meta function `get` selects for operator `Op` (an at::_ops struct), if there
// is one whose type is exactly Op's dispatcher signature; the first one added for an operator wins.
template <class Op, class Get>
void add_if_exact(NativeMetaTable& table, Get get) {
  if constexpr (std::is_invocable_v<Get, typename Op::schema*>) {
    table.emplace(c10::OperatorName(Op::name, Op::overload_name),
                  c10::KernelFunction::makeFromUnboxedRuntimeFunction(get(static_cast<typename Op::schema*>(nullptr))));
  }
}

// Selects the overload of at::meta::FN whose type is the operator's signature (no conversions).
#define OR_NATIVE_META(OP, FN)                                                                               \
  add_if_exact<at::_ops::OP>(table, [](auto* type) -> decltype(static_cast<decltype(type)>(&at::meta::FN)) { \
    return static_cast<decltype(type)>(&at::meta::FN);                                                       \
  });

// Generated (gen_native_meta.py): every C++ meta function of ATen with an exact-signature match.
void add_upstream_meta_kernels(NativeMetaTable& table);

}  // namespace c10::openreg
