// Attention on Backend::cuda against the double-precision reference (SPEC sections 3 and 4): the
// full bits x group x T product at one shape, a pairwise covering design over the rest of the
// parameter space, the edge cases of section 3, long caches (many splits), misaligned buffers,
// and a small representative set for compute-sanitizer (CudaSanitize.*).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_testutil.hpp"

using namespace qsdpa;
using test::Case;
using test::MaskKind;

namespace {

constexpr DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

// Greedy pairwise covering array: every pair of levels of every two factors appears in at least
// one row (AETG-style: each row is the best of several candidates built around an uncovered pair).
std::vector<std::vector<int>> pairwise(const std::vector<int>& levels, uint64_t seed) {
  const int F = int(levels.size());
  std::vector<std::vector<char>> covered(size_t(F * F));
  size_t remaining = 0;
  for (int a = 0; a < F; ++a)
    for (int b = a + 1; b < F; ++b) {
      covered[size_t(a * F + b)].assign(size_t(levels[size_t(a)] * levels[size_t(b)]), 0);
      remaining += size_t(levels[size_t(a)] * levels[size_t(b)]);
    }
  auto cell = [&](int a, int va, int b, int vb) -> char& {
    if (a > b) std::swap(a, b), std::swap(va, vb);
    return covered[size_t(a * F + b)][size_t(va * levels[size_t(b)] + vb)];
  };
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> rows;
  while (remaining > 0) {
    // An uncovered pair to build around.
    int fa = -1, fb = -1, va = -1, vb = -1;
    for (int a = 0; a < F && fa < 0; ++a)
      for (int b = a + 1; b < F && fa < 0; ++b)
        for (int x = 0; x < levels[size_t(a)] && fa < 0; ++x)
          for (int y = 0; y < levels[size_t(b)] && fa < 0; ++y)
            if (!cell(a, x, b, y)) fa = a, fb = b, va = x, vb = y;
    std::vector<int> best;
    int best_gain = -1;
    for (int cand = 0; cand < 24; ++cand) {
      std::vector<int> row(size_t(F), -1);
      row[size_t(fa)] = va;
      row[size_t(fb)] = vb;
      std::vector<int> order;
      for (int f = 0; f < F; ++f)
        if (f != fa && f != fb) order.push_back(f);
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng() % i)]);
      for (int f : order) {
        int bv = 0, bg = -1;
        const int start = int(rng() % uint64_t(levels[size_t(f)]));
        for (int k = 0; k < levels[size_t(f)]; ++k) {
          const int v = (start + k) % levels[size_t(f)];
          int g = 0;
          for (int o = 0; o < F; ++o)
            if (row[size_t(o)] >= 0 && !cell(f, v, o, row[size_t(o)])) ++g;
          if (g > bg) bg = g, bv = v;
        }
        row[size_t(f)] = bv;
      }
      int gain = 0;
      for (int a = 0; a < F; ++a)
        for (int b = a + 1; b < F; ++b) gain += !cell(a, row[size_t(a)], b, row[size_t(b)]);
      if (gain > best_gain) best_gain = gain, best = row;
    }
    for (int a = 0; a < F; ++a)
      for (int b = a + 1; b < F; ++b) {
        char& c = cell(a, best[size_t(a)], b, best[size_t(b)]);
        if (!c) c = 1, --remaining;
      }
    rows.push_back(best);
  }
  return rows;
}

// The pairwise design over D, GQA, N, Lq, sinks, window, masks, K and V formats, T, B and Hkv.
std::vector<Case> sweep_cases() {
  const int D[] = {64, 96, 128, 256, 512};
  const int rep[] = {1, 2, 4, 8};
  const int N[] = {0, 1, 2, 3, 31, 33, 255, 1000};
  const int Lq[] = {1, 3};
  const int window[] = {0, 1, 7, 100};
  const MaskKind masks[] = {MaskKind::none, MaskKind::u8, MaskKind::u32};
  const int bits[] = {2, 4, 8};
  const int groups[] = {32, 64, 128};
  const int B[] = {1, 2};
  const int Hkv[] = {1, 2, 3};
  const std::vector<int> levels = {3, 5, 4, 8, 2, 2, 4, 3, 2, 3, 3, 3, 3, 2, 3};
  std::vector<Case> out;
  uint64_t seed = 1000;
  for (const auto& r : pairwise(levels, 7)) {
    Case c;
    c.dtype = kTypes[r[0]];
    c.D = D[r[1]];
    c.Hkv = Hkv[r[14]];
    c.Hq = rep[r[2]] * c.Hkv;
    c.N = N[r[3]];
    c.Lq = c.N > 0 ? std::min<int64_t>(Lq[r[4]], c.N) : Lq[r[4]];
    c.sinks = r[5] != 0;
    c.window = window[r[6]];
    c.bool_mask = masks[r[7]];
    c.float_mask = r[8] != 0;
    c.kf = {bits[r[9]], groups[r[10]]};
    c.vf = {bits[r[11]], groups[r[12]]};
    if (c.D % c.kf.group) c.kf.group = 32;  // D = 96 takes groups of 32 only
    if (c.D % c.vf.group) c.vf.group = 32;
    c.B = B[r[13]];
    c.seed = seed++;
    out.push_back(c);
  }
  return out;
}

constexpr int kShards = 4;

class CudaSweep : public ::testing::TestWithParam<int> {};

}  // namespace

TEST(CudaAttention, BitsGroupsTypesProduct) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (DType t : kTypes)
    for (int bits : {2, 4, 8})
      for (int group : {32, 64, 128}) {
        Case c;
        c.dtype = t;
        c.kf = c.vf = {bits, group};
        c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 2, c.N = 77, c.D = 128;
        c.sinks = (seed % 2) == 0;
        c.seed = seed++;
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
      }
}

namespace {

// Case n of a sweep over one format: B = 2, Hkv = 2, one, four or eight query heads per KV head,
// and sinks, a window and masks in turn (the caller sets Lq and N).
Case varied_case(int n, DType t, QuantFormat kf, QuantFormat vf, int D, uint64_t seed) {
  Case c;
  c.dtype = t;
  c.kf = kf;
  c.vf = vf;
  c.D = D;
  c.B = 2, c.Hkv = 2;
  c.Hq = (n % 3 == 0 ? 1 : n % 3 == 1 ? 4 : 8) * c.Hkv;
  c.sinks = n % 3 == 1;
  c.window = n % 5 == 4 ? 100 : 0;
  if (n % 7 == 3) c.bool_mask = MaskKind::u8;
  if (n % 7 == 5) c.float_mask = true;
  c.seed = seed;
  return c;
}

// The case reaches the tensor-core kernel, and it (and the generic kernel) match the reference.
void expect_tensor_cores_and_reference(const Case& c) {
  test::Problem h(c);
  test::DeviceProblem d(h);
  EXPECT_TRUE(cuda::uses_tensor_cores(d.params())) << c.str();
  EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
}

}  // namespace

// 8-bit keys with 4-bit values (one group size) run on the tensor-core kernel: every head dim and
// group it takes, one and two n-tiles of query rows, with masks, windows and sinks; each case is
// checked to reach that kernel, then held to the reference (and the generic kernel with it).
TEST(CudaAttention, MixedKeyValueBitsOnTensorCores) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 9000;
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (int D : {64, 128, 256})
      for (int group : {32, 64, 128}) {
        if (D % group) continue;
        Case c = varied_case(n, t, {8, group}, {4, group}, D, seed++);  // > 8 rows: two n-tiles, D <= 128
        c.Lq = n % 4 == 2 ? 3 : 1;
        c.N = n % 2 ? 1000 : 77;
        ++n;
        expect_tensor_cores_and_reference(c);
      }
  EXPECT_EQ(n, 16);
}

// 2-bit caches (keys and values, groups of 64 or 128, D = 128 or 256) run on the tensor-core kernel:
// one to 24 query rows per KV head (several row tiles), one and three rows per head, masks,
// windows and sinks; each case is checked to reach that kernel, then held to the reference (and
// the generic kernel with it). Groups of 32 and D = 64 stay on the generic kernel.
TEST(CudaAttention, TwoBitOnTensorCores) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 9500;
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (int D : {128, 256})
      for (int group : {64, 128})
        for (int var = 0; var < 2; ++var) {
          Case c = varied_case(n, t, {2, group}, {2, group}, D, seed++);
          c.Lq = var ? 3 : 1;  // with 8 heads per KV head: 24 rows, three row tiles
          c.N = n % 2 ? 1000 : 77 + 13 * n;
          ++n;
          expect_tensor_cores_and_reference(c);
        }
  EXPECT_EQ(n, 16);
}

