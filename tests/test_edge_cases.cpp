// Edge cases of SPEC section 3 on every host backend: no visible key gives zeros (with or without a
// sink), a leading -inf in the float mask gives no NaN, windows at and beyond N, Lq == N, and
// every element of `out` is written and nothing past it. A backend that answers `unsupported`
// is skipped with its reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/testutil.hpp"

using namespace qsdpa;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class EdgeCases : public ::testing::TestWithParam<Backend> {};

// Runs attention; skips the test when the backend does not implement the case.
#define RUN_OR_SKIP(params)                                                                     \
  do {                                                                                          \
    const Status st_ = attention(params);                                                       \
    if (st_.code == StatusCode::unsupported) GTEST_SKIP() << "backend says: " << st_.message;  \
    ASSERT_TRUE(st_.ok()) << to_string(st_.code) << ": " << st_.message;                        \
  } while (0)

// Row r of out ([rows, D] of T) is all zeros.
bool row_is_zero(const test::Problem& pr, int64_t r) {
  for (int64_t d = 0; d < pr.c.D; ++d)
    if (detail::load_f32(pr.out.data(), pr.c.dtype, r * pr.c.D + d) != 0.0f) return false;
  return true;
}

bool has_nan(const test::Problem& pr) {
  const int64_t n = pr.c.B * pr.c.Hq * pr.c.Lq * pr.c.D;
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(detail::load_f32(pr.out.data(), pr.c.dtype, i))) return true;
  return false;
}

void set_bool_mask(test::Problem& pr, const std::function<bool(int64_t row, int64_t t)>& keep) {
  const int64_t rows = pr.c.B * pr.c.Hq * pr.c.Lq, N = pr.c.N;
  if (pr.c.bool_mask == test::MaskKind::u32) {
    pr.bool_mask.assign(size_t(rows * N) * 4, 0);
    auto* m = reinterpret_cast<uint32_t*>(pr.bool_mask.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < N; ++t) m[r * N + t] = keep(r, t) ? 0x80000000u : 0u;  // high bit only
  } else {
    pr.bool_mask.assign(size_t(rows * N), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < N; ++t) pr.bool_mask[size_t(r * N + t)] = keep(r, t) ? 1 : 0;
  }
}

void set_float_mask(test::Problem& pr, const std::function<float(int64_t row, int64_t t)>& f) {
  const int64_t rows = pr.c.B * pr.c.Hq * pr.c.Lq, N = pr.c.N;
  pr.float_mask = test::make_typed(pr.c.dtype, rows * N, [&](int64_t i) { return f(i / N, i % N); });
}

test::Case base_case(DType t = DType::f16) {
  test::Case c;
  c.dtype = t;
  c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 3, c.N = 21, c.D = 64;
  return c;
}

}  // namespace

TEST_P(EdgeCases, EmptyCacheGivesZeros) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (bool sinks : {false, true})
      for (int64_t Lq : {1, 3}) {
        test::Case c = base_case(t);
        c.N = 0, c.Lq = Lq, c.sinks = sinks;
        SCOPED_TRACE(c.str());
        test::Problem pr(c);
        AttentionParams p = pr.params(GetParam());
        p.k.packed = nullptr, p.k.scales = nullptr, p.k.biases = nullptr;  // nothing to read
        p.v.packed = nullptr, p.v.scales = nullptr, p.v.biases = nullptr;
        RUN_OR_SKIP(p);
        for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r) ASSERT_TRUE(row_is_zero(pr, r)) << "row " << r;
      }
}

TEST_P(EdgeCases, EverythingBoolMaskedGivesZeros) {
  for (test::MaskKind mk : {test::MaskKind::u8, test::MaskKind::u32})
    for (bool sinks : {false, true}) {
      test::Case c = base_case();
      c.bool_mask = mk, c.sinks = sinks;
      SCOPED_TRACE(c.str());
      test::Problem pr(c);
      set_bool_mask(pr, [](int64_t, int64_t) { return false; });
      AttentionParams p = pr.params(GetParam());
      RUN_OR_SKIP(p);
      for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r) ASSERT_TRUE(row_is_zero(pr, r)) << "row " << r;
    }
}

