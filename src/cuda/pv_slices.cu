// The two-pass experiment's second pass (logits_qk.cu is the first): from the logits S and a 4- or
// 8-bit value cache (the keys' width), the softmax-weighted sums of the values, one block per
// (split of the tokens, 128-dim slice of the head, b * Hkv), then a merge of the splits into the
// output. Nothing in attention() calls it; the tests hold both passes together to the reference
// attention and qsdpa_logits_bench times them. Measured and dropped (runs 109-110, H100): this
// pass alone takes 79 us for the D = 512 4-bit bench shape, 1.4x the whole fused kernel.
//
// Per warp and 32-token tile: Oᵀ += Vᵀ Pᵀ with the slice's 128 dims on the mma's M (8 m-tiles),
// tokens on K, the query rows on N (one or two n-tiles). The values come straight from global
// memory. 4-bit: lane (g, c) loads words g and g + 8 of the slice for tokens 2c, 2c + 1, 2c + 8,
// 2c + 9 of each 16-token step, and a prmt of two tokens' words gives the token pairs the A
// operand wants; m-tile 4 h + k (h: word g or g + 8, k: nibble pair) takes nibble 2k of word
// 8 h + g on row g and nibble 2k + 1 on row g + 8, so each m-tile stays in one group of 64 dims.
// 8-bit: the lane loads 16 bytes (dims 16 g ... 16 g + 15, one group) of the same 4 tokens, and
// m-tile i takes its bytes 2i (row g) and 2i + 1 (row g + 8). pv_dim maps the order back. Values
// are dequantized in f16 (1024 + n, minus 1024, times s plus z: one rounding), the softmax is lazy
// (the reference moves only when a logit passes it by more than 2^kTau) as in the fused kernel.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../core/backends.hpp"
#include "mma_ptx.cuh"
#include "testing.hpp"

namespace qsdpa::cuda {
namespace {

constexpr int kPvWarps = 4;
constexpr float kPvTau = 8.0f;  // lazy rescale margin (log2 units): p <= 2^8 in f16
constexpr float kPvLog2e = 1.4426950408889634f;

struct PvArgs {
  const float* s;  // [bh][N][RS]
  const uint32_t* v;
  const __half* vs;
  const __half* vb;
  float* po;  // partial outputs [split][bh][RS][D] (f32)
  float* pm;  // [split][bh][RS]: the reference (log2 units)
  float* pl;  // [split][bh][RS]: the sum of weights
  int N, D, chunk, splits;
  int Lq;  // row r sits at position N - Lq + r % Lq: tokens past it are hidden (causal)
};

// The slice dim of row r (0..15) of m-tile i (0..7). 4-bit: m-tile 4 h + k takes nibbles 2k and
// 2k + 1 of word 8 h + g (rows g and g + 8). 8-bit: lane g holds the 16 bytes of dims 16 g ...
// 16 g + 15 (words 4 g ... 4 g + 3), m-tile i takes bytes 2i and 2i + 1 of them.
template <int VBITS>
__host__ __device__ constexpr int pv_dim(int i, int r) {
  if constexpr (VBITS == 4) {
    const int h = i >> 2, k = i & 3;
    return 8 * (8 * h + (r & 7)) + 2 * k + (r >> 3);
  } else {
    return 16 * (r & 7) + 2 * i + (r >> 3);
  }
}

template <int VBITS, int NT>
__global__ void __launch_bounds__(kPvWarps * 32, NT == 2 ? 3 : 4) pv_kernel(PvArgs a) {
  static_assert(VBITS == 4 || VBITS == 8, "4- or 8-bit values");
  constexpr int RS = 8 * NT;
  constexpr int SW = 128 * VBITS / 32;  // words per token and slice
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int split = blockIdx.x, slice = blockIdx.y, bh = blockIdx.z;
  const int64_t seq = int64_t(bh) * a.N;
  const int WPR = a.D * VBITS / 32, NG = a.D / 64;
  const int64_t tb = int64_t(split) * a.chunk;
  const int64_t te = tb + a.chunk < a.N ? tb + a.chunk : a.N;

  // the last visible token of the lane's rows nt * 8 + g (SPEC: position N - Lq + r % Lq)
  int64_t last[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) last[nt] = a.N - a.Lq + (nt * 8 + g) % a.Lq;

  float o[8][NT][4] = {};
  float m[NT], l[NT];  // lane's row nt * 8 + g: reference (log2 units) and partial sum
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) m[nt] = -INFINITY, l[nt] = 0.0f;