// Blocks of at most 4 query rows in one n-tile, which a build with -DQSDPA_MMA_VPACK=1 runs with
// the value scales folded into the weights and the weights' hi and lo halves in columns 0-3 and
// 4-7 of one mma (mma_kernel.cuh, kVPack), next to blocks of 5 to 8 rows, which the same kernels
// run on the dequantizing path: f16, D = 128, 2- and 4-bit values (and 8-bit keys with 4-bit
// values), groups of 32, 64 and 128, one to 4 rows from GQA and Lq together (so also rows of one
// head at several positions, with the causal rule), 6 and 8 rows, 12 and 20 (2-bit: row tiles of
// 8 whose last has 4 rows), masks, windows, sinks, one partial tile to many splits. Each case is checked to reach the tensor-core kernel, then held to the reference;
// in the default build the same cases hold the dequantizing path.
TEST(CudaAttention, FewRowsPerKvHeadInOneNTile) {
  QSDPA_REQUIRE_CUDA();
  std::printf("packed value columns (kVPack) built: %s\n", cuda::packed_value_columns_built() ? "yes" : "no");
  struct Rows {
    int rep, Lq;
  };
  // (12 and 20 rows: with 2-bit keys, row tiles of 8 whose last has 4 rows, the two forms in one call)
  const Rows rows[] = {{1, 1}, {2, 1}, {4, 1}, {3, 1}, {2, 2}, {1, 4}, {1, 3}, {4, 2}, {6, 1}, {8, 1}, {3, 4}, {5, 4}};
  const QuantFormat formats[][2] = {{{2, 64}, {2, 64}}, {{4, 64}, {4, 64}}, {{4, 32}, {4, 32}},
                                    {{4, 128}, {4, 128}}, {{2, 128}, {2, 128}}, {{8, 64}, {4, 64}}};
  const int64_t lengths[] = {33, 1000, 6000};  // (6000: many splits; 20000 took 124 s on an H100, run 116)
  uint64_t seed = 9700;
  int n = 0;
  for (const auto& f : formats)
    for (const Rows& r : rows) {
      Case c;
      c.dtype = DType::f16;
      c.kf = f[0], c.vf = f[1];
      c.D = 128;
      c.B = 2, c.Hkv = 2, c.Hq = r.rep * c.Hkv, c.Lq = r.Lq;
      c.N = lengths[n % 3];
      c.sinks = n % 4 == 1;
      c.window = n % 5 == 2 ? 300 : 0;
      if (n % 6 == 3) c.bool_mask = MaskKind::u8;
      if (n % 7 == 4) c.float_mask = true;
      c.seed = seed++;
      ++n;
      expect_tensor_cores_and_reference(c);
    }
  EXPECT_EQ(n, 72);
}

// f16 values whose scales span f16's range, for the kernel that folds the value scales into the
// softmax weights (kVFold, mma_kernel.cuh: p s must stay inside f16, so each warp keeps an
// exponent that moves with the scales it meets): the whole cache scaled by 2^12 (scales near
// 1000: p s past f16's largest value without the exponent), by 2^-13 (scales that are f16
// subnormals), and a cache whose runs of 48 tokens take 2^-12, 1 and 2^12 in turn, so that the
// exponent moves up and down inside a split. 2-, 4- and 8-bit values, D = 128 (one and two
// n-tiles) and D = 512 (the d-split, where the default build folds), short and long caches; each
// case is checked to reach the tensor-core kernel where the device has it, then held to the
// reference.
TEST(CudaAttention, ValueScalesOfEveryMagnitude) {
  QSDPA_REQUIRE_CUDA();
  const bool d512 = device_takes_sm90a_kernels();  // (D = 512 on the tensor cores)
  uint64_t seed = 9900;
  int n = 0;
  for (int mode = 0; mode < 3; ++mode)
    for (int bits : {2, 4, 8})
      for (int64_t N : {int64_t(77), int64_t(3000)})
        for (int64_t D : {int64_t(128), int64_t(512)}) {
          Case c;
          c.dtype = DType::f16;
          c.kf = c.vf = {bits, 64};
          c.B = 2, c.Hq = 8, c.Hkv = 2, c.D = D, c.N = N;
          c.Lq = (n / 2) % 2 ? 4 : 1;  // 4 heads per KV head x 4 rows: two n-tiles (D = 512: two row tiles)
          c.sinks = n % 3 == 1;
          c.seed = seed++;
          ++n;
          test::Problem h(c);
          const int64_t rows = c.B * c.Hkv * c.N;
          std::vector<uint8_t> raw = h.v.raw;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t t = r % c.N;
            const int e = mode == 0 ? 12 : mode == 1 ? -13 : 12 * int((t / 48) % 3) - 12;
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t i = r * c.D + d;
              detail::store_f32(raw.data(), c.dtype, i, std::ldexp(detail::load_f32(raw.data(), c.dtype, i), e));
            }
          }
          h.v = test::quantize_host(c.dtype, c.vf, rows, c.D, std::move(raw));
          test::DeviceProblem d(h);
          const test::ReferenceCheck check(h.params(Backend::reference));
          const AttentionParams p = d.params();
          EXPECT_EQ(cuda::uses_tensor_cores(p), D == 128 || d512) << c.str();
          const Status s = attention(p);
          ASSERT_TRUE(s) << s.message << " " << c.str();
          ASSERT_EQ(d.fetch(), "") << c.str();
          EXPECT_EQ(check(h.out.data()), "") << "mode " << mode << " " << c.str();
        }
  EXPECT_EQ(n, 36);
}

// Values near zero whose codes sit at the bottom, the middle or the top of wide groups
// (test::near_zero_values: s n and b each up to 2^bits - 1 times the value). The kernels that
// fold the value scales into the weights (kVFold: 4-bit values at D = 256 and D = 512; kVPack:
// blocks of <= 4 rows at D = 128 in a build with it) sum p s n and p b apart, so
// the rounding of p s comes back up to 15 times larger against the result: with p s at f16
// precision alone (no lo half) the middle and the top of a 4-bit range are past the bound, which
// the hi + lo form keeps well inside. The dequantizing kernels and the generic kernel are held to
// the same cases. f16 and bf16, 2-, 4- and 8-bit values, D = 128, 256 and 512, 4 and 8 rows per KV
// head, a sharp softmax on a short cache and a flat one (scale 1e-3) on a long one.
TEST(CudaAttention, NearZeroValuesOfWideGroups) {
  QSDPA_REQUIRE_CUDA();
  const bool d512 = device_takes_sm90a_kernels();
  uint64_t seed = 9950;
  int n = 0;
  for (int64_t D : {int64_t(128), int64_t(256), int64_t(512)})
    for (int vbits : {4, 2, 8})
      for (test::CodeSpot spot : {test::CodeSpot::bottom, test::CodeSpot::middle, test::CodeSpot::top}) {
        Case c;
        c.dtype = (n % 5 == 4) ? DType::bf16 : DType::f16;
        c.kf = c.vf = {vbits, 64};
        c.B = 2, c.Hkv = 2, c.Hq = (n % 3 == 1 ? 8 : 4) * c.Hkv, c.D = D;
        const bool flat = n % 2 == 1;
        c.N = flat ? 3000 : 300;
        c.sinks = !flat;
        c.seed = seed++;
        ++n;
        test::Problem h(c);
        test::near_zero_values(h.v, c.dtype, c.vf, c.B * c.Hkv * c.N, c.D, spot, 1.0f, c.seed);
        {
          test::DeviceProblem d(h);
          EXPECT_EQ(cuda::uses_tensor_cores(d.params()), D != 512 || d512) << c.str();
        }
        EXPECT_EQ(test::run_cuda_problem(h, flat ? 1e-3f : 0.0f), "") << "spot " << int(spot) << " flat " << flat << " " << c.str();
      }
  EXPECT_EQ(n, 27);
}

