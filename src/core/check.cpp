// Argument checks (SPEC section 5): every rule returns an error naming the argument and the rule,
// before anything is written.
#include <algorithm>
#include <limits>
#include <utility>
#include <string>

#include "backends.hpp"
#include "format.hpp"
#include "layout.hpp"

namespace qsdpa::detail {

Status make_status(StatusCode c, std::string msg, Backend b) {
  Status s;
  s.code = c;
  s.message = std::move(msg);
  s.backend = b;
  return s;
}

namespace {

Status invalid(std::string msg) { return make_status(StatusCode::invalid_argument, std::move(msg)); }
Status ok() { return Status{}; }

std::string num(int64_t v) { return std::to_string(v); }

bool valid_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// Multiplies sizes, reporting an overflow of the byte count (which must fit in 63 bits so that
// it can be used as a signed 64-bit offset).
struct Bytes {
  bool overflow = false;
  uint64_t value = 1;
  Bytes& mul(int64_t x) {
    uint64_t r;
    if (x < 0 || __builtin_mul_overflow(value, uint64_t(x), &r) ||
        r > uint64_t(std::numeric_limits<int64_t>::max()))
      overflow = true;
    else
      value = r;
    return *this;
  }
};

Status check_format(const char* what, const QuantFormat& f, int64_t dim, const char* dim_name) {
  const std::string w = what;
  if (!supported_bits(f.bits))
    return invalid(w + "bits (" + num(f.bits) + ") is not supported: use 2, 4 or 8");
  if (!supported_group(f.group))
    return invalid(w + "group (" + num(f.group) + ") is not supported: use 32, 64 or 128");
  if (dim % f.group != 0)
    return invalid(std::string(dim_name) + " (" + num(dim) + ") is not a multiple of " + w +
                   "group (" + num(f.group) + ")");
  return ok();
}

Status check_rows(DType dtype, const QuantFormat& f, int64_t rows, int64_t dim) {
  if (!valid_dtype(dtype)) return invalid("dtype (" + num(int(dtype)) + ") is not f32, f16 or bf16");
  if (rows < 0) return invalid("rows (" + num(rows) + ") is negative");
  if (dim <= 0) return invalid("dim (" + num(dim) + ") must be positive");
  if (Status s = check_format("", f, dim, "dim"); !s) return s;
  Bytes b;
  b.mul(rows).mul(dim).mul(4);
  if (b.overflow) return invalid("rows * dim (" + num(rows) + " * " + num(dim) + ") overflows a 64-bit byte count");
  return ok();
}

bool stride_ok(int64_t s, int64_t lo) { return s == kAuto || s >= lo; }

// A cache layout (CacheLayout): strides, pages, and the largest row it addresses, whose byte
// offset (rows of `row_bytes` bytes at most) must fit in 63 bits.
Status check_layout(const std::string& w, const CacheLayout& l, int64_t B, int64_t Hkv, int64_t N,
                    int64_t row_bytes) {
  if (!stride_ok(l.token_stride, 1))
    return invalid(w + "token_stride (" + num(l.token_stride) + ") must be at least 1 (or kAuto)");
  if (!stride_ok(l.head_stride, 0))
    return invalid(w + "head_stride (" + num(l.head_stride) + ") is negative");
  if (!stride_ok(l.batch_stride, 0))
    return invalid(w + "batch_stride (" + num(l.batch_stride) + ") is negative");
  if (!stride_ok(l.page_stride, 0))
    return invalid(w + "page_stride (" + num(l.page_stride) + ") is negative");
  if (!l.block_table) {
    if (l.page_size != 0)
      return invalid(w + "page_size (" + num(l.page_size) + ") is set but block_table is null");
  } else {
    const int64_t ps = l.page_size;
    if (ps < 16 || ps > 256 || (ps & (ps - 1)) != 0)
      return invalid(w + "page_size (" + num(ps) + ") must be a power of two from 16 to 256");
    if (l.batch_stride != kAuto)
      return invalid(w + "batch_stride (" + num(l.batch_stride) + ") has no meaning in a paged cache: leave it kAuto");
    const int64_t pages = (N + ps - 1) / ps;
    if (!stride_ok(l.block_table_stride, pages))
      return invalid(w + "block_table_stride (" + num(l.block_table_stride) + ") is less than the pages of " +
                     num(N) + " tokens (" + num(pages) + ")");
  }
  if (N == 0) return ok();
  // The largest row: every stride times its largest index (pages: the page stride times a
  // largest page index that is not known here; int32 page indices bound it).
  const RowMap m = resolve_layout(l, Hkv, N);
  Bytes r;
  uint64_t total = 0;
  auto add = [&](int64_t stride, int64_t count) {
    Bytes t;
    t.mul(stride).mul(count);
    if (t.overflow || __builtin_add_overflow(total, t.value, &total)) r.overflow = true;
  };
  if (m.block_table) {
    add(m.page_stride, int64_t(INT32_MAX));
    add(m.head_stride, Hkv - 1);
    add(m.token_stride, (int64_t(1) << m.page_shift) - 1);
  } else {
    add(m.batch_stride, B - 1);
    add(m.head_stride, Hkv - 1);
    add(m.token_stride, N - 1);
  }
  Bytes bytes;
  bytes.mul(int64_t(std::min<uint64_t>(total + 1, uint64_t(INT64_MAX)))).mul(row_bytes);
  if (r.overflow || bytes.overflow)
    return invalid(w + "layout addresses rows whose byte offsets overflow 64 bits");
  return ok();
}

Status check_strides(const char* name, const Strides& s, bool allow_zero) {
  const int64_t lo = allow_zero ? 0 : 1;
  for (auto [v, what] : {std::pair{s.b, ".b"}, std::pair{s.h, ".h"}, std::pair{s.l, ".l"}})
    if (!stride_ok(v, lo))
      return invalid(std::string(name) + what + " (" + num(v) + ") must be " +
                     (allow_zero ? "at least 0" : "at least 1") + " (or kAuto)");
  return ok();
}

}  // namespace

Status check_quantize(const QuantizeParams& p) {
  if (Status s = check_rows(p.dtype, p.format, p.rows, p.dim); !s) return s;
  if (p.rows > 0) {
    if (!p.w) return invalid("w is null");
    if (!p.packed) return invalid("packed is null");
    if (!p.scales) return invalid("scales is null");
    if (!p.biases) return invalid("biases is null");
  }
  return ok();
}

Status check_dequantize(const DequantizeParams& p) {
  if (Status s = check_rows(p.dtype, p.format, p.rows, p.dim); !s) return s;
  if (p.rows > 0) {
    if (!p.packed) return invalid("packed is null");
    if (!p.scales) return invalid("scales is null");
    if (!p.biases) return invalid("biases is null");
    if (!p.w) return invalid("w is null");
  }
  return ok();
}

Status check_attention(const AttentionParams& p) {
  if (!valid_dtype(p.dtype)) return invalid("dtype (" + num(int(p.dtype)) + ") is not f32, f16 or bf16");
  if (p.B < 1) return invalid("B (" + num(p.B) + ") must be at least 1");
  if (p.Hq < 1) return invalid("Hq (" + num(p.Hq) + ") must be at least 1");
  if (p.Hkv < 1) return invalid("Hkv (" + num(p.Hkv) + ") must be at least 1");
  if (p.Lq < 1) return invalid("Lq (" + num(p.Lq) + ") must be at least 1");
  if (p.N < 0) return invalid("N (" + num(p.N) + ") is negative");
  if (!supported_head_dim(p.D))
    return invalid("D (" + num(p.D) + ") is not supported: use a multiple of 32 from 32 to 512");
  if (p.Hq % p.Hkv != 0)
    return invalid("Hq (" + num(p.Hq) + ") is not a multiple of Hkv (" + num(p.Hkv) + ")");
  if (p.N > 0 && p.Lq > p.N)
    return invalid("Lq (" + num(p.Lq) + ") is larger than N (" + num(p.N) + ")");
  if (p.window < 0) return invalid("window (" + num(p.window) + ") is negative");
  if (p.num_threads < 0) return invalid("num_threads (" + num(p.num_threads) + ") is negative");
  if (!(p.scale == p.scale) || p.scale < 0.0f)
    return invalid("scale (" + std::to_string(p.scale) + ") must be positive, or 0 for 1/sqrt(D)");
  if (p.bool_mask && p.bool_mask_type != BoolMaskType::u8 && p.bool_mask_type != BoolMaskType::u32)
    return invalid("bool_mask_type (" + num(int(p.bool_mask_type)) + ") is not u8 or u32");
  if (p.precision != Precision::exact && p.precision != Precision::fast)
    return invalid("precision (" + num(int(p.precision)) + ") is not exact or fast");
  if (Status s = check_format("k.format.", p.k.format, p.D, "D"); !s) return s;
  if (Status s = check_format("v.format.", p.v.format, p.D, "D"); !s) return s;

  // Byte counts of every tensor must fit in 63 bits.
  Bytes qb, kvb, mb;
  qb.mul(p.B).mul(p.Hq).mul(p.Lq).mul(p.D).mul(4);
  if (qb.overflow) return invalid("q / out size (B * Hq * Lq * D) overflows a 64-bit byte count");
  kvb.mul(p.B).mul(p.Hkv).mul(p.N).mul(p.D).mul(4);
  if (kvb.overflow) return invalid("K/V cache size (B * Hkv * N * D) overflows a 64-bit byte count");
  if (p.bool_mask || p.float_mask) {
    mb.mul(p.B).mul(p.Hq).mul(p.Lq).mul(p.N).mul(4);
    if (mb.overflow) return invalid("mask size (B * Hq * Lq * N) overflows a 64-bit byte count");
  }

  if (Status s = check_strides("q_strides", p.q_strides, true); !s) return s;
  if (Status s = check_strides("out_strides", p.out_strides, false); !s) return s;
  if (Status s = check_strides("mask_strides", p.mask_strides, true); !s) return s;
  {
    const size_t ts = dtype_size(p.dtype);
    const int64_t kb = std::max<int64_t>(p.D * p.k.format.bits / 8, int64_t(p.D / p.k.format.group * ts));
    const int64_t vb = std::max<int64_t>(p.D * p.v.format.bits / 8, int64_t(p.D / p.v.format.group * ts));
    if (Status s = check_layout("k.layout.", p.k.layout, p.B, p.Hkv, p.N, kb); !s) return s;
    if (Status s = check_layout("v.layout.", p.v.layout, p.B, p.Hkv, p.N, vb); !s) return s;
  }

  if (!p.q) return invalid("q is null");
  if (!p.out) return invalid("out is null");
  if (p.N > 0) {
    if (!p.k.packed) return invalid("k.packed is null");
    if (!p.k.scales) return invalid("k.scales is null");
    if (!p.k.biases) return invalid("k.biases is null");
    if (!p.v.packed) return invalid("v.packed is null");
    if (!p.v.scales) return invalid("v.scales is null");
    if (!p.v.biases) return invalid("v.biases is null");
  }
  if (p.precision == Precision::fast)
    return make_status(StatusCode::unsupported,
                       "precision (fast) is not offered by any backend yet: use exact");
  return ok();
}

}  // namespace qsdpa::detail

