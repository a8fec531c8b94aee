// Does the order in which a kernel reads wide key rows cost memory bandwidth? The wide-head kernels
// (the fused d-split kernel at D = 512 and the two-pass study's pass 1, docs/PERF.md runs 109-110)
// read a 32-token tile of 256-byte rows (D = 512, 4-bit) a 32-byte column at a time: one load
// instruction touches 8 rows, and a row's 8 columns arrive over the whole tile. The D = 128 kernel,
// which reaches ~90 % of the copy, reads 64-byte rows. This program reads one large buffer
// (several times the L2) in five orders, with the same grid (4 blocks of 4 warps per SM, a grid-
// stride loop over 32-row tiles) and the same bytes, and prints GB/s and the fraction of the
// device-to-device copy bandwidth measured in the same run:
//   contiguous  each warp reads its tile as 16 bytes per lane, consecutive lanes consecutive bytes;
//   columns     pass 1's order: for each 32-byte column p, lane (g, c) reads 8 bytes at p * 32 + c * 8
//               of rows g, g + 8, g + 16, g + 24 (the loads of column p + 1 issued after column p's
//               sums, as in a kernel that consumes each column before the next);
//   columns-all the same addresses, every column's loads issued before any sum (the most in flight);
//   rows4       a lane reads 16 bytes of row g + 8 i at column c (c = 0..3, 64-byte strips): the D = 128
//               kernel's order on 256-byte rows;
//   warp-strips the fused d-split kernel's copy order: the 4 warps of a block read the same 32-row
//               tile, warp w the strip [w ROW / 4, (w + 1) ROW / 4) of every row, 16 bytes per lane
//               (a block's tiles are 4x apart as often as a warp's tiles are in the other orders).
// Row widths 256 (D = 512 4-bit) and 128 bytes (D = 256 4-bit). Events, median of 30 calls after 5.
// Usage: qsdpa_stride_bench.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "exec.hpp"
#include "experiments/cuda_check.hpp"

namespace {

enum Order { kContiguous, kColumns, kColumnsAll, kRows4, kWarpStrips };
const char* const kOrderName[] = {"contiguous", "columns", "columns-all", "rows4", "warp-strips"};
constexpr int kOrders = 5;

// ROW: bytes per row (128 or 256). A tile is 32 rows. Each thread folds what it reads into one word.
template <int ROW, int ORDER>
__global__ void __launch_bounds__(128, 4) read_kernel(const uint4* __restrict__ buf, int64_t tiles, uint32_t* sink) {
  constexpr int COLS = ROW / 32;  // 32-byte columns per row
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int64_t w0 = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  uint32_t acc = 0;
  if constexpr (ORDER == kWarpStrips) {
    constexpr int SB = ROW / 4;       // bytes of a warp's strip of a row
    constexpr int RPI = 512 / SB;     // rows per load instruction (32 lanes x 16 bytes)
    const int w = threadIdx.x >> 5, r0 = lane / (SB / 16), col = (lane % (SB / 16)) * 16;
#pragma unroll 1
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const char* base = reinterpret_cast<const char*>(buf) + tile * 32 * ROW + w * SB + col;
#pragma unroll
      for (int i = 0; i < 32 / RPI; ++i) {
        const uint4 v = *reinterpret_cast<const uint4*>(base + (r0 + RPI * i) * ROW);
        acc ^= v.x + v.y + v.z + v.w;
      }
    }
  } else {
#pragma unroll 1  // one tile at a time in every order (what differs is the order inside a tile)
    for (int64_t tile = w0; tile < tiles; tile += warps) {
      const char* base = reinterpret_cast<const char*>(buf) + tile * 32 * ROW;
      if constexpr (ORDER == kContiguous) {
        // 32 * ROW bytes: ROW / 16 loads of 512 bytes per warp
#pragma unroll
        for (int i = 0; i < ROW / 16; ++i) {
          const uint4 v = *reinterpret_cast<const uint4*>(base + (i * 32 + lane) * 16);
          acc ^= v.x + v.y + v.z + v.w;
        }
      } else if constexpr (ORDER == kColumns) {
#pragma unroll 1
        for (int p = 0; p < COLS; ++p) {
          uint2 v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = *reinterpret_cast<const uint2*>(base + (g + 8 * i) * ROW + p * 32 + c * 8);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc = acc * 3u + (v[i].x ^ v[i].y);
        }
      } else if constexpr (ORDER == kColumnsAll) {
        uint2 v[COLS][4];
#pragma unroll
        for (int p = 0; p < COLS; ++p)
#pragma unroll
          for (int i = 0; i < 4; ++i) v[p][i] = *reinterpret_cast<const uint2*>(base + (g + 8 * i) * ROW + p * 32 + c * 8);
#pragma unroll
        for (int p = 0; p < COLS; ++p)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc = acc * 3u + (v[p][i].x ^ v[p][i].y);
      } else {
        static_assert(ORDER == kRows4);
        // 64-byte strips: lane (g, c) reads 16 bytes at strip s, column c of row g + 8 i
#pragma unroll
        for (int s = 0; s < ROW / 64; ++s)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint4 v = *reinterpret_cast<const uint4*>(base + (g + 8 * i) * ROW + s * 64 + c * 16);
            acc ^= v.x + v.y + v.z + v.w;
          }
      }
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // (keeps the loads; practically never stores)
}

template <int ROW, int ORDER>
void launch(const uint4* buf, int64_t tiles, uint32_t* sink, int blocks) {
  read_kernel<ROW, ORDER><<<blocks, 128>>>(buf, tiles, sink);
}

using Launch = void (*)(const uint4*, int64_t, uint32_t*, int);

}  // namespace

