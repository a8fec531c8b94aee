// The generic attention kernel: everything the SPEC allows (bits 2/4/8 and groups 32/64/128 for K
// and V independently, T f32/f16/bf16, D a multiple of 32 up to 512, any GQA ratio and Lq, window,
// u8/u32 bool mask, float mask), writing the split-K partials of split_kv.cuh.
//
// One block of 128 threads per (split, sequence b, KV head, tile of up to 16 query rows of the
// GQA group). The block walks its tokens in shared-memory tiles, double-buffered with cp.async:
// packed K rows (padded so that 8-byte reads of one row per thread are free of bank conflicts),
// packed V rows, and the raw T scales and biases. Each K/V row is loaded once and used for every
// query row of the block. Per tile:
//   1. logits: one thread per token (and per group of RPT query rows) with the affine map folded,
//      q·k̂ = Σ_g s_g (q_g·k̃_g) + z_g Σ_{d in g} q_d, in log2 units (q is pre-scaled by
//      scale·log2(e) once, in shared memory, with its per-group sums);
//   2. online softmax, one warp per query row (f32, -inf for hidden keys, never NaN);
//   3. P·V: one thread per (8 columns of D, group of RPT rows, token subset), dequantizing its 8
//      values once for its RPT rows. The output accumulators live in shared memory between tiles
//      (read, rescaled, accumulated in registers and written back once per tile), which keeps the
//      registers of the logits step free; the token subsets are added at the end.
// The only template parameter is RPT (query rows per thread: 1, 2, 4), which sizes the register
// accumulators; the K and V bits are uniform switches around the per-token work, and everything
// else (T, groups, D) is a runtime value. Three kernels in all keep the build short.
#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"
#include "kernels.cuh"

namespace qsdpa::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;             // query rows per block
constexpr int kQBudget = 4096;           // rows * D floats of pre-scaled queries per block
constexpr int kStageBudget = 48 * 1024;  // bytes of the two K/V tile buffers together
constexpr int kMinTile = 16;             // fewest tokens per tile (D = 512 with 8-bit f32 caches)
constexpr int kDefaultSmem = 48 * 1024;  // dynamic shared memory a kernel gets without opting in
// The most dynamic shared memory any geometry uses (82 KB for D = 320, 8-bit f32 caches, 9 rows;
// checked over every format, type, D and row count), with room: within the 99 KB of sm_86/sm_89.
constexpr int kMaxSmem = 96 * 1024;

// Launch geometry and shared-memory layout, computed on the host from the problem alone.
// Launch geometry and shared-memory layout, computed on the host from the problem alone.
struct Geometry {
  int rows;       // query rows per block (of the rep * Lq rows of a GQA group)
  int rpt;        // query rows per thread (the template parameter RPT)
  int row_parts;  // ceil(rows / rpt)
  int rows_pad;   // row_parts * rpt
  int64_t row_tiles;
  int tile;       // tokens per shared-memory tile
  int k_words, k_stride, k_groups, k_wpg_shift;  // words per row, padded stride, groups, log2 words/group
  int v_words, v_groups, v_group_shift;          // ..., log2 of the V group size
  int cols;       // D / 8: the P·V step's column threads per row part
  int tok_parts;  // token subsets of the P·V step
  int stage_bytes, off_v, off_ks, off_kb, off_vs, off_vb;  // one K/V tile buffer
  int off_qsum, off_s, off_ml, off_pos, off_o, off_stage, smem_bytes;
};

int ilog2(int x) {
  int r = 0;
  while ((1 << r) < x) ++r;
  return r;
}
int align16(int x) { return (x + 15) & ~15; }

