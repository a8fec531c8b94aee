// Test machinery for the serving layouts (CacheLayout, Strides, per-sequence lengths, append):
// a problem is generated densely (testutil.hpp's Problem), then laid out the way a server holds
// it — a cache with spare capacity, a token-major cache, a paged pool with shuffled pages,
// padded q / out rows, broadcast masks — with every byte the layout does not use poisoned (NaN
// scales and biases, NaN q, 0xff out), so that a backend reading or writing outside the layout
// fails. The same problem is handed to any backend through a pointer map (host: identity; CUDA:
// device copies).
#pragma once

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "../../src/core/layout.hpp"
#include "testutil.hpp"

namespace qsdpa::test {

enum class CacheKind { dense, capacity, token_major, paged };

inline const char* to_string(CacheKind k) {
  switch (k) {
    case CacheKind::dense: return "dense";
    case CacheKind::capacity: return "capacity";
    case CacheKind::token_major: return "token_major";
    case CacheKind::paged: return "paged";
  }
  return "?";
}

struct ServingCase {
  Case c;
  CacheKind kind = CacheKind::dense;
  int64_t page_size = 16;
  int64_t capacity_extra = 13;     // capacity: tokens beyond N allocated per head
  bool strided_q = false;          // q and out rows padded (l stride D + 32, ...)
  bool mask_broadcast_h = false;   // masks shared by all heads (h stride 0)
  bool shared_table = false;       // paged: K and V use one block table (else each its own)
  std::vector<int32_t> kv_lens;    // empty: N for all
  std::vector<int32_t> q_lens;     // empty: Lq for all

  std::string str() const {
    std::ostringstream o;
    o << c.str() << " cache=" << to_string(kind);
    if (kind == CacheKind::paged) o << "/" << page_size << (shared_table ? " shared-table" : "");
    if (strided_q) o << " strided_q";
    if (mask_broadcast_h) o << " mask_h0";
    if (!kv_lens.empty()) {
      o << " kv_lens=";
      for (auto n : kv_lens) o << n << ",";
    }
    if (!q_lens.empty()) {
      o << " q_lens=";
      for (auto n : q_lens) o << n << ",";
    }
    return o.str();
  }
};

// One cache (K or V) laid out in a pool.
struct LaidCache {
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
  std::vector<int32_t> block_table;
  CacheLayout layout;
};

// Copies the dense [B, Hkv, N] rows of `src` into a pool laid out as `kind` says.
// `table`: the block table to use (paged; nullptr: a new shuffle).
inline LaidCache lay_out(const HostCache& src, const ServingCase& sc, QuantFormat f, std::mt19937_64& rng,
                         const std::vector<int32_t>* table = nullptr) {
  const Case& c = sc.c;
  const int64_t wpr = c.D * f.bits / 32, gpr = c.D / f.group, ts = int64_t(tsize(c.dtype));
  LaidCache out;
  CacheLayout& l = out.layout;
  int64_t pool_rows = 0;
  switch (sc.kind) {
    case CacheKind::dense: pool_rows = c.B * c.Hkv * c.N; break;
    case CacheKind::capacity: {
      const int64_t cap = c.N + sc.capacity_extra;
      l.head_stride = cap;
      l.batch_stride = c.Hkv * cap + 8;  // and a gap between sequences
      pool_rows = c.B * l.batch_stride;
      break;
    }
    case CacheKind::token_major: {
      const int64_t cap = c.N + sc.capacity_extra;
      l.token_stride = c.Hkv;
      l.head_stride = 1;
      l.batch_stride = cap * c.Hkv;
      pool_rows = c.B * l.batch_stride;
      break;
    }
    case CacheKind::paged: {
      const int64_t ps = sc.page_size, per_seq = (c.N + ps - 1) / ps + 1;  // one spare entry
      const int64_t pages = c.B * per_seq + 3;                              // and spare pages
      std::vector<int32_t> ids(static_cast<size_t>(pages));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      out.block_table.assign(size_t(c.B * per_seq), -1);  // unused entries: invalid pages
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t i = 0; i < (c.N + ps - 1) / ps; ++i) out.block_table[size_t(b * per_seq + i)] = ids[size_t(b * per_seq + i)];
      if (table) out.block_table = *table;
      l.page_size = ps;
      l.block_table_stride = per_seq;
      l.block_table = out.block_table.data();
      pool_rows = pages * c.Hkv * ps;
      break;
    }
  }
  out.packed.resize(size_t(std::max<int64_t>(pool_rows, 1) * wpr));
  for (auto& w : out.packed) w = uint32_t(rng());
  out.scales.assign(size_t(std::max<int64_t>(pool_rows, 1) * gpr * ts), 0xff);  // NaN
  out.biases.assign(out.scales.size(), 0xff);
  // Where each row goes, written out per kind (not through the library's RowMap, which the tests
  // check).
  const int64_t cap = c.N + sc.capacity_extra;
  auto row_of = [&](int64_t b, int64_t h, int64_t t) -> int64_t {
    switch (sc.kind) {
      case CacheKind::dense: return (b * c.Hkv + h) * c.N + t;
      case CacheKind::capacity: return b * (c.Hkv * cap + 8) + h * cap + t;
      case CacheKind::token_major: return (b * cap + t) * c.Hkv + h;
      case CacheKind::paged: {
        const int64_t page = out.block_table[size_t(b * l.block_table_stride + t / sc.page_size)];
        return (page * c.Hkv + h) * sc.page_size + t % sc.page_size;
      }
    }
    return 0;
  };
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t n = sc.kv_lens.empty() ? c.N : sc.kv_lens[size_t(b)];
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t t = 0; t < n; ++t) {
        const int64_t from = (b * c.Hkv + h) * c.N + t, to = row_of(b, h, t);
        std::copy_n(src.packed.begin() + from * wpr, wpr, out.packed.begin() + to * wpr);
        std::copy_n(src.scales.begin() + from * gpr * ts, gpr * ts, out.scales.begin() + to * gpr * ts);
        std::copy_n(src.biases.begin() + from * gpr * ts, gpr * ts, out.biases.begin() + to * gpr * ts);
      }
  }
  return out;
}

