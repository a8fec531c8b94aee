// qsdpa._ext: the C++ API exposed to Python through nanobind.
//
// Every function takes arrays through DLPack (NumPy, PyTorch, JAX, CuPy, MLX, ...) and writes
// into output arrays the caller allocated (python/qsdpa/__init__.py allocates them with the
// framework of the input). Nothing is copied here: arrays must already be contiguous (row-major)
// and live where the backend runs. The checks below are the binding's own (ranks, shapes that
// tie the arrays together, dtypes, devices, contiguity); everything the library itself checks
// (bits, group size, head dim, Hq % Hkv, Lq <= N, ...) is asked from the library first, so that
// its message is the one the caller sees. Errors become Python exceptions:
//   ValueError          bad shape or value (StatusCode::invalid_argument and the binding's checks)
//   TypeError           bad dtype
//   NotImplementedError a valid request the backend does not implement (StatusCode::unsupported)
//   RuntimeError        backend not built, no device, or a failure inside the backend
//
// Frameworks that cannot hand qsdpa a GPU output buffer (JAX) get theirs from cuda_empty: device
// memory from cudaMalloc, freed (cudaFree) when the last array that views it goes away, exported
// through DLPack; cuda_synchronize then waits for the call's stream before the framework reads it.
// Both exist where the CUDA backend is built (QSDPA_PY_CUDA) and raise RuntimeError elsewhere.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#if QSDPA_PY_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qsdpa/qsdpa.hpp"

namespace nb = nanobind;

namespace {

using InArray = nb::ndarray<nb::ro>;  // any dtype, shape, device; read-only access
using OutArray = nb::ndarray<>;       // any dtype, shape, device; writable

// cuda_empty's result: a nanobind.nb_ndarray (__dlpack__, __dlpack_device__), which can be
// exported any number of times (nb::ndarray<> would return a single-use DLPack capsule). The
// array_api framework exists from nanobind 2.2 on.
#if NB_VERSION_MAJOR > 2 || (NB_VERSION_MAJOR == 2 && NB_VERSION_MINOR >= 2)
#define QSDPA_PY_ARRAY_API 1
using DeviceArray = nb::ndarray<nb::array_api>;
#else
#define QSDPA_PY_ARRAY_API 0
using DeviceArray = nb::ndarray<>;
#endif

// DLPack device types the binding accepts (DLDeviceType).
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

[[noreturn]] void throw_value(const std::string& msg) { throw nb::value_error(msg.c_str()); }
[[noreturn]] void throw_type(const std::string& msg) { throw nb::type_error(msg.c_str()); }

// Raises the Python exception that matches a failed Status (the GIL must be held).
void raise_status(const qsdpa::Status& s) {
  if (s.ok()) return;
  PyObject* type = PyExc_RuntimeError;  // not_built, no_device, backend_error
  if (s.code == qsdpa::StatusCode::invalid_argument) type = PyExc_ValueError;
  if (s.code == qsdpa::StatusCode::unsupported) type = PyExc_NotImplementedError;
  PyErr_SetString(type, s.message.c_str());
  throw nb::python_error();
}

// Plain string building, no iostreams: the module may carry its own static C++ runtime (some
// toolchains link it so) next to the one of the interpreter's other extensions.
std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "(";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1) o += ",";
  return o + ")";
}

template <class A>
std::vector<int64_t> shape_of(const A& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
  return s;
}

