// The portable multithreaded CPU backend (SPEC sections 2-3).
//
// Work is split over (sequence, KV head, row block, token chunk). A row block holds the query
// rows of one GQA group (all rep = Hq / Hkv query heads that read the KV head, times all Lq rows):
// they are contiguous in q and out, and each K/V row read from the cache serves all of them.
// A group larger than a few tens of KiB of state is cut into several row blocks.
//
// Per task, tokens go in tiles of `kTile`:
//   1. for each token of the tile that some row sees, the K row is dequantized once into an f32
//      buffer and every visible row's logit is x = scale * (q . k) + float_mask;
//   2. each row's online-softmax state (softmax_state.hpp) takes the tile: new maximum, weights;
//   3. for each token some row weighs, the V row is dequantized once into an f32 buffer and added,
//      weighted, into every row's accumulator.
// When there are fewer (sequence, KV head, row block) units than the threads can keep busy, the
// token range is also cut into chunks whose partial states are merged in a second pass.
// Everything is accumulated in f32; out is rounded to T once, at the end.
//
// Why K is dequantized rather than folded (q . k = sum_g s_g (q_g . codes_g) + z_g sum(q_g)): both
// cost the same D multiply-adds per (token, row), but the folded form subtracts two large terms
// when a group's bias is large next to its spread, and in f32 it used up to 0.6 of the SPEC's f32
// error budget where the dequantized form stays near 0.14.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "../core/backends.hpp"
#include "../core/format.hpp"
#include "../core/half.hpp"
#include "softmax_state.hpp"
#include "thread_pool.hpp"

namespace qsdpa::detail {

namespace {

using cpu::SoftmaxState;
using cpu::ThreadPool;

constexpr int64_t kTile = 32;             // tokens per tile
constexpr int64_t kMinChunk = 64;         // fewest tokens worth a split-K chunk
constexpr int64_t kBlockFloats = 8192;    // rows per block: at most this many floats of o
constexpr int64_t kInlineWork = 1 << 18;  // below this many multiply-adds, stay on one thread
constexpr int64_t kTasksPerThread = 4;    // split so that each thread gets a few tasks

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

// Dequantizes row `row` (an index into [B, Hkv, N]) of a cache into D floats: s * code + z, with
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

// What every task of one attention call shares.
struct Plan {
  const AttentionParams* p;
  int64_t rep;      // query heads per KV head
  int64_t R;        // rows of a group: rep * Lq
  int64_t rb;       // rows per block
  int64_t nrb;      // row blocks per group
  int64_t units;    // B * Hkv * nrb
  int64_t nchunks;  // token chunks per unit (1: no split-K)
  float scale;
  int64_t window;   // the sliding window, 0 when it hides nothing
  float* partial;   // nchunks > 1: [units, nchunks, rb, D + 2] states (m, l, o)
};

// Per-thread scratch, grown as needed and kept for the next call.
struct Scratch {
  std::vector<float> q, o, m, l, x, w, kf, vt;
  std::vector<int64_t> lo, hi, mrow, live_idx;
  std::vector<char> live;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <class V>
void ensure(V& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}

// The rows [r0, r1) of the group of (b, kvh), keys [t0, t1): leaves the unnormalized states in
// s.m, s.l, s.o.
template <DType T>
void attend(const Plan& pl, int64_t b, int64_t kvh, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
            Scratch& s) {
  const AttentionParams& p = *pl.p;
  const int64_t D = p.D, N = p.N, Lq = p.Lq;
  const int64_t nr = r1 - r0;

  ensure(s.q, nr * D);
  ensure(s.o, nr * D);
  ensure(s.m, nr);
  ensure(s.l, nr);
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
  const int64_t qrow0 = (b * p.Hq + kvh * pl.rep) * Lq;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t qrow = qrow0 + r0 + r;
    float* qr = s.q.data() + r * D;
    for (int64_t d = 0; d < D; ++d) qr[d] = ld<T>(p.q, qrow * D + d);
    const int64_t pos = N - Lq + (r0 + r) % Lq;
    s.hi[size_t(r)] = pos;
    s.lo[size_t(r)] = pl.window > 0 ? std::max<int64_t>(0, pos - pl.window + 1) : 0;
    s.mrow[size_t(r)] = (p.bool_mask || p.float_mask) ? qrow * N : 0;  // offset into the masks
    SoftmaxState st{kNegInf, 0.0f, s.o.data() + r * D};
    st.reset(D);  // no key seen yet
    s.m[size_t(r)] = st.m;
    s.l[size_t(r)] = st.l;
  }

