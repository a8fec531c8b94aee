// Host conversions between f32 and the 16-bit element types (IEEE binary16 and bfloat16), with
// round-to-nearest-even, as the CUDA intrinsics and MLX's casts do. Shared by every host backend.
#pragma once

#include <cstdint>
#include <cstring>

#include "qsdpa/qsdpa.hpp"

namespace qsdpa::detail {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    // inf / NaN; a signalling NaN comes out quiet, as IEEE conversions (and F16C) make it
    u = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    u = sign;  // +-0
  } else {
    // subnormal: value = mant * 2^-24; normalize
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    u = sign | (uint32_t(112 - e) << 23) | (mant << 13);
  }
  return bits_f32(u);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((au >> 13) & 0x3ffu));  // NaN
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (au >= 0x38800000u) {  // normal half range (>= 2^-14)
    uint32_t m = au + 0xfffu + ((au >> 13) & 1u);  // RNE on the 13 dropped bits
    return uint16_t(sign | uint16_t((m - 0x38000000u) >> 13));
  }
  if (au < 0x33000000u) return sign;  // below half of the smallest subnormal (2^-25): zero
  // subnormal half: value = round(x * 2^24) with RNE
  const uint32_t e = au >> 23;                    // biased f32 exponent, 102..112
  const uint32_t mant = (au & 0x7fffffu) | 0x800000u;  // 24-bit significand
  const uint32_t shift = 126u - e;                // x * 2^24 = mant * 2^(e - 127 - 23 + 24)
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

// Read element i of a T-typed buffer as f32, and write an f32 rounded to T.
inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

inline void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
  }
}

// Round an f32 to T and back (what storing to T and reading again gives).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::f32:
      return v;
    case DType::f16:
      return f16_to_f32(f32_to_f16(v));
    case DType::bf16:
      return bf16_to_f32(f32_to_bf16(v));
  }
  return v;
}

}  // namespace qsdpa::detail
