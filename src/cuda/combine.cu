// The split-K combine step (split_kv.cuh): for each query row, merge the (m, l, o) partials of all
// splits with the row's sink, divide, and round to T once. Rows with no visible key get zeros,
// with or without a sink (SPEC section 3). Every element of `out` is written.
//
// One block per row (grid-strided); each thread owns 4 consecutive elements of D, so the o
// partials of one split are read as coalesced 16-byte loads. The partials are small next to the
// cache (num_splits * rows * (D + 2) floats), so the per-row scalars are simply re-read from L1.
#include <algorithm>

#include "common.cuh"
#include "kernels.cuh"

namespace qsdpa::cuda {
namespace {

constexpr int64_t kMaxBlocks = 1 << 20;

__global__ void combine_kernel(const AttnArgs a, int64_t rows) {
  const int D = int(a.D), S = a.num_splits;
  const int d0 = int(threadIdx.x) * 4;
  const bool active = d0 < D;
  const bool vec_out = a.dtype == kF32 && (reinterpret_cast<uintptr_t>(a.out) & 15) == 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float mx = -INFINITY;
    for (int s = 0; s < S; ++s) mx = fmaxf(mx, a.part_m[int64_t(s) * rows + row]);
    float r[4] = {0.f, 0.f, 0.f, 0.f};
    if (mx != -INFINITY) {  // some key is visible
      float denom = 0.f;
      if (a.sinks) {
        const float sink = a.sinks[(row / a.Lq) % a.Hq];
        mx = fmaxf(mx, sink);
        denom = expf(sink - mx);
      }
      for (int s = 0; s < S; ++s) {
        const float m = a.part_m[int64_t(s) * rows + row];
        if (m == -INFINITY) continue;  // no visible key in this split: its o is not read
        const float w = expf(m - mx);
        denom = fmaf(w, a.part_l[int64_t(s) * rows + row], denom);
        if (active) {
          const float4 o = *reinterpret_cast<const float4*>(a.part_o + (int64_t(s) * rows + row) * D + d0);
          r[0] = fmaf(w, o.x, r[0]);
          r[1] = fmaf(w, o.y, r[1]);
          r[2] = fmaf(w, o.z, r[2]);
          r[3] = fmaf(w, o.w, r[3]);
        }
      }
      const float inv = 1.f / denom;
#pragma unroll
      for (int e = 0; e < 4; ++e) r[e] *= inv;
    }
    if (!active) continue;
    const int64_t base = row * D + d0;
    if (vec_out) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + base) = make_float4(r[0], r[1], r[2], r[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) store_t(a.out, a.dtype, base + e, r[e]);
    }
  }
}

}  // namespace

cudaError_t combine_launch(const AttnArgs& a, cudaStream_t s) {
  const int64_t rows = a.B * a.Hq * a.Lq;
  const int threads = std::max(32, int((a.D / 4 + 31) / 32 * 32));
  const int64_t blocks = std::min(rows, kMaxBlocks);
  combine_kernel<<<unsigned(blocks), threads, 0, s>>>(a, rows);
  return cudaGetLastError();
}

}  // namespace qsdpa::cuda