Geometry make_geometry(const AttnArgs& a) {
  Geometry g{};
  const int D = int(a.D), ts = dtype_bytes(a.dtype);
  const int64_t group_rows = (a.Hq / a.Hkv) * a.Lq;
  g.k_words = D * a.k_bits / 32;
  g.v_words = D * a.v_bits / 32;
  g.k_groups = D / a.k_group;
  g.v_groups = D / a.v_group;
  g.k_wpg_shift = ilog2(a.k_group * a.k_bits / 32);
  g.v_group_shift = ilog2(a.v_group);
  g.cols = D / 8;

  const int r0 = int(std::min<int64_t>({group_rows, int64_t(kMaxRows), int64_t(std::max(1, kQBudget / D))}));
  g.rpt = r0 <= 1 ? 1 : r0 <= 2 ? 2 : 4;
  // The P·V step gives each (column, row part) pair its own thread: cols * row_parts <= 128.
  g.rows = std::min(r0, g.rpt * std::max(1, kThreads / g.cols));
  g.row_parts = (g.rows + g.rpt - 1) / g.rpt;
  g.rows_pad = g.row_parts * g.rpt;
  g.row_tiles = (group_rows + g.rows - 1) / g.rows;
  g.tok_parts = std::max(1, kThreads / (g.cols * g.row_parts));

  // Padded K row stride in words: even, with an odd number of 8-byte units, so that sixteen
  // threads reading 8 bytes of sixteen different rows touch all 32 banks once.
  g.k_stride = g.k_words + ((g.k_words / 2) % 2 == 0 ? 2 : 0);

  int tile = 1;
  while (tile * 2 <= kThreads / g.row_parts) tile *= 2;
  for (;; tile /= 2) {
    g.tile = tile;
    g.off_v = align16(tile * g.k_stride * 4);
    g.off_ks = g.off_v + align16(tile * g.v_words * 4);
    g.off_kb = g.off_ks + align16(tile * g.k_groups * ts);
    g.off_vs = g.off_kb + align16(tile * g.k_groups * ts);
    g.off_vb = g.off_vs + align16(tile * g.v_groups * ts);
    g.stage_bytes = g.off_vb + align16(tile * g.v_groups * ts);
    if (2 * g.stage_bytes <= kStageBudget || tile <= kMinTile) break;
  }

  g.off_qsum = align16(D * g.rows_pad * 4);
  g.off_s = g.off_qsum + align16(g.k_groups * g.rows_pad * 4);
  g.off_ml = g.off_s + align16(g.rows_pad * g.tile * 4);
  g.off_pos = g.off_ml + align16(3 * g.rows_pad * 4);
  g.off_o = g.off_pos + align16(2 * g.rows_pad * 8);
  g.off_stage = g.off_o + g.tok_parts * g.rows_pad * D * 4;
  g.smem_bytes = g.off_stage + 2 * g.stage_bytes;
  return g;
}

// RPT consecutive floats of shared memory in one load.
template <int RPT>
__device__ __forceinline__ void load_rows(const float* p, float (&v)[RPT]) {
  if constexpr (RPT == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if constexpr (RPT == 2) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x, v[1] = x.y;
  } else {
    v[0] = p[0];
  }
}

