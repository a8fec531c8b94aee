// The host quantizer: MLX's affine quantization (SPEC section 2), bit for bit.
// All arithmetic is in f32 exactly as written; this file is built with -ffp-contract=off so that
// no multiply-add is fused, which would change the last bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends.hpp"
#include "format.hpp"
#include "half.hpp"

namespace qsdpa::detail {

namespace {

void quantize_row(const QuantizeParams& p, int64_t r) {
  const int bits = p.format.bits, G = p.format.group;
  const int per = 32 / bits;
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const int64_t ngroups = p.dim / G;
  uint32_t* packed = p.packed + r * (p.dim / per);
  std::vector<float> w(static_cast<size_t>(G));
  for (int64_t g = 0; g < ngroups; ++g) {
    const int64_t base = r * p.dim + g * G;
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < G; ++j) {
      w[size_t(j)] = load_f32(p.w, p.dtype, base + j);
      hi = std::max(hi, w[size_t(j)]);
      lo = std::min(lo, w[size_t(j)]);
    }
    const bool edge_is_lo = std::fabs(lo) > std::fabs(hi);
    float s = std::max((hi - lo) / n_bins, eps);
    s = edge_is_lo ? s : -s;
    const float edge = edge_is_lo ? lo : hi;
    const float q0 = std::rint(edge / s);
    float z = 0.0f;
    if (q0 != 0.0f) {
      s = edge / q0;
      z = edge;
    }
    for (int j = 0; j < G; j += per) {
      uint32_t word = 0;
      for (int k = 0; k < per; ++k) {
        float q = std::rint((w[size_t(j + k)] - z) / s);
        // NaN (a constant group beyond 3.4e31 gives s = -0 and 0 / -0) must become code 0, as
        // it does in MLX; converting a NaN to an integer would be undefined behaviour.
        q = q > 0.0f ? std::min(q, n_bins) : 0.0f;
        word |= uint32_t(q) << (k * bits);
      }
      packed[(g * G + j) / per] = word;
    }
    store_f32(p.scales, p.dtype, r * ngroups + g, s);
    store_f32(p.biases, p.dtype, r * ngroups + g, z);
  }
}

}  // namespace

void host_quantize_rows(const QuantizeParams& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) quantize_row(p, r);
}

void host_dequantize_rows(const DequantizeParams& p, int64_t r0, int64_t r1) {
  const int bits = p.format.bits, G = p.format.group;
  const int64_t words = p.dim * bits / 32, ngroups = p.dim / G;
  for (int64_t r = r0; r < r1; ++r) {
    const uint32_t* row = p.packed + r * words;
    for (int64_t d = 0; d < p.dim; ++d) {
      const int64_t g = r * ngroups + d / G;
      const float s = load_f32(p.scales, p.dtype, g), z = load_f32(p.biases, p.dtype, g);
      store_f32(p.w, p.dtype, r * p.dim + d, s * float(unpack_value(row, d, bits)) + z);
    }
  }
}

Status host_quantize(const QuantizeParams& p) {
  host_quantize_rows(p, 0, p.rows);
  return make_status(StatusCode::ok, "", Backend::reference);
}

Status host_dequantize(const DequantizeParams& p) {
  host_dequantize_rows(p, 0, p.rows);
  return make_status(StatusCode::ok, "", Backend::reference);
}

}  // namespace qsdpa::detail

#include "layout.hpp"

namespace qsdpa::detail {

Status host_append(const AppendParams& p) {
  const size_t ts = dtype_size(p.dtype);
  const RowMap km = resolve_layout(p.k_cache.layout, p.Hkv, p.capacity);
  const RowMap vm = resolve_layout(p.v_cache.layout, p.Hkv, p.capacity);
  for (int64_t layer = 0; layer < p.layers; ++layer)
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t start = p.kv_lens ? int64_t(p.kv_lens[b]) : p.start;
      for (int64_t h = 0; h < p.Hkv; ++h)
        for (int64_t i = 0; i < p.L; ++i) {
          const int64_t src = (((layer * p.B + b) * p.Hkv + h) * p.L + i) * p.D;
          for (int kv = 0; kv < 2; ++kv) {
            const KVCacheMut& c = kv == 0 ? p.k_cache : p.v_cache;
            const int64_t row = layer * p.layer_stride + (kv == 0 ? km : vm).row(b, h, start + i);
            QuantizeParams q;
            q.dtype = p.dtype;
            q.format = c.format;
            q.rows = 1;
            q.dim = p.D;
            q.w = static_cast<const char*>(kv == 0 ? p.k : p.v) + src * int64_t(ts);
            q.packed = c.packed + row * packed_words_per_row(c.format, p.D);
            q.scales = static_cast<char*>(c.scales) + row * groups_per_row(c.format, p.D) * int64_t(ts);
            q.biases = static_cast<char*>(c.biases) + row * groups_per_row(c.format, p.D) * int64_t(ts);
            host_quantize_rows(q, 0, 1);
          }
        }
    }
  return make_status(StatusCode::ok, "");
}

}  // namespace qsdpa::detail
