// Shared test machinery: random attention problems (never zeros), poisoned outputs, and the
// accuracy check of SPEC section 4 against the double-precision reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../src/core/backends.hpp"
#include "../../src/core/format.hpp"
#include "../../src/core/half.hpp"
#include "qsdpa/qsdpa.hpp"

namespace qsdpa::test {

enum class MaskKind { none, u8, u32 };

struct Case {
  DType dtype = DType::f16;
  QuantFormat kf{4, 64}, vf{4, 64};
  int64_t B = 1, Hq = 4, Hkv = 1, Lq = 1, N = 33, D = 64;
  bool sinks = false;
  int64_t window = 0;
  MaskKind bool_mask = MaskKind::none;
  bool float_mask = false;
  uint64_t seed = 1;

  std::string str() const {
    std::ostringstream o;
    o << "dtype=" << to_string(dtype) << " k=" << kf.bits << "b/g" << kf.group << " v=" << vf.bits
      << "b/g" << vf.group << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Lq=" << Lq
      << " N=" << N << " D=" << D << " sinks=" << sinks << " window=" << window
      << " bool_mask=" << (bool_mask == MaskKind::none ? "none" : bool_mask == MaskKind::u8 ? "u8" : "u32")
      << " float_mask=" << float_mask << " seed=" << seed;
    return o.str();
  }
};

inline size_t tsize(DType t) { return dtype_size(t); }

// Fills a T-typed byte buffer with values from f.
template <class F>
std::vector<uint8_t> make_typed(DType t, int64_t n, F&& f) {
  std::vector<uint8_t> buf(size_t(n) * tsize(t));
  for (int64_t i = 0; i < n; ++i) detail::store_f32(buf.data(), t, i, f(i));
  return buf;
}

// One quantized cache in host memory.
struct HostCache {
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
  std::vector<uint8_t> raw;  // the unquantized values (T), for quantization-error measurements
};

// Quantizes rows x D values of type t with the reference quantizer.
inline HostCache quantize_host(DType t, QuantFormat f, int64_t rows, int64_t D, std::vector<uint8_t> raw) {
  HostCache c;
  c.raw = std::move(raw);
  c.packed.resize(size_t(rows * D * f.bits / 32));
  c.scales.resize(size_t(rows * (D / f.group)) * tsize(t));
  c.biases.resize(c.scales.size());
  QuantizeParams qp;
  qp.dtype = t;
  qp.format = f;
  qp.rows = rows;
  qp.dim = D;
  qp.w = c.raw.data();
  qp.packed = c.packed.data();
  qp.scales = c.scales.data();
  qp.biases = c.biases.data();
  qp.backend = Backend::reference;
  Status s = quantize(qp);
  if (!s) throw std::runtime_error("quantize failed: " + s.message);
  return c;
}

// A whole attention problem in host memory.
struct Problem {
  Case c;
  std::vector<uint8_t> q, out, float_mask, bool_mask;
  HostCache k, v;
  std::vector<float> sinks;

