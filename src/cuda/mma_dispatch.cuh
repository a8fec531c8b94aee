// The one switch from runtime values (T, bits, D, query rows) to the compiled instantiations of the
// tensor-core kernel (mma_kernel.cuh), one translation unit per group so that a parallel build
// compiles them side by side: keys and values of one bit width for contiguous caches
// (mmak::kContig, attention_mma_dense.cu), paged ones (kPaged, attention_mma_paged.cu; kPaged16,
// attention_mma_paged16.cu) and the other layouts (kAny, attention_mma_layout.cu); 8-bit keys with
// 4-bit values for all four (attention_mma_mixed.cu, attention_mma_mixed_any.cu); and contiguous
// caches merging in clusters (kContigCluster, attention_mma_cluster.cu and
// attention_mma_cluster_mixed.cu); and, for sm_90a, the same with the group size 64 as a constant
// for the layouts kContig, kPaged, kPaged16 and kContigCluster, D = 512 on contiguous caches
// (kContigWide), and the tile pool's blocks of 16 warps (kContigPool, and kContigPoolCluster
// merging in clusters) and of 8 (kContigPoolPair): 4-bit keys and values, and 2-bit ones with f16,
// D = 128 (g64/*.cu, compiled for sm_90a alone).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "split_kv.cuh"

namespace qsdpa::cuda::mmad {

constexpr int kF16 = 1, kBF16 = 2;
// Whether the tile pool (mmak::kContigPool, kContigPoolCluster, kContigPoolPair) has kernels for
// keys and values of `bits` bits in the element type `dtype` (kF16 / kBF16): 4 bits, and 2 bits
// with f16 alone (to keep the build short). The one rule the dispatch (mma_dispatch_impl.cuh) and
// the host's pool_fits (attention_mma.cu) both follow.
constexpr bool pool_has(int dtype, int bits) { return bits == 4 || (bits == 2 && dtype == kF16); }
// Copy-ring stages per warp. Two rather than three: measured 3 % faster on the 4-bit D = 128
// headline (same 3 blocks per SM), and it cuts the shared memory of a block by a third, which
// lets 8-bit D = 128 run 3 blocks per SM instead of 2 and D = 256 run 2 instead of 1 (and fit
// the 163 KB of sm_80 with 8-bit D = 256).
constexpr int kStages = 2;
// f16 keys as subnormal codes (mma_format.cuh; bf16 ignores it). Measured on an H200 against the
// magic-number codes: the same speed and accuracy, and no offset correction to carry.
constexpr bool kKeyDenorm = true;

// Query rows per block: 16 (two n-tiles of 8) when there are more than 8 and D <= 128; D = 256
// keeps one n-tile (the Oᵀ accumulators would not fit in registers) and adds row tiles. (One
// n-tile and twice the row tiles for Lq = 4 was measured on an H200: 155 -> 202 us, K and V read
// twice.)
// 2-bit caches have one n-tile only (fewer instantiations to compile; more rows take more row tiles).
// D = 512 is d-split (128 dims per warp, mma_kernel.cuh) and keeps one n-tile: measured on an H200
// (2026-12-01, run 31, B=4 Hq=16 Hkv=1 N=32768, the same tree built both ways), two n-tiles and
// half the row tiles took 88.8 / 96.4 us (4 / 8 bits), one n-tile 72.5 / 73.2 us: 255 registers
// and two blocks per SM against one n-tile's lighter blocks (K and V read twice, the second time
// mostly from L2).
inline int n_tiles(const AttnArgs& a) {
  return (a.Hq / a.Hkv * a.Lq > 8 && a.D <= 128 && a.k_bits != 2) ? 2 : 1;
}

// Launches the instantiation for `a` (which mma_supports() accepted) with the layout LAYOUT
// (mmak::kContig, kPaged, kPaged16, kAny or kContigCluster): keys and values of one bit width
// (MIXED = false), or 8-bit keys with 4-bit values (MIXED = true); GC: the group size as a constant
// (mmak::kGroupFixed: groups of 64, D = 128 or 256, sm_90a only, the translation units under g64/)
// or 0 (the call's group size).
template <int LAYOUT, bool MIXED, int GC>
cudaError_t launch(const AttnArgs& a, cudaStream_t s);
// Blocks of that same instantiation that fit on one multiprocessor (cached per device).
template <int LAYOUT, bool MIXED, int GC>
int resident(const AttnArgs& a);

// Clusters of `splits` blocks of that instantiation that can be resident at once (0: none;
// AttnArgs::cluster; cached per device and size).
template <int LAYOUT, bool MIXED, int GC>
int cluster_ok(const AttnArgs& a, int splits);

// The D = 512 kernel with the rows on the mma's M dimension (mma_rowsm.cuh; g64/, sm_90a alone):
// its launch and its blocks per multiprocessor, for the calls attention_mma.cu's rowsm_fits takes.
cudaError_t rowsm_launch(const AttnArgs& a, cudaStream_t s);
int rowsm_resident(const AttnArgs& a);

#define QSDPA_MMAD_EXTERN(L, M, G)                                             \
  extern template cudaError_t launch<L, M, G>(const AttnArgs&, cudaStream_t); \
  extern template int resident<L, M, G>(const AttnArgs&);                     \
  extern template int cluster_ok<L, M, G>(const AttnArgs&, int);
#define QSDPA_MMAD_EXTERN_BOTH(L, G) QSDPA_MMAD_EXTERN(L, false, G) QSDPA_MMAD_EXTERN(L, true, G)
QSDPA_MMAD_EXTERN_BOTH(0, 0)
QSDPA_MMAD_EXTERN_BOTH(1, 0)
QSDPA_MMAD_EXTERN_BOTH(2, 0)
QSDPA_MMAD_EXTERN_BOTH(3, 0)
QSDPA_MMAD_EXTERN_BOTH(4, 0)
// (defined only where the build has sm_90a: QSDPA_HAVE_G64)
QSDPA_MMAD_EXTERN_BOTH(0, 64)
QSDPA_MMAD_EXTERN_BOTH(1, 64)
QSDPA_MMAD_EXTERN_BOTH(3, 64)
QSDPA_MMAD_EXTERN_BOTH(4, 64)
QSDPA_MMAD_EXTERN_BOTH(5, 64)
QSDPA_MMAD_EXTERN(6, false, 64)
QSDPA_MMAD_EXTERN(7, false, 64)
#undef QSDPA_MMAD_EXTERN_BOTH
#undef QSDPA_MMAD_EXTERN

}  // namespace qsdpa::cuda::mmad
