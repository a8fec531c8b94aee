// The host conversions of src/core/half.hpp against independent ones: the compiler's _Float16 for
// IEEE binary16, and a double-precision nearest-even rounding written here for bfloat16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/testutil.hpp"

using namespace qsdpa;
using detail::bits_f32;
using detail::f32_bits;

namespace {

// Several million f32 inputs that stress a conversion to a 16-bit type: uniformly random bit
// patterns (every exponent, NaNs and infinities included), values in and around the binary16
// subnormal range, every exact halfway point between neighbouring binary16 and bfloat16 values
// and its two f32 neighbours, and the overflow thresholds.
std::vector<uint32_t> hard_floats() {
  std::vector<uint32_t> v;
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 3000000; ++i) v.push_back(uint32_t(rng()));
  // f32 exponents 100..115 cover the binary16 subnormals (2^-24 .. 2^-14) and the first normals.
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t e = 100u + uint32_t(rng() % 16u);
    v.push_back(uint32_t(rng() & 0x80000000u) | (e << 23) | uint32_t(rng() & 0x7fffffu));
  }
  // Halfway points of binary16: the f32 bit patterns where the 13 dropped mantissa bits are
  // 1000000000000, plus the neighbours; in the subnormal range the tie position moves, so take
  // the exact midpoint of neighbouring binary16 values computed in double.
  // Past the largest binary16 (65504) the next value would be 2^16: the midpoint 65520 is where
  // rounding goes to infinity.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double a = detail::f16_to_f32(uint16_t(h));
    const double b = h + 1 == 0x7c00u ? 65536.0 : double(detail::f16_to_f32(uint16_t(h + 1)));
    const uint32_t mid = f32_bits(float((a + b) / 2));  // exact: binary16 midpoints fit in f32
    for (uint32_t s : {0u, 0x80000000u})
      for (uint32_t m : {mid - 1, mid, mid + 1}) v.push_back(m | s);
  }
  // Halfway points of bfloat16 (the 16 dropped bits are 0x8000) and neighbours.
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u, 0x0000u, 0xffffu}) v.push_back((hi << 16) | lo);
  // Overflow thresholds of binary16 (65504 is the largest; 65520 is the halfway point to 2^16).
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65520.01f, 65536.0f, 1e10f, INFINITY, 5.96e-8f,
                  2.98e-8f, 2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f, 6.1e-5f})
    for (float s : {1.0f, -1.0f}) v.push_back(f32_bits(s * f));
  // NaNs: quiet and signalling, with payloads that do and do not survive in 10 bits.
  for (uint32_t n : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0x7f802000u, 0x7fc00001u,
                     0x7f801fffu})
    for (uint32_t s : {0u, 0x80000000u}) v.push_back(n | s);
  return v;
}

#ifdef __FLT16_MAX__
uint16_t f16_bits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
_Float16 bits_f16(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return h;
}
#endif

// bfloat16 round-to-nearest-even, written independently: take the two bfloat16 values that
// bracket x (truncation and the next one away from zero), compare the distances in double (exact
// for f32 inputs), break ties towards the even one. The value past the largest finite bfloat16
// is 2^128, so inputs at least halfway there round to infinity, as IEEE specifies.
uint16_t bf16_rne_double(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  const uint16_t lo = uint16_t(au >> 16);  // truncated magnitude
  const uint16_t hi = uint16_t(lo + 1);
  const double ax = std::fabs(double(x));
  const double vlo = double(bits_f32(uint32_t(lo) << 16));
  const double vhi = hi == 0x7f80u ? std::ldexp(1.0, 128) : double(bits_f32(uint32_t(hi) << 16));
  const double dlo = ax - vlo, dhi = vhi - ax;
  uint16_t r;
  if (dlo < dhi) r = lo;
  else if (dhi < dlo) r = hi;
  else r = (lo & 1u) ? hi : lo;
  return uint16_t(sign | r);
}

bool f32_is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

}  // namespace

