// The tensor-core kernel's instantiations for contiguous caches whose splits merge in a
// thread-block cluster (mmak::kContigCluster, mma_dispatch.cuh), keys and values of one width.
#include "mma_dispatch_impl.cuh"

namespace qsdpa::cuda::mmad {
template cudaError_t launch<mmak::kContigCluster, false, 0>(const AttnArgs&, cudaStream_t);
template int resident<mmak::kContigCluster, false, 0>(const AttnArgs&);
template int cluster_ok<mmak::kContigCluster, false, 0>(const AttnArgs&, int);
}  // namespace qsdpa::cuda::mmad
