// Introspection of the generic operator path (OpenRegFallback.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace c10::openreg {

// How many times each operator ("name.overload") went through the generic path.
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void reset_fallback_counts();
// In strict mode an operator without a native openreg kernel raises.
void set_strict_mode(bool strict);
bool strict_mode();

}  // namespace c10::openreg
