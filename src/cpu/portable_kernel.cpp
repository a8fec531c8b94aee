// The portable attention kernel: plain loops that any compiler vectorizes a little, on any
// machine. It is the CPU backend's fallback (and its second opinion in tests); the SIMD kernel
// (simd_kernel.cpp) is what runs where Highway has an instruction set.
//
// Per task, tokens go in tiles of `kTile`:
//   1. for each token of the tile that some row sees, the K row is dequantized once into an f32
//      buffer and every visible row's logit is x = scale * (q . k) + float_mask;
//   2. each row's online-softmax state (softmax_state.hpp) takes the tile: new maximum, weights;
//   3. for each token some row weighs, the V row is dequantized once into an f32 buffer and added,
//      weighted, into every row's accumulator.
// Everything is accumulated in f32.
//
// Why K is dequantized rather than folded (q . k = sum_g s_g (q_g . codes_g) + z_g sum(q_g)): in
// f32 both cost the same D multiply-adds per (token, row), but the folded form subtracts two large
// terms when a group's bias is large next to its spread, and it used up to 0.6 of the SPEC's f32
// error budget where the dequantized form stays near 0.14. (The SIMD kernel folds with exact
// integer dot products instead, where that concern does not arise.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../core/format.hpp"
#include "../core/half.hpp"
#include "kernel.hpp"
#include "softmax_state.hpp"

