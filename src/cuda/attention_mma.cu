// Host side of the tensor-core attention kernel (mma_kernel.cuh): which problems it takes, and the
// choice between its layout instantiations (mma_dispatch.cuh).
#include "attention_mma.cuh"

#include <cstdint>

#include "mma_dispatch.cuh"
#include "mma_kernel.cuh"

namespace qsdpa::cuda {
namespace {

using mmad::n_tiles;
constexpr int64_t kMaxRows = 64;  // query rows per KV head (rep * Lq)

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// 8-bit keys with 4-bit values (the common mixed request: keys are the more sensitive).
bool mixed(const AttnArgs& a) { return a.k_bits == 8 && a.v_bits == 4; }

// Caches other than the dense [B, Hkv, N] the kernel reads tile by tile (mma_kernel.cuh):
// consecutive tokens in consecutive rows, no tile across two pages (or, with 16-token pages and one
// layout for K and V, exactly two), and strides that keep each
// tile's scale span at the same 16-byte phase (rows of ng * 2 bytes). K and V may have different
// layouts (and block tables).
bool layout_ok(const AttnArgs& a) {
  const int64_t span = (a.D / a.k_group) * 2;  // bytes of scales per row (f16 / bf16)
  for (const detail::RowMap* m : {&a.kmap, &a.vmap}) {
    if (m->token_stride != 1) return false;
    // pages of 16 tokens (half a warp tile): only with K and V in one layout (kPaged16 reads both
    // halves' pages at once)
    if (m->block_table && (int64_t(1) << m->page_shift) < mmak::kTileTokens &&
        !((int64_t(1) << m->page_shift) == mmak::kTileTokens / 2 && a.same_layout))
      return false;
    for (int64_t st : {m->head_stride, m->block_table ? m->page_stride : m->batch_stride})
      if ((st * span) % 16 != 0) return false;
  }
  return true;
}

// The layout instantiation that reads `a` (mma_kernel.cuh): contiguous caches (no block table,
// token stride 1: layout_ok), paged caches with one block table for K and V (pages of a warp tile
// or more, or of half of one), and the rest; D = 512 has contiguous caches alone (kContigWide).
int layout_kind(const AttnArgs& a) {
  if (a.dense || (!a.kmap.block_table && !a.vmap.block_table)) return a.D == 512 ? mmak::kContigWide : mmak::kContig;
  if (a.same_layout && a.kmap.block_table)
    return (int64_t(1) << a.kmap.page_shift) >= mmak::kTileTokens ? mmak::kPaged : mmak::kPaged16;
  return mmak::kAny;
}

// Whether `a`, read by the layout instantiation `kind` (layout_kind), takes the instantiations with
// the group size as a constant (mmak::kGroupFixed): groups of 64, D = 128, 256 or 512, a layout
// other than kAny, and a build and a device with sm_90a.
bool fixed_group(const AttnArgs& a, int kind) {
  return QSDPA_HAVE_G64 && a.sm90a && a.k_group == mmak::kGroupFixed && (a.D == 128 || a.D == 256 || a.D == 512) &&
         kind != mmak::kAny;
}

// Whether the D = 512 kernel with the rows on the mma's M dimension (mma_rowsm.cuh) takes `a`:
// f16, 4- or 8-bit keys and values of one width, groups of 64 as a constant, contiguous caches
// (the d-split's kContigWide), and 9 to 16 query rows per KV head (one block of 16 rows; 8 or fewer
// rows run the d-split kernel, whose one block of 8 rows already unpacks each code once); and
// a.rowsm (the process's setting, AttnArgs::rowsm).
bool rowsm_fits(const AttnArgs& a) {
  const int64_t R = a.Hkv > 0 ? a.Hq / a.Hkv * a.Lq : 0;
  return a.rowsm && a.dtype == kF16 && a.D == 512 && a.k_bits == a.v_bits &&
         (a.k_bits == 4 || a.k_bits == 8) && layout_kind(a) == mmak::kContigWide && fixed_group(a, mmak::kContigWide) &&
         R > 8 && R <= 16;
}

// Query rows per row tile of the kernel that runs `a`.
int tile_rows_of(const AttnArgs& a) { return rowsm_fits(a) ? 16 : 8 * n_tiles(a); }

// Calls fn.template operator()<GC>() with the group-size parameter of the instantiation that reads
// `a` with the layout `kind` (fixed_group; the constant-group ones exist only with QSDPA_HAVE_G64).
template <class Fn>
auto with_group(const AttnArgs& a, int kind, Fn&& fn) {
#if QSDPA_HAVE_G64
  if (fixed_group(a, kind)) return fn.template operator()<mmak::kGroupFixed>();
#endif
  return fn.template operator()<0>();
}

// Whether the tile pool's instantiations (mmak::kContigPool) can read `a`: contiguous caches, groups
// of 64 as a constant, D = 128, one n-tile of query rows, keys and values of one width that the
// pool has kernels for (mmad::pool_has: 4 bits, or 2 with f16).
bool pool_fits(const AttnArgs& a) {
  const int kind = layout_kind(a);
  return kind == mmak::kContig && fixed_group(a, kind) && a.k_bits == a.v_bits && mmad::pool_has(a.dtype, a.k_bits) &&
         a.D == 128 && n_tiles(a) == 1;
}

// Calls fn.template operator()<LAYOUT, GC>() for the instantiation that reads `a`: its layout (the
// cluster-merge one when a.cluster: contiguous caches only, mma_max_clusters; the tile pool's when
// a.pool, which pool_fits: blocks of 8 warps for a.pool 2, else of 16, merging in clusters when
// a.cluster too) and its group size. MIXED: 8-bit keys with 4-bit values (no pool).
template <bool MIXED, class Fn>
auto with_layout(const AttnArgs& a, Fn&& fn) {
  const int kind = layout_kind(a);
  return with_group(a, kind, [&]<int GC>() {
    if constexpr (!MIXED && GC != 0)
      if (a.pool)
        return a.pool == 2   ? fn.template operator()<mmak::kContigPoolPair, GC>()
               : a.cluster ? fn.template operator()<mmak::kContigPoolCluster, GC>()
                           : fn.template operator()<mmak::kContigPool, GC>();
    if (a.cluster) return fn.template operator()<mmak::kContigCluster, GC>();
    switch (kind) {
      case mmak::kContig: return fn.template operator()<mmak::kContig, GC>();
      case mmak::kPaged: return fn.template operator()<mmak::kPaged, GC>();
      case mmak::kPaged16: return fn.template operator()<mmak::kPaged16, GC>();
      case mmak::kContigWide:  // (D = 512: only with a constant group, mma_supports)
        if constexpr (GC != 0) return fn.template operator()<mmak::kContigWide, GC>();
        [[fallthrough]];
      default: return fn.template operator()<mmak::kAny, 0>();
    }
  });
}

template <bool MIXED>
int resident_for(const AttnArgs& a) {
  return with_layout<MIXED>(a, [&]<int L, int GC>() { return mmad::resident<L, MIXED, GC>(a); });
}

// (contiguous caches only: the cluster merge has instantiations of kContig alone, and of the
// tile pool's blocks of 16 warps)
template <bool MIXED>
int cluster_for(const AttnArgs& a, int splits) {
  const int kind = layout_kind(a);
  if (kind != mmak::kContig || a.pool == 2) return 0;
  return with_group(a, kind, [&]<int GC>() {
    if constexpr (!MIXED && GC != 0)
      if (a.pool) return mmad::cluster_ok<mmak::kContigPoolCluster, MIXED, GC>(a, splits);
    return mmad::cluster_ok<mmak::kContigCluster, MIXED, GC>(a, splits);
  });
}

template <bool MIXED>
cudaError_t launch_for(const AttnArgs& a, cudaStream_t s) {
  return with_layout<MIXED>(a, [&]<int L, int GC>() { return mmad::launch<L, MIXED, GC>(a, s); });
}

}  // namespace

bool mma_supports(const AttnArgs& a) {
  if (a.dtype != kF16 && a.dtype != kBF16) return false;
  if (a.k_group != a.v_group) return false;
  if (!(a.k_bits == a.v_bits && (a.k_bits == 2 || a.k_bits == 4 || a.k_bits == 8)) && !mixed(a)) return false;
  if (a.k_group != 32 && a.k_group != 64 && a.k_group != 128) return false;
  if (a.D != 64 && a.D != 128 && a.D != 256 && a.D != 512) return false;
  // 2 bits: a 16-byte piece is 64 head dims, which one mma and one group must hold (mma_format.cuh);
  // two pieces per row at least
  if (a.k_bits == 2 && (a.k_group < 64 || a.D < 128)) return false;
  if (a.D % a.k_group != 0) return false;
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) return false;
  if (a.Hq / a.Hkv * a.Lq > kMaxRows) return false;
  if (a.B * a.Hkv * ((a.Hq / a.Hkv * a.Lq + 7) / 8) > int64_t(INT32_MAX)) return false;  // grid.x
  if (!a.dense && !layout_ok(a)) return false;
  // D = 512 (d-split): contiguous caches, groups of 64, sm_90a (the instantiations of g64/ alone)
  if (a.D == 512 && !(layout_kind(a) == mmak::kContigWide && fixed_group(a, mmak::kContigWide))) return false;
  return aligned16(a.k_packed) && aligned16(a.v_packed) && aligned16(a.k_scales) && aligned16(a.k_biases) &&
         aligned16(a.v_scales) && aligned16(a.v_biases);
}

