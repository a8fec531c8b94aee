// The tensor-core kernel's instantiations for 8-bit keys with 4-bit values, 16-token pages and the
// other layouts (mmak::kPaged16, kAny; mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kPaged16, true, 0>(const AttnArgs&, cudaStream_t);
template cudaError_t launch<mmak::kAny, true, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kPaged16, true, 0>(const AttnArgs&);
template int cluster_ok<mmak::kPaged16, true, 0>(const AttnArgs&, int);
template int resident<mmak::kAny, true, 0>(const AttnArgs&);
template int cluster_ok<mmak::kAny, true, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
