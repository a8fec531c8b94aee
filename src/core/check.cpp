// Argument checks (SPEC section 5): every rule returns an error naming the argument and the rule,
// before anything is written.
#include <limits>
#include <string>

#include "backends.hpp"
#include "format.hpp"

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