namespace qsdpa::detail {

Status check_lengths_host(const AttentionParams& p) {
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = p.kv_lens ? p.kv_lens[b] : p.N;
    const int64_t l = p.q_lens ? p.q_lens[b] : p.Lq;
    if (n < 0 || n > p.N)
      return invalid("kv_lens[" + num(b) + "] (" + num(n) + ") is outside [0, N = " + num(p.N) + "]");
    if (l < 0 || l > p.Lq)
      return invalid("q_lens[" + num(b) + "] (" + num(l) + ") is outside [0, Lq = " + num(p.Lq) + "]");
    if (l > n && (p.q_lens || n > 0))
      return invalid("q_lens[" + num(b) + "] (" + num(l) + ") is larger than kv_lens[" + num(b) + "] (" + num(n) + ")");
  }
  return ok();
}

Status check_append(const AppendParams& p) {
  if (!valid_dtype(p.dtype)) return invalid("dtype (" + num(int(p.dtype)) + ") is not f32, f16 or bf16");
  if (p.layers < 1) return invalid("layers (" + num(p.layers) + ") must be at least 1");
  if (p.B < 1) return invalid("B (" + num(p.B) + ") must be at least 1");
  if (p.Hkv < 1) return invalid("Hkv (" + num(p.Hkv) + ") must be at least 1");
  if (p.L < 0) return invalid("L (" + num(p.L) + ") is negative");
  if (!supported_head_dim(p.D))
    return invalid("D (" + num(p.D) + ") is not supported: use a multiple of 32 from 32 to 512");
  if (p.capacity < 0) return invalid("capacity (" + num(p.capacity) + ") is negative");
  if (p.start < 0) return invalid("start (" + num(p.start) + ") is negative");
  if (!p.kv_lens && p.start + p.L > p.capacity)
    return invalid("start + L (" + num(p.start) + " + " + num(p.L) + ") exceeds capacity (" + num(p.capacity) + ")");
  if (p.layer_stride < 0) return invalid("layer_stride (" + num(p.layer_stride) + ") is negative");
  if (p.layers > 1 && p.layer_stride == 0) return invalid("layer_stride is 0 with several layers");
  if (Status s = check_format("k_cache.format.", p.k_cache.format, p.D, "D"); !s) return s;
  if (Status s = check_format("v_cache.format.", p.v_cache.format, p.D, "D"); !s) return s;
  const size_t ts = dtype_size(p.dtype);
  for (const auto* c : {&p.k_cache, &p.v_cache}) {
    const std::string w = c == &p.k_cache ? "k_cache.layout." : "v_cache.layout.";
    const int64_t rb = std::max<int64_t>(p.D * c->format.bits / 8, int64_t(p.D / c->format.group * ts));
    if (Status s = check_layout(w, c->layout, p.B, p.Hkv, p.capacity, rb); !s) return s;
    Bytes lb;
    lb.mul(p.layers).mul(std::max<int64_t>(p.layer_stride, 1)).mul(rb);
    if (lb.overflow) return invalid(w + "layers * layer_stride overflows a 64-bit byte count");
  }
  Bytes nb;
  nb.mul(p.layers).mul(p.B).mul(p.Hkv).mul(p.L).mul(p.D).mul(4);
  if (nb.overflow) return invalid("new rows (layers * B * Hkv * L * D) overflow a 64-bit byte count");
  if (p.L > 0) {
    if (!p.k) return invalid("k is null");
    if (!p.v) return invalid("v is null");
    for (auto [c, n] : {std::pair{&p.k_cache, "k_cache"}, std::pair{&p.v_cache, "v_cache"}}) {
      if (!c->packed) return invalid(std::string(n) + ".packed is null");
      if (!c->scales) return invalid(std::string(n) + ".scales is null");
      if (!c->biases) return invalid(std::string(n) + ".biases is null");
    }
  }
  return ok();
}

Status check_append_host(const AppendParams& p) {
  if (!p.kv_lens) return ok();
  for (int64_t b = 0; b < p.B; ++b)
    if (p.kv_lens[b] < 0 || int64_t(p.kv_lens[b]) + p.L > p.capacity)
      return invalid("kv_lens[" + num(b) + "] + L (" + num(p.kv_lens[b]) + " + " + num(p.L) +
                     ") is outside [0, capacity = " + num(p.capacity) + "]");
  return ok();
}

}  // namespace qsdpa::detail
