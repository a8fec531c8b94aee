// What does a kernel's first load of a cache page cost? The traces of the attention kernel (docs/PERF.md,
// runs 69-70 and 78) put its first tile 2.6-3.0 us after a block's start even where the memory is
// idle (B=1 N=4096: 2.4 MB requested by the whole grid), against a DRAM latency of well under a
// microsecond. One candidate is address translation: every call reads pages that the previous call
// did not touch (the bench rotates its inputs over a few hundred MB; a model's layers each have
// their own cache, many GB in all), so the first load of a page may wait for a page-table walk.
// This program measures it. One buffer of up to 16 GB, zero-filled; for each span S:
//   1. a "flush" kernel reads the first 256 KB of every 2 MB page of [0, S), in ascending order
//      (every page's translation used; the pages at the start of the span were touched the longest
//      ago; the L2 keeps the last ~50 MB; an eighth of each page, so that the 16 GB span's flushes
//      take seconds, not a minute);
//   2. a probe kernel, one block of one warp per SM, lane 0 alone, chained loads (each address
//      depends on the value before), clock64 around each:
//        first   a line in the second half (never read, so not in the L2) of a page: its first
//                access since the flush,
//        second  another never-read line of the same page (the page's translation now warm),
//        l2      the second line again (an L2 hit),
//      in three cases: "old" pages (block i: page i of the span's first quarter), "recent" pages
//      (the span's last pages, touched just before the probe), and "shared old" (every block in
//      the same old page, different lines).
// Then the instruction side: a kernel that runs 64 KB of straight-line code (4096 dependent FFMA),
// timed again at once, after other code, after other code and a 1 GB read through the L2 (which
// the attention kernels' streams do to their own code every call), and after the same read with
// evict-first loads. The kernels' prologues and merges run their code once per call, and an
// earlier ncu profile (run 62) had the merge of the last split waiting mostly on instruction fetch.
// Cycles are converted to ns with the SM clock measured in the same run (clock64 against
// %globaltimer over ~2 ms). Medians over blocks and 10 repetitions (3 at spans over 1 GB). Each
// row is printed as it is done (line-buffered), so a run cut off by a time limit keeps what it
// measured. Usage: qsdpa_first_touch_bench.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "experiments/cuda_check.hpp"

namespace {

constexpr int64_t kPage = int64_t(2) << 20;

__device__ __forceinline__ uint32_t ld_cg(const char* p) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Reads the first `head` bytes (a multiple of 16, at most half a page) of each 2 MB page of
// [0, bytes), 16 bytes per thread per step; EF: with evict-first loads (L2::evict_first).
template <bool EF>
__global__ void flush_kernel(const char* buf, int64_t bytes, int64_t head, uint32_t* sink) {
  uint32_t acc = 0;
  uint64_t pol = 0;
  if constexpr (EF) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const int64_t pieces = head / 16;
  const int64_t total = bytes / kPage * pieces;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t page = i / pieces, off = (i - page * pieces) * 16;
    uint4 v;
    if constexpr (EF)
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(buf + page * kPage + off), "l"(pol));
    else
      v = __ldcg(reinterpret_cast<const uint4*>(buf + page * kPage + off));
    acc ^= v.x + v.y + v.z + v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // (never, for zeros: keeps the loads)
}