// One key that takes nearly all the weight and whose values are exactly zero (an attention-sink
// token with small values: test::dominant_key_with_zero_values): the result is the few-percent
// share of the other tokens, so the weights of those must keep their own precision, not one
// relative to the sink's weight. f16 and bf16, 2-, 4- and 8-bit, D = 128, 256 and 512, 4 and 8
// rows per KV head, short and long caches; attention() and the generic kernel.
TEST(CudaAttention, DominantKeyWithZeroValues) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 9990;
  int n = 0;
  for (int64_t D : {int64_t(128), int64_t(256), int64_t(512)})
    for (int bits : {4, 2, 8})
      for (int64_t N : {int64_t(300), int64_t(3000)}) {
        Case c;
        c.dtype = n % 4 == 3 ? DType::bf16 : DType::f16;
        c.kf = c.vf = {bits, 64};
        c.B = 2, c.Hkv = 2, c.Hq = (n % 3 == 1 ? 8 : 4) * c.Hkv, c.D = D, c.N = N;
        c.float_mask = true;
        c.seed = seed++;
        ++n;
        test::Problem h(c);
        test::dominant_key_with_zero_values(h, 5 + n);
        EXPECT_EQ(test::run_cuda_problem(h), "") << c.str();
      }
  EXPECT_EQ(n, 18);
}

// D = 512 runs on the tensor-core kernel (its d-split instantiations: groups of 64, devices of
// compute capability 9.0 with a build for sm_90a) in every format: one to 24 query rows per KV
// head (one to three row tiles), masks, windows, sinks, short and long caches (many
// splits, partial tiles); each case is checked to take the kernel meant, then held to the
// reference (and the generic kernel with it).
TEST(CudaAttention, HeadDim512OnTensorCores) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  uint64_t seed = 9700;
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}})
      for (int var = 0; var < 3; ++var) {
        Case c = varied_case(n, t, {kb, 64}, {vb, 64}, 512, seed++);
        if (var == 0) c.N = 77 + 13 * n;
        if (var == 1) c.Hkv = 1, c.Hq = 16, c.N = 1000;  // 16 rows: two row tiles
        if (var == 2) c.Lq = 3, c.N = 5000 + n;          // 24 rows or fewer, many splits
        ++n;
        test::Problem h(c);
        test::DeviceProblem d(h);
        EXPECT_EQ(cuda::uses_tensor_cores(d.params()), want) << c.str();
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
      }
  EXPECT_EQ(n, 24);
}

// The same with two n-tiles of query rows (more than 8 rows per KV head) for every type and head
// dim that has them, and row tiles beyond the first (24 rows: two blocks of 16).
TEST(CudaAttention, MixedKeyValueBitsTwoNTiles) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 9100;
  for (DType t : {DType::f16, DType::bf16})
    for (int D : {64, 128})
      for (int64_t lq : {2, 3}) {
        Case c;
        c.dtype = t;
        c.kf = {8, 64};
        c.vf = {4, 64};
        c.D = D;
        c.B = 2, c.Hkv = 1, c.Hq = 8, c.Lq = lq, c.N = 700;
        c.sinks = lq == 3;
        c.seed = seed++;
        test::Problem h(c);
        test::DeviceProblem d(h);
        EXPECT_TRUE(cuda::uses_tensor_cores(d.params())) << c.str();
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
      }
}

// The tensor-core kernel's two ways of merging a row tile's splits: in the kernel, through a
// thread-block cluster (sm_90 and newer, at most 16 splits), and through partials and the combine
// kernel. Each case runs both ways, is checked to take the way meant, and is held to the reference:
// sinks, windows, masks, two n-tiles, D = 256, 8-bit, 8-bit keys with 4-bit values, one split.
TEST(CudaAttention, ClusterMergeAndCombineKernel) {
  QSDPA_REQUIRE_CUDA();
  int major = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  std::vector<Case> cases;
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.B = 2, c.Hq = 8, c.Hkv = 2, c.N = 3000, c.D = 128, c.sinks = true;
  cases.push_back(c);
  c.dtype = DType::bf16, c.kf = c.vf = {8, 32}, c.Lq = 4, c.N = 2000, c.window = 700, c.float_mask = true, c.sinks = false;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = {8, 64}, c.vf = {4, 64}, c.B = 1, c.Hq = 4, c.Hkv = 1, c.N = 1500, c.D = 64,
  c.bool_mask = MaskKind::u8;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::bf16, c.kf = c.vf = {4, 128}, c.B = 1, c.Hq = 16, c.Hkv = 2, c.N = 4000, c.D = 256, c.sinks = true;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.B = 3, c.Hq = 4, c.Hkv = 2, c.Lq = 2, c.N = 100, c.D = 128;
  cases.push_back(c);  // one split: a cluster of one block
  struct Restore {
    ~Restore() { cuda::set_cluster_merge(true); }
  } restore;
  uint64_t seed = 9300;
  for (bool on : {true, false}) {
    cuda::set_cluster_merge(on);
    for (Case cs : cases) {
      cs.seed = seed++;
      test::Problem h(cs);
      test::DeviceProblem d(h);
      EXPECT_TRUE(cuda::uses_tensor_cores(d.params())) << cs.str();
      EXPECT_EQ(cuda::uses_cluster_merge(d.params()), on && major >= 9) << cs.str();
      EXPECT_EQ(test::run_cuda_case(cs), "") << (on ? "cluster merge: " : "combine kernel: ") << cs.str();
    }
  }
}

// The tensor-core kernel's tile pool (blocks of 16 warps, or of 8, taking a split's 32-token tiles
// from a counter in shared memory; 4-bit g64 D = 128, at most 8 rows per KV head, or 2-bit f16,
// sm_90a): forced on problems of every size, fewer tiles than warps included (10 tiles, 2 tiles),
// partial last tiles, sinks, windows that skip tiles, masks, one to eight rows per KV head (2-bit:
// twelve, two row tiles), splits merged in the kernel, by the combine kernel and (blocks of 16
// warps, cuda::set_pool_cluster) in clusters; each case is checked to take the pool meant (where
// the device has it) and the merge meant, and held to the reference. Then the default choice: the
// pool on the large shapes only, blocks of 8 warps where the row tiles are up to twice the SMs.
// AttentionParams::deterministic: the planner takes no tile pool, even where a test forces it
// (cuda::set_block_pool(2)), and four calls on the same inputs give the same output bits, each
// within the reference's bound. The same call without the flag plans the pool on a device that
// has its kernels (sm_90a), so the first check sees the flag's effect there.
TEST(CudaAttention, DeterministicCallsRepeatTheirBits) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  struct Restore {
    int mode = cuda::set_block_pool(2);
    ~Restore() { cuda::set_block_pool(mode); }
  } restore;
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 2, c.Hq = 16, c.Hkv = 4, c.N = 20000, c.sinks = true, c.seed = 4242;
  test::Problem h(c);
  test::DeviceProblem d(h);
  const test::ReferenceCheck check(h.params(Backend::reference));
  AttentionParams p = d.params();
  EXPECT_EQ(cuda::planned_pool(p), want ? 1 : 0);
  p.deterministic = true;
  EXPECT_EQ(cuda::planned_pool(p), 0);
  std::vector<uint8_t> first;
  for (int call = 0; call < 4; ++call) {
    d.poison();
    const Status s = attention(p);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(s.backend, Backend::cuda);
    ASSERT_EQ(d.fetch(), "");
    ASSERT_EQ(check(h.out.data()), "") << "call " << call;
    if (call == 0) first = h.out;
    else EXPECT_TRUE(h.out == first) << "call " << call << ": the output bits differ from call 0's";
  }
  // (informational: without the flag, how many of 8 calls on the pool differ from the first one)
  p.deterministic = false;
  int differ = 0;
  for (int call = 0; call < 8; ++call) {
    ASSERT_TRUE(attention(p).ok());
    ASSERT_EQ(d.fetch(), "");
    ASSERT_EQ(check(h.out.data()), "") << "without the flag, call " << call;
    if (call == 0) first = h.out;
    else differ += h.out != first;
  }
  std::printf("[   info   ] without deterministic (pool %d): %d of 7 calls differ from the first in their bits\n",
              cuda::planned_pool(p), differ);
}

