// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, the other layouts
// (mmak::kAny, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kAny, true>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kAny, true>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