  const int64_t krow0 = (b * p.Hkv + kvh) * N;  // the group's first row in [B, Hkv, N]
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
          dequantize_row<T>(p.k, krow0 + t, D, s.kf.data());
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
      SoftmaxState st{s.m[size_t(r)], s.l[size_t(r)], s.o.data() + r * D};
      st.raise_max(mt, D);
      float sum = 0.0f;
      for (int64_t tt = 0; tt < tn; ++tt) {
        const float w = std::exp(x[tt] - st.m);  // hidden: exp(-inf) = 0
        x[tt] = w;
        sum += w;
        if (w != 0.0f) s.live[size_t(tt)] = 1;
      }
      s.m[size_t(r)] = st.m;
      s.l[size_t(r)] = st.l + sum;
    }

    // 3. weighted values: the V rows some row weighs are dequantized once into vt, then each
    // row's accumulator takes all of them, 16 floats at a time held in registers.
    int64_t nlive = 0;
    for (int64_t tt = 0; tt < tn; ++tt) {
      if (!s.live[size_t(tt)]) continue;
      dequantize_row<T>(p.v, krow0 + ta + tt, D, s.vt.data() + nlive * D);
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
      if (any) axpy_rows(w, s.vt.data(), nlive, D, s.o.data() + r * D);
    }
  }
}

// The query rows [r0, r1) of unit `u` and the tokens they can see at all.
struct UnitRange {
  int64_t b, kvh, r0, r1, tlo, thi;
};

UnitRange unit_range(const Plan& pl, int64_t u) {
  const AttentionParams& p = *pl.p;
  UnitRange ur;
  const int64_t blk = u % pl.nrb;
  const int64_t g = u / pl.nrb;
  ur.b = g / p.Hkv;
  ur.kvh = g % p.Hkv;
  ur.r0 = blk * pl.rb;
  ur.r1 = std::min(pl.R, ur.r0 + pl.rb);
  // Positions of the rows: row r sits at N - Lq + r % Lq.
  int64_t imin = p.Lq, imax = -1;
  if (ur.r1 - ur.r0 >= p.Lq) {
    imin = 0;
    imax = p.Lq - 1;
  } else {
    for (int64_t r = ur.r0; r < ur.r1; ++r) {
      imin = std::min(imin, r % p.Lq);
      imax = std::max(imax, r % p.Lq);
    }
  }
  const int64_t pmin = p.N - p.Lq + imin, pmax = p.N - p.Lq + imax;
  ur.tlo = pl.window > 0 ? std::max<int64_t>(0, pmin - pl.window + 1) : 0;
  ur.thi = std::max<int64_t>(ur.tlo, std::min(p.N, pmax + 1));
  return ur;
}

// Rounds the rows' states (scaled by their output factors) into out.
template <DType T>
void write_rows(const Plan& pl, const UnitRange& ur, const float* m, const float* l, const float* o,
                int64_t ostride) {
  const AttentionParams& p = *pl.p;
  const int64_t D = p.D;
  const int64_t qrow0 = (ur.b * p.Hq + ur.kvh * pl.rep) * p.Lq;
  for (int64_t r = ur.r0; r < ur.r1; ++r) {
    const int64_t i = r - ur.r0;
    const int64_t h = ur.kvh * pl.rep + r / p.Lq;
    const SoftmaxState st{m[i], l[i], nullptr};  // only m and l are read
    const float f = st.out_factor(p.sinks != nullptr, p.sinks ? p.sinks[h] : 0.0f);
    const float* orow = o + i * ostride;
    const int64_t base = (qrow0 + r) * D;
    for (int64_t d = 0; d < D; ++d) store_f32(p.out, T, base + d, orow[d] * f);
  }
}

// Phase 1: unit u, chunk c. Without split-K the task writes its rows of out; with it, the
// partial states.
template <DType T>
void phase1(const Plan& pl, int64_t task) {
  const int64_t u = task / pl.nchunks, c = task % pl.nchunks;
  const UnitRange ur = unit_range(pl, u);
  const int64_t span = ur.thi - ur.tlo;
  const int64_t t0 = ur.tlo + span * c / pl.nchunks, t1 = ur.tlo + span * (c + 1) / pl.nchunks;
  Scratch& s = scratch();
  attend<T>(pl, ur.b, ur.kvh, ur.r0, ur.r1, t0, t1, s);
  const int64_t nr = ur.r1 - ur.r0, D = pl.p->D;
  if (pl.nchunks == 1) {
    write_rows<T>(pl, ur, s.m.data(), s.l.data(), s.o.data(), D);
    return;
  }
  float* dst = pl.partial + (u * pl.nchunks + c) * pl.rb * (D + 2);
  for (int64_t r = 0; r < nr; ++r) {
    float* st = dst + r * (D + 2);
    st[0] = s.m[size_t(r)];
    st[1] = s.l[size_t(r)];
    std::copy(s.o.data() + r * D, s.o.data() + (r + 1) * D, st + 2);
  }
}

