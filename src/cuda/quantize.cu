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

// One group, by one warp: lanes load the group's values (coalesced), reduce min and max, compute
// the scale and bias exactly as the host does, quantize, and pack the words through shared memory
// (qbuf: the warp's kMaxGroup bytes). w[src ...] are the values; the words go to dst[0, words),
// the scale and bias to element sidx of scales and biases.
__device__ __forceinline__ void quantize_group(const void* w, int64_t src, uint32_t* dst, void* scales, void* biases,
                                               int64_t sidx, int dtype, int bits, int group, unsigned char* qbuf,
                                               int lane) {
  const int per = 32 / bits, words = group / per;
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  float v[kMaxGroup / 32];
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxGroup / 32; ++k) {
    if (k * 32 < group) {
      v[k] = load_t(w, dtype, src + k * 32 + lane);
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
      qbuf[k * 32 + lane] = static_cast<unsigned char>(static_cast<unsigned>(q));
    }
  }
  __syncwarp();
  for (int wi = lane; wi < words; wi += 32) {
    uint32_t word = 0;
    for (int k = 0; k < per; ++k) word |= uint32_t(qbuf[wi * per + k]) << (k * bits);
    dst[wi] = word;
  }
  if (lane == 0) {
    store_t(scales, dtype, sidx, s);
    store_t(biases, dtype, sidx, z);
  }
  __syncwarp();
}

// One warp per group of consecutive rows (whose groups are contiguous).
__global__ void quantize_kernel(const void* w, uint32_t* packed, void* scales, void* biases, int dtype, int bits,
                                int group, int64_t total_groups) {
  __shared__ unsigned char qbuf[kWarpsPerBlock][kMaxGroup];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int words = group / (32 / bits);
  for (int64_t gi = int64_t(blockIdx.x) * kWarpsPerBlock + warp; gi < total_groups;
       gi += int64_t(gridDim.x) * kWarpsPerBlock)
    quantize_group(w, gi * group, packed + gi * words, scales, biases, gi, dtype, bits, group, qbuf[warp], lane);
}

// Append (AppendParams): one warp per group of the new rows, K's groups of every (layer, b, h, i)
// first, then V's, all in one launch; each goes to the row its cache's layout gives token
// start_b + i.
struct AppendArgs {
  const void* k;
  const void* v;
  uint32_t* kp;
  void* ks;
  void* kb;
  uint32_t* vp;
  void* vs;
  void* vb;
  detail::RowMap km, vm;
  int k_bits, k_group, v_bits, v_group;
  int dtype;
  int64_t B, Hkv, L, D, layer_stride, start, capacity;
  const int32_t* kv_lens;
  int64_t k_groups_total;  // layers * B * Hkv * L * (D / k_group)
  int64_t total;           // + the same for V
};

__global__ void append_kernel(const AppendArgs a) {
  __shared__ unsigned char qbuf[kWarpsPerBlock][kMaxGroup];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int64_t gi = int64_t(blockIdx.x) * kWarpsPerBlock + warp; gi < a.total;
       gi += int64_t(gridDim.x) * kWarpsPerBlock) {
    const bool is_k = gi < a.k_groups_total;
    const int64_t gj = is_k ? gi : gi - a.k_groups_total;
    const int bits = is_k ? a.k_bits : a.v_bits, group = is_k ? a.k_group : a.v_group;
    const int64_t ng = a.D / group;
    const int64_t row_in = gj / ng, g = gj - row_in * ng;  // row of [layers, B, Hkv, L]
    int64_t r = row_in;
    const int64_t i = r % a.L;
    r /= a.L;
    const int64_t h = r % a.Hkv;
    r /= a.Hkv;
    const int64_t b = r % a.B, layer = r / a.B;
    int64_t t = a.kv_lens ? int64_t(a.kv_lens[b]) : a.start;
    t += i;
    if (t < 0 || t >= a.capacity) continue;  // (device lengths are not checked on the host)
    const int64_t row = layer * a.layer_stride + (is_k ? a.km : a.vm).row(b, h, t);
    const int64_t words = group / (32 / bits), wpr = a.D * bits / 32;
    quantize_group(is_k ? a.k : a.v, row_in * a.D + g * group, (is_k ? a.kp : a.vp) + row * wpr + g * words,
                   is_k ? a.ks : a.vs, is_k ? a.kb : a.vb, row * ng + g, a.dtype, bits, group, qbuf[warp], lane);
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

cudaError_t append_launch(const AppendParams& p, cudaStream_t s) {
  AppendArgs a{};
  a.k = p.k, a.v = p.v;
  a.kp = p.k_cache.packed, a.ks = p.k_cache.scales, a.kb = p.k_cache.biases;
  a.vp = p.v_cache.packed, a.vs = p.v_cache.scales, a.vb = p.v_cache.biases;
  a.km = detail::resolve_layout(p.k_cache.layout, p.Hkv, p.capacity);
  a.vm = detail::resolve_layout(p.v_cache.layout, p.Hkv, p.capacity);
  a.k_bits = p.k_cache.format.bits, a.k_group = p.k_cache.format.group;
  a.v_bits = p.v_cache.format.bits, a.v_group = p.v_cache.format.group;
  a.dtype = int(p.dtype);
  a.B = p.B, a.Hkv = p.Hkv, a.L = p.L, a.D = p.D, a.layer_stride = p.layer_stride, a.start = p.start;
  a.capacity = p.capacity;
  a.kv_lens = p.kv_lens;
  const int64_t rows = p.layers * p.B * p.Hkv * p.L;
  a.k_groups_total = rows * (p.D / a.k_group);
  a.total = a.k_groups_total + rows * (p.D / a.v_group);
  const int64_t blocks = std::min((a.total + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  append_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(a);
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
