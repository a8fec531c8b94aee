// The SIMD attention kernel (one task of kernel.hpp), written once with Google Highway and compiled
// for every instruction set in HWY_TARGETS (x86: SSE4, AVX2, AVX-512, AVX-512 with VNNI; Arm: NEON,
// SVE), the best one the machine has chosen at run time. The inner kernels are in
// simd_kernels-inl.h.
//
// The algebra. All query rows of the GQA group go together (each K/V byte is read once per task),
// tokens in tiles of kTile: scales and biases to f32, K logits, masks, online softmax, V.
//
// K, in token lanes. Each row's q is rounded once per task to int16 with a power-of-two row scale
// a = 2^(e-15) (amax = f 2^e): q ~ a qi, |qi| < 32768. Every f16 (bf16) element within 2^5 (2^8)
// of the row's largest is then exact; the others are off by at most a / 2. f32 inputs keep a
// second int16 piece for the residual, q ~ a (qi + qi2 / 2^14), to 2^-29 of max|q|: beyond f32's
// own rounding. The logit of group g,
//     q_g . k_g = s_g sum(q_g (c_g - h)) + (z_g + h s_g) sum(q_g),   h = 2^(bits-1),
// takes sum(qi (c - h)) as an exact int32 dot product (pairs of int16 multiplied and added:
// vpmaddwd, vpdpwssd with VNNI, smlal on Arm; the sum starts at -h sum(qi) so that the codes need
// no centring), and the affine map costs a few f32 operations per (token, group, row) instead of
// per element. Because the integer sums are exact and centred, the f32 cancellation that made the
// portable kernel dequantize first does not arise. The K rows of a tile are read in 16-byte
// pieces, one per 128-bit block, and turned with an in-block 4x4 transpose (lane i = token i):
// no horizontal sums.
//
// V, in element lanes. With the tile's softmax weights w_t and p = w s,
//     out = sum_t p_t (c_t - h) + sum_t w_t (z_t + h s_t),
// the second sum per group only. The codes are masked in place and offset by h (no shifts), in
// runs of at most 32 elements of one group whose order the accumulators undo once per task.
// f16 / bf16: p is rounded to int16 against the tile's largest |p| per (row, group) and pairs of
// tokens are multiplied and added exactly in int32, scaled once per tile into f32. f32: p times
// the codes in f32 multiply-adds. Centring keeps the f32 sums the size of the output, not of the
// cache's offset, for a cache quantized to its own range. Where the two sums cancel instead
// (values near zero whose codes sit far from h in a wide group, with a sharp softmax) the int16
// rounding comes back up to 2^bits times larger against the result: each row keeps an estimate
// of that error, and a task whose estimate passes half the SPEC's bound in some row runs
// again on f32 weights (Attend; measured on the development machine: the default decode shape
// never does, and those caches were up to 16x past the bound without it).
//
// The next tile's rows are prefetched a few lines at a time while this one is computed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/format.hpp"
#include "../core/half.hpp"
#include "kernel.hpp"

// SSSE3 adds little over the portable kernel and would cost one more compilation of this file.
// SVE's vectors are sizeless types, which the inner kernels' arrays of vectors cannot hold: Arm
// machines run the NEON kernel (tests/CMakeLists.txt compiles it for aarch64 where a cross
// compiler exists).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // AVX-512 with VNNI (Ice Lake, Zen 4 and later) as a target of its own
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd_kernel.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "cpu/simd_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qsdpa::detail::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* KernelTargetName() { return HWY_TARGET == HWY_SCALAR ? nullptr : hwy::TargetName(HWY_TARGET); }

#if HWY_TARGET == HWY_SCALAR

// One lane cannot hold the pairs of 16-bit values the K kernel multiplies: the portable kernel
// serves machines without SIMD.
bool Attend(const Plan&, const Task&) { return false; }
bool Micro(const MicroArgs&, int64_t) { return false; }

#else

// ---------------------------------------------------------------------------------------------
// The task
// ---------------------------------------------------------------------------------------------

// Carves aligned arrays out of one buffer; a first pass with no buffer measures it.
struct Carver {
  char* base = nullptr;
  size_t off = 0;
  template <class T>
  T* take(int64_t n) {
    off = (off + 63) & ~size_t(63);
    T* p = base ? reinterpret_cast<T*>(base + off) : nullptr;
    off += size_t(n) * sizeof(T);
    return p;
  }
};

struct Buffers {
  float* qf;         // [D] one row of q in f32
  int16_t *qi, *qi2;  // [Dp] its int16 pieces
  uint32_t *qh, *ql;  // the pairs of qi (qi2) per K row block, as KArgs::qh describes
  float *ah, *al, *cq;
  int32_t *h1, *h2;
  int64_t *pos, *lo, *mrow;
  char* bad;
  uint32_t* kbuf;  // a padded copy of a tile's K rows, where they cannot be read in place
  float *tmp, *ks, *kz, *vs, *vz, *x, *P, *zb, *O, *sig;
  float* noise;  // [row]: the integer kernel's rounding, sum of tn sigma^2 over tiles and groups
  int16_t* Pi;
  int32_t* psum;
};

