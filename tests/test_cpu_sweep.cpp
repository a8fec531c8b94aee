// The CPU backend against the double-precision reference (SPEC sections 3-4):
//   - FormatProduct: every bits x group x T at one GQA shape with Lq > 1 and sinks;
//   - Pairwise: a covering design over the attention features, every pair of values of every two
//     axes in at least one case (built by a deterministic greedy generator below);
//   - Edge: the rows that see no key, -inf first in the float mask, an explicit scale.
// Each case prints its whole description (seed included) on failure, so it can be replayed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/testutil.hpp"

namespace qsdpa::test {
// How GoogleTest prints a Case parameter.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.str(); }
}  // namespace qsdpa::test

namespace {

using namespace qsdpa;
using test::Case;
using test::MaskKind;

// Runs the CPU backend on a fresh (poisoned) problem and checks it against the reference.
void run_and_check(const Case& c, float scale = 0.0f) {
  SCOPED_TRACE(c.str());
  test::Problem pr(c);
  AttentionParams p = pr.params(Backend::cpu);
  p.scale = scale;
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(s.backend, Backend::cpu);
  EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
}

std::string dtype_name(DType t) { return to_string(t); }

// ---------------------------------------------------------------------------------------------
// (a) bits x group x T
// ---------------------------------------------------------------------------------------------

using FormatParam = std::tuple<int, int, DType>;

class FormatProduct : public ::testing::TestWithParam<FormatParam> {};

TEST_P(FormatProduct, MatchesReference) {
  const auto [bits, group, dtype] = GetParam();
  Case c;
  c.dtype = dtype;
  c.kf = {bits, group};
  c.vf = {bits, group};
  c.B = 2;
  c.Hq = 8;
  c.Hkv = 2;
  c.Lq = 3;
  c.N = 255;
  c.D = 128;
  c.sinks = true;
  c.seed = 100 + uint64_t(bits) * 1000 + uint64_t(group) * 10 + uint64_t(dtype);
  run_and_check(c);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, FormatProduct,
    ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(32, 64, 128),
                       ::testing::Values(DType::f32, DType::f16, DType::bf16)),
    [](const ::testing::TestParamInfo<FormatParam>& info) {
      std::ostringstream o;
      o << "b" << std::get<0>(info.param) << "_g" << std::get<1>(info.param) << "_"
        << dtype_name(std::get<2>(info.param));
      return o.str();
    });

// ---------------------------------------------------------------------------------------------
// (b) pairwise covering design
// ---------------------------------------------------------------------------------------------

// The axes and their values. A case is a choice of one value index per axis.
enum Axis : int {
  kD, kRatio, kN, kLq, kSinks, kWindow, kBoolMask, kFloatMask, kDType, kKBits, kKGroup, kVBits,
  kVGroup, kB, kAxes
};

const std::array<std::vector<int64_t>, kAxes>& axis_values() {
  static const std::array<std::vector<int64_t>, kAxes> v = {{
      {64, 96, 128, 256, 512},         // D
      {1, 2, 4, 8},                    // GQA ratio Hq / Hkv
      {0, 1, 2, 3, 31, 33, 255, 1000}, // N
      {1, 3},                          // Lq
      {0, 1},                          // sinks
      {0, 1, 2},                       // window: none, 7, N / 2
      {0, 1, 2},                       // bool mask: none, u8, u32
      {0, 1},                          // float mask
      {0, 1, 2},                       // T: f32, f16, bf16
      {2, 4, 8},                       // K bits
      {32, 64, 128},                   // K group
      {2, 4, 8},                       // V bits
      {32, 64, 128},                   // V group
      {1, 2},                          // B
  }};
  return v;
}

// The rules a case must keep: a group divides D, and Lq <= N unless N == 0. Every rule involves
// two axes, so a case is valid exactly when each of its pairs is.
bool pair_valid(int a, int64_t va, int b, int64_t vb) {
  if (a > b) return pair_valid(b, vb, a, va);
  if (a == kD && (b == kKGroup || b == kVGroup)) return va % vb == 0;
  if (a == kN && b == kLq) return va == 0 || vb <= va;
  return true;
}

using Choice = std::array<int, kAxes>;  // value index per axis

