// Times the two-pass experiment's first pass (src/cuda/logits_qk.cu: the logits of all query rows
// of a KV head against every key, into f32) on the wide-head shapes of `qsdpa bench`, beside the
// device-to-device copy bandwidth of the same run (measured as `qsdpa bench` does). Inputs are random words and scales, rotated
// over copies that read at least 5x the L2 per rotation; CUDA events, median of 100 calls after
// 10 warm-up calls. Usage: qsdpa_logits_bench (no arguments).
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

namespace {

#define CK(x)                                                                              \
  do {                                                                                     \
    const cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                       \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  int B, Hq, Hkv, N, D, bits;
};

}  // namespace

int main() {
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
  for (const Shape sh : {Shape{4, 16, 1, 32768, 512, 4}, Shape{4, 16, 1, 32768, 512, 8}, Shape{4, 16, 2, 32768, 256, 4},
                         Shape{4, 16, 2, 32768, 256, 8}}) {
    const int64_t rows = int64_t(sh.B) * sh.Hkv * sh.N, ng = sh.D / 64;
    const size_t kbytes = size_t(rows) * sh.D * sh.bits / 8, sbytes = size_t(rows) * ng * 2;
    const int rs = sh.Hq / sh.Hkv <= 8 ? 8 : 16;  // S's rows per token
    const size_t qbytes = size_t(sh.B) * sh.Hq * sh.D * 2, obytes = size_t(rows) * rs * 4;
    const size_t per_call = kbytes + 2 * sbytes + qbytes;
    const int copies = int(std::max<size_t>(2, (size_t(5) * size_t(l2) + per_call - 1) / per_call));
    std::vector<void*> ks(copies), ss(copies), bs(copies);
    std::vector<uint32_t> hk(kbytes / 4);
    std::vector<uint16_t> hs(sbytes / 2);
    for (auto& w : hk) w = uint32_t(rng());
    for (auto& s : hs) s = uint16_t(0x2000u + (rng() & 0x0fffu));  // f16 in ~[0.008, 0.03]: not zero
    for (int i = 0; i < copies; ++i) {
      CK(cudaMalloc(&ks[i], kbytes));
      CK(cudaMalloc(&ss[i], sbytes));
      CK(cudaMalloc(&bs[i], sbytes));
      CK(cudaMemcpy(ks[i], hk.data(), kbytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ss[i], hs.data(), sbytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(bs[i], hs.data(), sbytes, cudaMemcpyHostToDevice));
    }
    std::vector<uint16_t> hq(qbytes / 2);
    for (auto& v : hq) v = uint16_t(0x3000u + (rng() & 0x03ffu));
    void *q = nullptr, *s = nullptr;
    CK(cudaMalloc(&q, qbytes));
    CK(cudaMalloc(&s, obytes));
    CK(cudaMemcpy(q, hq.data(), qbytes, cudaMemcpyHostToDevice));
    qsdpa::cuda::LogitsQK p;
    p.q = q, p.s = static_cast<float*>(s);
    p.B = sh.B, p.Hq = sh.Hq, p.Hkv = sh.Hkv, p.Lq = 1, p.N = sh.N, p.D = sh.D, p.bits = sh.bits;
    p.scale = 0.0625f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 110; ++i) {
      const int c = i % copies;
      p.k = ks[c], p.k_scales = ss[c], p.k_biases = bs[c];
      CK(cudaEventRecord(e0));
      const qsdpa::Status st = qsdpa::cuda::logits_qk(p, nullptr);
      CK(cudaEventRecord(e1));
      if (!st.ok()) {
        std::fprintf(stderr, "logits_qk: %s\n", st.message.c_str());
        return 1;
      }
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 10) ms.push_back(t);
    }
    const double us = double(median(ms)) * 1e3, moved = double(per_call + obytes);
    const double gbps = moved / (us * 1e-6) / 1e9;
    std::printf("B=%d Hq=%d Hkv=%d N=%d D=%d %d-bit keys: %.1f us, %.1f MB read + %.1f MB of S written, %.1f GB/s "
                "(%.1f %% of copy); %d copies\n",
                sh.B, sh.Hq, sh.Hkv, sh.N, sh.D, sh.bits, us, double(per_call) / 1e6, double(obytes) / 1e6, gbps,
                100.0 * gbps / copy, copies);
    for (int i = 0; i < copies; ++i) cudaFree(ks[i]), cudaFree(ss[i]), cudaFree(bs[i]);
    cudaFree(q), cudaFree(s);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
  }
  return 0;
}