// Logits (log2 units, before masks) of one token for RPT query rows. krow: the token's packed K
// row in shared memory; ks/kb: its raw T scales and biases; q: pre-scaled queries [D][rows_pad]
// offset to the first of the RPT rows; qsum: their per-group sums [groups][rows_pad]. Rows hold an
// even number of words and a group at least two, so the row is read in 8-byte word pairs.
template <int KB, int RPT>
__device__ __forceinline__ void token_logits(const uint32_t* krow, const void* ks, const void* kb,
                                             int dtype, const float* q, const float* qsum, int rows_pad,
                                             int words, int wpg_shift, float (&dot)[RPT]) {
  constexpr int VPW = 32 / KB;
  const int wpg_mask = (1 << wpg_shift) - 1;
  float acc[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) acc[r] = 0.f, dot[r] = 0.f;
  for (int wi = 0; wi < words; wi += 2) {
    const uint2 pair = *reinterpret_cast<const uint2*>(krow + wi);
    const float* qw = q + wi * VPW * rows_pad;
#pragma unroll
    for (int e = 0; e < 2 * VPW; ++e) {
      const float kv = unpack_f32<KB>(e < VPW ? pair.x : pair.y, e % VPW);
      float qv[RPT];
      load_rows<RPT>(qw + e * rows_pad, qv);
#pragma unroll
      for (int r = 0; r < RPT; ++r) acc[r] = fmaf(qv[r], kv, acc[r]);
    }
    if (((wi + 2) & wpg_mask) == 0) {  // end of a quantization group: apply its scale and bias
      const int gi = wi >> wpg_shift;
      const float s = load_t(ks, dtype, gi), z = load_t(kb, dtype, gi);
      float qs[RPT];
      load_rows<RPT>(qsum + gi * rows_pad, qs);
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        dot[r] = fmaf(s, acc[r], fmaf(z, qs[r], dot[r]));
        acc[r] = 0.f;
      }
    }
  }
}

// The 8 values of columns [8c, 8c + 8) of a packed V row, as exact f32 integers.
template <int VB>
__device__ __forceinline__ void unpack8(const uint32_t* vrow, int c, float (&x)[8]) {
  if constexpr (VB == 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(vrow + 2 * c);
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = unpack_f32<8>(w.x, e), x[e + 4] = unpack_f32<8>(w.y, e);
  } else if constexpr (VB == 4) {
    const uint32_t w = vrow[c];
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = unpack_f32<4>(w, e);
  } else {
    const uint32_t w = vrow[c >> 1] >> ((c & 1) * 16);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = unpack_f32<2>(w, e);
  }
}

// Tokens j0, j0 + step, ... < nt of a tile into the P·V accumulators of columns [8c, 8c + 8)
// (V group gi) and RPT query rows. p: softmax weights [rows][tile] offset to the first row.
template <int VB, int RPT>
__device__ __forceinline__ void accumulate_pv(float (&acc)[RPT][8], const uint32_t* v, const void* vs,
                                              const void* vb, int dtype, const float* p, int tile,
                                              int v_words, int v_groups, int c, int gi, int j0, int nt,
                                              int step) {
  for (int j = j0; j < nt; j += step) {
    float val[8];
    unpack8<VB>(v + j * v_words, c, val);
    const float s = load_t(vs, dtype, j * v_groups + gi), z = load_t(vb, dtype, j * v_groups + gi);
#pragma unroll
    for (int e = 0; e < 8; ++e) val[e] = fmaf(s, val[e], z);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      const float pr = p[r * tile + j];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][e] = fmaf(pr, val[e], acc[r][e]);
    }
  }
}

// Packed K rows [t0, t0 + nt) into the padded tile layout, UNIT bytes per copy.
template <int UNIT>
__device__ __forceinline__ void copy_k_rows(unsigned char* dst, const uint32_t* src, int nt, int words,
                                            int stride, int tid) {
  const int per_row = words * 4 / UNIT;
  const auto* s = reinterpret_cast<const unsigned char*>(src);
  for (int u = tid; u < nt * per_row; u += kThreads) {
    const int j = u / per_row, c = u - j * per_row;
    cp_async<UNIT>(dst + j * stride * 4 + c * UNIT, s + (int64_t(j) * words * 4 + c * UNIT));
  }
}