  for (int64_t t0 = tb + 32 * warp; t0 < te; t0 += 32 * kPvWarps) {
    // ---- the tile's values, loaded first so that they are in flight with the logits ----------
    // (per k-step: tokens 2c, 2c + 1, 2c + 8, 2c + 9; 4-bit: words g and g + 8 of the slice;
    // 8-bit: words 4 g ... 4 g + 3; and each token's scales and biases of the slice's 2 groups)
    uint4 vx[2][4];
    uint32_t sw[2][4], zw[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int64_t t = t0 + 16 * kk + 2 * c + (j & 1) + 8 * (j >> 1);
        if (t >= te) t = tb;  // (weight 0; a valid row)
        const uint32_t* row = a.v + (seq + t) * WPR + SW * slice;
        if constexpr (VBITS == 4)
          vx[kk][j].x = row[g], vx[kk][j].y = row[g + 8];
        else
          vx[kk][j] = *reinterpret_cast<const uint4*>(row + 4 * g);
        sw[kk][j] = *reinterpret_cast<const uint32_t*>(a.vs + (seq + t) * NG + 2 * slice);
        zw[kk][j] = *reinterpret_cast<const uint32_t*>(a.vb + (seq + t) * NG + 2 * slice);
      }
    // ---- the tile's logits (f32, log2 units) for the lane's B fragments ---------------------
    float sv[2][NT][4];  // [k-step][nt][tokens 2c, 2c + 1, 2c + 8, 2c + 9]
    float tmax[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) tmax[nt] = -INFINITY;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t0 + 16 * kk + 2 * c + (j & 1) + 8 * (j >> 1);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float x = t < te && t <= last[nt] ? a.s[(seq + t) * RS + nt * 8 + g] * kPvLog2e : -INFINITY;
          sv[kk][nt][j] = x;
          tmax[nt] = fmaxf(tmax[nt], x);
        }
      }
    bool move = false;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      tmax[nt] = fmaxf(tmax[nt], __shfl_xor_sync(0xffffffffu, tmax[nt], 1));
      tmax[nt] = fmaxf(tmax[nt], __shfl_xor_sync(0xffffffffu, tmax[nt], 2));
      move |= tmax[nt] > m[nt] + kPvTau || (m[nt] == -INFINITY && tmax[nt] > -INFINITY);
    }
    if (__any_sync(0xffffffffu, move)) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float mn = tmax[nt] > m[nt] ? tmax[nt] : m[nt];
        const float f = m[nt] == -INFINITY ? 0.0f : exp2f(m[nt] - mn);
        m[nt] = mn;
        l[nt] *= f;
        // the accumulators' columns are rows 2c, 2c + 1: their factors from lanes 4 (2c), 4 (2c + 1)
        const float f0 = __shfl_sync(0xffffffffu, f, 8 * c), f1 = __shfl_sync(0xffffffffu, f, 8 * c + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i][nt][0] *= f0, o[i][nt][1] *= f1, o[i][nt][2] *= f0, o[i][nt][3] *= f1;
      }
    }
    uint32_t pb[2][NT][2];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          p[j] = m[nt] == -INFINITY ? 0.0f : exp2f(sv[kk][nt][j] - m[nt]);
          l[nt] += p[j];
        }
        pb[kk][nt][0] = mmak::Ty<__half>::pack(p[0], p[1]);
        pb[kk][nt][1] = mmak::Ty<__half>::pack(p[2], p[3]);
      }
    // ---- the values --------------------------------------------------------------------------
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      if constexpr (VBITS == 4) {
        const uint32_t x[4][2] = {{vx[kk][0].x, vx[kk][0].y}, {vx[kk][1].x, vx[kk][1].y},
                                  {vx[kk][2].x, vx[kk][2].y}, {vx[kk][3].x, vx[kk][3].y}};  // [token][word g, g + 8]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // token pairs (2c, 2c + 1) and (2c + 8, 2c + 9): their group-h scale and bias pairs
          const uint32_t sel = h ? 0x7632u : 0x5410u;
          const uint32_t s01 = __byte_perm(sw[kk][0], sw[kk][1], sel), z01 = __byte_perm(zw[kk][0], zw[kk][1], sel);
          const uint32_t s89 = __byte_perm(sw[kk][2], sw[kk][3], sel), z89 = __byte_perm(zw[kk][2], zw[kk][3], sel);
          const uint32_t lo01 = __byte_perm(x[0][h], x[1][h], 0x5410u), hi01 = __byte_perm(x[0][h], x[1][h], 0x7632u);
          const uint32_t lo89 = __byte_perm(x[2][h], x[3][h], 0x5410u), hi89 = __byte_perm(x[2][h], x[3][h], 0x7632u);
#pragma unroll
          for (int k = 0; k < 4; ++k) {  // nibble pair (2k, 2k + 1): m-tile 4 h + k
            const uint32_t w01 = k < 2 ? lo01 : hi01, w89 = k < 2 ? lo89 : hi89;
            const int sh = 8 * (k & 1);
            const auto deq = [](uint32_t w, int shift, bool high, uint32_t s2, uint32_t z2) {
              const uint32_t y = w >> shift;
              const uint32_t m2 = high ? mmak::and_or(y, 0x00f000f0u, 0x54005400u)   // 64 + n
                                       : mmak::and_or(y, 0x000f000fu, 0x64006400u);  // 1024 + n
              return mmak::Ty<__half>::fma2(mmak::Ty<__half>::add2(m2, high ? 0xD400D400u : 0xE400E400u), s2, z2);
            };
            const uint32_t av[4] = {deq(w01, sh, false, s01, z01), deq(w01, sh, true, s01, z01),
                                    deq(w89, sh, false, s89, z89), deq(w89, sh, true, s89, z89)};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mmak::Ty<__half>::mma(o[4 * h + k][nt], av, pb[kk][nt][0], pb[kk][nt][1]);
          }
        }
      } else {
        const uint4* x = vx[kk];  // [token]: words 4 g ... 4 g + 3 of the slice (dims 16 g ... 16 g + 15)
        // the lane's dims are in group g / 4 of the slice
        const uint32_t sel = g >= 4 ? 0x7632u : 0x5410u;
        const uint32_t s01 = __byte_perm(sw[kk][0], sw[kk][1], sel), z01 = __byte_perm(zw[kk][0], zw[kk][1], sel);
        const uint32_t s89 = __byte_perm(sw[kk][2], sw[kk][3], sel), z89 = __byte_perm(zw[kk][2], zw[kk][3], sel);
        const auto word = [](const uint4& u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; };
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // m-tile i: bytes 2i, 2i + 1 of the lane's 16 (word i / 2)
          // [t0 byte b, t0 byte b + 1, t1 byte b, t1 byte b + 1], b = 2 (i & 1)
          const uint32_t bsel = (i & 1) ? 0x7632u : 0x5410u;
          const uint32_t y01 = __byte_perm(word(x[0], i >> 1), word(x[1], i >> 1), bsel);
          const uint32_t y89 = __byte_perm(word(x[2], i >> 1), word(x[3], i >> 1), bsel);
          // 1024 + n as f16: the code in the mantissa's low byte under the exponent 0x64
          const auto deq = [](uint32_t y, bool high, uint32_t s2, uint32_t z2) {
            const uint32_t m2 = __byte_perm(y, 0x64646464u, high ? 0x4341u : 0x4240u);
            return mmak::Ty<__half>::fma2(mmak::Ty<__half>::add2(m2, 0xE400E400u), s2, z2);
          };
          const uint32_t av[4] = {deq(y01, false, s01, z01), deq(y01, true, s01, z01), deq(y89, false, s89, z89),
                                  deq(y89, true, s89, z89)};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mmak::Ty<__half>::mma(o[i][nt], av, pb[kk][nt][0], pb[kk][nt][1]);
        }
      }
    }
  }

  // ---- the block's 4 warps into one partial --------------------------------------------------
  __shared__ float wm[kPvWarps][RS], wl[kPvWarps][RS];
  __shared__ float red[RS][128 + 1];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    l[nt] += __shfl_xor_sync(0xffffffffu, l[nt], 1);
    l[nt] += __shfl_xor_sync(0xffffffffu, l[nt], 2);
    if (c == 0) wm[warp][nt * 8 + g] = m[nt], wl[warp][nt * 8 + g] = l[nt];
  }
  for (int i = threadIdx.x; i < RS * 129; i += kPvWarps * 32) (&red[0][0])[i] = 0.0f;
  __syncthreads();
  // the block's reference per row, and each warp's factor for its columns (rows 2c, 2c + 1)
  float bm[NT][2], fw[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = nt * 8 + 2 * c + e;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kPvWarps; ++w) mx = fmaxf(mx, wm[w][r]);
      bm[nt][e] = mx;
      fw[nt][e] = wm[warp][r] == -INFINITY ? 0.0f : exp2f(wm[warp][r] - mx);
    }
  for (int w = 0; w < kPvWarps; ++w) {
    if (w == warp) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const int r = nt * 8 + 2 * c + (v & 1), d = pv_dim<VBITS>(i, g + 8 * (v >> 1));
            red[r][d] += o[i][nt][v] * fw[nt][v & 1];
          }
    }
    __syncthreads();
  }
  const int64_t pr = (int64_t(split) * gridDim.z + bh) * RS;
  for (int i = threadIdx.x; i < RS * 128; i += kPvWarps * 32) {
    const int r = i >> 7, d = i & 127;
    a.po[(pr + r) * a.D + 128 * slice + d] = red[r][d];
  }
  if (slice == 0 && threadIdx.x < RS) {
    const int r = threadIdx.x;
    float mx = -INFINITY, sum = 0.0f;
    for (int w = 0; w < kPvWarps; ++w) mx = fmaxf(mx, wm[w][r]);
    for (int w = 0; w < kPvWarps; ++w)
      if (wm[w][r] != -INFINITY) sum += wl[w][r] * exp2f(wm[w][r] - mx);
    a.pm[pr + r] = mx;
    a.pl[pr + r] = sum;
  }
  (void)bm;
}

