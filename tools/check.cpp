// Accuracy of a backend's output, measured on the host:
//   - against Backend::reference on the same quantized cache (what the backend is responsible for);
//   - and what quantization itself costs: attention in double on the unquantized cache (rounded to
//     T, as an fp16 cache would hold it) against the reference on the quantized one.
// The reference is plain double loops, so for big shapes only a spread-out subset of
// (sequence, query head) rows is compared; the report says how many.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common.hpp"
#include "core/half.hpp"

namespace qsdpa_cli {

namespace {

using qsdpa::detail::load_f32;

struct Sums {
  double diff2 = 0, ref2 = 0;  // backend vs reference
  double qdiff2 = 0, exact2 = 0;  // reference vs unquantized
};

// SPEC section 3 in double for one query head h of sequence b, on unquantized K and V rows
// ([N, D] each); writes [Lq, D].
void exact_attention(const Problem& p, int64_t b, int64_t h, const std::vector<float>& k,
                     const std::vector<float>& v, std::vector<double>* out) {
  const Shape& s = p.shape;
  const double scale = double(s.effective_scale());
  const bool u32 = s.bool_mask == "u32";
  out->assign(size_t(s.Lq * s.D), 0.0);
  std::vector<double> logit(size_t(s.N)), qd(size_t(s.D));
  std::vector<char> vis(size_t(s.N));
  const int64_t n = s.kv_lens.empty() ? s.N : s.kv_lens[size_t(b)];  // this sequence's tokens
  for (int64_t i = 0; i < s.Lq; ++i) {
    const int64_t qrow = (b * s.Hq + h) * s.Lq + i, pos = n - s.Lq + i;
    for (int64_t d = 0; d < s.D; ++d) qd[size_t(d)] = double(load_f32(p.q.data(), s.dtype, qrow * s.D + d));
    double m = -std::numeric_limits<double>::infinity();
    bool any = false;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t mi = qrow * s.N + t;
      bool visible = t <= pos && (s.window == 0 || t > pos - s.window);
      if (!p.bool_mask.empty())
        visible = visible && (u32 ? reinterpret_cast<const uint32_t*>(p.bool_mask.data())[mi] != 0
                                  : p.bool_mask[size_t(mi)] != 0);
      double fm = 0;
      if (!p.float_mask.empty()) {
        fm = double(load_f32(p.float_mask.data(), s.dtype, mi));
        visible = visible && fm != -std::numeric_limits<double>::infinity();
      }
      vis[size_t(t)] = visible;
      if (!visible) continue;
      double dot = 0;
      const float* kr = k.data() + t * s.D;
      for (int64_t d = 0; d < s.D; ++d) dot += qd[size_t(d)] * double(kr[d]);
      logit[size_t(t)] = scale * dot + fm;
      m = std::max(m, logit[size_t(t)]);
      any = true;
    }
    if (!any) continue;  // no visible key: zeros
    double denom = 0;
    if (!p.sinks.empty()) {
      m = std::max(m, double(p.sinks[size_t(h)]));
      denom = std::exp(double(p.sinks[size_t(h)]) - m);
    }
    double* o = out->data() + i * s.D;
    for (int64_t t = 0; t < n; ++t) {
      if (!vis[size_t(t)]) continue;
      const double w = std::exp(logit[size_t(t)] - m);
      denom += w;
      const float* vr = v.data() + t * s.D;
      for (int64_t d = 0; d < s.D; ++d) o[d] += w * double(vr[d]);
    }
    for (int64_t d = 0; d < s.D; ++d) o[d] /= denom;
  }
}

// The reference backend's output for query head h of sequence b ([Lq, D] T).
Status reference_head(const Problem& p, int64_t b, int64_t h, std::vector<uint8_t>* out) {
  const Shape& s = p.shape;
  const size_t ts = qsdpa::dtype_size(s.dtype);
  const int64_t kvh = h / s.rep(), kv_row = (b * s.Hkv + kvh) * s.N, groups = s.D / s.group;
  const int64_t qrow = (b * s.Hq + h) * s.Lq;
  out->assign(size_t(s.Lq * s.D) * ts, 0);
  qsdpa::AttentionParams a = p.params(out->data());
  a.B = 1, a.Hq = 1, a.Hkv = 1;
  // the dense copy of the cache, this sequence's own length (its mask rows keep their N stride)
  a.k.layout = a.v.layout = {};
  a.kv_lens = nullptr;
  a.N = s.kv_lens.empty() ? s.N : s.kv_lens[size_t(b)];
  a.mask_strides.l = s.N;
  a.q = p.q.data() + size_t(qrow * s.D) * ts;
  if (s.N > 0) {
    a.k.packed = p.k_packed.data() + kv_row * (s.D * s.k_bits / 32);
    a.v.packed = p.v_packed.data() + kv_row * (s.D * s.v_bits / 32);
    a.k.scales = p.k_scales.data() + size_t(kv_row * groups) * ts;
    a.k.biases = p.k_biases.data() + size_t(kv_row * groups) * ts;
    a.v.scales = p.v_scales.data() + size_t(kv_row * groups) * ts;
    a.v.biases = p.v_biases.data() + size_t(kv_row * groups) * ts;
  }
  if (!p.sinks.empty()) a.sinks = p.sinks.data() + h;
  if (!p.bool_mask.empty())
    a.bool_mask = p.bool_mask.data() + size_t(qrow * s.N) * (s.bool_mask == "u32" ? 4 : 1);
  if (!p.float_mask.empty()) a.float_mask = p.float_mask.data() + size_t(qrow * s.N) * ts;
  a.backend = Backend::reference;
  return qsdpa::attention(a);
}

double rel(double diff2, double ref2) {
  return ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);  // all-zero reference: absolute
}

}  // namespace

