// An experiment toward a two-pass path for wide heads (D = 256 and 512): the first pass alone.
//
// Why: the fused tensor-core kernel runs D = 512 at 32 % and D = 256 4-bit at 59 % of the copy
// bandwidth on an H200 (docs/PERF.md, run 103). At D = 512 its 4 warps split the head dims of one
// tile (the logits' partial sums meet in shared memory every tile), its 255 registers leave 8 warps
// per multiprocessor, and the 16 query rows of a KV head are two row tiles that each unpack every
// code. A two-pass form splits the work where it is cheap to split: pass 1 computes the logits
// S = scale q·kᵀ of all 16 rows for every token (keys read once, no softmax, no exchange), pass 2
// reads S and the values per 128-dim slice, as the D = 128 kernel does. S is 64 bytes per token in
// f32, ~11 % of what a 4-bit D = 512 token's K and V take.
//
// This file is pass 1: f16 queries, 4- or 8-bit keys with groups of 64, contiguous caches, D = 256
// or 512, at most 16 query rows per KV head (GQA ratio x Lq), no mask. S is f32
// [B * Hkv][N][RS], RS = 8 for up to 8 rows (one n-tile), else 16 (rows beyond the group's are 0).
// Nothing in attention() calls it; the tests hold it to the host's dot products and
// qsdpa_logits_bench (tools/experiments) times it.
//
// Status (runs 109-110, H100, docs/PERF.md): measured and dropped. Pass 1 alone takes 30-35 us for
// the D = 512 4-bit bench shape (45 % of copy) at every tiles-per-warp setting, and both passes
// 98 us against the fused kernel's 55; it stays as a tested study.
//
// Per warp and 32-token tile: tokens on the mma's M (two m-tiles), the 16 rows on N (two n-tiles),
// head dims on K. A lane (g, c) loads, for each group of 64 dims, 8 bytes (4-bit) or 16 bytes
// (8-bit) at offset c of tokens g, g + 8, g + 16, g + 24: every k-step stays inside one group, so
// the group's scale multiplies the group's partial sums once per token (an FFMA per element and
// group). Codes go to the mma as f16 subnormals (mma_format.cuh's denormal key codes: one lop3 per
// pair), q is scaled per row by a power of two and by 1/16 where a nibble sits in bits 4..7; the
// biases' term Σ_g z_g Σ_{d∈g} q_d is one more mma per tile and n-tile (the per-group sums of q in
// hi + lo f16 on K). The head-dim order inside each group is the lanes' (qslot_dim below), applied
// to q once per block.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "../core/backends.hpp"
#include "mma_format.cuh"
#include "testing.hpp"

