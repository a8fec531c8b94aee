// The tensor-core kernel's instantiations for contiguous caches (mmak::kContig, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kContig, false, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kContig, false, 0>(const AttnArgs&);
template int cluster_ok<mmak::kContig, false, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
