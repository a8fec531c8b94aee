// The CPU backend's threading: any thread count gives the reference's result, calls from several
// caller threads at once work, a long cache split across threads still matches, and the threaded
// quantizer is bit-identical to the host one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/testutil.hpp"

namespace {

using namespace qsdpa;
using test::Case;
using test::MaskKind;

// Large enough that the backend leaves its single-thread path and splits the keys into chunks.
Case threads_case(DType t) {
  Case c;
  c.dtype = t;
  c.kf = {4, 64};
  c.vf = {8, 32};
  c.B = 1;
  c.Hq = 8;
  c.Hkv = 2;
  c.Lq = 2;
  c.N = 1500;
  c.D = 128;
  c.sinks = true;
  c.window = 900;
  c.bool_mask = MaskKind::u8;
  c.float_mask = true;
  c.seed = 31;
  return c;
}

class ThreadCount : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCount, MatchesReference) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Case c = threads_case(t);
    SCOPED_TRACE(c.str() + " num_threads=" + std::to_string(GetParam()));
    test::Problem pr(c);
    AttentionParams p = pr.params(Backend::cpu);
    p.num_threads = GetParam();
    const Status s = attention(p);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
    // Calling again (the pool is reused) gives the same bits: the split depends only on the
    // arguments, not on which thread ran which task.
    const std::vector<uint8_t> first = pr.out;
    pr.poison();
    ASSERT_TRUE(attention(p).ok());
    EXPECT_EQ(pr.out, first);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, ThreadCount, ::testing::Values(0, 1, 2, 3, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::ostringstream o;
                           o << "threads" << info.param;
                           return o.str();
                         });

TEST(CpuThreads, ResultsAgreeAcrossThreadCounts) {
  const Case c = threads_case(DType::f32);
  test::Problem pr(c);
  AttentionParams p = pr.params(Backend::cpu);
  p.num_threads = 1;
  ASSERT_TRUE(attention(p).ok());
  const std::vector<uint8_t> one = pr.out;
  for (int n : {2, 3, 8}) {
    pr.poison();
    p.num_threads = n;
    ASSERT_TRUE(attention(p).ok());
    // Different splits round differently, but only in the last bits.
    const auto* a = reinterpret_cast<const float*>(one.data());
    const auto* b = reinterpret_cast<const float*>(pr.out.data());
    for (size_t i = 0; i < one.size() / 4; ++i) ASSERT_NEAR(a[i], b[i], 1e-5f) << "element " << i << " threads " << n;
  }
}

