// The D = 512 tensor-core kernel with the query rows on the mma's M dimension ("rows on M"), for
// f16 queries, 4- or 8-bit keys and values of one width, groups of 64, contiguous caches, and 9 to
// 16 query rows per KV head (rep * Lq: GQA 16 at Lq = 1, the usual shape of a D = 512 model). One
// block of 8 warps per (b * Hkv, split): warp w owns head dims [64 w, 64 w + 64), which are one
// quantization group of keys and one of values.
//
// Why a kernel of its own: the d-split form (mma_kernel.cuh) puts tokens on M and the rows on N,
// 8 rows per n-tile, and the accumulators of two n-tiles of 512 dims do not fit a warp's
// registers, so 16 rows run as two blocks of 8 and every code is unpacked twice (once per block);
// the D = 512 4-bit call was bound by those instructions (58 us for 75 MB on an H200, run 92, 31 %
// of copy speed). Here q is the A operand (16 rows x 16 dims per k-step, loaded once), the keys
// and values the B operands, so each code is unpacked once for all 16 rows:
//   - Logits: each warp computes its 64 dims' partial Q Kᵀ for the 16 rows and 32 tokens of a tile
//     (16 mma), folds its group's key scale and bias in (per token, in f32), and writes the 16
//     values per lane to shared memory.
//   - Reduce-scatter: warp w sums the 8 warps' partials of rows 2w and 2w + 1 (two values per
//     lane, 16 lanes per row), keeps those rows' online softmax (lazy rescale, as the other
//     kernels), and writes p (f16, in the A-operand order of the next step) and the rows' rescale
//     factors.
//   - Values: every warp multiplies P by its group's value scale per token (p s as hi + lo f16, the
//     kVFold form of mma_kernel.cuh: bare subnormal codes as the B operand, the biases as one more
//     mma), O (16 rows x 64 dims, 32 registers) += P V.
//   Two barriers per tile; each warp copies only its own dims and its group's scales (a private
//   cp.async ring: no barrier for the copies). Nothing merges across warps at the end: O of every
//   warp is in the owners' reference, and the partials are stored straight from the registers.
// The rows' visibility (positions, window, masks) is applied by the owners, per element, on the
// tiles that need it. Splits merge as the other tensor-core kernels do: the combine kernel, its
// counted arrivals, or the in-kernel merge of the last split (merge_if_last), never in clusters.
// Measured (H100, 2026-12-06, run 94): correct, but slower than the d-split kernel (D=512 4-bit
// 74.1 against 57.7 us per call): 543 warp instructions per warp and tile rather than the ~330
// counted on paper (at 128 registers the copy path's addresses are recomputed every tile), issued
// at 0.33 per scheduler and cycle, the warps waiting mostly on shared memory (the scale loads and
// copies of 4 bytes, the exchange) at 3.4 warps per scheduler. With the 4-bit loop pipelined on
// shared-memory barrier objects (run 95, same H100 run): 74.5 -> 70.7 us against the d-split's
// 57.8. Run 97's trace: its median block ends the token loop 4.5 us before the d-split's, but the
// two blocks of a multiprocessor end far apart and the SMs' last blocks end later (57.4 against
// 51.1 us, p50), ~4.8 us of it the epilogue (the partials stored from the registers 4 bytes at a
// time: 6.6 us against the d-split's 1.8), and the combine merges 64 splits, not 32. Per
// multiprocessor the loop is no faster. Off by default (QSDPA_MMA_ROWSM).
#pragma once

#include "mma_kernel.cuh"

