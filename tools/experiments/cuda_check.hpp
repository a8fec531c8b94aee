// What the experiment programs in this folder share: CK(call) ends the program with the call and
// the CUDA runtime's message when a runtime call fails.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                              \
  do {                                                                     \
    const cudaError_t ck_error_ = (x);                                     \
    if (ck_error_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(ck_error_)); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)
