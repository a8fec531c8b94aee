// The quantizer and dequantizer (SPEC section 2), checked with code written here: an independent
// unpack of the packed layout, the round-trip error bounds of the MLX affine scheme, exact
// reproduction of constant groups and of each group's edge value, and agreement of the reference
// and cpu backends. (Bit-exactness against MLX itself is tests/python/test_mlx_quantize.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/testutil.hpp"

using namespace qsdpa;

namespace {

constexpr DType kTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr int kBits[] = {2, 4, 8};
constexpr int kGroups[] = {32, 64, 128};

// Element d of a packed row, written from the SPEC's words: word d / (32 / bits), bit offset
// (d % (32 / bits)) * bits, low bits first.
uint32_t code_at(const uint32_t* row, int64_t d, int bits) {
  const int64_t per = 32 / bits;
  const uint32_t word = row[d / per];
  const int shift = int(d % per) * bits;
  return (word >> shift) & ((1u << bits) - 1u);
}

struct Quantized {
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
};

Quantized run_quantize(Backend b, DType t, QuantFormat f, int64_t rows, int64_t dim,
                       const std::vector<uint8_t>& w) {
  Quantized q;
  q.packed.assign(size_t(rows * dim * f.bits / 32), 0xdeadbeefu);
  q.scales.assign(size_t(rows * (dim / f.group)) * dtype_size(t), 0xab);
  q.biases.assign(q.scales.size(), 0xcd);
  QuantizeParams p;
  p.dtype = t;
  p.format = f;
  p.rows = rows;
  p.dim = dim;
  p.w = w.data();
  p.packed = q.packed.data();
  p.scales = q.scales.data();
  p.biases = q.biases.data();
  p.backend = b;
  const Status s = quantize(p);
  EXPECT_TRUE(s.ok()) << to_string(b) << ": " << s.message;
  return q;
}

enum class Kind { gauss, constant, outlier, neg_only, pos_only, mixed_magnitude, count };

// One group of G values of a kind, at magnitude `mag`.
std::vector<float> make_group(Kind k, int G, float mag, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(G));
  switch (k) {
    case Kind::gauss: {
      const float off = mag * (4.0f * ud(rng) - 2.0f);
      for (auto& x : g) x = mag * nd(rng) + off;
      break;
    }
    case Kind::constant: {
      const float c = (ud(rng) < 0.5f ? -1.0f : 1.0f) * mag * (0.5f + ud(rng));
      for (auto& x : g) x = c;
      break;
    }
    case Kind::outlier:
      for (auto& x : g) x = mag * nd(rng);
      g[size_t(rng() % size_t(G))] = (ud(rng) < 0.5f ? -1.0f : 1.0f) * mag * (50.0f + 500.0f * ud(rng));
      break;
    case Kind::neg_only:
      for (auto& x : g) x = -mag * (std::fabs(nd(rng)) + ud(rng));
      break;
    case Kind::pos_only:
      for (auto& x : g) x = mag * (std::fabs(nd(rng)) + 0.1f);
      break;
    case Kind::mixed_magnitude:
      for (auto& x : g) x = nd(rng) * std::pow(10.0f, 4.0f * ud(rng) - 2.0f) * mag;
      break;
    case Kind::count:
      break;
  }
  return g;
}

// A [rows, dim] matrix of T values whose groups cycle through the kinds; also returns the kind of
// each group and the values as read back from T (what the quantizer sees).
struct Data {
  std::vector<uint8_t> raw;
  std::vector<float> w;
  std::vector<Kind> kinds;
};