// out[b, h rep + r / Lq, r % Lq, d] = Σ_s po_s exp2(pm_s - M) / Σ_s pl_s exp2(pm_s - M), f16; a
// block per (b * Hkv, row, 128 dims), a thread per dim.
__global__ void pv_merge_kernel(PvArgs a, __half* out, int Hkv, int Hq, int RS) {
  const int bh = blockIdx.x, r = blockIdx.y, b = bh / Hkv, h = bh % Hkv, rep = Hq / Hkv, Lq = a.Lq;
  const int nbh = gridDim.x, d = 128 * int(blockIdx.z) + int(threadIdx.x);
  float mx = -INFINITY;
  for (int s = 0; s < a.splits; ++s) mx = fmaxf(mx, a.pm[(int64_t(s) * nbh + bh) * RS + r]);
  float den = 0.0f, acc = 0.0f;
#pragma unroll 4
  for (int s = 0; s < a.splits; ++s) {
    const int64_t k = (int64_t(s) * nbh + bh) * RS + r;
    const float pm = a.pm[k];
    if (pm != -INFINITY) {
      const float f = exp2f(pm - mx);
      den += a.pl[k] * f;
      acc += a.po[k * a.D + d] * f;
    }
  }
  out[((int64_t(b) * Hq + h * rep + r / Lq) * Lq + r % Lq) * a.D + d] = __float2half_rn(den > 0.0f ? acc / den : 0.0f);
}

}  // namespace

