// Which problems the CUDA backend gives to its tensor-core kernel (host logic only: these tests
// run without a GPU too, so CI holds the dispatch rules). The GPU tests check that the kernel is
// right on what it takes; these check that it takes what it should and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

#include "../../src/cuda/split_kv.cuh"
#include "../../src/cuda/testing.hpp"
#include "qsdpa/qsdpa.hpp"

using namespace qsdpa;

namespace {

// Never dereferenced: uses_tensor_cores() looks at shapes, formats, layouts and alignment only.
alignas(16) uint8_t g_dummy[64];

AttentionParams problem(DType t, int kbits, int vbits, int kgroup, int vgroup, int64_t D) {
  AttentionParams p;
  p.dtype = t;
  p.B = 2, p.Hq = 8, p.Hkv = 2, p.Lq = 1, p.N = 4096, p.D = D;
  const auto* w = reinterpret_cast<const uint32_t*>(g_dummy);
  p.q = g_dummy, p.out = g_dummy;
  p.k = {{kbits, kgroup}, w, g_dummy, g_dummy, {}};
  p.v = {{vbits, vgroup}, w, g_dummy, g_dummy, {}};
  return p;
}

std::string name(const AttentionParams& p) {
  return std::string(to_string(p.dtype)) + " K" + std::to_string(p.k.format.bits) + "/g" +
         std::to_string(p.k.format.group) + " V" + std::to_string(p.v.format.bits) + "/g" +
         std::to_string(p.v.format.group) + " D=" + std::to_string(p.D);
}

}  // namespace

TEST(CudaDispatch, TensorCoresTakeOneWidthOrEightBitKeysWithFourBitValues) {
  for (DType t : {DType::f16, DType::bf16})
    for (int64_t D : {64, 128, 256})
      for (int g : {32, 64, 128}) {
        if (D % g) continue;
        for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}}) {
          const AttentionParams p = problem(t, kb, vb, g, g, D);
          // 2 bits: groups of 64 or more and two 64-dim pieces per row at least
          const bool want = kb != 2 || (g >= 64 && D >= 128);
          EXPECT_EQ(cuda::uses_tensor_cores(p), want) << name(p);
        }
      }
}

TEST(CudaDispatch, GenericKernelTakesTheRest) {
  // 4-bit keys with 8-bit values, 2-bit with groups of 32 or D = 64, 2-bit with another width,
  // different group sizes, f32, head dims it has no instantiation for: the generic kernel.
  for (const AttentionParams& p :
       {problem(DType::f16, 4, 8, 64, 64, 128), problem(DType::f16, 2, 2, 32, 32, 128),
        problem(DType::bf16, 2, 2, 64, 64, 64), problem(DType::f16, 2, 4, 64, 64, 128),
        problem(DType::f16, 8, 2, 64, 64, 128),
        problem(DType::bf16, 8, 4, 64, 32, 128), problem(DType::f16, 8, 4, 128, 64, 128),
        problem(DType::f32, 4, 4, 64, 64, 128), problem(DType::f32, 8, 4, 64, 64, 128),
        problem(DType::f16, 4, 4, 32, 32, 96), problem(DType::f16, 8, 4, 64, 64, 512)})
    EXPECT_FALSE(cuda::uses_tensor_cores(p, false)) << name(p);
}

