// The tensor-core kernel's instantiations for contiguous caches whose splits merge in a
// thread-block cluster (mmak::kContigCluster, mma_dispatch.cuh), 8-bit keys with 4-bit values.
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigCluster, true, 0)