Data make_data(DType t, int64_t rows, int64_t dim, int G, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Data d;
  d.w.resize(size_t(rows * dim));
  const int64_t ngroups = rows * dim / G;
  for (int64_t g = 0; g < ngroups; ++g) {
    const Kind k = Kind(g % int64_t(Kind::count));
    const float mag = std::pow(10.0f, 6.0f * ud(rng) - 3.0f);  // 1e-3 .. 1e3
    const auto vals = make_group(k, G, mag, rng);
    const float cap = t == DType::f16 ? 60000.0f : 1e30f;  // stay finite in T
    for (int j = 0; j < G; ++j) d.w[size_t(g * G + j)] = std::clamp(vals[size_t(j)], -cap, cap);
    d.kinds.push_back(k);
  }
  d.raw = test::make_typed(t, rows * dim, [&](int64_t i) { return d.w[size_t(i)]; });
  for (int64_t i = 0; i < rows * dim; ++i) d.w[size_t(i)] = detail::load_f32(d.raw.data(), t, i);
  return d;
}

// Unit roundoff of T, and half the smallest subnormal (the absolute error of rounding to T).
double unit_roundoff(DType t) { return t == DType::f32 ? 0.0 : t == DType::f16 ? 0x1p-11 : 0x1p-8; }
double abs_roundoff(DType t) { return t == DType::f32 ? 0.0 : t == DType::f16 ? 0x1p-25 : 0x1p-134; }

// Checks every element of every group: with s, z the stored (T-rounded) scale and bias and
// w^ = s * q + z,
//   - all elements: |w - w^| <= |s| (one quantization step; the MLX scheme shrinks the step so
//     that the edge is exact, which can leave the far end of a mixed-sign group up to one step
//     short of the grid, see MixedSignGroupCanMissByAlmostOneStep);
//   - groups of one sign, and elements strictly inside the grid (0 < q < n): |w - w^| <= |s| / 2;
//   - the edge (the element of largest magnitude) is reproduced exactly when q0 != 0;
// each up to the rounding of s and z to T and the f32 arithmetic of the quantizer.
void check_round_trip(DType t, QuantFormat f, int64_t rows, int64_t dim, const Data& d,
                      const Quantized& q) {
  const int n = (1 << f.bits) - 1;
  const int64_t ngroups = dim / f.group, words = dim * f.bits / 32;
  const double u = unit_roundoff(t), a = abs_roundoff(t);
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < ngroups; ++g) {
      const int64_t gi = r * ngroups + g;
      const double s = detail::load_f32(q.scales.data(), t, gi);
      const double z = detail::load_f32(q.biases.data(), t, gi);
      const double as = std::fabs(s);
      double lo = INFINITY, hi = -INFINITY;
      for (int j = 0; j < f.group; ++j) {
        lo = std::min(lo, double(d.w[size_t(r * dim + g * f.group + j)]));
        hi = std::max(hi, double(d.w[size_t(r * dim + g * f.group + j)]));
      }
      const bool one_sign = lo >= 0.0 || hi <= 0.0;
      const double edge = std::fabs(lo) > std::fabs(hi) ? lo : hi;
      for (int j = 0; j < f.group; ++j) {
        const int64_t dd = g * f.group + j;
        const double w = d.w[size_t(r * dim + dd)];
        const uint32_t c = code_at(q.packed.data() + r * words, dd, f.bits);
        const double wh = s * double(c) + z;
        const double err = std::fabs(w - wh);
        const double slack = n * (as * u * 1.01 + a) + std::fabs(z) * u * 1.01 + a +
                             4 * 0x1p-24 * (std::fabs(w) + std::fabs(z) + n * as);
        const bool interior = c > 0 && int(c) < n;
        const double bound = (one_sign || interior) ? as / 2 : as;
        bool ok = err <= bound + slack;
        if (w == edge && z != 0.0) ok = ok && err == 0.0;
        if (!ok && ++failures <= 5)
          ADD_FAILURE() << to_string(t) << " bits=" << f.bits << " G=" << f.group << " row " << r
                        << " group " << g << " (kind " << int(d.kinds[size_t(gi)]) << ") elem " << j
                        << ": w=" << w << " code=" << c << " s=" << s << " z=" << z
                        << " |w-w^|=" << err << " > " << bound << " + " << slack
                        << (w == edge ? " (the edge must be exact)" : "");
      }
    }
  EXPECT_EQ(failures, 0);
}

}  // namespace