TEST(CudaAttention, TilePoolBlocks) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  struct Restore {
    int mode = cuda::set_block_pool(2);
    bool in_kernel = cuda::set_in_kernel_merge(true);
    bool pool_cluster = cuda::set_pool_cluster(false);
    ~Restore() {
      cuda::set_block_pool(mode);
      cuda::set_in_kernel_merge(in_kernel);
      cuda::set_pool_cluster(pool_cluster);
    }
  } restore;
  std::vector<Case> cases;
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 2, c.Hq = 8, c.Hkv = 2, c.N = 300, c.sinks = true;  // 10 tiles for 16 warps, the last partial
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::bf16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 1, c.Hq = 4, c.Hkv = 1, c.Lq = 2, c.N = 5000, c.window = 700, c.float_mask = true;  // 8 rows
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 3, c.Hq = 32, c.Hkv = 8, c.N = 2000, c.bool_mask = MaskKind::u8;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::bf16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 2, c.Hq = 1, c.Hkv = 1, c.N = 33, c.sinks = true;  // one row, 2 tiles
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 1, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.N = 40000, c.sinks = true;  // many splits
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::bf16, c.kf = c.vf = {4, 64}, c.D = 128;
  c.B = 2, c.Hq = 6, c.Hkv = 2, c.Lq = 2, c.N = 3001, c.window = 100, c.bool_mask = MaskKind::u32;  // 6 rows
  cases.push_back(c);
  // 2-bit keys and values (f16 alone has pool kernels): few tiles, many splits, and 12 rows per KV
  // head (two row tiles of one n-tile)
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {2, 64}, c.D = 128;
  c.B = 2, c.Hq = 8, c.Hkv = 2, c.N = 300, c.sinks = true;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {2, 64}, c.D = 128;
  c.B = 1, c.Hq = 8, c.Hkv = 2, c.N = 40000, c.window = 30000, c.float_mask = true;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = c.vf = {2, 64}, c.D = 128;
  c.B = 2, c.Hq = 6, c.Hkv = 1, c.Lq = 2, c.N = 2500, c.sinks = true;
  cases.push_back(c);
  uint64_t seed = 9900;
  int clustered = 0;
  // blocks of 16 warps: in the kernel, the combine kernel, clusters; blocks of 8: in the kernel,
  // the combine kernel
  for (int pass = 0; pass < 5; ++pass) {
    const bool pair = pass >= 3;
    const int merge = pair ? pass - 3 : pass;
    cuda::set_block_pool(pair ? 3 : 2);
    cuda::set_in_kernel_merge(merge == 0);
    cuda::set_pool_cluster(merge == 2);
    const std::string how = std::string(pair ? "blocks of 8 warps, " : "blocks of 16 warps, ") +
                            (merge == 0 ? "in-kernel merge: " : merge == 1 ? "combine kernel: " : "clusters allowed: ");
    for (Case cs : cases) {
      cs.seed = seed++;
      test::Problem h(cs);
      test::DeviceProblem d(h);
      EXPECT_EQ(cuda::planned_pool(d.params()), want ? (pair ? 2 : 1) : 0) << how << cs.str();
      const bool cl = cuda::uses_cluster_merge(d.params());
      if (want && merge < 2) {
        EXPECT_FALSE(cl) << how << cs.str();
      }
      clustered += merge == 2 && cl;
      EXPECT_EQ(test::run_cuda_case(cs), "") << how << cs.str();
    }
  }
  // (the pool's clusters: at most 16 splits, all resident at once; most cases here qualify)
  if (want) {
    EXPECT_GE(clustered, 3) << "cases whose pool splits merged in clusters";
  }
  // bf16 2-bit caches have no pool kernels: even forced, the plan keeps the 4-warp blocks
  {
    Case cs;
    cs.dtype = DType::bf16, cs.kf = cs.vf = {2, 64}, cs.D = 128;
    cs.B = 2, cs.Hq = 8, cs.Hkv = 2, cs.N = 3000, cs.seed = seed++;
    cuda::set_block_pool(2);
    test::Problem h(cs);
    test::DeviceProblem d(h);
    EXPECT_EQ(cuda::planned_pool(d.params()), 0) << cs.str();
    EXPECT_EQ(test::run_cuda_case(cs), "") << cs.str();
  }
  // The default (mode 1): the pool where the tiles are many per warp of a full wave and its blocks
  // fill the slots in one round: blocks of 16 warps for up to 132 row tiles (on an H200), of 8 for
  // up to 264 (B=32 N=4096: 256 row tiles); not on the latency-bound small calls nor on grids that
  // leave many slots idle, and never on formats it has no instantiation for. The blocks of 16
  // warps merge their splits in clusters by default.
  cuda::set_block_pool(1);
  cuda::set_in_kernel_merge(true);
  cuda::set_pool_cluster(true);
  alignas(16) static uint8_t dummy[64];  // (never dereferenced: the plan reads shapes alone)
  const auto shape = [&](int64_t B, int64_t N, int bits) {
    AttentionParams p;
    p.dtype = DType::f16;
    p.B = B, p.Hq = 32, p.Hkv = 8, p.Lq = 1, p.N = N, p.D = 128;
    const auto* w = reinterpret_cast<const uint32_t*>(dummy);
    p.q = dummy, p.out = dummy;
    p.k = {{bits, 64}, w, dummy, dummy, {}};
    p.v = {{bits, 64}, w, dummy, dummy, {}};
    p.backend = Backend::cuda;
    return p;
  };
  // (the counts of row tiles below fill the slots of 132 SMs, as an H200 has, or of 128-142)
  int sms = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const bool here = want && sms >= 128 && sms <= 142;
  EXPECT_EQ(cuda::planned_pool(shape(8, 32768, 4)), here ? 1 : 0) << sms << " SMs";
  EXPECT_EQ(cuda::uses_cluster_merge(shape(8, 32768, 4)), here) << "64 clusters of 2";
  EXPECT_EQ(cuda::planned_pool(shape(32, 4096, 4)), here ? 2 : 0);
  if (here) {
    EXPECT_EQ(cuda::planned_splits(shape(32, 4096, 4)), 1) << "256 blocks of 8 warps, 2 per SM";
  }
  EXPECT_FALSE(cuda::uses_block_pool(shape(6, 32768, 4)));   // 48 row tiles: 96 of 132 SMs
  EXPECT_FALSE(cuda::uses_block_pool(shape(48, 4096, 4)));  // 384 row tiles: more than 264
  EXPECT_EQ(cuda::planned_pool(shape(1, 131072, 4)), here ? 1 : 0);
  EXPECT_FALSE(cuda::uses_block_pool(shape(1, 4096, 4)));
  EXPECT_FALSE(cuda::uses_block_pool(shape(8, 32768, 8)));
  // 2-bit (f16) as 4-bit where the row tiles are at least a quarter of the SMs, unless
  // cuda::set_pool_2bit keeps it off the pool
  const bool pool2 = cuda::set_pool_2bit(true);
  EXPECT_EQ(cuda::planned_pool(shape(8, 32768, 2)), here ? 1 : 0);
  EXPECT_EQ(cuda::uses_cluster_merge(shape(8, 32768, 2)), here) << "64 clusters of 2";
  EXPECT_EQ(cuda::planned_pool(shape(32, 4096, 2)), here ? 2 : 0);
  EXPECT_FALSE(cuda::uses_block_pool(shape(1, 4096, 2)));
  EXPECT_FALSE(cuda::uses_block_pool(shape(1, 131072, 2))) << "8 row tiles: under a quarter of the SMs";
  cuda::set_pool_2bit(false);
  EXPECT_FALSE(cuda::uses_block_pool(shape(8, 32768, 2)));
  EXPECT_EQ(cuda::planned_pool(shape(8, 32768, 4)), here ? 1 : 0);
  cuda::set_pool_2bit(pool2);
  cuda::set_block_pool(0);
  EXPECT_FALSE(cuda::uses_block_pool(shape(8, 32768, 4)));
  EXPECT_FALSE(cuda::uses_block_pool(shape(8, 32768, 2)));
}

