// Definitions of mma_dispatch.cuh's templates; included by the translation units that
// instantiate them (attention_mma_dense.cu, attention_mma_layout.cu, attention_mma_mixed.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <map>
#include <mutex>

#include "mma_dispatch.cuh"
#include "mma_kernel.cuh"

namespace qsdpa::cuda::mmad {
namespace impl {

template <class T, int BITS, int VBITS, int D, bool LAYOUT>
cudaError_t launch_d(const AttnArgs& a, cudaStream_t s) {
  if constexpr (D <= 128) {
    if (n_tiles(a) == 2) return mmak::launch<T, BITS, VBITS, D, 2, kKeyDenorm, kStages, LAYOUT>(a, s);
  }
  return mmak::launch<T, BITS, VBITS, D, 1, kKeyDenorm, kStages, LAYOUT>(a, s);
}

// Blocks of one instantiation that fit on one multiprocessor, queried once per device.
template <class T, int BITS, int VBITS, int D, int NT, bool LAYOUT>
int resident() {
  using S = mmak::Shape<T, BITS, VBITS, D, NT, kKeyDenorm, kStages>;
  static std::mutex mu;
  static std::map<int, int> cache;  // device -> blocks per SM
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dev); it != cache.end()) return it->second;
  auto* kern = mmak::attention_kernel<T, BITS, VBITS, D, NT, kKeyDenorm, kStages, LAYOUT>;
  int n = 0;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, mmak::kWarps * 32, S::kSmem) != cudaSuccess) {
    cudaGetLastError();
    return 1;  // not cached: asked again next time
  }
  if (n < 1) n = 1;
  cache[dev] = n;
  return n;
}

template <class T, int BITS, int VBITS, bool LAYOUT>
int resident_bits(const AttnArgs& a) {
  const bool two = n_tiles(a) == 2;
  switch (a.D) {
    case 64: return two ? resident<T, BITS, VBITS, 64, 2, LAYOUT>() : resident<T, BITS, VBITS, 64, 1, LAYOUT>();
    case 128:
      return two ? resident<T, BITS, VBITS, 128, 2, LAYOUT>() : resident<T, BITS, VBITS, 128, 1, LAYOUT>();
    default: return resident<T, BITS, VBITS, 256, 1, LAYOUT>();
  }
}

template <class T, int BITS, int VBITS, bool LAYOUT>
cudaError_t launch_bits(const AttnArgs& a, cudaStream_t s) {
  switch (a.D) {
    case 64: return launch_d<T, BITS, VBITS, 64, LAYOUT>(a, s);
    case 128: return launch_d<T, BITS, VBITS, 128, LAYOUT>(a, s);
    case 256: return launch_d<T, BITS, VBITS, 256, LAYOUT>(a, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace impl

// Keys and values of one bit width (4 or 8).
template <bool LAYOUT>
cudaError_t launch_all(const AttnArgs& a, cudaStream_t s) {
  const bool b4 = a.k_bits == 4;
  if (a.dtype == kF16)
    return b4 ? impl::launch_bits<__half, 4, 4, LAYOUT>(a, s) : impl::launch_bits<__half, 8, 8, LAYOUT>(a, s);
  return b4 ? impl::launch_bits<__nv_bfloat16, 4, 4, LAYOUT>(a, s)
            : impl::launch_bits<__nv_bfloat16, 8, 8, LAYOUT>(a, s);
}

template <bool LAYOUT>
int resident_all(const AttnArgs& a) {
  const bool b4 = a.k_bits == 4;
  if (a.dtype == kF16)
    return b4 ? impl::resident_bits<__half, 4, 4, LAYOUT>(a) : impl::resident_bits<__half, 8, 8, LAYOUT>(a);
  return b4 ? impl::resident_bits<__nv_bfloat16, 4, 4, LAYOUT>(a)
            : impl::resident_bits<__nv_bfloat16, 8, 8, LAYOUT>(a);
}

// 8-bit keys with 4-bit values.
template <bool LAYOUT>
cudaError_t launch_mixed(const AttnArgs& a, cudaStream_t s) {
  return a.dtype == kF16 ? impl::launch_bits<__half, 8, 4, LAYOUT>(a, s)
                         : impl::launch_bits<__nv_bfloat16, 8, 4, LAYOUT>(a, s);
}

template <bool LAYOUT>
int resident_mixed(const AttnArgs& a) {
  return a.dtype == kF16 ? impl::resident_bits<__half, 8, 4, LAYOUT>(a)
                         : impl::resident_bits<__nv_bfloat16, 8, 4, LAYOUT>(a);
}

}  // namespace qsdpa::cuda::mmad
