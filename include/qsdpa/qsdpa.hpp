// qsdpa — attention computed straight from an affine-quantized (MLX layout) KV cache.
//
// One plain params struct per operation, one entry point per operation, each returning a Status.
// Shapes are documented on each field; all tensors are row-major and contiguous unless a stride
// field says otherwise. Pointers live where the chosen backend runs: host memory for
// Backend::reference and Backend::cpu, device memory for Backend::cuda. Backend::automatic picks
// CUDA when the library was built with it, a device is present and `q` (or `w`) is device memory,
// and the CPU backend otherwise; Status::backend says which one ran.
//
// How the serving features fit without a redesign (they are added as fields with defaults that
// mean "contiguous, one length for the whole batch", so existing callers keep working):
//   - capacity and strides: KVCache gains `token_stride`, `head_stride`, `batch_stride` (in rows;
//     0 = derived from N), q/out/mask gain element strides, a mask stride of 0 broadcasts;
//   - per-sequence lengths: AttentionParams gains `kv_lens` / `q_lens` (int32 per sequence,
//     nullptr = N / Lq for all), with N and Lq then the maxima;
//   - paged caches: KVCache gains `block_table` ([B, max_pages] int32) and `page_size`; the
//     packed/scales/biases pointers then address the page pool;
//   - different K and V formats: already here — K and V each carry their own QuantFormat;
//   - quantize-on-append: a separate AppendParams / append() that writes rows at each sequence's
//     end using the same quantizer as quantize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qsdpa {

// Element type of queries, scales, biases, the float mask and the output.
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

enum class Backend : int {
  automatic = 0,  // CUDA when built, present and the data is on the device; else CPU
  reference = 1,  // double precision, plain loops: the oracle
  cpu = 2,        // multithreaded CPU backend
  cuda = 3,       // NVIDIA GPUs
};

// Precision::exact holds the accuracy bounds of the SPEC (section 4). No backend offers
// Precision::fast yet; asking for it is an error, never a silent change of accuracy.
enum class Precision : int { exact = 0, fast = 1 };

enum class BoolMaskType : int { u8 = 0, u32 = 1 };

enum class StatusCode : int {
  ok = 0,
  invalid_argument,  // a shape, pointer or value breaks a rule; the message names it
  unsupported,       // a valid request that this backend does not implement
  not_built,         // the backend was not compiled into this library
  no_device,         // the backend is built but no device is present
  backend_error,     // a runtime failure inside the backend (e.g. a CUDA error)
};

struct Status {
  StatusCode code = StatusCode::ok;
  std::string message;            // empty when ok; otherwise names the argument and the rule
  Backend backend = Backend::automatic;  // the backend that ran (or was asked for)

  bool ok() const { return code == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
};

// The affine quantization format: `bits` in {2, 4, 8}, `group` in {32, 64, 128}.
struct QuantFormat {
  int bits = 4;
  int group = 64;
};

// ---------------------------------------------------------------------------------------------
// quantize / dequantize: rows of `dim` values, bit-identical to MLX's mx.quantize.
// ---------------------------------------------------------------------------------------------
struct QuantizeParams {
  DType dtype = DType::f16;  // type of `w`, `scales`, `biases`
  QuantFormat format;
  int64_t rows = 0;  // number of rows (e.g. B * Hkv * N)
  int64_t dim = 0;   // values per row (head dim D); a multiple of format.group

  const void* w = nullptr;   // [rows, dim] dtype
  uint32_t* packed = nullptr;  // [rows, dim / (32 / bits)] u32
  void* scales = nullptr;      // [rows, dim / group] dtype
  void* biases = nullptr;      // [rows, dim / group] dtype

  Backend backend = Backend::automatic;
  void* stream = nullptr;  // cudaStream_t for Backend::cuda (nullptr = default stream)
};
Status quantize(const QuantizeParams& p);

struct DequantizeParams {
  DType dtype = DType::f16;  // type of `scales`, `biases`, `w`
  QuantFormat format;
  int64_t rows = 0;
  int64_t dim = 0;