namespace qsdpa::cuda::mmak {

constexpr int kRmWarps = 8;   // warps per block; warp w: head dims [64 w, 64 w + 64)
constexpr int kRmRows = 16;   // query rows per block (the mma's M)
constexpr int kRmD = 512, kRmDW = 64, kRmG = 64;

// Copy-ring stages per warp: 3 at 4 bits (a stage is 2.5 KB per warp), 2 at 8 bits (4.5 KB), so
// that two blocks fit a multiprocessor's shared memory.
__host__ __device__ constexpr int rowsm_stages(int bits) { return bits == 4 ? 3 : 2; }

// The loop's form: pipelined on shared-memory barrier objects (the next tile's logits while the
// owners finish a tile's softmax; needs three ring stages: 4-bit), or two block barriers per tile.
#ifndef QSDPA_MMA_ROWSM_PIPE
#define QSDPA_MMA_ROWSM_PIPE 1
#endif
template <int BITS>
constexpr bool kRmPipelined = QSDPA_MMA_ROWSM_PIPE != 0 && rowsm_stages(BITS) == 3;

template <int BITS>
struct RmShape {
  static constexpr int kStages = rowsm_stages(BITS);
  static constexpr int kRBG = kRmD * BITS / 8;   // bytes of a packed row in memory
  static constexpr int kRB = kRmDW * BITS / 8;   // bytes of a warp's part of a row
  static constexpr int kC = kRB / 16;            // its 16-byte pieces (4-bit: 2, 8-bit: 4)
  static constexpr int kKS = kRmDW / 16;         // k-steps of the logits per warp
  static constexpr int kNGF = kRmD / kRmG;       // groups per row in memory
  // One scale / bias tensor of a tile in a warp's stage: per token the 4 bytes of the pair of
  // groups that holds the warp's group (group w is half w & 1 of pair w / 2).
  static constexpr int kSC = kTileTokens * 4;
  static constexpr int kStage = 2 * kTileTokens * kRB + 4 * kSC;
  static constexpr int kPipe = kRmWarps * kStages * kStage;
  // The exchange: the warps' partial logits [warp][row half][lane][2] float4, P as f16 pairs
  // [mt][c][g][4] (the A fragments of the value mma), the rows' rescale factors [16].
  static constexpr int kX = kRmWarps * 2 * 32 * 2 * 16;
  static constexpr int kP = 2 * 4 * 8 * 4 * 4;
  static constexpr int kXch = 2 * (kX + kP + kRmRows * 4);  // two buffers (tile parity)
  static constexpr int kQf = kRmRows * kRmD * 4;  // the query rows' f32 copy (prologue), aliased
  static constexpr int kRegion = kQf > kXch ? kQf : kXch;
  // then the rows' group sums [16][8], logit factors [16], positions [16] and mask rows [16], and
  // the pipelined form's barrier objects (xbar[2], pbar[2])
  static constexpr int kTail = kRmRows * kNGF * 4 + kRmRows * 4 + 2 * kRmRows * 8 + 4 * 8;
  static constexpr int kSmem = kPipe + kRegion + kTail;
  static_assert(kC >= 2 && (kC & (kC - 1)) == 0, "row pieces: a power of two, at least 2");
  static_assert(kPipe % 16 == 0 && kRegion % 16 == 0, "16-byte aligned regions");
  static_assert(16 + kRmRows * kInKernelMergeMaxSplits * 8 + kRmRows * 16 <= kPipe, "the in-kernel merge's scratch fits");
};

__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

template <int BITS>
__global__ void __launch_bounds__(kRmWarps * 32, 2) rowsm_kernel(const __grid_constant__ AttnArgs a) {
  using T = __half;
  using S = RmShape<BITS>;
  using F = Fmt<T, BITS, true>;  // keys and values: subnormal f16 codes
  using Y = Ty<T>;
  constexpr int W = kRmWarps, D = kRmD, kTW = kTileTokens, kRT = kRmRows, STAGES = S::kStages;
  constexpr int kC = S::kC, kRB = S::kRB, kRBG = S::kRBG, kKS = S::kKS, kNGF = S::kNGF, kSC = S::kSC;
  constexpr bool kEF = evict_first_for(D, BITS, BITS);  // (as the other tensor-core kernels)
  static_assert(F::kDen && F::kVCodes, "f16 subnormal codes");
  extern __shared__ __align__(16) uint8_t smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // (as attention_kernel: nothing is read or written before the previous kernel's end)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#if QSDPA_MMA_TRACE
  const unsigned long long tr_start = global_ns();
#endif
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int64_t N = a.N;
  const int rep = int(a.Hq / a.Hkv), Lq = int(a.Lq), R = rep * Lq;
  const int row_tiles = (R + kRT - 1) / kRT;
  const int64_t bh = int64_t(blockIdx.x) / row_tiles;
  const int rtile = int(int64_t(blockIdx.x) - bh * row_tiles);
  const int split = int(blockIdx.y);
  const int64_t b = bh / a.Hkv, kvh = bh - b * a.Hkv;
  const int r0 = rtile * kRT, nrows = min(kRT, R - r0);
  const int64_t n = detail::seq_kv_len(a.kv_lens, b, N);
  const int lq = int(detail::seq_q_len(a.q_lens, b, Lq, n));
  const int64_t rows_total = a.B * a.Hq * a.Lq;
  int64_t tb = a.t_begin + int64_t(split) * a.chunk;
  const int64_t te = n < tb + a.chunk ? n : tb + a.chunk;

  float* xq = reinterpret_cast<float*>(smem + S::kPipe);  // [kRT][D] query rows (f32), then the exchange
  float* qc = reinterpret_cast<float*>(smem + S::kPipe + S::kRegion);  // [kRT][kNGF] Σ_g q
  float* rowc = qc + kRT * kNGF;                                      // [kRT] logit factor (log2 units)
  int64_t* rpos = reinterpret_cast<int64_t*>(rowc + kRT);             // [kRT] position (-1: none)
  int64_t* rmrow = rpos + kRT;                                        // [kRT] first mask element
  const uint32_t xbar = smem_addr(rmrow + kRT), pbar = xbar + 16;       // [2] each (pipelined form)
  const auto qrow_of = [&](int lr) {
    int i;
    const int hl = row_head(r0 + lr, Lq, i);
    return (b * a.Hq + kvh * rep + hl) * a.Lq + i;
  };

  if (tb >= te) {  // a split past this sequence's end (per-sequence lengths): no key
    for (int lr = tid; lr < nrows; lr += W * 32) {
      const int64_t prow = int64_t(split) * rows_total + qrow_of(lr);
      a.part_m[prow] = -INFINITY;
      a.part_l[prow] = 0.0f;
    }
    if (a.counters) merge_if_last_cold<kRT, W>(&a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
    else if (QSDPA_MMA_ARRIVALS && a.arrivals) arrive_count(a);
    return;
  }
  if (a.window > 0) {
    const int64_t lo = n - lq - a.window + 1;
    if (lo > tb) tb += (lo - tb) / kTW * kTW;
  }
  const int ntiles = te > tb ? int((te - tb + kTW - 1) / kTW) : 0;  // (a split's tiles: chunk / 32 < 2^31)

  // ---- the warp's copy ring: its 64 dims of K and V, its group's scales and biases ----------
  const uint32_t wring = smem_addr(smem) + uint32_t(warp * STAGES * S::kStage);
  const int64_t krow0 = b * a.kmap.batch_stride + kvh * a.kmap.head_stride + tb;
  const int64_t vrow0 = b * a.vmap.batch_stride + kvh * a.vmap.head_stride + tb;
  // (piece i = lane + 32 k of the warp's tile: piece i % kC of its part of row i / kC)
  const int lane_p = (lane / kC) * kRBG + warp * kRB + (lane % kC) * 16;
  const uint8_t* gk = reinterpret_cast<const uint8_t*>(a.k_packed) + krow0 * kRBG + lane_p;
  const uint8_t* gv = reinterpret_cast<const uint8_t*>(a.v_packed) + vrow0 * kRBG + lane_p;
  const int sc_arr = lane >> 3, sc_tok = lane & 7;  // this lane: tensor lane / 8, tokens lane % 8 + 8 j
  const uint8_t* gsc = static_cast<const uint8_t*>(sc_arr == 0   ? a.k_scales
                                                   : sc_arr == 1 ? a.k_biases
                                                   : sc_arr == 2 ? a.v_scales
                                                                 : a.v_biases) +
                       ((sc_arr < 2 ? krow0 : vrow0) + sc_tok) * (kNGF * 2) + (warp >> 1) * 4;
  uint32_t so[kC];
  piece_offsets(lane, so);
  const auto issue = [&](int it, int stage) {
    const int64_t left = te - (tb + int64_t(it) * kTW);
    const uint32_t sk = wring + uint32_t(stage * S::kStage), sv = sk + kTW * kRB;
    const uint32_t sd = sv + kTW * kRB + uint32_t(sc_arr * kSC + sc_tok * 4);
    const uint64_t tl = uint64_t(uint32_t(it));
    const uint8_t* pk = gk + tl * uint32_t(kTW * kRBG);
    const uint8_t* pv = gv + tl * uint32_t(kTW * kRBG);
    const uint8_t* ps = gsc + tl * uint32_t(kTW * kNGF * 2);
    if (left >= kTW) {
      copy_rows<kC, kRBG, true, false, kEF>(sk, so, pk, a.k_packed, lane, kTW);
      copy_rows<kC, kRBG, true, false, kEF>(sv, so, pv, a.v_packed, lane, kTW);
#pragma unroll
      for (int j = 0; j < kTW / 8; ++j) cp_async_small<4>(sd + uint32_t(32 * j), ps + 8 * j * kNGF * 2, true);
    } else {  // the last, partial tile: rows past the end are zero-filled (their scales 0)
      const int lf = int(left);
      copy_rows<kC, kRBG, false, false, kEF>(sk, so, pk, a.k_packed, lane, lf);
      copy_rows<kC, kRBG, false, false, kEF>(sv, so, pv, a.v_packed, lane, lf);
#pragma unroll
      for (int j = 0; j < kTW / 8; ++j) {
        const bool in = sc_tok + 8 * j < lf;
        cp_async_small<4>(sd + uint32_t(32 * j), in ? ps + 8 * j * kNGF * 2 : a.k_scales, in);
      }
    }
  };

  // ---- query rows: 16-byte pieces, a thread's four consecutive (32 dims of one row) ----------
  const uint16_t* q16 = static_cast<const uint16_t*>(a.q);
  constexpr int kTPR = W * 32 / kRT, kDPT = D / kTPR;  // threads per row (16), dims per thread (32)
  static_assert(kDPT == 32 && kRmG % kDPT == 0, "a thread's dims: one piece of a group");
  const int qlr = tid / kTPR, qd0 = (tid - qlr * kTPR) * kDPT;
  uint4 qv[kDPT / 8];
  {
    int i;
    const int hl = row_head(r0 + qlr, Lq, i);
    const uint16_t* src = qlr < nrows ? q16 + (a.qmap.at(b, kvh * rep + hl, i) + qd0) : nullptr;
#pragma unroll
    for (int k = 0; k < kDPT / 8; ++k) {
      qv[k] = src ? ldg_piece8(src + 8 * k) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
#pragma unroll
  for (int s = 0; s < (kRmPipelined<BITS> ? STAGES : STAGES - 1); ++s) {
    if (s < ntiles) issue(s, s);
    cp_commit();
  }
  {
    float f[kDPT];
#pragma unroll
    for (int k = 0; k < kDPT / 8; ++k) {
      const uint32_t w4[4] = {qv[k].x, qv[k].y, qv[k].z, qv[k].w};
#pragma unroll
      for (int j = 0; j < 8; ++j) f[8 * k + j] = Y::to_f32(uint16_t(w4[j >> 1] >> (16 * (j & 1))));
    }
    if (kRmPipelined<BITS> && tid == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) mbar_init(xbar + uint32_t(8 * j), W * 32);  // (published by the barrier below)
    }
    if (tid < kRT) {
      int i;
      const int hl = row_head(r0 + tid, Lq, i);
      rpos[tid] = tid < nrows && i < lq ? n - lq + i : -1;
      rmrow[tid] = tid < nrows ? a.mmap.at(b, kvh * rep + hl, i) : 0;
    }
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kDPT; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
    for (int o = kTPR / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int e = prescale_exp<F>(amax);
    const float sc = ldexpf(1.0f, e);
    float s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kDPT; ++j) {
      f[j] *= sc;
      s1 += f[j];
    }
#pragma unroll
    for (int j = 0; j < kDPT; j += 4)
      *reinterpret_cast<float4*>(xq + qlr * D + qd0 + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
#pragma unroll
    for (int o = 1; o * kDPT < kRmG; o <<= 1) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    if ((qd0 & (kRmG - 1)) == 0) qc[qlr * kNGF + qd0 / kRmG] = s1;
    if (qd0 == 0) rowc[qlr] = a.scale * kLog2e * ldexpf(1.0f, -e) / F::kKappa;
  }
  __syncthreads();

  // A operands: rows g and g + 8 of the warp's dims, in the key unpacking order (F::kdim)
  uint32_t aq[kKS][4];
#pragma unroll
  for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int d0 = F::kdim(ks, 2 * c + 8 * j), d1 = F::kdim(ks, 2 * c + 8 * j + 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* qr = xq + (g + 8 * h) * D + warp * kRmDW;
        aq[ks][2 * j + h] = Y::pack(qr[d0] * F::beta(d0), qr[d1] * F::beta(d1));
      }
    }
  // the key biases' factor per row (Σ q over the warp's group, in the accumulators' units)
  const float qk_g = qc[g * kNGF + warp] * F::kKappa, qk_g8 = qc[(g + 8) * kNGF + warp] * F::kKappa;
  // this lane as an owner: row 2 warp + lane / 16, tokens 8 (2 k + hf) + 2 c2 (+1) of a tile
  const int orow = 2 * warp + (lane >> 4), ol = lane & 15, ohf = ol & 1, ok = (ol >> 1) & 1, oc = ol >> 2;
  const float ocrow = rowc[orow];
  const int64_t opos = rpos[orow], omrow = rmrow[orow];
  __syncthreads();  // (the query rows' copy becomes the exchange)

  // The exchange, two buffers by tile parity (the pipelined form below runs two tiles' steps at
  // once): the warps' partial logits [warp][row half][lane][2] float4 (the pair's order by lane),
  // P as f16 pairs [mt][c][g][4], the rows' rescale factors [16].
  const uint32_t xch0 = smem_addr(xq);
  constexpr uint32_t kXB = uint32_t(S::kX + S::kP + kRmRows * 4);  // one buffer
  // (the second float4 of a lane's pair first on odd groups of 4 lanes: no bank conflict)
  const int xsw = (lane >> 2) & 1;
  // the owner's reads: lane 4 (orow % 8) + oc of each warp, its row half orow / 8
  const int osrc = 4 * (orow & 7) + oc, oxsw = (osrc >> 2) & 1;
  const int oh = orow >> 3;
  // where the owner's p pair goes: [mt = ok][c = oc][g = orow % 8][2 hf + orow / 8]
  const uint32_t pput = uint32_t(S::kX) + uint32_t((((ok * 4 + oc) * 8 + (orow & 7)) * 4 + 2 * ohf + oh) * 4);
  const uint32_t pget = uint32_t(S::kX) + uint32_t(((c * 8 + g) * 4) * 4);  // + mt * 512
  constexpr uint32_t kAl = uint32_t(S::kX + S::kP);                       // the rescale factors
  const bool has_mask = a.bool_mask != nullptr || a.float_mask != nullptr;
  const int64_t minpos = lq < Lq ? -1 : n - lq;
  const uint32_t hsel = (warp & 1) ? 0x7632u : 0x5410u;  // the warp's group of a pair, two tokens

  // ldmatrix row offsets: lane l addresses matrix l / 8 (token half, piece parity), row l % 8
  uint32_t ldo[kC / 2];
  {
    const int mi = lane >> 3, tok = (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int u = 0; u < kC / 2; ++u) ldo[u] = uint32_t(tok * kRB + (((2 * u + (mi >> 1)) ^ swz(kC, tok)) << 4));
  }

  // online softmax of the owned row (log2 units), the same in the row's 16 lanes
  float m = -INFINITY, mb = 0.0f, thr = -INFINITY, lsum = 0.0f;
  float o[2 * kKS][4];  // O: rows g, g + 8 x n-tile nt's columns 2c, 2c + 1
#pragma unroll
  for (int nt = 0; nt < 2 * kKS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  float zacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // Σ_t p_t z_t: rows g (0, 1), g + 8 (2, 3)
  uint32_t vexp2 = 0x3C003C00u;               // the warp's 2^e (kVFold), an f16 pair

  // ---- step A: the warp's partial logits of tile `it` (ring slot `slot`) into buffer `xo` --------
  const auto step_logits = [&](int slot, uint32_t xo) {
    const uint32_t sk = wring + uint32_t(slot * S::kStage), ss = sk + 2 * kTW * kRB, skz = ss + kSC;
    float acc[4][4];  // 4 n-tiles of 8 tokens x 16 rows
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int u = 0; u < kC / 2; ++u) {
        uint32_t w[4];
        ldsm_x4(sk + uint32_t(mt * 16 * kRB) + ldo[u], w);
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          const int ch = 2 * u + hc;
          uint32_t rg[F::kKRegs], rg8[F::kKRegs];
          F::kunpack(w[2 * hc], rg);       // token g of the half
          F::kunpack(w[2 * hc + 1], rg8);  // token g + 8
#pragma unroll
          for (int mm = 0; mm < F::kKMma; ++mm) {
            const int ks = F::kstep(ch, mm);
            Y::mma(acc[2 * mt], aq[ks], rg[2 * mm], rg[2 * mm + 1]);
            Y::mma(acc[2 * mt + 1], aq[ks], rg8[2 * mm], rg8[2 * mm + 1]);
          }
        }
      }
    // the group's affine map per token (tokens 8 j + 2 c, + 1), then to the exchange
    float sc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 sp = lds64(ss + uint32_t((8 * j + 2 * c) * 4)), zp = lds64(skz + uint32_t((8 * j + 2 * c) * 4));
      const uint32_t s2 = __byte_perm(sp.x, sp.y, hsel), z2 = __byte_perm(zp.x, zp.y, hsel);
      const float s0 = Y::to_f32(uint16_t(s2 & 0xffffu)), s1 = Y::to_f32(uint16_t(s2 >> 16));
      const float z0 = Y::to_f32(uint16_t(z2 & 0xffffu)), z1 = Y::to_f32(uint16_t(z2 >> 16));
      sc[j][0] = fmaf(s0, acc[j][0], z0 * qk_g);
      sc[j][1] = fmaf(s1, acc[j][1], z1 * qk_g);
      sc[j][2] = fmaf(s0, acc[j][2], z0 * qk_g8);
      sc[j][3] = fmaf(s1, acc[j][3], z1 * qk_g8);
    }
    float4* mine = reinterpret_cast<float4*>(reinterpret_cast<uint8_t*>(xq) + (xo - xch0)) + (warp * 2) * 64 + lane * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 2; ++k)
        mine[h * 64 + (k ^ xsw)] =
            make_float4(sc[2 * k][2 * h], sc[2 * k][2 * h + 1], sc[2 * k + 1][2 * h], sc[2 * k + 1][2 * h + 1]);
  };

