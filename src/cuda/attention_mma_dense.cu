// The tensor-core kernel's instantiations for dense [B, Hkv, N] caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch_all<false>(const AttnArgs&, cudaStream_t);
template int resident_all<false>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