template <class C>
Buffers carve(C& cv, int64_t nr, int64_t D, int64_t Dp, int64_t npairs, int64_t NL, bool two, int64_t ngk,
              int64_t ngv, int64_t wprp) {
  Buffers b;
  b.qf = cv.template take<float>(D);
  b.qi = cv.template take<int16_t>(Dp);
  b.qi2 = cv.template take<int16_t>(Dp);
  b.qh = cv.template take<uint32_t>(nr * npairs * NL);
  b.ql = cv.template take<uint32_t>(two ? nr * npairs * NL : 0);
  b.ah = cv.template take<float>(nr);
  b.al = cv.template take<float>(nr);
  b.h1 = cv.template take<int32_t>(nr * ngk);
  b.h2 = cv.template take<int32_t>(nr * ngk);
  b.cq = cv.template take<float>(nr * ngk);
  b.pos = cv.template take<int64_t>(nr);
  b.lo = cv.template take<int64_t>(nr);
  b.mrow = cv.template take<int64_t>(nr);
  b.bad = cv.template take<char>(nr);
  b.kbuf = cv.template take<uint32_t>(kTile * wprp);
  b.tmp = cv.template take<float>(2 * kTile * std::max(ngk, ngv));
  b.ks = cv.template take<float>(ngk * kTile);
  b.kz = cv.template take<float>(ngk * kTile);
  b.vs = cv.template take<float>(ngv * kTile);
  b.vz = cv.template take<float>(ngv * kTile);
  b.x = cv.template take<float>(nr * kTile);
  b.P = cv.template take<float>(nr * ngv * kTile);
  b.Pi = cv.template take<int16_t>(nr * ngv * kTile);
  b.sig = cv.template take<float>(nr * ngv);
  b.noise = cv.template take<float>(nr);
  b.psum = cv.template take<int32_t>(nr * ngv);
  b.zb = cv.template take<float>(nr * ngv * NL);
  b.O = cv.template take<float>(nr * D);
  return b;
}