TEST_P(CudaSweep, PairwiseDesign) {
  QSDPA_REQUIRE_CUDA();
  const auto cases = sweep_cases();
  ASSERT_GE(cases.size(), 40u);
  for (size_t i = size_t(GetParam()); i < cases.size(); i += kShards)
    EXPECT_EQ(test::run_cuda_case(cases[i]), "") << "case " << i << ": " << cases[i].str();
}
INSTANTIATE_TEST_SUITE_P(Shards, CudaSweep, ::testing::Range(0, kShards));

// ---- edge cases (SPEC section 3) ----------------------------------------------------------------
namespace {

// Runs a problem whose host buffers may have been edited; checks against the reference and, when
// asked, that every output element is exactly zero.
std::string run_problem(test::Problem& h, bool expect_zeros) {
  test::DeviceProblem d(h);
  const Status s = attention(d.params());
  if (!s) return "attention failed: " + s.message;
  if (std::string e = d.fetch(); !e.empty()) return e;
  if (std::string e = d.check(); !e.empty()) return e;
  if (expect_zeros)
    for (size_t i = 0; i < h.out.size(); ++i)
      if (h.out[i] != 0) return "byte " + std::to_string(i) + " of out is not zero";
  return "";
}

// Masks query rows 0, 2, 4 ... of h fully (h.c.bool_mask must be u8): no key visible, so the SPEC
// wants zeros there, with or without a sink.
void mask_every_other_row(test::Problem& h) {
  const Case& c = h.c;
  for (int64_t row = 0; row < c.B * c.Hq * c.Lq; row += 2)
    std::fill_n(h.bool_mask.begin() + row * c.N, c.N, uint8_t(0));
}

// "" when rows 0, 2, 4 ... of out (h's layout) are exactly zero, else the first row that is not.
std::string every_other_row_zero(const test::Problem& h, const std::vector<uint8_t>& out) {
  const Case& c = h.c;
  const size_t row_bytes = size_t(c.D) * test::tsize(c.dtype);
  for (int64_t row = 0; row < c.B * c.Hq * c.Lq; row += 2)
    for (size_t i = 0; i < row_bytes; ++i)
      if (out[size_t(row) * row_bytes + i] != 0) return "row " + std::to_string(row) + " is not zero";
  return "";
}

Case base_case(DType t) {
  Case c;
  c.dtype = t;
  c.B = 2, c.Hq = 4, c.Hkv = 2, c.Lq = 3, c.N = 300, c.D = 64;
  return c;
}

}  // namespace

TEST(CudaAttention, NoKeysGivesZeros) {
  QSDPA_REQUIRE_CUDA();
  for (DType t : kTypes)
    for (bool sinks : {false, true})
      for (int64_t lq : {1, 3}) {
        Case c = base_case(t);
        c.N = 0, c.Lq = lq, c.sinks = sinks;
        test::Problem h(c);
        EXPECT_EQ(run_problem(h, true), "") << c.str();
      }
}

TEST(CudaAttention, EverythingMaskedGivesZeros) {
  QSDPA_REQUIRE_CUDA();
  for (DType t : kTypes)
    for (int kind = 0; kind < 3; ++kind) {
      Case c = base_case(t);
      c.sinks = true;
      c.bool_mask = kind == 0 ? MaskKind::u8 : kind == 1 ? MaskKind::u32 : MaskKind::none;
      c.float_mask = kind == 2;
      test::Problem h(c);
      if (kind < 2) std::fill(h.bool_mask.begin(), h.bool_mask.end(), uint8_t(0));
      else
        for (int64_t i = 0; i < int64_t(h.float_mask.size() / test::tsize(t)); ++i)
          detail::store_f32(h.float_mask.data(), t, i, -std::numeric_limits<float>::infinity());
      EXPECT_EQ(run_problem(h, true), "") << c.str() << " kind=" << kind;
    }
}

TEST(CudaAttention, LeadingNegativeInfinityInFloatMask) {
  QSDPA_REQUIRE_CUDA();
  for (DType t : kTypes)
    for (int64_t lead : {1, 5, 64, 700}) {
      Case c = base_case(t);
      c.N = 1000, c.float_mask = true, c.sinks = lead % 2 == 1;
      test::Problem h(c);
      for (int64_t row = 0; row < c.B * c.Hq * c.Lq; ++row)
        for (int64_t k = 0; k < lead; ++k)
          detail::store_f32(h.float_mask.data(), t, row * c.N + k, -std::numeric_limits<float>::infinity());
      EXPECT_EQ(run_problem(h, false), "") << c.str() << " lead=" << lead;
    }
}

TEST(CudaAttention, FullyMaskedRowsWithSink) {
  QSDPA_REQUIRE_CUDA();
  for (DType t : kTypes) {
    Case c = base_case(t);
    c.sinks = true, c.bool_mask = MaskKind::u8;
    test::Problem h(c);
    mask_every_other_row(h);  // (every other row sees nothing)
    EXPECT_EQ(run_problem(h, false), "") << c.str();
    ASSERT_EQ(every_other_row_zero(h, h.out), "") << c.str();
  }
}

// Grids of one split whose rows merge in the tensor-core kernel (the B x Hkv row tiles fill every
// block slot): with D <= 128 the block writes the output itself (mma_kernel.cuh, kDirectOut),
// dividing by its l with the row's sink, zeros where a row sees no key; D = 256 still goes through
// its partials. Each case is checked to take that plan, then held to the reference, and again
// with the splits merged by the combine kernel.
TEST(CudaAttention, OneSplitWritesTheOutput) {
  QSDPA_REQUIRE_CUDA();
  std::vector<Case> cases;
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64};
  c.B = 80, c.Hq = 16, c.Hkv = 8, c.Lq = 1, c.N = 300, c.D = 128, c.sinks = true, c.seed = 21;
  cases.push_back(c);
  // 8-bit keys, 4-bit values, 6 rows per KV head (one n-tile), a window, a float mask
  c.dtype = DType::bf16, c.kf = {8, 64}, c.vf = {4, 64}, c.Lq = 3, c.window = 100, c.float_mask = true, c.seed = 22;
  cases.push_back(c);
  // 2 bits; every other row fully masked (below); then D = 256
  c.dtype = DType::f16, c.kf = c.vf = {2, 64}, c.Lq = 1, c.window = 0, c.float_mask = false;
  c.bool_mask = MaskKind::u8, c.seed = 23;
  cases.push_back(c);
  c.D = 256, c.seed = 24;
  cases.push_back(c);
  for (const Case& k : cases) {
    test::Problem h(k);
    const bool masked_rows = k.bool_mask != MaskKind::none;
    if (masked_rows) mask_every_other_row(h);
    {
      test::DeviceProblem d(h);
      ASSERT_TRUE(cuda::uses_tensor_cores(d.params())) << k.str();
      EXPECT_EQ(cuda::planned_splits(d.params()), 1) << k.str();
      EXPECT_TRUE(cuda::uses_in_kernel_merge(d.params())) << k.str();
    }
    for (bool in_kernel : {true, false}) {
      const bool was = cuda::set_in_kernel_merge(in_kernel);
      const std::string r = run_problem(h, false);
      cuda::set_in_kernel_merge(was);
      EXPECT_EQ(r, "") << (in_kernel ? "in the kernel: " : "combine kernel: ") << k.str();
      if (masked_rows) {
        ASSERT_EQ(every_other_row_zero(h, h.out), "") << k.str();
      }
    }
  }
}

