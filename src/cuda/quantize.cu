// GPU quantize / dequantize, bit-identical to the host quantizer (core/quantize_host.cpp, SPEC
// section 2). Every floating-point step is an explicitly rounded intrinsic (__fsub_rn, __fdiv_rn,
// __fmul_rn, __fadd_rn) so that nvcc cannot contract a multiply and an add into an FMA, and every
// min/max/clamp is written as the same comparison the host's std::min/std::max make.
#include <algorithm>

#include "common.cuh"
#include "kernels.cuh"

namespace qsdpa::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxGroup = 128;
constexpr int64_t kMaxBlocks = 1 << 20;

// One warp per group: lanes load the group's values (coalesced), reduce min and max, compute the
// scale and bias exactly as the host does, quantize, and pack the words through shared memory.
__global__ void quantize_kernel(const void* w, uint32_t* packed, void* scales, void* biases, int dtype, int bits,
                                int group, int64_t total_groups) {
  __shared__ unsigned char qbuf[kWarpsPerBlock][kMaxGroup];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int per = 32 / bits, words = group / per;
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  for (int64_t gi = int64_t(blockIdx.x) * kWarpsPerBlock + warp; gi < total_groups;
       gi += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t base = gi * group;  // the groups of consecutive rows are contiguous
    float v[kMaxGroup / 32];
    float lo = INFINITY, hi = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxGroup / 32; ++k) {
      if (k * 32 < group) {
        v[k] = load_t(w, dtype, base + k * 32 + lane);
        hi = fmaxf(hi, v[k]);  // like std::max/std::min in the host loop, NaN never wins
        lo = fminf(lo, v[k]);
      }
    }
    hi = warp_max(hi);
    lo = warp_min(lo);
    const bool edge_is_lo = fabsf(lo) > fabsf(hi);
    const float range = __fdiv_rn(__fsub_rn(hi, lo), n_bins);
    float s = range < eps ? eps : range;  // std::max(range, eps)
    s = edge_is_lo ? s : -s;
    const float edge = edge_is_lo ? lo : hi;
    const float q0 = rintf(__fdiv_rn(edge, s));
    float z = 0.0f;
    if (q0 != 0.0f) {
      s = __fdiv_rn(edge, q0);
      z = edge;
    }
#pragma unroll
    for (int k = 0; k < kMaxGroup / 32; ++k) {
      if (k * 32 < group) {
        float q = rintf(__fdiv_rn(__fsub_rn(v[k], z), s));
        q = q > 0.0f ? (n_bins < q ? n_bins : q) : 0.0f;  // the host's clamp: NaN becomes code 0
        qbuf[warp][k * 32 + lane] = static_cast<unsigned char>(static_cast<unsigned>(q));
      }
    }
    __syncwarp();
    for (int wi = lane; wi < words; wi += 32) {
      uint32_t word = 0;
      for (int k = 0; k < per; ++k) word |= uint32_t(qbuf[warp][wi * per + k]) << (k * bits);
      packed[gi * words + wi] = word;
    }
    if (lane == 0) {
      store_t(scales, dtype, gi, s);
      store_t(biases, dtype, gi, z);
    }
    __syncwarp();
  }
}

// One thread per packed word: value = s * q + z, rounded as the host rounds (product, then sum).
__global__ void dequantize_kernel(const uint32_t* packed, const void* scales, const void* biases, void* w,
                                  int dtype, int bits, int group, int64_t total_words) {
  const int per = 32 / bits, wpg = group / per;
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t wi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; wi < total_words;
       wi += int64_t(gridDim.x) * blockDim.x) {
    const int64_t gi = wi / wpg;
    const float s = load_t(scales, dtype, gi), z = load_t(biases, dtype, gi);
    const uint32_t word = packed[wi];
    for (int k = 0; k < per; ++k) {
      const float q = float((word >> (k * bits)) & mask);
      store_t(w, dtype, wi * per + k, __fadd_rn(__fmul_rn(s, q), z));
    }
  }
}

}  // namespace

cudaError_t quantize_launch(const QuantizeParams& p, cudaStream_t s) {
  const int64_t groups = p.rows * (p.dim / p.format.group);
  const int64_t blocks = std::min((groups + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  quantize_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(p.w, p.packed, p.scales, p.biases, int(p.dtype),
                                                                   p.format.bits, p.format.group, groups);
  return cudaGetLastError();
}

cudaError_t dequantize_launch(const DequantizeParams& p, cudaStream_t s) {
  const int64_t words = p.rows * (p.dim * p.format.bits / 32);
  constexpr int threads = 256;
  const int64_t blocks = std::min((words + threads - 1) / threads, kMaxBlocks);
  dequantize_kernel<<<unsigned(blocks), threads, 0, s>>>(p.packed, p.scales, p.biases, p.w, int(p.dtype),
                                                         p.format.bits, p.format.group, words);
  return cudaGetLastError();
}

}  // namespace qsdpa::cuda