// The tile's scales and biases ([tn, ng] of type T from row `row0`) as f32 [g][kTile], the
// biases made those of the codes centred on h (z + h s); the lanes past tn are zero. `tmp` holds
// [2, kTile, ng] floats (used by f32, and by more than 4 groups).
void tile_params(DType t, const void* sc, const void* bi, int64_t row0, int64_t tn, int64_t ng, int64_t nt,
                 float h, float* tmp, float* s_out, float* z_out) {
  const DF df;
  const int64_t NL = int64_t(hn::Lanes(df));
  if (t != DType::f32 && (ng == 1 || ng == 2 || ng == 4)) {
    // f16 / bf16 and 1, 2 or 4 groups: the halves are taken apart into groups and widened in
    // registers, with no f32 copy in between.
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const hn::RebindToUnsigned<DF> du32;
    const bool f16 = t == DType::f16;
    const auto widen = [&](hn::Vec<decltype(d16)> v) {
      return f16 ? hn::PromoteTo(df, hn::BitCast(dh, v)) : hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, v)));
    };
    const auto* s16 = static_cast<const uint16_t*>(sc) + row0 * ng;
    const auto* z16 = static_cast<const uint16_t*>(bi) + row0 * ng;
    const auto hv = hn::Set(df, h);
    int64_t i = 0;
    for (; i + NL <= tn; i += NL) {
      hn::Vec<decltype(d16)> S[4], Z[4];
      if (ng == 1) {
        S[0] = hn::LoadU(d16, s16 + i), Z[0] = hn::LoadU(d16, z16 + i);
      } else if (ng == 2) {
        hn::LoadInterleaved2(d16, s16 + i * 2, S[0], S[1]);
        hn::LoadInterleaved2(d16, z16 + i * 2, Z[0], Z[1]);
      } else {
        hn::LoadInterleaved4(d16, s16 + i * 4, S[0], S[1], S[2], S[3]);
        hn::LoadInterleaved4(d16, z16 + i * 4, Z[0], Z[1], Z[2], Z[3]);
      }
      for (int64_t g = 0; g < ng; ++g) {
        const auto sv = widen(S[g]);
        hn::Store(sv, df, s_out + g * kTile + i);
        hn::Store(hn::MulAdd(sv, hv, widen(Z[g])), df, z_out + g * kTile + i);
      }
    }
    for (; i < nt; ++i)  // the last lanes: tokens past tn are zero
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t j = i * ng + g;
        const float sv = i < tn ? (f16 ? f16_to_f32(s16[j]) : bf16_to_f32(s16[j])) : 0.0f;
        const float zv = i < tn ? (f16 ? f16_to_f32(z16[j]) : bf16_to_f32(z16[j])) : 0.0f;
        s_out[g * kTile + i] = sv;
        z_out[g * kTile + i] = zv + h * sv;  // h s is exact: h is a power of two
      }
    return;
  }
  const size_t ts = t == DType::f32 ? 4 : 2;
  float* ts_ = tmp;
  float* tz = tmp + kTile * ng;
  ToF32(t, static_cast<const char*>(sc) + size_t(row0 * ng) * ts, tn * ng, ts_);
  ToF32(t, static_cast<const char*>(bi) + size_t(row0 * ng) * ts, tn * ng, tz);
  std::fill(ts_ + tn * ng, ts_ + nt * ng, 0.0f);
  std::fill(tz + tn * ng, tz + nt * ng, 0.0f);
  const auto hv = hn::Set(df, h);
  for (int64_t i = 0; i < nt; i += NL) {
    if (ng == 1) {
      const auto S = hn::LoadU(df, ts_ + i), Z = hn::LoadU(df, tz + i);
      hn::Store(S, df, s_out + i);
      hn::Store(hn::MulAdd(S, hv, Z), df, z_out + i);
    } else if (ng == 2) {
      hn::Vec<DF> S0, S1, Z0, Z1;
      hn::LoadInterleaved2(df, ts_ + i * 2, S0, S1);
      hn::LoadInterleaved2(df, tz + i * 2, Z0, Z1);
      hn::Store(S0, df, s_out + i), hn::Store(S1, df, s_out + kTile + i);
      hn::Store(hn::MulAdd(S0, hv, Z0), df, z_out + i), hn::Store(hn::MulAdd(S1, hv, Z1), df, z_out + kTile + i);
    } else if (ng == 4) {
      hn::Vec<DF> S[4], Z[4];
      hn::LoadInterleaved4(df, ts_ + i * 4, S[0], S[1], S[2], S[3]);
      hn::LoadInterleaved4(df, tz + i * 4, Z[0], Z[1], Z[2], Z[3]);
      for (int g = 0; g < 4; ++g) {
        hn::Store(S[g], df, s_out + g * kTile + i);
        hn::Store(hn::MulAdd(S[g], hv, Z[g]), df, z_out + g * kTile + i);
      }
    } else {
      for (int64_t g = 0; g < ng; ++g)
        for (int64_t j = i; j < i + NL; ++j) {
          s_out[g * kTile + j] = ts_[j * ng + g];
          z_out[g * kTile + j] = tz[j * ng + g] + h * ts_[j * ng + g];
        }
    }
  }
}

// e^d for d <= 0 (-inf: 0; NaN stays NaN), to about 2e-7 relative, as 2^y with y = d log2(e):
// y = n + f with n = round(y), |f| <= 1/2, 2^f by Cephes' exp2f polynomial and 2^n in the
// exponent bits. Below 2^-126 (d < -87.3) the weight is 0, as it was nearly with hn::Exp (which
// gives 0 below -104): a weight that small adds nothing a row's sum can hold. About half the work
// of hn::Exp, which reduces against ln 2 in two pieces and scales by 2^n in two steps.
HWY_INLINE hn::Vec<DF> ExpNonPositive(DF df, hn::Vec<DF> d) {
  const hn::RebindToSigned<DF> di;
  // Max(lower, y): x86's maxps and Arm's fmax both return a NaN y.
  const auto y = hn::Max(hn::Set(df, -127.0f), hn::Mul(d, hn::Set(df, 1.44269504088896341f)));
  const auto n = hn::Round(y);
  const auto f = hn::Sub(y, n);
  auto p = hn::Set(df, 1.535336188319500e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.339887440266574e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618437357674640e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550332471162809e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.402264791363012e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931472028550421e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  // n in [-127, 0]: 2^n as exponent bits n + 127 (n = -127: the bits of 0).
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(df, e));
}

