// What the experiment programs in this folder share: CK(call) ends the program with the call and
// the CUDA runtime's message when a runtime call fails; median_us times a call with CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                              \
  do {                                                                     \
    const cudaError_t ck_error_ = (x);                                     \
    if (ck_error_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(ck_error_)); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

namespace qsdpa_experiments {

// The median time in microseconds of `calls` calls of call(i) after `warmup` (i counts from 0
// over all of them), each between two events on the legacy stream.
template <class F>
double median_us(int warmup, int calls, F&& call) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < warmup + calls; ++i) {
    CK(cudaEventRecord(e0));
    call(i);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= warmup) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3;
}

}  // namespace qsdpa_experiments
