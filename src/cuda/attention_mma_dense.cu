// The tensor-core kernel's instantiations for dense [B, Hkv, N] caches (mma_dispatch.cuh).
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<false, false>(const AttnArgs&, cudaStream_t);
template int resident<false, false>(const AttnArgs&);
}  // namespace qsdpa::cuda::mmad