TEST(CudaDispatch, HeadDim512OnSm90aWithGroupsOf64) {
  // D = 512 (the d-split instantiations): every format of the tensor-core kernel with groups of 64
  // on contiguous caches (dense, or capacities past N), on devices that run sm_90a code, and only
  // where the build has sm_90a; other groups, paged caches and other devices: the generic kernel.
  alignas(16) static int32_t table[2 * 256] = {};
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}}) {
      for (int g : {32, 64, 128}) {
        AttentionParams p = problem(t, kb, vb, g, g, 512);
        const bool want = cuda::fixed_group_build() && g == 64;
        EXPECT_EQ(cuda::uses_tensor_cores(p, true), want) << name(p);
        EXPECT_FALSE(cuda::uses_tensor_cores(p, false)) << name(p);
        EXPECT_EQ(cuda::uses_fixed_group(p, true), want) << name(p);
        CacheLayout cap;
        cap.head_stride = 4096 + 8;  // capacity past N
        p.k.layout = p.v.layout = cap;
        EXPECT_EQ(cuda::uses_tensor_cores(p, true), want) << name(p) << " capacity";
        CacheLayout pages;
        pages.block_table = table;
        pages.block_table_stride = 256;
        pages.page_size = 64;
        p.k.layout = p.v.layout = pages;
        EXPECT_FALSE(cuda::uses_tensor_cores(p, true)) << name(p) << " paged";
        n += want;
      }
    }
  EXPECT_EQ(n, cuda::fixed_group_build() ? 8 : 0);
}

TEST(CudaDispatch, HeadDim512RowsOnMTakesNineToSixteenRowsOfF16) {
  // The D = 512 kernel with the rows on the mma's M dimension: f16, 4- or 8-bit keys and values of
  // one width, groups of 64, contiguous caches, 9 to 16 query rows per KV head, sm_90a; the rest of
  // D = 512 stays on the d-split kernel (or the generic one). Turned off (set_rows_on_m), none.
  struct On {
    bool was = cuda::set_rows_on_m(true);
    ~On() { cuda::set_rows_on_m(was); }
  } on;
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}})
      for (auto [hq, hkv, lq] : {std::tuple{16, 1, 1}, std::tuple{9, 1, 1}, std::tuple{8, 2, 4}, std::tuple{8, 1, 1},
                                 std::tuple{16, 2, 1}, std::tuple{17, 1, 1}, std::tuple{6, 1, 3}}) {
        AttentionParams p = problem(t, kb, vb, 64, 64, 512);
        p.Hq = hq, p.Hkv = hkv, p.Lq = lq;
        const int64_t rows = int64_t(hq) / hkv * lq;
        const bool want = cuda::fixed_group_build() && t == DType::f16 && kb == vb && (kb == 4 || kb == 8) &&
                          rows > 8 && rows <= 16;
        EXPECT_EQ(cuda::uses_rows_on_m(p, true), want) << name(p) << " rows " << rows;
        EXPECT_FALSE(cuda::uses_rows_on_m(p, false)) << name(p) << " rows " << rows;
        EXPECT_EQ(cuda::uses_tensor_cores(p, true), cuda::fixed_group_build()) << name(p) << " rows " << rows;
        n += want;
        if (!want) continue;
        cuda::set_rows_on_m(false);
        EXPECT_FALSE(cuda::uses_rows_on_m(p, true)) << name(p) << " turned off";
        EXPECT_TRUE(cuda::uses_tensor_cores(p, true)) << name(p) << " turned off";
        cuda::set_rows_on_m(true);
        AttentionParams q = p;  // groups of 32 or D = 256: not this kernel
        q.k.format.group = q.v.format.group = 32;
        EXPECT_FALSE(cuda::uses_rows_on_m(q, true)) << name(q);
        q = p;
        q.D = 256;
        EXPECT_FALSE(cuda::uses_rows_on_m(q, true)) << name(q);
        alignas(16) static int32_t table[2 * 256] = {};
        CacheLayout pages;  // paged caches: not on the tensor cores at D = 512
        pages.block_table = table;
        pages.block_table_stride = 256;
        pages.page_size = 64;
        q = p;
        q.k.layout = q.v.layout = pages;
        EXPECT_FALSE(cuda::uses_rows_on_m(q, true)) << name(q) << " paged";
      }
  // (f16 4/4 and 8/8, each with 16, 9 and 16 (rep 4 x Lq 4) rows)
  EXPECT_EQ(n, cuda::fixed_group_build() ? 2 * 3 : 0);
}

