// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, contiguous and paged
// caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContig, true, 0)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kPaged, true, 0)
