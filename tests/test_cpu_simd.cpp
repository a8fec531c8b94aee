// The CPU backend's kernels, each against the double-precision reference (SPEC sections 3-4): the
// SIMD kernel on every Highway instruction set this machine can run (hwy::SetSupportedTargetsForTest
// picks one at a time), and the portable kernel. Each case reports its worst row as a fraction of
// the SPEC bound (1.0 = at the bound), and each kernel prints its worst fraction overall.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../src/cpu/kernel.hpp"
#include "common/testutil.hpp"
#include "hwy/targets.h"

namespace {

using namespace qsdpa;
using test::Case;
using test::MaskKind;

// One kernel to test: a Highway target, or 0 for the portable kernel.
struct Kernel {
  int64_t target;
  std::string name() const { return target == 0 ? "portable" : hwy::TargetName(target); }
};

std::vector<Kernel> kernels() {
  std::vector<Kernel> v;
  const int64_t runnable = detail::cpu::simd_runnable_targets();
  for (int64_t t = runnable; t != 0; t &= t - 1) v.push_back({t & -t});
  v.push_back({0});
  return v;
}

// The worst fraction of the bound seen per kernel, printed at the end.
std::map<std::string, double>& worst() {
  static std::map<std::string, double> w;
  return w;
}

// The worst row of `out` against the reference as a fraction of the SPEC bound (> 1 fails; NaN
// counts as infinitely bad).
double bound_fraction(const AttentionParams& p, const void* out) {
  const int64_t rows = p.B * p.Hq * p.Lq;
  std::vector<double> ref(size_t(rows * p.D));
  detail::reference_attention_f64(p, ref.data());
  const double tol = test::rel_tol(p.dtype), atol = 1e-6 * std::sqrt(double(p.D));
  double frac = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double err2 = 0, ref2 = 0;
    for (int64_t d = 0; d < p.D; ++d) {
      const double o = detail::load_f32(out, p.dtype, r * p.D + d);
      const double x = ref[size_t(r * p.D + d)];
      err2 += (o - x) * (o - x);
      ref2 += x * x;
    }
    const double f = std::sqrt(err2) / (tol * std::sqrt(ref2) + atol);
    if (!(f <= frac)) frac = std::isnan(f) ? std::numeric_limits<double>::infinity() : f;
  }
  return frac;
}

class CpuKernel : public ::testing::TestWithParam<Kernel> {
 protected:
  void SetUp() override {
    const Kernel k = GetParam();
    if (k.target == 0) {
      detail::cpu::set_kernel_choice(detail::cpu::KernelChoice::portable);
    } else {
      detail::cpu::set_kernel_choice(detail::cpu::KernelChoice::automatic);
      hwy::SetSupportedTargetsForTest(k.target);
    }
    // The kernel that runs is the one asked for (Highway's one-lane scalar target defers to the
    // portable kernel).
    const std::string want = k.target == 0 || k.target == HWY_SCALAR ? "portable" : k.name();
    ASSERT_EQ(detail::cpu::kernel_name(), want);
  }
  void TearDown() override {
    hwy::SetSupportedTargetsForTest(0);
    detail::cpu::set_kernel_choice(detail::cpu::KernelChoice::automatic);
  }

  // Runs the CPU backend on a fresh (poisoned) problem and checks it against the reference.
  double run(const Case& c, float scale = 0.0f, int threads = 0, test::Problem* keep = nullptr) {
    test::Problem local(c);
    test::Problem& pr = keep ? *keep : local;
    AttentionParams p = pr.params(Backend::cpu);
    p.scale = scale;
    p.num_threads = threads;
    const int64_t rechecks = detail::cpu::v_recheck_count().load();
    const Status s = attention(p);
    EXPECT_TRUE(s.ok()) << s.message;
    const double f = bound_fraction(p, pr.out.data());
    EXPECT_LE(f, 1.0) << c.str() << " scale=" << scale << " threads=" << threads;
    if (std::getenv("QSDPA_TEST_VERBOSE"))
      std::printf("  %.3f  %s scale=%g threads=%d%s\n", f, c.str().c_str(), double(scale), threads,
                  detail::cpu::v_recheck_count().load() > rechecks ? " (V weights in f32: rechecked)" : "");
    double& w = worst()[GetParam().name()];
    w = std::max(w, f);
    return f;
  }
};

std::string kernel_param_name(const ::testing::TestParamInfo<Kernel>& info) { return info.param.name(); }

Case base(DType t, QuantFormat kf, QuantFormat vf) {
  Case c;
  c.dtype = t;
  c.kf = kf;
  c.vf = vf;
  c.B = 2;
  c.Hq = 8;
  c.Hkv = 2;
  c.Lq = 3;
  c.N = 200;
  c.D = 128;
  c.sinks = true;
  return c;
}

