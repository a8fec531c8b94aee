// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, 16-token pages and the
// other layouts (mmak::kPaged16, kAny; mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kPaged16, true, 0)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kAny, true, 0)