namespace qsdpa::cuda {
namespace {

constexpr int kLgWarps = 4;
constexpr int kLgTilesPerWarp = 4;  // 32-token tiles per warp and block (LogitsQK::tiles_per_warp = 0)
constexpr int kLgRows = 16;
constexpr int kLgGroup = 64;

struct LgArgs {
  const __half* q;
  const uint32_t* k;
  const __half* ks;
  const __half* kb;
  float* s;
  int Hq, Hkv, rep, Lq, N;
  float scale;
  int64_t tiles;  // 32-token tiles per sequence
  int tpw;        // 32-token tiles per warp and block
};

// The head dim (within its group) that k-slot `slot` (0: 2c, 1: 2c + 1, 2: 2c + 8, 3: 2c + 9) of
// k-step kk (0..3) of a group takes, for lane column c, and its q factor (1/16 for a nibble in bits
// 4..7 of its half: the code arrives as 16 n).
template <int BITS>
__device__ __forceinline__ int qslot_dim(int kk, int c, int slot, float& beta) {
  beta = 1.0f;
  if constexpr (BITS == 4) {
    // lane c holds words 2c, 2c + 1 of the group (8 dims each); word j feeds k-steps 2j, 2j + 1;
    // kunpack's registers: r0 = (n0, n4), r1 = 16 (n1, n5), r2 = (n2, n6), r3 = 16 (n3, n7);
    // k-step 2j + m takes r[2m] on slots 2c, 2c + 1 and r[2m + 1] on slots 2c + 8, 2c + 9.
    const int j = kk >> 1, m = kk & 1, base = 8 * (2 * c + j);
    const int lo = slot >> 1;  // 0: r[2m], 1: r[2m + 1]
    if (lo) beta = 0.0625f;
    return base + 2 * m + lo + 4 * (slot & 1);
  } else {
    // lane c holds words 4c .. 4c + 3 (4 dims each); word j feeds k-step j: r0 = bytes (0, 2) on
    // slots 2c, 2c + 1, r1 = bytes (1, 3) on slots 2c + 8, 2c + 9.
    const int base = 4 * (4 * c + kk);
    return base + (slot >> 1) + 2 * (slot & 1);
  }
}

template <int BITS, int D, int NT>
__global__ void __launch_bounds__(kLgWarps * 32, 4) logits_kernel(LgArgs a) {
  constexpr int RS = 8 * NT;  // rows of S per token: 8 (one n-tile) or 16
  using F = mmak::Fmt<__half, BITS, true>;
  constexpr int NG = D / kLgGroup, KS = D / 16;
  constexpr int WPR = D * BITS / 32;        // words per key row
  constexpr int WPG = kLgGroup * BITS / 32;  // words per group
  constexpr int LW = WPG / 4;               // words per lane and group: 2 (4-bit) or 4 (8-bit)
  constexpr int KPW = 4 / LW;               // k-steps per word
  static_assert(NG == 4 || NG == 8, "D = 256 or 512");
  __shared__ __align__(16) __half qv[RS][D];      // q x 2^e (per row): exact, a power of two
  __shared__ __align__(16) uint2 qf[KS][NT][32];  // the B fragments of q, per k-step, n-tile, lane
  __shared__ uint2 zf[NT][32];                    // the B fragments of the biases' mma
  __shared__ float qs[RS][NG];                    // scale Σ_{d∈g} q_d, per row and group
  __shared__ float rowa[RS], rowb[RS];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int bh = blockIdx.y, b = bh / a.Hkv, h = bh % a.Hkv;
  const int R = a.rep * a.Lq;

  // ---- q: each warp 4 rows: the power of two, the group sums, the scaled copy -------------------
  for (int r = warp; r < RS; r += kLgWarps) {
    const bool live = r < R;
    const __half* qrow = a.q + ((int64_t(b) * a.Hq + h * a.rep + r / a.Lq) * a.Lq + r % a.Lq) * D;
    float v[D / 32], mx = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      v[i] = live ? __half2float(qrow[lane + 32 * i]) : 0.0f;
      mx = fmaxf(mx, fabsf(v[i]));
    }
    float gsum[NG];
#pragma unroll
    for (int p = 0; p < NG; ++p) gsum[p] = v[2 * p] + v[2 * p + 1];  // dims lane + 64 p (+ 32)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
#pragma unroll
      for (int p = 0; p < NG; ++p) gsum[p] += __shfl_xor_sync(0xffffffffu, gsum[p], o);
    }
    // max |q| 2^e in [2^7, 2^8): q / 16 stays a normal f16, the products stay far inside f32
    int ex = 0;
    if (mx > 0.0f) (void)frexpf(mx, &ex);  // mx in [2^(ex-1), 2^ex)
    const int e = mx > 0.0f ? 8 - ex : 0;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) qv[r][lane + 32 * i] = __float2half_rn(ldexpf(v[i], e));
    // the biases' sums, scaled by 2^ez so that the largest lands in [2^7, 2^8) as f16 hi + lo
    float gm = 0.0f;
#pragma unroll
    for (int p = 0; p < NG; ++p) gm = fmaxf(gm, fabsf(a.scale * gsum[p]));
    int gx = 0;
    if (gm > 0.0f) (void)frexpf(gm, &gx);
    const int ez = gm > 0.0f ? 8 - gx : 0;
    if (lane < NG) {
      float mine = 0.0f;
#pragma unroll
      for (int p = 0; p < NG; ++p)
        if (p == lane) mine = gsum[p];
      qs[r][lane] = ldexpf(a.scale * mine, ez);
    }
    if (lane == 0) {
      // acc = Σ n 2^-24 q 2^e, so Σ n q = acc 2^(24 - e)
      rowa[r] = ldexpf(a.scale, 24 - e);
      rowb[r] = ldexpf(1.0f, -ez);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < KS * NT * 32; i += kLgWarps * 32) {
    const int ks = i / (NT * 32), nt = (i >> 5) % NT, ln = i & 31, lg = ln >> 2, lc = ln & 3;
    const int p = ks >> 2, kk = ks & 3, row = nt * 8 + lg;
    float bt[4], vals[4];
#pragma unroll
    for (int sl = 0; sl < 4; ++sl) vals[sl] = __half2float(qv[row][kLgGroup * p + qslot_dim<BITS>(kk, lc, sl, bt[sl])]) * bt[sl];
    uint2 f;
    f.x = mmak::Ty<__half>::pack(vals[0], vals[1]);
    f.y = mmak::Ty<__half>::pack(vals[2], vals[3]);
    qf[ks][nt][ln] = f;
  }
  if (threadIdx.x < NT * 32) {
    // biases' mma: k-slots 0..NG-1 the groups' sums (hi), NG..2NG-1 the same (lo); A: z per token
    const int nt = threadIdx.x >> 5, ln = threadIdx.x & 31, lg = ln >> 2, lc = ln & 3, row = nt * 8 + lg;
    float v4[4];
#pragma unroll
    for (int sl = 0; sl < 4; ++sl) {
      const int k = 2 * lc + (sl & 1) + 8 * (sl >> 1);
      float val = 0.0f;
      if (k < NG) {
        val = __half2float(__float2half_rn(qs[row][k]));
      } else if (k < 2 * NG) {
        const float x = qs[row][k - NG];
        val = x - __half2float(__float2half_rn(x));
      }
      v4[sl] = val;
    }
    zf[nt][ln] = make_uint2(mmak::Ty<__half>::pack(v4[0], v4[1]), mmak::Ty<__half>::pack(v4[2], v4[3]));
  }
  __syncthreads();

