// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, dense and other
// layouts (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<false, true>(const AttnArgs&, cudaStream_t);
template cudaError_t launch<true, true>(const AttnArgs&, cudaStream_t);
template int resident<false, true>(const AttnArgs&);
template int resident<true, true>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
