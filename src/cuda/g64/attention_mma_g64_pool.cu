// The tensor-core kernel with the group size 64 as a constant (GC = mmak::kGroupFixed), contiguous
// caches whose splits share the row tile's tiles and merge in clusters (mmak::kContigPool), keys and
// values of one width: compiled for sm_90a alone (src/CMakeLists.txt), taken on devices of compute
// capability 9.0 (attention_mma.cu).
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPool, false, qsdpa::cuda::mmak::kGroupFixed)