std::string dtype_str(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (C(t.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: base = "code" + std::to_string(int(t.code)) + "_"; break;
  }
  std::string s = base + std::to_string(int(t.bits));
  if (t.lanes != 1) s += "x" + std::to_string(int(t.lanes));
  return s;
}

bool is(nb::dlpack::dtype t, nb::dlpack::dtype_code c, int bits) {
  return t.code == uint8_t(c) && t.bits == bits && t.lanes == 1;
}

const char* dtype_name(qsdpa::DType t) {
  switch (t) {
    case qsdpa::DType::f32: return "float32";
    case qsdpa::DType::f16: return "float16";
    case qsdpa::DType::bf16: return "bfloat16";
  }
  return "?";
}

// The element type T of a floating-point array. `u16_is_bf16`: NumPy has no bfloat16 that speaks
// DLPack, so the Python layer passes ml_dtypes' bfloat16 arrays as uint16 views and says so.
std::optional<qsdpa::DType> float_dtype(nb::dlpack::dtype t, bool u16_is_bf16) {
  using C = nb::dlpack::dtype_code;
  if (is(t, C::Float, 32)) return qsdpa::DType::f32;
  if (is(t, C::Float, 16)) return qsdpa::DType::f16;
  if (is(t, C::Bfloat, 16)) return qsdpa::DType::bf16;
  if (u16_is_bf16 && is(t, C::UInt, 16)) return qsdpa::DType::bf16;
  return std::nullopt;
}

qsdpa::DType require_float(const char* name, nb::dlpack::dtype t, bool u16_is_bf16) {
  if (auto d = float_dtype(t, u16_is_bf16)) return *d;
  throw_type(std::string(name) + " has dtype " + dtype_str(t) +
             "; expected float32, float16 or bfloat16");
}

void require_same_float(const char* name, nb::dlpack::dtype t, bool u16_is_bf16, qsdpa::DType want,
                        const char* ref) {
  auto d = float_dtype(t, u16_is_bf16);
  if (!d || *d != want)
    throw_type(std::string(name) + " has dtype " + (d ? dtype_name(*d) : dtype_str(t)) +
               "; expected " + dtype_name(want) + " (the dtype of " + ref + ")");
}

// Packed words: uint32, or int32 holding the same bits (frameworks with little uint32 support).
void require_packed(const char* name, nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  if (!is(t, C::UInt, 32) && !is(t, C::Int, 32))
    throw_type(std::string(name) + " has dtype " + dtype_str(t) + "; expected uint32 (or int32)");
}

// Row-major contiguity; dimensions of extent 1 may carry any stride.
template <class A>
bool c_contiguous(const A& a) {
  if (a.size() == 0) return true;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    const int64_t n = int64_t(a.shape(i));
    if (n != 1 && a.stride(i) != expect) return false;
    expect *= n;
  }
  return true;
}

// Where the arrays of one call live; every array must agree with the first one.
struct Place {
  int device_type = 0;
  int device_id = 0;
  const char* first = nullptr;

  bool on_gpu() const { return device_type == kDLCUDA || device_type == kDLCUDAManaged; }

  static std::string describe(int type, int id) {
    switch (type) {
      case kDLCPU: return "the CPU";
      case kDLCUDA: return "cuda:" + std::to_string(id);
      case kDLCUDAHost: return "CUDA pinned host memory";
      case kDLCUDAManaged: return "CUDA managed memory (device " + std::to_string(id) + ")";
      default: return "DLPack device type " + std::to_string(type);
    }
  }

  template <class A>
  void add(const char* name, const A& a) {
    const int t = a.device_type(), id = a.device_id();
    if (t != kDLCPU && t != kDLCUDA && t != kDLCUDAHost && t != kDLCUDAManaged)
      throw_value(std::string(name) + " is on " + describe(t, id) +
                  ", which qsdpa cannot read: use host (CPU) or CUDA memory");
    if (!first) {
      device_type = t;
      device_id = id;
      first = name;
      return;
    }
    // Host memory and pinned host memory are the same to the CPU backends.
    auto host = [](int x) { return x == kDLCPU || x == kDLCUDAHost; };
    const bool same = (host(t) && host(device_type)) || (t == device_type && id == device_id);
    if (!same)
      throw_value(std::string(name) + " is on " + describe(t, id) + " but " + first + " is on " +
                  describe(device_type, device_id) + ": all arrays must be on the same device");
  }
};

