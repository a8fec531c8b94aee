// The tensor-core kernel's instantiations for the other layouts (mmak::kAny, mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kAny, false>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kAny, false>(const AttnArgs&);
template int cluster_ok<mmak::kAny, false>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