int mma_token_tile(const AttnArgs&) { return mmak::kBlockTokens; }

int64_t mma_row_tiles(const AttnArgs& a) {
  const int64_t rows = a.Hq / a.Hkv * a.Lq, per = tile_rows_of(a);
  return (rows + per - 1) / per;
}

int mma_tile_rows(const AttnArgs& a) { return tile_rows_of(a); }

bool mma_rowsm(const AttnArgs& a) { return mma_supports(a) && rowsm_fits(a); }

int mma_layout_kind(const AttnArgs& a) { return mma_supports(a) ? layout_kind(a) : -1; }

bool mma_pool_fits(const AttnArgs& a) { return mma_supports(a) && pool_fits(a); }

bool mma_fixed_group(const AttnArgs& a) { return mma_supports(a) && fixed_group(a, layout_kind(a)); }

int mma_max_clusters(const AttnArgs& a, int splits) {
  if (!mma_supports(a) || splits < 1 || splits > mmak::kMaxClusterSplits) return 0;
  return mixed(a) ? cluster_for<true>(a, splits) : cluster_for<false>(a, splits);
}

int mma_blocks_per_sm(const AttnArgs& a) {
  if (!mma_supports(a)) return 1;
#if QSDPA_HAVE_G64
  if (rowsm_fits(a)) return mmad::rowsm_resident(a);
#endif
  const int n = mixed(a) ? resident_for<true>(a) : resident_for<false>(a);
  return n > 0 ? n : 1;
}

cudaError_t mma_launch(const AttnArgs& a, cudaStream_t s) {
  if (!mma_supports(a) || a.chunk <= 0 || a.chunk % mmak::kBlockTokens != 0 || a.num_splits > 65535 ||
      (a.pool && !pool_fits(a)) || a.pool < 0 || a.pool > 2 || (a.pool == 2 && a.cluster))
    return cudaErrorInvalidValue;
  if (a.num_splits <= 0 || a.B * a.Hkv == 0) return cudaSuccess;
#if QSDPA_HAVE_G64
  if (rowsm_fits(a)) return a.cluster ? cudaErrorInvalidValue : mmad::rowsm_launch(a, s);
#endif
  return mixed(a) ? launch_for<true>(a, s) : launch_for<false>(a, s);
}

}  // namespace qsdpa::cuda
