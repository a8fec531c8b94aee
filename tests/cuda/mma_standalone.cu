// Standalone accuracy test and benchmark of the tensor-core attention kernel (attention_mma.cu),
// for a GPU machine without GoogleTest: random problems quantized with the host quantizer,
// checked row by row against the double-precision reference (SPEC section 4), and timings of
// the decode shapes with CUDA events against the device-to-device copy bandwidth of the same run.
//
// Build and run (from the repository root; the variants it times are listed in variant()):
//   F="-std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc/cuda"
//   for f in attention_mma attention_mma_dense attention_mma_layout attention_mma_mixed; do nvcc $F -c src/cuda/$f.cu -o $f.o; done
//   nvcc $F -c tests/cuda/mma_standalone.cu -o t.o
//   g++ -std=c++20 -O2 -ffp-contract=off -Iinclude -c src/core/quantize_host.cpp -o q.o
//   g++ -std=c++20 -O2 -Iinclude -c src/reference/reference.cpp -o r.o
//   nvcc -arch=sm_90a attention_mma*.o t.o q.o r.o -o mma_standalone
//   ./mma_standalone [acc] [bench] [quick] [one]   (acc and bench when no argument; quick: a few
//   small cases for compute-sanitizer; one: the headline shape once, for ncu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../src/core/backends.hpp"
#include "../../src/core/half.hpp"
#include "../../src/cuda/attention_mma.cuh"
#include "../../src/cuda/mma_kernel.cuh"

namespace qsdpa::detail {
// The one symbol of core/check.cpp the reference and the quantizer use.
Status make_status(StatusCode c, std::string msg, Backend b) {
  Status s;
  s.code = c;
  s.message = std::move(msg);
  s.backend = b;
  return s;
}
}  // namespace qsdpa::detail

using namespace qsdpa;
using cuda::AttnArgs;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// ---- a minimal split-K combine (the library's is in combine.cu) ------------------------------
__global__ void combine_kernel(AttnArgs a, int64_t rows) {
  const int64_t row = blockIdx.x;
  const int S = a.num_splits;
  float mx = -INFINITY;
  for (int s = 0; s < S; ++s) mx = fmaxf(mx, a.part_m[int64_t(s) * rows + row]);
  const bool any = mx != -INFINITY;
  float denom = 0.f;
  if (any && a.sinks) {
    const float sink = a.sinks[(row / a.Lq) % a.Hq];
    mx = fmaxf(mx, sink);
    denom = expf(sink - mx);
  }
  if (any)
    for (int s = 0; s < S; ++s) {
      const float m = a.part_m[int64_t(s) * rows + row];
      if (m != -INFINITY) denom += expf(m - mx) * a.part_l[int64_t(s) * rows + row];
    }
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
    float r = 0.f;
    if (any) {
      for (int s = 0; s < S; ++s) {
        const float m = a.part_m[int64_t(s) * rows + row];
        if (m != -INFINITY) r += expf(m - mx) * a.part_o[(int64_t(s) * rows + row) * a.D + d];
      }
      r /= denom;
    }
    uint16_t* o = static_cast<uint16_t*>(a.out);
    o[row * a.D + d] = a.dtype == 1 ? __half_as_ushort(__float2half_rn(r)) : __bfloat16_as_ushort(__float2bfloat16_rn(r));
  }
}

// ---- launchers of extra variants (not the library's defaults) --------------------------------
using LaunchFn = cudaError_t (*)(const AttnArgs&, cudaStream_t);
LaunchFn variant(const std::string& name) {
  using namespace cuda::mmak;
  // key codes magic (mag) instead of subnormal; copy ring of 2 or 4 stages instead of 3 (the
  // library now runs 2 stages: attention_mma.cu, kStages)
  // (dense caches: LAYOUT = kContig (0); keys and values of one width; the group size of the call, GC = 0)
  if (name == "mag_f16_4_128_1") return launch<__half, 4, 4, 128, 1, false, 3, 0, 0>;
  if (name == "mag_f16_4_128_2") return launch<__half, 4, 4, 128, 2, false, 3, 0, 0>;
  if (name == "mag_f16_8_128_1") return launch<__half, 8, 8, 128, 1, false, 3, 0, 0>;
  if (name == "st2_f16_4_128_1") return launch<__half, 4, 4, 128, 1, true, 2, 0, 0>;
  if (name == "st4_f16_4_128_1") return launch<__half, 4, 4, 128, 1, true, 4, 0, 0>;
  return nullptr;
}