// Maps a host buffer to the pointer a backend reads (host: itself; CUDA: a device copy).
using PtrMap = std::function<const void*(const void* host, size_t bytes)>;

struct ServingProblem {
  ServingCase sc;
  Problem dense;  // the problem with dense, contiguous tensors (and full masks)
  LaidCache k, v;
  std::vector<uint8_t> q, out, bool_mask, float_mask;
  Strides qs, os, ms;

  explicit ServingProblem(const ServingCase& s) : sc(s), dense(s.c) {
    std::mt19937_64 rng(s.c.seed * 7919 + 17);
    const Case& c = s.c;
    k = lay_out(dense.k, sc, c.kf, rng);
    v = lay_out(dense.v, sc, c.vf, rng, s.shared_table ? &k.block_table : nullptr);
    const int64_t ts = int64_t(tsize(c.dtype));
    // q and out: rows padded by 32 elements, heads by one row more, sequences by one more.
    if (s.strided_q) {
      qs.l = c.D + 32;
      qs.h = c.Lq * qs.l + 32;
      qs.b = c.Hq * qs.h + 32;
      os = qs;
    }
    const detail::ElemMap qm = detail::resolve_strides(qs, c.Hq, c.Lq, c.D);
    const int64_t qel = c.B * qm.b;
    q.assign(size_t(qel * ts), 0xff);  // NaN between the rows
    out.assign(size_t(qel * ts), 0xff);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Lq; ++i)
          std::copy_n(dense.q.begin() + ((b * c.Hq + h) * c.Lq + i) * c.D * ts, c.D * ts,
                      q.begin() + qm.at(b, h, i) * ts);
    // masks: broadcast over heads keeps head 0's mask, and the dense problem gets it everywhere
    if (s.mask_broadcast_h) {
      ms.h = 0;
      ms.b = c.Lq * c.N;
      ms.l = c.N;
      auto squeeze = [&](std::vector<uint8_t>& full, int64_t es) {
        if (full.empty()) return std::vector<uint8_t>();
        std::vector<uint8_t> one(size_t(c.B * c.Lq * c.N * es));
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t i = 0; i < c.Lq; ++i)
            std::copy_n(full.begin() + ((b * c.Hq + 0) * c.Lq + i) * c.N * es, c.N * es,
                        one.begin() + (b * c.Lq + i) * c.N * es);
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.Hq; ++h)
            for (int64_t i = 0; i < c.Lq; ++i)
              std::copy_n(one.begin() + (b * c.Lq + i) * c.N * es, c.N * es,
                          full.begin() + ((b * c.Hq + h) * c.Lq + i) * c.N * es);
        return one;
      };
      bool_mask = squeeze(dense.bool_mask, c.bool_mask == MaskKind::u32 ? 4 : 1);
      float_mask = squeeze(dense.float_mask, ts);
    } else {
      bool_mask = dense.bool_mask;
      float_mask = dense.float_mask;
    }
  }

  // The dense problem's parameters (the oracle's input), with the same lengths.
  AttentionParams dense_params() {
    AttentionParams p = dense.params(Backend::reference);
    p.kv_lens = sc.kv_lens.empty() ? nullptr : sc.kv_lens.data();
    p.q_lens = sc.q_lens.empty() ? nullptr : sc.q_lens.data();
    return p;
  }

  // The laid-out problem's parameters, every pointer through `map`.
  AttentionParams params(Backend b, const PtrMap& map) {
    AttentionParams p = dense.params(b);
    auto m = [&](const auto& vec) -> const void* {
      return vec.empty() ? nullptr : map(vec.data(), vec.size() * sizeof(vec[0]));
    };
    p.q = m(q);
    p.q_strides = qs;
    p.out_strides = os;
    p.mask_strides = ms;
    p.bool_mask = m(bool_mask);
    p.float_mask = m(float_mask);
    p.sinks = static_cast<const float*>(m(dense.sinks));
    for (auto [cache, lc] : {std::pair{&p.k, &k}, std::pair{&p.v, &v}}) {
      cache->packed = static_cast<const uint32_t*>(m(lc->packed));
      cache->scales = m(lc->scales);
      cache->biases = m(lc->biases);
      cache->layout = lc->layout;
      cache->layout.block_table = static_cast<const int32_t*>(m(lc->block_table));
    }
    if (sc.shared_table) p.v.layout.block_table = p.k.layout.block_table;
    p.kv_lens = static_cast<const int32_t*>(m(sc.kv_lens));
    p.q_lens = static_cast<const int32_t*>(m(sc.q_lens));
    p.out = nullptr;  // the caller sets it (host: out.data(); device: its buffer)
    return p;
  }

  // Checks `result` (the laid-out out buffer after the call) against the oracle run on the dense
  // problem: every row within the SPEC bound, padding rows (past q_lens) zero, and every byte
  // between the rows untouched.
  std::string check(const std::vector<uint8_t>& result) {
    const Case& c = sc.c;
    const int64_t ts = int64_t(tsize(c.dtype));
    AttentionParams dp = dense_params();
    std::vector<uint8_t> packed_out(size_t(c.B * c.Hq * c.Lq * c.D * ts));
    const detail::ElemMap om = detail::resolve_strides(os, c.Hq, c.Lq, c.D);
    std::vector<char> written(result.size(), 0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Lq; ++i) {
          const int64_t at = om.at(b, h, i) * ts;
          std::copy_n(result.begin() + at, c.D * ts, packed_out.begin() + ((b * c.Hq + h) * c.Lq + i) * c.D * ts);
          std::fill_n(written.begin() + at, c.D * ts, 1);
        }
    for (size_t i = 0; i < result.size(); ++i)
      if (!written[i] && result[i] != 0xff) return "byte " + std::to_string(i) + " outside the out rows was written";
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t lq = sc.q_lens.empty() ? c.Lq : sc.q_lens[size_t(b)];
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = lq; i < c.Lq; ++i)
          for (int64_t d = 0; d < c.D; ++d)
            if (detail::load_f32(packed_out.data(), c.dtype, ((b * c.Hq + h) * c.Lq + i) * c.D + d) != 0.0f)
              return "padding row b=" + std::to_string(b) + " h=" + std::to_string(h) + " i=" + std::to_string(i) +
                     " is not zero";
    }
    return check_against_reference(dp, packed_out.data());
  }
};

