// How the tensor-core attention kernel turns packed MLX words into mma operands, per element type
// T (f16 / bf16), bit width (2 / 4 / 8) and, for f16 keys, the code representation.
//
// Keys (Q·Kᵀ, tokens on the mma M dimension, head dims on K). ldmatrix hands lane (g, c) word c of
// a 16-byte piece of token g's row; unpacking one word gives f16/bf16 pairs of integer codes of the
// SAME token, which is what the A operand wants (row g, two consecutive k). The k order inside an
// mma is therefore a permutation of the head dims (kdim() below), applied to q as well; every mma
// stays inside one 32-dim block (2 bits: one 64-dim piece, so 2-bit caches need groups of 64 or
// more), hence inside one quantization group, so that the affine map is applied per group
// afterwards in f32:  q·k̂ = Σ_g s_g (q_g·k̃_g) + z_g Σ_{d∈g} q_d.
// Codes are exact in T. Where the representation adds a constant (a "magic" exponent: the code n
// appears as μ + n), Σ_g s_g μ Σ q_g is removed by the same per-group correction as the biases.
//   f16, denormal codes (kDenorm): n * 2^-24 is the f16 bit pattern n itself (a subnormal), so a
//     nibble masked in place is already an exact operand; a nibble in bits 4..7 of a half is
//     16 n * 2^-24, compensated by q/16 on the B side (beta). No offset at all. 2 bits: a code
//     in bits 2k..2k+1 of a half is 4^k n * 2^-24, compensated by q / 4^k.
//   f16, magic codes: 0x6400 | n = 1024 + n, 0x5400 | n << 4 = 64 + n.
//   bf16: 0x4300 | n = 128 + n (nibble or 2-bit code in bits 0..3); for 8 bits the high nibble comes as
//     0x4500 | hi = 2048 + 16 hi, so that one byte is lo + hi over two mma with the same B.
// Values (P·V, head dims on M, tokens on K). ldmatrix.trans hands lane (g, c) one 16-bit column
// of two consecutive tokens (2c, 2c+1): pairs of TOKENS, as the A operand of Oᵀ = Vᵀ·Pᵀ wants.
// They are dequantized in T with one fma per pair (s n + z, exact n, one rounding): the rounding
// averages out in the weighted sum and keeps T's range. Folding s into p instead (p s per token
// and group in Pᵀ, Σ p z apart) was measured on an H200 in a first form (2026-11-29): 6 % slower,
// and 3-7x the error, because the rounding of the s n and z terms, each about as large as the
// group's extreme, no longer cancels (2.4e-3 relative error for f16 with one group per row: over
// the 2e-3 bound). The kernel's kVFold (mma_kernel.cuh) is the form that keeps this path's error
// (p s as hi + lo, bare subnormal codes: vcodes below); it runs where it was measured faster.
#pragma once

#include "mma_ptx.cuh"

namespace qsdpa::cuda::mmak {

template <class T, int BITS, bool KDEN>
struct Fmt {
  static constexpr bool kBf16 = Ty<T>::kBf16;
  static constexpr bool kDen = KDEN && !kBf16;  // denormal f16 key codes
  static_assert(BITS == 2 || BITS == 4 || BITS == 8, "2-, 4- and 8-bit formats");
  static_assert(BITS != 2 || kBf16 || kDen, "2-bit f16 keys: subnormal codes only");