// ---- problems ---------------------------------------------------------------------------------
struct Cfg {
  DType dtype = DType::f16;
  int bits = 4, G = 64;
  int64_t B = 1, Hq = 8, Hkv = 2, Lq = 1, N = 1000, D = 128;
  bool sinks = false;
  int64_t window = 0;
  int bmask = 0;  // 0 none, 1 u8, 2 u32
  bool fmask = false;
  float qscale = 1.f, vscale = 1.f;
  int splits = 3;
  std::string var;  // "" = the library's dispatch
  uint64_t seed = 1;
  std::string str() const {
    char b[320];
    std::snprintf(b, sizeof b,
                  "%s %db g%d B%lld Hq%lld Hkv%lld Lq%lld N%lld D%lld sinks%d win%lld bmask%d fmask%d qs%g vs%g sp%d %s",
                  dtype == DType::f16 ? "f16" : "bf16", bits, G, (long long)B, (long long)Hq, (long long)Hkv,
                  (long long)Lq, (long long)N, (long long)D, int(sinks), (long long)window, bmask, int(fmask), qscale,
                  vscale, splits, var.c_str());
    return b;
  }
};

template <class T>
T* dcopy(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(16, h.size() * sizeof(T))));
  if (!h.empty()) CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct HostKV {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;
};

HostKV quantize(DType t, int bits, int G, int64_t rows, int64_t D, const std::vector<uint16_t>& w) {
  HostKV c;
  c.packed.resize(size_t(rows * D * bits / 32));
  c.scales.resize(size_t(rows * (D / G)));
  c.biases.resize(c.scales.size());
  QuantizeParams qp;
  qp.dtype = t;
  qp.format = {bits, G};
  qp.rows = rows;
  qp.dim = D;
  qp.w = w.data();
  qp.packed = c.packed.data();
  qp.scales = c.scales.data();
  qp.biases = c.biases.data();
  detail::host_quantize_rows(qp, 0, rows);
  return c;
}

// Splits of `chunk` tokens, chunk a multiple of the kernel's tile.
void plan(AttnArgs& a, int splits) {
  const int64_t tile = cuda::mma_token_tile(a);
  int64_t chunk = (std::max<int64_t>(a.N, 1) + splits - 1) / splits;
  chunk = (chunk + tile - 1) / tile * tile;
  a.chunk = chunk;
  a.num_splits = int(std::max<int64_t>(1, (a.N + chunk - 1) / chunk));
  a.t_begin = 0;
}