// Every bits x group x T, K and V in different formats.
TEST_P(CpuKernel, Formats) {
  uint64_t seed = 1;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int bits : {2, 4, 8})
      for (int g : {32, 64, 128}) {
        Case c = base(t, {bits, g}, {bits == 8 ? 2 : bits * 2, g == 128 ? 32 : g * 2});
        c.seed = seed++;
        run(c);
      }
}

// Head dims, including those whose 2-bit rows are not a whole number of 4-word pieces.
TEST_P(CpuKernel, HeadDims) {
  uint64_t seed = 100;
  for (int64_t D : {32, 64, 96, 160, 256, 512})
    for (int bits : {2, 4, 8}) {
      Case c = base(DType::f16, {bits, 32}, {bits, 32});
      c.D = D;
      c.N = 70;
      c.seed = seed++;
      run(c);
      c.dtype = DType::f32;
      run(c);
    }
}

// Rows per group from 1 to 12 (blocks of 4, 2 and 1 rows), several query rows, short caches that
// end inside a tile, empty caches.
TEST_P(CpuKernel, RowsAndLengths) {
  uint64_t seed = 200;
  for (int64_t rep : {1, 2, 3, 5, 7, 12})
    for (int64_t N : {0, 1, 2, 63, 64, 65, 130})
      for (int64_t Lq : {1, 2}) {
        if (N > 0 && Lq > N) continue;
        Case c = base(rep % 2 ? DType::bf16 : DType::f32, {4, 64}, {8, 32});
        c.Hkv = 2;
        c.Hq = 2 * rep;
        c.Lq = Lq;
        c.N = N;
        c.D = 64;
        c.sinks = rep % 3 == 0;
        c.seed = seed++;
        run(c);
      }
}

// Masks, windows and explicit scales.
TEST_P(CpuKernel, MasksAndWindows) {
  uint64_t seed = 300;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (MaskKind bm : {MaskKind::none, MaskKind::u8, MaskKind::u32})
      for (bool fm : {false, true})
        for (int64_t window : {0, 1, 7, 150}) {
          Case c = base(t, {4, 32}, {2, 64});
          c.N = 180;
          c.Lq = 4;
          c.bool_mask = bm;
          c.float_mask = fm;
          c.window = window;
          c.seed = seed++;
          run(c, window == 7 ? 0.3f : 0.0f);
        }
}

// Long caches on one and several threads (split-K), at the default decode shape's layout.
TEST_P(CpuKernel, LongCacheThreads) {
  uint64_t seed = 400;
  for (DType t : {DType::f32, DType::f16})
    for (int threads : {1, 2, 3}) {
      Case c = base(t, {4, 64}, {4, 64});
      c.B = 1;
      c.Hq = 8;
      c.Hkv = 2;
      c.Lq = 1;
      c.N = 4096;
      c.seed = seed++;
      run(c, 0.0f, threads);
    }
}

// Sharp softmax: logits spread over tens (scale 1 on large q), where every logit's error shows.
TEST_P(CpuKernel, LargeLogits) {
  uint64_t seed = 500;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int bits : {4, 8}) {
      Case c = base(t, {bits, 64}, {bits, 64});
      c.N = 1000;
      c.seed = seed++;
      run(c, 1.0f);
      run(c, 0.02f);
    }
}

// Keys far from zero (a bias large next to the spread in every group): the affine fold must not
// lose them to cancellation.
TEST_P(CpuKernel, OffsetKeys) {
  uint64_t seed = 600;
  for (DType t : {DType::f32, DType::f16}) {
    Case c = base(t, {8, 64}, {4, 64});
    c.N = 300;
    c.seed = seed++;
    test::Problem pr(c);
    // Rebuild K as 40 + 0.5 * k: values around 40 with a spread of a few units.
    const int64_t rows = c.B * c.Hkv * c.N;
    auto raw = test::make_typed(t, rows * c.D, [&](int64_t i) {
      return 40.0f + 0.5f * detail::load_f32(pr.k.raw.data(), t, i);
    });
    pr.k = test::quantize_host(t, c.kf, rows, c.D, std::move(raw));
    run(c, 0.0f, 0, &pr);
  }
}

