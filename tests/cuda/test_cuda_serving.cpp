// Serving layouts on the GPU: the host serving cases (tests/common/serving.hpp) through device
// copies, cases meant for the tensor-core kernel (checked to reach it), append bit-identical to
// the host, a decode loop over a growing paged cache, and a cache of more than 2^32 elements.
#include <map>

#include "common/serving.hpp"
#include "cuda_testutil.hpp"

namespace qsdpa::test {
namespace {

// Device copies of host buffers, looked up by host address.
struct Mirror {
  std::map<const void*, DeviceBuffer> bufs;
  PtrMap map() {
    return [this](const void* host, size_t bytes) -> const void* {
      auto it = bufs.find(host);
      if (it == bufs.end()) {
        DeviceBuffer d(bytes);
        if (cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
          throw std::runtime_error("cudaMemcpy to the device failed");
        it = bufs.emplace(host, std::move(d)).first;
      }
      return it->second.get();
    };
  }
};

// Runs a serving case on the GPU; returns the check's verdict ("" = pass).
std::string run_cuda(const ServingCase& sc, bool expect_mma) {
  ServingProblem sp(sc);
  Mirror m;
  AttentionParams p = sp.params(Backend::cuda, m.map());
  DeviceBuffer out(sp.out);  // poisoned like the host buffer
  p.out = out.get();
  if (expect_mma && !cuda::uses_tensor_cores(p)) return "the tensor-core kernel does not take this case";
  const Status s = attention(p);
  if (!s) return "attention: " + s.message;
  if (cudaDeviceSynchronize() != cudaSuccess) return "cudaDeviceSynchronize failed";
  std::vector<uint8_t> res(sp.out.size());
  if (cudaMemcpy(res.data(), out.get(), res.size(), cudaMemcpyDeviceToHost) != cudaSuccess) return "cudaMemcpy failed";
  return sp.check(res);
}

class CudaServing : public ::testing::TestWithParam<int> {};

TEST_P(CudaServing, HostCases) {
  QSDPA_REQUIRE_CUDA();
  const ServingCase sc = serving_cases()[size_t(GetParam())];
  EXPECT_EQ(run_cuda(sc, false), "") << sc.str();
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaServing, ::testing::Range(0, int(serving_cases().size())));

// Layouts the tensor-core kernel takes (f16 / bf16, K and V in one 2-, 4- or 8-bit format, or 8-bit
// keys with 4-bit values; token stride 1, pages of 16 to 256 tokens, 16 only with one layout for
// K and V; capacities past N: every layout instantiation), with lengths, masks, windows and sinks.
std::vector<ServingCase> mma_cases() {
  std::vector<ServingCase> v;
  uint64_t seed = 500;
  for (int i = 0; i < 27; ++i) {  // (20: 8-bit keys, 4-bit values, 16-token pages)
    ServingCase s;
    s.c.dtype = i % 2 ? DType::bf16 : DType::f16;
    const QuantFormat f = i % 3 == 0 ? QuantFormat{4, 64} : i % 3 == 1 ? QuantFormat{8, 64} : QuantFormat{4, 32};
    s.c.kf = s.c.vf = f;
    if (i >= 16) s.c.kf = {8, f.group}, s.c.vf = {4, f.group};  // 8-bit keys, 4-bit values
    s.c.D = i % 4 == 3 ? 256 : i % 4 == 2 ? 64 : 128;
    if (i >= 22) {  // 2 bits (groups of 64 or 128, D = 128 or 256), pages of 64, 128, 256, 16, 32
      s.c.kf = s.c.vf = {2, i % 2 ? 128 : 64};
      s.c.D = i % 4 == 3 ? 256 : 128;
    }
    s.c.B = 3, s.c.Hkv = 2, s.c.Hq = i % 5 == 4 ? 2 : 8;
    s.c.N = 300 + 61 * i;
    s.c.Lq = i % 4 == 1 ? 4 : 1;
    s.c.seed = seed++;
    s.kind = i < 4 ? CacheKind::capacity : CacheKind::paged;
    s.capacity_extra = 8 - s.c.N % 8;  // capacities that keep the scale spans' 16-byte phase
    s.page_size = 16 << (i % 5);  // 16 (two pages per warp tile) to 256
    s.shared_table = s.page_size == 16 || i % 2 == 0;
    s.strided_q = i % 3 == 1;
    s.c.sinks = i % 5 == 2;
    s.c.window = i % 6 == 5 ? 100 : 0;
    if (i % 7 == 3) s.c.bool_mask = MaskKind::u8;
    if (i % 7 == 6) s.c.float_mask = true, s.mask_broadcast_h = true;
    if (i >= 8) {
      const int32_t N = int32_t(s.c.N), L = int32_t(s.c.Lq);
      s.kv_lens = {N, std::max(L, 33), N / 3 + 1};
      if (i % 2 == 1) s.q_lens = {L, L > 1 ? L - 1 : 1, L > 1 ? 0 : 1};
    }
    v.push_back(s);
  }
  return v;
}

class CudaServingMma : public ::testing::TestWithParam<int> {};
TEST_P(CudaServingMma, TensorCoreLayouts) {
  QSDPA_REQUIRE_CUDA();
  const ServingCase sc = mma_cases()[size_t(GetParam())];
  EXPECT_EQ(run_cuda(sc, true), "") << sc.str();
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaServingMma, ::testing::Range(0, int(mma_cases().size())));

// The same cases with the splits merged by the combine kernel, neither in clusters (on sm_90 the
// small contiguous ones, capacities past N, merge in clusters by default) nor in the attention
// kernel (the library's workspace: the default wherever it is a few loads per thread); every path
// must hold, also for splits past a sequence's end.
class CudaServingMmaCombine : public ::testing::TestWithParam<int> {};
TEST_P(CudaServingMmaCombine, TensorCoreLayouts) {
  QSDPA_REQUIRE_CUDA();
  const ServingCase sc = mma_cases()[size_t(GetParam())];
  const bool was = cuda::set_cluster_merge(false), was_in = cuda::set_in_kernel_merge(false);
  const std::string r = run_cuda(sc, true);
  cuda::set_cluster_merge(was);
  cuda::set_in_kernel_merge(was_in);
  EXPECT_EQ(r, "") << sc.str();
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaServingMmaCombine, ::testing::Range(0, int(mma_cases().size())));

// ... and by the combine kernel whose rows wait for their own row tile's splits (counted arrivals,
// cuda::set_combine_arrivals; a programmatic launch, the default): the case, then the same shape
// with other data, then the case again. A count the combine kernel left non-zero would let the
// next call's combine read partials before they are written (the other data's, or stale ones); one
// that never reaches the splits would hang.
class CudaServingMmaArrivals : public ::testing::TestWithParam<int> {};
TEST_P(CudaServingMmaArrivals, TensorCoreLayouts) {
  QSDPA_REQUIRE_CUDA();
  const ServingCase sc = mma_cases()[size_t(GetParam())];
  ServingCase other = sc;
  other.c.seed += 1000;
  const bool was = cuda::set_cluster_merge(false), was_in = cuda::set_in_kernel_merge(false),
             was_arr = cuda::set_combine_arrivals(true);
  {
    ServingProblem sp(sc);
    Mirror m;
    const AttentionParams p = sp.params(Backend::cuda, m.map());
    EXPECT_EQ(cuda::uses_combine_arrivals(p), cuda::uses_tensor_cores(p) && sm90_or_newer()) << sc.str();
  }
  std::string r = run_cuda(sc, true);
  if (r.empty()) r = run_cuda(other, true);
  if (r.empty()) r = run_cuda(sc, true);
  cuda::set_cluster_merge(was);
  cuda::set_in_kernel_merge(was_in);
  cuda::set_combine_arrivals(was_arr);
  EXPECT_EQ(r, "") << sc.str();
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaServingMmaArrivals, ::testing::Range(0, int(mma_cases().size())));

// ... and merged in the attention kernel where it takes them (no clusters), twice: the splits past
// a sequence's end (kv_lens) count their arrival on their own path (merge_if_last_cold), and a
// counter it left non-zero would spoil the second call.
class CudaServingMmaInKernel : public ::testing::TestWithParam<int> {};
TEST_P(CudaServingMmaInKernel, TensorCoreLayouts) {
  QSDPA_REQUIRE_CUDA();
  const ServingCase sc = mma_cases()[size_t(GetParam())];
  const bool was = cuda::set_cluster_merge(false), was_in = cuda::set_in_kernel_merge(true);
  std::string r = run_cuda(sc, true);
  if (r.empty()) r = run_cuda(sc, true);
  cuda::set_cluster_merge(was);
  cuda::set_in_kernel_merge(was_in);
  EXPECT_EQ(r, "") << sc.str();
}
INSTANTIATE_TEST_SUITE_P(Cases, CudaServingMmaInKernel, ::testing::Range(0, int(mma_cases().size())));

// A batch with sequences far shorter than N takes the in-kernel merge with splits that see no
// token (their own arrival path): three calls in a row, each checked.
TEST(CudaServingInKernel, EmptySplitsArrive) {
  QSDPA_REQUIRE_CUDA();
  ServingCase sc;
  sc.c.dtype = DType::f16, sc.c.kf = sc.c.vf = {4, 64};
  sc.c.B = 6, sc.c.Hq = 32, sc.c.Hkv = 8, sc.c.N = 6000, sc.c.D = 128, sc.c.sinks = true, sc.c.seed = 640;
  sc.kind = CacheKind::capacity, sc.capacity_extra = 64;
  sc.kv_lens = {6000, 1, 700, 6000, 33, 2500};
  ServingProblem sp(sc);
  Mirror m;
  AttentionParams p = sp.params(Backend::cuda, m.map());
  EXPECT_TRUE(cuda::uses_in_kernel_merge(p) || !cuda::uses_tensor_cores(p)) << sc.str();
  EXPECT_GT(cuda::planned_splits(p), 1) << sc.str();
  for (int call = 0; call < 3; ++call) EXPECT_EQ(run_cuda(sc, false), "") << "call " << call << ": " << sc.str();
}

// The tile pool (forced, cuda::set_block_pool(2)) on capacities past N with per-sequence lengths:
// splits past a sequence's end (their own arrival path), sequences of 1 and 33 tokens, strided q,
// broadcast masks, windows, sinks; merged in the kernel (three calls in a row: a counter left
// non-zero would spoil the next) and by the combine kernel; then in blocks of 8 warps
// (cuda::set_block_pool(3)), and in blocks of 16 whose splits may merge in clusters. Where the
// device has the pool's instantiations (sm_90a) each case is checked to take the pool meant.
TEST(CudaServingPool, CapacitiesAndLengths) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  const int mode = cuda::set_block_pool(2);
  const bool was = cuda::set_cluster_merge(true), was_in = cuda::set_in_kernel_merge(true);
  const bool was_pool_cluster = cuda::set_pool_cluster(false);
  for (int i = 0; i < 6; ++i) {
    ServingCase sc;
    sc.c.dtype = i % 2 ? DType::bf16 : DType::f16, sc.c.kf = sc.c.vf = {4, 64};
    sc.c.B = i < 3 ? 6 : 3, sc.c.Hq = i % 3 == 0 ? 32 : 8, sc.c.Hkv = i % 3 == 0 ? 8 : 4, sc.c.N = 3000 + 997 * i;
    sc.c.D = 128, sc.c.Lq = i % 3 == 2 ? 2 : 1;
    sc.c.sinks = i % 2 == 0, sc.c.window = i == 4 ? 900 : 0, sc.c.seed = 660 + uint64_t(i);
    if (i == 1) sc.c.float_mask = true, sc.mask_broadcast_h = true;
    // (capacities that keep the scale spans' 16-byte phase, as the tensor-core kernel requires)
    sc.kind = CacheKind::capacity, sc.capacity_extra = 64 + 8 - sc.c.N % 8;
    sc.strided_q = i % 2 == 1;
    const int32_t N = int32_t(sc.c.N), L = int32_t(sc.c.Lq);  // (a sequence holds its Lq rows' tokens)
    if (i < 3) sc.kv_lens = {N, L, N / 4, N, 33, N / 3 + 1};
    else sc.kv_lens = {N / 2, N, 0};
    cuda::set_in_kernel_merge(true);
    {
      ServingProblem sp(sc);
      Mirror m;
      const AttentionParams p = sp.params(Backend::cuda, m.map());
      EXPECT_EQ(cuda::uses_block_pool(p), want) << sc.str();
      EXPECT_TRUE(cuda::uses_in_kernel_merge(p) || !cuda::uses_tensor_cores(p)) << sc.str();
    }
    for (int call = 0; call < 3; ++call) EXPECT_EQ(run_cuda(sc, true), "") << "in-kernel merge, call " << call << ": " << sc.str();
    cuda::set_in_kernel_merge(false);
    EXPECT_EQ(run_cuda(sc, true), "") << "combine kernel: " << sc.str();
    cuda::set_in_kernel_merge(true);
    cuda::set_block_pool(3);
    {
      ServingProblem sp(sc);
      Mirror m;
      EXPECT_EQ(cuda::planned_pool(sp.params(Backend::cuda, m.map())), want ? 2 : 0) << sc.str();
    }
    EXPECT_EQ(run_cuda(sc, true), "") << "blocks of 8 warps: " << sc.str();
    cuda::set_block_pool(2);
    cuda::set_pool_cluster(true);
    EXPECT_EQ(run_cuda(sc, true), "") << "clusters allowed: " << sc.str();
    cuda::set_pool_cluster(false);
  }
  cuda::set_block_pool(mode);
  cuda::set_cluster_merge(was);
  cuda::set_in_kernel_merge(was_in);
  cuda::set_pool_cluster(was_pool_cluster);
}

// The pool's in-kernel merge (merge_if_last in the tile pool's blocks, one block of each row tile
// summing its splits' partials): 1, 2, 4 and 8 rows per KV head in blocks of 16 warps, 1 and 4
// rows in blocks of 8, each on a grid of 8 or 16 (sequence, KV head) units, so that its splits
// number 2 to 32 on a device of 100-142 SMs; per-sequence lengths leave splits with no token
// (weight 0, their o unwritten: another split's o is read in its place), a sequence of one token,
// and one of none (zeros); sinks on every other case, a mask on some. Each case is checked to take
// the pool, the in-kernel merge and (on such a device) that many splits, then held to the
// reference twice in a row (a counter left non-zero would spoil the second call).
TEST(CudaServingPool, ManySplitsInKernelMerge) {
  QSDPA_REQUIRE_CUDA();
  const bool want = device_takes_sm90a_kernels();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const bool sized = sms >= 100 && sms <= 142;
  struct Restore {
    int mode = cuda::set_block_pool(2);
    bool cl = cuda::set_cluster_merge(false), in = cuda::set_in_kernel_merge(true);
    ~Restore() {
      cuda::set_block_pool(mode);
      cuda::set_cluster_merge(cl);
      cuda::set_in_kernel_merge(in);
    }
  } restore;
  const struct {
    int pool;  // 2: blocks of 16 warps, 3: of 8
    int64_t rows, B;
  } shapes[] = {{2, 1, 4}, {2, 2, 4}, {2, 4, 4}, {2, 8, 4}, {3, 1, 8}, {3, 4, 8}};
  int i = 0;
  for (const auto& sh : shapes) {
    cuda::set_block_pool(sh.pool);
    ServingCase sc;
    sc.c.dtype = i % 2 ? DType::bf16 : DType::f16, sc.c.kf = sc.c.vf = {4, 64};
    sc.c.B = sh.B, sc.c.Hkv = 2, sc.c.Hq = 2 * sh.rows, sc.c.Lq = 1, sc.c.N = 20000, sc.c.D = 128;
    sc.c.sinks = i % 2 == 0, sc.c.seed = 700 + uint64_t(i);
    if (i == 2) sc.c.bool_mask = MaskKind::u8;
    if (i == 5) sc.c.float_mask = true, sc.mask_broadcast_h = true;
    sc.kind = CacheKind::capacity, sc.capacity_extra = 64;
    const int32_t N = int32_t(sc.c.N);
    sc.kv_lens = {N, N / 3 + 5, 1, 0};
    for (int64_t b = 4; b < sh.B; ++b) sc.kv_lens.push_back(int32_t(b % 2 ? N - 999 * b : 3 * b));
    {
      ServingProblem sp(sc);
      Mirror m;
      const AttentionParams p = sp.params(Backend::cuda, m.map());
      ASSERT_TRUE(cuda::uses_tensor_cores(p)) << sc.str();
      EXPECT_EQ(cuda::planned_pool(p), want ? sh.pool - 1 : 0) << sc.str();
      EXPECT_TRUE(cuda::uses_in_kernel_merge(p)) << sc.str();
      const int splits = cuda::planned_splits(p);
      if (want && sized) {
        EXPECT_GE(splits, 2) << sc.str();
        EXPECT_LE(splits, 32) << sc.str();
      }
    }
    for (int call = 0; call < 2; ++call) EXPECT_EQ(run_cuda(sc, true), "") << "call " << call << ": " << sc.str();
    ++i;
  }
}

// D = 512 on contiguous caches with capacities past N, per-sequence lengths, strided q and out and
// broadcast masks, every format: the tensor-core kernel (d-split) on devices of compute capability
// 9.0 with a build for sm_90a, the generic kernel elsewhere; held to the reference either way.
TEST(CudaServingWide, HeadDim512Capacities) {
  QSDPA_REQUIRE_CUDA();
  const bool mma = device_takes_sm90a_kernels();
  const QuantFormat kf[] = {{4, 64}, {8, 64}, {8, 64}, {2, 64}}, vf[] = {{4, 64}, {8, 64}, {4, 64}, {2, 64}};
  for (int i = 0; i < 8; ++i) {
    ServingCase s;
    s.c.dtype = i % 2 ? DType::bf16 : DType::f16;
    s.c.kf = kf[i % 4], s.c.vf = vf[i % 4];
    s.c.D = 512;
    s.c.B = 3, s.c.Hkv = 1 + i % 2, s.c.Hq = (i < 4 ? 16 : 4) * s.c.Hkv;
    s.c.N = 200 + 97 * i;
    s.c.Lq = i % 3 == 1 ? 2 : 1;
    s.c.seed = 800 + uint64_t(i);
    s.kind = CacheKind::capacity;
    s.capacity_extra = 8 - s.c.N % 8;
    s.strided_q = i % 2 == 0;
    s.c.sinks = i % 4 == 1;
    s.c.window = i % 4 == 2 ? 50 : 0;
    if (i % 4 == 3) s.c.float_mask = true, s.mask_broadcast_h = true;
    const int32_t N = int32_t(s.c.N), L = int32_t(s.c.Lq);
    s.kv_lens = {N, std::max(L, 33), N / 3 + 1};
    if (i % 2 == 1) s.q_lens = {L, L > 1 ? L - 1 : 1, L > 1 ? 0 : 1};
    EXPECT_EQ(run_cuda(s, mma), "") << s.str();
    if (!mma) {
      ServingProblem sp(s);
      Mirror m;
      EXPECT_FALSE(cuda::uses_tensor_cores(sp.params(Backend::cuda, m.map()))) << s.str();
    }
  }
}

// append on the GPU writes the same bytes as on the host, for every layout and several layers.
TEST(CudaAppend, SameBytesAsHost) {
  QSDPA_REQUIRE_CUDA();
  for (CacheKind kind : {CacheKind::dense, CacheKind::capacity, CacheKind::token_major, CacheKind::paged})
    for (DType t : {DType::f16, DType::bf16, DType::f32}) {
      ServingCase sc;
      sc.kind = kind;
      sc.c.dtype = t;
      sc.c.B = 3, sc.c.Hkv = 2, sc.c.D = 128, sc.c.N = 100;
      sc.c.kf = {8, 32}, sc.c.vf = {4, 128};
      sc.page_size = 32;
      sc.kv_lens = {37, 0, 64};
      SCOPED_TRACE(sc.str());
      ServingProblem sp(sc);
      const int64_t L = 5;
      std::mt19937_64 rng(9);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      auto kn = make_typed(t, sc.c.B * sc.c.Hkv * L * sc.c.D, [&](int64_t) { return nd(rng); });
      auto vn = make_typed(t, sc.c.B * sc.c.Hkv * L * sc.c.D, [&](int64_t) { return nd(rng); });
      auto params = [&](LaidCache& k, LaidCache& v, const PtrMap& m) {
        AppendParams ap;
        ap.dtype = t, ap.B = sc.c.B, ap.Hkv = sc.c.Hkv, ap.L = L, ap.D = sc.c.D, ap.capacity = sc.c.N;
        ap.k = m(kn.data(), kn.size()), ap.v = m(vn.data(), vn.size());
        auto mut = [&](auto& vec) { return const_cast<void*>(m(vec.data(), vec.size() * sizeof(vec[0]))); };
        ap.k_cache = {sc.c.kf, static_cast<uint32_t*>(mut(k.packed)), mut(k.scales), mut(k.biases), k.layout};
        ap.v_cache = {sc.c.vf, static_cast<uint32_t*>(mut(v.packed)), mut(v.scales), mut(v.biases), v.layout};
        ap.k_cache.layout.block_table = k.block_table.empty() ? nullptr : static_cast<const int32_t*>(mut(k.block_table));
        ap.v_cache.layout.block_table = v.block_table.empty() ? nullptr : static_cast<const int32_t*>(mut(v.block_table));
        ap.kv_lens = static_cast<const int32_t*>(m(sc.kv_lens.data(), sc.kv_lens.size() * 4));
        return ap;
      };
      LaidCache hk = sp.k, hv = sp.v;
      AppendParams hp = params(hk, hv, [](const void* p, size_t) { return p; });
      hp.backend = Backend::cpu;
      ASSERT_TRUE(append(hp).ok());
      Mirror m;
      AppendParams dp = params(sp.k, sp.v, m.map());
      dp.backend = Backend::cuda;
      const Status s = append(dp);
      ASSERT_TRUE(s.ok()) << s.message;
      CUDA_ASSERT(cudaDeviceSynchronize());
      for (auto [host, dev] : {std::pair{&hk, &sp.k}, std::pair{&hv, &sp.v}}) {
        std::vector<uint32_t> p(dev->packed.size());
        std::vector<uint8_t> sc8(dev->scales.size()), bi(dev->biases.size());
        CUDA_ASSERT(cudaMemcpy(p.data(), m.bufs.at(dev->packed.data()).get(), p.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_ASSERT(cudaMemcpy(sc8.data(), m.bufs.at(dev->scales.data()).get(), sc8.size(), cudaMemcpyDeviceToHost));
        CUDA_ASSERT(cudaMemcpy(bi.data(), m.bufs.at(dev->biases.data()).get(), bi.size(), cudaMemcpyDeviceToHost));
        EXPECT_TRUE(p == host->packed);
        EXPECT_TRUE(sc8 == host->scales);
        EXPECT_TRUE(bi == host->biases);
        EXPECT_FALSE(p == dev->packed) << "nothing was appended";
      }
    }
}

// A cache of more than 2^32 elements (rows past 2^32 / D, 64-bit offsets throughout): one
// cache of 2^25 + 512 rows of 128 elements, the second sequence starting at row 2^25.
TEST(CudaServingLarge, CacheOverFourBillionElements) {
  QSDPA_REQUIRE_CUDA();
  size_t free_b = 0, total_b = 0;
  CUDA_ASSERT(cudaMemGetInfo(&free_b, &total_b));
  const int64_t D = 128, cap = (int64_t(1) << 25) + 512, Hkv = 1;  // 2^32 + 65536 elements per cache
  const QuantFormat f{4, 64};
  const size_t packed_bytes = size_t(Hkv * cap * D * 4 / 8), scale_bytes = size_t(Hkv * cap * (D / 64) * 2);
  if (free_b < 2 * (packed_bytes + 2 * scale_bytes) + (size_t(1) << 30))
    GTEST_SKIP() << "needs " << 2 * (packed_bytes + 2 * scale_bytes) / (1 << 20) << " MiB of device memory";
  // The problem: N = 300 tokens placed at the END of the big capacity via a batch stride that
  // starts sequence 0 at row cap - 300... written as a two-sequence batch whose second sequence
  // starts at row 2^25 (offset 2^32 elements).
  ServingCase sc;
  sc.c.B = 2, sc.c.Hq = 4, sc.c.Hkv = Hkv, sc.c.N = 300, sc.c.D = D, sc.c.kf = sc.c.vf = f;
  sc.c.seed = 77;
  ServingProblem sp(sc);  // dense host data: rows [b][t]
  DeviceBuffer kp(packed_bytes), vp(packed_bytes), ks(scale_bytes), kb(scale_bytes), vs(scale_bytes), vb(scale_bytes);
  const int64_t bstride = int64_t(1) << 25;  // sequence 1 starts at element 2^32
  const size_t rowp = size_t(D * 4 / 8), rows_s = size_t(D / 64) * 2;
  for (int64_t b = 0; b < 2; ++b) {
    const size_t off = size_t(b * bstride), n = 300;
    auto put = [&](DeviceBuffer& dst, const void* src, size_t row_bytes) {
      return cudaMemcpy(dst.as<uint8_t>() + off * row_bytes, static_cast<const uint8_t*>(src) + size_t(b) * n * row_bytes,
                        n * row_bytes, cudaMemcpyHostToDevice);
    };
    CUDA_ASSERT(put(kp, sp.dense.k.packed.data(), rowp));
    CUDA_ASSERT(put(vp, sp.dense.v.packed.data(), rowp));
    CUDA_ASSERT(put(ks, sp.dense.k.scales.data(), rows_s));
    CUDA_ASSERT(put(kb, sp.dense.k.biases.data(), rows_s));
    CUDA_ASSERT(put(vs, sp.dense.v.scales.data(), rows_s));
    CUDA_ASSERT(put(vb, sp.dense.v.biases.data(), rows_s));
  }
  Mirror m;
  AttentionParams p = sp.params(Backend::cuda, m.map());
  p.k = {f, kp.as<uint32_t>(), ks.get(), kb.get(), {}};
  p.v = {f, vp.as<uint32_t>(), vs.get(), vb.get(), {}};
  p.k.layout.head_stride = p.v.layout.head_stride = bstride;
  p.k.layout.batch_stride = p.v.layout.batch_stride = bstride;
  DeviceBuffer out(sp.out);
  p.out = out.get();
  ASSERT_TRUE(cuda::uses_tensor_cores(p));
  for (int generic = 0; generic < 2; ++generic) {
    const Status s = generic ? cuda::attention_generic_kernel(p) : attention(p);
    ASSERT_TRUE(s.ok()) << s.message;
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint8_t> res(sp.out.size());
    CUDA_ASSERT(cudaMemcpy(res.data(), out.get(), res.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(sp.check(res), "") << (generic ? "generic kernel" : "tensor-core kernel");
  }
}

// 64 decode steps (append one token, attend) over a growing paged cache on the GPU, each matched
// to the oracle on a contiguous cache of the same rows.
TEST(CudaDecodeLoop, PagedAppendAttend) {
  QSDPA_REQUIRE_CUDA();
  const DType t = DType::f16;
  const int64_t B = 3, Hq = 16, Hkv = 4, D = 128, ps = 32, steps = 64;
  const QuantFormat f{4, 64};
  const int64_t prompt[B] = {1, 17, 200};
  const int64_t cap = 200 + steps, per_seq = (cap + ps - 1) / ps, pages = B * per_seq;
  const int64_t w = D / 8, g = D / 64;
  std::vector<int32_t> bt(static_cast<size_t>(pages));
  std::iota(bt.begin(), bt.end(), 0);
  std::mt19937_64 rng(4);
  std::shuffle(bt.begin(), bt.end(), rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  DeviceBuffer kp(size_t(pages * Hkv * ps * w * 4)), vp(kp.bytes()), ks(size_t(pages * Hkv * ps * g * 2)),
      kb(ks.bytes()), vs(ks.bytes()), vb(ks.bytes()), dbt(bt), dlens(size_t(B * 4));
  std::vector<std::vector<float>> kall(B * Hkv), vall(B * Hkv);
  std::vector<int32_t> lens(B, 0);
  CacheLayout lay;
  lay.block_table = dbt.as<int32_t>();
  lay.page_size = ps;
  lay.block_table_stride = per_seq;
  auto rows = [&](const std::vector<int64_t>& Ls) {  // new rows [B][Hkv][L] of each sequence
    const int64_t L = *std::max_element(Ls.begin(), Ls.end());
    std::vector<uint8_t> kn(size_t(B * Hkv * L * D * 2)), vn(kn.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t at = ((b * Hkv + h) * L + i) * D + d;
            detail::store_f32(kn.data(), t, at, nd(rng) + 0.3f);
            detail::store_f32(vn.data(), t, at, nd(rng));
            if (i < Ls[size_t(b)]) {
              kall[size_t(b * Hkv + h)].push_back(detail::load_f32(kn.data(), t, at));
              vall[size_t(b * Hkv + h)].push_back(detail::load_f32(vn.data(), t, at));
            }
          }
    return std::tuple{kn, vn, L};
  };
  auto do_append = [&](const std::vector<uint8_t>& kn, const std::vector<uint8_t>& vn, int64_t L) {
    DeviceBuffer dk(kn), dv(vn);
    CUDA_ASSERT(cudaMemcpy(dlens.get(), lens.data(), B * 4, cudaMemcpyHostToDevice));
    AppendParams ap;
    ap.dtype = t, ap.B = B, ap.Hkv = Hkv, ap.L = L, ap.D = D, ap.capacity = cap;
    ap.k = dk.get(), ap.v = dv.get();
    ap.k_cache = {f, kp.as<uint32_t>(), ks.get(), kb.get(), lay};
    ap.v_cache = {f, vp.as<uint32_t>(), vs.get(), vb.get(), lay};
    ap.kv_lens = dlens.as<int32_t>();
    ap.backend = Backend::cuda;
    const Status s = append(ap);
    ASSERT_TRUE(s.ok()) << s.message;
    CUDA_ASSERT(cudaDeviceSynchronize());
  };
  {  // the prompts, one call: rows past a sequence's prompt are written but not counted
    auto [kn, vn, L] = rows({prompt[0], prompt[1], prompt[2]});
    do_append(kn, vn, L);
    for (int64_t b = 0; b < B; ++b) lens[size_t(b)] = int32_t(prompt[b]);
  }
  for (int64_t step = 0; step < steps; ++step) {
    auto [kn, vn, L] = rows({1, 1, 1});
    do_append(kn, vn, L);
    for (auto& n : lens) ++n;
    CUDA_ASSERT(cudaMemcpy(dlens.get(), lens.data(), B * 4, cudaMemcpyHostToDevice));
    std::vector<uint8_t> q = make_typed(t, B * Hq * D, [&](int64_t) { return nd(rng); });
    DeviceBuffer dq(q), dout(q.size());
    AttentionParams p;
    p.dtype = t, p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Lq = 1, p.D = D;
    p.N = *std::max_element(lens.begin(), lens.end());
    p.q = dq.get(), p.out = dout.get();
    p.k = {f, kp.as<uint32_t>(), ks.get(), kb.get(), lay};
    p.v = {f, vp.as<uint32_t>(), vs.get(), vb.get(), lay};
    p.kv_lens = dlens.as<int32_t>();
    p.kv_lens_host = step % 2 ? lens.data() : nullptr;  // both ways of planning the splits
    p.window = step % 4 == 3 ? 40 : 0;
    p.backend = Backend::cuda;
    ASSERT_TRUE(cuda::uses_tensor_cores(p));
    const Status s = attention(p);
    ASSERT_TRUE(s.ok()) << s.message;
    std::vector<uint8_t> out(q.size());
    CUDA_ASSERT(cudaMemcpy(out.data(), dout.get(), out.size(), cudaMemcpyDeviceToHost));
    // the oracle on a contiguous cache of the same rows (host q and lengths)
    AttentionParams r = p;
    r.q = q.data();
    r.kv_lens = lens.data();
    ASSERT_EQ(check_step_on_contiguous(r, f, f, kall, vall, out.data()), "") << "step " << step;
  }
}

}  // namespace
}  // namespace qsdpa::test