TEST(CudaDispatch, MisalignedCacheGoesToTheGenericKernel) {
  AttentionParams p = problem(DType::f16, 8, 4, 64, 64, 128);
  ASSERT_TRUE(cuda::uses_tensor_cores(p));
  p.v.scales = g_dummy + 2;  // 2-byte aligned only
  EXPECT_FALSE(cuda::uses_tensor_cores(p));
}

TEST(CudaDispatch, PagedCaches) {
  alignas(16) static int32_t table[2 * 256] = {};
  for (int64_t page : {16, 32, 64, 256})
    for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}}) {
      AttentionParams p = problem(DType::f16, kb, vb, 64, 64, 128);
      CacheLayout pages;
      pages.block_table = table;
      pages.block_table_stride = 256;
      pages.page_size = page;
      p.k.layout = p.v.layout = pages;
      EXPECT_TRUE(cuda::uses_tensor_cores(p)) << name(p) << " pages of " << page;
    }
}

TEST(CudaDispatch, LayoutInstantiations) {
  // 0: contiguous (no block table, token stride 1: dense, a capacity past N, K and V with
  // different capacities); 1: one block table for K and V, pages of 32 tokens or more; 3: the
  // same with 16-token pages; 2: the rest the tensor cores take (K and V in different layouts,
  // pages of 32 or more); -1: not taken.
  alignas(16) static int32_t table[2 * 256] = {};
  alignas(16) static int32_t table2[2 * 256] = {};
  for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}}) {
    AttentionParams p = problem(DType::f16, kb, vb, 64, 64, 128);
    EXPECT_EQ(cuda::tensor_core_layout(p), 0) << name(p) << " dense";

    CacheLayout cap;  // capacity 6144 for N = 4096
    cap.head_stride = 6144;
    p.k.layout = p.v.layout = cap;
    EXPECT_EQ(cuda::tensor_core_layout(p), 0) << name(p) << " capacity";
    CacheLayout cap2 = cap;
    cap2.head_stride = 8192;
    p.v.layout = cap2;
    EXPECT_EQ(cuda::tensor_core_layout(p), 0) << name(p) << " K and V of different capacities";

    CacheLayout strided = cap;
    strided.token_stride = 2;  // rows two apart: not for the tensor cores
    p.k.layout = p.v.layout = strided;
    EXPECT_EQ(cuda::tensor_core_layout(p), -1) << name(p) << " token stride 2";

    for (int64_t page : {16, 32, 64, 256}) {
      CacheLayout pages;
      pages.block_table = table;
      pages.block_table_stride = 256;
      pages.page_size = page;
      p.k.layout = p.v.layout = pages;
      const int want = page >= 32 ? 1 : 3;
      EXPECT_EQ(cuda::tensor_core_layout(p), want) << name(p) << " pages of " << page;

      CacheLayout other = pages;
      other.block_table = table2;  // V pages at other places
      p.v.layout = other;
      EXPECT_EQ(cuda::tensor_core_layout(p), page >= 32 ? 2 : -1) << name(p) << " two tables, pages of " << page;
      p.v.layout = cap;  // paged K, contiguous V
      EXPECT_EQ(cuda::tensor_core_layout(p), page >= 32 ? 2 : -1) << name(p) << " paged K, contiguous V, " << page;
    }
  }
}