size_t two_pass_workspace_bytes(const LogitsQK& p, int splits) {
  const int R = (p.Hq / p.Hkv) * p.Lq, RS = R <= 8 ? 8 : 16;
  const size_t bhs = size_t(p.B) * p.Hkv;
  const size_t s_bytes = bhs * size_t(p.N) * RS * 4;
  const size_t part = size_t(splits) * bhs * RS;
  return s_bytes + part * size_t(p.D) * 4 + 2 * part * 4;
}

Status two_pass_attention(const LogitsQK& p, const void* v, const void* v_scales, const void* v_biases, void* out,
                          void* workspace, int splits, void* stream) {
  const auto bad = [](const std::string& m) {
    return detail::make_status(StatusCode::invalid_argument, "two_pass_attention: " + m, Backend::cuda);
  };
  if (p.bits != 4 && p.bits != 8) return bad("4- or 8-bit values (as the keys)");
  if (splits < 1 || !v || !v_scales || !v_biases || !out || !workspace) return bad("buffers and splits >= 1");
  const int R = (p.Hq / p.Hkv) * p.Lq, RS = R <= 8 ? 8 : 16;
  const size_t bhs = size_t(p.B) * p.Hkv;
  LogitsQK q1 = p;
  q1.s = static_cast<float*>(workspace);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (Status s1 = logits_qk(q1, stream); !s1.ok()) return s1;
  PvArgs a;
  a.s = q1.s;
  a.v = static_cast<const uint32_t*>(v);
  a.vs = static_cast<const __half*>(v_scales);
  a.vb = static_cast<const __half*>(v_biases);
  char* w = static_cast<char*>(workspace) + bhs * size_t(p.N) * RS * 4;
  const size_t part = size_t(splits) * bhs * RS;
  a.po = reinterpret_cast<float*>(w);
  a.pm = a.po + part * size_t(p.D);
  a.pl = a.pm + part;
  a.N = p.N, a.D = p.D, a.splits = splits, a.Lq = p.Lq;
  a.chunk = int((int64_t(p.N) + splits - 1) / splits);
  a.chunk = (a.chunk + 31) / 32 * 32;
  const dim3 grid(unsigned(splits), unsigned(p.D / 128), unsigned(bhs));
  if (p.bits == 4) {
    if (RS == 8)
      pv_kernel<4, 1><<<grid, kPvWarps * 32, 0, st>>>(a);
    else
      pv_kernel<4, 2><<<grid, kPvWarps * 32, 0, st>>>(a);
  } else {
    if (RS == 8)
      pv_kernel<8, 1><<<grid, kPvWarps * 32, 0, st>>>(a);
    else
      pv_kernel<8, 2><<<grid, kPvWarps * 32, 0, st>>>(a);
  }
  pv_merge_kernel<<<dim3(unsigned(bhs), unsigned(R), unsigned(p.D / 128)), 128, 0, st>>>(a, static_cast<__half*>(out),
                                                                                          p.Hkv, p.Hq, RS);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return detail::make_status(StatusCode::backend_error, std::string("two_pass_attention: ") + cudaGetErrorString(e),
                               Backend::cuda);
  return Status{};
}

}  // namespace qsdpa::cuda
