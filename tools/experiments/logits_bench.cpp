// Times the two-pass experiment (src/cuda/logits_qk.cu: the logits of all query rows of a KV head
// against every key, into f32; pv_slices.cu: the values per 128-dim slice and the merge) on the
// wide-head shapes of `qsdpa bench` (4- and 8-bit): pass 1 alone (1, 2, 4 and 8 tiles per warp),
// and both passes with 16 to 64 splits, beside the device-to-device copy bandwidth of the same run
// (measured as `qsdpa bench` does).
// Inputs are random words and scales, rotated over copies that read at least 5x the L2 per
// rotation; CUDA events, median of 100 calls after 10 warm-up calls. Usage: qsdpa_logits_bench [D bits]
// (one shape only, e.g. under a profiler).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/testing.hpp"
#include "exec.hpp"
#include "experiments/cuda_check.hpp"

namespace {

struct Shape {
  int B, Hq, Hkv, N, D, bits;
};

}  // namespace

int main(int argc, char** argv) {
  const int only_d = argc > 2 ? std::atoi(argv[1]) : 0, only_bits = argc > 2 ? std::atoi(argv[2]) : 0;
  int dev = 0, l2 = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  double copy = 0.0;  // (the measurement of `qsdpa bench`)
  std::string how;
  if (const qsdpa::Status st = qsdpa_cli::copy_bandwidth(qsdpa::Backend::cuda, &copy, &how); !st.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", st.message.c_str());
    return 1;
  }
  std::printf("logits_qk (first pass of the two-pass experiment) on %s; copy %.1f GB/s (read + write); L2 %d MiB\n",
              prop.name, copy, l2 >> 20);
  std::mt19937 rng(1);
  // median time of 100 calls after 10 (us); call(c) runs on copy c
  const auto time_us = [](int copies, auto&& call) {
    return qsdpa_experiments::median_us(10, 100, [&](int i) {
      if (const qsdpa::Status st = call(i % copies); !st.ok()) {
        std::fprintf(stderr, "call: %s\n", st.message.c_str());
        std::exit(1);
      }
    });
  };
  for (const Shape sh : {Shape{4, 16, 1, 32768, 512, 4}, Shape{4, 16, 1, 32768, 512, 8}, Shape{4, 16, 2, 32768, 256, 4},
                         Shape{4, 16, 2, 32768, 256, 8}}) {
    if (only_d && (sh.D != only_d || sh.bits != only_bits)) continue;
    const int64_t rows = int64_t(sh.B) * sh.Hkv * sh.N, ng = sh.D / 64;
    const size_t kbytes = size_t(rows) * sh.D * sh.bits / 8, sbytes = size_t(rows) * ng * 2;
    const int rs = sh.Hq / sh.Hkv <= 8 ? 8 : 16;  // S's rows per token
    const size_t qbytes = size_t(sh.B) * sh.Hq * sh.D * 2, obytes = size_t(rows) * rs * 4;
    const size_t per_call = kbytes + 2 * sbytes + qbytes;
    // copies of K (and V) that read at least 5x the L2 per rotation
    const size_t per_copy = 2 * per_call;  // K and V
    const int copies = int(std::max<size_t>(2, (size_t(5) * size_t(l2) + per_copy - 1) / per_copy));
    std::vector<void*> bufs(size_t(copies) * 6, nullptr);  // k, ks, kb, v, vs, vb per copy
    std::vector<uint32_t> hk(kbytes / 4);
    std::vector<uint16_t> hs(sbytes / 2);
    for (auto& w : hk) w = uint32_t(rng());
    for (auto& x : hs) x = uint16_t(0x2000u + (rng() & 0x0fffu));  // f16 in ~[0.008, 0.03]: not zero
    for (int i = 0; i < copies; ++i)
      for (int j = 0; j < 6; ++j) {
        const bool words = j % 3 == 0;
        void*& b = bufs[size_t(i) * 6 + j];
        CK(cudaMalloc(&b, words ? kbytes : sbytes));
        CK(cudaMemcpy(b, words ? static_cast<const void*>(hk.data()) : static_cast<const void*>(hs.data()),
                      words ? kbytes : sbytes, cudaMemcpyHostToDevice));
      }
    std::vector<uint16_t> hq(qbytes / 2);
    for (auto& v : hq) v = uint16_t(0x3000u + (rng() & 0x03ffu));
    void *q = nullptr, *sbuf = nullptr, *out = nullptr, *ws = nullptr;
    CK(cudaMalloc(&q, qbytes));
    CK(cudaMalloc(&sbuf, obytes));
    CK(cudaMalloc(&out, qbytes));
    CK(cudaMemcpy(q, hq.data(), qbytes, cudaMemcpyHostToDevice));
    qsdpa::cuda::LogitsQK p;
    p.q = q, p.s = static_cast<float*>(sbuf);
    p.B = sh.B, p.Hq = sh.Hq, p.Hkv = sh.Hkv, p.Lq = 1, p.N = sh.N, p.D = sh.D, p.bits = sh.bits;
    p.scale = 0.0625f;
    const auto on = [&](int c) {
      auto r = p;
      r.k = bufs[size_t(c) * 6], r.k_scales = bufs[size_t(c) * 6 + 1], r.k_biases = bufs[size_t(c) * 6 + 2];
      return r;
    };
    // pass 1 with 1, 2, 4 (the default) and 8 tiles of 32 tokens per warp and block; the best
    // is kept for the two passes
    double best = 1e30;
    int best_tpw = 0;
    for (const int tpw : {1, 2, 4, 8}) {
      p.tiles_per_warp = tpw;
      const double us = time_us(copies, [&](int c) { return qsdpa::cuda::logits_qk(on(c), nullptr); });
      const double gbps = double(per_call + obytes) / (us * 1e-6) / 1e9;
      std::printf("B=%d Hq=%d Hkv=%d N=%d D=%d %d-bit keys, pass 1, %d tiles per warp: %.1f us, %.1f MB read + %.1f MB "
                  "of S written, %.1f GB/s (%.1f %% of copy); %d copies\n",
                  sh.B, sh.Hq, sh.Hkv, sh.N, sh.D, sh.bits, tpw, us, double(per_call) / 1e6, double(obytes) / 1e6,
                  gbps, 100.0 * gbps / copy, copies);
      if (us < best) best = us, best_tpw = tpw;
    }
    p.tiles_per_warp = best_tpw;
    {
      // both passes and the merge; bytes as `qsdpa bench` counts them (K and V, scales, biases, q, out)
      const double cache = double(2 * per_call + qbytes);
      for (const int splits : {16, 24, 32, 48, 64}) {
        CK(cudaMalloc(&ws, qsdpa::cuda::two_pass_workspace_bytes(p, splits)));
        const double t2 = time_us(copies, [&](int c) {
          const size_t o = size_t(c) * 6;
          return qsdpa::cuda::two_pass_attention(on(c), bufs[o + 3], bufs[o + 4], bufs[o + 5], out, ws, splits, nullptr);
        });
        const double g2 = cache / (t2 * 1e-6) / 1e9;
        std::printf("  two passes, %d splits (pass 1: %d tiles per warp): %.1f us, %.1f GB/s of cache, q and out (%.1f %% "
                    "of copy)\n", splits, p.tiles_per_warp, t2, g2, 100.0 * g2 / copy);
        cudaFree(ws);
      }
    }
    for (void* b : bufs)
      if (b) cudaFree(b);
    cudaFree(q), cudaFree(sbuf), cudaFree(out);
  }
  return 0;
}
