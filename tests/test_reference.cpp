// The reference backend (the oracle every other backend is held to) against a second, independent
// formulation of SPEC section 3 written here: dequantize all of K and V to double matrices first,
// materialize the full [Lq, N] score matrix of each head with hidden keys set to -inf, take a plain
// softmax with the sink as one extra column, then multiply by V.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/testutil.hpp"

using namespace qsdpa;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Element d of a packed row: word d / (32 / bits), bit offset (d % (32 / bits)) * bits.
uint32_t code_at(const uint32_t* row, int64_t d, int bits) {
  const int64_t per = 32 / bits;
  return (row[d / per] >> (int(d % per) * bits)) & ((1u << bits) - 1u);
}

// The whole cache [B * Hkv * N, D] as doubles.
std::vector<double> dequantize_all(const KVCache& c, DType t, int64_t rows, int64_t D) {
  std::vector<double> m(size_t(rows * D));
  const int64_t words = D * c.format.bits / 32, groups = D / c.format.group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t g = r * groups + d / c.format.group;
      const double s = detail::load_f32(c.scales, t, g), z = detail::load_f32(c.biases, t, g);
      m[size_t(r * D + d)] = s * double(code_at(c.packed + r * words, d, c.format.bits)) + z;
    }
  return m;
}

// SPEC section 3, the matrix way. Returns [B, Hq, Lq, D] doubles.
std::vector<double> matrix_attention(const AttentionParams& p) {
  const int64_t B = p.B, Hq = p.Hq, Hkv = p.Hkv, Lq = p.Lq, N = p.N, D = p.D;
  const std::vector<double> K = dequantize_all(p.k, p.dtype, B * Hkv * N, D);
  const std::vector<double> V = dequantize_all(p.v, p.dtype, B * Hkv * N, D);
  const double scale = p.scale != 0.0f ? double(p.scale) : 1.0 / std::sqrt(double(D));
  const int64_t cols = N + (p.sinks ? 1 : 0);  // the sink is column N
  std::vector<double> out(size_t(B * Hq * Lq * D), 0.0);
  std::vector<double> S(size_t(Lq * cols));

  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv = h / (Hq / Hkv);
      const double* Kh = K.data() + (b * Hkv + kv) * N * D;
      const double* Vh = V.data() + (b * Hkv + kv) * N * D;
      // Scores with masks.
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t row = (b * Hq + h) * Lq + i;
        const int64_t pos = N - Lq + i;
        for (int64_t t = 0; t < N; ++t) {
          double x = 0;
          for (int64_t d = 0; d < D; ++d) x += double(detail::load_f32(p.q, p.dtype, row * D + d)) * Kh[t * D + d];
          x *= scale;
          bool hidden = t > pos || (p.window > 0 && t <= pos - p.window);
          const int64_t mi = row * N + t;
          if (p.bool_mask) {
            const uint32_t m = p.bool_mask_type == BoolMaskType::u32
                                   ? static_cast<const uint32_t*>(p.bool_mask)[mi]
                                   : static_cast<const uint8_t*>(p.bool_mask)[mi];
            hidden = hidden || m == 0;
          }
          if (p.float_mask) {
            const double f = detail::load_f32(p.float_mask, p.dtype, mi);
            if (f == -kInf) hidden = true;
            else x += f;
          }
          S[size_t(i * cols + t)] = hidden ? -kInf : x;
        }
        if (p.sinks) S[size_t(i * cols + N)] = p.sinks[h];
      }
      // Row softmax over the columns (keys + sink), then P[:, :N] * V.
      for (int64_t i = 0; i < Lq; ++i) {
        double* s = S.data() + i * cols;
        bool any = false;
        for (int64_t t = 0; t < N; ++t) any = any || s[t] != -kInf;
        double* o = out.data() + ((b * Hq + h) * Lq + i) * D;
        if (!any) continue;  // no visible key: zeros, sink or not
        double m = -kInf;
        for (int64_t t = 0; t < cols; ++t) m = std::max(m, s[t]);
        double sum = 0;
        for (int64_t t = 0; t < cols; ++t) sum += (s[t] == -kInf) ? 0.0 : std::exp(s[t] - m);
        for (int64_t t = 0; t < N; ++t) {
          if (s[t] == -kInf) continue;
          const double w = std::exp(s[t] - m) / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += w * Vh[t * D + d];
        }
      }
    }
  return out;
}

double unit_roundoff(DType t) { return t == DType::f32 ? 0x1p-24 : t == DType::f16 ? 0x1p-11 : 0x1p-8; }
double abs_roundoff(DType t) { return t == DType::f32 ? 0x1p-150 : t == DType::f16 ? 0x1p-25 : 0x1p-134; }

