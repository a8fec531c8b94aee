// The two-pass study (src/cuda/logits_qk.cu, pv_slices.cu): the first pass against the host's dot
// products (S = scale q·k̂ for every query row of a KV head's group and every token, k̂ = s n + z
// from the packed MLX words), both passes against the reference attention, and what pass 1 refuses.
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_testutil.hpp"

namespace qsdpa {
namespace {

struct Case {
  int B, Hq, Hkv, Lq, N, D, bits;
  int tiles_per_warp = 0;  // (0: the kernel's default)
};

void run_case(const Case& cs, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << cs.B << " Hq=" << cs.Hq << " Hkv=" << cs.Hkv << " Lq=" << cs.Lq
                                    << " N=" << cs.N << " D=" << cs.D << " bits=" << cs.bits
                                    << " tiles_per_warp=" << cs.tiles_per_warp);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int rep = cs.Hq / cs.Hkv, R = rep * cs.Lq, NG = cs.D / 64, WPR = cs.D * cs.bits / 32;
  const int RS = R <= 8 ? 8 : 16;  // S's rows per token
  const int64_t rows_kv = int64_t(cs.B) * cs.Hkv * cs.N;
  // q: each query row at its own magnitude (1e-3 .. 1e2), so that the per-row power of two matters
  std::vector<uint16_t> q(size_t(cs.B) * cs.Hq * cs.Lq * cs.D);
  for (size_t r = 0; r < q.size() / cs.D; ++r) {
    const float mag = std::pow(10.0f, float(r % 6) - 3.0f);
    for (int d = 0; d < cs.D; ++d) q[r * cs.D + d] = detail::f32_to_f16(mag * uni(rng));
  }
  std::vector<uint32_t> k(size_t(rows_kv) * WPR);
  for (auto& w : k) w = uint32_t(rng());
  std::vector<uint16_t> ks(size_t(rows_kv) * NG), kb(ks.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    ks[i] = detail::f32_to_f16(0.002f + 0.05f * std::fabs(uni(rng)) * (i % 3 == 0 ? -1.0f : 1.0f));
    kb[i] = detail::f32_to_f16(uni(rng));
  }
  const float scale = 1.0f / std::sqrt(float(cs.D));
  const test::DeviceBuffer dq(q), dk(k), dks(ks), dkb(kb), ds(size_t(rows_kv) * RS * sizeof(float));
  CUDA_ASSERT(cudaMemset(ds.get(), 0xff, ds.bytes()));  // NaN: every entry must be written
  CUDA_ASSERT(cudaDeviceSynchronize());
  cuda::LogitsQK p;
  p.q = dq.get(), p.k = dk.get(), p.k_scales = dks.get(), p.k_biases = dkb.get(), p.s = ds.as<float>();
  p.B = cs.B, p.Hq = cs.Hq, p.Hkv = cs.Hkv, p.Lq = cs.Lq, p.N = cs.N, p.D = cs.D, p.bits = cs.bits;
  p.scale = scale;
  p.tiles_per_warp = cs.tiles_per_warp;
  const Status st = cuda::logits_qk(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got(size_t(rows_kv) * RS);
  CUDA_ASSERT(cudaMemcpy(got.data(), ds.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost));

  const int per_word = 32 / cs.bits;
  const uint32_t mask = (1u << cs.bits) - 1u;
  int64_t bad = 0;
  double worst = 0.0;
  std::vector<double> kh(cs.D);
  for (int b = 0; b < cs.B; ++b)
    for (int h = 0; h < cs.Hkv; ++h)
      for (int t = 0; t < cs.N; ++t) {
        const int64_t row = (int64_t(b) * cs.Hkv + h) * cs.N + t;
        for (int d = 0; d < cs.D; ++d) {
          const uint32_t code = (k[size_t(row) * WPR + d / per_word] >> (cs.bits * (d % per_word))) & mask;
          kh[d] = double(detail::f16_to_f32(ks[size_t(row) * NG + d / 64])) * code + double(detail::f16_to_f32(kb[size_t(row) * NG + d / 64]));
        }
        for (int r = 0; r < RS; ++r) {
          const float v = got[size_t(row) * RS + r];
          double want = 0.0, mag = 0.0;
          if (r < R) {
            const size_t qo = ((size_t(b) * cs.Hq + h * rep + r / cs.Lq) * cs.Lq + r % cs.Lq) * cs.D;
            for (int d = 0; d < cs.D; ++d) {
              const double qd = detail::f16_to_f32(q[qo + d]);
              want += qd * kh[d];
              mag += std::fabs(qd * kh[d]);
            }
            want *= scale, mag *= scale;
          }
          // the kernel's error is f32 accumulation and the biases' sums as hi + lo f16 (~2^-22):
          // 1e-5 of the terms' magnitudes leaves a wide margin and catches any misplaced dim
          const double err = std::fabs(double(v) - want), tol = 1e-5 * mag + 1e-30;
          if (!(err <= tol)) {
            if (bad++ < 5)
              ADD_FAILURE() << "b=" << b << " h=" << h << " t=" << t << " r=" << r << ": " << v << " vs " << want
                            << " (tolerance " << tol << ")";
          }
          if (mag > 0) worst = std::max(worst, err / mag);
        }
      }
  EXPECT_EQ(bad, 0) << "entries off; worst relative error " << worst;
}

TEST(CudaLogitsQK, MatchesHostDotProducts) {
  QSDPA_REQUIRE_CUDA();
  uint32_t seed = 7;
  for (const int bits : {4, 8})
    for (const int D : {256, 512}) {
      // 16 rows (GQA 16), 12 rows (GQA 4 x Lq 3: 4 rows of zeros), 8 rows (one n-tile), one row
      // (S of 8 rows, 7 of zeros); N: a partial tile, several blocks of 16 tiles with a partial
      // last one
      run_case({2, 16, 1, 1, 1100, D, bits}, seed++);
      run_case({1, 8, 2, 3, 77, D, bits}, seed++);
      run_case({2, 16, 2, 1, 600, D, bits}, seed++);
      run_case({3, 2, 2, 1, 33, D, bits}, seed++);
      // blocks of 1 and 2 tiles per warp (more blocks, a partial last block)
      run_case({1, 16, 1, 1, 1000, D, bits, 1}, seed++);
      run_case({2, 8, 2, 1, 333, D, bits, 2}, seed++);
    }
}

// Both passes and the merge against the reference attention (SPEC's f16 bound), on data of
// test::Problem (keys with large channels and offsets, quantized by the reference quantizer).
TEST(CudaLogitsQK, TwoPassAttentionMatchesReference) {
  QSDPA_REQUIRE_CUDA();
  for (const int bits : {4, 8})
  for (const int D : {256, 512})
    for (const auto& [B, Hq, Hkv, Lq, N, splits] :
         std::vector<std::array<int, 6>>{{2, 16, 1, 1, 1000, 3}, {1, 8, 2, 2, 77, 2}, {1, 8, 2, 4, 300, 3}, {2, 4, 2, 1, 300, 1}, {1, 16, 1, 1, 4096, 8}}) {
      test::Case cs;
      cs.B = B, cs.Hq = Hq, cs.Hkv = Hkv, cs.Lq = Lq, cs.N = N, cs.D = D, cs.seed = uint64_t(D + N + splits + bits);
      cs.kf = {bits, 64}, cs.vf = {bits, 64};
      SCOPED_TRACE(cs.str() + " splits=" + std::to_string(splits));
      test::Problem pr(cs);
      const test::DeviceBuffer dq(pr.q), dk(pr.k.packed), dks(pr.k.scales), dkb(pr.k.biases), dv(pr.v.packed),
          dvs(pr.v.scales), dvb(pr.v.biases), dout(pr.out.size());
      CUDA_ASSERT(cudaMemset(dout.get(), 0xff, dout.bytes()));
      cuda::LogitsQK p;
      p.q = dq.get(), p.k = dk.get(), p.k_scales = dks.get(), p.k_biases = dkb.get();
      p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Lq = Lq, p.N = N, p.D = D, p.bits = bits;
      p.scale = 1.0f / std::sqrt(float(D));
      const test::DeviceBuffer ws(cuda::two_pass_workspace_bytes(p, splits));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const Status st = cuda::two_pass_attention(p, dv.get(), dvs.get(), dvb.get(), dout.get(), ws.get(), splits, nullptr);
      ASSERT_TRUE(st.ok()) << st.message;
      CUDA_ASSERT(cudaDeviceSynchronize());
      CUDA_ASSERT(cudaMemcpy(pr.out.data(), dout.get(), pr.out.size(), cudaMemcpyDeviceToHost));
      const AttentionParams ap = pr.params(Backend::reference);
      EXPECT_EQ(test::check_against_reference(ap, pr.out.data()), "");
    }
}

TEST(CudaLogitsQK, RefusesWhatItDoesNotTake) {
  QSDPA_REQUIRE_CUDA();
  const test::DeviceBuffer buf(1 << 20);
  cuda::LogitsQK p;
  p.q = p.k = p.k_scales = p.k_biases = buf.get();
  p.s = buf.as<float>();
  p.B = 1, p.Hq = 16, p.Hkv = 1, p.Lq = 1, p.N = 32, p.D = 512, p.bits = 4;
  EXPECT_TRUE(cuda::logits_qk(p, nullptr).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  auto q = p;
  q.D = 128;
  EXPECT_EQ(cuda::logits_qk(q, nullptr).code, StatusCode::invalid_argument);
  q = p, q.bits = 2;
  EXPECT_EQ(cuda::logits_qk(q, nullptr).code, StatusCode::invalid_argument);
  q = p, q.Lq = 2;  // 32 rows per KV head
  EXPECT_EQ(cuda::logits_qk(q, nullptr).code, StatusCode::invalid_argument);
  q = p, q.s = reinterpret_cast<float*>(static_cast<char*>(buf.get()) + 4);
  EXPECT_EQ(cuda::logits_qk(q, nullptr).code, StatusCode::invalid_argument);
}

}  // namespace
}  // namespace qsdpa
