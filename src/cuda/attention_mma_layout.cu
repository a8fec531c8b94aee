// The tensor-core kernel's instantiations for the other layouts (mmak::kAny, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kAny, false, 0)