// Runs one problem; returns the worst ||out-ref|| / (tol ||ref|| + atol) over the rows (> 1 fails).
double run_case(const Cfg& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  const DType t = c.dtype;
  const int64_t rows_kv = c.B * c.Hkv * c.N, rows_q = c.B * c.Hq * c.Lq;
  auto st = [&](float v) { return t == DType::f16 ? detail::f32_to_f16(v) : detail::f32_to_bf16(v); };
  std::vector<uint16_t> q(size_t(rows_q * c.D)), kr(size_t(rows_kv * c.D)), vr(size_t(rows_kv * c.D));
  for (auto& x : q) x = st(c.qscale * nd(rng));
  for (size_t i = 0; i < kr.size(); ++i) kr[i] = st(((i % c.D) % 29 == 3 ? 8.f : 1.f) * nd(rng) + 0.25f);
  for (auto& x : vr) x = st(c.vscale * nd(rng));
  HostKV k = quantize(t, c.bits, c.G, rows_kv, c.D, kr), v = quantize(t, c.bits, c.G, rows_kv, c.D, vr);
  std::vector<float> sinks;
  if (c.sinks) {
    std::uniform_real_distribution<float> sd(-10.f, 10.f);
    sinks.resize(size_t(c.Hq));
    for (auto& s : sinks) s = sd(rng);
  }
  const int64_t mn = rows_q * c.N;
  std::vector<uint8_t> bm8;
  std::vector<uint32_t> bm32;
  std::vector<uint16_t> fm;
  std::bernoulli_distribution keep(0.8), hide(0.1);
  if (c.bmask == 1) {
    bm8.resize(size_t(mn));
    for (auto& m : bm8) m = keep(rng) ? uint8_t(1 + rng() % 255) : 0;
  } else if (c.bmask == 2) {
    bm32.resize(size_t(mn));
    for (auto& m : bm32) m = keep(rng) ? uint32_t(1 + rng() % 0xfffffffeu) : 0u;
  }
  if (c.fmask) {
    fm.resize(size_t(mn));
    for (int64_t i = 0; i < mn; ++i)
      fm[size_t(i)] = (hide(rng) || i % c.N < 3) ? st(-INFINITY) : st(2.f * ud(rng));  // -inf first
  }

  AttentionParams p;
  p.dtype = t;
  p.B = c.B;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.Lq = c.Lq;
  p.N = c.N;
  p.D = c.D;
  p.q = q.data();
  p.k = {{c.bits, c.G}, k.packed.data(), k.scales.data(), k.biases.data(), {}};
  p.v = {{c.bits, c.G}, v.packed.data(), v.scales.data(), v.biases.data(), {}};
  p.sinks = c.sinks ? sinks.data() : nullptr;
  p.bool_mask = c.bmask == 1 ? (const void*)bm8.data() : c.bmask == 2 ? (const void*)bm32.data() : nullptr;
  p.bool_mask_type = c.bmask == 2 ? BoolMaskType::u32 : BoolMaskType::u8;
  p.float_mask = c.fmask ? fm.data() : nullptr;
  p.window = c.window;

  AttnArgs a{};
  a.q = dcopy(q);
  a.k_packed = dcopy(k.packed);
  a.k_scales = dcopy(k.scales);
  a.k_biases = dcopy(k.biases);
  a.v_packed = dcopy(v.packed);
  a.v_scales = dcopy(v.scales);
  a.v_biases = dcopy(v.biases);
  a.sinks = c.sinks ? dcopy(sinks) : nullptr;
  a.bool_mask = c.bmask == 1 ? (const void*)dcopy(bm8) : c.bmask == 2 ? (const void*)dcopy(bm32) : nullptr;
  a.float_mask = c.fmask ? dcopy(fm) : nullptr;
  std::vector<uint16_t> out(size_t(rows_q * c.D), 0xffff);
  a.out = dcopy(out);
  a.B = c.B;
  a.Hq = c.Hq;
  a.Hkv = c.Hkv;
  a.Lq = c.Lq;
  a.N = c.N;
  a.D = c.D;
  a.window = c.window;
  a.scale = float(1.0 / std::sqrt(double(c.D)));
  a.k_bits = a.v_bits = c.bits;
  a.k_group = a.v_group = c.G;
  a.bool_mask_u32 = c.bmask == 2;
  a.dtype = int(t);
  plan(a, c.splits);
  const size_t np = size_t(a.num_splits) * size_t(rows_q);
  CK(cudaMalloc(&a.part_m, np * 4));
  CK(cudaMalloc(&a.part_l, np * 4));
  CK(cudaMalloc(&a.part_o, np * c.D * 4));
  if (!cuda::mma_supports(a)) {
    std::printf("  NOT SUPPORTED: %s\n", c.str().c_str());
    return 1e9;
  }
  LaunchFn fn = c.var.empty() ? cuda::mma_launch : variant(c.var);
  CK(fn(a, nullptr));
  combine_kernel<<<unsigned(rows_q), 128>>>(a, rows_q);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(out.data(), a.out, out.size() * 2, cudaMemcpyDeviceToHost));

  std::vector<double> ref(size_t(rows_q * c.D));
  detail::reference_attention_f64(p, ref.data());
  const double tol = t == DType::f16 ? 2e-3 : 1.6e-2, atol = 1e-6 * std::sqrt(double(c.D));
  double worst = 0, worst_rel = 0;
  for (int64_t r = 0; r < rows_q; ++r) {
    double e2 = 0, r2 = 0;
    for (int64_t d = 0; d < c.D; ++d) {
      const double o = detail::load_f32(out.data(), t, r * c.D + d), x = ref[size_t(r * c.D + d)];
      e2 += (o - x) * (o - x);
      r2 += x * x;
    }
    const double ratio = std::sqrt(e2) / (tol * std::sqrt(r2) + atol);
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? 1e9 : std::max(worst, ratio);
    if (r2 > 0) worst_rel = std::max(worst_rel, std::sqrt(e2 / r2));
  }
  std::printf("  %-6s ratio %.3f relerr %.2e  %s\n", worst <= 1 ? "ok" : "FAIL", worst, worst_rel, c.str().c_str());
  for (const void* ptr : {(const void*)a.q, (const void*)a.k_packed, a.k_scales, a.k_biases, (const void*)a.v_packed,
                          a.v_scales, a.v_biases, (const void*)a.sinks, a.bool_mask, a.float_mask, (const void*)a.out,
                          (const void*)a.part_m, (const void*)a.part_l, (const void*)a.part_o})
    if (ptr) CK(cudaFree(const_cast<void*>(ptr)));
  return worst;
}