template <class A>
void check_array(const char* name, const A& a, Place& place) {
  place.add(name, a);
  if (!c_contiguous(a))
    throw_value(std::string(name) + " is not contiguous (row-major): pass a contiguous array, "
                "e.g. numpy.ascontiguousarray(x) or x.contiguous()");
  const size_t align = a.itemsize();
  if (a.size() > 0 && align > 1 && reinterpret_cast<uintptr_t>(a.data()) % align != 0)
    throw_value(std::string(name) + " is not aligned to its element size (" +
                std::to_string(align) + " bytes)");
}

template <class A>
void check_shape(const char* name, const A& a, const std::vector<int64_t>& want, const char* what) {
  if (shape_of(a) != want)
    throw_value(std::string(name) + " has shape " + shape_str(shape_of(a)) + "; expected " +
                shape_str(want) + " = " + what);
}

qsdpa::Backend parse_backend(const std::string& s) {
  if (s == "auto" || s == "automatic") return qsdpa::Backend::automatic;
  if (s == "reference") return qsdpa::Backend::reference;
  if (s == "cpu") return qsdpa::Backend::cpu;
  if (s == "cuda") return qsdpa::Backend::cuda;
  throw_value("backend ('" + s + "') is not one of 'auto', 'reference', 'cpu', 'cuda'");
}

qsdpa::Precision parse_precision(const std::string& s) {
  if (s == "exact") return qsdpa::Precision::exact;
  if (s == "fast") return qsdpa::Precision::fast;
  throw_value("precision ('" + s + "') is not one of 'exact', 'fast'");
}

// Matches the backend with where the data lives: the host backends cannot read GPU memory, the
// CUDA backend reads only GPU memory, and `auto` on GPU data must mean CUDA (a library without
// it then says so instead of reading device memory on the host).
qsdpa::Backend place_backend(qsdpa::Backend b, const Place& place) {
  if (place.on_gpu()) {
    if (b == qsdpa::Backend::reference || b == qsdpa::Backend::cpu)
      throw_value(std::string("backend (") + qsdpa::to_string(b) + ") reads host memory but " +
                  place.first + " is on " + Place::describe(place.device_type, place.device_id) +
                  ": use backend='cuda' or 'auto', or move the arrays to the CPU");
    return qsdpa::Backend::cuda;
  }
  if (b == qsdpa::Backend::cuda && qsdpa::backend_built(qsdpa::Backend::cuda))
    throw_value(std::string("backend (cuda) reads GPU memory but ") + place.first + " is on " +
                Place::describe(place.device_type, place.device_id) +
                ": move the arrays to the GPU, or use backend='cpu'");
  return b;
}

// Asks the library to check the arguments without touching any data: the call gets every size
// but null pointers, so it stops at the first null-pointer rule (`null_message`) unless an earlier
// rule (bits, group, head dim, ...) fails; that failure is raised with the library's message.
void precheck(const qsdpa::Status& s, const char* null_message) {
  if (!s.ok() && s.message != null_message) raise_status(s);
}

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