TEST(CudaDispatch, FixedGroupInstantiations) {
  // The instantiations with the group size 64 as a constant: groups of 64 with D = 128 or 256, on
  // devices that run sm_90a code, in every layout but kAny (K and V in different layouts); never
  // without sm_90a, nor where the build has none.
  alignas(16) static int32_t table[2 * 256] = {};
  alignas(16) static int32_t table2[2 * 256] = {};
  int n = 0;
  for (DType t : {DType::f16, DType::bf16})
    for (int64_t D : {64, 128, 256})
      for (int g : {32, 64, 128}) {
        if (D % g) continue;
        for (auto [kb, vb] : {std::pair{4, 4}, std::pair{8, 8}, std::pair{8, 4}, std::pair{2, 2}}) {
          AttentionParams p = problem(t, kb, vb, g, g, D);
          if (!cuda::uses_tensor_cores(p)) continue;
          const bool want = cuda::fixed_group_build() && g == 64 && D >= 128;
          EXPECT_EQ(cuda::uses_fixed_group(p, true), want) << name(p);
          EXPECT_FALSE(cuda::uses_fixed_group(p, false)) << name(p);
          for (int64_t page : {16, 64}) {
            CacheLayout pages;
            pages.block_table = table;
            pages.block_table_stride = 256;
            pages.page_size = page;
            p.k.layout = p.v.layout = pages;
            EXPECT_EQ(cuda::uses_fixed_group(p, true), want) << name(p) << " pages of " << page;
            if (page >= 32) {
              CacheLayout other = pages;
              other.block_table = table2;
              p.v.layout = other;  // two block tables: the general-layout kernel, runtime group
              EXPECT_FALSE(cuda::uses_fixed_group(p, true)) << name(p) << " two tables";
            }
            p.k.layout = p.v.layout = CacheLayout{};
          }
          ++n;
        }
      }
  EXPECT_GT(n, 40);
}

// The splits of a sequence that hold a token (split_kv.cuh, splits_with_tokens: the combine kernel
// in one round reads o from these alone) are exactly those the tensor-core kernel does not skip as
// empty (mma_kernel.cuh: tb = t_begin + s chunk, te = min(n, tb + chunk), empty when tb >= te),
// and they come first: every (n, t_begin, chunk, S) of a small grid, against that rule split by
// split.
TEST(CudaDispatch, SplitsWithTokensAreTheOnesTheKernelDoesNotSkip) {
  int cases = 0;
  for (int64_t chunk : {128, 256, 384, 4096})
    for (int64_t t_begin : {int64_t(0), int64_t(128), int64_t(1000)})
      for (int S : {1, 2, 7, 32, 64})
        for (int64_t n = 0; n <= t_begin + (S + 1) * chunk; n += 37) {
          int with = 0;
          bool gap = false;  // a split with a token after an empty one
          for (int s = 0; s < S; ++s) {
            const int64_t tb = t_begin + s * chunk, te = std::min(n, tb + chunk);
            if (tb < te) {
              gap = gap || with < s;
              ++with;
            }
          }
          ASSERT_FALSE(gap) << "n=" << n << " t_begin=" << t_begin << " chunk=" << chunk << " S=" << S;
          ASSERT_EQ(cuda::splits_with_tokens(n, t_begin, chunk, S), with)
              << "n=" << n << " t_begin=" << t_begin << " chunk=" << chunk << " S=" << S;
          ++cases;
        }
  EXPECT_GT(cases, 1000);
}

namespace {

// The planner's tile-pool settings at their defaults (mode 1, the 2-bit pool on) for a test's
// length, and as they were afterwards.
struct PoolDefaults {
  int mode = cuda::set_block_pool(1);
  bool pool_2bit = cuda::set_pool_2bit(true);
  ~PoolDefaults() {
    cuda::set_block_pool(mode);
    cuda::set_pool_2bit(pool_2bit);
  }
};

// The bench's D = 128 shape (Hq = 32, Hkv = 8) of B sequences of N tokens, keys and values of
// `bits` in groups of 64, and its name.
AttentionParams bench_shape(DType t, int bits, int64_t B, int64_t N) {
  AttentionParams p = problem(t, bits, bits, 64, 64, 128);
  p.B = B, p.Hq = 32, p.Hkv = 8, p.N = N;
  return p;
}
std::string shape_name(const AttentionParams& p) {
  return name(p) + " B=" + std::to_string(p.B) + " N=" + std::to_string(p.N);
}

}  // namespace