// The oracle of one decode step: `r` (host q, lengths and masks) on a contiguous [B, Hkv, N]
// cache quantized from all rows appended so far (rows[b * Hkv + h]: D floats per token, in order;
// zeros past a sequence's end, hidden by its length), checked against `out`.
inline std::string check_step_on_contiguous(AttentionParams r, QuantFormat kf, QuantFormat vf,
                                            const std::vector<std::vector<float>>& krows,
                                            const std::vector<std::vector<float>>& vrows, const void* out) {
  const DType t = r.dtype;
  const int64_t N = r.N, D = r.D, BH = r.B * r.Hkv, ts = int64_t(tsize(t));
  std::vector<uint8_t> kraw(size_t(BH * N * D * ts)), vraw(kraw.size());
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < int64_t(krows[size_t(bh)].size()) / D; ++i)
      for (int64_t d = 0; d < D; ++d) {
        detail::store_f32(kraw.data(), t, (bh * N + i) * D + d, krows[size_t(bh)][size_t(i * D + d)]);
        detail::store_f32(vraw.data(), t, (bh * N + i) * D + d, vrows[size_t(bh)][size_t(i * D + d)]);
      }
  HostCache kc = quantize_host(t, kf, BH * N, D, kraw), vc = quantize_host(t, vf, BH * N, D, vraw);
  r.k = {kf, kc.packed.data(), kc.scales.data(), kc.biases.data(), {}};
  r.v = {vf, vc.packed.data(), vc.scales.data(), vc.biases.data(), {}};
  return check_against_reference(r, out);
}