TEST_P(EdgeCases, FloatMaskAllNegInfGivesZeros) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (bool sinks : {false, true}) {
      test::Case c = base_case(t);
      c.float_mask = true, c.sinks = sinks;
      SCOPED_TRACE(c.str());
      test::Problem pr(c);
      set_float_mask(pr, [](int64_t, int64_t) { return kNegInf; });
      AttentionParams p = pr.params(GetParam());
      RUN_OR_SKIP(p);
      for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r) ASSERT_TRUE(row_is_zero(pr, r)) << "row " << r;
    }
}

TEST_P(EdgeCases, WindowPlusMaskExcludingAllGivesZeros) {
  // A window always contains the query's own position p; window = 1 plus a mask hiding exactly
  // key p leaves nothing visible.
  for (bool sinks : {false, true}) {
    test::Case c = base_case();
    c.window = 1, c.bool_mask = test::MaskKind::u8, c.sinks = sinks;
    SCOPED_TRACE(c.str());
    test::Problem pr(c);
    set_bool_mask(pr, [&](int64_t row, int64_t t) { return t != c.N - c.Lq + row % c.Lq; });
    AttentionParams p = pr.params(GetParam());
    RUN_OR_SKIP(p);
    for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r) ASSERT_TRUE(row_is_zero(pr, r)) << "row " << r;
  }
}

TEST_P(EdgeCases, SomeRowsFullyMaskedWithSink) {
  // Rows whose keys are all hidden are zeros even with a (wide) sink; the other rows are normal.
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    test::Case c = base_case(t);
    c.bool_mask = test::MaskKind::u32, c.sinks = true;
    SCOPED_TRACE(c.str());
    test::Problem pr(c);
    set_bool_mask(pr, [](int64_t row, int64_t t) { return row % 3 != 1 && (t + row) % 4 != 0; });
    AttentionParams p = pr.params(GetParam());
    RUN_OR_SKIP(p);
    EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
    for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r) {
      if (r % 3 == 1) {
        ASSERT_TRUE(row_is_zero(pr, r)) << "row " << r;
      } else {
        ASSERT_FALSE(row_is_zero(pr, r)) << "row " << r;
      }
    }
  }
}

TEST_P(EdgeCases, LeadingNegInfInFloatMaskGivesNoNaN) {
  // -inf first in the row (and the first several, up to whole tiles of keys of any tiled
  // backend), then finite values: the hidden keys must not poison the running maximum. The result
  // equals hiding the same keys with a bool mask.
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t lead : {1, 5, 17, 70, 140}) {
      test::Case c = base_case(t);
      c.N = 150;
      c.float_mask = true, c.sinks = (lead == 5 || lead == 70);
      SCOPED_TRACE(c.str() + " leading -inf: " + std::to_string(lead));
      test::Problem pr(c);
      set_float_mask(pr, [&](int64_t row, int64_t tk) {
        return tk < lead ? kNegInf : 0.25f * float((row * 7 + tk * 3) % 9) - 1.0f;
      });
      AttentionParams p = pr.params(GetParam());
      RUN_OR_SKIP(p);
      ASSERT_FALSE(has_nan(pr));
      EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");

      // The same problem with the leading keys hidden by a bool mask and a finite float mask.
      test::Case c2 = c;
      c2.bool_mask = test::MaskKind::u8;
      test::Problem pr2(c2);
      set_bool_mask(pr2, [&](int64_t, int64_t tk) { return tk >= lead; });
      set_float_mask(pr2, [&](int64_t row, int64_t tk) {
        return tk < lead ? 3.0f : 0.25f * float((row * 7 + tk * 3) % 9) - 1.0f;
      });
      AttentionParams p2 = pr2.params(Backend::reference);
      ASSERT_TRUE(attention(p2).ok());
      const int64_t n = c.B * c.Hq * c.Lq * c.D;
      for (int64_t i = 0; i < n; ++i) {
        const double a = detail::load_f32(pr.out.data(), t, i), b = detail::load_f32(pr2.out.data(), t, i);
        ASSERT_NEAR(a, b, 4 * test::rel_tol(t) * (1 + std::fabs(b))) << "element " << i;
      }
    }
}

