// The tensor-core kernel for D = 512 (the d-split instantiations, mma_kernel.cuh), contiguous caches
// (mmak::kContigWide) with the group size 64 as a constant, keys and values of one width and 8-bit
// keys with 4-bit values: compiled for sm_90a alone (src/CMakeLists.txt), taken on devices of
// compute capability 9.0 (attention_mma.cu). Other D = 512 calls run on the generic kernel.
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigWide, false, qsdpa::cuda::mmak::kGroupFixed)
QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigWide, true, qsdpa::cuda::mmak::kGroupFixed)
