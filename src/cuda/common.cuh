// Device helpers shared by the CUDA kernels of this folder: element-type loads and stores with a
// runtime type (T is never a template parameter outside the innermost loops), unpacking of the
// MLX layout, asynchronous copies into shared memory, and warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qsdpa::cuda {

// The launch attribute that makes a kernel a programmatic dependent of the stream's previous work
// (AttnArgs::pdl): the kernels wait in griddepcontrol.wait before they touch memory.
inline cudaLaunchAttribute programmatic_launch_attribute() {
  cudaLaunchAttribute at{};
  at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at.val.programmaticStreamSerializationAllowed = 1;
  return at;
}

// DType values as ints (qsdpa::DType: f32 = 0, f16 = 1, bf16 = 2).
constexpr int kF32 = 0;
constexpr int kF16 = 1;
constexpr int kBF16 = 2;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int dtype_bytes(int dtype) { return dtype == kF32 ? 4 : 2; }

// Element i of a T-typed buffer (global or shared memory) widened to f32.
__device__ __forceinline__ float load_t(const void* p, int dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(p)[i];
  const unsigned short h = static_cast<const unsigned short*>(p)[i];
  if (dtype == kF16) return __half2float(__ushort_as_half(h));
  return __uint_as_float(uint32_t(h) << 16);
}

// The warp's largest mx and, among the lanes that hold it, the smallest arg (the same in every
// lane after the call; a NaN is never the max).
__device__ __forceinline__ void warp_max_arg(float& mx, int& arg) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, mx, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (om > mx || (om == mx && oa < arg)) mx = om, arg = oa;
  }
}

// f32 rounded to T (round to nearest even, as the host conversions in core/half.hpp).
__device__ __forceinline__ void store_t(void* p, int dtype, int64_t i, float v) {
  if (dtype == kF32) {
    static_cast<float*>(p)[i] = v;
  } else if (dtype == kF16) {
    static_cast<unsigned short*>(p)[i] = __half_as_ushort(__float2half_rn(v));
  } else {
    static_cast<unsigned short*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// Four consecutive outputs from element i: one 16-byte store where T is f32 and the address is
// 16-byte aligned, else four store_t.
__device__ __forceinline__ void store4_t(void* p, int dtype, int64_t i, float4 v) {
  if (dtype == kF32 && (reinterpret_cast<uintptr_t>(static_cast<float*>(p) + i) & 15) == 0) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = v;
  } else {
    store_t(p, dtype, i, v.x);
    store_t(p, dtype, i + 1, v.y);
    store_t(p, dtype, i + 2, v.z);
    store_t(p, dtype, i + 3, v.w);
  }
}

// Value e of a packed word (low bits first) as an exact f32. The integer is placed in the
// mantissa of 2^23 and 2^23 is subtracted: two full-rate ALU operations instead of a conversion,
// which runs at a quarter of the rate on recent GPUs.
template <int BITS>
__device__ __forceinline__ float unpack_f32(uint32_t word, int e) {
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  uint32_t v;
  if constexpr (BITS == 8) {
    v = __byte_perm(word, 0x4B000000u, 0x7650u + uint32_t(e));  // byte e under exponent 2^23
  } else {
    v = ((word >> (e * BITS)) & kMask) | 0x4B000000u;
  }
  return __uint_as_float(v) - 8388608.0f;
}

// ---- asynchronous copies global -> shared (sm_80 and newer) -----------------------------------
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  } else if constexpr (BYTES == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
  } else {
    static_assert(BYTES == 4, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Copies `nbytes` contiguous bytes from global memory to 16-byte-aligned shared memory with all
// `nthreads` threads of the block, in the widest unit that the source address and the size allow
// (16, 8 or 4 bytes asynchronously; 2-byte plain copies for f16/bf16 data at odd offsets, which
// are complete once the block synchronizes).
__device__ __forceinline__ void copy_block_async(void* dst, const void* src, int nbytes, int tid,
                                                 int nthreads) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src) | uintptr_t(nbytes);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if ((a & 15) == 0) {
    for (int i = tid * 16; i < nbytes; i += nthreads * 16) cp_async<16>(d + i, s + i);
  } else if ((a & 7) == 0) {
    for (int i = tid * 8; i < nbytes; i += nthreads * 8) cp_async<8>(d + i, s + i);
  } else if ((a & 3) == 0) {
    for (int i = tid * 4; i < nbytes; i += nthreads * 4) cp_async<4>(d + i, s + i);
  } else {
    for (int i = tid * 2; i < nbytes; i += nthreads * 2)
      *reinterpret_cast<unsigned short*>(d + i) = *reinterpret_cast<const unsigned short*>(s + i);
  }
}

// ---- warp reductions (all lanes receive the result) -------------------------------------------
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// %globaltimer in ns (the trace builds' stamps: mma_kernel.cuh, combine.cu).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace qsdpa::cuda