// Phase 2 (split-K only): merges the chunks of unit u in order and writes its rows of out.
template <DType T>
void phase2(const Plan& pl, int64_t u) {
  const UnitRange ur = unit_range(pl, u);
  const int64_t nr = ur.r1 - ur.r0, D = pl.p->D, stride = D + 2;
  float* base = pl.partial + u * pl.nchunks * pl.rb * stride;
  Scratch& s = scratch();
  ensure(s.m, nr);
  ensure(s.l, nr);
  ensure(s.o, nr * D);
  for (int64_t r = 0; r < nr; ++r) {
    SoftmaxState acc{kNegInf, 0.0f, s.o.data() + r * D};
    acc.reset(D);
    for (int64_t c = 0; c < pl.nchunks; ++c) {
      float* st = base + c * pl.rb * stride + r * stride;
      const SoftmaxState part{st[0], st[1], st + 2};
      acc.merge(part, D);
    }
    s.m[size_t(r)] = acc.m;
    s.l[size_t(r)] = acc.l;
  }
  write_rows<T>(pl, ur, s.m.data(), s.l.data(), s.o.data(), D);
}

template <DType T>
Status run_attention(const AttentionParams& p) {
  const int threads = cpu::resolve_threads(p.num_threads);
  Plan pl{};
  pl.p = &p;
  pl.rep = p.Hq / p.Hkv;
  pl.R = pl.rep * p.Lq;
  pl.rb = std::clamp<int64_t>(kBlockFloats / p.D, 1, pl.R);
  pl.nrb = (pl.R + pl.rb - 1) / pl.rb;
  pl.units = p.B * p.Hkv * pl.nrb;
  pl.scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(float(p.D));
  // A window of N or more hides nothing (every row sits at a position below N); treating it as
  // no window also keeps `pos - window` far from overflow.
  pl.window = p.window < p.N ? p.window : 0;

  // The longest token range of a group (the rows of one group see at most these keys).
  const int64_t span = pl.window > 0 ? std::min(p.N, pl.window + p.Lq - 1) : p.N;
  const double work = double(p.B * p.Hq * p.Lq) * double(std::max<int64_t>(span, 1)) * double(p.D);
  const int use = work < double(kInlineWork) ? 1 : threads;
  pl.nchunks = 1;
  if (use > 1 && pl.units < kTasksPerThread * use) {
    const int64_t want = (kTasksPerThread * use + pl.units - 1) / pl.units;
    pl.nchunks = std::clamp<int64_t>(span / kMinChunk, 1, want);
  }

  std::vector<float> partial;
  if (pl.nchunks > 1) {
    partial.resize(size_t(pl.units * pl.nchunks * pl.rb * (p.D + 2)));
    pl.partial = partial.data();
  }
  ThreadPool& pool = ThreadPool::global();
  bool ok = pool.parallel_for(use, pl.units * pl.nchunks, [&](int64_t t) { phase1<T>(pl, t); });
  if (ok && pl.nchunks > 1) ok = pool.parallel_for(use, pl.units, [&](int64_t u) { phase2<T>(pl, u); });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

// Rows per quantizer task: enough that a task is worth waking a thread for.
int64_t rows_per_task(int64_t rows, int64_t dim, int threads) {
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1));
  const int64_t even = (rows + int64_t(threads) * kTasksPerThread - 1) / (int64_t(threads) * kTasksPerThread);
  return std::max(min_rows, even);
}

}  // namespace

Status cpu_attention(const AttentionParams& p) {
  if (p.num_threads < 0)
    return make_status(StatusCode::invalid_argument,
                       "num_threads (" + std::to_string(p.num_threads) + ") is negative: use 0 for all hardware threads",
                       Backend::cpu);
  try {
    switch (p.dtype) {
      case DType::f32: return run_attention<DType::f32>(p);
      case DType::f16: return run_attention<DType::f16>(p);
      case DType::bf16: return run_attention<DType::bf16>(p);
    }
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::backend_error, "cpu backend: out of memory", Backend::cpu);
  } catch (const std::exception& e) {
    return make_status(StatusCode::backend_error, std::string("cpu backend: ") + e.what(), Backend::cpu);
  }
  return make_status(StatusCode::unsupported, "cpu backend: dtype is not supported", Backend::cpu);
}

Status cpu_quantize(const QuantizeParams& p) {
  const int threads = cpu::resolve_threads(0);
  const int64_t per = rows_per_task(p.rows, p.dim, threads);
  const int64_t tasks = (p.rows + per - 1) / per;
  const bool ok = ThreadPool::global().parallel_for(threads, tasks, [&](int64_t t) {
    host_quantize_rows(p, t * per, std::min(p.rows, (t + 1) * per));
  });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

Status cpu_dequantize(const DequantizeParams& p) {
  const int threads = cpu::resolve_threads(0);
  const int64_t per = rows_per_task(p.rows, p.dim, threads);
  const int64_t tasks = (p.rows + per - 1) / per;
  const bool ok = ThreadPool::global().parallel_for(threads, tasks, [&](int64_t t) {
    host_dequantize_rows(p, t * per, std::min(p.rows, (t + 1) * per));
  });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

}  // namespace qsdpa::detail
