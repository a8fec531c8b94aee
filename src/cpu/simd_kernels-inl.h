// The inner kernels of the SIMD attention kernel (simd_kernel.cpp), compiled once per instruction
// set: per tile of kTile tokens, K logits in token lanes (unpack + integer dot products + the
// affine map) and V accumulation in element lanes (unpack + weighted sums, on f32 multiply-adds
// or on int16 weights). simd_kernel.cpp explains the algebra; bench/cpu_kernels_bench.cpp times
// each kernel per instruction set.
//
// Included from simd_kernel.cpp once per target (Highway's per-target include guard below).
#if defined(QSDPA_CPU_SIMD_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QSDPA_CPU_SIMD_KERNELS_INL_H_
#undef QSDPA_CPU_SIMD_KERNELS_INL_H_
#else
#define QSDPA_CPU_SIMD_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernel.hpp"

// VNNI's vpdpwssd: Highway 1.0.3 has no operation for it, and its AVX3_DL target does not enable
// the compiler's avx512vnni, so this file does, for that target only (GCC).
#undef QSDPA_X86_SIMD
#if HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL
#define QSDPA_X86_SIMD 1  // (not the emulated targets that run on x86 too: EMU128, SCALAR)
#else
#define QSDPA_X86_SIMD 0
#endif
#undef QSDPA_VNNI
#if HWY_TARGET == HWY_AVX3_DL && HWY_COMPILER_GCC_ACTUAL && !HWY_COMPILER_CLANG
#define QSDPA_VNNI 1
#else
#define QSDPA_VNNI 0
#endif

HWY_BEFORE_NAMESPACE();
namespace qsdpa::detail::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR  // (one lane: simd_kernel.cpp defers to the portable kernel)

constexpr int64_t kTile = 128;  // tokens per tile (a multiple of the token lanes)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using DU = hn::CappedTag<uint32_t, 16>;  // token lanes: a K word of each of up to 16 tokens
using DI = hn::Rebind<int32_t, DU>;
using DF = hn::Rebind<float, DU>;

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

// The 128-bit blocks of a vector from different places: block B from p + B * stride (bytes).
template <class D>
HWY_INLINE hn::Vec<D> LoadBlocks(D d, const uint8_t* p, int64_t stride) {
#if HWY_HAVE_SCALABLE
  // (a vector length known only at run time: through memory)
  using T = hn::TFromD<D>;
  HWY_ALIGN T buf[hn::MaxLanes(D())];
  const int64_t blocks = int64_t(hn::Lanes(d) * sizeof(T) / 16);
  for (int64_t b = 0; b < blocks; ++b) std::memcpy(reinterpret_cast<uint8_t*>(buf) + b * 16, p + b * stride, 16);
  return hn::Load(d, buf);
#else
  if constexpr (hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) <= 16) {
    return hn::LoadU(d, reinterpret_cast<const hn::TFromD<D>*>(p));
  } else {
    const hn::Half<D> dh;
    constexpr int64_t half_blocks = int64_t(hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) / 32);
    return hn::Combine(d, LoadBlocks(dh, p + half_blocks * stride, stride), LoadBlocks(dh, p, stride));
  }
#endif
}

// Within each 128-bit block, a 4x4 transpose of u32: block B, lane j of x_k = lane k of a_j.
HWY_INLINE void Transpose4(hn::Vec<DU> a0, hn::Vec<DU> a1, hn::Vec<DU> a2, hn::Vec<DU> a3, hn::Vec<DU>* x) {
  const DU du;
  const hn::Repartition<uint64_t, DU> d64;
  const auto t0 = hn::BitCast(d64, hn::InterleaveLower(du, a0, a1));  // a0[0] a1[0] a0[1] a1[1]
  const auto t1 = hn::BitCast(d64, hn::InterleaveLower(du, a2, a3));
  const auto t2 = hn::BitCast(d64, hn::InterleaveUpper(du, a0, a1));  // a0[2] a1[2] a0[3] a1[3]
  const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(du, a2, a3));
  x[0] = hn::BitCast(du, hn::InterleaveLower(d64, t0, t1));
  x[1] = hn::BitCast(du, hn::InterleaveUpper(d64, t0, t1));
  x[2] = hn::BitCast(du, hn::InterleaveLower(d64, t2, t3));
  x[3] = hn::BitCast(du, hn::InterleaveUpper(d64, t2, t3));
}

