// Serving layouts on the host backends: caches with spare capacity, token-major and paged caches,
// strided q / out, broadcast masks, per-sequence lengths, mixed K / V formats, append, and a
// decode loop over a growing paged cache.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "../src/cpu/kernel.hpp"
#include "common/serving.hpp"

namespace qsdpa::test {
namespace {

const PtrMap kHost = [](const void* p, size_t) { return p; };

class Serving : public ::testing::TestWithParam<int> {};

// The oracle on a laid-out problem equals the oracle on the dense one, exactly: the layout only
// moves rows.
TEST_P(Serving, ReferenceLayoutIsOnlyAddressing) {
  ServingCase sc = serving_cases()[size_t(GetParam())];
  SCOPED_TRACE(sc.str());
  ServingProblem sp(sc);
  AttentionParams lp = sp.params(Backend::reference, kHost);
  lp.out = sp.out.data();
  AttentionParams dp = sp.dense_params();
  const size_t n = size_t(sc.c.B * sc.c.Hq * sc.c.Lq * sc.c.D);
  std::vector<double> a(n), b(n);
  detail::reference_attention_f64(lp, a.data());
  detail::reference_attention_f64(dp, b.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

// Per-sequence lengths mean what a batch of separate calls means: sequence b alone, with
// N = kv_lens[b] and Lq = q_lens[b] (rows past it zero).
TEST_P(Serving, ReferenceLengthsAreSeparateCalls) {
  ServingCase sc = serving_cases()[size_t(GetParam())];
  if (sc.kv_lens.empty() && sc.q_lens.empty()) GTEST_SKIP() << "no per-sequence lengths in this case";
  SCOPED_TRACE(sc.str());
  const Case& c = sc.c;
  ServingProblem sp(sc);
  AttentionParams dp = sp.dense_params();
  std::vector<double> all(size_t(c.B * c.Hq * c.Lq * c.D));
  detail::reference_attention_f64(dp, all.data());
  const int64_t ts = int64_t(tsize(c.dtype));
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t n = sc.kv_lens.empty() ? c.N : sc.kv_lens[size_t(b)];
    const int64_t lq = sc.q_lens.empty() ? c.Lq : sc.q_lens[size_t(b)];
    // Sequence b as its own problem: its first n tokens, its first lq query rows.
    AttentionParams one = dp;
    one.B = 1, one.N = n, one.Lq = std::max<int64_t>(lq, 1), one.kv_lens = one.q_lens = nullptr;
    const int64_t wk = c.D * c.kf.bits / 32, wv = c.D * c.vf.bits / 32, gk = c.D / c.kf.group, gv = c.D / c.vf.group;
    std::vector<uint32_t> kp, vp;
    std::vector<uint8_t> ks, kb, vs, vb, q, bm, fm;
    for (int64_t h = 0; h < c.Hkv; ++h) {
      const int64_t r0 = (b * c.Hkv + h) * c.N;
      kp.insert(kp.end(), sp.dense.k.packed.begin() + r0 * wk, sp.dense.k.packed.begin() + (r0 + n) * wk);
      vp.insert(vp.end(), sp.dense.v.packed.begin() + r0 * wv, sp.dense.v.packed.begin() + (r0 + n) * wv);
      ks.insert(ks.end(), sp.dense.k.scales.begin() + r0 * gk * ts, sp.dense.k.scales.begin() + (r0 + n) * gk * ts);
      kb.insert(kb.end(), sp.dense.k.biases.begin() + r0 * gk * ts, sp.dense.k.biases.begin() + (r0 + n) * gk * ts);
      vs.insert(vs.end(), sp.dense.v.scales.begin() + r0 * gv * ts, sp.dense.v.scales.begin() + (r0 + n) * gv * ts);
      vb.insert(vb.end(), sp.dense.v.biases.begin() + r0 * gv * ts, sp.dense.v.biases.begin() + (r0 + n) * gv * ts);
    }
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < one.Lq; ++i) {
        const int64_t qr = (b * c.Hq + h) * c.Lq + i;
        q.insert(q.end(), sp.dense.q.begin() + qr * c.D * ts, sp.dense.q.begin() + (qr + 1) * c.D * ts);
        const int64_t es = c.bool_mask == MaskKind::u32 ? 4 : 1;
        if (!sp.dense.bool_mask.empty())
          bm.insert(bm.end(), sp.dense.bool_mask.begin() + qr * c.N * es, sp.dense.bool_mask.begin() + (qr * c.N + n) * es);
        if (!sp.dense.float_mask.empty())
          fm.insert(fm.end(), sp.dense.float_mask.begin() + qr * c.N * ts, sp.dense.float_mask.begin() + (qr * c.N + n) * ts);
      }
    one.k.packed = kp.data(), one.k.scales = ks.data(), one.k.biases = kb.data();
    one.v.packed = vp.data(), one.v.scales = vs.data(), one.v.biases = vb.data();
    one.q = q.data();
    one.bool_mask = bm.empty() ? nullptr : bm.data();
    one.float_mask = fm.empty() ? nullptr : fm.data();
    std::vector<double> got(size_t(c.Hq * one.Lq * c.D));
    detail::reference_attention_f64(one, got.data());
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Lq; ++i)
        for (int64_t d = 0; d < c.D; ++d) {
          const double want = i < lq ? got[size_t((h * one.Lq + i) * c.D + d)] : 0.0;
          ASSERT_EQ(all[size_t(((b * c.Hq + h) * c.Lq + i) * c.D + d)], want)
              << "b=" << b << " h=" << h << " i=" << i << " d=" << d;
        }
  }
}

void run_backend(Backend be, int param) {
  ServingCase sc = serving_cases()[size_t(param)];
  SCOPED_TRACE(sc.str());
  ServingProblem sp(sc);
  AttentionParams p = sp.params(be, kHost);
  p.out = sp.out.data();
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  const std::string err = sp.check(sp.out);
  EXPECT_EQ(err, "");
}

TEST_P(Serving, Reference) { run_backend(Backend::reference, GetParam()); }
TEST_P(Serving, Cpu) { run_backend(Backend::cpu, GetParam()); }
TEST_P(Serving, CpuPortableKernel) {
  detail::cpu::set_kernel_choice(detail::cpu::KernelChoice::portable);
  run_backend(Backend::cpu, GetParam());
  detail::cpu::set_kernel_choice(detail::cpu::KernelChoice::automatic);
}

INSTANTIATE_TEST_SUITE_P(Cases, Serving, ::testing::Range(0, int(serving_cases().size())));

// ---- append -------------------------------------------------------------------------------------

// Appending rows writes exactly what quantize() writes for them, where the layout says, for several
// layers at once, and nothing else.
TEST(Append, BitIdenticalToQuantize) {
  for (CacheKind kind : {CacheKind::dense, CacheKind::capacity, CacheKind::token_major, CacheKind::paged})
    for (DType t : {DType::f16, DType::bf16, DType::f32}) {
      ServingCase sc;
      sc.kind = kind;
      sc.c.dtype = t;
      sc.c.B = 3, sc.c.Hkv = 2, sc.c.D = 128, sc.c.N = 100;
      sc.c.kf = {8, 32}, sc.c.vf = {4, 64};
      sc.page_size = 32;
      sc.kv_lens = {37, 0, 64};  // tokens already in each sequence
      SCOPED_TRACE(sc.str());
      ServingProblem sp(sc);
      const int64_t L = 3, layers = 2, ts = int64_t(tsize(t));
      // Two layers in one pool: the second layer's rows sit layer_stride rows after the first.
      auto two = [&](LaidCache& lc) {
        const size_t w = lc.packed.size(), s = lc.scales.size();
        lc.packed.resize(2 * w);
        for (size_t i = w; i < 2 * w; ++i) lc.packed[i] = lc.packed[i - w] ^ 0x5a5a5a5au;
        lc.scales.resize(2 * s, 0xff);
        lc.biases.resize(2 * s, 0xff);
      };
      const int64_t kw = sc.c.D * sc.c.kf.bits / 32, vw = sc.c.D * sc.c.vf.bits / 32;
      const int64_t layer_stride = int64_t(sp.k.packed.size()) / kw;
      ASSERT_EQ(layer_stride, int64_t(sp.v.packed.size()) / vw);
      two(sp.k);
      two(sp.v);
      LaidCache k0 = sp.k, v0 = sp.v;
      std::mt19937_64 rng(5);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      const int64_t nrows = layers * sc.c.B * sc.c.Hkv * L;
      auto kn = make_typed(t, nrows * sc.c.D, [&](int64_t) { return nd(rng); });
      auto vn = make_typed(t, nrows * sc.c.D, [&](int64_t) { return nd(rng); });

      AppendParams ap;
      ap.dtype = t;
      ap.layers = layers, ap.B = sc.c.B, ap.Hkv = sc.c.Hkv, ap.L = L, ap.D = sc.c.D, ap.capacity = sc.c.N;
      ap.k = kn.data(), ap.v = vn.data();
      ap.k_cache = {sc.c.kf, sp.k.packed.data(), sp.k.scales.data(), sp.k.biases.data(), sp.k.layout};
      ap.v_cache = {sc.c.vf, sp.v.packed.data(), sp.v.scales.data(), sp.v.biases.data(), sp.v.layout};
      ap.k_cache.layout.block_table = sp.k.block_table.empty() ? nullptr : sp.k.block_table.data();
      ap.v_cache.layout.block_table = sp.v.block_table.empty() ? nullptr : sp.v.block_table.data();
      ap.layer_stride = layer_stride;
      ap.kv_lens = sc.kv_lens.data();
      ap.backend = Backend::cpu;
      const Status s = append(ap);
      ASSERT_TRUE(s.ok()) << s.message;

      // Expected: the pool before, with quantize()'s rows at the appended places.
      HostCache kq = quantize_host(t, sc.c.kf, nrows, sc.c.D, kn), vq = quantize_host(t, sc.c.vf, nrows, sc.c.D, vn);
      const detail::RowMap km = detail::resolve_layout(ap.k_cache.layout, sc.c.Hkv, sc.c.N);
      const detail::RowMap vm = detail::resolve_layout(ap.v_cache.layout, sc.c.Hkv, sc.c.N);
      for (int64_t layer = 0; layer < layers; ++layer)
        for (int64_t b = 0; b < sc.c.B; ++b)
          for (int64_t h = 0; h < sc.c.Hkv; ++h)
            for (int64_t i = 0; i < L; ++i) {
              const int64_t src = ((layer * sc.c.B + b) * sc.c.Hkv + h) * L + i;
              for (auto [lc, q, m, f] : {std::tuple{&k0, &kq, &km, sc.c.kf}, std::tuple{&v0, &vq, &vm, sc.c.vf}}) {
                const int64_t row = layer * layer_stride + m->row(b, h, sc.kv_lens[size_t(b)] + i);
                const int64_t w = sc.c.D * f.bits / 32, g = sc.c.D / f.group * ts;
                std::copy_n(q->packed.begin() + src * w, w, lc->packed.begin() + row * w);
                std::copy_n(q->scales.begin() + src * g, g, lc->scales.begin() + row * g);
                std::copy_n(q->biases.begin() + src * g, g, lc->biases.begin() + row * g);
              }
            }
      EXPECT_TRUE(k0.packed == sp.k.packed);
      EXPECT_TRUE(k0.scales == sp.k.scales);
      EXPECT_TRUE(k0.biases == sp.k.biases);
      EXPECT_TRUE(v0.packed == sp.v.packed);
      EXPECT_TRUE(v0.scales == sp.v.scales);
      EXPECT_TRUE(v0.biases == sp.v.biases);
    }
}

TEST(Append, Errors) {
  std::vector<uint32_t> kp(4096, 7), vp(4096, 7);
  std::vector<uint8_t> ks(4096, 3), kb(4096, 3), vs(4096, 3), vb(4096, 3), kn(4096), vn(4096);
  auto base = [&] {
    AppendParams ap;
    ap.B = 2, ap.Hkv = 1, ap.L = 2, ap.D = 64, ap.capacity = 8;
    ap.k = kn.data(), ap.v = vn.data();
    ap.k_cache = {{4, 64}, kp.data(), ks.data(), kb.data(), {}};
    ap.v_cache = {{4, 64}, vp.data(), vs.data(), vb.data(), {}};
    ap.backend = Backend::cpu;
    return ap;
  };
  const auto kp0 = kp;
  auto expect = [&](AppendParams ap, const char* what) {
    const Status s = append(ap);
    EXPECT_EQ(s.code, StatusCode::invalid_argument) << what;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
    EXPECT_TRUE(kp == kp0) << what << ": the cache was written";
  };
  {
    AppendParams ap = base();
    ap.start = 7;  // 7 + 2 > 8
    expect(ap, "exceeds capacity");
  }
  {
    AppendParams ap = base();
    const int32_t lens[2] = {0, 7};
    ap.kv_lens = lens;
    expect(ap, "kv_lens[1]");
  }
  {
    AppendParams ap = base();
    ap.k = nullptr;
    expect(ap, "k is null");
  }
  {
    AppendParams ap = base();
    ap.v_cache.format.group = 48;
    expect(ap, "v_cache.format.group");
  }
  {
    AppendParams ap = base();
    const int32_t bt[2] = {0, 1};
    ap.k_cache.layout.block_table = bt;
    ap.k_cache.layout.page_size = 24;
    expect(ap, "page_size (24)");
  }
  {
    AppendParams ap = base();
    ap.layers = 2;
    expect(ap, "layer_stride is 0");
  }
}

// ---- attention argument rules of the serving layouts ----------------------------------------------

TEST(ServingErrors, Rules) {
  ServingCase sc;
  sc.c.N = 40, sc.c.B = 2;
  ServingProblem sp(sc);
  auto expect = [&](AttentionParams p, const char* what) {
    sp.out.assign(sp.out.size(), 0xff);
    p.out = sp.out.data();
    const Status s = attention(p);
    EXPECT_EQ(s.code, StatusCode::invalid_argument) << what;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
    for (uint8_t x : sp.out) ASSERT_EQ(x, 0xff) << what << ": out was written";
  };
  for (Backend be : {Backend::reference, Backend::cpu}) {
    {
      AttentionParams p = sp.params(be, kHost);
      p.k.layout.token_stride = 0;
      expect(p, "k.layout.token_stride (0)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      p.v.layout.head_stride = -5;
      expect(p, "v.layout.head_stride (-5) is negative");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      p.k.layout.page_size = 16;  // without a block table
      expect(p, "block_table is null");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      const int32_t bt[6] = {0, 1, 2, 3, 4, 5};
      p.k.layout.block_table = bt;
      p.k.layout.page_size = 16;
      p.k.layout.block_table_stride = 2;  // 40 tokens need 3 pages
      expect(p, "block_table_stride (2)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      p.out_strides.h = 0;
      expect(p, "out_strides.h (0)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      p.q_strides.l = -2;
      expect(p, "q_strides.l (-2)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      const int32_t lens[2] = {40, 41};
      p.kv_lens = lens;
      expect(p, "kv_lens[1] (41)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      const int32_t kl[2] = {40, 3}, ql[2] = {1, 2};
      p.kv_lens = kl;
      p.q_lens = ql;
      expect(p, "q_lens[1] (2)");
    }
    {
      AttentionParams p = sp.params(be, kHost);
      p.k.layout.head_stride = int64_t(1) << 62;
      expect(p, "overflow");
    }
  }
}

// ---- a decode loop over a growing paged cache -----------------------------------------------------

// 64 steps of: append one token's K and V (all layers' heads, one call) to a paged cache, attend
// with per-sequence lengths. Each step matches the oracle run on a contiguous cache quantized from
// all the rows so far.
void decode_loop(Backend be) {
  const DType t = DType::f16;
  const int64_t B = 2, Hq = 8, Hkv = 2, D = 128, ps = 16, steps = 64;
  const QuantFormat kf{8, 64}, vf{4, 64};
  const int64_t prompt[B] = {5, 40};
  const int64_t cap = 40 + steps, per_seq = (cap + ps - 1) / ps, pages = B * per_seq;
  const int64_t kw = D * kf.bits / 32, vw = D * vf.bits / 32, gk = D / kf.group, gv = D / vf.group, ts = 2;
  std::vector<uint32_t> kp(size_t(pages * Hkv * ps * kw)), vp(size_t(pages * Hkv * ps * vw));
  std::vector<uint8_t> ks(size_t(pages * Hkv * ps * gk * ts)), kb(ks.size()), vs(size_t(pages * Hkv * ps * gv * ts)),
      vb(vs.size());
  std::vector<int32_t> bt(static_cast<size_t>(pages));
  std::iota(bt.begin(), bt.end(), 0);
  std::mt19937_64 rng(42);
  std::shuffle(bt.begin(), bt.end(), rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // All K / V rows of every sequence, in order ([B][Hkv][tokens][D] as floats).
  std::vector<std::vector<float>> kall(B * Hkv), vall(B * Hkv);
  std::vector<int32_t> lens(B, 0);

  AppendParams ap;
  ap.dtype = t, ap.B = B, ap.Hkv = Hkv, ap.D = D, ap.capacity = cap;
  ap.k_cache = {kf, kp.data(), ks.data(), kb.data(), {}};
  ap.v_cache = {vf, vp.data(), vs.data(), vb.data(), {}};
  for (auto* c : {&ap.k_cache, &ap.v_cache}) {
    c->layout.block_table = bt.data();
    c->layout.page_size = ps;
    c->layout.block_table_stride = per_seq;
  }
  ap.kv_lens = lens.data();
  ap.backend = be;
  // The prompts: one append per sequence length (B = 1 calls with a block table offset).
  auto new_rows = [&](int64_t b, int64_t L) {
    std::vector<uint8_t> kn(size_t(Hkv * L * D * ts)), vn(kn.size());
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const float kx = nd(rng) + 0.5f, vx = nd(rng);
          detail::store_f32(kn.data(), t, (h * L + i) * D + d, kx);
          detail::store_f32(vn.data(), t, (h * L + i) * D + d, vx);
          kall[size_t(b * Hkv + h)].push_back(detail::load_f32(kn.data(), t, (h * L + i) * D + d));
          vall[size_t(b * Hkv + h)].push_back(detail::load_f32(vn.data(), t, (h * L + i) * D + d));
        }
    return std::pair{kn, vn};
  };
  for (int64_t b = 0; b < B; ++b) {
    auto [kn, vn] = new_rows(b, prompt[b]);
    AppendParams one = ap;
    one.B = 1, one.L = prompt[b], one.k = kn.data(), one.v = vn.data();
    one.kv_lens = lens.data() + b;
    for (auto* c : {&one.k_cache, &one.v_cache}) c->layout.block_table = bt.data() + b * per_seq;
    const Status s = append(one);
    ASSERT_TRUE(s.ok()) << s.message;
    lens[size_t(b)] = int32_t(prompt[b]);
  }
  for (int64_t step = 0; step < steps; ++step) {
    // append one token per sequence (both sequences' heads in one call)
    std::vector<uint8_t> kn(size_t(B * Hkv * D * ts)), vn(kn.size());
    for (int64_t b = 0; b < B; ++b) {
      auto [k1, v1] = new_rows(b, 1);
      std::copy(k1.begin(), k1.end(), kn.begin() + b * Hkv * D * ts);
      std::copy(v1.begin(), v1.end(), vn.begin() + b * Hkv * D * ts);
    }
    ap.L = 1, ap.k = kn.data(), ap.v = vn.data();
    Status s = append(ap);
    ASSERT_TRUE(s.ok()) << s.message;
    for (auto& n : lens) ++n;

    // attend
    std::vector<uint8_t> q = make_typed(t, B * Hq * D, [&](int64_t) { return nd(rng); });
    std::vector<uint8_t> out(q.size(), 0xff);
    AttentionParams p;
    p.dtype = t, p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Lq = 1, p.D = D;
    p.N = *std::max_element(lens.begin(), lens.end());
    p.q = q.data(), p.out = out.data();
    p.k = {kf, kp.data(), ks.data(), kb.data(), ap.k_cache.layout};
    p.v = {vf, vp.data(), vs.data(), vb.data(), ap.v_cache.layout};
    p.k.layout.block_table_stride = p.v.layout.block_table_stride = per_seq;
    p.kv_lens = lens.data();
    p.window = step % 3 == 2 ? 20 : 0;
    p.backend = be;
    s = attention(p);
    ASSERT_TRUE(s.ok()) << s.message;

    ASSERT_EQ(check_step_on_contiguous(p, kf, vf, kall, vall, out.data()), "") << "step " << step;
  }
}

TEST(DecodeLoop, PagedAppendAttendReference) { decode_loop(Backend::reference); }
TEST(DecodeLoop, PagedAppendAttendCpu) { decode_loop(Backend::cpu); }

// ---- a cache of more than 2^32 elements ------------------------------------------------------------

// Anonymous memory reserved but not committed (MAP_NORESERVE): only the pages written or read
// become resident, so a 2 GB cache of which 600 rows are used costs a few MB.
class Sparse {
 public:
  explicit Sparse(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Sparse() {
    if (p_) munmap(p_, bytes_);
  }
  Sparse(const Sparse&) = delete;
  Sparse& operator=(const Sparse&) = delete;
  uint8_t* get() const { return p_; }

 private:
  uint8_t* p_ = nullptr;
  size_t bytes_;
};

// The CPU backend on a cache of 2^25 + 512 rows of 128 elements (more than 2^32 elements, 64-bit
// offsets throughout): a two-sequence batch whose second sequence starts at row 2^25, element 2^32
// (the same problem as CudaServingLarge.CacheOverFourBillionElements). Skipped where the address
// space cannot be reserved.
TEST(ServingLarge, CacheOverFourBillionElementsCpu) {
  const int64_t D = 128, cap = (int64_t(1) << 25) + 512, Hkv = 1;
  const QuantFormat f{4, 64};
  const size_t packed_bytes = size_t(Hkv * cap * D * 4 / 8), scale_bytes = size_t(Hkv * cap * (D / 64) * 2);
  ServingCase sc;
  sc.c.B = 2, sc.c.Hq = 4, sc.c.Hkv = Hkv, sc.c.N = 300, sc.c.D = D, sc.c.kf = sc.c.vf = f;
  sc.c.seed = 77;
  ServingProblem sp(sc);  // dense host data: rows [b][t]
  Sparse kp(packed_bytes), vp(packed_bytes), ks(scale_bytes), kb(scale_bytes), vs(scale_bytes), vb(scale_bytes);
  for (const Sparse* m : {&kp, &vp, &ks, &kb, &vs, &vb})
    if (!m->get()) GTEST_SKIP() << "cannot reserve " << (2 * (packed_bytes + 2 * scale_bytes) >> 20) << " MiB";
  const int64_t bstride = int64_t(1) << 25;  // sequence 1 starts at element 2^32
  const size_t rowp = size_t(D * 4 / 8), rows_s = size_t(D / 64) * 2, n = 300;
  for (int64_t b = 0; b < 2; ++b) {
    const size_t off = size_t(b * bstride);
    const auto put = [&](const Sparse& dst, const void* src, size_t row_bytes) {
      std::memcpy(dst.get() + off * row_bytes, static_cast<const uint8_t*>(src) + size_t(b) * n * row_bytes,
                  n * row_bytes);
    };
    put(kp, sp.dense.k.packed.data(), rowp);
    put(vp, sp.dense.v.packed.data(), rowp);
    put(ks, sp.dense.k.scales.data(), rows_s);
    put(kb, sp.dense.k.biases.data(), rows_s);
    put(vs, sp.dense.v.scales.data(), rows_s);
    put(vb, sp.dense.v.biases.data(), rows_s);
  }
  AttentionParams p = sp.params(Backend::cpu, kHost);
  p.k = {f, reinterpret_cast<const uint32_t*>(kp.get()), ks.get(), kb.get(), {}};
  p.v = {f, reinterpret_cast<const uint32_t*>(vp.get()), vs.get(), vb.get(), {}};
  p.k.layout.head_stride = p.v.layout.head_stride = bstride;
  p.k.layout.batch_stride = p.v.layout.batch_stride = bstride;
  std::vector<uint8_t> res = sp.out;
  p.out = res.data();
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(sp.check(res), "");
  // (the element offset of sequence 1's first row does not fit 32 bits)
  EXPECT_GT(bstride * D, int64_t(UINT32_MAX));
}

}  // namespace
}  // namespace qsdpa::test
