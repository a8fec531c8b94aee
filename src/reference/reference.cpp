// The reference backend: SPEC section 3 in double precision with plain loops. It is the oracle
// every other backend is tested against, so it is written to be obviously right, never fast.
#include <cmath>
#include <limits>
#include <vector>

#include "../core/backends.hpp"
#include "../core/format.hpp"
#include "../core/half.hpp"
#include "../core/layout.hpp"

namespace qsdpa::detail {

namespace {

// Dequantized element d of cache row `row` (CacheLayout: the row of a (sequence, head, token)).
double dequant(const KVCache& c, DType t, int64_t D, int64_t row, int64_t d) {
  const int64_t words = D * c.format.bits / 32, ngroups = D / c.format.group;
  const uint32_t qv = unpack_value(c.packed + row * words, d, c.format.bits);
  const int64_t g = row * ngroups + d / c.format.group;
  return double(load_f32(c.scales, t, g)) * double(qv) + double(load_f32(c.biases, t, g));
}

}  // namespace

void reference_attention_f64(const AttentionParams& p, double* out) {
  const int64_t rep = p.Hq / p.Hkv;
  const double scale = p.scale > 0.0f ? double(p.scale) : 1.0 / std::sqrt(double(p.D));
  const RowMap km = resolve_layout(p.k.layout, p.Hkv, p.N), vm = resolve_layout(p.v.layout, p.Hkv, p.N);
  const ElemMap qm = resolve_strides(p.q_strides, p.Hq, p.Lq, p.D);
  const ElemMap mm = resolve_strides(p.mask_strides, p.Hq, p.Lq, p.N);
  std::vector<double> logits(size_t(p.N)), acc(size_t(p.D));
  std::vector<char> visible(size_t(p.N));

  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = p.kv_lens ? int64_t(p.kv_lens[b]) : p.N;  // this sequence's tokens
    const int64_t lq = p.q_lens ? int64_t(p.q_lens[b]) : p.Lq;  // and query rows
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t orow = ((b * p.Hq + h) * p.Lq + i);  // row of the [B, Hq, Lq, D] result
        const int64_t qoff = qm.at(b, h, i);
        const int64_t pos = n - lq + i;  // position of this query row
        const int64_t kvh = h / rep;
        double m = -std::numeric_limits<double>::infinity();
        bool any = false;
        for (int64_t t = 0; t < n && i < lq; ++t) {
          const int64_t midx = mm.at(b, h, i) + t;
          bool vis = t <= pos;
          if (p.window > 0 && !(t > pos - p.window)) vis = false;
          if (p.bool_mask) {
            const bool keep = p.bool_mask_type == BoolMaskType::u8
                                  ? static_cast<const uint8_t*>(p.bool_mask)[midx] != 0
                                  : static_cast<const uint32_t*>(p.bool_mask)[midx] != 0;
            if (!keep) vis = false;
          }
          double fm = 0.0;
          if (p.float_mask) {
            fm = double(load_f32(p.float_mask, p.dtype, midx));
            if (fm == -std::numeric_limits<double>::infinity()) vis = false;
          }
          visible[size_t(t)] = vis;
          if (!vis) continue;
          const int64_t krow = km.row(b, kvh, t);
          double dot = 0.0;
          for (int64_t d = 0; d < p.D; ++d)
            dot += double(load_f32(p.q, p.dtype, qoff + d)) * dequant(p.k, p.dtype, p.D, krow, d);
          logits[size_t(t)] = scale * dot + fm;
          m = std::max(m, logits[size_t(t)]);
          any = true;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        if (any) {
          const bool has_sink = p.sinks != nullptr;
          const double sink = has_sink ? double(p.sinks[h]) : 0.0;
          if (has_sink) m = std::max(m, sink);
          double denom = has_sink ? std::exp(sink - m) : 0.0;
          for (int64_t t = 0; t < n; ++t) {
            if (!visible[size_t(t)]) continue;
            const double w = std::exp(logits[size_t(t)] - m);
            denom += w;
            const int64_t vrow = vm.row(b, kvh, t);
            for (int64_t d = 0; d < p.D; ++d) acc[size_t(d)] += w * dequant(p.v, p.dtype, p.D, vrow, d);
          }
          for (auto& a : acc) a /= denom;
        }
        for (int64_t d = 0; d < p.D; ++d) out[orow * p.D + d] = acc[size_t(d)];
      }
  }
}

Status reference_attention(const AttentionParams& p) {
  std::vector<double> out(size_t(p.B * p.Hq * p.Lq * p.D));
  reference_attention_f64(p, out.data());
  const ElemMap om = resolve_strides(p.out_strides, p.Hq, p.Lq, p.D);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Lq; ++i)
        for (int64_t d = 0; d < p.D; ++d)
          store_f32(p.out, p.dtype, om.at(b, h, i) + d, float(out[size_t(((b * p.Hq + h) * p.Lq + i) * p.D + d)]));
  return make_status(StatusCode::ok, "", Backend::reference);
}

}  // namespace qsdpa::detail
