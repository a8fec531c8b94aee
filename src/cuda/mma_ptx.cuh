// Thin wrappers over the PTX instructions the tensor-core attention kernel is built from
// (sm_80 and newer): warp-level mma.sync m16n8k16 with f32 accumulation, ldmatrix, movmatrix,
// cp.async with zero fill, lop3, and the element-type specifics (f16 / bf16) in one traits type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qsdpa::cuda::mmak {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Tuning knobs of the cache's copies (they are read once, in order): QSDPA_MMA_L2_PREFETCH, the
// bytes L2 fetches around each (128 or 256), and QSDPA_MMA_EVICT_FIRST, an L2 evict-first policy
// on them (0 none; 1 all, since run 96: the streamed cache leaves L2 to what is read again, the
// kernels' code, the partials and the query rows; 2, the default of the twenty-eighth and
// twenty-ninth sessions, all but the two kinds of tensor-core kernel it made slower,
// mma_kernel.cuh's evict_first_for: each kernel compiles to the code run 96 timed, with or without
// it; 3, the default since: 2 without D = 128 4-bit, after the H200's run 103, evict_first_for;
// 4, a tuning variant: 2 for the kernels of one n-tile, 3 for the others, evict_first_for).
// 1 measured on an H100 (run 96, the default sweep, 3 rounds against 0 in the same run): 9 of
// its 15 shapes faster by 0.8-4.4 us (D=512 8-bit
// -4.4, B=8 N=32768 4-bit -2.0, D=256 -1.0 / -1.8, B=1 N=131072 -0.8 / -1.4, B=32 N=4096
// -0.9 / -1.1, Lq=4 4-bit -1.5), B=8 8-bit -0.7, 2-bit +1.5 us and D=512 4-bit +0.7 slower, the
// other three within 0.2. Not yet timed on an H200.
#ifndef QSDPA_MMA_L2_PREFETCH
#define QSDPA_MMA_L2_PREFETCH 128
#endif
#ifndef QSDPA_MMA_EVICT_FIRST
#define QSDPA_MMA_EVICT_FIRST 3
#endif
#if QSDPA_MMA_L2_PREFETCH == 256
#define QSDPA_CP_PREFETCH ".L2::256B"
#elif QSDPA_MMA_L2_PREFETCH == 128
#define QSDPA_CP_PREFETCH ".L2::128B"
#else
#error "QSDPA_MMA_L2_PREFETCH: 128 or 256"
#endif

// 16-byte asynchronous copy; `bytes` (0..16) are read, the rest of the 16 is zero-filled. EF: with
// the L2 evict-first policy (the tensor-core kernels choose per instantiation: evict_first_for).
template <bool EF = (QSDPA_MMA_EVICT_FIRST != 0)>
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  if constexpr (EF) {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint" QSDPA_CP_PREFETCH " [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "l"(pol)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global" QSDPA_CP_PREFETCH " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
  }
}
// Thread-block clusters (sm_90): the block's rank in its cluster, the cluster's size, a barrier
// of all threads of the cluster (release / acquire: shared-memory writes before it are seen by
// the other blocks' reads after it), and a 32-bit load from another block's shared memory at the
// same offset as `addr` in this block's. Never called on older devices (the host only launches
// clusters on compute capability 9.0 and newer).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr, uint32_t rank) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(ra) : "memory");
#else
  (void)addr, (void)rank;
#endif
  return v;
}

__device__ __forceinline__ float2 ld_cluster_f32x2(uint32_t addr, uint32_t rank) {
  float2 v = make_float2(0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(ra) : "memory");
#else
  (void)addr, (void)rank;
#endif
  return v;
}

// Shared-memory barrier objects (mbarrier, sm_80 and later): a phase completes when `count`
// arrivals are in; an arrival releases the arriving thread's earlier shared-memory writes, a
// completed wait acquires them. Waits name the phase by its parity (phases 0, 1, 2, ...: 0, 1, 0, ...).
__device__ __forceinline__ void mbar_init(uint32_t addr, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t addr) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\nMBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n"
      "@!done bra MBAR_WAIT_%=;\n}\n" ::"r"(addr), "r"(parity) : "memory");
#else
  asm volatile(
      "{\n.reg .pred done;\nMBAR_WAIT_%=:\n"
      "mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
      "@!done bra MBAR_WAIT_%=;\n}\n" ::"r"(addr), "r"(parity) : "memory");
#endif
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l/8, row l%8. Lane (g = l/4,
// c = l%4) receives word c of row g of each matrix (plain), or the words (row 2c, col g) and
// (row 2c+1, col g) packed (trans).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Transposes an 8x8 b16 matrix held in the accumulator-row layout (lane (g, c) holds row g,
// columns 2c and 2c+1) into the same layout of its transpose.
__device__ __forceinline__ uint32_t movm_t(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// (a & b) | c in one instruction (written out: the compiler splits two immediates in two).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Element-type specifics. Values travel as packed uint32_t pairs (low half first).
template <class T>
struct Ty;

template <>
struct Ty<__half> {
  static constexpr bool kBf16 = false;
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static __forceinline__ float to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
  __device__ static __forceinline__ uint16_t from_f32(float f) { return __half_as_ushort(__float2half_rn(f)); }
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  // a * b + c on pairs, one rounding
  __device__ static __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  __device__ static __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  // a * b on pairs, rounded (hi), and the exact rest a * b - hi rounded once (lo): hi + lo holds
  // the product to about 22 bits (mma_kernel.cuh, kVFold).
  __device__ static __forceinline__ void mul2_split(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    const __half2 ha = u2h(a), hb = u2h(b);
    const __half2 h = __hmul2(ha, hb);
    const __half2 l = __hfma2(ha, hb, __hneg2(h));
    hi = h2u(h);
    lo = h2u(l);
  }
  // mul2_split's hi (lo = false) or lo (lo = true), a lane's choice (mma_kernel.cuh, kVPack)
  __device__ static __forceinline__ uint32_t mul2_part(uint32_t a, uint32_t b, bool lo) {
    uint32_t hi, rest;
    mul2_split(a, b, hi, rest);
    return lo ? rest : hi;
  }
  __device__ static __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) { return h2u(__hmul2(u2h(a), u2h(b))); }
  __device__ static __forceinline__ __half2 u2h(uint32_t x) { return *reinterpret_cast<const __half2*>(&x); }
  __device__ static __forceinline__ uint32_t h2u(__half2 x) { return *reinterpret_cast<const uint32_t*>(&x); }
};

template <>
struct Ty<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static __forceinline__ float to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
  __device__ static __forceinline__ uint16_t from_f32(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ static __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  // a + b as a * 1 + b (add.bf16x2 needs sm_90; this form runs on sm_80 too, exact the same)
  __device__ static __forceinline__ uint32_t add2(uint32_t a, uint32_t b) {
    return fma2(a, 0x3F803F80u, b);
  }
};

}  // namespace qsdpa::cuda::mmak
