// quantize / dequantize on Backend::cuda are bit-identical to the host quantizer (SPEC section 2)
// for every bits x group x T, including groups that stress the rounding: constant groups (scale
// 1e-7), tiny ranges, large magnitudes, all-negative and all-positive groups, exact halves.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_testutil.hpp"

using namespace qsdpa;

namespace {

// rows x dim values of type t: Gaussian, with special groups in the first rows.
std::vector<uint8_t> make_values(DType t, int64_t rows, int64_t dim, int group, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * dim));
  for (auto& x : v) x = nd(rng);
  auto grp = [&](int64_t row, int64_t g) { return v.data() + row * dim + g * group; };
  const float big = t == DType::f16 ? 3.0e4f : 1.0e6f;
  for (int64_t g = 0; g < dim / group; ++g) {
    float* p = grp(0, g);  // constant group
    for (int j = 0; j < group; ++j) p[j] = 0.75f + float(g);
    p = grp(1, g);  // tiny range around an offset
    for (int j = 0; j < group; ++j) p[j] = 1.0f + float(j % 5) * 1e-3f;
    p = grp(2, g);  // large magnitudes of both signs
    for (int j = 0; j < group; ++j) p[j] = (j % 2 ? -big : big) * (0.1f + float(j) / float(group));
    p = grp(3, g);  // all negative
    for (int j = 0; j < group; ++j) p[j] = -std::fabs(p[j]) - 0.5f;
    p = grp(4, g);  // small integers and halves: exact ties for rint
    for (int j = 0; j < group; ++j) p[j] = float(j % 16) * 0.5f - 3.0f;
    p = grp(5, g);  // one value far from the rest
    p[g % group] = 40.0f;
  }
  return test::make_typed(t, rows * dim, [&](int64_t i) { return v[size_t(i)]; });
}

QuantizeParams qparams(DType t, QuantFormat f, int64_t rows, int64_t dim) {
  QuantizeParams p;
  p.dtype = t;
  p.format = f;
  p.rows = rows;
  p.dim = dim;
  return p;
}

}  // namespace

TEST(CudaQuantize, BitExactWithHost) {
  QSDPA_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int bits : {2, 4, 8})
      for (int group : {32, 64, 128})
        for (int64_t dim : {int64_t(group), int64_t(256)}) {
          const int64_t rows = 97;
          const QuantFormat f{bits, group};
          const std::vector<uint8_t> w = make_values(t, rows, dim, group, seed++);
          test::HostCache host = test::quantize_host(t, f, rows, dim, w);

          test::DeviceBuffer dw(w), dp(host.packed.size() * 4), ds(host.scales.size()), db(host.biases.size());
          CUDA_ASSERT(cudaMemset(dp.get(), 0xab, dp.bytes()));
          CUDA_ASSERT(cudaMemset(ds.get(), 0xab, ds.bytes()));
          CUDA_ASSERT(cudaMemset(db.get(), 0xab, db.bytes()));
          QuantizeParams p = qparams(t, f, rows, dim);
          p.w = dw.get(), p.packed = dp.as<uint32_t>(), p.scales = ds.get(), p.biases = db.get();
          p.backend = Backend::cuda;
          const Status s = quantize(p);
          ASSERT_TRUE(s.ok()) << s.message;
          std::vector<uint32_t> packed(host.packed.size());
          std::vector<uint8_t> scales(host.scales.size()), biases(host.biases.size());
          CUDA_ASSERT(cudaMemcpy(packed.data(), dp.get(), dp.bytes(), cudaMemcpyDeviceToHost));
          CUDA_ASSERT(cudaMemcpy(scales.data(), ds.get(), ds.bytes(), cudaMemcpyDeviceToHost));
          CUDA_ASSERT(cudaMemcpy(biases.data(), db.get(), db.bytes(), cudaMemcpyDeviceToHost));
          const std::string what = std::string(to_string(t)) + " bits=" + std::to_string(bits) +
                                   " group=" + std::to_string(group) + " dim=" + std::to_string(dim);
          EXPECT_EQ(packed, host.packed) << what;
          EXPECT_EQ(scales, host.scales) << what;
          EXPECT_EQ(biases, host.biases) << what;

          // dequantize the host's quantization on the device: bit-identical to the host's
          std::vector<uint8_t> ref(w.size()), got(w.size());
          DequantizeParams dq;
          dq.dtype = t, dq.format = f, dq.rows = rows, dq.dim = dim;
          dq.packed = host.packed.data(), dq.scales = host.scales.data(), dq.biases = host.biases.data();
          dq.w = ref.data();
          dq.backend = Backend::reference;
          ASSERT_TRUE(dequantize(dq).ok());
          test::DeviceBuffer hp(host.packed), hs(host.scales), hb(host.biases), out(w.size());
          dq.packed = hp.as<uint32_t>(), dq.scales = hs.get(), dq.biases = hb.get(), dq.w = out.get();
          dq.backend = Backend::automatic;  // device data: the CUDA backend
          const Status ds2 = dequantize(dq);
          ASSERT_TRUE(ds2.ok()) << ds2.message;
          EXPECT_EQ(ds2.backend, Backend::cuda);
          CUDA_ASSERT(cudaMemcpy(got.data(), out.get(), got.size(), cudaMemcpyDeviceToHost));
          EXPECT_EQ(got, ref) << what;
        }
}

TEST(CudaQuantize, StreamAndHostPointerError) {
  QSDPA_REQUIRE_CUDA();
  const DType t = DType::bf16;
  const QuantFormat f{4, 64};
  const int64_t rows = 1000, dim = 128;
  const std::vector<uint8_t> w = make_values(t, rows, dim, f.group, 99);
  test::HostCache host = test::quantize_host(t, f, rows, dim, w);
  cudaStream_t st = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  test::DeviceBuffer dw(w), dp(host.packed.size() * 4), ds(host.scales.size()), db(host.biases.size());
  QuantizeParams p = qparams(t, f, rows, dim);
  p.w = dw.get(), p.packed = dp.as<uint32_t>(), p.scales = ds.get(), p.biases = db.get();
  p.backend = Backend::cuda;
  p.stream = st;
  ASSERT_TRUE(quantize(p).ok());
  CUDA_ASSERT(cudaStreamSynchronize(st));
  std::vector<uint32_t> packed(host.packed.size());
  CUDA_ASSERT(cudaMemcpy(packed.data(), dp.get(), dp.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(packed, host.packed);
  cudaStreamDestroy(st);

  int pageable = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
  if (!pageable) {
    p.stream = nullptr;
    p.w = w.data();  // host memory
    const Status s = quantize(p);
    EXPECT_EQ(s.code, StatusCode::invalid_argument);
    EXPECT_NE(s.message.find("w "), std::string::npos) << s.message;
  }
}