Status check_accuracy(const Problem& p, const std::vector<uint8_t>& out, double budget, Accuracy* acc) {
  const Shape& s = p.shape;
  const size_t ts = qsdpa::dtype_size(s.dtype);
  if (out.size() < size_t(s.q_elems()) * ts)
    return error(StatusCode::invalid_argument, "accuracy check: output buffer is too small");
  // The unit of work is one (sequence, query head): Lq * N * D cache elements, for K and for V.
  const int64_t rep = s.rep(), total = s.B * s.Hq;
  const double per_head = double(s.Lq) * double(std::max<int64_t>(s.N, 1)) * double(s.D) * 2.0;
  const int64_t nheads = std::clamp<int64_t>(int64_t(budget / per_head), 1, total);
  std::vector<int64_t> picked;  // spread evenly over all (sequence, head) rows, in order
  for (int64_t j = 0; j < nheads; ++j) picked.push_back(j * total / nheads);

  Sums sum;
  std::vector<float> k, v;
  for (size_t j0 = 0; j0 < picked.size();) {
    // The picked heads that share one KV head share its unquantized rows.
    const int64_t b = picked[j0] / s.Hq, kvh = (picked[j0] % s.Hq) / rep;
    size_t j1 = j0;
    while (j1 < picked.size() && picked[j1] / s.Hq == b && (picked[j1] % s.Hq) / rep == kvh) ++j1;
    unquantized_rows(p, 'k', b, kvh, &k);
    unquantized_rows(p, 'v', b, kvh, &v);
    const int64_t n = int64_t(j1 - j0);
    std::vector<Sums> per(static_cast<size_t>(n));
    std::vector<Status> status(static_cast<size_t>(n));
    parallel_for(n, [&](int64_t i0, int64_t i1) {
      std::vector<uint8_t> ref;
      std::vector<double> exact;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t h = picked[j0 + size_t(i)] % s.Hq;
        status[size_t(i)] = reference_head(p, b, h, &ref);
        if (!status[size_t(i)]) return;
        exact_attention(p, b, h, k, v, &exact);
        Sums& ps = per[size_t(i)];
        const int64_t base = (b * s.Hq + h) * s.Lq * s.D;
        for (int64_t e = 0; e < s.Lq * s.D; ++e) {
          const double r = double(load_f32(ref.data(), s.dtype, e));
          const double o = double(load_f32(out.data(), s.dtype, base + e));
          const double x = exact[size_t(e)];
          ps.diff2 += (o - r) * (o - r);
          ps.ref2 += r * r;
          ps.qdiff2 += (r - x) * (r - x);
          ps.exact2 += x * x;
        }
      }
    });
    for (int64_t i = 0; i < n; ++i) {
      if (!status[size_t(i)]) return status[size_t(i)];
      sum.diff2 += per[size_t(i)].diff2;
      sum.ref2 += per[size_t(i)].ref2;
      sum.qdiff2 += per[size_t(i)].qdiff2;
      sum.exact2 += per[size_t(i)].exact2;
    }
    j0 = j1;
  }
  acc->err_vs_reference = rel(sum.diff2, sum.ref2);
  acc->quant_err = rel(sum.qdiff2, sum.exact2);
  acc->rows_checked = nheads;
  acc->rows_total = total;
  acc->subset = nheads == total ? "all " + std::to_string(total) + " (sequence, head) rows"
                                : std::to_string(nheads) + " of " + std::to_string(total) +
                                      " (sequence, head) rows, spread evenly";
  return Status{};
}

}  // namespace qsdpa_cli