  // ---- keys -------------------------------------------------------------------------------
  // mma per 16-byte piece of a key row, and the k-step each one belongs to.
  static constexpr int kKMma = BITS == 2 ? 4 : (BITS == 4 || kBf16) ? 2 : 1;
  static constexpr int kKRegs = BITS == 2 ? 8 : 4;  // A registers one packed word unpacks into
  __host__ __device__ static constexpr int kstep(int ch, int m) {
    return BITS == 2 ? 4 * ch + m : BITS == 4 ? 2 * ch + m : ch;
  }
  // The first and the last 32-dim block of a piece (8 bits: half a block; 2 bits: two blocks), and
  // whether the piece ends / starts a block.
  __host__ __device__ static constexpr int block_first(int ch) { return BITS == 2 ? 2 * ch : BITS == 4 ? ch : ch / 2; }
  __host__ __device__ static constexpr int block_last(int ch) { return BITS == 2 ? 2 * ch + 1 : BITS == 4 ? ch : ch / 2; }
  __host__ __device__ static constexpr bool block_end(int ch) { return BITS != 8 || (ch & 1); }
  __host__ __device__ static constexpr bool block_start(int ch) { return BITS != 8 || !(ch & 1); }
  // The head dim at k-slot kk (0..15) of k-step ks.
  __host__ __device__ static constexpr int kdim(int ks, int kk) {
    const int c = (kk & 7) >> 1, half = kk & 1, upper = kk >> 3;
    if (BITS == 2) {
      // register r[reg] holds codes reg and reg + 8 of word c (16 codes: 16 head dims)
      const int ch = ks >> 2, reg = 2 * (ks & 3) + upper;
      return 64 * ch + 16 * c + reg + 8 * half;
    }
    if (BITS == 4) {
      const int ch = ks >> 1, reg = 2 * (ks & 1) + upper;  // registers (n0,n4) (n1,n5) (n2,n6) (n3,n7)
      return 32 * ch + 8 * c + reg + 4 * half;
    }
    return 16 * ks + 4 * c + upper + 2 * half;  // registers (b0,b2) (b1,b3)
  }
  // B-side factor of head dim d, the code's constant offset, and the common code scale kappa:
  // A_d * B_d = kappa * (n_d + mu_d) * q_d.
  __host__ __device__ static constexpr float beta(int d) {
    if (kDen && BITS == 2) return (d & 3) == 0 ? 1.0f : (d & 3) == 1 ? 0.25f : (d & 3) == 2 ? 0.0625f : 0.015625f;
    return (kDen && BITS == 4 && (d & 1)) ? 0.0625f : 1.0f;
  }
  __host__ __device__ static constexpr float mu(int d) {
    return kBf16 ? (BITS == 8 ? 2176.0f : 128.0f) : kDen ? 0.0f : (BITS == 8 ? 1024.0f : (d & 1) ? 64.0f : 1024.0f);
  }
  static constexpr float kKappa = kDen ? 5.9604644775390625e-08f : 1.0f;  // 2^-24
  static constexpr bool kOffsets = !kDen;
  // q is scaled per row by a power of two so that max|q| lands in [2^kT0, 2^(kT0+1)): big enough
  // that q/16 stays normal (denormal codes), small enough that the per-group sums and offsets
  // stay inside f16's range (magic codes). bf16 has f32's range and needs none.
  static constexpr bool kPrescale = !kBf16;
  static constexpr int kT0 = kDen ? 7 : -3;