TEST(Quantize, RoundTripErrorIsBounded) {
  const int64_t rows = 24, dim = 384;
  for (DType t : kTypes)
    for (int bits : kBits)
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        const QuantFormat f{bits, G};
        const Data d = make_data(t, rows, dim, G, 1000 + uint64_t(bits * 1000 + G) + uint64_t(t));
        const Quantized q = run_quantize(Backend::reference, t, f, rows, dim, d.raw);
        check_round_trip(t, f, rows, dim, d, q);
      }
}

TEST(Quantize, ReferenceAndCpuAgreeBitForBit) {
  const int64_t rows = 40, dim = 256;
  for (DType t : kTypes)
    for (int bits : kBits)
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        const QuantFormat f{bits, G};
        const Data d = make_data(t, rows, dim, G, 7 + uint64_t(bits + G));
        const Quantized a = run_quantize(Backend::reference, t, f, rows, dim, d.raw);
        const Quantized b = run_quantize(Backend::cpu, t, f, rows, dim, d.raw);
        EXPECT_EQ(a.packed, b.packed);
        EXPECT_EQ(a.scales, b.scales);
        EXPECT_EQ(a.biases, b.biases);
      }
}

TEST(Quantize, PackedLayoutMatchesSpec) {
  // w = c - n with codes c in [0, n], both ends present: lo = -n is the edge, the scale is exactly
  // 1 and the bias exactly -n, so the stored codes must be c, placed as the SPEC says.
  std::mt19937_64 rng(99);
  for (DType t : kTypes)
    for (int bits : kBits)
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        const int n = (1 << bits) - 1;
        const int64_t rows = 5, dim = 256, ngroups = dim / G, per = 32 / bits;
        std::vector<uint32_t> codes(size_t(rows * dim));
        for (auto& c : codes) c = uint32_t(rng() % uint64_t(n + 1));
        for (int64_t g = 0; g < rows * ngroups; ++g) {
          codes[size_t(g * G + int64_t(rng() % uint64_t(G / 2)))] = 0;
          codes[size_t(g * G + G / 2 + int64_t(rng() % uint64_t(G / 2)))] = uint32_t(n);
        }
        const auto raw = test::make_typed(t, rows * dim, [&](int64_t i) { return float(codes[size_t(i)]) - float(n); });
        const Quantized q = run_quantize(Backend::reference, t, {bits, G}, rows, dim, raw);
        for (int64_t g = 0; g < rows * ngroups; ++g) {
          ASSERT_EQ(detail::load_f32(q.scales.data(), t, g), 1.0f) << "group " << g;
          ASSERT_EQ(detail::load_f32(q.biases.data(), t, g), -float(n)) << "group " << g;
        }
        // Independent packing of the expected codes: element d goes to word d / per at bit
        // (d % per) * bits.
        std::vector<uint32_t> expect(size_t(rows * dim / per), 0u);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < dim; ++d)
            expect[size_t(r * (dim / per) + d / per)] |= codes[size_t(r * dim + d)] << ((d % per) * bits);
        ASSERT_EQ(q.packed, expect);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < dim; ++d)
            ASSERT_EQ(code_at(q.packed.data() + r * (dim / per), d, bits), codes[size_t(r * dim + d)]);
      }
}