  // ---- step B: the owned row's logits (2 per lane) of tile `it` and its online softmax ----------
  const auto step_softmax = [&](int it, uint32_t xo) {
    const int64_t t0 = tb + int64_t(it) * kTW;
    float v0 = 0.0f, v1 = 0.0f;
    const float* src = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(xq) + (xo - xch0)) + ((oh * 32 + osrc) * 2 + (ok ^ oxsw)) * 4 + 2 * ohf;
#pragma unroll
    for (int w2 = 0; w2 < W; ++w2) {  // (the same order in every run: deterministic)
      const float2 v = *reinterpret_cast<const float2*>(src + w2 * 2 * 64 * 4);
      v0 += v.x, v1 += v.y;
    }
    float y0 = fmaf(v0, ocrow, -mb), y1 = fmaf(v1, ocrow, -mb);
    const bool fast = !has_mask && t0 + kTW <= te && t0 + kTW - 1 <= minpos && (a.window == 0 || t0 >= n - a.window);
    if (!fast) {  // partial tile, causal or window edge, or masks: per element
      const int64_t tok0 = t0 + 8 * (2 * ok + ohf) + 2 * oc;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t tok = tok0 + e;
        bool vis = tok < te && tok <= opos && (a.window == 0 || tok > opos - a.window);
        float& y = e ? y1 : y0;
        if (vis && has_mask) {
          const int64_t mi = omrow + tok;
          if (a.bool_mask)
            vis = a.bool_mask_u32 ? static_cast<const uint32_t*>(a.bool_mask)[mi] != 0u
                                  : static_cast<const uint8_t*>(a.bool_mask)[mi] != 0;
          if (vis && a.float_mask) {
            const float fm = Y::to_f32(static_cast<const uint16_t*>(a.float_mask)[mi]);
            if (fm == -INFINITY) vis = false;
            else y = fmaf(fm, kLog2e, y);
          }
        }
        if (!vis) y = -INFINITY;
      }
    }
    float al = 1.0f;
    if (__any_sync(0xffffffffu, y0 > thr || y1 > thr)) {  // a new maximum: move the reference
      float mx = fmaxf(y0, y1);
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float xa = mx + mb;
      if (xa > m) {
        al = m == -INFINITY ? 0.0f : ex2(m - xa);
        const float dl = xa - mb;
        y0 -= dl, y1 -= dl;
        lsum *= al;
        m = mb = xa;
        thr = kTau;
      }
    }
    const float p0 = ex2(y0), p1 = ex2(y1);
    lsum += p0 + p1;
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(xo + pput), "r"(Y::pack(p0, p1)) : "memory");
    if (ol == 0) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(xo + kAl + uint32_t(orow * 4)), "f"(al) : "memory");
  };

  // ---- step C: O += P V for the warp's 64 dims, tile in ring slot `slot`, P in buffer `xo` ------
  const auto step_values = [&](int slot, uint32_t xo) {
    const uint32_t sv = wring + uint32_t(slot * S::kStage) + kTW * kRB, svs = sv + kTW * kRB + 2 * kSC, svz = svs + kSC;
    {
      float ag, ag8;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(ag) : "r"(xo + kAl + uint32_t(g * 4)) : "memory");
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(ag8) : "r"(xo + kAl + uint32_t(g * 4 + 32)) : "memory");
      if (__any_sync(0xffffffffu, ag != 1.0f || ag8 != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < 2 * kKS; ++nt) o[nt][0] *= ag, o[nt][1] *= ag, o[nt][2] *= ag8, o[nt][3] *= ag8;
        zacc[0] *= ag, zacc[1] *= ag, zacc[2] *= ag8, zacc[3] *= ag8;
      }
    }
    {  // kVFold: the tile's value scales (this lane: token lane's) against the warp's exponent
      const uint32_t amax = lds16(svs + uint32_t(lane * 4 + (warp & 1) * 2)) & 0x7fffu;
      if (float fct; vexp_track<Y>(amax, vexp2, fct)) {
#pragma unroll
        for (int nt = 0; nt < 2 * kKS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[nt][e] *= fct;
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const uint4 pw = lds128(xo + pget + uint32_t(mt * 512));  // P rows g, g + 8, tokens 2c (+1), 2c + 8 (+9)
      const uint32_t ap[4] = {pw.x, pw.y, pw.z, pw.w};
      const uint32_t tl = uint32_t((16 * mt + 2 * c) * 4), th = tl + 32;
      const uint2 sl = lds64(svs + tl), sh = lds64(svs + th), zl = lds64(svz + tl), zh = lds64(svz + th);
      Y::mma(zacc, ap, __byte_perm(zl.x, zl.y, hsel), __byte_perm(zh.x, zh.y, hsel));
      const uint32_t s01 = Y::mul2(__byte_perm(sl.x, sl.y, hsel), vexp2);
      const uint32_t s89 = Y::mul2(__byte_perm(sh.x, sh.y, hsel), vexp2);
      uint32_t ah[4], alo[4];
      Y::mul2_split(ap[0], s01, ah[0], alo[0]);
      Y::mul2_split(ap[1], s01, ah[1], alo[1]);
      Y::mul2_split(ap[2], s89, ah[2], alo[2]);
      Y::mul2_split(ap[3], s89, ah[3], alo[3]);
#pragma unroll
      for (int u = 0; u < kC / 2; ++u) {
        uint32_t w[4];
        ldsm_x4_t(sv + uint32_t(mt * 16 * kRB) + ldo[u], w);
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          const int ch = 2 * u + hc;
          uint32_t ul[F::kVRegs], uh[F::kVRegs];
          F::vcodes(w[2 * hc], ul);       // tokens 2c, 2c + 1 of the half
          F::vcodes(w[2 * hc + 1], uh);   // tokens 2c + 8, 2c + 9
#pragma unroll
          for (int t = 0; t < F::kVTiles; ++t) {
            const int dt = ch * F::kVTiles + t;  // n-tiles 2 dt (dims vdim(dt, n)) and 2 dt + 1 (vdim(dt, n + 8))
            Y::mma(o[2 * dt], ah, ul[2 * t], uh[2 * t]);
            Y::mma(o[2 * dt], alo, ul[2 * t], uh[2 * t]);
            Y::mma(o[2 * dt + 1], ah, ul[2 * t + 1], uh[2 * t + 1]);
            Y::mma(o[2 * dt + 1], alo, ul[2 * t + 1], uh[2 * t + 1]);
          }
        }
      }
    }
  };

  if constexpr (kRmPipelined<BITS>) {
    // Pipelined: a warp runs tile it + 1's logits between its softmax step of tile it and the
    // wait for every owner's P of tile it, and the block's warps meet on shared-memory barrier
    // objects (xbar: every thread's partial logits of a tile are in; pbar: every row's p), so a
    // warp never idles at a barrier with work of its own left. Ring slots: tile it (its values),
    // it + 1 (its keys, in use) and it + 2 (in flight): three stages. Reuse of a buffer (tile
    // parity) is safe: a warp writes tile it + 2's logits after its wait on tile it + 1's xbar,
    // which every thread passes only after its softmax step of tile it; it writes tile it + 2's P
    // after the wait on tile it + 2's xbar, which every thread passes only after its values step
    // of tile it. The same order keeps each barrier's phase from running ahead of its waiters.
    static_assert(STAGES == 3, "the pipelined form: three ring stages");
    int sa = 0, sv = 0;  // ring slots of the next logits step and of the values step
    if (ntiles > 0) {
      cp_wait<STAGES - 1>();
      __syncwarp();
      step_logits(sa, xch0);
      mbar_arrive(xbar);
      sa = 1;
    }
    for (int it = 0; it < ntiles; ++it) {
      const uint32_t xo = xch0 + uint32_t(it & 1) * kXB, ph = uint32_t(it >> 1) & 1u;
      mbar_wait(xbar + uint32_t(it & 1) * 8, ph);
      step_softmax(it, xo);
      mbar_arrive(pbar + uint32_t(it & 1) * 8);
      if (it + 1 < ntiles) {
        cp_wait<STAGES - 2>();
        __syncwarp();
        step_logits(sa, xch0 + uint32_t((it + 1) & 1) * kXB);
        mbar_arrive(xbar + uint32_t((it + 1) & 1) * 8);
        sa = sa + 1 == STAGES ? 0 : sa + 1;
      }
      mbar_wait(pbar + uint32_t(it & 1) * 8, ph);
      step_values(sv, xo);
      __syncwarp();  // (every lane's reads of the slot are done before it is refilled)
      if (it + STAGES < ntiles) issue(it + STAGES, sv);
      cp_commit();
      sv = sv + 1 == STAGES ? 0 : sv + 1;
    }
  } else {
    // Two block barriers per tile (8-bit: two stages of 4.5 KB per warp leave no third for the
    // pipelined form within two blocks per multiprocessor).
    int stage = 0;
    for (int it = 0; it < ntiles; ++it, stage = stage + 1 == STAGES ? 0 : stage + 1) {
      cp_wait<STAGES - 2>();
      __syncwarp();
      if (it + STAGES - 1 < ntiles) issue(it + STAGES - 1, stage == 0 ? STAGES - 1 : stage - 1);
      cp_commit();
      step_logits(stage, xch0);
      __syncthreads();
      step_softmax(it, xch0);
      __syncthreads();
      step_values(stage, xch0);
    }
  }