// Reference (double and T-rounded) against the matrix formulation.
void check_case(const test::Case& c, float scale = 0.0f) {
  SCOPED_TRACE(c.str() + " scale=" + std::to_string(scale));
  test::Problem pr(c);
  AttentionParams p = pr.params(Backend::reference);
  p.scale = scale;
  const std::vector<double> expect = matrix_attention(p);
  std::vector<double> got(expect.size(), std::nan(""));
  detail::reference_attention_f64(p, got.data());

  const int64_t rows = c.B * c.Hq * c.Lq;
  for (int64_t r = 0; r < rows; ++r) {
    double e2 = 0, n2 = 0;
    for (int64_t d = 0; d < c.D; ++d) {
      const double a = got[size_t(r * c.D + d)], x = expect[size_t(r * c.D + d)];
      e2 += (a - x) * (a - x);
      n2 += x * x;
    }
    ASSERT_TRUE(std::sqrt(e2) <= 1e-9 * std::sqrt(n2)) << "row " << r << ": ||ref - matrix|| = "
                                                       << std::sqrt(e2) << ", ||matrix|| = " << std::sqrt(n2);
  }

  // The public entry point writes the same values rounded to T (via f32), every element.
  pr.poison();
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(s.backend, Backend::reference);
  const double u = unit_roundoff(c.dtype) + 0x1p-24, a = abs_roundoff(c.dtype) + 0x1p-150;
  for (int64_t i = 0; i < rows * c.D; ++i) {
    const double o = detail::load_f32(pr.out.data(), c.dtype, i), x = expect[size_t(i)];
    ASSERT_TRUE(std::fabs(o - x) <= u * std::fabs(x) * 1.0001 + a) << "element " << i << ": " << o << " vs " << x;
  }
}

struct Shape {
  int64_t B, Hq, Hkv, Lq, N, D;
  bool sinks;
  int64_t window;
  test::MaskKind mask;
  bool fmask;
};

// Small cases covering GQA, Lq > 1 (including Lq == N), sinks, windows (inside and beyond N),
// both bool-mask types, the float mask and their combinations.
const Shape kShapes[] = {
    {1, 4, 1, 1, 33, 64, false, 0, test::MaskKind::none, false},
    {2, 4, 2, 3, 17, 64, true, 0, test::MaskKind::none, false},
    {1, 2, 2, 5, 20, 128, false, 4, test::MaskKind::none, false},
    {2, 6, 3, 4, 12, 64, true, 3, test::MaskKind::u8, false},
    {1, 4, 2, 2, 25, 128, false, 0, test::MaskKind::u32, true},
    {1, 3, 1, 7, 7, 64, true, 0, test::MaskKind::none, true},
    {2, 2, 1, 2, 9, 64, true, 20, test::MaskKind::u8, true},
    {1, 1, 1, 1, 1, 64, true, 0, test::MaskKind::none, false},
    {1, 8, 2, 3, 30, 256, true, 7, test::MaskKind::u32, true},
    {1, 2, 1, 1, 0, 64, true, 0, test::MaskKind::none, false},  // empty cache
    {1, 2, 1, 6, 6, 64, false, 1, test::MaskKind::u8, false},   // window 1: only the diagonal
};

}  // namespace

TEST(Reference, MatchesMatrixFormulationOnShapes) {
  uint64_t seed = 1;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (size_t i = 0; i < std::size(kShapes); ++i) {
      const Shape& s = kShapes[i];
      test::Case c;
      c.dtype = t;
      c.B = s.B, c.Hq = s.Hq, c.Hkv = s.Hkv, c.Lq = s.Lq, c.N = s.N, c.D = s.D;
      c.sinks = s.sinks, c.window = s.window, c.bool_mask = s.mask, c.float_mask = s.fmask;
      constexpr int bits[] = {2, 4, 8}, groups[] = {32, 64, 128};
      const auto fit = [&](int G) { return s.D % G == 0 ? G : 32; };
      c.kf = {bits[i % 3], fit(groups[(i / 3) % 3])};
      c.vf = {bits[(i + 2) % 3], fit(groups[(i + 1) % 3])};
      c.seed = seed++;
      check_case(c);
      if (HasFatalFailure()) return;
    }
}

TEST(Reference, MatchesMatrixFormulationOnAllFormats) {
  // Every dtype x bits x group for K, with V in a different format, on a GQA / Lq > 1 / sink /
  // masked problem.
  uint64_t seed = 100;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int bits : {2, 4, 8})
      for (int G : {32, 64, 128}) {
        test::Case c;
        c.dtype = t;
        c.B = 1, c.Hq = 4, c.Hkv = 2, c.Lq = 3, c.N = 19, c.D = 128;
        c.kf = {bits, G};
        c.vf = {bits == 8 ? 2 : bits * 2, G == 32 ? 128 : G / 2};
        c.sinks = (bits != 4);
        c.bool_mask = G == 64 ? test::MaskKind::u32 : test::MaskKind::u8;
        c.float_mask = (G != 32);
        c.seed = seed++;
        check_case(c);
        if (HasFatalFailure()) return;
      }
}

TEST(Reference, ExplicitScale) {
  test::Case c;
  c.dtype = DType::f32;
  c.Hq = 2, c.Hkv = 1, c.Lq = 2, c.N = 15, c.D = 64, c.sinks = true;
  check_case(c, 0.37f);
  check_case(c, 2.0f);
}