int accuracy(bool quick) {
  std::vector<Cfg> cs;
  if (quick) {  // a few small cases (partial tiles, unaligned scale rows, masks) for the memory checker
    Cfg c;
    c.N = 333, c.B = 2, c.Hkv = 2, c.Hq = 8, c.Lq = 2, c.bmask = 1, c.fmask = true, c.sinks = true;
    cs.push_back(c);
    c.dtype = DType::bf16, c.bits = 8, c.D = 64, c.G = 32, c.window = 50;
    cs.push_back(c);
    c = Cfg{};
    c.D = 256, c.G = 32, c.N = 77, c.Lq = 3, c.splits = 2;
    cs.push_back(c);
    c.N = 0;
    cs.push_back(c);
    int fails = 0;
    for (const Cfg& q : cs) fails += run_case(q) > 1.0;
    std::printf("quick accuracy: %zu cases, %d failed\n", cs.size(), fails);
    return fails;
  }
  for (DType t : {DType::f16, DType::bf16})
    for (int bits : {4, 8})
      for (int64_t D : {64, 128, 256})
        for (int G : {32, 64, 128}) {
          if (D % G) continue;
          Cfg c;
          c.dtype = t;
          c.bits = bits;
          c.G = G;
          c.D = D;
          c.N = 1001;
          c.B = 2;
          c.seed = uint64_t(D * 7 + G + bits * 1000 + int(t) * 100000);
          cs.push_back(c);
        }
  auto add = [&](Cfg c) { cs.push_back(c); };
  for (DType t : {DType::f16, DType::bf16}) {
    Cfg c;
    c.dtype = t;
    c.Lq = 4;  // 16 rows: two n-tiles, causal
    add(c);
    c.bits = 8;
    add(c);
    c.Lq = 3;  // 12 rows
    c.bits = 4;
    c.sinks = true;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.Hq = 32, c.Hkv = 1;  // 32 rows: two row tiles
    add(c);
    c.D = 256;  // 8-row tiles
    c.Hq = 8, c.Hkv = 1, c.Lq = 2;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.bmask = 1, c.fmask = true, c.sinks = true, c.Lq = 2;
    add(c);
    c.bmask = 2, c.fmask = false, c.window = 100;
    add(c);
    c.bmask = 0, c.window = 7, c.N = 300, c.splits = 1;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.qscale = 8.f;  // large logits: a sharp softmax
    add(c);
    c.bits = 8;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.vscale = 1e-3f;
    add(c);
    c.vscale = 1e-5f;  // tiny values: scales near the bottom of f16
    add(c);
    c.vscale = 300.f;  // large values
    add(c);
    c.bits = 8;
    add(c);
    c.vscale = 1e-3f;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.N = 5, c.splits = 2;
    add(c);
    c.N = 3, c.Lq = 3;
    add(c);
    c = Cfg{};
    c.dtype = t;
    c.N = 4096, c.splits = 5, c.B = 2, c.Hq = 32, c.Hkv = 8;  // a decode shape
    add(c);
  }
  for (std::string var : {"mag_f16_4_128_1", "mag_f16_4_128_2", "mag_f16_8_128_1", "st2_f16_4_128_1",
                          "st4_f16_4_128_1"}) {
    Cfg c;
    c.var = var;
    c.bits = var.find("_8_") != std::string::npos ? 8 : 4;
    c.Lq = var.find("128_2") != std::string::npos ? 4 : 1;
    add(c);
    c.qscale = 8.f;
    add(c);
  }
  int fails = 0;
  for (const Cfg& c : cs) fails += run_case(c) > 1.0;
  std::printf("accuracy: %zu cases, %d failed\n", cs.size(), fails);
  return fails;
}

