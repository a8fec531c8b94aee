// The tensor-core kernel with the group size 64 as a constant (GC = mmak::kGroupFixed), contiguous
// caches merging in clusters (mmak::kContigCluster), keys and values of one width and 8-bit keys
// with 4-bit values: compiled for sm_90a alone (src/CMakeLists.txt), taken on devices of compute
// capability 9.0 (attention_mma.cu).
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigCluster, false, qsdpa::cuda::mmak::kGroupFixed)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigCluster, true, qsdpa::cuda::mmak::kGroupFixed)
