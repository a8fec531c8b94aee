// The tensor-core kernel's instantiations for contiguous caches whose splits merge in a
// thread-block cluster (mmak::kContigCluster, mma_dispatch.cuh), keys and values of one width.
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigCluster, false, 0)