void* stream_ptr(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// ------------------------------------------------------------------------------------------------

std::string quantize(InArray w, OutArray packed, OutArray scales, OutArray biases, int group_size,
                     int bits, const std::string& backend, uintptr_t stream, bool u16_is_bf16) {
  const qsdpa::Backend asked = parse_backend(backend);
  if (w.ndim() < 1) throw_value("w must have at least 1 dimension [..., D]; got a scalar");
  const qsdpa::DType T = require_float("w", w.dtype(), u16_is_bf16);
  const std::vector<int64_t> ws = shape_of(w);
  const int64_t D = ws.back(), rows = product(ws, 0, ws.size() - 1);

  qsdpa::QuantizeParams p;
  p.dtype = T;
  p.format = {bits, group_size};
  p.rows = rows;
  p.dim = D;
  p.backend = asked;
  precheck(qsdpa::quantize(p), "w is null");

  Place place;
  check_array("w", w, place);
  check_array("packed", packed, place);
  check_array("scales", scales, place);
  check_array("biases", biases, place);
  require_packed("packed", packed.dtype());
  require_same_float("scales", scales.dtype(), u16_is_bf16, T, "w");
  require_same_float("biases", biases.dtype(), u16_is_bf16, T, "w");
  std::vector<int64_t> ps = ws, ss = ws;
  ps.back() = qsdpa::packed_words_per_row(p.format, D);
  ss.back() = qsdpa::groups_per_row(p.format, D);
  check_shape("packed", packed, ps, "[..., D * bits / 32]");
  check_shape("scales", scales, ss, "[..., D / group_size]");
  check_shape("biases", biases, ss, "[..., D / group_size]");

  p.backend = place_backend(asked, place);
  p.w = w.data();
  p.packed = static_cast<uint32_t*>(packed.data());
  p.scales = scales.data();
  p.biases = biases.data();
  p.stream = stream_ptr(stream);
  qsdpa::Status s;
  {
    nb::gil_scoped_release release;
    s = qsdpa::quantize(p);
  }
  raise_status(s);
  return qsdpa::to_string(s.backend);
}

std::string dequantize(InArray packed, InArray scales, InArray biases, OutArray w, int group_size,
                       int bits, const std::string& backend, uintptr_t stream, bool u16_is_bf16) {
  const qsdpa::Backend asked = parse_backend(backend);
  if (packed.ndim() < 1) throw_value("packed must have at least 1 dimension [..., D * bits / 32]");
  if (scales.ndim() < 1) throw_value("scales must have at least 1 dimension [..., D / group_size]");
  const qsdpa::DType T = require_float("scales", scales.dtype(), u16_is_bf16);
  const std::vector<int64_t> ps = shape_of(packed);
  const int64_t words = ps.back(), rows = product(ps, 0, ps.size() - 1);
  // D follows from the packed width; with unsupported bits the library reports the bits.
  const int64_t D = (bits > 0 && bits <= 32 && 32 % bits == 0) ? words * (32 / bits) : words;

  qsdpa::DequantizeParams p;
  p.dtype = T;
  p.format = {bits, group_size};
  p.rows = rows;
  p.dim = D;
  p.backend = asked;
  precheck(qsdpa::dequantize(p), "packed is null");

  Place place;
  check_array("packed", packed, place);
  check_array("scales", scales, place);
  check_array("biases", biases, place);
  check_array("w", w, place);
  require_packed("packed", packed.dtype());
  require_same_float("biases", biases.dtype(), u16_is_bf16, T, "scales");
  require_same_float("w", w.dtype(), u16_is_bf16, T, "scales");
  std::vector<int64_t> ss = ps, outs = ps;
  ss.back() = qsdpa::groups_per_row(p.format, D);
  outs.back() = D;
  check_shape("scales", scales, ss, "[..., D / group_size] with the leading dimensions of packed");
  check_shape("biases", biases, ss, "[..., D / group_size] with the leading dimensions of packed");
  check_shape("w", w, outs, "[..., D] with D = packed.shape[-1] * 32 / bits");

  p.backend = place_backend(asked, place);
  p.packed = static_cast<const uint32_t*>(packed.data());
  p.scales = scales.data();
  p.biases = biases.data();
  p.w = w.data();
  p.stream = stream_ptr(stream);
  qsdpa::Status s;
  {
    nb::gil_scoped_release release;
    s = qsdpa::dequantize(p);
  }
  raise_status(s);
  return qsdpa::to_string(s.backend);
}

std::string attention(InArray q, InArray k_packed, InArray k_scales, InArray k_biases,
                      InArray v_packed, InArray v_scales, InArray v_biases, OutArray out,
                      std::optional<InArray> sinks, std::optional<InArray> mask, int k_bits,
                      int k_group_size, int v_bits, int v_group_size, float scale, int64_t window,
                      const std::string& backend, const std::string& precision, int num_threads,
                      uintptr_t stream, bool u16_is_bf16, nb::object workspace_alloc, bool deterministic) {
  const qsdpa::Backend asked = parse_backend(backend);
  if (q.ndim() != 4)
    throw_value("q has shape " + shape_str(shape_of(q)) + "; expected 4 dimensions [B, Hq, Lq, D]");
  if (k_packed.ndim() != 4)
    throw_value("k_packed has shape " + shape_str(shape_of(k_packed)) +
                "; expected 4 dimensions [B, Hkv, N, D * k_bits / 32]");
  const qsdpa::DType T = require_float("q", q.dtype(), u16_is_bf16);

  qsdpa::AttentionParams p;
  p.dtype = T;
  p.B = int64_t(q.shape(0));
  p.Hq = int64_t(q.shape(1));
  p.Lq = int64_t(q.shape(2));
  p.D = int64_t(q.shape(3));
  p.Hkv = int64_t(k_packed.shape(1));
  p.N = int64_t(k_packed.shape(2));
  p.k.format = {k_bits, k_group_size};
  p.v.format = {v_bits, v_group_size};
  p.scale = scale;
  p.window = window;
  p.backend = asked;
  p.precision = parse_precision(precision);
  p.num_threads = num_threads;
  p.deterministic = deterministic;
  precheck(qsdpa::attention(p), "q is null");

  Place place;
  check_array("q", q, place);
  check_array("k_packed", k_packed, place);
  check_array("k_scales", k_scales, place);
  check_array("k_biases", k_biases, place);
  check_array("v_packed", v_packed, place);
  check_array("v_scales", v_scales, place);
  check_array("v_biases", v_biases, place);
  check_array("out", out, place);
  if (sinks) check_array("sinks", *sinks, place);
  if (mask) check_array("mask", *mask, place);

  require_packed("k_packed", k_packed.dtype());
  require_packed("v_packed", v_packed.dtype());
  require_same_float("k_scales", k_scales.dtype(), u16_is_bf16, T, "q");
  require_same_float("k_biases", k_biases.dtype(), u16_is_bf16, T, "q");
  require_same_float("v_scales", v_scales.dtype(), u16_is_bf16, T, "q");
  require_same_float("v_biases", v_biases.dtype(), u16_is_bf16, T, "q");
  require_same_float("out", out.dtype(), u16_is_bf16, T, "q");

  const int64_t B = p.B, Hkv = p.Hkv, N = p.N;
  check_shape("k_packed", k_packed, {B, Hkv, N, qsdpa::packed_words_per_row(p.k.format, p.D)},
              "[B, Hkv, N, D * k_bits / 32]");
  check_shape("k_scales", k_scales, {B, Hkv, N, qsdpa::groups_per_row(p.k.format, p.D)},
              "[B, Hkv, N, D / k_group_size]");
  check_shape("k_biases", k_biases, {B, Hkv, N, qsdpa::groups_per_row(p.k.format, p.D)},
              "[B, Hkv, N, D / k_group_size]");
  check_shape("v_packed", v_packed, {B, Hkv, N, qsdpa::packed_words_per_row(p.v.format, p.D)},
              "[B, Hkv, N, D * v_bits / 32]");
  check_shape("v_scales", v_scales, {B, Hkv, N, qsdpa::groups_per_row(p.v.format, p.D)},
              "[B, Hkv, N, D / v_group_size]");
  check_shape("v_biases", v_biases, {B, Hkv, N, qsdpa::groups_per_row(p.v.format, p.D)},
              "[B, Hkv, N, D / v_group_size]");
  check_shape("out", out, {B, p.Hq, p.Lq, p.D}, "[B, Hq, Lq, D]");

  if (sinks) {
    if (!is(sinks->dtype(), nb::dlpack::dtype_code::Float, 32))
      throw_type("sinks has dtype " + dtype_str(sinks->dtype()) + "; expected float32");
    check_shape("sinks", *sinks, {p.Hq}, "[Hq]");
    p.sinks = static_cast<const float*>(sinks->data());
  }
  if (mask) {
    check_shape("mask", *mask, {B, p.Hq, p.Lq, N}, "[B, Hq, Lq, N]");
    using C = nb::dlpack::dtype_code;
    const nb::dlpack::dtype mt = mask->dtype();
    // 0 hides a key whatever the signedness, so int8 / int32 masks are read as u8 / u32.
    if (is(mt, C::Bool, 8) || is(mt, C::UInt, 8) || is(mt, C::Int, 8)) {
      p.bool_mask = mask->data();
      p.bool_mask_type = qsdpa::BoolMaskType::u8;
    } else if (is(mt, C::UInt, 32) || is(mt, C::Int, 32)) {
      p.bool_mask = mask->data();
      p.bool_mask_type = qsdpa::BoolMaskType::u32;
    } else if (float_dtype(mt, u16_is_bf16)) {
      require_same_float("mask", mt, u16_is_bf16, T, "q");
      p.float_mask = mask->data();
    } else {
      throw_type("mask has dtype " + dtype_str(mt) +
                 "; expected bool, uint8 or uint32 (a boolean mask; int8 and int32 too) or a "
                 "float dtype (an additive mask, q's dtype)");
    }
  }

  p.backend = place_backend(asked, place);
  p.q = q.data();
  p.k.packed = static_cast<const uint32_t*>(k_packed.data());
  p.k.scales = k_scales.data();
  p.k.biases = k_biases.data();
  p.v.packed = static_cast<const uint32_t*>(v_packed.data());
  p.v.scales = v_scales.data();
  p.v.biases = v_biases.data();
  p.out = out.data();
  p.stream = stream_ptr(stream);

  // The CUDA workspace from the caller's allocator (PyTorch's caching allocator: stream-ordered
  // and safe under CUDA graph capture), kept alive through the call; without one the library
  // uses a buffer of its own.
  nb::object workspace;
  if (p.backend == qsdpa::Backend::cuda && !workspace_alloc.is_none()) {
    if (const size_t bytes = qsdpa::attention_workspace_size(p); bytes > 0) {
      workspace = workspace_alloc(bytes);
      OutArray w = nb::cast<OutArray>(workspace);
      check_array("workspace", w, place);
      if (w.nbytes() < bytes)
        throw_value("workspace has " + std::to_string(w.nbytes()) + " bytes; attention needs " +
                    std::to_string(bytes));
      p.workspace = w.data();
      p.workspace_bytes = w.nbytes();
    }
  }
  qsdpa::Status s;
  {
    nb::gil_scoped_release release;
    s = qsdpa::attention(p);
  }
  raise_status(s);
  return qsdpa::to_string(s.backend);
}

// ---- GPU buffers for frameworks without an allocator qsdpa can call (JAX) -----------------------

[[noreturn]] void throw_runtime(const std::string& msg) {
  PyErr_SetString(PyExc_RuntimeError, msg.c_str());
  throw nb::python_error();
}

// The DLPack dtype of a NumPy dtype name (the output dtypes the package allocates).
nb::dlpack::dtype parse_dtype(const std::string& s) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C c, int bits) {
    nb::dlpack::dtype t;
    t.code = uint8_t(c);
    t.bits = uint8_t(bits);
    t.lanes = 1;
    return t;
  };
  if (s == "float32") return make(C::Float, 32);
  if (s == "float16") return make(C::Float, 16);
  if (s == "bfloat16") return make(C::Bfloat, 16);
  if (s == "uint32") return make(C::UInt, 32);
  if (s == "int32") return make(C::Int, 32);
  if (s == "uint8") return make(C::UInt, 8);
  throw_type("dtype ('" + s + "') is not one of 'float32', 'float16', 'bfloat16', 'uint32', "
             "'int32', 'uint8'");
}