// One block of one warp per SM; lane 0 times three chained loads in page pages[blockIdx.x] (the
// buffer is zeros, so each value adds 0 to the next address, which the compiler cannot know).
// Each value is stored to shared memory before the clock is read: a warp issues in order, so the
// store, and the clock read behind it, wait for the load's value.
// Block i reads in the 4 KB slot i % 256 of the page's second half (1 MB: 256 slots, so no two
// blocks of a GPU of up to 256 SMs read the same line, also where several share a page): the first
// load at 128 rep bytes into it, the second at 2048 + 128 rep (rep: the repetition, so that no line
// read by an earlier repetition is read again, whatever the L2 kept).
__global__ void probe_kernel(const char* buf, const int64_t* pages, int64_t* cycles, int rep) {
  __shared__ volatile uint32_t seen[4];
  if (threadIdx.x != 0) return;
  const char* page = buf + pages[blockIdx.x] * kPage;
  const int64_t slot = kPage / 2 + 4096 * int64_t(blockIdx.x % 256);  // never read by the flush
  const long long t0 = clock64();
  const uint32_t v1 = ld_cg(page + slot + 128 * rep);
  seen[0] = v1;
  const long long t1 = clock64();
  const uint32_t v2 = ld_cg(page + slot + 2048 + 128 * rep + v1);
  seen[1] = v2;
  const long long t2 = clock64();
  const uint32_t v3 = ld_cg(page + slot + 2048 + 128 * rep + v2);
  seen[2] = v3;
  const long long t3 = clock64();
  cycles[3 * blockIdx.x + 0] = t1 - t0;
  cycles[3 * blockIdx.x + 1] = t2 - t1;
  cycles[3 * blockIdx.x + 2] = t3 - t2 + seen[2];
}

// The instruction side: kCodeInstr dependent FFMA in a straight line (16 bytes each: 64 KB of code,
// ~4 cycles each once fetched). SALT makes a second copy with other code (another constant), run to
// replace the first in the multiprocessors' instruction caches. Each block's lane 0 reports the
// cycles of the straight line; the value is stored (shared memory, then global) before the clock.
constexpr int kCodeInstr = 4096;
template <int SALT>
__global__ void straight_kernel(float* out, int64_t* cycles) {
  __shared__ volatile float seen;
  float x = float(threadIdx.x);
  const long long t0 = clock64();
#pragma unroll
  for (int i = 0; i < kCodeInstr; ++i) x = fmaf(x, 1.0000001f + float(SALT) * 1e-7f, 0.5f);
  seen = x;
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (x == 1.2345f) out[threadIdx.x] = x;  // (never)
}

__global__ void clock_kernel(long long* out) {
  long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  const long long c0 = clock64();
  long long g = g0;
  while (g - g0 < 2000000) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  const long long c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  out[0] = c1 - c0;
  out[1] = g1 - g0;
}

