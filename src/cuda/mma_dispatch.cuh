// The one switch from runtime values (T, bits, D, query rows) to the compiled instantiations of
// the tensor-core kernel (mma_kernel.cuh), for the dense [B, Hkv, N] caches (LAYOUT = false,
// attention_mma_dense.cu) and for strided and paged ones (LAYOUT = true, attention_mma_layout.cu),
// and 8-bit keys with 4-bit values for both (attention_mma_mixed.cu): translation units that a
// parallel build compiles side by side.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "split_kv.cuh"

namespace qsdpa::cuda::mmad {

constexpr int kF16 = 1, kBF16 = 2;
// Copy-ring stages per warp. Two rather than three: measured 3 % faster on the 4-bit D = 128
// headline (same 3 blocks per SM), and it cuts the shared memory of a block by a third, which
// lets 8-bit D = 128 run 3 blocks per SM instead of 2 and D = 256 run 2 instead of 1 (and fit
// the 163 KB of sm_80 with 8-bit D = 256).
constexpr int kStages = 2;
// f16 keys as subnormal codes (mma_format.cuh; bf16 ignores it). Measured on an H200 against the
// magic-number codes: the same speed and accuracy, and no offset correction to carry.
constexpr bool kKeyDenorm = true;

// Query rows per block: 16 (two n-tiles of 8) when there are more than 8 and D <= 128; D = 256
// keeps one n-tile (the Oᵀ accumulators would not fit in registers) and adds row tiles.
// (-DQSDPA_MMA_ONE_NTILE: always one n-tile, more row tiles; a tuning knob.)
inline int n_tiles(const AttnArgs& a) {
#ifdef QSDPA_MMA_ONE_NTILE
  (void)a;
  return 1;
#else
  return (a.Hq / a.Hkv * a.Lq > 8 && a.D <= 128) ? 2 : 1;
#endif
}

// Launches the instantiation for `a` (which mma_supports() accepted): keys and values of one bit
// width (launch_all), or 8-bit keys with 4-bit values (launch_mixed, attention_mma_mixed.cu).
template <bool LAYOUT>
cudaError_t launch_all(const AttnArgs& a, cudaStream_t s);
template <bool LAYOUT>
cudaError_t launch_mixed(const AttnArgs& a, cudaStream_t s);
// Blocks of that instantiation that fit on one multiprocessor (cached per device).
template <bool LAYOUT>
int resident_all(const AttnArgs& a);
template <bool LAYOUT>
int resident_mixed(const AttnArgs& a);

extern template cudaError_t launch_all<false>(const AttnArgs&, cudaStream_t);
extern template cudaError_t launch_all<true>(const AttnArgs&, cudaStream_t);
extern template int resident_all<false>(const AttnArgs&);
extern template int resident_all<true>(const AttnArgs&);
extern template cudaError_t launch_mixed<false>(const AttnArgs&, cudaStream_t);
extern template cudaError_t launch_mixed<true>(const AttnArgs&, cudaStream_t);
extern template int resident_mixed<false>(const AttnArgs&);
extern template int resident_mixed<true>(const AttnArgs&);

}  // namespace qsdpa::cuda::mmad
