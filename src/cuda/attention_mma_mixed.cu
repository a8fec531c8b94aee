// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, dense and other
// layouts (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch_mixed<false>(const AttnArgs&, cudaStream_t);
template cudaError_t launch_mixed<true>(const AttnArgs&, cudaStream_t);
template int resident_mixed<false>(const AttnArgs&);
template int resident_mixed<true>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