// Deterministic greedy pairwise generator: each new case starts from the first pair not yet
// covered and fills the other axes, in a shuffled order, with the value that covers the most new
// pairs (ties go to the lowest index); the best of a few such candidates is kept.
std::vector<Choice> pairwise_design() {
  const auto& vals = axis_values();
  auto key = [](int a, int ia, int b, int ib) { return ((a * 16 + ia) * 16 + b) * 16 + ib; };
  std::set<int> uncovered;
  for (int a = 0; a < kAxes; ++a)
    for (int b = a + 1; b < kAxes; ++b)
      for (int ia = 0; ia < int(vals[a].size()); ++ia)
        for (int ib = 0; ib < int(vals[b].size()); ++ib)
          if (pair_valid(a, vals[a][size_t(ia)], b, vals[b][size_t(ib)])) uncovered.insert(key(a, ia, b, ib));

  uint64_t rng = 0x9e3779b97f4a7c15ull;  // splitmix64: the same sequence everywhere
  auto next = [&rng]() {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };

  std::vector<Choice> design;
  while (!uncovered.empty()) {
    const int first = *uncovered.begin();
    const int ib0 = first % 16, b0 = (first / 16) % 16, ia0 = (first / 256) % 16, a0 = first / 4096;
    Choice best{};
    int best_gain = -1;
    for (int attempt = 0; attempt < 8; ++attempt) {
      Choice c;
      c.fill(-1);
      c[size_t(a0)] = ia0;
      c[size_t(b0)] = ib0;
      std::vector<int> order;
      for (int a = 0; a < kAxes; ++a)
        if (a != a0 && a != b0) order.push_back(a);
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(next() % i)]);
      for (int a : order) {
        int pick = -1, pick_gain = -1;
        for (int ia = 0; ia < int(vals[a].size()); ++ia) {
          bool ok = true;
          int gain = 0;
          for (int b = 0; b < kAxes && ok; ++b) {
            if (c[size_t(b)] < 0) continue;
            const int ib = c[size_t(b)];
            if (!pair_valid(a, vals[a][size_t(ia)], b, vals[b][size_t(ib)])) ok = false;
            else if (uncovered.count(a < b ? key(a, ia, b, ib) : key(b, ib, a, ia))) ++gain;
          }
          if (ok && gain > pick_gain) {
            pick = ia;
            pick_gain = gain;
          }
        }
        c[size_t(a)] = pick;
      }
      int gain = 0;
      for (int a = 0; a < kAxes; ++a)
        for (int b = a + 1; b < kAxes; ++b) gain += int(uncovered.count(key(a, c[size_t(a)], b, c[size_t(b)])));
      if (gain > best_gain) {
        best_gain = gain;
        best = c;
      }
    }
    for (int a = 0; a < kAxes; ++a)
      for (int b = a + 1; b < kAxes; ++b) uncovered.erase(key(a, best[size_t(a)], b, best[size_t(b)]));
    design.push_back(best);
  }
  return design;
}

Case to_case(const Choice& ch, size_t index) {
  const auto& vals = axis_values();
  auto v = [&](Axis a) { return vals[a][size_t(ch[size_t(a)])]; };
  Case c;
  c.D = v(kD);
  const int64_t ratio = v(kRatio);
  c.Hkv = ratio >= 4 ? 1 : 2;
  c.Hq = ratio * c.Hkv;
  c.N = v(kN);
  c.Lq = v(kLq);
  c.sinks = v(kSinks) != 0;
  const int64_t w = v(kWindow);
  c.window = w == 0 ? 0 : w == 1 ? 7 : c.N / 2;
  c.bool_mask = v(kBoolMask) == 0 ? MaskKind::none : v(kBoolMask) == 1 ? MaskKind::u8 : MaskKind::u32;
  c.float_mask = v(kFloatMask) != 0;
  c.dtype = DType(int(v(kDType)));
  c.kf = {int(v(kKBits)), int(v(kKGroup))};
  c.vf = {int(v(kVBits)), int(v(kVGroup))};
  c.B = v(kB);
  c.seed = 7000 + index;
  return c;
}

std::vector<Case> pairwise_cases() {
  std::vector<Case> cases;
  const auto design = pairwise_design();
  for (size_t i = 0; i < design.size(); ++i) cases.push_back(to_case(design[i], i));
  return cases;
}

TEST(PairwiseDesign, CoversEveryValidPair) {
  const auto& vals = axis_values();
  const auto design = pairwise_design();
  EXPECT_EQ(design.size(), pairwise_cases().size());
  for (const Choice& c : design)
    for (int a = 0; a < kAxes; ++a)
      for (int b = a + 1; b < kAxes; ++b)
        ASSERT_TRUE(pair_valid(a, vals[a][size_t(c[size_t(a)])], b, vals[b][size_t(c[size_t(b)])]));
  for (int a = 0; a < kAxes; ++a)
    for (int b = a + 1; b < kAxes; ++b)
      for (int ia = 0; ia < int(vals[a].size()); ++ia)
        for (int ib = 0; ib < int(vals[b].size()); ++ib) {
          if (!pair_valid(a, vals[a][size_t(ia)], b, vals[b][size_t(ib)])) continue;
          const bool covered = std::any_of(design.begin(), design.end(), [&](const Choice& c) {
            return c[size_t(a)] == ia && c[size_t(b)] == ib;
          });
          EXPECT_TRUE(covered) << "axes " << a << "," << b << " values " << ia << "," << ib;
        }
  // The design is deterministic.
  EXPECT_EQ(pairwise_design(), design);
}