TEST(Half, F16ToF32AllPatternsMatchCompiler) {
#ifdef __FLT16_MAX__
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float ours = detail::f16_to_f32(uint16_t(h));
    const float theirs = float(bits_f16(uint16_t(h)));
    if (f32_bits(ours) != f32_bits(theirs) && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "f16 0x" << h << ": ours 0x" << f32_bits(ours) << ", compiler 0x"
                    << f32_bits(theirs);
  }
  EXPECT_EQ(mismatches, 0);
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(Half, F32ToF16MatchesCompiler) {
#ifdef __FLT16_MAX__
  const std::vector<uint32_t> in = hard_floats();
  int mismatches = 0;
  for (uint32_t u : in) {
    const uint16_t ours = detail::f32_to_f16(bits_f32(u));
    const uint16_t theirs = f16_bits(_Float16(bits_f32(u)));
    if (ours != theirs && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "f32 0x" << u << " (" << bits_f32(u) << "): ours 0x" << ours
                    << ", compiler 0x" << theirs;
  }
  EXPECT_EQ(mismatches, 0) << "of " << in.size() << " inputs";
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(Half, F16RoundTripIsExact) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    const uint16_t back = detail::f32_to_f16(detail::f16_to_f32(uint16_t(h)));
    if (nan) {
      ASSERT_EQ(back & 0x7c00u, 0x7c00u) << std::hex << h;
      ASSERT_NE(back & 0x3ffu, 0u) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  const std::vector<uint32_t> in = hard_floats();
  int mismatches = 0;
  for (uint32_t u : in) {
    const uint16_t ours = detail::f32_to_bf16(bits_f32(u));
    if (f32_is_nan(u)) {
      // A NaN stays a NaN (quiet); its payload is not specified.
      if (!((ours & 0x7f80u) == 0x7f80u && (ours & 0x7fu) != 0) && ++mismatches <= 10)
        ADD_FAILURE() << std::hex << "NaN 0x" << u << " became 0x" << ours;
      continue;
    }
    const uint16_t expect = bf16_rne_double(bits_f32(u));
    if (ours != expect && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "f32 0x" << u << " (" << bits_f32(u) << "): ours 0x" << ours
                    << ", expected 0x" << expect;
  }
  EXPECT_EQ(mismatches, 0) << "of " << in.size() << " inputs";
}

TEST(Half, Bf16TiesGoToEven) {
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (bfloat16 has 7 stored bits).
  EXPECT_EQ(detail::f32_to_bf16(1.0f + 0x1p-8f), 0x3f80u);                // down to even 1.0
  EXPECT_EQ(detail::f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82u);            // up to even 1 + 2^-6
  EXPECT_EQ(detail::f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80u);
  EXPECT_EQ(detail::f32_to_bf16(bits_f32(0x7f7f8000u)), 0x7f80u);         // tie at the top: inf
  EXPECT_EQ(detail::f32_to_bf16(bits_f32(0x7f7f7fffu)), 0x7f7fu);         // just below: max
  EXPECT_EQ(detail::f32_to_bf16(bits_f32(0x00008000u)), 0x0000u);         // subnormal tie: even 0
  EXPECT_EQ(detail::f32_to_bf16(bits_f32(0x00018000u)), 0x0002u);         // subnormal tie: up
}

TEST(Half, Bf16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = detail::bf16_to_f32(uint16_t(h));
    ASSERT_EQ(f32_bits(f), h << 16) << std::hex << h;
    const uint16_t back = detail::f32_to_bf16(f);
    if (f32_is_nan(h << 16))
      ASSERT_TRUE((back & 0x7f80u) == 0x7f80u && (back & 0x7fu) != 0) << std::hex << h;
    else
      ASSERT_EQ(back, h) << std::hex << h;
  }
}

TEST(Half, LoadStoreRoundTo) {
  // store_f32 / load_f32 / round_to agree with the scalar conversions for every type.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = nd(rng);
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      alignas(4) uint8_t buf[12] = {};
      detail::store_f32(buf, t, 1, x);
      const float back = detail::load_f32(buf, t, 1);
      EXPECT_EQ(f32_bits(back), f32_bits(detail::round_to(t, x)));
      const float expect = t == DType::f32   ? x
                           : t == DType::f16 ? detail::f16_to_f32(detail::f32_to_f16(x))
                                             : detail::bf16_to_f32(detail::f32_to_bf16(x));
      EXPECT_EQ(f32_bits(back), f32_bits(expect));
      const size_t sz = dtype_size(t);
      for (size_t b = 0; b < sizeof(buf); ++b) {
        if (b < sz || b >= 2 * sz) {
          EXPECT_EQ(buf[b], 0u) << "store_f32 wrote outside element 1";
        }
      }
    }
  }
}