// Values near zero whose codes sit at the bottom, the middle or the top of wide groups
// (test::near_zero_values: s n and b each up to 2^bits - 1 times the value): a kernel that sums
// the codes' and the biases' parts apart must not lose the result to their cancellation. A
// sharp softmax on a short cache and a flat one (scale 1e-3) on a long cache, where the two sums
// are longest; every format, f32, f16 and bf16.
TEST_P(CpuKernel, NearZeroValuesOfWideGroups) {
  uint64_t seed = 650;
  int fired = 0;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int bits : {2, 4, 8})
      for (test::CodeSpot spot : {test::CodeSpot::bottom, test::CodeSpot::middle, test::CodeSpot::top})
        for (bool flat : {false, true}) {
          Case c = base(t, {4, 64}, {bits, bits == 8 ? 32 : 64});
          c.Lq = 1;
          c.N = flat ? 4000 : 300;
          c.sinks = !flat;
          c.seed = seed++;
          test::Problem pr(c);
          test::near_zero_values(pr.v, t, c.vf, c.B * c.Hkv * c.N, c.D, spot, 1.0f, c.seed);
          const int64_t before = detail::cpu::v_recheck_count().load();
          run(c, flat ? 1e-3f : 1.0f / std::sqrt(float(c.D)), 0, &pr);
          const int64_t rechecked = detail::cpu::v_recheck_count().load() - before;
          if (t == DType::f32) {
            EXPECT_EQ(rechecked, 0) << "f32 weights need no second run: " << c.str();
          }
          fired += rechecked > 0;
        }
  // The SIMD kernels (f16 / bf16 on int16 weights) ran some of these cases again on f32 weights:
  // the sharp softmax over codes at the ends of the range is past the bound on int16 weights.
  if (GetParam().target != 0 && GetParam().target != HWY_SCALAR) {
    EXPECT_GT(fired, 0);
  }
}

// One key that takes nearly all the weight and whose values are exactly zero (an attention-sink
// token with small values: test::dominant_key_with_zero_values): the result is then the
// few-percent share of the other tokens, and the tokens of the sink's tile, rounded to int16
// against its weight, lose their digits (25-39x the f16 bound without the recheck). Every format,
// f16 and bf16 (f32 for comparison), short and long caches.
TEST_P(CpuKernel, DominantKeyWithZeroValues) {
  uint64_t seed = 720;
  for (DType t : {DType::f16, DType::bf16, DType::f32})
    for (int bits : {2, 4, 8})
      for (int64_t N : {int64_t(300), int64_t(4000)}) {
        Case c = base(t, {4, 64}, {bits, 64});
        c.Lq = 1;
        c.N = N;
        c.float_mask = true;
        c.seed = seed++;
        test::Problem pr(c);
        test::dominant_key_with_zero_values(pr, 5);
        run(c, 0.0f, 0, &pr);
      }
}

// Caches quantized to their own range (the random problems of the other tests, short and long,
// every format) keep the int16 weights: the check of NearZeroValuesOfWideGroups never sends them
// to the f32 weights, which cost ~30 % more time per call.
TEST_P(CpuKernel, OrdinaryCachesKeepIntegerWeights) {
  uint64_t seed = 700;
  const int64_t before = detail::cpu::v_recheck_count().load();
  for (DType t : {DType::f16, DType::bf16})
    for (int bits : {2, 4, 8})
      for (int64_t N : {int64_t(300), int64_t(4096)}) {
        Case c = base(t, {4, 64}, {bits, 64});
        c.N = N;
        c.seed = seed++;
        run(c);
        run(c, 1.0f);  // a sharp softmax
      }
  EXPECT_EQ(detail::cpu::v_recheck_count().load() - before, 0);
}

// A NaN or infinity in q gives NaN (or anything) in its own rows, never a crash, and leaves the
// other rows right.
TEST_P(CpuKernel, NonFiniteQuery) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Case c = base(DType::f32, {4, 64}, {4, 64});
    c.Lq = 1;
    test::Problem pr(c);
    detail::store_f32(pr.q.data(), c.dtype, 5, bad);  // row 0 (head 0)
    AttentionParams p = pr.params(Backend::cpu);
    ASSERT_TRUE(attention(p).ok());
    // Rows other than 0: compare with the reference of a problem without the bad row.
    std::vector<uint8_t> got = pr.out;
    detail::store_f32(pr.q.data(), c.dtype, 5, 0.5f);
    std::vector<double> ref(size_t(c.B * c.Hq * c.D));
    p = pr.params(Backend::cpu);
    detail::reference_attention_f64(p, ref.data());
    for (int64_t r = 1; r < c.B * c.Hq; ++r)
      for (int64_t d = 0; d < c.D; ++d)
        ASSERT_NEAR(detail::load_f32(got.data(), c.dtype, r * c.D + d), ref[size_t(r * c.D + d)], 1e-4)
            << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuKernel, ::testing::ValuesIn(kernels()), kernel_param_name);

// Prints what ran and the worst fraction of the bound per kernel, after all tests.
class Summary : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("SIMD targets compiled:");
    for (int64_t t = detail::cpu::simd_compiled_targets(); t != 0; t &= t - 1) std::printf(" %s", hwy::TargetName(t & -t));
    std::printf("; runnable here:");
    for (int64_t t = detail::cpu::simd_runnable_targets(); t != 0; t &= t - 1) std::printf(" %s", hwy::TargetName(t & -t));
    std::printf("\n");
    for (const auto& [name, w] : worst()) std::printf("kernel %-10s worst row: %.3f of the SPEC bound\n", name.c_str(), w);
  }
};
const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new Summary);

}  // namespace
