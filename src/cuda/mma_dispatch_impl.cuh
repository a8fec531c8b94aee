// Definitions of mma_dispatch.cuh's templates; included by the translation units that
// instantiate them (mma_dispatch.cuh lists them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "mma_dispatch.cuh"
#include "mma_kernel.cuh"

namespace qsdpa::cuda::mmad {
namespace impl {

// Calls fn.template operator()<T, BITS, VBITS, D, NT>() for the instantiation that runs `a`: the
// one switch from runtime values to template parameters, shared by the launch and the occupancy
// query so that both always name the same kernel. D is 64, 128 or 256 (2 bits: 128 or 256;
// mma_supports), or 512 for the layout kContigWide alone.
// 2 bits and GC != 0 (a constant group size): D is 128 or 256 only; 2 bits: one n-tile only.
// The tile pool (kContigPool, kContigPoolCluster, kContigPoolPair) has the formats pool_has names,
// D = 128 and one n-tile alone (pool_fits, attention_mma.cu).
template <int LAYOUT, bool MIXED, int GC, class Fn>
auto visit(const AttnArgs& a, Fn&& fn) {
  const auto d = [&]<class T, int BITS, int VBITS>() {
    const bool two = n_tiles(a) == 2;
    if constexpr (LAYOUT == mmak::kContigWide) {  // D = 512 (the d-split instantiations: one n-tile)
      return fn.template operator()<T, BITS, VBITS, 512, 1>();
    } else if constexpr (mmak::is_pool(LAYOUT)) {
      return fn.template operator()<T, BITS, VBITS, 128, 1>();
    } else {
      if constexpr (BITS != 2 && GC == 0) {
        if (a.D == 64)
          return two ? fn.template operator()<T, BITS, VBITS, 64, 2>() : fn.template operator()<T, BITS, VBITS, 64, 1>();
      }
      if (a.D == 128) {
        if constexpr (BITS == 2) return fn.template operator()<T, BITS, VBITS, 128, 1>();
        else
          return two ? fn.template operator()<T, BITS, VBITS, 128, 2>() : fn.template operator()<T, BITS, VBITS, 128, 1>();
      }
      return fn.template operator()<T, BITS, VBITS, 256, 1>();
    }
  };
  const auto t = [&]<class T>() {
    if constexpr (MIXED) {
      return d.template operator()<T, 8, 4>();
    } else if constexpr (mmak::is_pool(LAYOUT)) {
      if constexpr (pool_has(std::is_same_v<T, __nv_bfloat16> ? kBF16 : kF16, 2))
        if (a.k_bits == 2) return d.template operator()<T, 2, 2>();
      return d.template operator()<T, 4, 4>();
    } else {
      return a.k_bits == 4   ? d.template operator()<T, 4, 4>()
             : a.k_bits == 2 ? d.template operator()<T, 2, 2>()
                             : d.template operator()<T, 8, 8>();
    }
  };
  return a.dtype == kF16 ? t.template operator()<__half>() : t.template operator()<__nv_bfloat16>();
}

}  // namespace impl

template <int LAYOUT, bool MIXED, int GC>
cudaError_t launch(const AttnArgs& a, cudaStream_t s) {
  return impl::visit<LAYOUT, MIXED, GC>(a, [&]<class T, int BITS, int VBITS, int D, int NT>() {
    return mmak::launch<T, BITS, VBITS, D, NT, kKeyDenorm, kStages, LAYOUT, GC>(a, s);
  });
}

template <int LAYOUT, bool MIXED, int GC>
int resident(const AttnArgs& a) {
  return impl::visit<LAYOUT, MIXED, GC>(a, [&]<class T, int BITS, int VBITS, int D, int NT>() {
    constexpr int W = mmak::warps_of(LAYOUT);
    using S = mmak::Shape<T, BITS, VBITS, D, NT, kKeyDenorm, kStages, W>;
    static std::mutex mu;
    static std::map<int, int> cache;  // device -> blocks per SM, for this instantiation
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(dev); it != cache.end()) return it->second;
    auto* kern = mmak::attention_kernel<T, BITS, VBITS, D, NT, kKeyDenorm, kStages, LAYOUT, GC>;
    int n = 0;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, W * 32, S::kSmem) != cudaSuccess) {
      cudaGetLastError();
      return 1;  // not cached: asked again next time
    }
    if (n < 1) n = 1;
    cache[dev] = n;
    return n;
  });
}

template <int LAYOUT, bool MIXED, int GC>
int cluster_ok(const AttnArgs& a, int splits) {
  return impl::visit<LAYOUT, MIXED, GC>(a, [&]<class T, int BITS, int VBITS, int D, int NT>() {
    static std::mutex mu;
    static std::map<std::pair<int, int>, int> cache;  // (device, splits) -> clusters
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    std::lock_guard<std::mutex> lock(mu);
    const std::pair<int, int> key{dev, splits};
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const int n = mmak::cluster_fits<T, BITS, VBITS, D, NT, kKeyDenorm, kStages, LAYOUT, GC>(splits);
    cache[key] = n;
    return n;
  });
}

}  // namespace qsdpa::cuda::mmad

// The explicit instantiations of one layout, format and group choice (the translation units).
#define QSDPA_MMAD_INSTANTIATE(L, M, G)                                 \
  namespace qsdpa::cuda::mmad {                                         \
  template cudaError_t launch<L, M, G>(const AttnArgs&, cudaStream_t); \
  template int resident<L, M, G>(const AttnArgs&);                     \
  template int cluster_ok<L, M, G>(const AttnArgs&, int);              \
  }