  // One packed key word -> 8 (2 bits), 4 or 2 A registers.
  __device__ static __forceinline__ void kunpack(uint32_t x, uint32_t (&r)[kKRegs]) {
    if constexpr (BITS == 2) {
      const uint32_t y = x >> 8;
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // codes k, k + 8 (x) and k + 4, k + 12 (y)
        if constexpr (kBf16) {
          r[k] = and_or(x >> (2 * k), 0x00030003u, 0x43004300u);
          r[k + 4] = and_or(y >> (2 * k), 0x00030003u, 0x43004300u);
        } else {
          r[k] = x & (0x00030003u << (2 * k));
          r[k + 4] = y & (0x00030003u << (2 * k));
        }
      }
    } else if constexpr (kBf16) {
      if constexpr (BITS == 4) {
        r[0] = and_or(x, 0x000f000fu, 0x43004300u);
        r[1] = and_or(x >> 4, 0x000f000fu, 0x43004300u);
        r[2] = and_or(x >> 8, 0x000f000fu, 0x43004300u);
        r[3] = and_or(x >> 12, 0x000f000fu, 0x43004300u);
      } else {
        r[0] = and_or(x, 0x000f000fu, 0x43004300u);          // low nibbles of bytes 0, 2
        r[1] = and_or(x >> 8, 0x000f000fu, 0x43004300u);   // low nibbles of bytes 1, 3
        r[2] = and_or(x >> 4, 0x000f000fu, 0x45004500u);   // high nibbles of bytes 0, 2 (x16)
        r[3] = and_or(x >> 12, 0x000f000fu, 0x45004500u);  // high nibbles of bytes 1, 3 (x16)
      }
    } else if constexpr (BITS == 4) {
      const uint32_t y = x >> 8;
      if constexpr (kDen) {
        r[0] = x & 0x000f000fu;
        r[1] = x & 0x00f000f0u;
        r[2] = y & 0x000f000fu;
        r[3] = y & 0x00f000f0u;
      } else {
        r[0] = and_or(x, 0x000f000fu, 0x64006400u);
        r[1] = and_or(x, 0x00f000f0u, 0x54005400u);
        r[2] = and_or(y, 0x000f000fu, 0x64006400u);
        r[3] = and_or(y, 0x00f000f0u, 0x54005400u);
      }
    } else {
      const uint32_t hi = kDen ? 0u : 0x64646464u;
      r[0] = __byte_perm(x, hi, 0x4240);  // bytes 0, 2
      r[1] = __byte_perm(x, hi, 0x4341);  // bytes 1, 3
      r[2] = r[3] = 0u;
    }
  }

  // ---- values -----------------------------------------------------------------------------
  // d-tiles (16 head dims each) per 16-byte piece, and the head dim of row `row` (0..15) of
  // d-tile dt.
  static constexpr int kVTiles = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
  static constexpr int kVRegs = BITS == 2 ? 8 : 4;  // dequantized pairs one word gives
  __host__ __device__ static constexpr int vdim(int dt, int row) {
    if (BITS == 2) return 64 * (dt >> 2) + 8 * (row & 7) + 2 * (dt & 3) + (row >> 3);
    if (BITS == 4) return 32 * (dt >> 1) + 4 * (row & 7) + 2 * (dt & 1) + (row >> 3);
    return 16 * dt + 2 * (row & 7) + (row >> 3);
  }