  const uint32_t* packed = nullptr;  // [rows, dim / (32 / bits)] u32
  const void* scales = nullptr;      // [rows, dim / group] dtype
  const void* biases = nullptr;      // [rows, dim / group] dtype
  void* w = nullptr;                 // [rows, dim] dtype (output)

  Backend backend = Backend::automatic;
  void* stream = nullptr;
};
Status dequantize(const DequantizeParams& p);

// ---------------------------------------------------------------------------------------------
// attention
// ---------------------------------------------------------------------------------------------

// One quantized cache (K or V) of shape [B, Hkv, N, D], in the MLX affine layout.
struct KVCache {
  QuantFormat format;
  const uint32_t* packed = nullptr;  // [B, Hkv, N, D / (32 / bits)] u32
  const void* scales = nullptr;      // [B, Hkv, N, D / group] AttentionParams::dtype
  const void* biases = nullptr;      // [B, Hkv, N, D / group] AttentionParams::dtype
};

struct AttentionParams {
  DType dtype = DType::f16;  // T: type of q, scales, biases, float_mask, out

  int64_t B = 1;    // sequences
  int64_t Hq = 1;   // query heads
  int64_t Hkv = 1;  // key/value heads; Hq % Hkv == 0, query head h reads KV head h / (Hq / Hkv)
  int64_t Lq = 1;   // query rows per sequence; row i sits at position N - Lq + i (causal)
  int64_t N = 0;    // tokens in the KV cache of each sequence
  int64_t D = 128;  // head dim: a multiple of 32, at most 512, divisible by each group size

  const void* q = nullptr;  // [B, Hq, Lq, D] T
  KVCache k;                // keys
  KVCache v;                // values
  void* out = nullptr;      // [B, Hq, Lq, D] T; every element is written on success

  const float* sinks = nullptr;  // optional [Hq] f32: one extra logit per head with a zero value

  const void* bool_mask = nullptr;  // optional [B, Hq, Lq, N]; 0 = hidden
  BoolMaskType bool_mask_type = BoolMaskType::u8;
  const void* float_mask = nullptr;  // optional [B, Hq, Lq, N] T, added to the logit; -inf hides

  float scale = 0.0f;  // logit scale; 0 means 1/sqrt(D)
  int64_t window = 0;  // sliding window: key t visible when t > p - window; 0 = no window

  Backend backend = Backend::automatic;
  Precision precision = Precision::exact;

  // CPU: number of threads (0 = all hardware threads).
  int num_threads = 0;

  // CUDA: the stream to launch on (cudaStream_t; nullptr = the default stream), and an optional
  // device workspace for split-K partial results. With workspace == nullptr the backend uses a
  // buffer it keeps per device and grows when needed (the growth is the only allocation; it never
  // happens during CUDA graph capture — capture with a workspace of attention_workspace_size()).
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
Status attention(const AttentionParams& p);

// Bytes of device workspace that attention(p) may use on the CUDA backend (0 for the others).
size_t attention_workspace_size(const AttentionParams& p);

// ---------------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------------
const char* to_string(DType t);
const char* to_string(Backend b);
const char* to_string(StatusCode c);
size_t dtype_size(DType t);

// Whether a backend was compiled in, and whether it can run here (for CUDA: a device is
// present). `why` (optional) receives a reason when it cannot.
bool backend_built(Backend b);
bool backend_available(Backend b, std::string* why = nullptr);

// Build configuration and devices, one line each (what `qsdpa info` prints).
std::string build_info();
std::string device_info();

// Bytes of one row of the packed cache and of its scales (or biases) for a format and head dim.
inline int64_t packed_words_per_row(const QuantFormat& f, int64_t dim) { return dim * f.bits / 32; }
inline int64_t groups_per_row(const QuantFormat& f, int64_t dim) { return dim / f.group; }

}  // namespace qsdpa
