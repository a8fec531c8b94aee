// qsdpa — attention computed straight from an affine-quantized (MLX layout) KV cache.
//
// One plain params struct per operation, one entry point per operation, each returning a Status.
// Shapes are documented on each field; all tensors are row-major and contiguous unless a stride
// field says otherwise. Pointers live where the chosen backend runs: host memory for
// Backend::reference and Backend::cpu, device memory for Backend::cuda. Backend::automatic picks
// CUDA when the library was built with it, a device is present and `q` (or `w`) is device memory,
// and the CPU backend otherwise; Status::backend says which one ran.
//
// Serving layouts (all optional; the defaults mean "contiguous, one length for the whole batch"):
//   - capacity and strides: each cache has a CacheLayout (row strides; a capacity larger than N is
//     a head stride larger than N); q, out and the masks have element Strides, and a mask stride
//     of 0 broadcasts;
//   - per-sequence lengths: AttentionParams::kv_lens / q_lens, with N and Lq the maxima;
//   - paged caches: CacheLayout::block_table and page_size; the cache pointers then address the
//     page pool;
//   - different K and V formats: K and V each carry their own QuantFormat and layout;
//   - quantize on append: append() quantizes new rows and writes them at each sequence's end.
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

// "The contiguous value": a stride or size left at kAuto is derived from the shapes.
inline constexpr int64_t kAuto = -1;

// Where the rows of one cache live. A row is one token of one KV head: D / (32 / bits) u32 words
// of `packed` and D / group values of `scales` and of `biases`. Every stride here counts rows, so
// one set of strides addresses all three arrays. Offsets are 64-bit.
//   contiguous (block_table == nullptr): token t of KV head h of sequence b is the row
//       b * batch_stride + h * head_stride + t * token_stride
//     defaults: token_stride 1, head_stride N, batch_stride Hkv * head_stride, i.e. [B, Hkv, N];
//     a cache allocated for C >= N tokens ([B, Hkv, C]) is head_stride = C; a token-major cache
//     ([B, C, Hkv]) is token_stride = Hkv, head_stride = 1, batch_stride = C * Hkv.
//   paged (block_table != nullptr): the cache is a pool of pages of `page_size` tokens; token t
//     of sequence b is in page block_table[b * block_table_stride + t / page_size] and is the row
//       page * page_stride + h * head_stride + (t % page_size) * token_stride
//     defaults: token_stride 1, head_stride page_size, page_stride Hkv * page_size (a page is
//     [Hkv, page_size] rows), block_table_stride ceil(N / page_size). Entries of the block table
//     past a sequence's last token are not read.
struct CacheLayout {
  int64_t token_stride = kAuto;
  int64_t head_stride = kAuto;
  int64_t batch_stride = kAuto;  // contiguous only

  const int32_t* block_table = nullptr;  // paged: [B, block_table_stride] page indices (int32)
  int64_t block_table_stride = kAuto;
  int64_t page_size = 0;  // paged: tokens per page, a power of two from 16 to 256
  int64_t page_stride = kAuto;
};

// One quantized cache (K or V): N tokens of Hkv heads for each of B sequences, in the MLX affine
// layout, where `layout` says (by default [B, Hkv, N, D]).
struct KVCache {
  QuantFormat format;
  const uint32_t* packed = nullptr;  // rows of D / (32 / bits) u32
  const void* scales = nullptr;      // rows of D / group AttentionParams::dtype
  const void* biases = nullptr;      // rows of D / group AttentionParams::dtype
  CacheLayout layout;
};

// Element strides of a [B, H, L, X] tensor whose last dimension is contiguous (q, out: X = D;
// masks: X = N). kAuto is the contiguous stride; 0 broadcasts (q and the masks; a mask shared by
// all heads is h = 0, by all query rows l = 0).
struct Strides {
  int64_t b = kAuto;
  int64_t h = kAuto;
  int64_t l = kAuto;
};

struct AttentionParams {
  DType dtype = DType::f16;  // T: type of q, scales, biases, float_mask, out

  int64_t B = 1;    // sequences
  int64_t Hq = 1;   // query heads
  int64_t Hkv = 1;  // key/value heads; Hq % Hkv == 0, query head h reads KV head h / (Hq / Hkv)
  int64_t Lq = 1;   // query rows per sequence (the most, with q_lens); row i sits at position
                    // N - Lq + i (causal), with per-sequence lengths kv_lens[b] - q_lens[b] + i
  int64_t N = 0;    // tokens in the KV cache of each sequence (the most, with kv_lens)
  int64_t D = 128;  // head dim: a multiple of 32, at most 512, divisible by each group size

  const void* q = nullptr;  // [B, Hq, Lq, D] T, at q_strides
  KVCache k;                // keys
  KVCache v;                // values
  void* out = nullptr;      // [B, Hq, Lq, D] T, at out_strides; every element is written on
                            // success (rows past a sequence's q_lens[b] with zeros)
  Strides q_strides;
  Strides out_strides;