// Row tiles of 16 query rows (two n-tiles: 4 query heads per KV head, Lq = 4) whose splits merge
// in the tensor-core kernel, the compact epilogue of mma_kernel.cuh (kCompactEpi): with sinks,
// every other row fully masked (zeros), f16 and bf16, D = 128 (at most 8 splits) and D = 64 with
// more than 8 splits (two rounds of loads of o); the cluster merge is off, so that the splits
// merge through their partials. Each case is checked to take that plan, then held to the
// reference, with the output aligned and 2 bytes off its 8-byte alignment (the merge's 8-byte
// stores and their fallback), and again with the combine kernel.
TEST(CudaAttention, TwoNTileInKernelMerge) {
  QSDPA_REQUIRE_CUDA();
  struct Restore {  // (also when an assertion ends the test early)
    bool was = cuda::set_cluster_merge(false);
    ~Restore() { cuda::set_cluster_merge(was); }
  } restore;
  for (DType t : {DType::f16, DType::bf16})
    for (int D : {128, 64}) {
      // the first batch size whose plan merges 2 or more (D = 64: more than 8) splits in the kernel
      Case k;
      bool found = false;
      for (int64_t B = 1; B <= 12 && !found; ++B) {
        k = Case{};
        k.dtype = t, k.kf = k.vf = {4, 64}, k.B = B, k.Hq = 16, k.Hkv = 4, k.Lq = 4, k.N = 4096, k.D = D;
        k.sinks = true, k.bool_mask = MaskKind::u8, k.seed = 40 + uint64_t(B);
        test::Problem h(k);
        test::DeviceProblem d(h);
        const int splits = cuda::planned_splits(d.params());
        found = cuda::uses_tensor_cores(d.params()) && cuda::uses_in_kernel_merge(d.params()) &&
                (D == 128 ? splits >= 2 : splits > 8);
      }
      EXPECT_TRUE(found) << "no batch size merges its two-n-tile row tiles in the kernel: " << k.str();
      if (!found) continue;
      test::Problem h(k);
      mask_every_other_row(h);  // (no key visible: zeros)
      EXPECT_EQ(run_problem(h, false), "") << k.str();
      EXPECT_EQ(every_other_row_zero(h, h.out), "") << k.str();
      {  // the output 2 bytes past an 8-byte boundary
        test::DeviceProblem d(h);
        test::DeviceBuffer out(h.out.size() + 16);
        AttentionParams p = d.params();
        p.out = out.as<char>() + 2;
        CUDA_ASSERT(cudaMemset(out.as<char>(), 0xff, h.out.size() + 16));
        const Status s = attention(p);
        ASSERT_TRUE(s.ok()) << s.message;
        std::vector<uint8_t> got(h.out.size());
        CUDA_ASSERT(cudaMemcpy(got.data(), p.out, got.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(test::check_against_reference(h.params(Backend::reference), got.data()), "") << "misaligned: " << k.str();
        EXPECT_EQ(every_other_row_zero(h, got), "") << "misaligned: " << k.str();
      }
      const bool was = cuda::set_in_kernel_merge(false);
      EXPECT_EQ(run_problem(h, false), "") << "combine kernel: " << k.str();
      cuda::set_in_kernel_merge(was);
    }
}

// Wide rows (D = 256 and 512, 8 query rows per row tile) merging many splits in the tensor-core
// kernel: at D = 256 each split adds 4 loads of o per thread of the merging block, so that from 9
// splits on, the default plan (at most 32 loads per thread, in_kernel_merge) leaves them to the
// combine kernel; the test raises that cap so that they merge in the kernel. 4-bit and 8-bit, f16
// and bf16, sinks, every other row fully masked (zeros); each case is checked to take that plan
// (on a device of 100 SMs or more, with more than 8 splits), held to the reference twice in a row
// (a counter left non-zero would spoil the second call), then with the combine kernel, then twice
// with the combine kernel's rows waiting for their own row tile (counted arrivals).
TEST(CudaAttention, WideRowsManySplitsInKernelMerge) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();  // (D = 512 on the tensor cores)
  int sms = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Restore {  // (also when an assertion ends the test early)
    bool cl = cuda::set_cluster_merge(false);
    int64_t loads = cuda::set_merge_max_loads(int64_t(1) << 20);
    ~Restore() {
      cuda::set_cluster_merge(cl);
      cuda::set_merge_max_loads(loads);
    }
  } restore;
  uint64_t seed = 9900;
  for (int D : {256, 512})
    for (DType t : {DType::f16, DType::bf16})
      for (int bits : {4, 8}) {
        Case k;
        k.dtype = t, k.kf = k.vf = {bits, 64}, k.B = 2, k.Hq = 16, k.Hkv = D == 256 ? 2 : 1, k.Lq = 1;
        k.N = 8192 + 77, k.D = D, k.sinks = true, k.bool_mask = MaskKind::u8, k.seed = seed++;
        test::Problem h(k);
        mask_every_other_row(h);  // (no key visible: zeros)
        {
          test::DeviceProblem d(h);
          const bool tc = cuda::uses_tensor_cores(d.params());
          EXPECT_EQ(tc, D == 256 || want) << k.str();
          if (!tc) continue;
          EXPECT_TRUE(cuda::uses_in_kernel_merge(d.params())) << k.str();
          if (sms >= 100) {
            EXPECT_GT(cuda::planned_splits(d.params()), 8) << k.str();
          }
        }
        // twice in the kernel, then by the combine kernel, then twice by the combine kernel whose
        // rows wait for their own row tile (counted arrivals)
        for (int call = 0; call < 5; ++call) {
          const bool in_kernel = call < 2, arrivals = call >= 3;
          const bool was = cuda::set_in_kernel_merge(in_kernel), was_arr = cuda::set_combine_arrivals(arrivals);
          if (arrivals) {
            test::DeviceProblem d(h);
            EXPECT_EQ(cuda::uses_combine_arrivals(d.params()), sm90_or_newer()) << k.str();
          }
          const std::string r = run_problem(h, false);
          cuda::set_in_kernel_merge(was);
          cuda::set_combine_arrivals(was_arr);
          EXPECT_EQ(r, "") << (in_kernel ? "in the kernel, call " : arrivals ? "counted arrivals, call " : "combine kernel, call ")
                           << call << ": " << k.str();
          ASSERT_EQ(every_other_row_zero(h, h.out), "") << "call " << call << ": " << k.str();
        }
      }
}

// D = 512 with 9 to 16 query rows per KV head, f16, 4- and 8-bit: the kernel with the rows on the
// mma's M dimension (mma_rowsm.cuh; sm_90a, else the generic kernel). 16, 12 and 9 rows (padding
// rows in the block of 16), Lq = 4 and 3 (each row its own causal position), windows, u8 and u32
// boolean masks, float masks, sinks, short caches (one split, a partial tile) and long ones (many
// splits), and the three merges of the splits (the combine kernel, in the kernel, the combine
// kernel with counted arrivals); each case is checked to take the kernel meant, then held to the
// reference (and the generic kernel with it). Then the 16-row cases again on the d-split kernel
// (the kernel turned off), which the same calls took before.
TEST(CudaAttention, HeadDim512RowsOnM) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  struct On {  // (on whatever the build's default; restored when an assertion ends the test early)
    bool was = cuda::set_rows_on_m(true);
    ~On() { cuda::set_rows_on_m(was); }
  } on;
  struct Rows {
    int64_t Hq, Hkv, Lq;
  };
  uint64_t seed = 12000;
  int n = 0;
  for (int bits : {4, 8})
    for (Rows r : {Rows{16, 1, 1}, Rows{12, 1, 1}, Rows{9, 1, 1}, Rows{8, 2, 4}, Rows{3, 1, 3}})
      for (int var = 0; var < 3; ++var) {
        Case c;
        c.dtype = DType::f16;
        c.kf = c.vf = {bits, 64};
        c.B = 2, c.Hq = r.Hq, c.Hkv = r.Hkv, c.Lq = r.Lq, c.D = 512;
        c.N = var == 0 ? 77 + 13 * n : var == 1 ? 1000 + n : 6000 + 7 * n;
        c.sinks = n % 2 == 1;
        c.window = n % 4 == 2 ? 300 : 0;
        if (n % 5 == 1) c.bool_mask = MaskKind::u8;
        if (n % 5 == 3) c.bool_mask = MaskKind::u32;
        if (n % 5 == 4) c.float_mask = true;
        c.seed = seed++;
        ++n;
        test::Problem h(c);
        {
          test::DeviceProblem d(h);
          EXPECT_EQ(cuda::uses_rows_on_m(d.params(), true), cuda::fixed_group_build()) << c.str();
          EXPECT_EQ(cuda::uses_tensor_cores(d.params()), want) << c.str();
        }
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
        if (var != 1) continue;
        // the same case merged in the kernel, then by the combine kernel with counted arrivals
        // (twice each: a counter left non-zero would spoil the second call)
        for (int call = 0; call < 4; ++call) {
          const bool in_kernel = call < 2;
          const bool was = cuda::set_in_kernel_merge(in_kernel), was_arr = cuda::set_combine_arrivals(!in_kernel);
          const int64_t loads = cuda::set_merge_max_loads(in_kernel ? int64_t(1) << 20 : 0);
          if (want) {
            test::DeviceProblem d(h);
            EXPECT_EQ(cuda::uses_in_kernel_merge(d.params()), in_kernel) << c.str();
            if (!in_kernel) {
              EXPECT_EQ(cuda::uses_combine_arrivals(d.params()), sm90_or_newer()) << c.str();
            }
          }
          const std::string e = run_problem(h, false);
          cuda::set_in_kernel_merge(was);
          cuda::set_combine_arrivals(was_arr);
          cuda::set_merge_max_loads(loads);
          EXPECT_EQ(e, "") << (in_kernel ? "in the kernel, call " : "counted arrivals, call ") << call << ": " << c.str();
        }
      }
  EXPECT_EQ(n, 30);
  cuda::set_rows_on_m(false);
  for (int bits : {4, 8}) {
    Case c;
    c.dtype = DType::f16, c.kf = c.vf = {bits, 64}, c.B = 2, c.Hq = 16, c.Hkv = 1, c.D = 512, c.N = 3001;
    c.sinks = true, c.seed = seed++;
    test::Problem h(c);
    {
      test::DeviceProblem d(h);
      EXPECT_FALSE(cuda::uses_rows_on_m(d.params(), true)) << c.str();
      EXPECT_EQ(cuda::uses_tensor_cores(d.params()), want) << c.str();
    }
    EXPECT_EQ(test::run_cuda_case(c), "") << "turned off: " << c.str();
  }
}

