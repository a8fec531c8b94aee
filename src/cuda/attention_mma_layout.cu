// The tensor-core kernel's instantiations for strided and paged caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<true, false>(const AttnArgs&, cudaStream_t);
template int resident<true, false>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