// Tokens [t0, t0 + nt) of (b, KV head h) of one cache in any layout, into a tile buffer: packed rows
// at `stride` words, scales and biases at `sbytes` bytes per row. One thread per 4 bytes (scales
// and biases hold whole 2-byte or 4-byte values, and a row of them is at least 2 bytes).
__device__ __forceinline__ void gather_rows(const detail::RowMap& m, const uint32_t* packed, const void* scales,
                                            const void* biases, int words, int stride, int sbytes, int64_t b,
                                            int64_t h, int64_t t0, int nt, unsigned char* dst_p,
                                            unsigned char* dst_s, unsigned char* dst_b, int tid) {
  auto* dp = reinterpret_cast<uint32_t*>(dst_p);
  for (int u = tid; u < nt * words; u += kThreads) {
    const int j = u / words, w = u - j * words;
    dp[j * stride + w] = packed[m.row(b, h, t0 + j) * words + w];
  }
  const auto* s8 = static_cast<const unsigned char*>(scales);
  const auto* b8 = static_cast<const unsigned char*>(biases);
  const int halves = sbytes / 2;  // 2-byte pieces per row
  for (int u = tid; u < nt * halves; u += kThreads) {
    const int j = u / halves, c = u - j * halves;
    const int64_t off = m.row(b, h, t0 + j) * sbytes + 2 * c;
    reinterpret_cast<uint16_t*>(dst_s + j * sbytes)[c] = *reinterpret_cast<const uint16_t*>(s8 + off);
    reinterpret_cast<uint16_t*>(dst_b + j * sbytes)[c] = *reinterpret_cast<const uint16_t*>(b8 + off);
  }
}

// Starts the asynchronous copy of tokens [t0, t0 + nt) of (b, KV head) bh into tile buffer st.
// The source addresses are recomputed from the kernel parameters on each call rather than kept
// in registers through the token loop.
__device__ __forceinline__ void issue_tile(const AttnArgs& a, const Geometry& g, int64_t bh, int64_t t0, int nt,
                                           unsigned char* st, int tid) {
  const int ts = dtype_bytes(a.dtype);
  if (!a.dense) {  // any layout: row by row, with plain loads (the copy still ends a cp.async group)
    const int64_t b = bh / a.Hkv, h = bh - b * a.Hkv;
    gather_rows(a.kmap, a.k_packed, a.k_scales, a.k_biases, g.k_words, g.k_stride, g.k_groups * ts, b, h, t0, nt, st,
                st + g.off_ks, st + g.off_kb, tid);
    gather_rows(a.vmap, a.v_packed, a.v_scales, a.v_biases, g.v_words, g.v_words, g.v_groups * ts, b, h, t0, nt,
                st + g.off_v, st + g.off_vs, st + g.off_vb, tid);
    cp_async_commit();
    return;
  }
  const int64_t row = bh * a.N + t0;  // first cache row of the tile
  const uint32_t* krows = a.k_packed + row * g.k_words;
  if ((reinterpret_cast<uintptr_t>(a.k_packed) & 7) == 0)  // rows hold an even number of words
    copy_k_rows<8>(st, krows, nt, g.k_words, g.k_stride, tid);
  else
    copy_k_rows<4>(st, krows, nt, g.k_words, g.k_stride, tid);
  copy_block_async(st + g.off_v, a.v_packed + row * g.v_words, nt * g.v_words * 4, tid, kThreads);
  const int64_t kg = row * g.k_groups * ts, vg = row * g.v_groups * ts;
  copy_block_async(st + g.off_ks, static_cast<const unsigned char*>(a.k_scales) + kg, nt * g.k_groups * ts, tid,
                   kThreads);
  copy_block_async(st + g.off_kb, static_cast<const unsigned char*>(a.k_biases) + kg, nt * g.k_groups * ts, tid,
                   kThreads);
  copy_block_async(st + g.off_vs, static_cast<const unsigned char*>(a.v_scales) + vg, nt * g.v_groups * ts, tid,
                   kThreads);
  copy_block_async(st + g.off_vb, static_cast<const unsigned char*>(a.v_biases) + vg, nt * g.v_groups * ts, tid,
                   kThreads);
  cp_async_commit();
}

