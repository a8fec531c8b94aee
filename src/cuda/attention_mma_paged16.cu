// The tensor-core kernel's instantiations for caches of 16-token pages (mmak::kPaged16,
// mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kPaged16, false, 0)
