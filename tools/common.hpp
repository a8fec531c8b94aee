// Shared pieces of the qsdpa program: the problem shape the flags describe, the host data made
// for it, and small helpers (errors, threads, sizes). Each command lives in its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qsdpa/qsdpa.hpp"

namespace qsdpa_cli {

using qsdpa::Backend;
using qsdpa::DType;
using qsdpa::Status;
using qsdpa::StatusCode;

// Everything that decides what one attention call computes.
struct Shape {
  int64_t B = 1, Hq = 32, Hkv = 8, Lq = 1, N = 8192, D = 128;
  int k_bits = 4, v_bits = 4, group = 64;
  DType dtype = DType::f16;
  int64_t window = 0;
  bool sinks = false;
  std::string bool_mask;  // "" (none), "u8" or "u32"
  bool float_mask = false;
  float scale = 0.0f;  // 0: 1/sqrt(D)
  int64_t paged = 0;             // 0: contiguous caches; else a paged pool of pages of this many tokens
  std::vector<int32_t> kv_lens;  // per-sequence lengths (B of them, N their maximum), or empty

  int64_t rep() const { return Hkv > 0 ? Hq / Hkv : 0; }
  int64_t kv_rows() const { return B * Hkv * N; }
  // Rows a call reads: the sequences' own lengths where they differ.
  int64_t kv_rows_used() const;
  int64_t q_elems() const { return B * Hq * Lq * D; }
  int64_t mask_elems() const { return B * Hq * Lq * N; }
  float effective_scale() const;
  std::string describe() const;  // "B=1 Hq=32 Hkv=8 Lq=1 N=8192 D=128 K4/V4 g64 f16 ..."
};

// Host data of one problem: q, the quantized K and V caches, and the optional tensors.
struct Problem {
  Shape shape;
  uint64_t seed = 0;
  std::vector<uint8_t> q;                                  // [B, Hq, Lq, D] T
  std::vector<uint32_t> k_packed, v_packed;                // [B, Hkv, N, D * bits / 32]
  std::vector<uint8_t> k_scales, k_biases, v_scales, v_biases;  // [B, Hkv, N, D / group] T
  std::vector<float> sinks;                                // [Hq] or empty
  std::vector<uint8_t> bool_mask;                          // [B, Hq, Lq, N] u8/u32, or empty
  std::vector<uint8_t> float_mask;                         // [B, Hq, Lq, N] T, or empty
  // Paged (shape.paged > 0): the same rows in a pool of pages in shuffled order, and the block
  // table [B, ceil(N / paged)] of each sequence's pages. The dense vectors above stay for the
  // accuracy check.
  std::vector<uint32_t> k_pool_packed, v_pool_packed;
  std::vector<uint8_t> k_pool_scales, k_pool_biases, v_pool_scales, v_pool_biases;
  std::vector<int32_t> block_table;

  // Attention parameters pointing at this host data, writing to `out` ([B, Hq, Lq, D] T): the
  // paged pool and the lengths when the shape has them.
  qsdpa::AttentionParams params(void* out) const;
};

// Bytes one attention call moves: packed K and V, scales, biases, q and out (plus the masks and
// sinks when given, since they are read too).
int64_t call_bytes(const Shape& s);
// Bytes of the quantized K and V caches (packed + scales + biases), and of the same caches in fp16.
int64_t quantized_cache_bytes(const Shape& s);
int64_t fp16_cache_bytes(const Shape& s);

// Checks the shape with the library's own argument rules before any data is made.
Status validate(const Shape& s);

// Makes the problem's data (deterministic in `seed`): realistic K/V activations quantized with
// qsdpa::quantize, Gaussian queries, and masks/sinks when the shape asks for them.
Status make_problem(const Shape& s, uint64_t seed, Problem* out);

// The unquantized cache rows of one (sequence, KV head): [N, D] floats, rounded to T as an fp16
// (or f32/bf16) cache would hold them. `which` is 'k' or 'v'.
void unquantized_rows(const Problem& p, char which, int64_t b, int64_t kvh, std::vector<float>* out);

// Accuracy on a subset of (sequence, head) rows small enough for the host oracle.
struct Accuracy {
  double err_vs_reference = 0;  // relative L2: backend output vs Backend::reference
  double quant_err = 0;  // relative L2: fp64 attention on the unquantized cache vs the reference
  int64_t rows_checked = 0, rows_total = 0;  // (sequence, query head) rows compared, of all
  std::string subset;  // "all 32 (sequence, head) rows" or "16 of 256 (sequence, head) rows, ..."
};
// `out` is the backend's full output on the host ([B, Hq, Lq, D] T). `budget` bounds the host
// work in cache elements touched (each (sequence, head) row costs Lq * N * D * 2); at least one
// row is always checked.
Status check_accuracy(const Problem& p, const std::vector<uint8_t>& out, double budget,
                      Accuracy* acc);

// ---- helpers --------------------------------------------------------------------------------
Status error(StatusCode c, std::string msg);
int hardware_threads();
// Runs f(i) for i in [0, n) on all hardware threads, in contiguous chunks.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& f);
uint64_t physical_memory_bytes();
std::string human_bytes(double bytes);  // "302.12 MB" (10^6 bytes)
std::string human_mib(double bytes);    // "60 MiB" (2^20 bytes), for cache sizes
std::string utc_now_iso();              // "2026-11-29T14:53:00Z"
std::string cpu_model_name();           // from /proc/cpuinfo
int64_t cpu_l3_bytes();                 // last-level cache size, 32 MB when unknown
bool parse_dtype(const std::string& s, DType* t);

}  // namespace qsdpa_cli