// AttentionParams::deterministic keeps a call off the tile pool (whose warps take their tiles in
// the order they come free, so a row's sums add up in a different order from call to call): on a
// described H200 (132 SMs, sm_90a), problems the pool takes without the flag, in the planner's
// default and in the forced modes, take it with none of them once the flag is set. (The GPU test
// CudaAttention.DeterministicCallsRepeatTheirBits checks the bits; this holds the rule in CI.)
TEST(CudaDispatch, DeterministicCallsNeverTakeTheTilePool) {
  const PoolDefaults restore;
  const bool build = cuda::fixed_group_build();  // (the pool's kernels are sm_90a instantiations)
  struct Shape {
    int bits;
    int64_t B, Hq, Hkv, N;
    bool by_default;  // the default mode takes the pool on this shape (large enough)
  };
  const Shape shapes[] = {{4, 8, 32, 8, 32768, true}, {4, 2, 16, 4, 20000, false}, {2, 8, 32, 8, 32768, false}};
  int pooled = 0;
  for (const Shape& s : shapes)
    for (int mode : {1, 2, 3}) {
      cuda::set_block_pool(mode);
      AttentionParams p = problem(DType::f16, s.bits, s.bits, 64, 64, 128);
      p.B = s.B, p.Hq = s.Hq, p.Hkv = s.Hkv, p.N = s.N;
      const std::string what = shape_name(p) + " mode " + std::to_string(mode);
      const int free_pool = cuda::planned_pool(p, 132, true);
      if (mode >= 2) {
        EXPECT_EQ(free_pool, build ? mode - 1 : 0) << what;
      }
      if (mode == 1 && s.by_default) {
        EXPECT_EQ(free_pool, build ? 1 : 0) << what;
      }
      pooled += free_pool != 0;
      EXPECT_EQ(cuda::planned_pool(p, 132, false), 0) << what << " (no sm_90a)";
      p.deterministic = true;
      EXPECT_EQ(cuda::planned_pool(p, 132, true), 0) << what << " deterministic";
    }
  if (build) {
    EXPECT_GE(pooled, 7) << "the shapes should reach the pool without the flag";
  }
}

// The planner's default (set_block_pool(1)) on the bench's D = 128 shapes (Hq = 32, Hkv = 8), on a
// described H200 (132 SMs, sm_90a): the rules of backend.cu's pool_wanted, each measured there
// (docs/PERF.md): the pool in blocks of 16 warps where the row tiles are at most the SMs and fill a
// round, in blocks of 8 where they are at most twice the SMs; not for calls with fewer than 8
// tiles per warp of a full wave (B=1 N=4096); 2-bit (f16 only) only where the row tiles are at
// least a quarter of the SMs (not B=1 N=131072), and not at all with set_pool_2bit(false); never
// for 8-bit or bf16 2-bit caches (the pool has no kernels for them).
TEST(CudaDispatch, TilePoolDefaultsOnTheBenchShapes) {
  const PoolDefaults restore;
  const bool build = cuda::fixed_group_build();
  struct Case {
    DType t;
    int bits;
    int64_t B, N;
    int pool;  // with the pool's 2-bit default on
  };
  const Case cases[] = {
      {DType::f16, 4, 8, 32768, 1},  {DType::bf16, 4, 8, 32768, 1}, {DType::f16, 4, 1, 131072, 1},
      {DType::f16, 4, 32, 4096, 2},  {DType::f16, 4, 1, 4096, 0},   {DType::f16, 2, 8, 32768, 1},
      {DType::f16, 2, 32, 4096, 2},  {DType::f16, 2, 1, 131072, 0}, {DType::bf16, 2, 8, 32768, 0},
      {DType::f16, 8, 8, 32768, 0},
  };
  for (const Case& c : cases) {
    const AttentionParams p = bench_shape(c.t, c.bits, c.B, c.N);
    const std::string what = shape_name(p);
    EXPECT_EQ(cuda::planned_pool(p, 132, true), build ? c.pool : 0) << what;
    cuda::set_pool_2bit(false);
    EXPECT_EQ(cuda::planned_pool(p, 132, true), build && c.bits != 2 ? c.pool : 0) << what << " (2-bit pool off)";
    cuda::set_pool_2bit(true);
  }
}

