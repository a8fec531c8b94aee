// Host side of the tensor-core attention kernel (mma_kernel.cuh): which problems it takes, and the
// one switch from runtime values (T, bits, D, query rows) to the compiled instantiations.
#include "attention_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "mma_kernel.cuh"

namespace qsdpa::cuda {
namespace {

constexpr int kF16 = 1, kBF16 = 2;
// Copy-ring stages per warp. Two rather than three: measured 3 % faster on the 4-bit D = 128
// headline (same 3 blocks per SM), and it cuts the shared memory of a block by a third, which
// lets 8-bit D = 128 run 3 blocks per SM instead of 2 and D = 256 run 2 instead of 1 (and fit
// the 163 KB of sm_80 with 8-bit D = 256).
constexpr int kStages = 2;
// f16 keys as subnormal codes (mma_format.cuh; bf16 ignores it). Measured on an H200 against the
// magic-number codes: the same speed and accuracy, and no offset correction to carry.
constexpr bool kKeyDenorm = true;
constexpr int64_t kMaxRows = 64;  // query rows per KV head (rep * Lq)

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Caches other than the dense [B, Hkv, N] the kernel reads tile by tile (mma_kernel.cuh):
// consecutive tokens in consecutive rows, no tile across two pages (or, with 16-token pages and one
// layout for K and V, exactly two), and strides that keep each
// tile's scale span at the same 16-byte phase (rows of ng * 2 bytes). K and V may have different
// layouts (and block tables).
bool layout_ok(const AttnArgs& a) {
  const int64_t span = (a.D / a.k_group) * 2;  // bytes of scales per row (f16 / bf16)
  for (const detail::RowMap* m : {&a.kmap, &a.vmap}) {
    if (m->token_stride != 1) return false;
    // pages of 16 tokens (half a warp tile): only with K and V in one layout (mma_kernel.cuh reads
    // both halves' pages at once)
    if (m->block_table && (int64_t(1) << m->page_shift) < mmak::kTileTokens &&
        !((int64_t(1) << m->page_shift) == mmak::kTileTokens / 2 && a.same_layout))
      return false;
    for (int64_t st : {m->head_stride, m->block_table ? m->page_stride : m->batch_stride})
      if ((st * span) % 16 != 0) return false;
  }
  return true;
}

// Query rows per block: 16 (two n-tiles of 8) when there are more than 8 and D <= 128; D = 256
// keeps one n-tile (the Oᵀ accumulators would not fit in registers) and adds row tiles.
// (-DQSDPA_MMA_ONE_NTILE: always one n-tile, more row tiles; a tuning knob.)
int n_tiles(const AttnArgs& a) {
#ifdef QSDPA_MMA_ONE_NTILE
  (void)a;
  return 1;
#else
  return (a.Hq / a.Hkv * a.Lq > 8 && a.D <= 128) ? 2 : 1;
#endif
}

template <class T, int BITS, int D>
cudaError_t launch_d(const AttnArgs& a, cudaStream_t s) {
  if constexpr (D <= 128) {
    if (n_tiles(a) == 2) return mmak::launch<T, BITS, D, 2, kKeyDenorm, kStages>(a, s);
  }
  return mmak::launch<T, BITS, D, 1, kKeyDenorm, kStages>(a, s);
}

// Blocks of the instantiation that mma_launch() would run that fit on one multiprocessor.
// Queried once per instantiation and device (the planner asks on every call).
template <class T, int BITS, int D, int NT>
int resident(int* out) {
  using S = mmak::Shape<T, BITS, D, NT, kKeyDenorm, kStages>;
  static std::mutex mu;
  static std::map<int, int> cache;  // device -> blocks per SM
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    *out = 1;
    return *out;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dev); it != cache.end()) return *out = it->second;
  auto* kern = mmak::attention_kernel<T, BITS, D, NT, kKeyDenorm, kStages>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kern, mmak::kWarps * 32, S::kSmem) != cudaSuccess) {
    cudaGetLastError();
    *out = 1;
    return *out;  // not cached: asked again next time
  }
  if (*out < 1) *out = 1;
  cache[dev] = *out;
  return *out;
}

template <class T, int BITS>
int resident_bits(const AttnArgs& a) {
  int n = 1;
  const bool two = n_tiles(a) == 2;
  switch (a.D) {
    case 64: return two ? resident<T, BITS, 64, 2>(&n) : resident<T, BITS, 64, 1>(&n);
    case 128: return two ? resident<T, BITS, 128, 2>(&n) : resident<T, BITS, 128, 1>(&n);
    default: return resident<T, BITS, 256, 1>(&n);
  }
}

template <class T, int BITS>
cudaError_t launch_bits(const AttnArgs& a, cudaStream_t s) {
  switch (a.D) {
    case 64: return launch_d<T, BITS, 64>(a, s);
    case 128: return launch_d<T, BITS, 128>(a, s);
    case 256: return launch_d<T, BITS, 256>(a, s);
    default: return cudaErrorInvalidValue;
  }
}

template <class T>
cudaError_t launch_t(const AttnArgs& a, cudaStream_t s) {
  return a.k_bits == 4 ? launch_bits<T, 4>(a, s) : launch_bits<T, 8>(a, s);
}

}  // namespace

bool mma_supports(const AttnArgs& a) {
  if (a.dtype != kF16 && a.dtype != kBF16) return false;
  if (a.k_bits != a.v_bits || a.k_group != a.v_group) return false;
  if (a.k_bits != 4 && a.k_bits != 8) return false;
  if (a.k_group != 32 && a.k_group != 64 && a.k_group != 128) return false;
  if (a.D != 64 && a.D != 128 && a.D != 256) return false;
  if (a.D % a.k_group != 0) return false;
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) return false;
  if (a.Hq / a.Hkv * a.Lq > kMaxRows) return false;
  if (a.B * a.Hkv * ((a.Hq / a.Hkv * a.Lq + 7) / 8) > int64_t(INT32_MAX)) return false;  // grid.x
  if (!a.dense && !layout_ok(a)) return false;
  return aligned16(a.k_packed) && aligned16(a.v_packed) && aligned16(a.k_scales) && aligned16(a.k_biases) &&
         aligned16(a.v_scales) && aligned16(a.v_biases);
}

int mma_token_tile(const AttnArgs&) { return mmak::kBlockTokens; }

int64_t mma_row_tiles(const AttnArgs& a) {
  const int64_t rows = a.Hq / a.Hkv * a.Lq, per = 8 * n_tiles(a);
  return (rows + per - 1) / per;
}

int mma_blocks_per_sm(const AttnArgs& a) {
  if (!mma_supports(a)) return 1;
  const bool f16 = a.dtype == kF16, b4 = a.k_bits == 4;
  const int n = f16 ? (b4 ? resident_bits<__half, 4>(a) : resident_bits<__half, 8>(a))
                    : (b4 ? resident_bits<__nv_bfloat16, 4>(a) : resident_bits<__nv_bfloat16, 8>(a));
  return n > 0 ? n : 1;
}

cudaError_t mma_launch(const AttnArgs& a, cudaStream_t s) {
  if (!mma_supports(a) || a.chunk <= 0 || a.chunk % mmak::kBlockTokens != 0 || a.num_splits > 65535)
    return cudaErrorInvalidValue;
  if (a.num_splits <= 0 || a.B * a.Hkv == 0) return cudaSuccess;
  return a.dtype == kF16 ? launch_t<__half>(a, s) : launch_t<__nv_bfloat16>(a, s);
}

}  // namespace qsdpa::cuda