  // ---- tiles ------------------------------------------------------------------------------------
  const int64_t seq = int64_t(bh) * a.N;
  for (int it = 0; it < a.tpw; ++it) {
    const int64_t tile = (int64_t(blockIdx.x) * a.tpw + it) * kLgWarps + warp;
    if (tile >= a.tiles) break;
    const int64_t t0 = tile * 32;
    int64_t tok[2][2];
    bool ok[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        tok[mi][hh] = t0 + 16 * mi + 8 * hh + g;
        ok[mi][hh] = tok[mi][hh] < a.N;
      }
    // the scales and biases of the lane's 4 tokens (all groups: 8 or 16 bytes of scales each);
    // a token past N reads token 0 of the sequence (valid memory) and is not stored
    uint32_t sw[2][2][NG / 2];
    uint32_t zp[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t t = ok[mi][hh] ? tok[mi][hh] : 0;
        const __half* sp = a.ks + (seq + t) * NG;
        if constexpr (NG == 8) {
          const uint4 w = *reinterpret_cast<const uint4*>(sp);
          sw[mi][hh][0] = w.x, sw[mi][hh][1] = w.y, sw[mi][hh][2] = w.z, sw[mi][hh][3] = w.w;
        } else {
          const uint2 w = *reinterpret_cast<const uint2*>(sp);
          sw[mi][hh][0] = w.x, sw[mi][hh][1] = w.y;
        }
        // biases of groups (2c, 2c + 1) mod NG: k-slots 2c, 2c + 1 (hi) and, for NG = 4, the lo
        // slots 2c - 4 ... of lanes c >= 2
        zp[mi][hh] = *reinterpret_cast<const uint32_t*>(a.kb + (seq + t) * NG + ((2 * c) % NG));
      }
    float accs[2][NT][4] = {};
#pragma unroll
    for (int p = 0; p < NG; ++p) {
      uint32_t w[2][2][LW];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int64_t t = ok[mi][hh] ? tok[mi][hh] : 0;
          const uint32_t* kp = a.k + (seq + t) * WPR + p * WPG + c * LW;
          if constexpr (LW == 2) {
            const uint2 x = *reinterpret_cast<const uint2*>(kp);
            w[mi][hh][0] = x.x, w[mi][hh][1] = x.y;
          } else {
            const uint4 x = *reinterpret_cast<const uint4*>(kp);
            w[mi][hh][0] = x.x, w[mi][hh][1] = x.y, w[mi][hh][2] = x.z, w[mi][hh][3] = x.w;
          }
        }
      float acc[2][NT][4] = {};
#pragma unroll
      for (int j = 0; j < LW; ++j) {
        uint32_t r[2][2][F::kKRegs];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) F::kunpack(w[mi][hh][j], r[mi][hh]);
#pragma unroll
        for (int m = 0; m < KPW; ++m) {
          const int ks = 4 * p + KPW * j + m;
          uint2 bq[NT];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) bq[nt] = qf[ks][nt][lane];
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            const uint32_t av[4] = {r[mi][0][2 * m], r[mi][1][2 * m], r[mi][0][2 * m + 1], r[mi][1][2 * m + 1]};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mmak::Ty<__half>::mma(acc[mi][nt], av, bq[nt].x, bq[nt].y);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const __half2 h0 = *reinterpret_cast<const __half2*>(&sw[mi][0][p >> 1]);
        const __half2 h1 = *reinterpret_cast<const __half2*>(&sw[mi][1][p >> 1]);
        const float s0 = (p & 1) ? __high2float(h0) : __low2float(h0);
        const float s1 = (p & 1) ? __high2float(h1) : __low2float(h1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          accs[mi][nt][0] = fmaf(s0, acc[mi][nt][0], accs[mi][nt][0]);
          accs[mi][nt][1] = fmaf(s0, acc[mi][nt][1], accs[mi][nt][1]);
          accs[mi][nt][2] = fmaf(s1, acc[mi][nt][2], accs[mi][nt][2]);
          accs[mi][nt][3] = fmaf(s1, acc[mi][nt][3], accs[mi][nt][3]);
        }
      }
    }
    // the biases' term, then S = rowa acc + rowb z-acc, stored 8 bytes per lane and row pair
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const uint32_t hi2 = NG == 8 ? 1u : 0u;  // D = 512: k-slots 8..15 hold the lo sums
      const uint32_t az[4] = {zp[mi][0], zp[mi][1], hi2 ? zp[mi][0] : 0u, hi2 ? zp[mi][1] : 0u};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float zacc[4] = {};
        const uint2 zb = zf[nt][lane];
        mmak::Ty<__half>::mma(zacc, az, zb.x, zb.y);
        const int r0 = nt * 8 + 2 * c;
        const float ra0 = rowa[r0], ra1 = rowa[r0 + 1], rb0 = rowb[r0], rb1 = rowb[r0 + 1];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          if (!ok[mi][hh]) continue;
          float2 o;
          o.x = fmaf(ra0, accs[mi][nt][2 * hh], rb0 * zacc[2 * hh]);
          o.y = fmaf(ra1, accs[mi][nt][2 * hh + 1], rb1 * zacc[2 * hh + 1]);
          *reinterpret_cast<float2*>(a.s + (seq + tok[mi][hh]) * RS + r0) = o;
        }
      }
    }
  }
}

