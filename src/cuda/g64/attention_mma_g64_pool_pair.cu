// The tensor-core kernel's tile pool in blocks of 8 warps, two per multiprocessor
// (mmak::kContigPoolPair: grids of up to twice as many row tiles as multiprocessors): contiguous
// caches, 4-bit keys and values (and 2-bit ones, f16 alone), D = 128, groups of 64 as a constant;
// compiled for sm_90a alone (src/CMakeLists.txt). A translation unit of its own, so that a parallel
// build compiles it beside the other pool's.
#include "../mma_dispatch_impl.cuh"

QSDPA_MMAD_INSTANTIATE(qsdpa::cuda::mmak::kContigPoolPair, false, qsdpa::cuda::mmak::kGroupFixed)