  // One ldmatrix.trans word (a 16-bit column of two tokens) -> dequantized token pairs, using
  // the pairs of scales s and biases z of those two tokens. u[2t], u[2t+1] feed rows g, g+8 of
  // d-tile t of the piece (2 bits: u[0..7], codes 0..7 of the column; d-tile t takes u[2t], u[2t+1]).
  __device__ static __forceinline__ void vunpack(uint32_t x, uint32_t s, uint32_t z, uint32_t (&u)[kVRegs]) {
    using Y = Ty<T>;
    if constexpr (BITS == 2) {
      const uint32_t y = x >> 8;
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // codes k (x) and k + 4 (y) of both tokens
        if constexpr (kBf16) {
          u[k] = Y::fma2(Y::add2(and_or(x >> (2 * k), 0x00030003u, 0x43004300u), 0xC300C300u), s, z);
          u[k + 4] = Y::fma2(Y::add2(and_or(y >> (2 * k), 0x00030003u, 0x43004300u), 0xC300C300u), s, z);
        } else {
          // a code at bits 2k of a half: M_k + n with M_k = 1024, 256, 64, 16 (the exponent that
          // makes one unit of the code one unit of the number)
          constexpr uint32_t kMagic[4] = {0x64006400u, 0x5C005C00u, 0x54005400u, 0x4C004C00u};
          constexpr uint32_t kNeg[4] = {0xE400E400u, 0xDC00DC00u, 0xD400D400u, 0xCC00CC00u};
          const uint32_t mk = 0x00030003u << (2 * k);
          u[k] = Y::fma2(Y::add2(and_or(x, mk, kMagic[k]), kNeg[k]), s, z);
          u[k + 4] = Y::fma2(Y::add2(and_or(y, mk, kMagic[k]), kNeg[k]), s, z);
        }
      }
    } else if constexpr (kBf16) {
      if constexpr (BITS == 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t m = and_or(x >> (4 * k), 0x000f000fu, 0x43004300u);  // 128 + n
          u[k] = Y::fma2(Y::add2(m, 0xC300C300u), s, z);                    // (n) * s + z
        }
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t lo = and_or(x >> (8 * k), 0x000f000fu, 0x43004300u);      // 128 + lo
          const uint32_t hi = and_or(x >> (8 * k + 4), 0x000f000fu, 0x45004500u);  // 2048 + 16 hi
          const uint32_t n = Y::add2(lo, Y::add2(hi, 0xC508C508u));              // lo + 16 hi, exact
          u[k] = Y::fma2(n, s, z);
        }
        u[2] = u[3] = 0u;
      }
    } else if constexpr (BITS == 4) {
      const uint32_t y = x >> 8;
      u[0] = Y::fma2(Y::add2(and_or(x, 0x000f000fu, 0x64006400u), 0xE400E400u), s, z);  // 1024 + n
      u[1] = Y::fma2(Y::add2(and_or(x, 0x00f000f0u, 0x54005400u), 0xD400D400u), s, z);  // 64 + n
      u[2] = Y::fma2(Y::add2(and_or(y, 0x000f000fu, 0x64006400u), 0xE400E400u), s, z);
      u[3] = Y::fma2(Y::add2(and_or(y, 0x00f000f0u, 0x54005400u), 0xD400D400u), s, z);
    } else {
      u[0] = Y::fma2(Y::add2(__byte_perm(x, 0x64646464u, 0x4240), 0xE400E400u), s, z);
      u[1] = Y::fma2(Y::add2(__byte_perm(x, 0x64646464u, 0x4341), 0xE400E400u), s, z);
      u[2] = u[3] = 0u;
    }
  }

  // ---- values with the scale folded into the weights (f16; mma_kernel.cuh, kVFold) ----------
  // The same word as vunpack's, as bare codes: each half is the f16 subnormal of the code where
  // it sits, c * 2^-24 with c = n * vfactor(k) (a nibble in bits 4..7 of its half is 16 n; a
  // 2-bit code in bits 2j..2j+1, 4^j n), exact, one lop3 (8 bits: one prmt) per pair. Register
  // u[k] feeds the same rows of the same d-tile as vunpack's u[k], so vdim() holds for both.
  static constexpr bool kVCodes = !kBf16;
  __host__ __device__ static constexpr int vfactor(int k) {
    return BITS == 4 ? ((k & 1) ? 16 : 1) : BITS == 2 ? (1 << (2 * (k & 3))) : 1;
  }
  __device__ static __forceinline__ void vcodes(uint32_t x, uint32_t (&u)[kVRegs]) {
    static_assert(!kBf16, "bare value codes: f16 (subnormal codes)");
    const uint32_t y = x >> 8;
    if constexpr (BITS == 2) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // codes k (x) and k + 4 (y) of both tokens
        u[k] = x & (0x00030003u << (2 * k));
        u[k + 4] = y & (0x00030003u << (2 * k));
      }
    } else if constexpr (BITS == 4) {
      u[0] = x & 0x000f000fu;
      u[1] = x & 0x00f000f0u;
      u[2] = y & 0x000f000fu;
      u[3] = y & 0x00f000f0u;
    } else {
      u[0] = __byte_perm(x, 0u, 0x4240);  // bytes 0, 2
      u[1] = __byte_perm(x, 0u, 0x4341);  // bytes 1, 3
      u[2] = u[3] = 0u;
    }
  }
};

}  // namespace qsdpa::cuda::mmak