// The value `tenths` / 10 of the way through the sorted samples (5: the median, 9: the p90).
double quantile(std::vector<double> v, int tenths) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() * size_t(tenths) / 10];
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // (rows out as they come: see the top)
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  int64_t max_span = int64_t(16) << 30;
  while (max_span > int64_t(free_b) * 4 / 10) max_span /= 2;
  char* buf = nullptr;
  CK(cudaMalloc(&buf, size_t(max_span)));
  CK(cudaMemset(buf, 0, size_t(max_span)));
  uint32_t* sink = nullptr;
  int64_t *pages_d = nullptr, *cycles_d = nullptr;
  long long* clk_d = nullptr;
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&pages_d, sizeof(int64_t) * sms));
  CK(cudaMalloc(&cycles_d, sizeof(int64_t) * 3 * sms));
  CK(cudaMalloc(&clk_d, 2 * sizeof(long long)));

  clock_kernel<<<1, 1>>>(clk_d);
  long long clk[2];
  CK(cudaMemcpy(clk, clk_d, sizeof clk, cudaMemcpyDeviceToHost));
  const double ghz = double(clk[0]) / double(clk[1]);
  std::printf("qsdpa_first_touch_bench: %s, %d SMs, SM clock %.3f GHz (measured), buffer %lld MB\n", prop.name, sms, ghz,
              static_cast<long long>(max_span >> 20));
  std::printf("ns per load, medians over %d blocks x 10 repetitions, 3 over 1 GB (p90 in brackets)\n", sms);
  std::printf("%-9s %-11s %15s %15s %15s\n", "span", "pages", "first", "second", "l2");

  for (int64_t span = int64_t(64) << 20; span <= max_span; span *= 4) {
    const int64_t np = span / kPage;
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<int64_t> pages(sms);
      for (int i = 0; i < sms; ++i) {
        const int64_t quarter = std::max<int64_t>(1, np / 4);
        pages[i] = mode == 0 ? i % quarter : mode == 1 ? np - 1 - (i % quarter) : 0;
      }
      CK(cudaMemcpy(pages_d, pages.data(), sizeof(int64_t) * sms, cudaMemcpyHostToDevice));
      std::vector<double> f, s, l;
      // (10 measured repetitions up to 1 GB, 3 above: each flush of 16 GB reads 2 GB)
      const int reps = span <= (int64_t(1) << 30) ? 11 : 4;
      for (int rep = 0; rep < reps; ++rep) {
        flush_kernel<false><<<4 * sms, 256>>>(buf, span, kPage / 8, sink);
        probe_kernel<<<sms, 32>>>(buf, pages_d, cycles_d, rep);
        CK(cudaGetLastError());
        std::vector<int64_t> cy(3 * sms);
        CK(cudaMemcpy(cy.data(), cycles_d, sizeof(int64_t) * 3 * sms, cudaMemcpyDeviceToHost));
        if (rep == 0) continue;  // (warm-up)
        for (int i = 0; i < sms; ++i) {
          f.push_back(double(cy[3 * i]) / ghz);
          s.push_back(double(cy[3 * i + 1]) / ghz);
          l.push_back(double(cy[3 * i + 2]) / ghz);
        }
      }
      static const char* const kMode[] = {"old", "recent", "shared old"};
      char sp[32];
      std::snprintf(sp, sizeof sp, "%lld MB", static_cast<long long>(span >> 20));
      std::printf("%-9s %-11s %7.0f [%5.0f] %7.0f [%5.0f] %7.0f [%5.0f]\n", sp, kMode[mode], quantile(f, 5),
                  quantile(f, 9), quantile(s, 5), quantile(s, 9), quantile(l, 5), quantile(l, 9));
    }
  }
  // ---- the instruction side ----------------------------------------------------------------
  {
    int64_t* cyc_d = nullptr;
    float* junk = nullptr;
    CK(cudaMalloc(&cyc_d, sizeof(int64_t) * sms));
    CK(cudaMalloc(&junk, 1024));
    // (the flush reads half of each page of [0, 2 fspan): fspan bytes, inside the buffer)
    const int64_t fspan = std::min<int64_t>(max_span / 2, int64_t(1) << 30);
    std::printf("\n%d dependent FFMA in a straight line (%d KB of code), one warp per SM, us (median [p90] over %d "
                "blocks x 10); the reads below: %lld MB\n",
                kCodeInstr, kCodeInstr * 16 / 1024, sms, static_cast<long long>(fspan >> 20));
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<double> us;
      for (int rep = 0; rep < 11; ++rep) {
        straight_kernel<0><<<sms, 32>>>(junk, cyc_d);  // (the code into every cache)
        if (mode >= 1) {  // (128 KB of other code through the SMs' instruction caches)
          straight_kernel<1><<<sms, 32>>>(junk, cyc_d);
          straight_kernel<2><<<sms, 32>>>(junk, cyc_d);
        }
        if (mode >= 2) (mode == 3 ? flush_kernel<true> : flush_kernel<false>)<<<4 * sms, 256>>>(buf, 2 * fspan, kPage / 2, sink);
        straight_kernel<0><<<sms, 32>>>(junk, cyc_d);
        CK(cudaGetLastError());
        std::vector<int64_t> cy(sms);
        CK(cudaMemcpy(cy.data(), cyc_d, sizeof(int64_t) * sms, cudaMemcpyDeviceToHost));
        if (rep == 0) continue;
        for (int i = 0; i < sms; ++i) us.push_back(double(cy[i]) / ghz / 1000.0);
      }
      static const char* const kCase[] = {
          "again at once (code in the SMs' caches)", "after other code (code in L2)",
          "after other code and a read (code from DRAM?)", "after other code and an evict-first read"};
      std::printf("  %-52s %7.2f [%6.2f]\n", kCase[mode], quantile(us, 5), quantile(us, 9));
    }
    CK(cudaFree(cyc_d));
    CK(cudaFree(junk));
  }
  CK(cudaFree(buf));
  CK(cudaFree(sink));
  CK(cudaFree(pages_d));
  CK(cudaFree(cycles_d));
  CK(cudaFree(clk_d));
  return 0;
}