// dst[0, n) = src[0, n) of type t, widened to f32.
void ToF32(DType t, const void* src, int64_t n, float* dst) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  if (t == DType::f32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  const auto* s16 = static_cast<const uint16_t*>(src);
  if (t == DType::f16) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    for (; i + L <= n; i += L)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(s16 + i))), df, dst + i);
    for (; i < n; ++i) dst[i] = f16_to_f32(s16[i]);
  } else {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> db;
    for (; i + L <= n; i += L)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(s16 + i))), df, dst + i);
    for (; i < n; ++i) dst[i] = bf16_to_f32(s16[i]);
  }
}

// Prefetches part i of n of [p, p + bytes), a cache line at a time: the next tile's rows are asked
// for while this tile is computed, a few lines at a time, so that the loads of the next tile hit
// the cache. (The hardware prefetchers stop at each 4 KiB page, and a tile of rows is about one.)
HWY_INLINE void prefetch_part(const char* p, int64_t bytes, int64_t i, int64_t n) {
  if (!p) return;
  const int64_t lines = (bytes + 63) / 64, l0 = lines * i / n, l1 = lines * (i + 1) / n;
  // Into L2, not L1: the next tile's K and V rows (up to 32 KiB at 8 bits) would push this tile's
  // out of L1.
#if HWY_COMPILER_GCC || HWY_COMPILER_CLANG
  for (int64_t l = l0; l < l1; ++l) __builtin_prefetch(p + l * 64, 0, 2);
#else
  for (int64_t l = l0; l < l1; ++l) hwy::Prefetch(p + l * 64);
#endif
}

// ---------------------------------------------------------------------------------------------
// K: logits of a tile, RB rows at a time, in token lanes
// ---------------------------------------------------------------------------------------------

struct KArgs {
  const uint32_t* krows;  // the tile's K rows (from the cache, or a padded copy)
  int64_t kstride;        // words from one row to the next (a multiple of 4)
  int64_t nlg, nquad;     // lane groups of tokens; quads of words per (padded) row
  int64_t wpg, ng;       // words per group, groups per row
  const uint32_t* qh;    // the pairs of qi as the codes come out of a word, per row block (k_rows):
                         // block of rows [r0, r0 + RB) at r0 * npairs * NL, then [pair][RB][lane]
  const uint32_t* ql;    // the same for qi2 (f32 only)
  int64_t npairs;        // pairs per row
  const float* ah;       // [row]: scale * a
  const float* al;       // [row]: scale * a / 2^14
  const int32_t* h1;     // [row][group]: h * sum(qi), where a group's int32 sums start
  const int32_t* h2;     // the same for qi2
  const float* cq;       // [row][group]: scale * Q
  const float* ks;       // [group][kTile] the tile's K scales
  const float* kz;       // [group][kTile] the tile's K biases of the centred codes, z + h s
  float* x;              // [row][kTile] logits
  const char* ahead;     // the next tile's K rows, prefetched a part per lane group (or null)
  int64_t ahead_bytes;
};

// The rows of the K block that starts at row r of nr: 4, then 2, then 1.
inline int k_rows(int64_t nr, int64_t r) { return nr - r >= 4 ? 4 : nr - r >= 2 ? 2 : 1; }

// ---------------------------------------------------------------------------------------------
// V: weighted sum of a tile's rows, RB rows at a time, in element lanes
// ---------------------------------------------------------------------------------------------

struct VArgs {
  const uint8_t* vrows;  // the packed V row of the tile's first token
  int64_t row_bytes;
  int64_t tn;  // tokens of the tile
  const float* P;     // [group][row][kTile]: w * s (the f32 kernel)
  const int16_t* Pi;  // [group][row][kTile]: w * s / sigma rounded to int16 (the integer kernel)
  const float* sig;   // [group][row]: sigma
  const int32_t* psum;  // [group][row]: the sum of the tile's int16 weights (the integer kernel)
  int64_t nrows, G, D;
  float* O;  // [row][D] accumulators, permuted within each run of Lanes * (8 / bits) elements
  const char* ahead;  // the next tile's V rows, prefetched a part per run (or null)
  int64_t ahead_bytes;
};