#if QSDPA_MMA_TRACE
  const unsigned long long tr_loop = global_ns();
#endif

  // ---- the partials, straight from the registers -------------------------------------------
  // O = acc 2^(24 - e) / vfactor + Σ p z (codes were n vfactor 2^-24, weights p s 2^e)
  {
    const float unit = ldexpf(1.0f, 24 - f16_pow2_exp(vexp2));
    const int64_t pbase = int64_t(split) * rows_total;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = g + 8 * h;
      if (lr >= nrows) continue;
      float* po = a.part_o + (pbase + qrow_of(lr)) * D + warp * kRmDW;
      const float z = zacc[2 * h];
#pragma unroll
      for (int nt = 0; nt < 2 * kKS; ++nt) {
        const int dt = nt >> 1, sub = nt & 1;
        const float f = unit / float(F::vfactor(2 * (dt % F::kVTiles) + sub));
#pragma unroll
        for (int e = 0; e < 2; ++e) po[F::vdim(dt, 2 * c + e + 8 * sub)] = fmaf(o[nt][2 * h + e], f, z);
      }
    }
    float l = lsum;
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (ol == 0 && orow < nrows) {
      const int64_t prow = pbase + qrow_of(orow);
      a.part_m[prow] = m == -INFINITY ? -INFINITY : m * kLn2;
      a.part_l[prow] = l;
    }
  }
  cp_wait<0>();
  __syncthreads();  // (the rings become the merge's scratch)
  if (a.counters) merge_if_last_cold<kRT, W>(&a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
  else if (QSDPA_MMA_ARRIVALS && a.arrivals) arrive_count(a);
#if QSDPA_MMA_TRACE
  if (tid == 0 && a.trace) trace_block(a, tr_start, tr_loop, a.counters && *reinterpret_cast<const int*>(smem));
#endif
}

