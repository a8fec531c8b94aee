// Micro-benchmarks of the CPU backend (Google Benchmark), so that regressions show:
//
//   K/<target>/bits/rows     the K kernel on a 64-token tile held in L1: unpack the codes, integer
//                            dot products with `rows` query rows, the affine map (f16 / bf16 q;
//                            K32 = the two-piece q of f32)
//   V/<target>/bits/rows     the V kernel on the same tile: unpack, weighted accumulate (int16
//                            weights of f16 / bf16; V32 = f32 multiply-adds of f32)
//   call/<kernel>/bits/threads/N/rotate
//                            whole attention calls on the default decode shape (B=1 Hq=32 Hkv=8
//                            D=128 Lq=1, group 64, f16), inputs rotated over copies reading 4x the
//                            last-level cache (rotate=1) or one copy (rotate=0, from cache)
//
// K and V report `elem_rows/s`: cache elements times query rows per second (each is one
// multiply-add); `call` reports time per call and the cache bytes read per second.
// One instruction set at a time is chosen with hwy::SetSupportedTargetsForTest.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "cpu/kernel.hpp"
#include "hwy/targets.h"
#include "qsdpa/qsdpa.hpp"

namespace {

using namespace qsdpa;
namespace cpu = qsdpa::detail::cpu;

// Selects a Highway target (0: the portable kernel) for the duration of a benchmark.
struct UseKernel {
  explicit UseKernel(int64_t target) {
    if (target == 0) {
      cpu::set_kernel_choice(cpu::KernelChoice::portable);
    } else {
      cpu::set_kernel_choice(cpu::KernelChoice::automatic);
      hwy::SetSupportedTargetsForTest(target);
    }
  }
  ~UseKernel() {
    hwy::SetSupportedTargetsForTest(0);
    cpu::set_kernel_choice(cpu::KernelChoice::automatic);
  }
};

void BM_Micro(benchmark::State& state, int64_t target, int which, bool f32) {
  UseKernel use(target);
  cpu::MicroArgs a;
  a.which = which;
  a.bits = int(state.range(0));
  a.rows = int(state.range(1));
  a.f32 = f32;
  a.D = 128;
  a.group = 64;
  constexpr int64_t reps = 16;
  if (!cpu::simd_micro(a, 1)) {
    state.SkipWithError("no SIMD kernel on this target");
    return;
  }
  for (auto _ : state) cpu::simd_micro(a, reps);
  state.counters["elem_rows/s"] = benchmark::Counter(double(state.iterations() * reps * cpu::kMicroTokens * a.D * a.rows),
                                                      benchmark::Counter::kIsRate);
}

// A default-decode-shape problem: random codes, f16 scales and biases of realistic size.
struct CallProblem {
  AttentionParams base;
  std::vector<std::vector<uint32_t>> kp, vp;
  std::vector<std::vector<uint16_t>> ks, kz, vs, vz;
  std::vector<uint16_t> q, out;
  int64_t bytes = 0;

  CallProblem(int bits, int64_t N, int copies) {
    const int64_t B = 1, Hq = 32, Hkv = 8, D = 128, G = 64;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.02f, 0.2f);
    const int64_t rows = B * Hkv * N, words = rows * D * bits / 32, groups = rows * D / G;
    auto fill_codes = [&](std::vector<uint32_t>& v) {
      v.resize(size_t(words));
      for (auto& w : v) w = uint32_t(rng());
    };
    auto fill_half = [&](std::vector<uint16_t>& v, int64_t n, bool scale) {
      v.resize(size_t(n));
      for (auto& h : v) h = detail::f32_to_f16(scale ? ud(rng) : 0.3f * nd(rng));
    };
    kp.resize(size_t(copies)), vp.resize(size_t(copies));
    ks.resize(size_t(copies)), kz.resize(size_t(copies)), vs.resize(size_t(copies)), vz.resize(size_t(copies));
    for (int c = 0; c < copies; ++c) {
      fill_codes(kp[size_t(c)]), fill_codes(vp[size_t(c)]);
      fill_half(ks[size_t(c)], groups, true), fill_half(kz[size_t(c)], groups, false);
      fill_half(vs[size_t(c)], groups, true), fill_half(vz[size_t(c)], groups, false);
    }
    fill_half(q, B * Hq * D, false);
    out.resize(q.size());
    base.dtype = DType::f16;
    base.B = B, base.Hq = Hq, base.Hkv = Hkv, base.Lq = 1, base.N = N, base.D = D;
    base.k.format = base.v.format = {bits, int(G)};
    base.q = q.data();
    base.out = out.data();
    base.backend = Backend::cpu;
    bytes = 2 * (words * 4 + 2 * groups * 2);
  }