// A run of V: the NE vectors of codes one token gives at a time, NE * Lanes (<= 32) consecutive
// elements, all of one group (groups hold 32 or more).
template <int BITS>
constexpr int kRunVectors = BITS == 8 ? 2 : 8 / BITS;
template <int BITS>
using DV = hn::CappedTag<float, 32 / kRunVectors<BITS>>;

// The codes of one run of a token's V row, centred on h = 2^(bits-1), in f32. For 8 bits, e[k]
// lane m is element k * Lanes + m of the run, code - h. For 4 and 2 bits, e[k] lane m is element
// (8 / bits) * m + k, as 2^(k bits) (code - h): the code is masked in place, not shifted down
// (vector shifts cost more than the rest on some machines); the power of two comes out once per
// task (unpermute).
template <int BITS, class DF8>
HWY_INLINE void UnpackV(DF8 df, const uint8_t* src, hn::Vec<DF8>* e) {
  const hn::Rebind<int32_t, DF8> di;
  const hn::Rebind<uint8_t, DF8> du8;
  constexpr int32_t h = 1 << (BITS - 1), mask = (1 << BITS) - 1;
  const auto x = hn::BitCast(di, hn::PromoteTo(hn::Rebind<uint32_t, DF8>(), hn::LoadU(du8, src)));
  if constexpr (BITS == 8) {
    e[0] = hn::ConvertTo(df, hn::Sub(x, hn::Set(di, h)));
    const auto x1 = hn::BitCast(di, hn::PromoteTo(hn::Rebind<uint32_t, DF8>(), hn::LoadU(du8, src + hn::Lanes(df))));
    e[1] = hn::ConvertTo(df, hn::Sub(x1, hn::Set(di, h)));
  } else {
    for (int k = 0; k < 8 / BITS; ++k)
      e[k] = hn::ConvertTo(df, hn::Sub(hn::And(x, hn::Set(di, mask << (k * BITS))), hn::Set(di, h << (k * BITS))));
  }
}

// The codes of one run of tokens t and u (rows s0 and s1) side by side, scaled as UnpackV leaves
// them but not centred (the integer kernel takes h times the sum of the weights off once per run):
// 32-bit lane m of e[k] holds (code of t, code of u) as two int16.
template <int BITS, class DI32>
HWY_INLINE void PairCodes(DI32 di, const uint8_t* s0, const uint8_t* s1, hn::Vec<DI32>* e) {
  constexpr int32_t mask = (1 << BITS) - 1;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
  // The bytes of t and u interleaved, then widened to 16 bits: one unpack and one widening per
  // vector instead of two widenings, a shift and an or.
  using VI = hn::Vec<DI32>;
  constexpr size_t kBytes = hn::MaxLanes(DI32()) * (BITS == 8 ? 2 : 1);  // bytes of one token's run
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "run of 4, 8 or 16 bytes");
  __m128i t, u;
  if constexpr (kBytes == 16) {
    t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s0));
    u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s1));
  } else if constexpr (kBytes == 8) {
    t = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s0));
    u = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s1));
  } else {
    int32_t a, b;
    std::memcpy(&a, s0, 4);
    std::memcpy(&b, s1, 4);
    t = _mm_cvtsi32_si128(a);
    u = _mm_cvtsi32_si128(b);
  }
  const __m128i lo = _mm_unpacklo_epi8(t, u);  // t0 u0 t1 u1 ...
#if HWY_TARGET == HWY_AVX2
  const auto widen = [](__m128i x) { return VI{_mm256_cvtepu8_epi16(x)}; };
#else
  const auto widen = [](__m128i x) { return VI{_mm_cvtepu8_epi16(x)}; };
#endif
  if constexpr (BITS == 8) {
#if HWY_TARGET == HWY_AVX2
    e[0] = widen(lo);
    e[1] = widen(_mm_unpackhi_epi8(t, u));
#else
    e[0] = widen(lo);
    e[1] = widen(_mm_srli_si128(lo, 8));
#endif
  } else {
    const VI x = widen(lo);
    for (int k = 0; k < 8 / BITS; ++k) e[k] = hn::And(x, hn::Set(di, (mask << (k * BITS)) * 0x00010001));
  }