namespace qsdpa::detail::cpu {

namespace {

constexpr int64_t kTile = 32;  // tokens per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <DType T>
inline float ld(const void* p, int64_t i) {
  return load_f32(p, T, i);
}

// a . b over D floats (D a multiple of 32), in 16 independent partial sums so that the compiler
// can keep them in vector registers without reassociating anything itself.
inline float dot(const float* a, const float* b, int64_t D) {
  constexpr int L = 16;
  float acc[L] = {};
  for (int64_t d = 0; d < D; d += L)
    for (int j = 0; j < L; ++j) acc[j] += a[d + j] * b[d + j];
  float half[L / 2];
  for (int j = 0; j < L / 2; ++j) half[j] = acc[j] + acc[j + L / 2];
  float quarter[L / 4];
  for (int j = 0; j < L / 4; ++j) quarter[j] = half[j] + half[j + L / 4];
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// o[0..D) += sum_j w[j] * v[j * D .. (j + 1) * D), the rows of v taken in order.
inline void axpy_rows(const float* w, const float* v, int64_t rows, int64_t D, float* o) {
  constexpr int L = 16;
  for (int64_t d = 0; d < D; d += L) {
    float acc[L];
    for (int k = 0; k < L; ++k) acc[k] = o[d + k];
    for (int64_t j = 0; j < rows; ++j) {
      const float wj = w[j];
      const float* vj = v + j * D + d;
      for (int k = 0; k < L; ++k) acc[k] += wj * vj[k];
    }
    for (int k = 0; k < L; ++k) o[d + k] = acc[k];
  }
}

// Dequantizes row `row` (the layout's row of a (sequence, head, token)) of a cache into D floats: s * code + z, with
// the codes unpacked low bits first (SPEC section 2).
template <DType T, int BITS>
void dequantize_row_t(const KVCache& c, int64_t row, int64_t D, float* out) {
  constexpr int per = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1u;
  const int64_t G = c.format.group, ng = D / G, wpg = G / per;  // words per group
  const uint32_t* words = c.packed + row * (D / per);
  for (int64_t g = 0; g < ng; ++g) {
    const float sc = ld<T>(c.scales, row * ng + g), z = ld<T>(c.biases, row * ng + g);
    for (int64_t w = 0; w < wpg; ++w) {
      const uint32_t word = words[g * wpg + w];
      float* o = out + (g * wpg + w) * per;
      for (int k = 0; k < per; ++k) o[k] = sc * float((word >> (k * BITS)) & mask) + z;
    }
  }
}

template <DType T>
void dequantize_row(const KVCache& c, int64_t row, int64_t D, float* out) {
  switch (c.format.bits) {
    case 2: dequantize_row_t<T, 2>(c, row, D, out); return;
    case 4: dequantize_row_t<T, 4>(c, row, D, out); return;
    default: dequantize_row_t<T, 8>(c, row, D, out); return;
  }
}

// Per-thread scratch, grown as needed and kept for the next call.
struct Scratch {
  std::vector<float> q, x, w, kf, vt;
  std::vector<int64_t> lo, hi, mrow, live_idx;
  std::vector<char> live;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <DType T>
void attend(const Plan& pl, const Task& task) {
  const AttentionParams& p = *pl.p;
  const int64_t D = p.D, Lq = p.Lq;
  const int64_t b = task.b, kvh = task.kvh, r0 = task.r0, t0 = task.t0, t1 = task.t1;
  const int64_t nr = task.r1 - task.r0;
  Scratch& s = scratch();

  ensure(s.q, nr * D);
  ensure(s.x, nr * kTile);
  ensure(s.kf, D);
  ensure(s.w, kTile);
  ensure(s.vt, kTile * D);
  ensure(s.live_idx, kTile);
  ensure(s.lo, nr);
  ensure(s.hi, nr);
  ensure(s.mrow, nr);
  ensure(s.live, kTile);

  // The group's rows are contiguous in q: row r of the group is query head kvh * rep + r / Lq,
  // query row r % Lq.
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t h = kvh * pl.rep + (r0 + r) / Lq, i = (r0 + r) % Lq;
    float* qr = s.q.data() + r * D;
    const int64_t qoff = pl.qm.at(b, h, i);
    for (int64_t d = 0; d < D; ++d) qr[d] = ld<T>(p.q, qoff + d);
    const int64_t pos = i < task.lq ? task.n - task.lq + i : -1;  // -1: a padding row sees nothing
    s.hi[size_t(r)] = pos;
    s.lo[size_t(r)] = pl.window > 0 ? std::max<int64_t>(0, pos - pl.window + 1) : 0;
    s.mrow[size_t(r)] = (p.bool_mask || p.float_mask) ? pl.mm.at(b, h, i) : 0;  // offset into the masks
    SoftmaxState st{kNegInf, 0.0f, task.o + r * D};
    st.reset(D);  // no key seen yet
    task.m[r] = st.m;
    task.l[r] = st.l;
  }

  const auto* bm8 = static_cast<const uint8_t*>(p.bool_mask);
  const auto* bm32 = static_cast<const uint32_t*>(p.bool_mask);
  const bool bm_u8 = p.bool_mask_type == BoolMaskType::u8;
  const float scale = pl.scale;

  for (int64_t ta = t0; ta < t1; ta += kTile) {
    const int64_t tn = std::min(kTile, t1 - ta);

    // 1. logits of the tile; hidden keys are -inf.
    for (int64_t tt = 0; tt < tn; ++tt) {
      const int64_t t = ta + tt;
      bool have_k = false;
      for (int64_t r = 0; r < nr; ++r) {
        float& x = s.x[size_t(r * kTile + tt)];
        x = kNegInf;
        if (t < s.lo[size_t(r)] || t > s.hi[size_t(r)]) continue;
        const int64_t mi = s.mrow[size_t(r)] + t;
        if (p.bool_mask && (bm_u8 ? bm8[mi] == 0 : bm32[mi] == 0)) continue;
        float fm = 0.0f;
        if (p.float_mask) {
          fm = ld<T>(p.float_mask, mi);
          if (fm == kNegInf) continue;
        }
        if (!have_k) {
          dequantize_row<T>(p.k, pl.km.row(b, kvh, t), D, s.kf.data());
          have_k = true;
        }
        x = scale * dot(s.q.data() + r * D, s.kf.data(), D) + fm;
      }
    }

    // 2. online softmax over the tile: the logits become weights.
    std::fill(s.live.begin(), s.live.begin() + tn, char(0));
    for (int64_t r = 0; r < nr; ++r) {
      float* x = s.x.data() + r * kTile;
      float mt = kNegInf;
      for (int64_t tt = 0; tt < tn; ++tt) mt = std::max(mt, x[tt]);
      if (mt == kNegInf) {  // no visible key for this row in this tile: all weights 0
        std::fill(x, x + tn, 0.0f);
        continue;
      }
      SoftmaxState st{task.m[r], task.l[r], task.o + r * D};
      st.raise_max(mt, D);
      float sum = 0.0f;
      for (int64_t tt = 0; tt < tn; ++tt) {
        const float w = std::exp(x[tt] - st.m);  // hidden: exp(-inf) = 0
        x[tt] = w;
        sum += w;
        if (w != 0.0f) s.live[size_t(tt)] = 1;
      }
      task.m[r] = st.m;
      task.l[r] = st.l + sum;
    }

    // 3. weighted values: the V rows some row weighs are dequantized once into vt, then each
    // row's accumulator takes all of them, 16 floats at a time held in registers.
    int64_t nlive = 0;
    for (int64_t tt = 0; tt < tn; ++tt) {
      if (!s.live[size_t(tt)]) continue;
      dequantize_row<T>(p.v, pl.vm.row(b, kvh, ta + tt), D, s.vt.data() + nlive * D);
      s.live_idx[size_t(nlive++)] = tt;
    }
    if (nlive == 0) continue;
    for (int64_t r = 0; r < nr; ++r) {
      const float* x = s.x.data() + r * kTile;
      float* w = s.w.data();
      bool any = false;
      for (int64_t j = 0; j < nlive; ++j) {
        w[j] = x[s.live_idx[size_t(j)]];
        any |= w[j] != 0.0f;
      }
      if (any) axpy_rows(w, s.vt.data(), nlive, D, task.o + r * D);
    }
  }
}

}  // namespace

void portable_attend(const Plan& pl, const Task& t) {
  switch (pl.p->dtype) {
    case DType::f32: attend<DType::f32>(pl, t); return;
    case DType::f16: attend<DType::f16>(pl, t); return;
    case DType::bf16: attend<DType::bf16>(pl, t); return;
  }
}

}  // namespace qsdpa::detail::cpu
