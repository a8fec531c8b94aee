// Public entry points: check the arguments, resolve the backend, dispatch. No backend is ever
// chosen silently in place of the one asked for; Backend::automatic says which one it picked.
#include <cmath>
#include <string>
#include <thread>

#include "backends.hpp"

namespace qsdpa {

using detail::make_status;

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(StatusCode c) {
  switch (c) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid argument";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::not_built: return "not built";
    case StatusCode::no_device: return "no device";
    case StatusCode::backend_error: return "backend error";
  }
  return "?";
}

size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

bool backend_built(Backend b) {
  switch (b) {
    case Backend::automatic:
    case Backend::reference:
    case Backend::cpu: return true;
    case Backend::cuda: return detail::cuda_built();
  }
  return false;
}

bool backend_available(Backend b, std::string* why) {
  if (b == Backend::cuda) return detail::cuda_available(why);
  return backend_built(b);
}

namespace {

// Resolves Backend::automatic from where the data lives; checks that an explicit choice can run.
Status resolve(Backend asked, const void* data, Backend* out) {
  if (asked == Backend::automatic) {
    *out = (detail::cuda_available(nullptr) && detail::cuda_is_device_pointer(data)) ? Backend::cuda
                                                                                     : Backend::cpu;
    return Status{};
  }
  if (asked == Backend::cuda) {
    if (!detail::cuda_built())
      return make_status(StatusCode::not_built,
                         "backend (cuda) is not built into this library: configure with -DQSDPA_CUDA=ON",
                         asked);
    std::string why;
    if (!detail::cuda_available(&why))
      return make_status(StatusCode::no_device, "backend (cuda) has no device: " + why, asked);
  } else if (asked != Backend::reference && asked != Backend::cpu) {
    return make_status(StatusCode::invalid_argument,
                       "backend (" + std::to_string(int(asked)) + ") is not a known backend", asked);
  }
  *out = asked;
  return Status{};
}

Status tag(Status s, Backend b) {
  s.backend = b;
  return s;
}

}  // namespace

Status quantize(const QuantizeParams& p) {
  if (Status s = detail::check_quantize(p); !s) return tag(s, p.backend);
  Backend b;
  if (Status s = resolve(p.backend, p.w, &b); !s) return s;
  if (p.rows == 0) return tag(Status{}, b);
  switch (b) {
    case Backend::cuda: return tag(detail::cuda_quantize(p), b);
    case Backend::cpu: return tag(detail::cpu_quantize(p), b);
    default: return tag(detail::host_quantize(p), b);
  }
}

Status dequantize(const DequantizeParams& p) {
  if (Status s = detail::check_dequantize(p); !s) return tag(s, p.backend);
  Backend b;
  if (Status s = resolve(p.backend, p.packed, &b); !s) return s;
  if (p.rows == 0) return tag(Status{}, b);
  switch (b) {
    case Backend::cuda: return tag(detail::cuda_dequantize(p), b);
    case Backend::cpu: return tag(detail::cpu_dequantize(p), b);
    default: return tag(detail::host_dequantize(p), b);
  }
}

Status attention(const AttentionParams& p) {
  if (Status s = detail::check_attention(p); !s) return tag(s, p.backend);
  Backend b;
  if (Status s = resolve(p.backend, p.q, &b); !s) return s;
  if (b != Backend::cuda)
    if (Status s = detail::check_lengths_host(p); !s) return tag(s, b);
  switch (b) {
    case Backend::cuda: return tag(detail::cuda_attention(p), b);
    case Backend::cpu: return tag(detail::cpu_attention(p), b);
    default: return tag(detail::reference_attention(p), b);
  }
}

Status append(const AppendParams& p) {
  if (Status s = detail::check_append(p); !s) return tag(s, p.backend);
  Backend b;
  if (Status s = resolve(p.backend, p.k, &b); !s) return s;
  if (b != Backend::cuda)
    if (Status s = detail::check_append_host(p); !s) return tag(s, b);
  if (p.L == 0) return tag(Status{}, b);
  switch (b) {
    case Backend::cuda: return tag(detail::cuda_append(p), b);
    default: return tag(detail::host_append(p), b);
  }
}

size_t attention_workspace_size(const AttentionParams& p) {
  if (!detail::check_attention(p)) return 0;
  Backend b;
  if (!resolve(p.backend, p.q, &b) || b != Backend::cuda) return 0;
  return detail::cuda_attention_workspace_size(p);
}

std::string build_info() {
  std::string s = "qsdpa " QSDPA_VERSION "\n";
  s += "compiler: " __VERSION__ "\n";
  s += "backends: reference, cpu";
  if (detail::cuda_built()) s += ", cuda";
  s += "\n";
#ifdef QSDPA_CUDA_ARCHS
  s += "cuda architectures: " QSDPA_CUDA_ARCHS "\n";
#endif
  s += "cpu threads: " + std::to_string(std::thread::hardware_concurrency()) + "\n";
  return s;
}

std::string device_info() {
  std::string s = "cpu: " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads\n";
  if (detail::cuda_built()) {
    std::string why;
    if (detail::cuda_available(&why))
      s += detail::cuda_device_info();
    else
      s += "cuda: no device (" + why + ")\n";
  } else {
    s += "cuda: not built\n";
  }
  return s;
}

}  // namespace qsdpa