int main() {
  int dev = 0, sms = 0, l2 = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  double copy = 0.0;
  std::string how;
  if (const qsdpa::Status st = qsdpa_cli::copy_bandwidth(qsdpa::Backend::cuda, &copy, &how); !st.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", st.message.c_str());
    return 1;
  }
  // one buffer of at least 16x the L2 (and 1 GiB), random words
  const size_t bytes = std::max<size_t>(size_t(1) << 30, size_t(16) * size_t(l2)) / 8192 * 8192;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMalloc(&sink, 4));
  {
    std::vector<uint32_t> h(bytes / 4);
    uint32_t x = 12345u;
    for (auto& w : h) w = (x = x * 1664525u + 1013904223u);
    CK(cudaMemcpy(buf, h.data(), bytes, cudaMemcpyHostToDevice));
  }
  std::printf("read orders on %s (%d SMs, L2 %d MiB); copy %.1f GB/s; buffer %.0f MB\n", prop.name, sms, l2 >> 20, copy,
              double(bytes) / 1e6);
  const Launch table[2][kOrders] = {
      {launch<128, kContiguous>, launch<128, kColumns>, launch<128, kColumnsAll>, launch<128, kRows4>, launch<128, kWarpStrips>},
      {launch<256, kContiguous>, launch<256, kColumns>, launch<256, kColumnsAll>, launch<256, kRows4>, launch<256, kWarpStrips>}};
  for (int w = 0; w < 2; ++w) {
    const int row = w ? 256 : 128;
    const int64_t tiles = int64_t(bytes / (32 * size_t(row)));
    for (int o = 0; o < kOrders; ++o) {
      const double us =
          qsdpa_experiments::median_us(5, 30, [&](int) { table[w][o](static_cast<const uint4*>(buf), tiles, sink, 4 * sms); });
      CK(cudaGetLastError());
      const double gbps = double(bytes) / (us * 1e-6) / 1e9;
      std::printf("rows of %3d bytes, %-11s: %8.1f us, %7.1f GB/s (%5.1f %% of copy)\n", row, kOrderName[o], us, gbps,
                  100.0 * gbps / copy);
    }
  }
  cudaFree(buf), cudaFree(sink);
  return 0;
}