class Pairwise : public ::testing::TestWithParam<Case> {};

TEST_P(Pairwise, MatchesReference) { run_and_check(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cpu, Pairwise, ::testing::ValuesIn(pairwise_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           std::ostringstream o;
                           o << "c" << info.index << "_D" << c.D << "_Hq" << c.Hq << "_Hkv" << c.Hkv
                             << "_N" << c.N << "_Lq" << c.Lq << "_" << dtype_name(c.dtype);
                           return o.str();
                         });

// ---------------------------------------------------------------------------------------------
// edge cases
// ---------------------------------------------------------------------------------------------

Case edge_case(DType t, bool sinks) {
  Case c;
  c.dtype = t;
  c.kf = {4, 32};
  c.vf = {8, 64};
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.Lq = 2;
  c.N = 70;
  c.D = 64;
  c.sinks = sinks;
  c.seed = 42;
  return c;
}

bool all_zero(const test::Problem& pr) {
  for (int64_t i = 0; i < pr.c.B * pr.c.Hq * pr.c.Lq * pr.c.D; ++i)
    if (detail::load_f32(pr.out.data(), pr.c.dtype, i) != 0.0f) return false;
  return true;
}

class Edge : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(Edge, EmptyCacheGivesZeros) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.N = 0;
  c.Lq = 3;
  SCOPED_TRACE(c.str());
  test::Problem pr(c);
  AttentionParams p = pr.params(Backend::cpu);
  ASSERT_TRUE(attention(p).ok());
  EXPECT_TRUE(all_zero(pr));
}

TEST_P(Edge, EverythingMaskedGivesZeros) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.bool_mask = MaskKind::u32;
  c.float_mask = true;
  SCOPED_TRACE(c.str());
  test::Problem pr(c);
  // Row 0 of every head: hidden by the bool mask; row 1: hidden by -inf in the float mask.
  auto* bm = reinterpret_cast<uint32_t*>(pr.bool_mask.data());
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r)
    for (int64_t t = 0; t < c.N; ++t) {
      if (r % c.Lq == 0) bm[r * c.N + t] = 0;
      else detail::store_f32(pr.float_mask.data(), c.dtype, r * c.N + t, ninf);
    }
  AttentionParams p = pr.params(Backend::cpu);
  ASSERT_TRUE(attention(p).ok());
  EXPECT_TRUE(all_zero(pr));
  EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
}

TEST_P(Edge, NegInfFirstInFloatMask) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.float_mask = true;
  c.N = 300;
  SCOPED_TRACE(c.str());
  test::Problem pr(c);
  const float ninf = -std::numeric_limits<float>::infinity();
  // The first keys of every row (and, for some rows, all but the last visible one) are hidden.
  for (int64_t r = 0; r < c.B * c.Hq * c.Lq; ++r)
    for (int64_t t = 0; t < c.N; ++t)
      if (t < 5 || (r % 3 == 0 && t < c.N - c.Lq + r % c.Lq))
        detail::store_f32(pr.float_mask.data(), c.dtype, r * c.N + t, ninf);
  AttentionParams p = pr.params(Backend::cpu);
  ASSERT_TRUE(attention(p).ok());
  EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
}

TEST_P(Edge, WindowOfOne) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.window = 1;
  run_and_check(c);
}

TEST_P(Edge, WindowLongerThanCache) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.window = 1000;
  c.bool_mask = MaskKind::u8;
  run_and_check(c);
}

TEST_P(Edge, WindowAtAndAroundCacheLength) {
  // N - 1 still hides keys of the first rows; N and beyond hide nothing; the largest value must
  // not overflow a position computation (also with an empty cache).
  for (int64_t w : {int64_t(69), int64_t(70), int64_t(71), std::numeric_limits<int64_t>::max()}) {
    for (int64_t n : {int64_t(70), int64_t(0)}) {
      Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
      c.window = w;
      c.N = n;
      run_and_check(c);
    }
  }
}

TEST_P(Edge, ExplicitScale) {
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.N = 400;
  run_and_check(c, 0.37f);
}

TEST_P(Edge, ManyRowsPerGroup) {
  // A group of 64 heads x 4 rows at D = 256: more rows than one block holds.
  Case c = edge_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
  c.B = 1;
  c.Hq = 64;
  c.Hkv = 1;
  c.Lq = 4;
  c.D = 256;
  c.N = 90;
  c.window = 40;
  c.bool_mask = MaskKind::u8;
  run_and_check(c);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Edge,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<DType, bool>>& info) {
                           std::ostringstream o;
                           o << dtype_name(std::get<0>(info.param))
                             << (std::get<1>(info.param) ? "_sinks" : "_nosinks");
                           return o.str();
                         });

}  // namespace