#else
  const hn::Rebind<uint32_t, DI32> du;
  const hn::Rebind<uint8_t, DI32> du8;
  auto pair = [&](const uint8_t* a, const uint8_t* b) {
    return hn::BitCast(di, hn::Or(hn::PromoteTo(du, hn::LoadU(du8, a)), hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du8, b)))));
  };
  if constexpr (BITS == 8) {
    const size_t NV = hn::Lanes(di);
    e[0] = pair(s0, s1);
    e[1] = pair(s0 + NV, s1 + NV);
  } else {
    const auto x = pair(s0, s1);
    for (int k = 0; k < 8 / BITS; ++k) e[k] = hn::And(x, hn::Set(di, (mask << (k * BITS)) * 0x00010001));
  }
#endif
}

// Rows per V block: the accumulators (rows x elements per byte) stay in registers.
constexpr int v_rows(int bits) { return bits == 2 ? 2 : 4; }

// The rows of the V block that starts at row r of nr.
inline int v_rows(int bits, int64_t nr, int64_t r) {
  return nr - r >= v_rows(bits) ? v_rows(bits) : nr - r >= 2 ? 2 : 1;
}

// Element d of the natural order, for accumulators permuted (and scaled) as VAccum leaves them.
template <int BITS>
void unpermute(const float* O, int64_t D, float* o) {
  if constexpr (BITS == 8) {
    std::copy(O, O + D, o);
  } else {
    constexpr int PB = 8 / BITS;
    const int64_t NV = int64_t(hn::Lanes(DV<BITS>())), CE = NV * PB;
    for (int64_t c = 0; c < D / CE; ++c)
      for (int k = 0; k < PB; ++k) {
        const float unscale = 1.0f / float(1 << (k * BITS));  // a power of two: exact
        for (int64_t m = 0; m < NV; ++m) o[c * CE + PB * m + k] = O[c * CE + k * NV + m] * unscale;
      }
  }
}

// ---------------------------------------------------------------------------------------------
// The kernels that multiply (with VNNI where the target has it)
// ---------------------------------------------------------------------------------------------
#if QSDPA_VNNI
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#endif

// acc + (per 32-bit lane) lo(a) * lo(b) + hi(a) * hi(b), the halves being int16: exact.
template <class VI, class VU>
HWY_INLINE VI DotPairs(VU a, VU b, VI acc) {
  const hn::DFromV<VI> di;
  const hn::Repartition<int16_t, decltype(di)> d16;
#if QSDPA_VNNI
  if constexpr (sizeof(VI) == 64)
    return VI{_mm512_dpwssd_epi32(acc.raw, hn::BitCast(d16, a).raw, hn::BitCast(d16, b).raw)};
#endif
  VI odd = hn::Zero(di);
#if QSDPA_X86_SIMD
  // vpmaddwd: the pairs are summed in place, so the sum can run on in `acc`.
  auto sum = hn::ReorderWidenMulAccumulate(di, hn::BitCast(d16, a), hn::BitCast(d16, b), acc, odd);
#if HWY_COMPILER_GCC_ACTUAL && !HWY_COMPILER_CLANG
  // Keeps GCC from computing all the products of a word first and spilling them (an empty asm
  // that only pins the running sum to a register at this point).
  asm("" : "+x"(sum.raw));
#endif
  return sum;
#else
  const VI even = hn::ReorderWidenMulAccumulate(di, hn::BitCast(d16, a), hn::BitCast(d16, b), hn::Zero(di), odd);
  return hn::Add(acc, hn::RearrangeToOddPlusEven(even, odd));
#endif
}

// Pair P of one word of K (for every token of the lane group) against RB rows.
template <int BITS, int P, int RB, bool TWO, int... R>
HWY_INLINE void KPairRows(hn::Vec<DU> X, hn::Vec<DU> mask, const uint32_t* qw, const uint32_t* qw2, int64_t NL,
                          hn::Vec<DI>* acc, hn::Vec<DI>* acc2, std::integer_sequence<int, R...>) {
  const DU du;
  const auto c = hn::And(hn::ShiftRight<P * BITS>(X), mask);
  ((acc[R] = DotPairs(c, hn::Load(du, qw + R * NL), acc[R])), ...);
  if constexpr (TWO) ((acc2[R] = DotPairs(c, hn::Load(du, qw2 + R * NL), acc2[R])), ...);
}