TEST(CpuThreads, ConcurrentCallers) {
  // Four caller threads, each with its own problem, each calling several times.
  std::vector<test::Problem> problems;
  problems.reserve(4);
  for (int i = 0; i < 4; ++i) {
    Case c = threads_case(i % 2 ? DType::f16 : DType::f32);
    c.N = 600 + 100 * i;
    c.window = i == 3 ? 0 : c.window;
    c.seed = 500 + uint64_t(i);
    problems.emplace_back(c);
  }
  std::vector<std::vector<uint8_t>> results(4);
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i)
    callers.emplace_back([&, i] {
      test::Problem& pr = problems[size_t(i)];
      AttentionParams p = pr.params(Backend::cpu);
      p.num_threads = 1 + i;  // 1, 2, 3, 4: single-thread calls run beside pooled ones
      for (int rep = 0; rep < 5; ++rep) {
        pr.poison();
        if (!attention(p).ok()) ++failures;
        if (rep == 0) results[size_t(i)] = pr.out;
        else if (pr.out != results[size_t(i)]) ++failures;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(problems[size_t(i)].c.str());
    AttentionParams p = problems[size_t(i)].params(Backend::cpu);
    EXPECT_EQ(test::check_against_reference(p, problems[size_t(i)].out.data()), "");
  }
}

TEST(CpuThreads, LongCacheSplitAcrossThreads) {
  // One sequence, one KV head: only a split of the 5000 keys can keep several threads busy.
  for (int threads : {0, 4}) {
    Case c;
    c.dtype = DType::f16;
    c.kf = {8, 128};
    c.vf = {4, 64};
    c.B = 1;
    c.Hq = 4;
    c.Hkv = 1;
    c.Lq = 1;
    c.N = 5000;
    c.D = 128;
    c.sinks = true;
    c.seed = 77;
    SCOPED_TRACE(c.str() + " num_threads=" + std::to_string(threads));
    test::Problem pr(c);
    AttentionParams p = pr.params(Backend::cpu);
    p.num_threads = threads;
    ASSERT_TRUE(attention(p).ok());
    EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
  }
}

TEST(CpuThreads, LargeGroupSplitIntoRowBlocksAndChunks) {
  // 32 query heads x 2 rows on one KV head at D = 512: the group is cut into several row blocks,
  // and each block's keys are split into chunks as well.
  Case c;
  c.dtype = DType::bf16;
  c.kf = {2, 128};
  c.vf = {4, 32};
  c.B = 1;
  c.Hq = 32;
  c.Hkv = 1;
  c.Lq = 2;
  c.N = 1200;
  c.D = 512;
  c.sinks = true;
  c.bool_mask = MaskKind::u32;
  c.seed = 91;
  SCOPED_TRACE(c.str());
  test::Problem pr(c);
  AttentionParams p = pr.params(Backend::cpu);
  p.num_threads = 8;
  ASSERT_TRUE(attention(p).ok());
  EXPECT_EQ(test::check_against_reference(p, pr.out.data()), "");
}

TEST(CpuThreads, NegativeThreadCountIsAnError) {
  test::Problem pr(Case{});
  AttentionParams p = pr.params(Backend::cpu);
  p.num_threads = -2;
  const Status s = attention(p);
  EXPECT_EQ(s.code, StatusCode::invalid_argument);
  EXPECT_NE(s.message.find("num_threads"), std::string::npos) << s.message;
}

// The threaded quantizer and dequantizer write exactly what the host (reference) ones write.
class QuantizeRows : public ::testing::TestWithParam<std::tuple<int, int, DType>> {};

TEST_P(QuantizeRows, BitIdenticalToHost) {
  const auto [bits, group, dtype] = GetParam();
  const int64_t rows = 3001, dim = 256;
  std::mt19937_64 rng(uint64_t(bits * 1000 + group) + uint64_t(dtype));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const auto w = test::make_typed(dtype, rows * dim, [&](int64_t i) { return nd(rng) + float(i % 7) * 0.1f; });
  const QuantFormat f{bits, group};
  const size_t ts = test::tsize(dtype);

  auto quant = [&](Backend b, std::vector<uint32_t>& packed, std::vector<uint8_t>& sc, std::vector<uint8_t>& bi) {
    packed.assign(size_t(rows * dim * bits / 32), 0xdeadbeefu);
    sc.assign(size_t(rows * (dim / group)) * ts, 0xff);
    bi.assign(sc.size(), 0xff);
    QuantizeParams qp;
    qp.dtype = dtype;
    qp.format = f;
    qp.rows = rows;
    qp.dim = dim;
    qp.w = w.data();
    qp.packed = packed.data();
    qp.scales = sc.data();
    qp.biases = bi.data();
    qp.backend = b;
    const Status s = quantize(qp);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_EQ(s.backend, b);
  };
  std::vector<uint32_t> pr, pc;
  std::vector<uint8_t> sr, br, scpu, bcpu;
  quant(Backend::reference, pr, sr, br);
  quant(Backend::cpu, pc, scpu, bcpu);
  EXPECT_EQ(pc, pr);
  EXPECT_EQ(scpu, sr);
  EXPECT_EQ(bcpu, br);

  auto dequant = [&](Backend b, std::vector<uint8_t>& out) {
    out.assign(size_t(rows * dim) * ts, 0xff);
    DequantizeParams dp;
    dp.dtype = dtype;
    dp.format = f;
    dp.rows = rows;
    dp.dim = dim;
    dp.packed = pr.data();
    dp.scales = sr.data();
    dp.biases = br.data();
    dp.w = out.data();
    dp.backend = b;
    const Status s = dequantize(dp);
    ASSERT_TRUE(s.ok()) << s.message;
  };
  std::vector<uint8_t> dr, dc;
  dequant(Backend::reference, dr);
  dequant(Backend::cpu, dc);
  EXPECT_EQ(dc, dr);
}

INSTANTIATE_TEST_SUITE_P(Cpu, QuantizeRows,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(32, 128),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, DType>>& info) {
                           std::ostringstream o;
                           o << "b" << std::get<0>(info.param) << "_g" << std::get<1>(info.param) << "_"
                             << to_string(std::get<2>(info.param));
                           return o.str();
                         });

}  // namespace
