// SPEC section 5, one test per rule: each bad argument gives the right StatusCode, a message that
// names the argument (and its value), and leaves every output untouched (outputs are poisoned
// with a byte pattern first and compared afterwards). Argument checks come before the backend is
// chosen, so every backend, CUDA included, must answer the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/testutil.hpp"

using namespace qsdpa;

namespace {

constexpr Backend kAllBackends[] = {Backend::automatic, Backend::reference, Backend::cpu, Backend::cuda};
constexpr uint8_t kPoison = 0xa5;

// A pointer that must never be dereferenced: the overflow checks run before anything is read.
template <class T = void>
T* fake(uintptr_t v = 0x10) {
  return reinterpret_cast<T*>(v);
}

// A valid problem whose params each test breaks in one way.
struct Fixture {
  test::Problem pr;
  Fixture() : pr(make_case()) {}
  static test::Case make_case() {
    test::Case c;
    c.dtype = DType::f16;
    c.B = 1, c.Hq = 4, c.Hkv = 2, c.Lq = 2, c.N = 8, c.D = 64;
    c.sinks = true;
    return c;
  }
  AttentionParams params(Backend b) { return pr.params(b); }
};

std::string describe(const Status& s) { return std::string(to_string(s.code)) + ": \"" + s.message + "\""; }

// Runs attention(p) on every backend and checks code, message and that out is untouched.
void expect_attention_error(Fixture& f, AttentionParams p, StatusCode code,
                            std::initializer_list<const char*> needles) {
  for (Backend b : kAllBackends) {
    p.backend = b;
    if (p.out == f.pr.out.data()) std::memset(f.pr.out.data(), kPoison, f.pr.out.size());
    const Status s = attention(p);
    EXPECT_EQ(s.code, code) << to_string(b) << " gave " << describe(s);
    EXPECT_FALSE(s.ok());
    for (const char* n : needles)
      EXPECT_NE(s.message.find(n), std::string::npos)
          << to_string(b) << ": message " << describe(s) << " does not contain \"" << n << "\"";
    if (p.out == f.pr.out.data()) {
      for (size_t i = 0; i < f.pr.out.size(); ++i)
        ASSERT_EQ(f.pr.out[i], kPoison) << to_string(b) << ": out byte " << i << " was written";
    }
  }
}

}  // namespace

// ---- attention --------------------------------------------------------------------------------

TEST(Errors, ValidBaselineIsAccepted) {
  // The fixture itself is valid, so each error below comes from the one thing broken.
  Fixture f;
  for (Backend b : {Backend::automatic, Backend::reference, Backend::cpu}) {
    const Status s = attention(f.params(b));
    EXPECT_TRUE(s.ok()) << to_string(b) << ": " << describe(s);
  }
}

TEST(Errors, UnsupportedBits) {
  Fixture f;
  for (int bits : {0, 1, 3, 5, 6, 16, 32, -4}) {
    AttentionParams p = f.params(Backend::reference);
    p.k.format.bits = bits;
    const std::string k = "k.format.bits (" + std::to_string(bits) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {k.c_str()});
    p = f.params(Backend::reference);
    p.v.format.bits = bits;
    const std::string v = "v.format.bits (" + std::to_string(bits) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {v.c_str()});
  }
}

TEST(Errors, UnsupportedGroup) {
  Fixture f;
  for (int g : {0, 16, 48, 96, 256, -64}) {
    AttentionParams p = f.params(Backend::reference);
    p.k.format.group = g;
    const std::string k = "k.format.group (" + std::to_string(g) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {k.c_str()});
    p = f.params(Backend::reference);
    p.v.format.group = g;
    const std::string v = "v.format.group (" + std::to_string(g) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {v.c_str()});
  }
}

TEST(Errors, UnsupportedHeadDim) {
  Fixture f;
  for (int64_t D : {int64_t(0), int64_t(16), int64_t(48), int64_t(65), int64_t(544), int64_t(1024), int64_t(-64)}) {
    AttentionParams p = f.params(Backend::reference);
    p.D = D;
    const std::string n = "D (" + std::to_string(D) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {n.c_str()});
  }
}

TEST(Errors, UnsupportedDtype) {
  Fixture f;
  for (int t : {3, 7, -1}) {
    AttentionParams p = f.params(Backend::reference);
    p.dtype = DType(t);
    const std::string n = "dtype (" + std::to_string(t) + ")";
    expect_attention_error(f, p, StatusCode::invalid_argument, {n.c_str()});
  }
}