TEST(Quantize, HalfwayValuesRoundToEven) {
  // As in PackedLayoutMatchesSpec the scale is 1 and the bias -n (codes 0 and n present), and the
  // other elements sit exactly halfway between two codes: (w - z) / s = c + 0.5 must round to the
  // even one of c and c + 1 (rint), not away from zero.
  std::mt19937_64 rng(5);
  for (DType t : kTypes)
    for (int bits : kBits) {
      if (t == DType::bf16 && bits == 8) continue;  // x.5 near 255 needs 9 significant bits
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        const int n = (1 << bits) - 1;
        const int64_t dim = 256, ngroups = dim / G;
        std::vector<float> w(static_cast<size_t>(dim));
        for (auto& x : w) x = float(rng() % uint64_t(n)) + 0.5f - float(n);  // c + 0.5 - n, c < n
        for (int64_t g = 0; g < ngroups; ++g) {
          w[size_t(g * G)] = -float(n);  // code 0
          w[size_t(g * G + 1)] = 0.0f;   // code n
        }
        const auto raw = test::make_typed(t, dim, [&](int64_t i) { return w[size_t(i)]; });
        for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(detail::load_f32(raw.data(), t, i), w[size_t(i)]);
        const Quantized q = run_quantize(Backend::reference, t, {bits, G}, 1, dim, raw);
        for (int64_t g = 0; g < ngroups; ++g) {
          ASSERT_EQ(detail::load_f32(q.scales.data(), t, g), 1.0f);
          ASSERT_EQ(detail::load_f32(q.biases.data(), t, g), -float(n));
        }
        for (int64_t d = 0; d < dim; ++d) {
          const double x = double(w[size_t(d)]) + n;  // the exact quotient (w - z) / s
          const uint32_t lo = uint32_t(std::floor(x));
          const uint32_t expect = (x == double(lo)) ? lo : (lo % 2 == 0 ? lo : lo + 1);
          ASSERT_EQ(code_at(q.packed.data(), d, bits), expect) << "element " << d << " (w = " << w[size_t(d)] << ")";
        }
      }
    }
}

TEST(Quantize, ConstantGroupsAreExact) {
  // A constant group: the range is 0, the scale floors at 1e-7, the edge is the constant, every
  // code is 0 and the bias is the constant itself, so dequantization is exact. Beyond 3.4e31
  // (f32 and bf16 only) edge / 1e-7 overflows: the scale becomes -0 and the codes must still be 0.
  for (DType t : kTypes)
    for (int bits : kBits)
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        std::vector<float> consts = {0.0f, 1.0f, -1.0f, 0.1f, -3.5f, 1e-6f, -7e-8f, 1000.0f, -60000.0f};
        if (t != DType::f16) consts.insert(consts.end(), {1e32f, -1e32f, 3e38f, 4e-7f});
        const int64_t rows = int64_t(consts.size()), dim = 2 * G;
        const auto raw = test::make_typed(t, rows * dim, [&](int64_t i) { return consts[size_t(i / dim)]; });
        const Quantized q = run_quantize(Backend::reference, t, {bits, G}, rows, dim, raw);
        for (uint32_t w : q.packed) ASSERT_EQ(w, 0u);
        DequantizeParams dp;
        dp.dtype = t;
        dp.format = {bits, G};
        dp.rows = rows;
        dp.dim = dim;
        dp.packed = q.packed.data();
        dp.scales = q.scales.data();
        dp.biases = q.biases.data();
        std::vector<uint8_t> back(raw.size(), 0xee);
        dp.w = back.data();
        for (Backend b : {Backend::reference, Backend::cpu}) {
          dp.backend = b;
          ASSERT_TRUE(dequantize(dp).ok());
          for (int64_t i = 0; i < rows * dim; ++i)
            ASSERT_EQ(detail::load_f32(back.data(), t, i), detail::load_f32(raw.data(), t, i))
                << to_string(b) << " element " << i;
        }
      }
}

