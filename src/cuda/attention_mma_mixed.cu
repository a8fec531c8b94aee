// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, contiguous and paged
// caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kContig, true, 0>(const AttnArgs&, cudaStream_t);
template cudaError_t launch<mmak::kPaged, true, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kContig, true, 0>(const AttnArgs&);
template int cluster_ok<mmak::kContig, true, 0>(const AttnArgs&, int);
template int resident<mmak::kPaged, true, 0>(const AttnArgs&);
template int cluster_ok<mmak::kPaged, true, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
