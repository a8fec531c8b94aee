// The tensor-core kernel's instantiations for paged caches (mmak::kPaged, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kPaged, false, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kPaged, false, 0>(const AttnArgs&);
template int cluster_ok<mmak::kPaged, false, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
