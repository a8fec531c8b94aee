// Problem data for the qsdpa program: K/V caches that look like real activations, quantized with
// qsdpa::quantize, Gaussian queries, and masks and sinks when asked for.
//
// Every value is a pure function of (seed, tensor, row), so a row can be made again later (the
// accuracy check rebuilds the unquantized rows of the heads it compares) without keeping the
// unquantized cache in memory.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>

#include "common.hpp"
#include "core/half.hpp"

namespace qsdpa_cli {

namespace {

using qsdpa::detail::store_f32;

// Stream tags: each tensor draws from its own random stream.
enum Tag : uint64_t { tag_q = 1, tag_k = 2, tag_v = 3, tag_kstat = 4, tag_vstat = 5, tag_sink = 6, tag_mask = 7 };

uint64_t mix(uint64_t x) {  // the splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b = 0) {
  return mix(mix(mix(seed ^ (tag << 56)) ^ a) + b);
}

// 65536 quantiles of the standard normal distribution at (i + 0.5) / 65536: one 16-bit random
// chunk picks a Gaussian value (tails to about 4.3 sigma), four per 64-bit draw. Much faster
// than Box-Muller, which matters when a cache holds a billion values.
const float* gauss_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (int i = 0; i < 32768; ++i) {
      const double p = (i + 0.5) / 65536.0;  // lower half; the upper half by symmetry
      double lo = -10.0, hi = 0.0;
      for (int it = 0; it < 60; ++it) {  // bisection on Phi(x) = erfc(-x / sqrt 2) / 2
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[size_t(i)] = float(0.5 * (lo + hi));
      t[size_t(65535 - i)] = -t[size_t(i)];
    }
    return t;
  }();
  return table.data();
}

struct Rng {
  uint64_t state;
  uint64_t bits = 0;
  int left = 0;
  explicit Rng(uint64_t s) : state(s) {}
  uint64_t next() { return mix(state += 0x9e3779b97f4a7c15ull); }
  float gauss() {
    if (left == 0) {
      bits = next();
      left = 4;
    }
    const float g = gauss_table()[bits & 0xffffu];
    bits >>= 16;
    --left;
    return g;
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// Per-channel statistics of K and V for each KV head. Keys of trained models have a few channels
// of much larger magnitude in every head; we give D/32 channels of each head 10x the scale. Every
// channel has its own offset and a scale spread around 1. (The outliers are what makes 4-bit
// keys costly: they widen the range of their group, and so the step, for the other channels.)
struct ChannelStats {
  std::vector<float> k_mu, k_sigma, v_mu, v_sigma;  // [Hkv, D]
};

ChannelStats channel_stats(const Shape& s, uint64_t seed) {
  ChannelStats c;
  const size_t n = size_t(s.Hkv * s.D);
  c.k_mu.resize(n), c.k_sigma.resize(n), c.v_mu.resize(n), c.v_sigma.resize(n);
  for (int64_t h = 0; h < s.Hkv; ++h) {
    Rng rk(hash(seed, tag_kstat, uint64_t(h))), rv(hash(seed, tag_vstat, uint64_t(h)));
    std::vector<int64_t> order(size_t(s.D));
    for (int64_t d = 0; d < s.D; ++d) order[size_t(d)] = d;
    const int64_t outliers = std::max<int64_t>(1, s.D / 32);
    for (int64_t i = 0; i < outliers; ++i)  // partial Fisher-Yates: the first `outliers` entries
      std::swap(order[size_t(i)], order[size_t(i + int64_t(rk.uniform() * double(s.D - i)))]);
    for (int64_t d = 0; d < s.D; ++d) {
      const size_t j = size_t(h * s.D + d);
      c.k_sigma[j] = std::exp(0.25f * rk.gauss());
      c.k_mu[j] = 0.5f * rk.gauss();
      c.v_sigma[j] = std::exp(0.25f * rv.gauss());
      c.v_mu[j] = 0.2f * rv.gauss();
    }
    for (int64_t i = 0; i < outliers; ++i) {
      const size_t j = size_t(h * s.D + order[size_t(i)]);
      c.k_sigma[j] *= 10.0f;
    }
  }
  return c;
}

// Row `row` of [B, Hkv, N] of K or V, unquantized, in f32 (not yet rounded to T).
void gen_kv_row(const Shape& s, const ChannelStats& c, uint64_t seed, char which, int64_t row,
                float* out) {
  const int64_t kvh = (row / std::max<int64_t>(s.N, 1)) % s.Hkv;
  const float* mu = (which == 'k' ? c.k_mu : c.v_mu).data() + kvh * s.D;
  const float* sg = (which == 'k' ? c.k_sigma : c.v_sigma).data() + kvh * s.D;
  Rng r(hash(seed, which == 'k' ? tag_k : tag_v, uint64_t(row)));
  for (int64_t d = 0; d < s.D; ++d) out[d] = mu[d] + sg[d] * r.gauss();
}

// Left padding of sequence b (hidden by the masks): up to N/8 tokens, never the last Lq.
int64_t pad_of(const Shape& s, uint64_t seed, int64_t b) {
  const int64_t room = std::max<int64_t>(0, std::min(s.N / 8, s.N - s.Lq));
  return room > 0 ? int64_t(hash(seed, tag_mask, uint64_t(b)) % uint64_t(room + 1)) : 0;
}

// Quantizes one cache (K or V) in chunks of rows on all threads.
Status make_cache(const Shape& s, uint64_t seed, const ChannelStats& c, char which,
                  std::vector<uint32_t>* packed, std::vector<uint8_t>* scales,
                  std::vector<uint8_t>* biases) {
  const int bits = which == 'k' ? s.k_bits : s.v_bits;
  const size_t ts = qsdpa::dtype_size(s.dtype);
  const int64_t rows = s.kv_rows(), words = s.D * bits / 32, groups = s.D / s.group;
  packed->assign(size_t(rows * words), 0u);
  scales->assign(size_t(rows * groups) * ts, 0);
  biases->assign(size_t(rows * groups) * ts, 0);
  constexpr int64_t chunk = 256;
  std::mutex mu;
  Status first;
  parallel_for((rows + chunk - 1) / chunk, [&](int64_t c0, int64_t c1) {
    std::vector<float> row(size_t(s.D));
    std::vector<uint8_t> w(size_t(chunk * s.D) * ts);
    for (int64_t ci = c0; ci < c1; ++ci) {
      const int64_t r0 = ci * chunk, r1 = std::min(rows, r0 + chunk);
      for (int64_t r = r0; r < r1; ++r) {
        gen_kv_row(s, c, seed, which, r, row.data());
        for (int64_t d = 0; d < s.D; ++d) store_f32(w.data(), s.dtype, (r - r0) * s.D + d, row[size_t(d)]);
      }
      qsdpa::QuantizeParams qp;
      qp.dtype = s.dtype;
      qp.format = {bits, s.group};
      qp.rows = r1 - r0;
      qp.dim = s.D;
      qp.w = w.data();
      qp.packed = packed->data() + r0 * words;
      qp.scales = scales->data() + size_t(r0 * groups) * ts;
      qp.biases = biases->data() + size_t(r0 * groups) * ts;
      qp.backend = Backend::reference;  // the plain host quantizer; we thread it ourselves
      const Status st = qsdpa::quantize(qp);
      if (!st) {
        std::lock_guard<std::mutex> lock(mu);
        if (first) first = st;
        return;
      }
    }
  });
  return first;
}

}  // namespace

// ---- Shape ----------------------------------------------------------------------------------

float Shape::effective_scale() const { return scale > 0.0f ? scale : float(1.0 / std::sqrt(double(D))); }

std::string Shape::describe() const {
  std::ostringstream o;
  o << "B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Lq=" << Lq << " N=" << N << " D=" << D;
  if (k_bits == v_bits)
    o << " " << k_bits << "-bit";
  else
    o << " K" << k_bits << "/V" << v_bits;
  o << " g" << group << " " << qsdpa::to_string(dtype);
  if (window) o << " window=" << window;
  if (sinks) o << " sinks";
  if (!bool_mask.empty()) o << " bool-mask=" << bool_mask;
  if (float_mask) o << " float-mask";
  if (scale > 0.0f) o << " scale=" << scale;
  if (paged > 0) o << " paged=" << paged;
  if (!kv_lens.empty()) {
    o << " kv-lens=";
    for (size_t i = 0; i < kv_lens.size(); ++i) o << (i ? "," : "") << kv_lens[i];
  }
  return o.str();
}

int64_t Shape::kv_rows_used() const {
  if (kv_lens.empty()) return kv_rows();
  int64_t n = 0;
  for (int32_t x : kv_lens) n += x;
  return n * Hkv;
}

qsdpa::AttentionParams Problem::params(void* out) const {
  qsdpa::AttentionParams p;
  const Shape& s = shape;
  p.dtype = s.dtype;
  p.B = s.B, p.Hq = s.Hq, p.Hkv = s.Hkv, p.Lq = s.Lq, p.N = s.N, p.D = s.D;
  p.q = q.data();
  if (s.paged > 0) {
    qsdpa::CacheLayout l;
    l.block_table = block_table.data();
    l.page_size = s.paged;
    p.k = {{s.k_bits, s.group}, k_pool_packed.data(), k_pool_scales.data(), k_pool_biases.data(), l};
    p.v = {{s.v_bits, s.group}, v_pool_packed.data(), v_pool_scales.data(), v_pool_biases.data(), l};
  } else {
    p.k = {{s.k_bits, s.group}, k_packed.data(), k_scales.data(), k_biases.data(), {}};
    p.v = {{s.v_bits, s.group}, v_packed.data(), v_scales.data(), v_biases.data(), {}};
  }
  p.kv_lens = s.kv_lens.empty() ? nullptr : s.kv_lens.data();
  p.kv_lens_host = p.kv_lens;  // (exec.cpp points kv_lens at the device copy)
  p.out = out;
  p.sinks = sinks.empty() ? nullptr : sinks.data();
  p.bool_mask = bool_mask.empty() ? nullptr : bool_mask.data();
  p.bool_mask_type = s.bool_mask == "u32" ? qsdpa::BoolMaskType::u32 : qsdpa::BoolMaskType::u8;
  p.float_mask = float_mask.empty() ? nullptr : float_mask.data();
  p.scale = s.scale;
  p.window = s.window;
  return p;
}

int64_t quantized_cache_bytes(const Shape& s) {
  const int64_t ts = int64_t(qsdpa::dtype_size(s.dtype)), groups = s.D / s.group;
  return s.kv_rows() * ((s.D * s.k_bits / 32) * 4 + (s.D * s.v_bits / 32) * 4 + 4 * groups * ts);
}

int64_t fp16_cache_bytes(const Shape& s) { return 2 * s.kv_rows() * s.D * 2; }

int64_t call_bytes(const Shape& s) {
  const int64_t ts = int64_t(qsdpa::dtype_size(s.dtype));
  int64_t b = quantized_cache_bytes(s) / std::max<int64_t>(s.kv_rows(), 1) * s.kv_rows_used() + 2 * s.q_elems() * ts;
  if (!s.bool_mask.empty()) b += s.mask_elems() * (s.bool_mask == "u32" ? 4 : 1);
  if (s.float_mask) b += s.mask_elems() * ts;
  if (s.sinks) b += s.Hq * 4;
  return b;
}

Status validate(const Shape& s) {
  // The library checks every rule before it looks at a pointer, so a call with no data says
  // whether the shape is valid ("q is null" means it passed every shape rule).
  qsdpa::AttentionParams p;
  p.dtype = s.dtype;
  p.B = s.B, p.Hq = s.Hq, p.Hkv = s.Hkv, p.Lq = s.Lq, p.N = s.N, p.D = s.D;
  p.k.format = {s.k_bits, s.group};
  p.v.format = {s.v_bits, s.group};
  p.scale = s.scale;
  p.window = s.window;
  // Optional tensors take part in the checks (the mask's byte count); nothing is read before
  // the check of q, which is null here.
  static const uint32_t dummy = 0;
  if (!s.bool_mask.empty()) p.bool_mask = &dummy;
  p.bool_mask_type = s.bool_mask == "u32" ? qsdpa::BoolMaskType::u32 : qsdpa::BoolMaskType::u8;
  if (s.float_mask) p.float_mask = &dummy;
  if (s.sinks) p.sinks = reinterpret_cast<const float*>(&dummy);
  p.backend = Backend::reference;
  if (!s.bool_mask.empty() && s.bool_mask != "u8" && s.bool_mask != "u32")
    return error(StatusCode::invalid_argument, "bool-mask (" + s.bool_mask + ") is not u8 or u32");
  Status st = qsdpa::attention(p);
  const std::string null_tail = " is null";
  if (st.code == StatusCode::invalid_argument && st.message.size() >= null_tail.size() &&
      st.message.compare(st.message.size() - null_tail.size(), null_tail.size(), null_tail) == 0)
    return Status{};
  if (st.ok()) return error(StatusCode::backend_error, "the shape check accepted a call without data");
  return st;
}

Status make_problem(const Shape& s, uint64_t seed, Problem* pr) {
  if (Status st = validate(s); !st) return st;
  // Host memory: the problem itself, the output and the oracle's working set, with room to spare.
  const double need = double(call_bytes(s)) * 1.2;
  const double have = double(physical_memory_bytes());
  if (have > 0 && need > 0.75 * have)
    return error(StatusCode::invalid_argument, "the problem needs " + human_bytes(need) +
                                                   " of host memory; this machine has " + human_bytes(have));
  pr->shape = s;
  pr->seed = seed;
  const size_t ts = qsdpa::dtype_size(s.dtype);

  // Queries: Gaussian, unit scale (with the keys above, logits have a spread of about 2).
  pr->q.assign(size_t(s.q_elems()) * ts, 0);
  parallel_for(s.B * s.Hq * s.Lq, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Rng g(hash(seed, tag_q, uint64_t(r)));
      for (int64_t d = 0; d < s.D; ++d) store_f32(pr->q.data(), s.dtype, r * s.D + d, g.gauss());
    }
  });

