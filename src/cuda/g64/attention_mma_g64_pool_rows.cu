// The tensor-core kernel's tile pool for two n-tiles of query rows (mmak::kContigPoolRows: blocks
// of 8 warps, one per multiprocessor, taking tiles from a counter in shared memory, 9-16 query rows
// per KV head; kContigPoolRowsCluster: the same with a row tile's splits merging in a cluster):
// contiguous caches, 4-bit keys and values, D = 128, groups of 64 as a constant; compiled for
// sm_90a alone (src/CMakeLists.txt).
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPoolRows, false, qsdpa::cuda::mmak::kGroupFixed)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPoolRowsCluster, false, qsdpa::cuda::mmak::kGroupFixed)