  explicit Problem(const Case& cs) : c(cs) {
    std::mt19937_64 rng(cs.seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    const int64_t rows = c.B * c.Hkv * c.N;
    // Queries: Gaussian. Keys: Gaussian with a few high-magnitude channels, plus a per-row offset
    // so that groups are not centered. Values: Gaussian.
    q = make_typed(c.dtype, c.B * c.Hq * c.Lq * c.D, [&](int64_t) { return nd(rng); });
    auto kraw = make_typed(c.dtype, rows * c.D, [&](int64_t i) {
      const int64_t d = i % c.D;
      const float big = (d % 29 == 3) ? 8.0f : 1.0f;
      return big * nd(rng) + 0.25f;
    });
    auto vraw = make_typed(c.dtype, rows * c.D, [&](int64_t) { return nd(rng); });
    k = quantize_host(c.dtype, c.kf, rows, c.D, std::move(kraw));
    v = quantize_host(c.dtype, c.vf, rows, c.D, std::move(vraw));
    if (c.sinks) {
      std::uniform_real_distribution<float> sd(-10.0f, 10.0f);
      sinks.resize(size_t(c.Hq));
      for (auto& s : sinks) s = sd(rng);
    }
    const int64_t mn = c.B * c.Hq * c.Lq * c.N;
    if (c.bool_mask != MaskKind::none) {
      std::bernoulli_distribution keep(0.8);
      if (c.bool_mask == MaskKind::u8) {
        bool_mask.resize(size_t(mn));
        for (auto& m : bool_mask) m = keep(rng) ? uint8_t(1 + rng() % 255) : 0;
      } else {
        bool_mask.resize(size_t(mn) * 4);
        auto* m32 = reinterpret_cast<uint32_t*>(bool_mask.data());
        for (int64_t i = 0; i < mn; ++i) m32[i] = keep(rng) ? uint32_t(1 + rng() % 0xfffffffeu) : 0u;
      }
    }
    if (c.float_mask) {
      std::bernoulli_distribution hide(0.1);
      float_mask = make_typed(c.dtype, mn, [&](int64_t) {
        return hide(rng) ? -std::numeric_limits<float>::infinity() : 2.0f * ud(rng);
      });
    }
    out.assign(size_t(c.B * c.Hq * c.Lq * c.D) * tsize(c.dtype), 0);
    poison();
  }

  // Every byte 0xff: a NaN in f32, f16 and bf16, so an unwritten element fails the check.
  void poison() { std::memset(out.data(), 0xff, out.size()); }

  AttentionParams params(Backend b) {
    AttentionParams p;
    p.dtype = c.dtype;
    p.B = c.B;
    p.Hq = c.Hq;
    p.Hkv = c.Hkv;
    p.Lq = c.Lq;
    p.N = c.N;
    p.D = c.D;
    p.q = q.data();
    p.out = out.data();
    p.k = {c.kf, k.packed.data(), k.scales.data(), k.biases.data(), {}};
    p.v = {c.vf, v.packed.data(), v.scales.data(), v.biases.data(), {}};
    p.sinks = c.sinks ? sinks.data() : nullptr;
    p.bool_mask = bool_mask.empty() ? nullptr : bool_mask.data();
    p.bool_mask_type = c.bool_mask == MaskKind::u32 ? BoolMaskType::u32 : BoolMaskType::u8;
    p.float_mask = float_mask.empty() ? nullptr : float_mask.data();
    p.window = c.window;
    p.backend = b;
    return p;
  }
};

// Where the codes of near_zero_values() sit in each group's range of L + 1 = 2^bits levels.
enum class CodeSpot { bottom, middle, top };

// Replaces a cache's codes, scales and biases (a valid quantized cache, though not one the
// quantizer would make) with values of +-s/2 whose codes sit at one spot of the range: codes c0 or
// c0 + 1 (at random) with c0 = 0, (L - 1) / 2 or L - 1 and the bias -(c0 + 1/2) s, so that a value
// is b + s n with s n and b each up to L times the value. A kernel that sums s n and b apart (the
// values' scale folded into the weights, sum p s n + sum p b) turns any rounding of those two
// sums, or of p s, into an error that large against the result; one that sums them against a
// centre code h (sum p s (n - h) + sum p (b + h s)) meets the same at the ends of the range. The
// scale is M s' per row with s' in [1, 2); raw holds the values the codes stand for.
inline void near_zero_values(HostCache& v, DType t, QuantFormat f, int64_t rows, int64_t D, CodeSpot spot, float M,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(1.0f, 2.0f);
  const int L = (1 << f.bits) - 1;
  const int c0 = spot == CodeSpot::bottom ? 0 : spot == CodeSpot::middle ? (L - 1) / 2 : L - 1;
  const int64_t groups = D / f.group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i = r * groups + g;
      detail::store_f32(v.scales.data(), t, i, M * ud(rng) * 2.0f / float(L));
      const float s = detail::load_f32(v.scales.data(), t, i);
      detail::store_f32(v.biases.data(), t, i, -(float(c0) + 0.5f) * s);
      const float b = detail::load_f32(v.biases.data(), t, i);
      for (int64_t d = g * f.group; d < (g + 1) * f.group; ++d) {
        const uint32_t n = uint32_t(c0) + uint32_t(rng() & 1u);
        detail::pack_value(v.packed.data() + r * D * f.bits / 32, d, f.bits, n);
        detail::store_f32(v.raw.data(), t, r * D + d, b + s * float(n));
      }
    }
}

// Makes token `dom` of every sequence take nearly all the weight (a float-mask entry of +14, e^14
// ~ 1.2e6, where the others take -1 .. 1) and gives it values of exactly zero (bias -h s with
// h = 2^(bits-1), every code h): an attention-sink token with small values, where the result is
// the few-percent share of the other tokens. The problem must have a float mask.
inline void dominant_key_with_zero_values(Problem& pr, int64_t dom) {
  const Case& c = pr.c;
  const DType t = c.dtype;
  const int bits = c.vf.bits;
  const int64_t h = int64_t(1) << (bits - 1), ng = c.D / c.vf.group;
  for (int64_t i = 0; i < c.B * c.Hq * c.Lq * c.N; ++i)
    detail::store_f32(pr.float_mask.data(), t, i, i % c.N == dom ? 14.0f : 0.5f * float((i * 7919) % 5) - 1.0f);
  for (int64_t bh = 0; bh < c.B * c.Hkv; ++bh) {
    const int64_t row = bh * c.N + dom;
    for (int64_t g = 0; g < ng; ++g) {
      const float s = detail::load_f32(pr.v.scales.data(), t, row * ng + g);
      detail::store_f32(pr.v.biases.data(), t, row * ng + g, -float(h) * s);  // exact: h is a power of two
    }
    for (int64_t d = 0; d < c.D; ++d) detail::pack_value(pr.v.packed.data() + row * c.D * bits / 32, d, bits, uint32_t(h));
  }
}

// SPEC section 4 tolerances.
inline double rel_tol(DType t) {
  switch (t) {
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
  }
  return 0;
}

// Compares `out` (T-typed, [B, Hq, Lq, D]) with the double-precision reference, row by row.
// Returns an empty string when every row holds, else a description of the first failing row.
inline std::string check_against_reference(const AttentionParams& p, const void* out) {
  const int64_t rows = p.B * p.Hq * p.Lq;
  std::vector<double> ref(size_t(rows * p.D));
  detail::reference_attention_f64(p, ref.data());
  const double tol = rel_tol(p.dtype), atol = 1e-6 * std::sqrt(double(p.D));
  for (int64_t r = 0; r < rows; ++r) {
    double err2 = 0, ref2 = 0;
    for (int64_t d = 0; d < p.D; ++d) {
      const double o = detail::load_f32(out, p.dtype, r * p.D + d);
      const double x = ref[size_t(r * p.D + d)];
      err2 += (o - x) * (o - x);
      ref2 += x * x;
    }
    const double err = std::sqrt(err2), rn = std::sqrt(ref2);
    if (!(err <= tol * rn + atol)) {  // also catches NaN
      std::ostringstream o;
      o << "row " << r << " (b=" << r / (p.Hq * p.Lq) << " h=" << (r / p.Lq) % p.Hq
        << " i=" << r % p.Lq << "): ||out-ref|| = " << err << " > " << tol << " * " << rn
        << " + " << atol;
      return o.str();
    }
  }
  return "";
}

}  // namespace qsdpa::test