  AttentionParams params(int c) const {
    AttentionParams p = base;
    p.k.packed = kp[size_t(c)].data(), p.k.scales = ks[size_t(c)].data(), p.k.biases = kz[size_t(c)].data();
    p.v.packed = vp[size_t(c)].data(), p.v.scales = vs[size_t(c)].data(), p.v.biases = vz[size_t(c)].data();
    return p;
  }
};

void BM_Call(benchmark::State& state, int64_t target) {
  UseKernel use(target);
  const int bits = int(state.range(0));
  const int threads = int(state.range(1));
  const int64_t N = state.range(2);
  const bool rotate = state.range(3) != 0;
  // Copies enough to read 4x a 32 MiB last-level cache per rotation (at most 16).
  const int64_t per_call = 2 * 8 * N * 128 * bits / 8;
  const int copies = rotate ? int(std::clamp<int64_t>((int64_t(128) << 20) / per_call + 1, 2, 16)) : 1;
  CallProblem pr(bits, N, copies);
  std::vector<AttentionParams> ps;
  for (int c = 0; c < copies; ++c) {
    ps.push_back(pr.params(c));
    ps.back().num_threads = threads;
  }
  int c = 0;
  for (auto _ : state) {
    const Status s = attention(ps[size_t(c)]);
    if (!s.ok()) {
      state.SkipWithError(s.message.c_str());
      return;
    }
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * pr.bytes);
  state.SetLabel(cpu::kernel_name());
}

// The fastest of the repetitions (--benchmark_repetitions): on a machine shared with other work
// the minimum is the least disturbed figure.
double min_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

std::vector<int64_t> runnable_targets() {
  std::vector<int64_t> v;
  for (int64_t t = cpu::simd_runnable_targets(); t != 0; t &= t - 1)
    if ((t & -t) != HWY_SCALAR) v.push_back(t & -t);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int64_t t : runnable_targets()) {
    const std::string name = hwy::TargetName(t);
    for (int which : {0, 1})
      for (bool f32 : {false, true}) {
        const std::string kind = std::string(which == 0 ? "K" : "V") + (f32 ? "32/" : "/");
        benchmark::RegisterBenchmark((kind + name).c_str(), BM_Micro, t, which, f32)
            ->ArgNames({"bits", "rows"})
            ->ArgsProduct({{2, 4, 8}, {1, 4}})
            ->ComputeStatistics("min", min_of);
      }
  }
  // Whole calls: the best SIMD target and the portable kernel.
  const std::vector<int64_t> ts = runnable_targets();
  std::vector<int64_t> kernels;
  if (!ts.empty()) kernels.push_back(ts.front());
  kernels.push_back(0);
  for (int64_t t : kernels)
    benchmark::RegisterBenchmark(("call/" + std::string(t ? hwy::TargetName(t) : "portable")).c_str(), BM_Call, t)
        ->ArgNames({"bits", "threads", "N", "rotate"})
        ->ArgsProduct({{4, 8}, {1, 2}, {1024, 8192}, {1, 0}})
        ->UseRealTime()
        ->MeasureProcessCPUTime()
        ->ComputeStatistics("min", min_of)
        ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