#if QSDPA_PY_CUDA
// Runs f() with `device` current (restoring the previous device) and returns the first error.
template <class F>
cudaError_t on_device(int device, F&& f) {
  int prev = 0;
  if (cudaError_t e = cudaGetDevice(&prev); e != cudaSuccess) return e;
  if (prev != device) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
  }
  const cudaError_t e = f();
  if (prev != device) cudaSetDevice(prev);
  return e;
}

[[noreturn]] void throw_cuda(cudaError_t e, const std::string& what, const char* hint = "") {
  cudaGetLastError();  // clears the error unless it is sticky (a broken context stays broken)
  throw_runtime(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")" + hint);
}

struct CudaBuffer {
  void* ptr;
  int device;
};

// The capsule's destructor: cudaFree waits for the work still using the memory.
[[maybe_unused]] void free_cuda_buffer(void* p) noexcept {
  std::unique_ptr<CudaBuffer> b(static_cast<CudaBuffer*>(p));
  on_device(b->device, [&] { return cudaFree(b->ptr); });
  cudaGetLastError();
}
#endif

// An uninitialized C-contiguous array of `shape` and `dtype` in the memory of CUDA device
// `device` (at least 1 byte, 256-byte aligned), owned by a capsule that frees it with cudaFree.
DeviceArray cuda_empty(const std::vector<int64_t>& shape, const std::string& dtype, int device) {
  const nb::dlpack::dtype t = parse_dtype(dtype);
  std::vector<size_t> dims;
  size_t bytes = t.bits / 8;
  for (int64_t n : shape) {
    if (n < 0) throw_value("cuda_empty: shape " + shape_str(shape) + " has a negative extent");
    if (n > 0 && bytes > SIZE_MAX / size_t(n))
      throw_value("cuda_empty: shape " + shape_str(shape) + " is too large");
    bytes *= size_t(n);
    dims.push_back(size_t(n));
  }
  if (device < 0) throw_value("cuda_empty: device (" + std::to_string(device) + ") is negative");
#if QSDPA_PY_CUDA && QSDPA_PY_ARRAY_API
  void* ptr = nullptr;
  cudaError_t e;
  {
    nb::gil_scoped_release release;
    e = on_device(device, [&] { return cudaMalloc(&ptr, std::max<size_t>(bytes, 1)); });
  }
  if (e != cudaSuccess)
    throw_cuda(e,
               "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" +
                   std::to_string(device),
               e == cudaErrorMemoryAllocation
                   ? " (JAX takes 75% of the GPU memory up front: "
                     "XLA_PYTHON_CLIENT_MEM_FRACTION or XLA_PYTHON_CLIENT_PREALLOCATE=false "
                     "leaves more to others)"
                   : "");
  nb::capsule owner;
  try {
    auto buf = std::make_unique<CudaBuffer>(CudaBuffer{ptr, device});
    owner = nb::capsule(buf.get(), free_cuda_buffer);  // the capsule frees it from now on
    buf.release();
  } catch (...) {
    cudaFree(ptr);
    throw;
  }
  return DeviceArray(ptr, dims.size(), dims.data(), owner, nullptr, t, nb::device::cuda::value,
                     device);
#elif QSDPA_PY_CUDA
  throw_runtime("qsdpa's extension was built with nanobind " NB_TOSTRING(NB_VERSION_MAJOR) "."
                NB_TOSTRING(NB_VERSION_MINOR) ", which cannot return GPU arrays for JAX: "
                "rebuild it with nanobind 2.2 or later");
#else
  throw_runtime("qsdpa was built without the CUDA backend, so it cannot allocate GPU memory: "
                "rebuild it where nvcc is found (pip install . with the CUDA toolkit; "
                "-DQSDPA_CUDA=ON), or pass host arrays");
#endif
}