template <int BITS, int D>
cudaError_t launch(const LgArgs& a, int bhs, cudaStream_t s) {
  const int64_t per_block = int64_t(kLgWarps) * a.tpw;
  const dim3 grid(unsigned((a.tiles + per_block - 1) / per_block), unsigned(bhs));
  if (a.rep * a.Lq <= 8)
    logits_kernel<BITS, D, 1><<<grid, kLgWarps * 32, 0, s>>>(a);
  else
    logits_kernel<BITS, D, 2><<<grid, kLgWarps * 32, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace

Status logits_qk(const LogitsQK& p, void* stream) {
  const auto bad = [](const std::string& m) {
    return detail::make_status(StatusCode::invalid_argument, "logits_qk: " + m, Backend::cuda);
  };
  if (p.D != 256 && p.D != 512) return bad("D must be 256 or 512");
  if (p.bits != 4 && p.bits != 8) return bad("bits must be 4 or 8");
  if (p.B < 1 || p.Hkv < 1 || p.Hq % p.Hkv != 0 || p.Lq < 1 || p.N < 1 || (p.Hq / p.Hkv) * p.Lq > kLgRows)
    return bad("shapes: B, Hkv, Lq, N >= 1, Hq a multiple of Hkv, at most 16 query rows per KV head");
  if (int64_t(p.B) * p.Hkv > 65535) return bad("B * Hkv must be at most 65535");
  const auto aligned = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15) == 0; };
  if (!p.q || !p.k || !p.k_scales || !p.k_biases || !p.s || !aligned(p.k) || !aligned(p.k_scales) || !aligned(p.k_biases) || !aligned(p.s))
    return bad("device buffers; the keys, their scales, biases and S 16-byte aligned");
  LgArgs a;
  a.q = static_cast<const __half*>(p.q);
  a.k = static_cast<const uint32_t*>(p.k);
  a.ks = static_cast<const __half*>(p.k_scales);
  a.kb = static_cast<const __half*>(p.k_biases);
  a.s = p.s;
  a.Hq = p.Hq, a.Hkv = p.Hkv, a.rep = p.Hq / p.Hkv, a.Lq = p.Lq, a.N = p.N;
  a.scale = p.scale;
  a.tiles = (int64_t(p.N) + 31) / 32;
  a.tpw = p.tiles_per_warp > 0 ? p.tiles_per_warp : kLgTilesPerWarp;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int bhs = p.B * p.Hkv;
  const cudaError_t e = p.bits == 4 ? (p.D == 256 ? launch<4, 256>(a, bhs, s) : launch<4, 512>(a, bhs, s))
                                    : (p.D == 256 ? launch<8, 256>(a, bhs, s) : launch<8, 512>(a, bhs, s));
  if (e != cudaSuccess)
    return detail::make_status(StatusCode::backend_error, std::string("logits_qk: ") + cudaGetErrorString(e),
                               Backend::cuda);
  return Status{};
}

}  // namespace qsdpa::cuda