  const ChannelStats c = channel_stats(s, seed);
  if (Status st = make_cache(s, seed, c, 'k', &pr->k_packed, &pr->k_scales, &pr->k_biases); !st) return st;
  if (Status st = make_cache(s, seed, c, 'v', &pr->v_packed, &pr->v_scales, &pr->v_biases); !st) return st;
  if (s.paged > 0) {
    // Pages in shuffled order: page j of sequence b is pool page perm[b * per + j], a page holds
    // [Hkv, paged] rows.
    const int64_t ps = s.paged, per = (s.N + ps - 1) / ps, pages = s.B * per;
    std::vector<int32_t> perm(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = int32_t(i);
    Rng g(hash(seed, tag_mask, 0x9a9e));
    for (int64_t i = pages - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(int64_t(g.uniform() * double(i + 1)) % (i + 1))]);
    pr->block_table = perm;
    auto relayout = [&](const auto& src, auto& dst, int64_t unit) {  // unit: elements per row
      dst.assign(size_t(pages * s.Hkv * ps * unit), {});
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.Hkv; ++h)
          for (int64_t t = 0; t < s.N; ++t) {
            const int64_t from = (b * s.Hkv + h) * s.N + t;
            const int64_t to = (int64_t(perm[size_t(b * per + t / ps)]) * s.Hkv + h) * ps + t % ps;
            std::copy_n(src.begin() + from * unit, unit, dst.begin() + to * unit);
          }
    };
    const int64_t ts8 = int64_t(ts), sg = s.D / s.group * ts8;
    relayout(pr->k_packed, pr->k_pool_packed, s.D * s.k_bits / 32);
    relayout(pr->v_packed, pr->v_pool_packed, s.D * s.v_bits / 32);
    relayout(pr->k_scales, pr->k_pool_scales, sg);
    relayout(pr->k_biases, pr->k_pool_biases, sg);
    relayout(pr->v_scales, pr->v_pool_scales, sg);
    relayout(pr->v_biases, pr->v_pool_biases, sg);
  }

  pr->sinks.clear();
  if (s.sinks) {  // drawn wide, as the SPEC's tests draw them, so that the sink matters
    Rng g(hash(seed, tag_sink, 0));
    for (int64_t h = 0; h < s.Hq; ++h) pr->sinks.push_back(float(-10.0 + 20.0 * g.uniform()));
  }

  // Bool mask: each sequence hides a left padding (up to N/8 tokens) and about 1 key in 16.
  pr->bool_mask.clear();
  if (!s.bool_mask.empty()) {
    const bool u32 = s.bool_mask == "u32";
    pr->bool_mask.assign(size_t(s.mask_elems()) * (u32 ? 4 : 1), 0);
    parallel_for(s.B * s.Hq * s.Lq, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (s.Hq * s.Lq), pad = pad_of(s, seed, b);
        for (int64_t t = 0; t < s.N; ++t) {
          const bool keep = t >= pad && (hash(seed, tag_mask, uint64_t(r), uint64_t(t)) & 15u) != 0;
          if (u32)
            reinterpret_cast<uint32_t*>(pr->bool_mask.data())[r * s.N + t] = keep ? 1u : 0u;
          else
            pr->bool_mask[size_t(r * s.N + t)] = keep ? 1 : 0;
        }
      }
    });
  }

  // Float mask: ALiBi position biases (-slope_h * distance), -inf on the left padding.
  pr->float_mask.clear();
  if (s.float_mask) {
    pr->float_mask.assign(size_t(s.mask_elems()) * ts, 0);
    parallel_for(s.B * s.Hq * s.Lq, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (s.Hq * s.Lq), h = (r / s.Lq) % s.Hq, i = r % s.Lq;
        const int64_t pad = pad_of(s, seed, b), pos = s.N - s.Lq + i;
        const double slope = std::exp2(-8.0 * double(h + 1) / double(s.Hq));
        for (int64_t t = 0; t < s.N; ++t) {
          float v = -std::numeric_limits<float>::infinity();
          if (t >= pad) v = float(std::max(-60000.0, -slope * double(std::max<int64_t>(0, pos - t))));
          store_f32(pr->float_mask.data(), s.dtype, r * s.N + t, v);
        }
      }
    });
  }
  return Status{};
}

void unquantized_rows(const Problem& p, char which, int64_t b, int64_t kvh, std::vector<float>* out) {
  const Shape& s = p.shape;
  const ChannelStats c = channel_stats(s, p.seed);
  out->resize(size_t(s.N * s.D));
  parallel_for(s.N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = out->data() + t * s.D;
      gen_kv_row(s, c, p.seed, which, (b * s.Hkv + kvh) * s.N + t, row);
      for (int64_t d = 0; d < s.D; ++d) row[d] = qsdpa::detail::round_to(s.dtype, row[d]);
    }
  });
}

}  // namespace qsdpa_cli