TEST(Errors, HeadDimNotMultipleOfGroup) {
  Fixture f;
  AttentionParams p = f.params(Backend::reference);
  p.D = 96;  // a supported head dim, but not a multiple of 64
  p.k.format.group = 64;
  p.v.format.group = 32;
  expect_attention_error(f, p, StatusCode::invalid_argument, {"D (96)", "k.format.group (64)"});
  p.k.format.group = 32;
  p.v.format.group = 128;
  expect_attention_error(f, p, StatusCode::invalid_argument, {"D (96)", "v.format.group (128)"});
}

TEST(Errors, HqNotMultipleOfHkv) {
  Fixture f;
  AttentionParams p = f.params(Backend::reference);
  p.Hq = 12;
  p.Hkv = 5;
  expect_attention_error(f, p, StatusCode::invalid_argument, {"Hq (12)", "Hkv (5)"});
  p.Hq = 2;
  p.Hkv = 4;  // fewer query heads than KV heads
  expect_attention_error(f, p, StatusCode::invalid_argument, {"Hq (2)", "Hkv (4)"});
}

TEST(Errors, LqLargerThanN) {
  Fixture f;
  AttentionParams p = f.params(Backend::reference);
  p.Lq = 9;  // N = 8
  expect_attention_error(f, p, StatusCode::invalid_argument, {"Lq (9)", "N (8)"});
}

TEST(Errors, NonPositiveSizes) {
  Fixture f;
  struct Bad {
    const char* needle;
    void (*apply)(AttentionParams&);
  };
  const Bad bad[] = {
      {"B (0)", [](AttentionParams& p) { p.B = 0; }},
      {"Hq (0)", [](AttentionParams& p) { p.Hq = 0; }},
      {"Hkv (0)", [](AttentionParams& p) { p.Hkv = 0; }},
      {"Hkv (-2)", [](AttentionParams& p) { p.Hkv = -2; }},
      {"Lq (0)", [](AttentionParams& p) { p.Lq = 0; }},
      {"N (-1)", [](AttentionParams& p) { p.N = -1; }},
      {"window (-3)", [](AttentionParams& p) { p.window = -3; }},
      {"scale", [](AttentionParams& p) { p.scale = -1.0f; }},
      {"scale", [](AttentionParams& p) { p.scale = std::nanf(""); }},
      {"bool_mask_type (9)",
       [](AttentionParams& p) {
         p.bool_mask = p.q;
         p.bool_mask_type = BoolMaskType(9);
       }},
      {"precision (5)", [](AttentionParams& p) { p.precision = Precision(5); }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.needle);
    AttentionParams p = f.params(Backend::reference);
    b.apply(p);
    expect_attention_error(f, p, StatusCode::invalid_argument, {b.needle});
  }
}

