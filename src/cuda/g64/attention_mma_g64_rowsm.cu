// The D = 512 kernel with the query rows on the mma's M dimension (mma_rowsm.cuh): f16, 4- or
// 8-bit keys and values, groups of 64, contiguous caches, 9 to 16 query rows per KV head; compiled
// for sm_90a alone (src/CMakeLists.txt), taken where attention_mma.cu's rowsm_fits says so.
#include <map>
#include <mutex>

#include "../mma_dispatch.cuh"
#include "../mma_rowsm.cuh"

namespace qsdpa::cuda::mmad {

cudaError_t rowsm_launch(const AttnArgs& a, cudaStream_t s) {
  return a.k_bits == 4 ? mmak::rowsm_launch<4>(a, s) : mmak::rowsm_launch<8>(a, s);
}

int rowsm_resident(const AttnArgs& a) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;  // (device, bits) -> blocks per SM
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{dev, a.k_bits};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const int n = a.k_bits == 4 ? mmak::rowsm_resident<4>() : mmak::rowsm_resident<8>();
  cache[key] = n;
  return n;
}

}  // namespace qsdpa::cuda::mmad
