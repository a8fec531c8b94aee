// The MLX affine layout (SPEC section 2): element d of a row sits in word d / (32 / bits) at bit
// offset (d % (32 / bits)) * bits, low bits first; group g = d / group has one scale and one bias.
#pragma once

#include <cstdint>

namespace qsdpa::detail {

constexpr int values_per_word(int bits) { return 32 / bits; }

inline uint32_t unpack_value(const uint32_t* row, int64_t d, int bits) {
  const int per = 32 / bits;
  const uint32_t mask = (bits == 32) ? 0xffffffffu : ((1u << bits) - 1u);
  return (row[d / per] >> ((d % per) * bits)) & mask;
}

// Writes code c (< 2^bits) as element d of a row, in the layout unpack_value() reads.
inline void pack_value(uint32_t* row, int64_t d, int bits, uint32_t c) {
  const int per = 32 / bits, shift = int(d % per) * bits;
  const uint32_t mask = ((1u << bits) - 1u) << shift;
  row[d / per] = (row[d / per] & ~mask) | ((c << shift) & mask);
}

constexpr bool supported_bits(int b) { return b == 2 || b == 4 || b == 8; }
constexpr bool supported_group(int g) { return g == 32 || g == 64 || g == 128; }
constexpr bool supported_head_dim(int64_t d) { return d >= 32 && d <= 512 && d % 32 == 0; }

}  // namespace qsdpa::detail