// Waits until the work queued on `stream` (0: the legacy default stream) of `device` is done.
void cuda_synchronize(int device, uintptr_t stream) {
#if QSDPA_PY_CUDA
  cudaError_t e;
  {
    nb::gil_scoped_release release;
    const auto s = static_cast<cudaStream_t>(stream_ptr(stream));
    e = on_device(device, [&] { return cudaStreamSynchronize(s); });
  }
  if (e != cudaSuccess) throw_cuda(e, "cudaStreamSynchronize on cuda:" + std::to_string(device));
#else
  (void)device;
  (void)stream;
  throw_runtime("qsdpa was built without the CUDA backend: there is no CUDA stream to synchronize");
#endif
}

std::pair<bool, std::string> backend_available(const std::string& name) {
  std::string why;
  const bool ok = qsdpa::backend_available(parse_backend(name), &why);
  return {ok, why};
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "qsdpa's compiled core. Use the functions of the `qsdpa` package instead: they "
            "allocate the outputs with the framework of the inputs and pass them here.";
  m.attr("__version__") = QSDPA_VERSION;

  m.def("quantize", &quantize, nb::arg("w"), nb::arg("packed"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"), nb::arg("backend"),
        nb::arg("stream"), nb::arg("u16_is_bf16"),
        "Quantizes w [..., D] into packed [..., D*bits/32] (u32), scales and biases "
        "[..., D/group_size] (w's dtype), all preallocated. Returns the backend that ran.");
  m.def("dequantize", &dequantize, nb::arg("packed"), nb::arg("scales"), nb::arg("biases"),
        nb::arg("w"), nb::arg("group_size"), nb::arg("bits"), nb::arg("backend"),
        nb::arg("stream"), nb::arg("u16_is_bf16"),
        "Dequantizes packed [..., D*bits/32] with scales, biases [..., D/group_size] into the "
        "preallocated w [..., D]. Returns the backend that ran.");
  m.def("attention", &attention, nb::arg("q"), nb::arg("k_packed"), nb::arg("k_scales"),
        nb::arg("k_biases"), nb::arg("v_packed"), nb::arg("v_scales"), nb::arg("v_biases"),
        nb::arg("out"), nb::arg("sinks").none(), nb::arg("mask").none(), nb::arg("k_bits"),
        nb::arg("k_group_size"), nb::arg("v_bits"), nb::arg("v_group_size"), nb::arg("scale"),
        nb::arg("window"), nb::arg("backend"), nb::arg("precision"), nb::arg("num_threads"),
        nb::arg("stream"), nb::arg("u16_is_bf16"), nb::arg("workspace_alloc").none() = nb::none(),
        nb::arg("deterministic") = false,
        "Attention of q [B, Hq, Lq, D] over the quantized cache [B, Hkv, N, ...] into the "
        "preallocated out [B, Hq, Lq, D]. workspace_alloc(nbytes) -> array, when given, "
        "provides the CUDA backend's workspace; deterministic: the same output bits on every "
        "call (AttentionParams::deterministic). Returns the backend that ran.");
  m.def(
      "dtype_name",
      [](InArray a) { return dtype_str(a.dtype()); },
      nb::arg("a"), "The dtype of a DLPack array as a NumPy name ('float32', 'bfloat16', ...).");
  m.def("cuda_empty", &cuda_empty, nb::arg("shape"), nb::arg("dtype"), nb::arg("device"),
        "An uninitialized C-contiguous array (DLPack device type CUDA) of shape and dtype "
        "('float32', 'float16', 'bfloat16', 'uint32', 'int32', 'uint8') in the memory of CUDA "
        "device `device`, from cudaMalloc; cudaFree releases it when the last array that views "
        "it (through DLPack too) is gone. RuntimeError without the CUDA backend or on failure.");
  m.def("cuda_synchronize", &cuda_synchronize, nb::arg("device"), nb::arg("stream"),
        "Waits for the work queued on `stream` (a cudaStream_t as an integer; 0: the legacy "
        "default stream) of CUDA device `device`. RuntimeError without the CUDA backend or on "
        "failure.");
  m.def("build_info", &qsdpa::build_info, "The library's build configuration, one item a line.");
  m.def("device_info", &qsdpa::device_info, "The devices the library sees, one a line.");
  m.def(
      "backend_built", [](const std::string& name) { return qsdpa::backend_built(parse_backend(name)); },
      nb::arg("name"), "Whether the backend ('auto', 'reference', 'cpu', 'cuda') was compiled in.");
  m.def("backend_available", &backend_available, nb::arg("name"),
        "(available, why): whether the backend can run here, and a reason when it cannot.");
}
