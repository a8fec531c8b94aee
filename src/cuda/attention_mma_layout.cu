// The tensor-core kernel's instantiations for the other layouts (mmak::kAny, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kAny, false, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kAny, false, 0>(const AttnArgs&);
template int cluster_ok<mmak::kAny, false, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