template <int BITS, int P, int RB, bool TWO>
HWY_INLINE void KPair(hn::Vec<DU> X, hn::Vec<DU> mask, const uint32_t* qw, const uint32_t* qw2, int64_t NL,
                      hn::Vec<DI>* acc, hn::Vec<DI>* acc2) {
  KPairRows<BITS, P, RB, TWO>(X, mask, qw, qw2, NL, acc, acc2, std::make_integer_sequence<int, RB>{});
}

// All pairs of one word: q holds [pair][RB][lane].
template <int BITS, int RB, bool TWO, int... P>
HWY_INLINE void KWord(hn::Vec<DU> X, hn::Vec<DU> mask, const uint32_t* qw, const uint32_t* qw2, int64_t NL,
                      hn::Vec<DI>* acc, hn::Vec<DI>* acc2, std::integer_sequence<int, P...>) {
  (KPair<BITS, P, RB, TWO>(X, mask, qw + P * RB * NL, qw2 + P * RB * NL, NL, acc, acc2), ...);
}

template <int BITS, int RB, bool TWO>
HWY_NOINLINE void KLogits(const KArgs& a, int64_t r0) {
  constexpr int PER = 32 / BITS, PAIRS = PER / 2;
  const DU du;
  const DI di;
  const DF df;
  const int64_t NL = int64_t(hn::Lanes(du));
  const auto mask = hn::Set(du, ((1u << BITS) - 1u) * 0x00010001u);
  const int64_t ws = PAIRS * RB * NL;  // word stride of qh / ql within the row block
  // Groups hold 2, 4, 8, ... words: a group ends after word 1 of a quad (2 words) or word 3.
  const int64_t quads_per_group = a.wpg >= 4 ? a.wpg / 4 : 1;

  for (int64_t lg = 0; lg < a.nlg; ++lg) {
    if (r0 == 0) prefetch_part(a.ahead, a.ahead_bytes, lg, a.nlg);
    // Token i = 4 B + j of the lane group: its row at kq + i * kstride words.
    const uint8_t* kq = reinterpret_cast<const uint8_t*>(a.krows + lg * NL * a.kstride);
    const int64_t bs = 4 * a.kstride * 4;  // bytes from block B to block B + 1: four rows
    const uint32_t* qw = a.qh + r0 * a.npairs * NL;
    const uint32_t* qw2 = TWO ? a.ql + r0 * a.npairs * NL : qw;
    hn::Vec<DI> acc[RB], acc2[RB];
    for (int64_t g = 0; g < a.ng; ++g) {
      // The sums start at -h sum(qi): they end as qi . (c - h), exactly.
      for (int r = 0; r < RB; ++r) {
        acc[r] = hn::Set(di, -a.h1[(r0 + r) * a.ng + g]);
        acc2[r] = hn::Set(di, TWO ? -a.h2[(r0 + r) * a.ng + g] : 0);
      }
      const int64_t q0 = g * a.wpg / 4, q1 = a.wpg >= 4 ? q0 + quads_per_group : q0 + 1;
      // Two groups per quad (2-bit, group 32): this one has words 0-1 or 2-3 of it.
      const int k0 = a.wpg == 2 ? int(g & 1) * 2 : 0, k1 = a.wpg == 2 ? k0 + 2 : 4;
      for (int64_t q = q0; q < q1; ++q) {
        hn::Vec<DU> X[4];
        const uint8_t* kqq = kq + q * 16;
        const int64_t rb = a.kstride * 4;  // bytes per row
        Transpose4(LoadBlocks(du, kqq, bs), LoadBlocks(du, kqq + rb, bs), LoadBlocks(du, kqq + 2 * rb, bs),
                   LoadBlocks(du, kqq + 3 * rb, bs), X);
        // One word at a time (not unrolled: the code of a word is already RB x pairs long).
        for (int k = k0; k < k1; ++k) {
          const int64_t w = q * 4 + k;
          KWord<BITS, RB, TWO>(X[k], mask, qw + w * ws, qw2 + w * ws, NL, acc, acc2,
                               std::make_integer_sequence<int, PAIRS>{});
        }
      }
      // logit += s * (a qi . (c - h)) + (z + h s) * Q, in f32
      const auto S = hn::Load(df, a.ks + g * kTile + lg * NL);
      const auto Z = hn::Load(df, a.kz + g * kTile + lg * NL);
      for (int r = 0; r < RB; ++r) {
        const int64_t rr = r0 + r;
        auto v = hn::Mul(hn::ConvertTo(df, acc[r]), hn::Set(df, a.ah[rr]));
        if constexpr (TWO) v = hn::MulAdd(hn::ConvertTo(df, acc2[r]), hn::Set(df, a.al[rr]), v);
        float* xp = a.x + rr * kTile + lg * NL;
        const auto xv = g == 0 ? hn::Zero(df) : hn::Load(df, xp);
        hn::Store(hn::MulAdd(Z, hn::Set(df, a.cq[rr * a.ng + g]), hn::MulAdd(S, v, xv)), df, xp);
      }
    }
  }
}

