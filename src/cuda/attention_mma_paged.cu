// The tensor-core kernel's instantiations for paged caches (mmak::kPaged, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kPaged, false, 0)