// A spread of serving cases over the layouts, lengths and formats (seeded, deterministic).
inline std::vector<ServingCase> serving_cases(bool large = false) {
  std::vector<ServingCase> v;
  const DType types[] = {DType::f16, DType::bf16, DType::f32};
  const QuantFormat fmts[][2] = {{{4, 64}, {4, 64}}, {{8, 64}, {4, 64}}, {{4, 32}, {8, 128}},
                                 {{8, 32}, {8, 32}}, {{2, 64}, {4, 128}}, {{4, 128}, {2, 32}}};
  const CacheKind kinds[] = {CacheKind::dense, CacheKind::capacity, CacheKind::token_major, CacheKind::paged};
  uint64_t seed = 100;
  int i = 0;
  for (CacheKind kind : kinds)
    for (int variant = 0; variant < 6; ++variant, ++i) {
      ServingCase s;
      s.kind = kind;
      s.c.dtype = types[i % 3];
      s.c.kf = fmts[i % 6][0];
      s.c.vf = fmts[i % 6][1];
      s.c.D = (variant % 3 == 0) ? 128 : (variant % 3 == 1) ? 64 : 256;
      if (s.c.D % s.c.kf.group != 0 || s.c.D % s.c.vf.group != 0) s.c.D = 128;
      s.c.Hkv = 2;
      s.c.Hq = (variant % 2) ? 8 : 4;
      s.c.B = 3;
      s.c.N = large ? 700 + 97 * variant : 150 + 37 * variant;
      s.c.Lq = variant == 4 ? 4 : variant == 5 ? 3 : 1;
      s.c.seed = seed++;
      s.page_size = 16 << (variant % 4);  // 16, 32, 64, 128
      s.shared_table = variant % 2 == 0;
      s.strided_q = variant % 2 == 1;
      s.c.sinks = variant == 2;
      s.c.window = variant == 3 ? 50 : 0;
      if (variant == 1) s.c.bool_mask = MaskKind::u8;
      if (variant == 4) s.c.float_mask = true, s.mask_broadcast_h = true;
      if (variant == 5) s.c.bool_mask = MaskKind::u32, s.mask_broadcast_h = true;
      if (variant >= 2) {  // per-sequence lengths: a short one, an empty one (where allowed), a full one
        const int32_t N = int32_t(s.c.N);
        s.kv_lens = {std::max<int32_t>(int32_t(s.c.Lq), 17), N, N / 2 + 1};
        if (variant >= 4) s.q_lens = {int32_t(s.c.Lq), 1, int32_t(s.c.Lq) - 1};
      }
      v.push_back(s);
    }
  return v;
}

}  // namespace qsdpa::test
