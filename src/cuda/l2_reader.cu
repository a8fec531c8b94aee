// The bench's stand-in for the kernel that runs before an attention call in a model (a GEMM
// reading its weights): it reads a buffer with the normal L2 policy, so that the next call starts
// with L2 holding someone else's lines (tools/exec.cpp, `qsdpa bench --cold-l2`).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../core/backends.hpp"
#include "testing.hpp"

namespace qsdpa::cuda {
namespace {

// Every 16-byte piece of [p, p + pieces * 16) once (grid-stride), then the words of the tail;
// the wrapping sum of all 32-bit words goes to *sum (atomics: one per warp).
__global__ void read_sum_kernel(const uint4* p, int64_t pieces, const uint32_t* tail, int tail_words, uint32_t* sum) {
  uint32_t s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (blockIdx.x == 0 && int(threadIdx.x) < tail_words) s += tail[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, s);
}

}  // namespace

Status read_through_l2(const void* p, size_t bytes, uint32_t* sum, void* stream) {
  if ((bytes & 3) != 0 || (reinterpret_cast<uintptr_t>(p) & 15) != 0 || sum == nullptr ||
      (reinterpret_cast<uintptr_t>(sum) & 3) != 0)
    return detail::make_status(StatusCode::invalid_argument,
                               "read_through_l2: the buffer must be 16-byte aligned and whole 32-bit words, "
                               "sum an aligned word",
                               Backend::cuda);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(sum, 0, sizeof(uint32_t), s);
  const int64_t pieces = int64_t(bytes / 16);
  const int tail_words = int((bytes % 16) / 4);
  if (e == cudaSuccess) {
    // (a grid-stride loop: 1024 blocks of 512 threads fill any GPU of today several times over)
    constexpr int kThreads = 512, kMaxBlocks = 1024;
    const int64_t want = (pieces + kThreads - 1) / kThreads;
    const int blocks = int(want < 1 ? 1 : want < kMaxBlocks ? want : kMaxBlocks);
    read_sum_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint4*>(p), pieces,
                                                reinterpret_cast<const uint32_t*>(static_cast<const uint4*>(p) + pieces),
                                                tail_words, sum);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return detail::make_status(StatusCode::backend_error, std::string("read_through_l2: ") + cudaGetErrorString(e),
                               Backend::cuda);
  return Status{};
}

}  // namespace qsdpa::cuda