// The in-kernel merge counts its splits' arrivals in the workspace's counters, which must start at
// zero: the library's own workspace (always kept zeroed) and a caller's marked workspace_zeroed may
// take it, a caller's workspace without the mark never does (the combine kernel merges instead).
// On a described H200 (132 SMs, sm_90a), on the bench's D = 128 shapes that merge in the kernel.
TEST(CudaDispatch, InKernelMergeOnlyWithAZeroedWorkspace) {
  struct Restore {
    bool in_kernel = cuda::set_in_kernel_merge(true);
    ~Restore() { cuda::set_in_kernel_merge(in_kernel); }
  } restore;
  alignas(16) static uint8_t ws[64];
  int in_kernel = 0;
  for (auto [bits, B, N] : {std::tuple{4, 8, 32768}, std::tuple{8, 8, 32768}, std::tuple{4, 32, 4096}}) {
    AttentionParams p = bench_shape(DType::f16, bits, B, N);
    const std::string what = shape_name(p);
    const int own = cuda::planned_merge(p, 132, true);  // (the library's workspace)
    EXPECT_GE(own, 1) << what;
    p.workspace = ws, p.workspace_bytes = sizeof ws;
    p.workspace_zeroed = true;
    EXPECT_EQ(cuda::planned_merge(p, 132, true), own) << what << " (a caller's zeroed workspace)";
    p.workspace_zeroed = false;
    const int unmarked = cuda::planned_merge(p, 132, true);
    EXPECT_NE(unmarked, 2) << what << " (a caller's workspace, not marked zeroed)";
    if (own == 2) {
      EXPECT_EQ(unmarked, 3) << what << " (the combine kernel instead)";
    }
    in_kernel += own == 2;
    cuda::set_in_kernel_merge(false);
    p.workspace = nullptr, p.workspace_bytes = 0;
    EXPECT_NE(cuda::planned_merge(p, 132, true), 2) << what << " (in-kernel merge forbidden)";
    cuda::set_in_kernel_merge(true);
  }
  EXPECT_GE(in_kernel, 2) << "the shapes should merge in the kernel with a zeroed workspace";
}

// The in-kernel merge runs in the last block of each row tile, on the call's critical path, so
// the planner takes it only up to a number of 16-byte loads per thread (set_merge_max_loads; the
// default 32): with no loads allowed a call merges in the combine kernel, with many it merges in
// the kernel (a described H200; the library's workspace).
TEST(CudaDispatch, InKernelMergeUpToItsLoadCap) {
  struct Restore {
    bool in_kernel = cuda::set_in_kernel_merge(true);
    int64_t cap = cuda::set_merge_max_loads(32);
    ~Restore() {
      cuda::set_in_kernel_merge(in_kernel);
      cuda::set_merge_max_loads(cap);
    }
  } restore;
  for (auto [bits, B, N] : {std::tuple{4, 8, 32768}, std::tuple{8, 8, 32768}, std::tuple{4, 32, 4096}}) {
    const AttentionParams p = bench_shape(DType::f16, bits, B, N);
    const std::string what = shape_name(p);
    cuda::set_merge_max_loads(0);
    const int none = cuda::planned_merge(p, 132, true);
    cuda::set_merge_max_loads(int64_t(1) << 20);
    const int many = cuda::planned_merge(p, 132, true);
    if (none == 1) {  // (clusters merge without the load cap, where the device offers them)
      EXPECT_EQ(many, 1) << what;
      continue;
    }
    EXPECT_TRUE(none == 3 || none == 4) << what << ": " << none;
    EXPECT_EQ(many, 2) << what;
  }
}