TEST(Errors, NullRequiredTensor) {
  Fixture f;
  struct Bad {
    const char* name;
    void (*apply)(AttentionParams&);
  };
  const Bad bad[] = {
      {"q", [](AttentionParams& p) { p.q = nullptr; }},
      {"k.packed", [](AttentionParams& p) { p.k.packed = nullptr; }},
      {"k.scales", [](AttentionParams& p) { p.k.scales = nullptr; }},
      {"k.biases", [](AttentionParams& p) { p.k.biases = nullptr; }},
      {"v.packed", [](AttentionParams& p) { p.v.packed = nullptr; }},
      {"v.scales", [](AttentionParams& p) { p.v.scales = nullptr; }},
      {"v.biases", [](AttentionParams& p) { p.v.biases = nullptr; }},
      {"out", [](AttentionParams& p) { p.out = nullptr; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    AttentionParams p = f.params(Backend::reference);
    b.apply(p);
    const std::string n = std::string(b.name) + " is null";
    expect_attention_error(f, p, StatusCode::invalid_argument, {n.c_str()});
  }
}

TEST(Errors, ByteCountOverflow) {
  // Every tensor pointer is fake (never readable) except out, which must stay untouched; the
  // sizes pass every shape rule but their byte counts do not fit in 63 bits.
  Fixture f;
  auto fake_params = [&]() {
    AttentionParams p = f.params(Backend::reference);
    p.q = fake();
    p.k.packed = fake<const uint32_t>(), p.k.scales = fake(), p.k.biases = fake();
    p.v.packed = fake<const uint32_t>(), p.v.scales = fake(), p.v.biases = fake();
    p.sinks = fake<const float>();
    return p;
  };
  {
    SCOPED_TRACE("K/V cache");
    AttentionParams p = fake_params();
    p.B = int64_t(1) << 20, p.Hq = 2, p.Hkv = 2, p.Lq = 1, p.N = int64_t(1) << 40, p.D = 64;
    expect_attention_error(f, p, StatusCode::invalid_argument, {"B * Hkv * N * D", "overflow"});
  }
  {
    SCOPED_TRACE("K/V cache, a product of exactly 2^64 (wraps to 0)");
    AttentionParams p = fake_params();
    p.B = int64_t(1) << 31, p.Hq = 1, p.Hkv = 1, p.Lq = 1, p.N = int64_t(1) << 25, p.D = 64;
    expect_attention_error(f, p, StatusCode::invalid_argument, {"overflow"});
  }
  {
    SCOPED_TRACE("q / out");
    AttentionParams p = fake_params();
    p.B = int64_t(1) << 30, p.Hq = int64_t(1) << 30, p.Hkv = 1, p.Lq = 4, p.N = 4, p.D = 64;
    expect_attention_error(f, p, StatusCode::invalid_argument, {"B * Hq * Lq * D", "overflow"});
  }
  {
    SCOPED_TRACE("mask");
    AttentionParams p = fake_params();
    p.B = 1, p.Hq = 1, p.Hkv = 1, p.Lq = int64_t(1) << 31, p.N = int64_t(1) << 31, p.D = 64;
    p.bool_mask = fake();
    expect_attention_error(f, p, StatusCode::invalid_argument, {"B * Hq * Lq * N", "overflow"});
    p.bool_mask = nullptr;
    p.float_mask = fake();
    expect_attention_error(f, p, StatusCode::invalid_argument, {"B * Hq * Lq * N", "overflow"});
  }
}

TEST(Errors, CudaNotBuiltOrNoDevice) {
  Fixture f;
  std::string why;
  if (backend_built(Backend::cuda) && backend_available(Backend::cuda, &why))
    GTEST_SKIP() << "a CUDA device is present: there is no error to see";
  // The attention data is in host memory, so a present device would also fail differently;
  // what matters here is the code for a backend that cannot run.
  const StatusCode want = backend_built(Backend::cuda) ? StatusCode::no_device : StatusCode::not_built;
  AttentionParams p = f.params(Backend::cuda);
  std::memset(f.pr.out.data(), kPoison, f.pr.out.size());
  Status s = attention(p);
  EXPECT_EQ(s.code, want) << describe(s);
  EXPECT_EQ(s.backend, Backend::cuda);
  EXPECT_NE(s.message.find("cuda"), std::string::npos) << describe(s);
  for (size_t i = 0; i < f.pr.out.size(); ++i) ASSERT_EQ(f.pr.out[i], kPoison) << "out byte " << i;
  EXPECT_EQ(attention_workspace_size(p), 0u);

  // quantize / dequantize too.
  std::vector<uint8_t> w(64 * 2, 1), sc(2 * 2, kPoison), bi(2 * 2, kPoison);
  std::vector<uint32_t> pk(8, 0xa5a5a5a5u);
  QuantizeParams qp;
  qp.dtype = DType::f16, qp.format = {4, 32}, qp.rows = 1, qp.dim = 64;
  qp.w = w.data(), qp.packed = pk.data(), qp.scales = sc.data(), qp.biases = bi.data();
  qp.backend = Backend::cuda;
  s = quantize(qp);
  EXPECT_EQ(s.code, want) << describe(s);
  for (uint32_t x : pk) ASSERT_EQ(x, 0xa5a5a5a5u);
  for (uint8_t x : sc) ASSERT_EQ(x, kPoison);
  for (uint8_t x : bi) ASSERT_EQ(x, kPoison);
  DequantizeParams dp;
  dp.dtype = DType::f16, dp.format = {4, 32}, dp.rows = 1, dp.dim = 64;
  dp.packed = pk.data(), dp.scales = sc.data(), dp.biases = bi.data(), dp.w = w.data();
  dp.backend = Backend::cuda;
  s = dequantize(dp);
  EXPECT_EQ(s.code, want) << describe(s);
  for (uint8_t x : w) ASSERT_EQ(x, 1);
}

TEST(Errors, UnknownBackend) {
  Fixture f;
  AttentionParams p = f.params(Backend(7));
  std::memset(f.pr.out.data(), kPoison, f.pr.out.size());
  const Status s = attention(p);
  EXPECT_EQ(s.code, StatusCode::invalid_argument) << describe(s);
  EXPECT_NE(s.message.find("backend (7)"), std::string::npos) << describe(s);
  for (size_t i = 0; i < f.pr.out.size(); ++i) ASSERT_EQ(f.pr.out[i], kPoison) << "out byte " << i;
}

TEST(Errors, PrecisionFastIsUnsupported) {
  Fixture f;
  AttentionParams p = f.params(Backend::reference);
  p.precision = Precision::fast;
  expect_attention_error(f, p, StatusCode::unsupported, {"precision (fast)"});
}

TEST(Errors, FirstBrokenRuleIsReportedNotACrash) {
  // Several things wrong at once, including null and fake pointers: still a clean error.
  Fixture f;
  AttentionParams p = f.params(Backend::reference);
  p.Hq = 7, p.Hkv = 3, p.D = 33, p.q = nullptr, p.k.packed = fake<const uint32_t>();
  std::memset(f.pr.out.data(), kPoison, f.pr.out.size());
  const Status s = attention(p);
  EXPECT_EQ(s.code, StatusCode::invalid_argument) << describe(s);
  EXPECT_FALSE(s.message.empty());
  for (size_t i = 0; i < f.pr.out.size(); ++i) ASSERT_EQ(f.pr.out[i], kPoison) << "out byte " << i;
}

// ---- quantize / dequantize --------------------------------------------------------------------

namespace {

struct QBufs {
  std::vector<uint8_t> w, scales, biases;
  std::vector<uint32_t> packed;
  QBufs() : w(4 * 128 * 4, 0x3c), scales(4 * 4 * 4, kPoison), biases(4 * 4 * 4, kPoison), packed(4 * 128, 0xa5a5a5a5u) {}
  QuantizeParams qparams(Backend b) {
    QuantizeParams p;
    p.dtype = DType::bf16, p.format = {4, 32}, p.rows = 4, p.dim = 128;
    p.w = w.data(), p.packed = packed.data(), p.scales = scales.data(), p.biases = biases.data();
    p.backend = b;
    return p;
  }
  DequantizeParams dparams(Backend b) {
    DequantizeParams p;
    p.dtype = DType::bf16, p.format = {4, 32}, p.rows = 4, p.dim = 128;
    p.packed = packed.data(), p.scales = scales.data(), p.biases = biases.data(), p.w = w.data();
    p.backend = b;
    return p;
  }
  void poison() {
    std::fill(w.begin(), w.end(), uint8_t(0x3c));
    std::fill(scales.begin(), scales.end(), kPoison);
    std::fill(biases.begin(), biases.end(), kPoison);
    std::fill(packed.begin(), packed.end(), 0xa5a5a5a5u);
  }
  bool untouched() const {
    for (uint8_t x : w)
      if (x != 0x3c) return false;
    for (uint8_t x : scales)
      if (x != kPoison) return false;
    for (uint8_t x : biases)
      if (x != kPoison) return false;
    for (uint32_t x : packed)
      if (x != 0xa5a5a5a5u) return false;
    return true;
  }
};

template <class Params, class Fn>
void expect_q_error(QBufs& bufs, Params p, Fn&& call, StatusCode code, std::initializer_list<const char*> needles) {
  for (Backend b : kAllBackends) {
    p.backend = b;
    bufs.poison();
    const Status s = call(p);
    EXPECT_EQ(s.code, code) << to_string(b) << " gave " << describe(s);
    for (const char* n : needles)
      EXPECT_NE(s.message.find(n), std::string::npos)
          << to_string(b) << ": message " << describe(s) << " does not contain \"" << n << "\"";
    EXPECT_TRUE(bufs.untouched()) << to_string(b) << ": an output was written";
  }
}

const auto kQ = [](const QuantizeParams& p) { return quantize(p); };
const auto kDQ = [](const DequantizeParams& p) { return dequantize(p); };

}  // namespace

TEST(Errors, QuantizeValidBaselineIsAccepted) {
  QBufs q;
  EXPECT_TRUE(quantize(q.qparams(Backend::reference)).ok());
  EXPECT_TRUE(dequantize(q.dparams(Backend::cpu)).ok());
}

TEST(Errors, QuantizeBadFormatAndShape) {
  QBufs q;
  struct Bad {
    const char* needle;
    void (*apply)(QuantFormat&, int64_t& rows, int64_t& dim, DType& t);
  };
  const Bad bad[] = {
      {"bits (3)", [](QuantFormat& f, int64_t&, int64_t&, DType&) { f.bits = 3; }},
      {"bits (16)", [](QuantFormat& f, int64_t&, int64_t&, DType&) { f.bits = 16; }},
      {"group (16)", [](QuantFormat& f, int64_t&, int64_t&, DType&) { f.group = 16; }},
      {"group (256)", [](QuantFormat& f, int64_t&, int64_t&, DType&) { f.group = 256; }},
      {"dim (96)", [](QuantFormat& f, int64_t&, int64_t& d, DType&) { f.group = 64, d = 96; }},
      {"dim (0)", [](QuantFormat&, int64_t&, int64_t& d, DType&) { d = 0; }},
      {"rows (-1)", [](QuantFormat&, int64_t& r, int64_t&, DType&) { r = -1; }},
      {"dtype (5)", [](QuantFormat&, int64_t&, int64_t&, DType& t) { t = DType(5); }},
      {"overflow", [](QuantFormat&, int64_t& r, int64_t& d, DType&) { r = int64_t(1) << 58, d = 64; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.needle);
    QuantizeParams p = q.qparams(Backend::reference);
    b.apply(p.format, p.rows, p.dim, p.dtype);
    expect_q_error(q, p, kQ, StatusCode::invalid_argument, {b.needle});
    DequantizeParams d = q.dparams(Backend::reference);
    b.apply(d.format, d.rows, d.dim, d.dtype);
    expect_q_error(q, d, kDQ, StatusCode::invalid_argument, {b.needle});
  }
}

TEST(Errors, QuantizeNullPointers) {
  QBufs q;
  {
    QuantizeParams p = q.qparams(Backend::reference);
    p.w = nullptr;
    expect_q_error(q, p, kQ, StatusCode::invalid_argument, {"w is null"});
    p = q.qparams(Backend::reference);
    p.packed = nullptr;
    expect_q_error(q, p, kQ, StatusCode::invalid_argument, {"packed is null"});
    p = q.qparams(Backend::reference);
    p.scales = nullptr;
    expect_q_error(q, p, kQ, StatusCode::invalid_argument, {"scales is null"});
    p = q.qparams(Backend::reference);
    p.biases = nullptr;
    expect_q_error(q, p, kQ, StatusCode::invalid_argument, {"biases is null"});
  }
  {
    DequantizeParams p = q.dparams(Backend::reference);
    p.packed = nullptr;
    expect_q_error(q, p, kDQ, StatusCode::invalid_argument, {"packed is null"});
    p = q.dparams(Backend::reference);
    p.scales = nullptr;
    expect_q_error(q, p, kDQ, StatusCode::invalid_argument, {"scales is null"});
    p = q.dparams(Backend::reference);
    p.biases = nullptr;
    expect_q_error(q, p, kDQ, StatusCode::invalid_argument, {"biases is null"});
    p = q.dparams(Backend::reference);
    p.w = nullptr;
    expect_q_error(q, p, kDQ, StatusCode::invalid_argument, {"w is null"});
  }
}

TEST(Errors, QuantizeOverflowReadsNothing) {
  QBufs q;
  QuantizeParams p = q.qparams(Backend::reference);
  p.rows = int64_t(1) << 56, p.dim = 512;
  p.w = fake();
  expect_q_error(q, p, kQ, StatusCode::invalid_argument, {"rows * dim", "overflow"});
  DequantizeParams d = q.dparams(Backend::reference);
  d.rows = int64_t(1) << 56, d.dim = 512;
  d.packed = fake<const uint32_t>(), d.scales = fake(), d.biases = fake();
  expect_q_error(q, d, kDQ, StatusCode::invalid_argument, {"rows * dim", "overflow"});
}