using KFn = void (*)(const KArgs&, int64_t);

template <int BITS, bool TWO>
KFn k_kernel(int rb) {
  return rb == 4 ? &KLogits<BITS, 4, TWO> : rb == 2 ? &KLogits<BITS, 2, TWO> : &KLogits<BITS, 1, TWO>;
}

KFn k_kernel(int bits, int rb, bool two) {
  if (two) return bits == 2 ? k_kernel<2, true>(rb) : bits == 4 ? k_kernel<4, true>(rb) : k_kernel<8, true>(rb);
  return bits == 2 ? k_kernel<2, false>(rb) : bits == 4 ? k_kernel<4, false>(rb) : k_kernel<8, false>(rb);
}

template <int BITS, int RB>
HWY_NOINLINE void VAccum(const VArgs& a, int64_t r0) {
  constexpr int NE = kRunVectors<BITS>;
  const DV<BITS> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t NV = int64_t(hn::Lanes(df)), CE = NV * NE;  // elements per run
  const int64_t rb = a.row_bytes, run_bytes = CE * BITS / 8;
  for (int64_t c = 0; c < a.D / CE; ++c) {
    if (r0 == 0) prefetch_part(a.ahead, a.ahead_bytes, c, a.D / CE);
    const int64_t g = c * CE / a.G;
    V acc[RB][NE];
    float* o = a.O + r0 * a.D + c * CE;
    for (int r = 0; r < RB; ++r)
      for (int k = 0; k < NE; ++k) acc[r][k] = hn::Load(df, o + r * a.D + k * NV);
    const float* pg = a.P + (g * a.nrows + r0) * kTile;  // row r, token t: pg[r * kTile + t]
    const uint8_t* src = a.vrows + c * run_bytes;
    int64_t i = 0;
    // Two tokens per step: more independent work between the multiply-adds of one accumulator.
    for (; i + 2 <= a.tn; i += 2) {
      V e0[NE], e1[NE];
      UnpackV<BITS>(df, src + i * rb, e0);
      UnpackV<BITS>(df, src + (i + 1) * rb, e1);
      for (int r = 0; r < RB; ++r) {
        const V p0 = hn::Set(df, pg[r * kTile + i]), p1 = hn::Set(df, pg[r * kTile + i + 1]);
        for (int k = 0; k < NE; ++k) acc[r][k] = hn::MulAdd(p1, e1[k], hn::MulAdd(p0, e0[k], acc[r][k]));
      }
    }
    if (i < a.tn) {
      V e[NE];
      UnpackV<BITS>(df, src + i * rb, e);
      for (int r = 0; r < RB; ++r) {
        const V p = hn::Set(df, pg[r * kTile + i]);
        for (int k = 0; k < NE; ++k) acc[r][k] = hn::MulAdd(p, e[k], acc[r][k]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int k = 0; k < NE; ++k) hn::Store(acc[r][k], df, o + r * a.D + k * NV);
  }
}

// The integer kernel (f16 and bf16): the weights p of a tile, per (row, group), are rounded to
// int16 against the tile's largest (sigma = max |p| / 32767, error <= sigma / 2), and pairs of
// tokens are multiplied and added exactly in int32 (vpmaddwd); once per tile the sums are scaled
// by sigma into the f32 accumulators. Half the multiply-adds of the f32 kernel.
template <int BITS, int RB>
HWY_NOINLINE void VAccumI(const VArgs& a, int64_t r0) {
  constexpr int NE = kRunVectors<BITS>;
  const DV<BITS> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint32_t, decltype(df)> du;
  using VI = hn::Vec<decltype(di)>;
  constexpr int32_t h = 1 << (BITS - 1);
  static_assert(kTile <= 128, "the uncentred int32 sums of a tile must not overflow");
  const int64_t NV = int64_t(hn::Lanes(df)), CE = NV * NE;  // elements per run
  const int64_t rb = a.row_bytes, run_bytes = CE * BITS / 8;
  for (int64_t c = 0; c < a.D / CE; ++c) {
    if (r0 == 0) prefetch_part(a.ahead, a.ahead_bytes, c, a.D / CE);
    const int64_t g = c * CE / a.G;
    VI acc[RB][NE];
    for (int r = 0; r < RB; ++r)
      for (int k = 0; k < NE; ++k) acc[r][k] = hn::Zero(di);
    const int16_t* pg = a.Pi + (g * a.nrows + r0) * kTile;  // row r, token t: pg[r * kTile + t]
    const uint8_t* src = a.vrows + c * run_bytes;
    const auto step = [&](const uint8_t* s0, const uint8_t* s1, int64_t i) HWY_ATTR {
      VI e[NE];
      PairCodes<BITS>(di, s0, s1, e);
      for (int r = 0; r < RB; ++r) {
        uint32_t pp;
        std::memcpy(&pp, pg + r * kTile + i, 4);
        const auto pv = hn::Set(du, pp);
        for (int k = 0; k < NE; ++k) acc[r][k] = DotPairs(hn::BitCast(du, e[k]), pv, acc[r][k]);
      }
    };
    int64_t i = 0;
    for (; i + 2 <= a.tn; i += 2) step(src + i * rb, src + (i + 1) * rb, i);
    // (an odd last token pairs with itself, its partner's weight being 0)
    if (i < a.tn) step(src + i * rb, src + i * rb, i);
    float* o = a.O + r0 * a.D + c * CE;
    for (int r = 0; r < RB; ++r) {
      const auto sg = hn::Set(df, a.sig[g * a.nrows + r0 + r]);
      const int32_t ps = a.psum[g * a.nrows + r0 + r];
      for (int k = 0; k < NE; ++k) {
        // centred: sum p (c - h) = sum p c - h sum p, exactly in int32 (|sum p c| < 128 * 2^15 * 2^8)
        const int32_t hk = BITS == 8 ? h : h << (k * BITS);
        const auto centred = hn::Sub(acc[r][k], hn::Set(di, hk * ps));
        float* ok = o + r * a.D + k * NV;
        hn::Store(hn::MulAdd(sg, hn::ConvertTo(df, centred), hn::Load(df, ok)), df, ok);
      }
    }
  }
}

using VFn = void (*)(const VArgs&, int64_t);

template <int BITS, bool INT>
VFn v_kernel(int rb) {
  constexpr int R4 = v_rows(BITS) >= 4 ? 4 : 1;
  if constexpr (INT) return rb == 4 ? &VAccumI<BITS, R4> : rb == 2 ? &VAccumI<BITS, 2> : &VAccumI<BITS, 1>;
  return rb == 4 ? &VAccum<BITS, R4> : rb == 2 ? &VAccum<BITS, 2> : &VAccum<BITS, 1>;
}

VFn v_kernel(int bits, int rb, bool integer) {
  if (integer) return bits == 2 ? v_kernel<2, true>(rb) : bits == 4 ? v_kernel<4, true>(rb) : v_kernel<8, true>(rb);
  return bits == 2 ? v_kernel<2, false>(rb) : bits == 4 ? v_kernel<4, false>(rb) : v_kernel<8, false>(rb);
}

#if QSDPA_VNNI
#pragma GCC pop_options
#endif

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace qsdpa::detail::cpu
HWY_AFTER_NAMESPACE();

#endif  // QSDPA_CPU_SIMD_KERNELS_INL_H_