template <int RPT>
__global__ void __launch_bounds__(kThreads) generic_attention_kernel(const AttnArgs a, const Geometry g) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);                  // [D][rows_pad], pre-scaled
  float* qsum_s = reinterpret_cast<float*>(smem + g.off_qsum);  // [k_groups][rows_pad]
  float* s_s = reinterpret_cast<float*>(smem + g.off_s);        // [rows_pad][tile] logits, then p
  float* m_s = reinterpret_cast<float*>(smem + g.off_ml);       // [rows_pad] running max (log2)
  float* l_s = m_s + g.rows_pad;                                // [rows_pad] running sum
  float* alpha_s = l_s + g.rows_pad;                            // [rows_pad] rescale of this tile
  int64_t* pos_s = reinterpret_cast<int64_t*>(smem + g.off_pos);  // [rows_pad] position (-1: pad)
  int64_t* mrow_s = pos_s + g.rows_pad;                            // [rows_pad] mask row offset
  float* o_s = reinterpret_cast<float*>(smem + g.off_o);  // [tok_parts][rows_pad][D] accumulators
  unsigned char* stages = smem + g.off_stage;

  const int tid = threadIdx.x;
  int64_t idx = blockIdx.x;
  const int64_t rtile = idx % g.row_tiles;
  idx /= g.row_tiles;
  const int split = int(idx % a.num_splits);
  const int64_t bh = idx / a.num_splits;  // b * Hkv + KV head
  const int64_t b = bh / a.Hkv, kvh = bh % a.Hkv;
  const int64_t N = a.N, Lq = a.Lq, rep = a.Hq / a.Hkv;
  // This sequence's tokens and query rows: row i sits at position n - lq + i; rows i >= lq are
  // padding that sees no key.
  const int64_t n = detail::seq_kv_len(a.kv_lens, b, N), lq = detail::seq_q_len(a.q_lens, b, Lq, n);
  const int64_t gr0 = rtile * g.rows;  // first row of the block within its GQA group
  const int nrows = int(min(int64_t(g.rows), rep * Lq - gr0));
  const int64_t row0 = (b * a.Hq + kvh * rep) * Lq + gr0;  // its index in [B, Hq, Lq]
  const int64_t total_rows = a.B * a.Hq * Lq;
  const int D = int(a.D);

  // Tokens of this block: the split's chunk, clipped to what its rows can see.
  int64_t i_lo = 0, i_hi = Lq - 1;
  if (const int64_t i0 = gr0 % Lq; nrows < Lq && i0 + nrows <= Lq) i_lo = i0, i_hi = i0 + nrows - 1;
  i_hi = min(i_hi, lq - 1);  // the last row that is not padding (< i_lo: none)
  const int64_t s0 = a.t_begin + int64_t(split) * a.chunk;
  int64_t t_lo = s0;
  if (a.window > 0) t_lo = max(t_lo, n - lq + i_lo - a.window + 1);
  t_lo = max(t_lo, int64_t(0));
  const int64_t t_hi = i_hi < i_lo ? t_lo : min(min(s0 + a.chunk, n), n - lq + i_hi + 1);  // exclusive

  if (t_lo >= t_hi) {  // nothing visible: m = -inf, l = 0, and o zeros (the combine weighs it by 0)
    const int64_t pi = int64_t(split) * total_rows + row0;
    for (int r = tid; r < nrows; r += kThreads) a.part_m[pi + r] = -INFINITY, a.part_l[pi + r] = 0.f;
    if (QSDPA_COMBINE_ONE_ROUND)
      for (int64_t e = tid; e < int64_t(nrows) * a.D; e += kThreads) a.part_o[pi * a.D + e] = 0.f;
    return;
  }

  const int ts = dtype_bytes(a.dtype);
  issue_tile(a, g, bh, t_lo, int(min(int64_t(g.tile), t_hi - t_lo)), stages, tid);
  // element offsets of the block's row r in q and in the masks
  const auto q_off = [&](int64_t r) {
    const int64_t gr = gr0 + r, hl = gr / Lq;
    return a.qmap.at(b, kvh * rep + hl, gr - hl * Lq);
  };
  const auto m_off = [&](int64_t r) {
    const int64_t gr = gr0 + r, hl = gr / Lq;
    return a.mmap.at(b, kvh * rep + hl, gr - hl * Lq);
  };

  // Queries, pre-scaled by scale * log2(e) so that the softmax runs on exp2.
  // Loaded kQBatch per thread at a time, then stored: a few memory latencies for the block rather
  // than one per element (the shared-memory stores could otherwise be ordered between the loads).
  const float qscale = a.scale * kLog2e;
  {
    constexpr int kQBatch = 8;
    const int total = g.rows_pad * D;
    for (int e0 = tid; e0 < total; e0 += kQBatch * kThreads) {
      float v[kQBatch];
#pragma unroll
      for (int k = 0; k < kQBatch; ++k) {
        const int e = e0 + k * kThreads, r = e / D, d = e - r * D;
        v[k] = e < total && r < nrows ? load_t(a.q, a.dtype, q_off(r) + d) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kQBatch; ++k) {
        const int e = e0 + k * kThreads, r = e / D, d = e - r * D;
        if (e < total) q_s[d * g.rows_pad + r] = r < nrows ? v[k] * qscale : 0.f;
      }
    }
  }
  for (int e = tid; e < g.tok_parts * g.rows_pad * D; e += kThreads) o_s[e] = 0.f;
  for (int r = tid; r < g.rows_pad; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
    const int64_t i = (gr0 + r) % Lq;
    pos_s[r] = r < nrows && i < lq ? n - lq + i : -1;
    mrow_s[r] = r < nrows ? m_off(r) : 0;
  }
  __syncthreads();
  for (int e = tid; e < g.k_groups * g.rows_pad; e += kThreads) {
    const int gi = e / g.rows_pad, r = e - gi * g.rows_pad;
    float sum = 0.f;
    for (int d = gi * a.k_group; d < (gi + 1) * a.k_group; ++d) sum += q_s[d * g.rows_pad + r];
    qsum_s[gi * g.rows_pad + r] = sum;
  }

  // Thread roles. Logits: token sj of the tile, rows sr0 .. sr0 + RPT. P·V: columns
  // [8 pc, 8 pc + 8), rows pr0 .. pr0 + RPT, tokens ptp, ptp + tok_parts, ...
  const int sj = tid % g.tile, sr0 = (tid / g.tile) * RPT;
  const bool s_active = tid / g.tile < g.row_parts;
  const int pc = tid % g.cols, pr0 = (tid / g.cols % g.row_parts) * RPT;
  const int ptp = tid / g.cols / g.row_parts;
  const bool p_active = ptp < g.tok_parts;
  const int pgi = (pc * 8) >> g.v_group_shift;
  const int warp = tid >> 5, lane = tid & 31;
  float* o_own = o_s + (ptp * g.rows_pad + pr0) * D + pc * 8;  // this thread's accumulators

  const int64_t ntiles = (t_hi - t_lo + g.tile - 1) / g.tile;
  for (int64_t it = 0; it < ntiles; ++it) {
    const int64_t t0 = t_lo + it * g.tile;
    const int nt = int(min(int64_t(g.tile), t_hi - t0));
    unsigned char* st = stages + (it & 1) * g.stage_bytes;
    if (it + 1 < ntiles) {
      const int64_t t1 = t0 + g.tile;
      issue_tile(a, g, bh, t1, int(min(int64_t(g.tile), t_hi - t1)), stages + ((it + 1) & 1) * g.stage_bytes, tid);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    // 1. logits of the tile's tokens; hidden keys are -inf
    if (s_active) {
      float x[RPT];
      const int64_t t = t0 + sj;
      if (sj < nt) {
        const auto* krow = reinterpret_cast<const uint32_t*>(st) + sj * g.k_stride;
        const unsigned char* ks = st + g.off_ks + sj * g.k_groups * ts;
        const unsigned char* kb = st + g.off_kb + sj * g.k_groups * ts;
        const float* q = q_s + sr0;
        const float* qs = qsum_s + sr0;
        if (a.k_bits == 2)
          token_logits<2, RPT>(krow, ks, kb, a.dtype, q, qs, g.rows_pad, g.k_words, g.k_wpg_shift, x);
        else if (a.k_bits == 4)
          token_logits<4, RPT>(krow, ks, kb, a.dtype, q, qs, g.rows_pad, g.k_words, g.k_wpg_shift, x);
        else
          token_logits<8, RPT>(krow, ks, kb, a.dtype, q, qs, g.rows_pad, g.k_words, g.k_wpg_shift, x);
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
          const int64_t pos = pos_s[sr0 + r];
          bool vis = t <= pos && (a.window == 0 || t > pos - a.window);
          if (vis && a.bool_mask) {
            const int64_t mi = mrow_s[sr0 + r] + t;
            vis = a.bool_mask_u32 ? static_cast<const uint32_t*>(a.bool_mask)[mi] != 0u
                                  : static_cast<const uint8_t*>(a.bool_mask)[mi] != 0;
          }
          if (vis && a.float_mask) {
            const float fm = load_t(a.float_mask, a.dtype, mrow_s[sr0 + r] + t);
            vis = fm != -INFINITY;
            x[r] = fmaf(fm, kLog2e, x[r]);
          }
          x[r] = vis ? x[r] : -INFINITY;
        }
      } else {
#pragma unroll
        for (int r = 0; r < RPT; ++r) x[r] = -INFINITY;
      }
#pragma unroll
      for (int r = 0; r < RPT; ++r) s_s[(sr0 + r) * g.tile + sj] = x[r];
    }
    __syncthreads();

    // 2. online softmax, one warp per row: p = exp2(x - m_new), rescale alpha = exp2(m_old - m_new)
    for (int r = warp; r < g.rows_pad; r += kWarps) {
      float* sr = s_s + r * g.tile;
      float mx = -INFINITY;
      for (int j = lane; j < nt; j += 32) mx = fmaxf(mx, sr[j]);
      mx = warp_max(mx);
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f, alpha = 1.f;
      if (m_new != -INFINITY) {
        alpha = exp2f(m_old - m_new);
        for (int j = lane; j < nt; j += 32) {
          const float p = exp2f(sr[j] - m_new);
          sr[j] = p;
          sum += p;
        }
      } else {
        for (int j = lane; j < nt; j += 32) sr[j] = 0.f;
      }
      sum = warp_sum(sum);
      // Every lane has read m_s[r] above; order those reads before lane 0's writes
      // (the shuffles of warp_sum do not count as a barrier for compute-sanitizer's racecheck).
      __syncwarp();
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();

    // 3. P·V
    if (p_active) {
      float acc[RPT][8];
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        const float al = alpha_s[pr0 + r];
        const float4 x0 = reinterpret_cast<const float4*>(o_own + r * D)[0];
        const float4 x1 = reinterpret_cast<const float4*>(o_own + r * D)[1];
        acc[r][0] = x0.x * al, acc[r][1] = x0.y * al, acc[r][2] = x0.z * al, acc[r][3] = x0.w * al;
        acc[r][4] = x1.x * al, acc[r][5] = x1.y * al, acc[r][6] = x1.z * al, acc[r][7] = x1.w * al;
      }
      const auto* v = reinterpret_cast<const uint32_t*>(st + g.off_v);
      const float* p = s_s + pr0 * g.tile;
      if (a.v_bits == 2)
        accumulate_pv<2, RPT>(acc, v, st + g.off_vs, st + g.off_vb, a.dtype, p, g.tile, g.v_words, g.v_groups, pc,
                              pgi, ptp, nt, g.tok_parts);
      else if (a.v_bits == 4)
        accumulate_pv<4, RPT>(acc, v, st + g.off_vs, st + g.off_vb, a.dtype, p, g.tile, g.v_words, g.v_groups, pc,
                              pgi, ptp, nt, g.tok_parts);
      else
        accumulate_pv<8, RPT>(acc, v, st + g.off_vs, st + g.off_vb, a.dtype, p, g.tile, g.v_words, g.v_groups, pc,
                              pgi, ptp, nt, g.tok_parts);
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        reinterpret_cast<float4*>(o_own + r * D)[0] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        reinterpret_cast<float4*>(o_own + r * D)[1] = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
      }
    }
    __syncthreads();
  }

  // Partials: m in natural-log units, l, and o summed over the token subsets.
  const int64_t pi = int64_t(split) * total_rows + row0;
  float* po = a.part_o + pi * D;
  for (int r = tid; r < nrows; r += kThreads) {
    a.part_m[pi + r] = m_s[r] * kLn2;
    a.part_l[pi + r] = l_s[r];
  }
  const int part = g.rows_pad * D;
  for (int e = tid; e < nrows * D; e += kThreads) {
    float sum = 0.f;
    for (int tp = 0; tp < g.tok_parts; ++tp) sum += o_s[tp * part + e];
    po[e] = sum;
  }
}

