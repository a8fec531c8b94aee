// The tensor-core kernel's instantiations for caches of 16-token pages (mmak::kPaged16,
// mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kPaged16, false, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kPaged16, false, 0>(const AttnArgs&);
template int cluster_ok<mmak::kPaged16, false, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