// One task with V on int16 weights (vint) or on f32 multiply-adds. With vint, *recheck is set
// when a row's estimated rounding error of the int16 weights is not small against its result
// (see the end); the caller then runs the task again without.
bool AttendWith(const Plan& pl, const Task& task, bool vint, bool* recheck) {
  const AttentionParams& p = *pl.p;
  const DU du;
  const DF df;
  const int64_t NL = int64_t(hn::Lanes(du));
  // The tile must hold whole lane groups of tokens, and the K transpose whole 128-bit blocks.
  if (NL < 4 || (NL & (NL - 1)) != 0 || kTile % NL != 0) return false;
  const int vb = p.v.format.bits;
  const int64_t NV = int64_t(vb == 2 ? hn::Lanes(DV<2>()) : vb == 4 ? hn::Lanes(DV<4>()) : hn::Lanes(DV<8>()));
  if ((NV & (NV - 1)) != 0) return false;

  // Tiles are runs of consecutive rows (token stride 1; a paged cache's tiles end at its pages);
  // other layouts take the portable kernel.
  if (pl.km.token_stride != 1 || pl.vm.token_stride != 1) return false;
  const int64_t D = p.D, Lq = p.Lq;
  const int64_t nr = task.r1 - task.r0;
  const int kb = p.k.format.bits;
  const int64_t kper = 32 / kb, wpr = D / kper, wprp = (wpr + 3) / 4 * 4, nquad = wprp / 4;
  const int64_t Dp = wprp * kper, npairs = Dp / 2;
  const int64_t ngk = D / p.k.format.group, ngv = D / p.v.format.group;
  const int64_t wpg = p.k.format.group / kper;
  const bool two = p.dtype == DType::f32;
  const DType T = p.dtype;

  thread_local std::vector<char> storage;
  Carver measure;
  carve(measure, nr, D, Dp, npairs, NL, two, ngk, ngv, wprp);
  if (storage.size() < measure.off + 64) storage.resize(measure.off + 64);
  Carver cv;
  cv.base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
  const Buffers bf = carve(cv, nr, D, Dp, npairs, NL, two, ngk, ngv, wprp);

  // ---- the rows: q in int16 pieces, positions, mask offsets, empty states
  const int32_t hk = 1 << (kb - 1);
  int64_t minpos = std::numeric_limits<int64_t>::max(), maxlo = 0;
  int64_t rb0 = 0, rbn = k_rows(nr, 0);  // the K row block of row r
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t hq = task.kvh * pl.rep + (task.r0 + r) / Lq, iq = (task.r0 + r) % Lq;
    const int64_t qoff = pl.qm.at(task.b, hq, iq);
    bf.pos[r] = iq < task.lq ? task.n - task.lq + iq : -1;  // -1: a padding row sees nothing
    bf.lo[r] = pl.window > 0 ? std::max<int64_t>(0, bf.pos[r] - pl.window + 1) : 0;
    bf.mrow[r] = (p.bool_mask || p.float_mask) ? pl.mm.at(task.b, hq, iq) : 0;
    minpos = std::min(minpos, bf.pos[r]);
    maxlo = std::max(maxlo, bf.lo[r]);
    task.m[r] = kNegInf;
    task.l[r] = 0.0f;
    bf.noise[r] = 0.0f;

    float amax = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      bf.qf[d] = load_f32(p.q, T, qoff + d);
      amax = std::max(amax, std::fabs(bf.qf[d]));
    }
    for (int64_t d = 0; d < D; ++d) amax = std::isnan(bf.qf[d]) ? bf.qf[d] : amax;
    bf.bad[r] = !std::isfinite(amax);
    // a = 2^(e - 15) with amax = f 2^e, f in [0.5, 1): |q / a| < 32768. A power of two keeps
    // q / a exact, and every f16 (bf16) element within 2^5 (2^8) of amax an exact integer: only
    // the small elements are rounded, by at most a / 2. (f32 keeps the residual, to a / 32768,
    // in the second piece.)
    int e = 0;
    if (!bf.bad[r] && amax > 0.0f) std::frexp(double(amax), &e);
    const double a = (bf.bad[r] || amax == 0.0f) ? 1.0 : std::ldexp(1.0, e - 15);
    for (int64_t d = 0; d < Dp; ++d) {
      const double v = (d < D && !bf.bad[r]) ? double(bf.qf[d]) / a : 0.0;
      const double hi = std::clamp(std::nearbyint(v), -32767.0, 32767.0);
      const double lo = two ? std::clamp(std::nearbyint((v - hi) * 16384.0), -16384.0, 16384.0) : 0.0;
      bf.qi[d] = int16_t(hi);
      bf.qi2[d] = int16_t(lo);
    }
    bf.ah[r] = float(double(pl.scale) * a);
    bf.al[r] = float(double(pl.scale) * a / 16384.0);
    const int64_t G = p.k.format.group;
    for (int64_t g = 0; g < ngk; ++g) {
      double qs = 0.0;
      int32_t s1 = 0, s2 = 0;
      for (int64_t d = g * G; d < (g + 1) * G; ++d) {
        qs += double(bf.qf[d]);
        s1 += bf.qi[d];
        s2 += bf.qi2[d];
      }
      bf.h1[r * ngk + g] = hk * s1;  // |h sum(qi)| < 2^7 * 2^7 * 2^15: no overflow
      bf.h2[r * ngk + g] = hk * s2;
      bf.cq[r * ngk + g] = bf.bad[r] ? 0.0f : float(double(pl.scale) * qs);
    }
    // Pair j of word w: elements w * per + j and w * per + j + per / 2, as the codes come out.
    if (r == rb0 + rbn) {
      rb0 = r;
      rbn = k_rows(nr, r);
    }
    for (int64_t i = 0; i < npairs; ++i) {
      const int64_t w = i / (kper / 2), j = i % (kper / 2);
      const int64_t d0 = w * kper + j, d1 = d0 + kper / 2;
      const uint32_t h = uint32_t(uint16_t(bf.qi[d0])) | (uint32_t(uint16_t(bf.qi[d1])) << 16);
      hn::Store(hn::Set(du, h), du, bf.qh + (rb0 * npairs + i * rbn + (r - rb0)) * NL);
      if (two) {
        const uint32_t l = uint32_t(uint16_t(bf.qi2[d0])) | (uint32_t(uint16_t(bf.qi2[d1])) << 16);
        hn::Store(hn::Set(du, l), du, bf.ql + (rb0 * npairs + i * rbn + (r - rb0)) * NL);
      }
    }
  }
  std::fill(bf.O, bf.O + nr * D, 0.0f);
  std::fill(bf.zb, bf.zb + nr * ngv * NL, 0.0f);

  const auto* bm8 = static_cast<const uint8_t*>(p.bool_mask);
  const auto* bm32 = static_cast<const uint32_t*>(p.bool_mask);
  const bool bm_u8 = p.bool_mask_type == BoolMaskType::u8;
  const bool masks = p.bool_mask || p.float_mask;
  const float hv = float(1 << (vb - 1));
  const int64_t vrow_bytes = D * vb / 8;

  KArgs ka{bf.kbuf, wprp,  0,     nquad, wpg,   ngk,   bf.qh, bf.ql, npairs, bf.ah,
           bf.al,   bf.h1, bf.h2, bf.cq, bf.ks, bf.kz, bf.x,  nullptr, 0};
  VArgs va{nullptr, vrow_bytes, 0, bf.P, bf.Pi, bf.sig, bf.psum, nr, p.v.format.group, D, bf.O, nullptr, 0};

  // The tile at ta: at most kTile tokens, none past the end of a page of K or V.
  const auto tile_len = [&](int64_t ta) {
    return std::min({kTile, task.t1 - ta, pl.km.page_rest(ta), pl.vm.page_rest(ta)});
  };
  // This tile's length and rows; the next tile's, found for its prefetch, become the next
  // iteration's (a paged cache reads its block table once per tile).
  int64_t tn = 0, krow = 0, vrow = 0, n1 = 0, krow1 = 0, vrow1 = 0;
  if (task.t0 < task.t1) {
    n1 = tile_len(task.t0);
    krow1 = pl.km.row(task.b, task.kvh, task.t0);
    vrow1 = pl.vm.row(task.b, task.kvh, task.t0);
  }
  for (int64_t ta = task.t0; ta < task.t1; ta += tn) {
    tn = n1, krow = krow1, vrow = vrow1;
    const int64_t nlg = (tn + NL - 1) / NL, nt = nlg * NL;

    // 0. the next tile: its scales and biases now, its K and V rows a part at a time inside the
    // kernels below (prefetch_part).
    n1 = ta + tn < task.t1 ? tile_len(ta + tn) : 0;
    krow1 = n1 > 0 ? pl.km.row(task.b, task.kvh, ta + tn) : 0;
    vrow1 = n1 > 0 ? pl.vm.row(task.b, task.kvh, ta + tn) : 0;
    ka.ahead = n1 > 0 ? reinterpret_cast<const char*>(p.k.packed + krow1 * wpr) : nullptr;
    ka.ahead_bytes = n1 * wpr * 4;
    va.ahead = n1 > 0 ? reinterpret_cast<const char*>(p.v.packed) + vrow1 * vrow_bytes : nullptr;
    va.ahead_bytes = n1 * vrow_bytes;
    if (n1 > 0) {
      const size_t ts = T == DType::f32 ? 4 : 2;
      for (const void* a : {p.k.scales, p.k.biases})
        prefetch_part(static_cast<const char*>(a) + size_t(krow1 * ngk) * ts, n1 * ngk * int64_t(ts), 0, 1);
      for (const void* a : {p.v.scales, p.v.biases})
        prefetch_part(static_cast<const char*>(a) + size_t(vrow1 * ngv) * ts, n1 * ngv * int64_t(ts), 0, 1);
    }

    // 1. the tile's K rows are read in place, or (a tile shorter than the lane groups, rows that
    // are not a whole number of 16-byte pieces) from a copy padded with the last row and zeros.
    if (tn == nt && wpr == wprp) {
      ka.krows = p.k.packed + krow * wpr;
      ka.kstride = wpr;
    } else {
      for (int64_t t = 0; t < nt; ++t) {
        uint32_t* dst = bf.kbuf + t * wprp;
        std::memcpy(dst, p.k.packed + (krow + std::min(t, tn - 1)) * wpr, size_t(wpr) * 4);
        std::fill(dst + wpr, dst + wprp, 0u);
      }
      ka.krows = bf.kbuf;
      ka.kstride = wprp;
    }
    tile_params(T, p.k.scales, p.k.biases, krow, tn, ngk, nt, float(hk), bf.tmp, bf.ks, bf.kz);

    // 2. logits
    ka.nlg = nlg;
    for (int64_t r = 0; r < nr; r += k_rows(nr, r)) k_kernel(kb, k_rows(nr, r), two)(ka, r);

    // 3. masks: hidden keys and the lanes past the tile are -inf
    const bool full = !masks && ta >= maxlo && ta + tn - 1 <= minpos;
    for (int64_t r = 0; r < nr; ++r) {
      float* x = bf.x + r * kTile;
      if (!full) {
        for (int64_t i = 0; i < tn; ++i) {
          const int64_t t = ta + i;
          bool vis = t >= bf.lo[r] && t <= bf.pos[r];
          if (vis && masks) {
            const int64_t mi = bf.mrow[r] + t;
            if (p.bool_mask && (bm_u8 ? bm8[mi] == 0 : bm32[mi] == 0)) vis = false;
            if (vis && p.float_mask) {
              const float fm = load_f32(p.float_mask, T, mi);
              if (fm == kNegInf) vis = false;
              x[i] += fm;
            }
          }
          if (!vis) x[i] = kNegInf;
        }
      }
      for (int64_t i = tn; i < nt; ++i) x[i] = kNegInf;
    }

    // 4. online softmax: the logits become weights
    for (int64_t r = 0; r < nr; ++r) {
      float* x = bf.x + r * kTile;
      auto mv = hn::Set(df, kNegInf);
      for (int64_t i = 0; i < nt; i += NL) mv = hn::Max(mv, hn::Load(df, x + i));
      const float mt = hn::GetLane(hn::MaxOfLanes(df, mv));
      if (bf.bad[r] || !(mt > kNegInf)) {  // nothing visible in this tile
        std::fill(x, x + nt, 0.0f);
        continue;
      }
      const float mnew = std::max(task.m[r], mt);
      if (mnew > task.m[r]) {
        if (task.m[r] > kNegInf) {
          const float s = std::exp(task.m[r] - mnew);
          task.l[r] *= s;
          const auto sv = hn::Set(df, s);
          float* o = bf.O + r * D;
          for (int64_t d = 0; d < D; d += NL) hn::Store(hn::Mul(hn::Load(df, o + d), sv), df, o + d);
          float* z = bf.zb + r * ngv * NL;
          for (int64_t d = 0; d < ngv * NL; d += NL) hn::Store(hn::Mul(hn::Load(df, z + d), sv), df, z + d);
          bf.noise[r] *= s * s;
        }
        task.m[r] = mnew;
      }
      const auto mb = hn::Set(df, mnew);
      auto sum = hn::Zero(df);
      for (int64_t i = 0; i < nt; i += NL) {
        const auto w = ExpNonPositive(df, hn::Sub(hn::Load(df, x + i), mb));
        hn::Store(w, df, x + i);
        sum = hn::Add(sum, w);
      }
      task.l[r] += hn::GetLane(hn::SumOfLanes(df, sum));
    }

    // 5. p = w s per (group, row, token) and the bias sums; a hidden key (w = 0) adds exactly
    // nothing, whatever its scale and bias hold. A tile no row sees is skipped.
    bool any = full;
    for (int64_t r = 0; r < nr && !any; ++r)
      for (int64_t i = 0; i < nt && !any; i += NL)
        any = !hn::AllTrue(df, hn::Eq(hn::Load(df, bf.x + r * kTile + i), hn::Zero(df)));
    if (!any) continue;
    tile_params(T, p.v.scales, p.v.biases, vrow, tn, ngv, nt, hv, bf.tmp, bf.vs, bf.vz);
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t g = 0; g < ngv; ++g) {
        float* pr = bf.P + (g * nr + r) * kTile;
        float* zr = bf.zb + (r * ngv + g) * NL;
        const float* xr = bf.x + r * kTile;
        const float* vsg = bf.vs + g * kTile;
        const float* vzg = bf.vz + g * kTile;
        auto z = hn::Load(df, zr);
        auto mx = hn::Zero(df);  // the largest |p|
        if (full) {  // every key seen: w > 0 or an underflow to 0, the scales and biases finite
          for (int64_t i = 0; i < nt; i += NL) {
            const auto w = hn::Load(df, xr + i);
            const auto pv = hn::Mul(w, hn::Load(df, vsg + i));
            hn::Store(pv, df, pr + i);
            mx = hn::Max(mx, hn::Abs(pv));
            z = hn::MulAdd(w, hn::Load(df, vzg + i), z);
          }
        } else {
          for (int64_t i = 0; i < nt; i += NL) {
            const auto w = hn::Load(df, xr + i);
            const auto seen = hn::Ne(w, hn::Zero(df));
            const auto pv = hn::IfThenElseZero(seen, hn::Mul(w, hn::Load(df, vsg + i)));
            hn::Store(pv, df, pr + i);
            mx = hn::Max(mx, hn::Abs(pv));
            z = hn::Add(z, hn::IfThenElseZero(seen, hn::Mul(w, hn::Load(df, vzg + i))));
          }
        }
        hn::Store(z, df, zr);
        if (vint) {  // p to int16 against the tile's largest |p|
          const float pmax = hn::GetLane(hn::MaxOfLanes(df, mx));
          const float inv = pmax > 0.0f ? 32767.0f / pmax : 0.0f;
          bf.sig[g * nr + r] = pmax > 0.0f ? pmax / 32767.0f : 0.0f;
          bf.noise[r] += float(tn) * bf.sig[g * nr + r] * bf.sig[g * nr + r];
          int16_t* pi = bf.Pi + (g * nr + r) * kTile;
          const hn::Rebind<int16_t, DF> d16;
          const hn::Rebind<int32_t, DF> d32;
          auto ps = hn::Zero(d32);
          for (int64_t i = 0; i < nt; i += NL) {
            const auto v = hn::NearestInt(hn::Mul(hn::Load(df, pr + i), hn::Set(df, inv)));  // |v| <= 32767
            ps = hn::Add(ps, v);
            hn::Store(hn::DemoteTo(d16, v), d16, pi + i);
          }
          bf.psum[g * nr + r] = hn::GetLane(hn::SumOfLanes(d32, ps));
        }
      }

    // 6. values
    va.vrows = reinterpret_cast<const uint8_t*>(p.v.packed) + vrow * vrow_bytes;
    va.tn = tn;
    for (int64_t r = 0; r < nr; r += v_rows(vb, nr, r)) v_kernel(vb, v_rows(vb, nr, r), vint)(va, r);
  }

  // ---- the states in natural order: o = sum w s (c - h) + the bias sums of each group
  const int64_t G = p.v.format.group;
  for (int64_t r = 0; r < nr; ++r) {
    float* o = task.o + r * D;
    if (bf.bad[r]) {  // a NaN or infinity in q: the row is NaN
      task.m[r] = 0.0f;
      task.l[r] = 1.0f;
      std::fill(o, o + D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (vb == 2) unpermute<2>(bf.O + r * D, D, o);
    else if (vb == 4) unpermute<4>(bf.O + r * D, D, o);
    else unpermute<8>(bf.O + r * D, D, o);
    for (int64_t g = 0; g < ngv; ++g) {
      const float z = hn::GetLane(hn::SumOfLanes(df, hn::Load(df, bf.zb + (r * ngv + g) * NL)));
      for (int64_t d = g * G; d < (g + 1) * G; ++d) o[d] += z;
    }
    if (vint && !*recheck) {
      // The int16 weights' rounding (at most sigma / 2 per weight, independent) puts an error of
      // variance <= tn sigma^2 / 12 h^2 on each element per tile and group (|c - h| <= h): over
      // the row, noise G h^2 / 12. For a cache quantized to its own range this estimate stays at
      // 0.1-0.2 of the SPEC's bound against the result (tests/test_cpu_simd.cpp), but it grows as
      // the codes' part and the biases' part cancel: values near zero whose codes sit far from h
      // in a wide group (tests/common/testutil.hpp, near_zero_values) went past the bound. A row
      // whose estimate exceeds half the bound sends the task to the f32 weights.
      const double h = double(1 << (vb - 1)), tol = T == DType::bf16 ? 1.6e-2 : 2e-3;
      const double est2 = double(bf.noise[r]) * double(G) * h * h / 12.0;
      double o2 = 0.0;
      for (int64_t d = 0; d < D; ++d) o2 += double(o[d]) * double(o[d]);
      if (est2 > 0.25 * tol * tol * o2) *recheck = true;
    }
  }
  return true;
}

bool Attend(const Plan& pl, const Task& task) {
  bool recheck = false;
  const bool vint = pl.p->dtype != DType::f32;  // V on int16 weights (f32 keeps f32 multiply-adds)
  if (!AttendWith(pl, task, vint, &recheck)) return false;
  if (recheck) {
    v_recheck_count().fetch_add(1, std::memory_order_relaxed);
    return AttendWith(pl, task, false, &recheck);
  }
  return true;
}

// The micro-benchmark hook (kernel.hpp): a synthetic tile of random codes and weights, built once
// per shape and thread, then one kernel run over it `reps` times.
struct MicroTile {
  int64_t key = -1;
  hwy::AlignedFreeUniquePtr<uint32_t[]> kbuf, qh, bytes;
  hwy::AlignedFreeUniquePtr<int32_t[]> h;
  hwy::AlignedFreeUniquePtr<float[]> f, kp, x, P, O;
};

bool Micro(const MicroArgs& m, int64_t reps) {
  static_assert(kMicroTokens == kTile);
  const DU du;
  const int64_t NL = int64_t(hn::Lanes(du));
  if (NL < 4 || (NL & (NL - 1)) != 0 || m.rows < 1) return false;
  const int64_t D = m.D, per = 32 / m.bits, wpr = D / per, wprp = (wpr + 3) / 4 * 4, npairs = wprp * per / 2;
  const int64_t ng = D / m.group, rows = m.rows;
  thread_local MicroTile st;
  const int64_t key = ((D * 256 + m.group) * 16 + m.bits) * 1024 + rows;
  const size_t nf = size_t(2 * rows + rows * ng);
  if (st.key != key) {
    st.key = key;
    uint32_t seed = 12345;
    auto rnd = [&]() { return seed = seed * 1664525u + 1013904223u; };
    auto fill = [&](auto& v, size_t n, auto f) {
      v = hwy::AllocateAligned<std::remove_reference_t<decltype(v[0])>>(n);
      for (size_t i = 0; i < n; ++i) v[i] = f(i);
    };
    fill(st.kbuf, size_t(kTile * wprp), [&](size_t) { return rnd(); });
    fill(st.qh, size_t(2 * rows * npairs * NL), [&](size_t) { return rnd() & 0x3fff3fffu; });
    fill(st.bytes, size_t(kTile * D * m.bits / 32), [&](size_t) { return rnd(); });
    fill(st.h, size_t(rows * ng), [&](size_t) { return int32_t(rnd() % 1000); });
    fill(st.f, nf, [&](size_t) { return float(rnd() % 1000) * 1e-3f; });
    fill(st.kp, size_t(2 * ng * kTile), [&](size_t) { return float(rnd() % 1000) * 1e-3f; });
    fill(st.x, size_t(rows * kTile), [&](size_t) { return 0.0f; });
    fill(st.P, size_t(rows * ng * kTile), [&](size_t) { return float(rnd() % 1000) * 1e-3f; });
    fill(st.O, size_t(rows * D), [&](size_t) { return 0.0f; });
  }
  const float* f = st.f.get();
  if (m.which == 0) {
    const KArgs ka{st.kbuf.get(), wprp, kTile / NL, wprp / 4, m.group / per, ng, st.qh.get(),
                   st.qh.get() + rows * npairs * NL, npairs, f, f + rows, st.h.get(), st.h.get(), f + 2 * rows,
                   st.kp.get(), st.kp.get() + ng * kTile, st.x.get(), nullptr, 0};
    for (int64_t i = 0; i < reps; ++i)
      for (int64_t r = 0; r < rows; r += k_rows(rows, r)) k_kernel(m.bits, k_rows(rows, r), m.f32)(ka, r);
  } else {
    const VArgs va{reinterpret_cast<const uint8_t*>(st.bytes.get()), D * m.bits / 8, kTile, st.P.get(),
                   reinterpret_cast<const int16_t*>(st.kbuf.get()), st.P.get(), st.h.get(), rows, m.group, D, st.O.get(), nullptr, 0};
    for (int64_t i = 0; i < reps; ++i)
      for (int64_t r = 0; r < rows; r += v_rows(m.bits, rows, r))
        v_kernel(m.bits, v_rows(m.bits, rows, r), !m.f32)(va, r);
  }
  return true;
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace qsdpa::detail::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qsdpa::detail::cpu {

HWY_EXPORT(Attend);
HWY_EXPORT(KernelTargetName);
HWY_EXPORT(Micro);

bool simd_micro(const MicroArgs& a, int64_t reps) { return HWY_DYNAMIC_DISPATCH(Micro)(a, reps); }

bool simd_attend(const Plan& pl, const Task& t) { return HWY_DYNAMIC_DISPATCH(Attend)(pl, t); }

std::string kernel_name() {
  if (kernel_choice() == KernelChoice::portable) return "portable";
  const char* n = HWY_DYNAMIC_DISPATCH(KernelTargetName)();
  return n ? n : "portable";
}

std::atomic<int64_t>& v_recheck_count() {
  static std::atomic<int64_t> n{0};
  return n;
}

int64_t simd_compiled_targets() { return HWY_TARGETS; }
int64_t simd_runnable_targets() { return hwy::SupportedTargets() & HWY_TARGETS; }

}  // namespace qsdpa::detail::cpu
#endif  // HWY_ONCE
