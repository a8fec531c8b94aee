// GPU test machinery: a test::Problem copied to the device, run on Backend::cuda, copied back and
// checked against the double-precision reference on the host. Every GPU test starts with
// QSDPA_REQUIRE_CUDA(), which skips (with the reason) where no device is present.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../../src/cuda/testing.hpp"
#include "common/testutil.hpp"

#define QSDPA_REQUIRE_CUDA()                                        \
  do {                                                              \
    std::string why_;                                               \
    if (!qsdpa::backend_available(qsdpa::Backend::cuda, &why_))     \
      GTEST_SKIP() << "no CUDA device: " << why_;                   \
  } while (0)

#define CUDA_ASSERT(expr)                                                        \
  do {                                                                           \
    const cudaError_t e_ = (expr);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);      \
  } while (0)

// Device 0's compute capability (false, and 0.0, without a device).
inline bool device0_capability(int& major, int& minor) {
  major = minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    cudaGetLastError();
    major = minor = 0;
    return false;
  }
  return true;
}

// Whether device 0 has compute capability 9.0 and the build has the sm_90a instantiations (the
// tensor-core kernel takes D = 512 there alone).
inline bool device_takes_sm90a_kernels() {
  int major = 0, minor = 0;
  return device0_capability(major, minor) && major == 9 && minor == 0 && qsdpa::cuda::fixed_group_build();
}

// Whether device 0 has compute capability 9.0 or newer (programmatic dependent launches).
inline bool sm90_or_newer() {
  int major = 0, minor = 0;
  return device0_capability(major, minor) && major >= 9;
}

namespace qsdpa::test {

// A device allocation (nullptr for 0 bytes), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes && cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      throw std::runtime_error("cudaMalloc failed");
    }
  }
  // The upload has landed when this returns: a copy from pageable memory may return before its
  // DMA ends, and a stream created cudaStreamNonBlocking does not wait for the legacy stream it
  // went through (run 106 caught a test racing that way).
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (bytes_ && (cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess ||
                   cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess))
      throw std::runtime_error("cudaMemcpy to the device failed");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A host problem's buffers on the device.
struct DeviceProblem {
  Problem& host;
  DeviceBuffer q, kp, ks, kb, vp, vs, vb, sinks, bool_mask, float_mask, out;

  explicit DeviceProblem(Problem& h)
      : host(h),
        q(h.q),
        kp(h.k.packed),
        ks(h.k.scales),
        kb(h.k.biases),
        vp(h.v.packed),
        vs(h.v.scales),
        vb(h.v.biases),
        sinks(h.sinks),
        bool_mask(h.bool_mask),
        float_mask(h.float_mask),
        out(h.out.size()) {
    poison();
  }

  // Every byte 0xff: NaN in every T, so an element left unwritten fails the check. Like the
  // uploads (DeviceBuffer), it has landed when this returns, so that a call on a non-blocking
  // stream cannot start before it.
  void poison() {
    if (cudaMemset(out.get(), 0xff, out.bytes()) != cudaSuccess ||
        cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess)
      throw std::runtime_error("cudaMemset failed");
  }

  AttentionParams params() {
    AttentionParams p = host.params(Backend::cuda);
    p.q = q.get();
    p.out = out.get();
    p.k.packed = kp.as<uint32_t>();
    p.k.scales = ks.get();
    p.k.biases = kb.get();
    p.v.packed = vp.as<uint32_t>();
    p.v.scales = vs.get();
    p.v.biases = vb.get();
    p.sinks = host.c.sinks ? sinks.as<float>() : nullptr;
    p.bool_mask = bool_mask.get();
    p.float_mask = float_mask.get();
    return p;
  }

  // Copies the device output into host.out; returns the CUDA error string, or "".
  std::string fetch() {
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
      return std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(e);
    if (cudaError_t e = cudaMemcpy(host.out.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost); e != cudaSuccess)
      return std::string("cudaMemcpy: ") + cudaGetErrorString(e);
    return "";
  }

  // The reference check of the fetched output.
  std::string check() { return check_against_reference(host.params(Backend::reference), host.out.data()); }
};

// The SPEC section 4 check of check_against_reference(), with the reference computed once for
// several outputs of the same problem.
class ReferenceCheck {
 public:
  explicit ReferenceCheck(const AttentionParams& p) : p_(p), ref_(size_t(p.B * p.Hq * p.Lq * p.D)) {
    detail::reference_attention_f64(p, ref_.data());
  }
  std::string operator()(const void* out) const {
    const int64_t rows = p_.B * p_.Hq * p_.Lq;
    const double tol = rel_tol(p_.dtype), atol = 1e-6 * std::sqrt(double(p_.D));
    for (int64_t r = 0; r < rows; ++r) {
      double err2 = 0, ref2 = 0;
      for (int64_t d = 0; d < p_.D; ++d) {
        const double o = detail::load_f32(out, p_.dtype, r * p_.D + d), x = ref_[size_t(r * p_.D + d)];
        err2 += (o - x) * (o - x);
        ref2 += x * x;
      }
      const double err = std::sqrt(err2), rn = std::sqrt(ref2);
      if (!(err <= tol * rn + atol)) {  // also catches NaN
        std::ostringstream o;
        o << "row " << r << " (b=" << r / (p_.Hq * p_.Lq) << " h=" << (r / p_.Lq) % p_.Hq << " i=" << r % p_.Lq
          << "): ||out-ref|| = " << err << " > " << tol << " * " << rn << " + " << atol;
        return o.str();
      }
    }
    return "";
  }

 private:
  AttentionParams p_;
  std::vector<double> ref_;
};

// Runs a problem on the GPU through attention() (whichever kernel the dispatch picks) and through
// the generic kernel alone, and checks both; returns "" or what went wrong. scale: the softmax
// scale of both and of the reference (0: 1 / sqrt(D)).
inline std::string run_cuda_problem(Problem& h, float scale = 0.0f, const AttentionParams* overrides = nullptr) {
  DeviceProblem d(h);
  AttentionParams hp = h.params(Backend::reference);
  hp.scale = scale;
  const ReferenceCheck check(hp);
  AttentionParams p = d.params();
  p.scale = scale;
  if (overrides) {
    p.stream = overrides->stream;
    p.workspace = overrides->workspace;
    p.workspace_bytes = overrides->workspace_bytes;
    p.workspace_zeroed = overrides->workspace_zeroed;
  }
  const Status s = attention(p);
  if (!s) return "attention failed: " + s.message;
  if (s.backend != Backend::cuda) return std::string("ran on ") + to_string(s.backend);
  if (std::string e = d.fetch(); !e.empty()) return e;
  if (std::string e = check(h.out.data()); !e.empty()) return "attention(): " + e;

  d.poison();
  p.workspace = nullptr, p.workspace_bytes = 0;
  const Status g = cuda::attention_generic_kernel(p);
  if (!g) return "generic kernel failed: " + g.message;
  if (std::string e = d.fetch(); !e.empty()) return e;
  if (std::string e = check(h.out.data()); !e.empty()) return "generic kernel: " + e;
  return "";
}

// run_cuda_problem() on the random problem of a case.
inline std::string run_cuda_case(const Case& c, const AttentionParams* overrides = nullptr) {
  Problem h(c);
  return run_cuda_problem(h, 0.0f, overrides);
}

}  // namespace qsdpa::test
