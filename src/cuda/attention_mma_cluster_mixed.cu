// The tensor-core kernel's instantiations for contiguous caches whose splits merge in a
// thread-block cluster (mmak::kContigCluster, mma_dispatch.cuh), 8-bit keys with 4-bit values.
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kContigCluster, true, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kContigCluster, true, 0>(const AttnArgs&);
template int cluster_ok<mmak::kContigCluster, true, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