// The query rows at any alignment. The kernels read them in 16-byte pieces where a piece's address
// is 16-byte aligned and element by element where it is not (mma_kernel.cuh, kQVec: the two-n-tile
// kernels and the 4-warp one-n-tile kernels; the tile pool's blocks read element by element):
// q 2 bytes past a 16-byte boundary (every piece misaligned), and q rows D + 4
// elements apart (consecutive rows alternately aligned and not); 16 rows and 12 (a padding part of
// the row tile) at D = 128, 16 at D = 64, one n-tile (8 rows at D = 128, 4 at D = 256), and the
// tile pool's blocks of 16 and of 8 warps (forced); f16 and bf16; each on the tensor cores, held to
// the reference; and D = 512 (the d-split kernels, 4 rows in a tile of 8; sm_90a).
TEST(CudaAttention, QueryRowsAtAnyAlignment) {
  QSDPA_REQUIRE_CUDA();
  struct Shape {
    int64_t D, Lq;
    int pool;  // cuda::set_block_pool's mode: 1 the planner's choice, 2 / 3 blocks of 16 / 8 warps
    int group;
  };
  struct Restore {
    int mode = cuda::set_block_pool(1);
    ~Restore() { cuda::set_block_pool(mode); }
  } restore;
  uint64_t seed = 7100;
  for (DType t : {DType::f16, DType::bf16})
    for (Shape sh : {Shape{128, 4, 1, 64}, Shape{128, 3, 1, 64}, Shape{64, 4, 1, 32}, Shape{128, 2, 1, 64},
                     Shape{256, 1, 1, 64}, Shape{128, 1, 2, 64}, Shape{128, 2, 3, 64}, Shape{512, 1, 1, 64}})
      for (int how = 0; how < 2; ++how) {
        // (the pool's kernels and D = 512 on the tensor cores are sm_90a's)
        if ((sh.pool > 1 || sh.D == 512) && !device_takes_sm90a_kernels()) continue;
        cuda::set_block_pool(sh.pool);
        Case c;
        c.dtype = t, c.kf = c.vf = {4, sh.group}, c.D = sh.D;
        c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = sh.Lq, c.N = 700, c.sinks = true, c.seed = seed++;
        test::Problem h(c);
        test::DeviceProblem d(h);
        AttentionParams p = d.params();
        const size_t ts = test::tsize(t);
        const int64_t D = c.D, rows = c.B * c.Hq * c.Lq, ls = how == 0 ? D : D + 4;  // (elements row to row)
        const size_t shift = how == 0 ? 2 : 0;
        std::vector<uint8_t> qh(size_t(rows * ls) * ts, 0);
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(qh.data() + size_t(r * ls) * ts, h.q.data() + size_t(r * D) * ts, size_t(D) * ts);
        test::DeviceBuffer qd(qh.size() + 32);
        char* q = qd.as<char>() + shift;
        CUDA_ASSERT(cudaMemcpy(q, qh.data(), qh.size(), cudaMemcpyHostToDevice));
        p.q = q;
        p.q_strides = {c.Hq * c.Lq * ls, c.Lq * ls, ls};
        EXPECT_TRUE(cuda::uses_tensor_cores(p)) << c.str();
        if (sh.pool > 1) {
          EXPECT_EQ(cuda::planned_pool(p), sh.pool - 1) << c.str();
        }
        const Status s = attention(p);
        ASSERT_TRUE(s.ok()) << s.message;
        CUDA_ASSERT(cudaMemcpy(h.out.data(), p.out, h.out.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(test::check_against_reference(h.params(Backend::reference), h.out.data()), "")
            << (how == 0 ? "q 2 bytes past 16: " : "q rows D + 4 apart: ") << c.str();
      }
}

TEST(CudaAttention, Windows) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 50;
  for (DType t : kTypes)
    for (int64_t n : {5, 300, 2000})
      for (int64_t w : {int64_t(1), int64_t(2), int64_t(100), n, n + 100}) {
        Case c = base_case(t);
        c.N = n, c.window = w, c.sinks = w % 2 == 0, c.seed = seed++;
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
      }
}

TEST(CudaAttention, PrefillAndManyQueryRows) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 80;
  for (DType t : kTypes) {
    for (int64_t w : {0, 8}) {  // Lq = N: causal prefill
      Case c = base_case(t);
      c.N = 40, c.Lq = 40, c.window = w, c.Hq = 4, c.Hkv = 2, c.seed = seed++;
      EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
    }
    for (int64_t d : {64, 512}) {  // rep * Lq = 72 rows per KV head: several row tiles
      Case c = base_case(t);
      c.Hq = 16, c.Hkv = 2, c.Lq = 9, c.N = 600, c.D = d, c.sinks = true, c.bool_mask = MaskKind::u8,
      c.seed = seed++;
      EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
    }
  }
}

TEST(CudaAttention, OtherHeadDimsAndMha) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 120;
  for (DType t : kTypes) {
    for (int64_t d : {32, 160, 384, 480})
      for (int group : {32, 128}) {
        if (d % group) continue;
        Case c = base_case(t);
        c.D = d, c.kf = {2, group}, c.vf = {8, 32}, c.seed = seed++;
        EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
      }
    Case c = base_case(t);  // multi-head attention: one query head per KV head
    c.Hq = 16, c.Hkv = 16, c.Lq = 1, c.N = 513, c.D = 128, c.float_mask = true, c.seed = seed++;
    EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
  }
}

// Long caches: more than 64 splits (the combine's lane groups over three and more batches of 32
// splits), sinks, windows that leave splits without a visible key, masks.
TEST(CudaAttention, LongCacheManySplits) {
  QSDPA_REQUIRE_CUDA();
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64};
  c.B = 1, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.N = 50000, c.D = 128, c.sinks = true, c.seed = 7;
  {
    test::Problem h(c);
    test::DeviceProblem d(h);
    EXPECT_GT(cuda::planned_splits(d.params()), 64) << c.str();
  }
  EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
  const Case c4 = c;
  c.dtype = DType::bf16, c.kf = {8, 32}, c.vf = {4, 128}, c.Lq = 3, c.window = 3000, c.seed = 8;
  EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
  c.dtype = DType::f32, c.kf = {2, 64}, c.vf = {8, 64}, c.Lq = 2, c.window = 0, c.N = 20000, c.D = 256,
  c.Hq = 4, c.Hkv = 1, c.bool_mask = MaskKind::u32, c.seed = 9;
  EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
  // More splits than a cluster takes, merged in the tensor-core kernel (the first case's 131 splits
  // go to the combine kernel): the first case with a cache of 7000 tokens (17-28 splits: at most
  // 32 loads of o per thread for its 4 rows, in_kernel_merge), and the same with the combine kernel.
  c = c4;
  c.N = 7000, c.seed = 10;
  {
    test::Problem h(c);
    test::DeviceProblem d(h);
    const int splits = cuda::planned_splits(d.params());
    EXPECT_GT(splits, 16) << c.str();
    EXPECT_EQ(cuda::uses_in_kernel_merge(d.params()), cuda::uses_tensor_cores(d.params()) && splits <= 32)
        << splits << " splits: " << c.str();
  }
  EXPECT_EQ(test::run_cuda_case(c), "") << c.str();
  const bool was = cuda::set_in_kernel_merge(false);
  const std::string r = test::run_cuda_case(c);
  cuda::set_in_kernel_merge(was);
  EXPECT_EQ(r, "") << "combine kernel: " << c.str();
}