TEST(Quantize, MixedSignGroupCanMissByAlmostOneStep) {
  // Why the round-trip bound above is one step, not half a step, for mixed-sign groups: with
  // lo = -1 and hi just under 1, bits = 4, the first scale is (hi - lo) / 15 ~= 0.1332, q0 =
  // rint(-1 / 0.1332) = -8 and the scale shrinks to 1/8; the grid then ends at -1 + 15/8 = 0.875,
  // and hi is clamped there. MLX 0.32 gives the same (scale 0.125, bias -1, error 0.1223).
  const int G = 32;
  std::vector<float> w(G);
  for (int j = 0; j < G; ++j) w[size_t(j)] = -1.0f + (0.99734f + 1.0f) * float(j) / float(G - 1);
  const auto raw = test::make_typed(DType::f32, G, [&](int64_t i) { return w[size_t(i)]; });
  const Quantized q = run_quantize(Backend::reference, DType::f32, {4, G}, 1, G, raw);
  const float s = detail::load_f32(q.scales.data(), DType::f32, 0);
  const float z = detail::load_f32(q.biases.data(), DType::f32, 0);
  EXPECT_EQ(s, 0.125f);
  EXPECT_EQ(z, -1.0f);
  const float last = s * float(code_at(q.packed.data(), G - 1, 4)) + z;
  const float err = std::fabs(w[G - 1] - last);
  EXPECT_GT(err, s / 2);
  EXPECT_LE(err, s);
}

TEST(Quantize, DequantizeIsScaleTimesCodePlusBias) {
  // dequantize() writes round_T(s * q + z) computed in f32 (with or without a fused multiply-add)
  // from the stored s and z, for every element, on both host backends.
  for (DType t : kTypes)
    for (int bits : kBits)
      for (int G : kGroups) {
        SCOPED_TRACE(std::string(to_string(t)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(G));
        const int64_t rows = 8, dim = 256, words = dim * bits / 32;
        const Data d = make_data(t, rows, dim, G, 31 + uint64_t(bits * G));
        const Quantized q = run_quantize(Backend::reference, t, {bits, G}, rows, dim, d.raw);
        for (Backend b : {Backend::reference, Backend::cpu}) {
          DequantizeParams dp;
          dp.dtype = t;
          dp.format = {bits, G};
          dp.rows = rows;
          dp.dim = dim;
          dp.packed = q.packed.data();
          dp.scales = q.scales.data();
          dp.biases = q.biases.data();
          std::vector<uint8_t> back(d.raw.size() + 16, 0xee);  // 16 guard bytes
          dp.w = back.data();
          dp.backend = b;
          ASSERT_TRUE(dequantize(dp).ok()) << to_string(b);
          for (size_t i = d.raw.size(); i < back.size(); ++i) ASSERT_EQ(back[i], 0xee) << "wrote past w";
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t e = 0; e < dim; ++e) {
              const int64_t gi = r * (dim / G) + e / G;
              const float s = detail::load_f32(q.scales.data(), t, gi);
              const float z = detail::load_f32(q.biases.data(), t, gi);
              const float c = float(code_at(q.packed.data() + r * words, e, bits));
              const float prod = s * c;
              const float plain = detail::round_to(t, prod + z);
              const float fused = detail::round_to(t, std::fma(s, c, z));
              const float got = detail::load_f32(back.data(), t, r * dim + e);
              ASSERT_TRUE(got == plain || got == fused)
                  << to_string(b) << " row " << r << " elem " << e << ": got " << got << ", expected "
                  << plain << " (or " << fused << " fused)";
            }
        }
      }
}

TEST(Quantize, ZeroRowsWritesNothing) {
  for (Backend b : {Backend::reference, Backend::cpu}) {
    QuantizeParams p;
    p.dtype = DType::f16;
    p.rows = 0;
    p.dim = 128;
    p.backend = b;  // every pointer null: nothing may be touched
    EXPECT_TRUE(quantize(p).ok()) << to_string(b);
    DequantizeParams dp;
    dp.dtype = DType::bf16;
    dp.rows = 0;
    dp.dim = 64;
    dp.backend = b;
    EXPECT_TRUE(dequantize(dp).ok()) << to_string(b);
  }
}
