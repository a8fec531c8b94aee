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
    // The loops over the splits are unrolled and free of branches around their loads, so that
    // several splits' loads are in flight at once: with many short splits (small problems) the
    // combine is a chain of L2 round trips otherwise.
    const float* pm = a.part_m + row;
    const float* pl = a.part_l + row;
    const float* po = a.part_o + row * D + d0;
    const int64_t so = rows * D;
    float mx = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < S; ++s) mx = fmaxf(mx, pm[int64_t(s) * rows]);
    float r[4] = {0.f, 0.f, 0.f, 0.f};
    if (mx != -INFINITY) {  // some key is visible
      float denom = 0.f;
      if (a.sinks) {
        const float sink = a.sinks[(row / a.Lq) % a.Hq];
        mx = fmaxf(mx, sink);
        denom = expf(sink - mx);
      }
      if (active) {  // (a thread past D only takes part in the max)
#pragma unroll 8
        for (int s = 0; s < S; ++s) {
          const float m = pm[int64_t(s) * rows], l = pl[int64_t(s) * rows];
          // no visible key in this split: its o (possibly never written) is not read
          const bool vis = m != -INFINITY;
          float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
          if (vis) o = *reinterpret_cast<const float4*>(po + int64_t(s) * so);
          const float w = vis ? expf(m - mx) : 0.f;
          denom = vis ? fmaf(w, l, denom) : denom;
          r[0] = vis ? fmaf(w, o.x, r[0]) : r[0];
          r[1] = vis ? fmaf(w, o.y, r[1]) : r[1];
          r[2] = vis ? fmaf(w, o.z, r[2]) : r[2];
          r[3] = vis ? fmaf(w, o.w, r[3]) : r[3];
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