  // Per-sequence lengths (optional, int32 [B], in the memory of the backend that runs: host for
  // reference / cpu, device for cuda): sequence b holds kv_lens[b] tokens (nullptr: N for all)
  // and q_lens[b] query rows (nullptr: Lq for all), 0 <= q_lens[b] <= Lq,
  // q_lens[b] <= kv_lens[b] <= N. The host backends check the values; the CUDA backend cannot
  // without a synchronization and clamps them to those ranges instead.
  const int32_t* kv_lens = nullptr;
  const int32_t* q_lens = nullptr;
  // CUDA, optional: the same lengths in host memory. The backend then cuts the work by the
  // tokens the batch really holds (a batch of 1, 17 and 100000 tokens costs about what 100018
  // tokens cost); without it, it plans as if every sequence held N tokens.
  const int32_t* kv_lens_host = nullptr;

  const float* sinks = nullptr;  // optional [Hq] f32: one extra logit per head with a zero value

  const void* bool_mask = nullptr;  // optional [B, Hq, Lq, N] at mask_strides; 0 = hidden
  BoolMaskType bool_mask_type = BoolMaskType::u8;
  const void* float_mask = nullptr;  // optional [B, Hq, Lq, N] T at mask_strides, added to the
                                     // logit; -inf hides
  Strides mask_strides;              // of both masks

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
  // workspace_zeroed: the caller's workspace was zero-filled (cudaMemset) before its first use and
  // nothing else writes it between calls; the tensor-core kernel then merges the splits itself,
  // through counters that it leaves at zero after every call, instead of a second kernel launch
  // (1.5-4 us less per call on an H200). Without it a caller's workspace is never assumed zeroed.
  // (The library's own workspace always is.) A workspace marked so that is not zero-filled, or one
  // workspace used by two calls running at once (say a captured graph replayed on another stream
  // beside direct calls), leaves wrong results from then on, until it is zero-filled again.
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool workspace_zeroed = false;
  // CUDA, compute capability 9.0 and newer: launch the kernels as programmatic dependents of the
  // stream's previous work (programmatic dependent launch). Their blocks may then be placed on
  // the multiprocessors while the preceding kernel finishes, and wait (griddepcontrol.wait)
  // until it has completed and its writes are visible before they read or write any memory: the
  // order of the stream is kept, only the launch latency between kernels is hidden. Kernels
  // captured into a CUDA graph keep it as a programmatic edge. false: ordinary launches.
  bool pdl = true;
  // The same call (inputs, device, settings, num_threads on the CPU) gives the same output bits
  // every time. The host backends always do. On CUDA the default plan of the large decode calls
  // (contiguous 4- and 2-bit caches, D = 128) hands a block's 32-token tiles to its warps in the
  // order they become free (the tile pool), so which warp adds which tile into its softmax sums,
  // and with it the last bits of the output, can change from call to call (always within SPEC's
  // bounds). true: the CUDA planner never takes the pool; every tile's place in the sums is fixed
  // by the plan. Its cost where the pool applies (docs/PERF.md, run 114, H100): B=8 N=32768 4-bit
  // 113.9 -> 114.8 us, B=1 N=131072 4-bit 63.9 -> 65.2 us. (Run 114 also saw 7 of 7 calls on the
  // pool differ from the first in their bits.)
  bool deterministic = false;
};
Status attention(const AttentionParams& p);

// Bytes of device workspace that attention(p) may use on the CUDA backend (0 for the others).
size_t attention_workspace_size(const AttentionParams& p);

// ---------------------------------------------------------------------------------------------
// append: quantize new rows of K and V and write them at the end of each sequence's cache
// ---------------------------------------------------------------------------------------------

// A cache that append() writes (the same fields as KVCache, writable).
struct KVCacheMut {
  QuantFormat format;
  uint32_t* packed = nullptr;
  void* scales = nullptr;
  void* biases = nullptr;
  CacheLayout layout;
};

// Row i < L of new keys / values of (layer, b, h) becomes token start_b + i of that sequence's
// cache, quantized bit-identically to quantize(); start_b = kv_lens[b] (the tokens already there;
// nullptr: `start` for every sequence). One call covers K and V of every layer, sequence and head
// (one launch on the GPU). kv_lens is not updated: the caller adds L after the call.
struct AppendParams {
  DType dtype = DType::f16;  // T: type of k, v and of the caches' scales and biases
  int64_t layers = 1;        // caches of several layers at once (see layer_stride)
  int64_t B = 1;
  int64_t Hkv = 1;
  int64_t L = 1;     // new rows per sequence
  int64_t D = 128;
  int64_t capacity = 0;  // tokens each sequence's cache can hold: start_b + L must not exceed it
                         // (for a paged cache, at most block_table_stride * page_size)

  const void* k = nullptr;  // [layers, B, Hkv, L, D] T
  const void* v = nullptr;  // [layers, B, Hkv, L, D] T
  KVCacheMut k_cache;       // its layout's N-derived defaults use N = capacity
  KVCacheMut v_cache;
  int64_t layer_stride = 0;  // rows between one layer's cache and the next (paged: in the same
                             // pool, with the same block table)

  const int32_t* kv_lens = nullptr;  // [B] int32, in the backend's memory (as in attention)
  int64_t start = 0;

  Backend backend = Backend::automatic;
  void* stream = nullptr;
};
Status append(const AppendParams& p);

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
