// The tensor-core kernel's instantiations for contiguous caches (mmak::kContig, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContig, false, 0)