// ---- benchmark --------------------------------------------------------------------------------
__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u + seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = x;
  }
}
// T values uniform in [lo, hi)
__global__ void fill_t_kernel(uint16_t* p, size_t n, uint32_t seed, float lo, float hi, int dtype) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u + seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float v = lo + (hi - lo) * float(x >> 8) * (1.0f / 16777216.0f);
    p[i] = dtype == 1 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bw() {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int i = 0; i < 12; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) ts.push_back(ms);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (median(ts) * 1e-3);
}

struct BenchCfg {
  int dtype = 1, bits = 4, G = 64;
  int64_t B = 8, Hq = 32, Hkv = 8, Lq = 1, N = 32768, D = 128;
  int splits = 5;
  std::string var;
};

void bench(const BenchCfg& bc, double copy) {
  const int copies = 4;
  AttnArgs a{};
  a.B = bc.B, a.Hq = bc.Hq, a.Hkv = bc.Hkv, a.Lq = bc.Lq, a.N = bc.N, a.D = bc.D;
  a.scale = float(1.0 / std::sqrt(double(bc.D)));
  a.k_bits = a.v_bits = bc.bits;
  a.k_group = a.v_group = bc.G;
  a.dtype = bc.dtype;
  const size_t rows = size_t(bc.B * bc.Hkv * bc.N);
  const size_t words = rows * bc.D * bc.bits / 32, ngs = rows * (bc.D / bc.G);
  const size_t qn = size_t(bc.B * bc.Hq * bc.Lq * bc.D);
  std::vector<void*> bufs;
  auto alloc = [&](size_t bytes) {
    void* p;
    CK(cudaMalloc(&p, bytes));
    bufs.push_back(p);
    return p;
  };
  struct Set {
    uint32_t *kp, *vp;
    uint16_t *ks, *kz, *vs, *vz;
  };
  std::vector<Set> sets(copies);
  uint32_t seed = 1;
  for (auto& s : sets) {
    s.kp = static_cast<uint32_t*>(alloc(words * 4));
    s.vp = static_cast<uint32_t*>(alloc(words * 4));
    s.ks = static_cast<uint16_t*>(alloc(ngs * 2));
    s.kz = static_cast<uint16_t*>(alloc(ngs * 2));
    s.vs = static_cast<uint16_t*>(alloc(ngs * 2));
    s.vz = static_cast<uint16_t*>(alloc(ngs * 2));
    fill_kernel<<<1024, 256>>>(s.kp, words, seed++);
    fill_kernel<<<1024, 256>>>(s.vp, words, seed++);
    const float sc = bc.bits == 4 ? 0.3f : 0.02f;
    fill_t_kernel<<<1024, 256>>>(s.ks, ngs, seed++, 0.5f * sc, 1.5f * sc, bc.dtype);
    fill_t_kernel<<<1024, 256>>>(s.kz, ngs, seed++, -2.f, 2.f, bc.dtype);
    fill_t_kernel<<<1024, 256>>>(s.vs, ngs, seed++, 0.5f * sc, 1.5f * sc, bc.dtype);
    fill_t_kernel<<<1024, 256>>>(s.vz, ngs, seed++, -2.f, 2.f, bc.dtype);
  }
  uint16_t* q = static_cast<uint16_t*>(alloc(qn * 2));
  fill_t_kernel<<<256, 256>>>(q, qn, 99, -2.f, 2.f, bc.dtype);
  a.q = q;
  a.out = alloc(qn * 2);
  plan(a, bc.splits);
  const size_t np = size_t(a.num_splits) * size_t(bc.B * bc.Hq * bc.Lq);
  a.part_m = static_cast<float*>(alloc(np * 4));
  a.part_l = static_cast<float*>(alloc(np * 4));
  a.part_o = static_cast<float*>(alloc(np * bc.D * 4));
  CK(cudaDeviceSynchronize());
  LaunchFn fn = bc.var.empty() ? cuda::mma_launch : variant(bc.var);
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  std::vector<float> tk, tc;
  for (int i = 0; i < 90; ++i) {
    const Set& s = sets[size_t(i % copies)];
    a.k_packed = s.kp, a.v_packed = s.vp, a.k_scales = s.ks, a.k_biases = s.kz, a.v_scales = s.vs, a.v_biases = s.vz;
    CK(cudaEventRecord(e0));
    CK(fn(a, nullptr));
    CK(cudaEventRecord(e1));
    combine_kernel<<<unsigned(bc.B * bc.Hq * bc.Lq), 128>>>(a, bc.B * bc.Hq * bc.Lq);
    CK(cudaEventRecord(e2));
    CK(cudaEventSynchronize(e2));
    float ms1, ms2;
    CK(cudaEventElapsedTime(&ms1, e0, e1));
    CK(cudaEventElapsedTime(&ms2, e1, e2));
    if (i >= 10) {
      tk.push_back(ms1);
      tc.push_back(ms2);
    }
  }
  CK(cudaGetLastError());
  if (bc.var.empty())
    std::printf("  (%d blocks per SM, %lld row tiles)\n", cuda::mma_blocks_per_sm(a), (long long)cuda::mma_row_tiles(a));
  const double bytes = double(words) * 4 * 2 + double(ngs) * 2 * 4 + double(qn) * 2 * 2;
  const double us = median(tk) * 1e3, usc = median(tc) * 1e3;
  std::printf("  %s %db g%d B%lld Hq%lld Hkv%lld Lq%lld N%lld D%lld splits %d (blocks %lld) %s: kernel %.1f us, "
              "%.0f GB/s = %.1f%% of copy; combine(test) %.1f us; floor %.1f us\n",
              bc.dtype == 1 ? "f16" : "bf16", bc.bits, bc.G, (long long)bc.B, (long long)bc.Hq, (long long)bc.Hkv,
              (long long)bc.Lq, (long long)bc.N, (long long)bc.D, a.num_splits,
              (long long)(a.num_splits * bc.B * bc.Hkv), bc.var.c_str(), us, bytes / us * 1e-3,
              100.0 * bytes / (us * 1e-6) / copy, usc, bytes / copy * 1e6);
  for (void* p : bufs) CK(cudaFree(p));
}