// Launches the kernel: grid (B * Hkv * row tiles of 16, num_splits), 8 warps per block.
template <int BITS>
cudaError_t rowsm_launch(const AttnArgs& a, cudaStream_t stream) {
  using S = RmShape<BITS>;
  auto* kern = rowsm_kernel<BITS>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_once(kern, S::kSmem, opted); e != cudaSuccess) return e;
  const int64_t R = a.Hq / a.Hkv * a.Lq, row_tiles = (R + kRmRows - 1) / kRmRows;
  if (a.B * a.Hkv * row_tiles > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.B * a.Hkv * row_tiles), unsigned(a.num_splits), 1u);
  if (a.pdl) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = launch_config(grid, kRmWarps * 32, S::kSmem, stream, 0, true, attr);
    return cudaLaunchKernelEx(&cfg, kern, a);
  }
  kern<<<grid, kRmWarps * 32, S::kSmem, stream>>>(a);
  return cudaGetLastError();
}

// Blocks of the kernel that fit one multiprocessor (as launched).
template <int BITS>
int rowsm_resident() {
  using S = RmShape<BITS>;
  auto* kern = rowsm_kernel<BITS>;
  int n = 0;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kRmWarps * 32, S::kSmem) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return n < 1 ? 1 : n;
}

}  // namespace qsdpa::cuda::mmak