using KernelFn = void (*)(AttnArgs, Geometry);

KernelFn pick(int rpt) {
  if (rpt == 1) return generic_attention_kernel<1>;
  if (rpt == 2) return generic_attention_kernel<2>;
  return generic_attention_kernel<4>;
}

// Opts the kernel of geometry g in to more than 48 KB of shared memory when it needs it, once per
// kernel and device (with the most any geometry uses), so that later calls, and calls under graph
// capture, make no attribute call.
cudaError_t opt_in(const Geometry& g, KernelFn k) {
  if (g.smem_bytes <= kDefaultSmem) return cudaSuccess;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  static std::atomic<uint64_t> opted[3];
  std::atomic<uint64_t>& bits = opted[g.rpt == 1 ? 0 : g.rpt == 2 ? 1 : 2];
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(bits.load(std::memory_order_acquire) & bit) || dev >= 64) {
    if (cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
        e != cudaSuccess)
      return e;
    bits.fetch_or(bit, std::memory_order_acq_rel);
  }
  return cudaSuccess;
}

}  // namespace

int64_t generic_row_tiles(const AttnArgs& a) { return make_geometry(a).row_tiles; }

int generic_blocks_per_sm(const AttnArgs& a) {
  const Geometry g = make_geometry(a);
  if (g.smem_bytes > kMaxSmem) return 1;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  // Queried once per (device, kernel, shared memory bytes).
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, int> cache;
  const auto key = std::make_tuple(dev, g.rpt, g.smem_bytes);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const KernelFn k = pick(g.rpt);
  int n = 0;
  if (opt_in(g, k) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, size_t(g.smem_bytes)) != cudaSuccess) {
    cudaGetLastError();
    return 1;  // not cached: asked again next time
  }
  n = std::max(n, 1);
  cache[key] = n;
  return n;
}

cudaError_t generic_launch(const AttnArgs& a, cudaStream_t s) {
  const Geometry g = make_geometry(a);
  const int64_t blocks = int64_t(a.num_splits) * a.B * a.Hkv * g.row_tiles;
  if (blocks < 1 || blocks > INT_MAX || g.smem_bytes > kMaxSmem) return cudaErrorInvalidConfiguration;
  const KernelFn k = pick(g.rpt);
  if (cudaError_t e = opt_in(g, k); e != cudaSuccess) return e;
  k<<<unsigned(blocks), kThreads, size_t(g.smem_bytes), s>>>(a, g);
  return cudaGetLastError();
}

}  // namespace qsdpa::cuda