// Buffers at offsets that break 16-, 8- and 4-byte alignment (packed words at 4 bytes, T-typed
// tensors at 2 bytes for f16/bf16): the kernels fall back to narrower copies.
TEST(CudaAttention, MisalignedBuffers) {
  QSDPA_REQUIRE_CUDA();
  for (DType t : {DType::f16, DType::bf16, DType::f32}) {
    Case c = base_case(t);
    c.N = 333, c.sinks = true, c.float_mask = true, c.kf = {4, 32}, c.vf = {2, 64}, c.D = 128;
    test::Problem h(c);
    const size_t shift_t = test::tsize(t) == 2 ? 2 : 4;
    std::vector<test::DeviceBuffer> keep;
    auto place = [&](const void* src, size_t bytes, size_t shift) -> void* {
      keep.emplace_back(bytes + 64);
      char* p = keep.back().as<char>() + shift;
      if (cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
      return p;
    };
    AttentionParams p = h.params(Backend::cuda);
    p.q = place(h.q.data(), h.q.size(), shift_t);
    p.k.packed = static_cast<const uint32_t*>(place(h.k.packed.data(), h.k.packed.size() * 4, 4));
    p.k.scales = place(h.k.scales.data(), h.k.scales.size(), shift_t);
    p.k.biases = place(h.k.biases.data(), h.k.biases.size(), shift_t);
    p.v.packed = static_cast<const uint32_t*>(place(h.v.packed.data(), h.v.packed.size() * 4, 4));
    p.v.scales = place(h.v.scales.data(), h.v.scales.size(), shift_t);
    p.v.biases = place(h.v.biases.data(), h.v.biases.size(), shift_t);
    p.sinks = static_cast<const float*>(place(h.sinks.data(), h.sinks.size() * 4, 4));
    p.float_mask = place(h.float_mask.data(), h.float_mask.size(), shift_t);
    std::vector<uint8_t> poison(h.out.size(), 0xff);
    p.out = place(poison.data(), poison.size(), shift_t);
    const Status s = attention(p);
    ASSERT_TRUE(s.ok()) << s.message;
    CUDA_ASSERT(cudaMemcpy(h.out.data(), p.out, h.out.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(test::check_against_reference(h.params(Backend::reference), h.out.data()), "") << c.str();
  }
}

// A small, varied set for compute-sanitizer (memcheck, racecheck, initcheck): every K/V bits,
// several head dims and row tilings, masks, window, sinks, several splits, a caller workspace.
TEST(CudaSanitize, Representative) {
  QSDPA_REQUIRE_CUDA();
  std::vector<Case> cases;
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.B = 1, c.Hq = 4, c.Hkv = 1, c.N = 600, c.D = 128, c.sinks = true;
  cases.push_back(c);
  c.dtype = DType::bf16, c.kf = {2, 32}, c.vf = {8, 32}, c.Hq = 6, c.Hkv = 2, c.Lq = 3, c.N = 700, c.D = 96,
  c.window = 50, c.bool_mask = MaskKind::u8;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f32, c.kf = {8, 128}, c.vf = {2, 128}, c.Hq = 8, c.Hkv = 1, c.Lq = 2, c.N = 520, c.D = 512,
  c.float_mask = true;
  cases.push_back(c);
  c = Case{};
  c.dtype = DType::f16, c.kf = {2, 64}, c.vf = {2, 32}, c.Hq = 2, c.Hkv = 2, c.N = 33, c.D = 64,
  c.bool_mask = MaskKind::u32;
  cases.push_back(c);
  c = Case{};  // 2 bits on the tensor cores
  c.dtype = DType::bf16, c.kf = c.vf = {2, 64}, c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 2, c.N = 900, c.D = 128,
  c.window = 300, c.sinks = true;
  cases.push_back(c);
  c = Case{};  // D = 512 on the tensor cores (sm_90a: the d-split's shared-memory exchange)
  c.dtype = DType::f16, c.kf = {8, 64}, c.vf = {4, 64}, c.B = 1, c.Hq = 16, c.Hkv = 1, c.N = 700, c.D = 512,
  c.sinks = true, c.bool_mask = MaskKind::u8;
  cases.push_back(c);
  c = Case{};  // D = 512 with 12 rows of 16 per KV head, a partial last tile, a window: on the
  // d-split kernel here, and with the rows on the mma's M below (that kernel is off by default)
  c.dtype = DType::f16, c.kf = c.vf = {4, 64}, c.B = 2, c.Hq = 12, c.Hkv = 1, c.N = 1501, c.D = 512,
  c.window = 700, c.float_mask = true;
  cases.push_back(c);
  const Case rows_on_m = c;
  c = Case{};  // a partial last tile whose scale span ends inside a 16-byte piece, at the buffers' end
  c.dtype = DType::bf16, c.kf = c.vf = {4, 64}, c.B = 2, c.Hq = 1, c.Hkv = 1, c.N = 33, c.D = 128, c.sinks = true;
  cases.push_back(c);
  for (const Case& cs : cases) EXPECT_EQ(test::run_cuda_case(cs), "") << cs.str();
  {  // the rows-on-M kernel turned on (sm_90a): its 4-bit loop's barrier objects and the exchange
     // buffers it alternates by tile parity, under racecheck
    const bool was = cuda::set_rows_on_m(true);
    {
      test::Problem h(rows_on_m);
      test::DeviceProblem d(h);
      EXPECT_EQ(cuda::uses_rows_on_m(d.params(), true), cuda::fixed_group_build()) << rows_on_m.str();
    }
    const std::string r = test::run_cuda_case(rows_on_m);
    cuda::set_rows_on_m(was);
    EXPECT_EQ(r, "") << "rows on M: " << rows_on_m.str();
  }
  for (const int mode : {2, 3}) {  // the last case on the tile pool's blocks of 16 warps, then of 8
    const int was = cuda::set_block_pool(mode);
    const std::string r = test::run_cuda_case(cases.back());
    cuda::set_block_pool(was);
    EXPECT_EQ(r, "") << "tile pool, mode " << mode << ": " << cases.back().str();
  }
  {  // the tensor-core case again with its splits merged by the combine kernel, not a cluster
    const bool was = cuda::set_cluster_merge(false);
    const std::string r = test::run_cuda_case(cases[0]);
    cuda::set_cluster_merge(was);
    EXPECT_EQ(r, "") << "combine kernel: " << cases[0].str();
  }

  // caller-provided workspace (the combine kernel), and the same zero-filled (the in-kernel merge,
  // without clusters), twice
  test::Problem h(cases[0]);
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  const size_t bytes = attention_workspace_size(p);
  ASSERT_GT(bytes, 0u);
  test::DeviceBuffer ws(bytes);
  p.workspace = ws.get(), p.workspace_bytes = bytes;
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(d.fetch(), "");
  EXPECT_EQ(d.check(), "");
  const bool was = cuda::set_cluster_merge(false);
  CUDA_ASSERT(cudaMemset(ws.get(), 0, bytes));
  p.workspace_zeroed = true;
  EXPECT_EQ(cuda::uses_in_kernel_merge(p), cuda::uses_tensor_cores(p));
  for (int call = 0; call < 2; ++call) {
    d.poison();
    const Status z = attention(p);
    ASSERT_TRUE(z.ok()) << z.message;
    ASSERT_EQ(d.fetch(), "");
    EXPECT_EQ(d.check(), "") << "in-kernel merge, call " << call;
  }
  cuda::set_cluster_merge(was);
}