TEST_P(EdgeCases, WindowAtAndBeyondNEqualsNoWindow) {
  for (DType t : {DType::f32, DType::bf16})
    for (int64_t w : {int64_t(21), int64_t(22), int64_t(1000)}) {
      test::Case c = base_case(t);
      c.sinks = true, c.window = w;
      SCOPED_TRACE(c.str());
      test::Problem pr(c);
      AttentionParams p = pr.params(GetParam());
      RUN_OR_SKIP(p);
      EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
      // The oracle itself: the same output as without a window, bit for bit.
      if (GetParam() == Backend::reference) {
        const std::vector<uint8_t> with = pr.out;
        pr.poison();
        p.window = 0;
        RUN_OR_SKIP(p);
        EXPECT_EQ(with, pr.out);
      }
    }
}

TEST_P(EdgeCases, WindowSmallerThanN) {
  for (int64_t w : {1, 2, 7}) {
    test::Case c = base_case(DType::f32);
    c.window = w, c.sinks = (w == 2);
    SCOPED_TRACE(c.str());
    test::Problem pr(c);
    AttentionParams p = pr.params(GetParam());
    RUN_OR_SKIP(p);
    EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
  }
}

TEST_P(EdgeCases, LqEqualsN) {
  // Query row i sits at position i: row 0 sees key 0 only, so (no mask, no sink) its output is
  // exactly v^[0] rounded to T.
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    test::Case c = base_case(t);
    c.Lq = c.N = 9;
    SCOPED_TRACE(c.str());
    test::Problem pr(c);
    AttentionParams p = pr.params(GetParam());
    RUN_OR_SKIP(p);
    EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
    const int64_t rep = c.Hq / c.Hkv, groups = c.D / c.vf.group, words = c.D * c.vf.bits / 32;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h) {
        const int64_t vrow = (b * c.Hkv + h / rep) * c.N;  // key 0 of this head
        const int64_t orow = (b * c.Hq + h) * c.Lq;        // query row 0
        for (int64_t d = 0; d < c.D; ++d) {
          const float s = detail::load_f32(pr.v.scales.data(), t, vrow * groups + d / c.vf.group);
          const float z = detail::load_f32(pr.v.biases.data(), t, vrow * groups + d / c.vf.group);
          const uint32_t* row = pr.v.packed.data() + vrow * words;
          const int per = 32 / c.vf.bits;
          const uint32_t code = (row[d / per] >> ((d % per) * c.vf.bits)) & ((1u << c.vf.bits) - 1u);
          const double v = double(s) * code + double(z);
          const double o = detail::load_f32(pr.out.data(), t, orow * c.D + d);
          ASSERT_NEAR(o, v, test::rel_tol(t) * std::fabs(v) + 1e-6) << "b=" << b << " h=" << h << " d=" << d;
        }
      }
  }
}

TEST_P(EdgeCases, OutFullyWrittenAndNothingPastIt) {
  // out lives inside a larger buffer poisoned with two different patterns; every element of out
  // must be overwritten with the right value and the guard bytes around it left alone.
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (uint8_t pattern : {uint8_t(0xff), uint8_t(0x7b)}) {
      test::Case c = base_case(t);
      c.sinks = true, c.bool_mask = test::MaskKind::u8, c.float_mask = true;
      SCOPED_TRACE(c.str() + " pattern " + std::to_string(pattern));
      test::Problem pr(c);
      const size_t bytes = pr.out.size(), guard = 256;
      std::vector<uint8_t> buf(bytes + 2 * guard, pattern);
      AttentionParams p = pr.params(GetParam());
      p.out = buf.data() + guard;
      RUN_OR_SKIP(p);
      for (size_t i = 0; i < guard; ++i) {
        ASSERT_EQ(buf[i], pattern) << "byte " << i << " before out was written";
        ASSERT_EQ(buf[guard + bytes + i], pattern) << "byte " << i << " after out was written";
      }
      // Both poisons (0xff is NaN, 0x7b a huge finite value in every T) fail this check
      // wherever an element was left unwritten.
      EXPECT_EQ(test::check_against_reference(p, p.out), "");
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, EdgeCases, ::testing::Values(Backend::reference, Backend::cpu),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(to_string(i.param)); });