int main(int argc, char** argv) {
  bool acc = argc < 2, ben = argc < 2, quick = false, one = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "acc")) acc = true;
    if (!std::strcmp(argv[i], "bench")) ben = true;
    if (!std::strcmp(argv[i], "quick")) acc = quick = true;
    if (!std::strcmp(argv[i], "one")) one = true;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  int fails = 0;
  if (one) {  // the headline shape alone (for a profiler)
    BenchCfg h;
    h.splits = 6;
    bench(h, 4.2e12);
    return 0;
  }
  if (acc) fails = accuracy(quick);
  if (ben) {
    const double copy = copy_bw();
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy * 1e-9);
    BenchCfg h;  // the headline
    for (int sp : {5, 6, 8, 12}) {
      BenchCfg b = h;
      b.splits = sp;
      bench(b, copy);
    }
    for (std::string v : {"st2_f16_4_128_1", "st4_f16_4_128_1", "mag_f16_4_128_1"}) {
      BenchCfg b = h;
      b.var = v;
      b.splits = 6;
      bench(b, copy);
    }
    BenchCfg b = h;
    b.splits = 6;
    b.G = 32;
    bench(b, copy);
    b.G = 128;
    bench(b, copy);
    b = h;
    b.bits = 8;
    for (int sp : {5, 6}) {
      b.splits = sp;
      bench(b, copy);
    }
    b.var = "mag_f16_8_128_1";
    bench(b, copy);
    b = h;
    b.Lq = 4;
    for (int sp : {5, 6}) {
      b.splits = sp;
      bench(b, copy);
    }
    b = h;
    b.dtype = 2;
    b.splits = 6;
    bench(b, copy);
    b.bits = 8;
    bench(b, copy);
    b = h;
    b.B = 1;  // one sequence: the splits carry the parallelism
    b.splits = 48;
    bench(b, copy);
    b = h;
    b.D = 64, b.Hq = 64, b.Hkv = 16;
    b.splits = 6;
    bench(b, copy);
    b = h;
    b.D = 256, b.Hq = 16, b.Hkv = 4;
    b.splits = 6;
    bench(b, copy);
  }
  return fails ? 1 : 0;
}
