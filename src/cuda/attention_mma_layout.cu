// The tensor-core kernel's instantiations for strided and paged caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch_all<true>(const AttnArgs&, cudaStream_t);
template int resident_all<true>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
