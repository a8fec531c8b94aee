// The tensor-core kernel's tile-pool instantiations (mmak::kContigPool: blocks of 16 warps, one per
// multiprocessor, taking tiles from a counter in shared memory; kContigPoolCluster: the same with a
// row tile's splits merging in a cluster): contiguous caches, 4-bit keys and values (and 2-bit
// ones, f16 alone), D = 128, groups of 64 as a constant; compiled for sm_90a alone
// (src/CMakeLists.txt).
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPool, false, qsdpa::cuda::mmak::kGroupFixed)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPoolCluster, false, qsdpa::cuda::mmak::kGroupFixed)
