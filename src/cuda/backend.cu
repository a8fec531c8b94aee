// The CUDA backend's entry points (core/backends.hpp): device queries, pointer checks, the split-K
// plan, the workspace, and the ONE dispatch between the tensor-core kernel and the generic one.
//
// Everything is enqueued on the caller's stream with no synchronization and no allocation, except
// the growth of the library's own workspace (when the caller passes none), which never happens
// while the stream is being captured into a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../core/backends.hpp"
#include "kernels.cuh"
#include "split_kv.cuh"
#include "testing.hpp"

#if __has_include("attention_mma.cuh")
#include "attention_mma.cuh"
#define QSDPA_HAVE_MMA 1
#else
#define QSDPA_HAVE_MMA 0
#endif

namespace qsdpa::detail {
namespace {

using cuda::AttnArgs;

// Split-K plan. Each split covers at least this many tokens (the tensor-core kernel: one 32-token
// tile per warp; the generic kernel: a few of its shared-memory tiles) ...
// (Two tiles per warp: measured on an H200, 2026-12-01, against one: B=1 N=8192 26.3 -> 19.7 us,
// B=1 N=4096 17.9 -> 15.9 us, longer caches unchanged. -DQSDPA_MMA_MIN_SPLIT_TOKENS: a tuning knob.)
#ifndef QSDPA_MMA_MIN_SPLIT_TOKENS
#define QSDPA_MMA_MIN_SPLIT_TOKENS 256
#endif
constexpr int64_t kMinSplitTokensMma = QSDPA_MMA_MIN_SPLIT_TOKENS;
constexpr int64_t kMinSplitTokensGeneric = 256;
// ... and reads at least this many times the bytes of the partials it writes (rows * (D + 2)
// floats), so that the partials stay small next to the cache.
constexpr int64_t kPartialsRatio = 4;
// Per-block cost that does not scale with the tokens (queries, pipeline fill, merge, partials),
// in tokens, for the choice between one long wave and several short ones.
constexpr int64_t kBlockOverheadTokens = 128;
// Most splits the planner considers.
constexpr int64_t kMaxSplits = 4096;
// Tensor-core plans of at most this many splits run each row tile's splits as one thread-block
// cluster that merges in the kernel (sm_90 and newer; AttnArgs::cluster): no partials round trip
// and no combine launch. 0 turns it off (-DQSDPA_MMA_CLUSTER_SPLITS: a tuning knob).
#ifndef QSDPA_MMA_CLUSTER_SPLITS
#define QSDPA_MMA_CLUSTER_SPLITS 16
#endif
constexpr int kClusterSplits = QSDPA_MMA_CLUSTER_SPLITS;
std::atomic<bool> g_cluster_allowed{true};  // cuda::set_cluster_merge (a test hook)
// The in-kernel merge of the splits (in_kernel_merge below); -DQSDPA_IN_KERNEL_MERGE=0 starts with it
// off (a tuning knob: the same tree with the combine kernel).
#ifndef QSDPA_IN_KERNEL_MERGE
#define QSDPA_IN_KERNEL_MERGE 1
#endif
std::atomic<bool> g_in_kernel_merge_allowed{QSDPA_IN_KERNEL_MERGE != 0};  // cuda::set_in_kernel_merge (a test hook)
// A tuning knob from the environment, read once: the variable's value if it is one digit from 0
// to `most`, else `fallback`.
int env_digit(const char* name, int most, int fallback) {
  const char* e = std::getenv(name);
  return e && e[0] >= '0' && e[0] <= char('0' + most) && e[1] == '\0' ? e[0] - '0' : fallback;
}
// Whether a tensor-core plan that merges in the combine kernel, launched as a programmatic
// dependent, counts the attention blocks' arrivals per row tile so that the combine kernel's rows
// wait for their own row tile rather than for the whole grid (AttnArgs::arrivals; place_partials
// below). QSDPA_COMBINE_ARRIVALS=0/1 in the environment sets the start, cuda::set_combine_arrivals
// (a test hook) any time.
std::atomic<bool> g_combine_arrivals{env_digit("QSDPA_COMBINE_ARRIVALS", 1, 0) == 1};
// Whether the calls that the D = 512 kernel with the rows on M fits run on it (AttnArgs::rowsm,
// mma_rowsm.cuh): QSDPA_MMA_ROWSM at build time, QSDPA_ROWSM=0/1 in the environment over it,
// cuda::set_rows_on_m (a test hook) any time.
std::atomic<bool> g_rows_on_m{env_digit("QSDPA_ROWSM", 1, QSDPA_MMA_ROWSM != 0) == 1};
// The tensor-core kernel's tile pool (AttnArgs::pool; pool_wanted below): 0 never, 1 (the
// default) where the problem is large enough, 2 wherever it fits in blocks of 16 warps, 3 the same
// in blocks of 8 (2 and 3: cuda::set_block_pool, a test hook). QSDPA_BLOCK_POOL=0..3 in the
// environment sets the starting mode (one build timed several ways, scripts/gpu_tune.sh).
std::atomic<int> g_pool_mode{env_digit("QSDPA_BLOCK_POOL", 3, 1)};
// Whether the tile pool's splits may merge in clusters (mmak::kContigPoolCluster; cluster_merge
// below, whose rule then applies): on by default, measured on an H200 (2026-12-02, run 53, 2
// rounds, the same build): B=8 N=32768 4-bit 85.2 -> 84.2 us per call, graph10 81.6 -> 80.3, the
// other shapes unchanged. QSDPA_POOL_CLUSTER=0 in the environment or cuda::set_pool_cluster (a
// test hook) turns it off.
std::atomic<bool> g_pool_cluster{env_digit("QSDPA_POOL_CLUSTER", 1, 1) == 1};
// Whether the planner's default (g_pool_mode 1) takes the tile pool for 2-bit caches too (f16,
// pool_fits) or keeps them on the 4-warp blocks, and then only where the row tiles are at least a
// quarter of the SMs (a row tile takes at most ~4 of the pool's splits). Measured on an H200
// (2026-12-06, run 103, 3 rounds, us per call, pool against 4-warp blocks): B=8 N=32768 72.1 /
// 74.7, B=32 N=4096 42.2 / 44.1 (blocks of 8 warps), but B=1 N=131072 (8 row tiles: 16 splits
// merged in the kernel) 45.3 / 43.6 (64 splits and the combine kernel). QSDPA_POOL_2BIT=0/1 in
// the environment sets the start (a tuning knob: one build timed both ways), cuda::set_pool_2bit
// (a test hook) any time.
std::atomic<bool> g_pool_2bit{env_digit("QSDPA_POOL_2BIT", 1, 1) == 1};
constexpr int kPool2BitSmsPerRowTile = 4;  // (the most SMs per row tile that 2-bit takes the pool at)
// The pool is taken when the call's 32-token tiles are at least this many per warp of a full
// wave of its blocks (16 warps per multiprocessor): the latency-bound small calls keep the 4-warp
// blocks, which spread a few tiles over more blocks ...
constexpr int64_t kPoolMinTilesPerWarp = 8;
// ... and when its blocks fill at least this share of the block slots in one round (units x
// splits <= slots): a second round of blocks pays the block's fixed cost again (measured on an
// H200, 2026-12-02, run 48: B=32 N=4096 4-bit, 256 blocks of 16 warps in two rounds, 61.7 us
// against 52.1 with the 4-warp blocks), and idle SMs are lost bandwidth. Blocks of 16 warps (one
// slot per SM) where the row tiles are at most the SMs, else blocks of 8 (two slots per SM) where
// they are at most twice the SMs.
constexpr double kPoolMinFill = 0.9;

Status error(StatusCode c, std::string msg) { return make_status(c, std::move(msg), Backend::cuda); }

#if QSDPA_MMA_TRACE
// Trace builds (-DQSDPA_MMA_TRACE=1, a diagnostic, never timed): every tensor-core launch records per
// block when it started, ended its token loop and ended (AttnArgs::trace). With QSDPA_TRACE_FILE
// set, calls QSDPA_TRACE_SKIP, +2, +4 ... (QSDPA_TRACE_CALLS of them) are waited for and appended to
// that file as one JSON line each: {"call", "gx", "gy", "blocks": [[x, y, sm, merged, start, loop
// end, end, warp 0's loop end, ... warp 3's, stores issued, arrival, query rows ready, first tile in,
// o stored, per-row step, merge step 1, merge step 2] ...]} with the times in ns
// from the earliest start (0: not recorded). Every other call only, so that each
// traced call runs behind an untraced one, as calls do back to back.
// (a header, the attention kernel's blocks, then the combine kernel's)
constexpr size_t kTraceWords =
    size_t(cuda::kTraceCombineBase) + size_t(cuda::kTraceCombineWords) * size_t(cuda::kTraceCombineBlocks);
struct Trace {
  unsigned long long* buf = nullptr;
  long calls = 0;
};
Trace g_trace;

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : dflt;
}

void trace_arm(AttnArgs& a, cudaStream_t s) {
  a.trace = nullptr;
  if (!g_trace.buf && cudaMalloc(&g_trace.buf, kTraceWords * 8) != cudaSuccess) g_trace.buf = nullptr;
  if (!g_trace.buf) return;
  cudaMemsetAsync(g_trace.buf, 0, kTraceWords * 8, s);
  a.trace = g_trace.buf;
}

void trace_dump(const AttnArgs& a, cudaStream_t s) {
  const long call = g_trace.calls++, skip = env_long("QSDPA_TRACE_SKIP", 20), n = env_long("QSDPA_TRACE_CALLS", 3);
  const char* path = std::getenv("QSDPA_TRACE_FILE");
  if (!a.trace || !path || call < skip || call >= skip + 2 * n || (call - skip) % 2) return;
  std::vector<unsigned long long> h(kTraceWords);
  if (cudaStreamSynchronize(s) != cudaSuccess ||
      cudaMemcpy(h.data(), a.trace, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
    return;
  const int64_t gx = int64_t(h[0]), gy = int64_t(h[1]), nb = std::min<int64_t>(gx * gy, cuda::kTraceMaxBlocks);
  const auto record = [&](int64_t i) { return &h[size_t(4 + cuda::kTraceBlockWords * i)]; };
  unsigned long long t0 = ~0ull;
  for (int64_t i = 0; i < nb; ++i)
    if (record(i)[0]) t0 = std::min(t0, record(i)[0]);
  FILE* f = std::fopen(path, "a");
  if (!f) return;
  std::fprintf(f, "{\"call\": %ld, \"gx\": %lld, \"gy\": %lld, \"blocks\": [", call, (long long)gx, (long long)gy);
  bool first = true;
  for (int64_t i = 0; i < nb; ++i) {
    const unsigned long long* e = record(i);
    if (!e[0]) continue;  // (a split without tokens records nothing)
    std::fprintf(f, "%s[%lld, %lld, %llu, %llu, %llu, %llu, %llu", first ? "" : ", ", (long long)(i % gx),
                 (long long)(i / gx), e[3] & 0xffffffffull, e[3] >> 32, e[0] - t0, e[1] - t0, e[2] - t0);
    for (int w = 4; w < cuda::kTraceBlockWords; ++w) std::fprintf(f, ", %llu", e[w] ? e[w] - t0 : 0ull);
    std::fprintf(f, "]");
    first = false;
  }
  // the combine kernel's blocks: [placed, wait ended, end, sm, (m, l) reduced, summed] (none when
  // the attention kernel merged; a block placed before the earliest attention block's start is
  // clamped to it)
  std::fprintf(f, "], \"combine\": [");
  first = true;
  const auto since = [&](unsigned long long v) { return v > t0 ? v - t0 : 0ull; };
  for (int64_t i = 0; i < cuda::kTraceCombineBlocks; ++i) {
    const unsigned long long* e = &h[size_t(cuda::kTraceCombineBase + cuda::kTraceCombineWords * i)];
    if (!e[0] || e[2] < t0) continue;
    std::fprintf(f, "%s[%llu, %llu, %llu, %llu, %llu, %llu]", first ? "" : ", ", since(e[0]), since(e[1]),
                 since(e[2]), e[3], since(e[4]), since(e[5]));
    first = false;
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}
#endif

Status cuda_status(cudaError_t e, const char* what) {
  return error(StatusCode::backend_error, std::string(what) + ": " + cudaGetErrorString(e));
}

// Per-device facts read once.
struct DeviceFacts {
  int sms = 0;
  int cc_major = 0;
  int cc_minor = 0;
  bool pageable_access = false;  // the device can read pageable host memory (HMM / ATS)
};

Status device_facts(int dev, DeviceFacts* out) {
  static std::mutex mu;
  static std::map<int, DeviceFacts> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dev); it != cache.end()) {
    *out = it->second;
    return Status{};
  }
  DeviceFacts f;
  int pageable = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess)
    return cuda_status(e, "cudaDeviceGetAttribute(multiProcessorCount)");
  if (cudaError_t e = cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev); e != cudaSuccess)
    return cuda_status(e, "cudaDeviceGetAttribute(pageableMemoryAccess)");
  f.pageable_access = pageable != 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, dev); e != cudaSuccess)
    return cuda_status(e, "cudaDeviceGetAttribute(computeCapabilityMajor)");
  if (cudaError_t e = cudaDeviceGetAttribute(&f.cc_minor, cudaDevAttrComputeCapabilityMinor, dev); e != cudaSuccess)
    return cuda_status(e, "cudaDeviceGetAttribute(computeCapabilityMinor)");
  cache[dev] = f;
  *out = f;
  return Status{};
}

// Makes `dev` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != dev && cudaSetDevice(dev) == cudaSuccess) switched_ = true;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// Checks that `ptr` can be read by the device; `dev` receives its device (or stays unchanged for
// memory that is not bound to one).
Status check_pointer(const void* ptr, const char* name, int* dev) {
  cudaPointerAttributes at{};
  if (cudaError_t e = cudaPointerGetAttributes(&at, ptr); e != cudaSuccess) {
    cudaGetLastError();
    return error(StatusCode::invalid_argument,
                 std::string(name) + " is not memory the CUDA backend can read (" + cudaGetErrorString(e) + ")");
  }
  if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) {
    if (at.type == cudaMemoryTypeDevice && dev) *dev = at.device;
    return Status{};
  }
  if (at.type == cudaMemoryTypeHost && at.devicePointer != nullptr) return Status{};  // mapped pinned memory
  DeviceFacts f;
  int cur = 0;
  if (cudaGetDevice(&cur) == cudaSuccess && device_facts(cur, &f).ok() && f.pageable_access) return Status{};
  return error(StatusCode::invalid_argument,
               std::string(name) + " is host memory: Backend::cuda needs device (or managed) memory");
}

struct Check {
  const void* ptr;
  const char* name;
};

// Checks every non-null pointer; the device of the first device allocation is the one to run on.
Status check_pointers(std::initializer_list<Check> list, int* dev) {
  int found = -1;
  for (const Check& c : list) {
    if (!c.ptr) continue;
    int d = -1;
    if (Status s = check_pointer(c.ptr, c.name, &d); !s) return s;
    if (found < 0 && d >= 0) found = d;
  }
  if (found >= 0) {
    *dev = found;
  } else if (cudaError_t e = cudaGetDevice(dev); e != cudaSuccess) {
    return cuda_status(e, "cudaGetDevice");
  }
  return Status{};
}

// ---- split-K plan -----------------------------------------------------------------------------
struct Plan {
  bool use_mma = false;
  size_t workspace = 0;
};

AttnArgs make_args(const AttentionParams& p) {
  AttnArgs a{};
  a.rowsm = g_rows_on_m.load(std::memory_order_relaxed) ? 1 : 0;
  a.deterministic = p.deterministic ? 1 : 0;
  a.q = p.q;
  a.k_packed = p.k.packed;
  a.k_scales = p.k.scales;
  a.k_biases = p.k.biases;
  a.v_packed = p.v.packed;
  a.v_scales = p.v.scales;
  a.v_biases = p.v.biases;
  a.sinks = p.sinks;
  a.bool_mask = p.bool_mask;
  a.float_mask = p.float_mask;
  a.out = p.out;
  a.B = p.B;
  a.Hq = p.Hq;
  a.Hkv = p.Hkv;
  a.Lq = p.Lq;
  a.N = p.N;
  a.D = p.D;
  a.window = p.window;
  a.scale = p.scale > 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.D)));
  a.k_bits = p.k.format.bits;
  a.k_group = p.k.format.group;
  a.v_bits = p.v.format.bits;
  a.v_group = p.v.format.group;
  a.bool_mask_u32 = p.bool_mask_type == BoolMaskType::u32 ? 1 : 0;
  a.dtype = int(p.dtype);
  a.kmap = resolve_layout(p.k.layout, p.Hkv, p.N);
  a.vmap = resolve_layout(p.v.layout, p.Hkv, p.N);
  a.dense = a.kmap.dense(p.Hkv, p.N) && a.vmap.dense(p.Hkv, p.N);
  const auto& km = a.kmap;
  const auto& vm = a.vmap;
  a.same_layout = km.token_stride == vm.token_stride && km.head_stride == vm.head_stride &&
                  km.batch_stride == vm.batch_stride && km.block_table == vm.block_table &&
                  km.bt_stride == vm.bt_stride && km.page_stride == vm.page_stride && km.page_shift == vm.page_shift;
  a.qmap = resolve_strides(p.q_strides, p.Hq, p.Lq, p.D);
  a.omap = resolve_strides(p.out_strides, p.Hq, p.Lq, p.D);
  a.mmap = resolve_strides(p.mask_strides, p.Hq, p.Lq, p.N);
  a.kv_lens = p.kv_lens;
  a.q_lens = p.q_lens;
  a.plan_b = p.B;
  if (p.kv_lens && p.kv_lens_host && p.N > 0) {
    int64_t total = 0;
    for (int64_t b = 0; b < p.B; ++b) total += std::clamp<int64_t>(p.kv_lens_host[b], 0, p.N);
    a.plan_b = std::clamp<int64_t>((total + p.N / 2) / p.N, 1, p.B);
  }
  return a;
}

bool use_tensor_cores(const AttnArgs& a) {
#if QSDPA_HAVE_MMA
  return cuda::mma_supports(a);
#else
  (void)a;
  return false;
#endif
}

// Fills num_splits, chunk and t_begin (N > 0).
//
// Independent work units are (b, KV head, query-row tile) triples; a block handles one unit's
// split. The model: a block runs at about the same speed whether its multiprocessor holds 2 or 3
// of them (the tensor-core kernel on an H200, B = 8, Hkv = 8, N = 32768: one wave of 384 blocks
// of 5504 tokens beat 320 blocks of 6656, 512 of 4096 and 768 of 2816 by 10-25 %), so the time is
// about waves x (tokens per block + a fixed cost), with waves = ceil(blocks / (SMs x blocks per
// SM)) from the kernel's occupancy. The plan takes the number of splits that minimizes it (the
// fewest on a tie): one full wave when the (b, KV head) pairs are few, a whole number of waves
// otherwise.
// Whether the device runs sm_90a code (compute capability 9.0 alone).
bool runs_sm90a(const DeviceFacts& f) { return f.cc_major == 9 && f.cc_minor == 0; }

// The current device's facts (false without a device).
bool current_device_facts(DeviceFacts* f) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return bool(device_facts(dev, f));
}

// Which tile pool (AttnArgs::pool: 0 none, 1 blocks of 16 warps, 2 of 8) a tensor-core plan of
// `units` (b, KV head, row tile) triples over `span` tokens takes (g_pool_mode). Measured reason:
// with 4-warp blocks, several per multiprocessor, the blocks an SM received later ran slower than
// the first ones (H200 traces, 2026-12-02: a block's warps ended 1.6-1.8 us apart, the blocks of a
// wave 20 us apart, B=32 N=4096 10 us apart), and the wave ended in a tail; warps of one block
// that take tiles from one counter end together. Never for a deterministic call (the order in
// which the warps take the tiles depends on timing), whatever the mode, the test hook's included.
int pool_wanted(const AttnArgs& a, int64_t units, int64_t span, int sms) {
#if QSDPA_HAVE_MMA
  const int mode = g_pool_mode.load(std::memory_order_relaxed);
  if (mode == 0 || a.deterministic || !cuda::mma_pool_fits(a)) return 0;
  if (mode >= 2) return mode - 1;
  if (a.k_bits == 2 && (!g_pool_2bit.load(std::memory_order_relaxed) || units * kPool2BitSmsPerRowTile < sms))
    return 0;
  const int64_t tiles = units * ((span + cuda::kPoolTileTokens - 1) / cuda::kPoolTileTokens);
  if (units <= 0 || tiles < int64_t(sms) * cuda::kPoolBlockWarps * kPoolMinTilesPerWarp) return 0;
  // (the splits of one round fill the slots: sms blocks of 16 warps, or 2 sms of 8)
  const auto fills = [&](int64_t slots) { return double(units * (slots / units)) >= kPoolMinFill * slots; };
  if (units <= sms) return fills(sms) ? 1 : 0;
  return units <= 2 * sms && fills(2 * sms) ? 2 : 0;
#else
  (void)a, (void)units, (void)span, (void)sms;
  return 0;
#endif
}

Plan make_plan(AttnArgs& a, const DeviceFacts& f, bool allow_mma = true) {
  const int sms = f.sms;
  a.sm90a = runs_sm90a(f);
  Plan plan;
  plan.use_mma = allow_mma && use_tensor_cores(a);
  int64_t tile = cuda::kGenericTokenTile, min_tokens = kMinSplitTokensGeneric, units = a.plan_b * a.Hkv;
#if QSDPA_HAVE_MMA
  if (plan.use_mma) {
    tile = std::max(1, cuda::mma_token_tile(a));
    min_tokens = kMinSplitTokensMma;
    units *= cuda::mma_row_tiles(a);
  }
#endif
  if (!plan.use_mma) units *= cuda::generic_row_tiles(a);
  // Bytes per token of K and V (packed words, scales and biases) and of one split's partials.
  const int64_t tsz = a.dtype == int(DType::f32) ? 4 : 2;
  const int64_t token_bytes = a.D * (a.k_bits + a.v_bits) / 8 + (a.D / a.k_group + a.D / a.v_group) * 2 * tsz;
  const int64_t partial_bytes = (a.Hq / a.Hkv) * a.Lq * (a.D + 2) * 4;
  min_tokens = std::max(min_tokens, kPartialsRatio * partial_bytes / std::max<int64_t>(1, token_bytes));
  min_tokens = (min_tokens + tile - 1) / tile * tile;

  // Tokens before t_begin are outside every row's window (the first row sits at N - Lq); with
  // per-sequence lengths each block finds its own first token. A multiple of the token tile, so
  // that no tile straddles two pages of a paged cache.
  a.t_begin = a.window > 0 && !a.kv_lens && !a.q_lens ? std::max<int64_t>(0, a.N - a.Lq - a.window + 1) : 0;
  a.t_begin = a.t_begin / tile * tile;
  const int64_t span = a.N - a.t_begin;
  int per_sm = 1;
#if QSDPA_HAVE_MMA
  if (plan.use_mma) {
    a.pool = pool_wanted(a, units, span, sms);
    per_sm = cuda::mma_blocks_per_sm(a);  // (of the pool's kernel when a.pool)
  }
#endif
  if (!plan.use_mma) per_sm = cuda::generic_blocks_per_sm(a);
  const int64_t slots = std::max<int64_t>(1, int64_t(sms) * std::max(1, per_sm));
  const int64_t most = std::clamp<int64_t>(span / min_tokens, 1, kMaxSplits);
  int64_t best_chunk = 0, best_cost = -1;
  for (int64_t want = 1; want <= most; ++want) {
    int64_t chunk = (span + want - 1) / want;
    chunk = (chunk + tile - 1) / tile * tile;
    const int64_t splits = (span + chunk - 1) / chunk;
    if (splits != want) continue;  // the same plan as a smaller want
    const int64_t waves = (units * splits + slots - 1) / slots;
    // (waves * chunk is about B * Hkv * row tiles * N / slots: far from overflowing)
    const int64_t cost = waves * (chunk + kBlockOverheadTokens);
    if (best_cost < 0 || cost < best_cost) best_cost = cost, best_chunk = chunk;
    // Every larger want costs at least units * (span + want * overhead) / slots: stop when that
    // reaches the best so far.
    if ((units * (span + (want + 1) * kBlockOverheadTokens)) / slots >= best_cost) break;
  }
  if (best_cost < 0) best_chunk = (span + tile - 1) / tile * tile;  // (want = 1 always qualifies)
  a.chunk = best_chunk;
  a.num_splits = int((span + best_chunk - 1) / best_chunk);
  plan.workspace = cuda::partials_bytes(a.B * a.Hq * a.Lq, a.D, a.num_splits);
  return plan;
}

// Whether a tensor-core plan runs its row tiles' splits as clusters that merge in the kernel: only
// when the grid holds at most one block per multiprocessor (the latency-bound small calls). With
// more, a cluster's blocks wait at its barrier for the slowest of them, holding their slots, and
// the waves lose that time (measured on an H200, 2026-12-01, clusters at up to 16 splits against
// the combine kernel: B=1 N=4096 4-bit 16.2 -> 13.7 us, but B=8 N=32768 4-bit 101.8 -> 132.1 us,
// 8-bit 146.7 -> 222.3 us, B=4 N=16384 38.1 -> 46.3 us; B=32 N=4096 57.9 -> 56.4 us).
bool cluster_merge(const AttnArgs& a, const DeviceFacts& f) {
#if QSDPA_HAVE_MMA
  if (!g_cluster_allowed.load(std::memory_order_relaxed) || f.cc_major < 9 || a.num_splits > kClusterSplits ||
      a.pool == 2 || (a.pool == 1 && !g_pool_cluster.load(std::memory_order_relaxed)))
    return false;
  // ... and when all the clusters are resident at once: a second wave of clusters costs more than
  // the combine (D=256 8-bit, one block per SM: 8 clusters of 16 did not fit, 61.7 -> 97.7 us).
  const int64_t clusters = a.B * a.Hkv * cuda::mma_row_tiles(a), blocks = clusters * a.num_splits;
  return blocks <= f.sms && clusters <= cuda::mma_max_clusters(a, a.num_splits);
#else
  (void)a, (void)f;
  return false;
#endif
}

// Whether a tensor-core plan that does not merge in clusters merges its splits in the kernel
// (AttnArgs::counters) rather than in the combine kernel: when the workspace's counters are known
// to be zero (`zeroed`: the library's own workspace, or the caller's with workspace_zeroed), the
// row tiles have counters (kInKernelMergeSlots) and the splits fit the kernel's scratch. Measured
// on an H200 (2026-12-01) the combine kernel cost 3-5 us per call end to end.
// The merge runs in the last block of each row tile, on the call's critical path: only when it
// is a few loads per thread (g_merge_max_loads 16-byte loads of o, rows x D / 4 / 128 x
// splits). Measured on an H200 (2026-12-01, run 35, against the combine kernel in the same run):
// B=8 N=32768 4-bit (4 rows, 8 splits: 8 loads) 91.3 -> 89.8 us, 8-bit 147.1 -> 145.1, B=32
// N=4096 (2 loads) 54.1 -> 53.1; but B=1 N=131072 (64 splits: 64 loads) 54.8 -> 56.6 and D=512
// (8 rows, 43 splits: 344 loads) 79.5 -> 101.7. Again with the merge of 2026-12-03 (run 79, one
// build, the cap from the environment): D=256 4-bit (8 rows, 32 splits: 128 loads) 33.1 -> 38.6
// us at a cap of 128, 8-bit (16 splits: 64 loads) 45.3 -> 48.4 at 64, D=512 (256 loads) +27 / +30
// us at 256; every other shape unchanged. QSDPA_MERGE_LOADS=k in the environment sets the
// cap to 16 << k (k = 0..5; one build timed several ways, scripts/gpu_tune.sh), and
// cuda::set_merge_max_loads (a test hook) to any value.
std::atomic<int64_t> g_merge_max_loads{int64_t(16) << env_digit("QSDPA_MERGE_LOADS", 5, 1)};

bool in_kernel_merge(const AttnArgs& a, bool zeroed) {
#if QSDPA_HAVE_MMA
  if (!zeroed || !g_in_kernel_merge_allowed.load(std::memory_order_relaxed) || a.cluster ||
      a.num_splits > cuda::kInKernelMergeMaxSplits)
    return false;
  const int64_t tiles = cuda::mma_row_tiles(a), R = a.Hq / a.Hkv * a.Lq;
  if (a.B * a.Hkv * tiles > cuda::kInKernelMergeSlots) return false;
  const int64_t rows = tiles == 1 ? R : ((R + tiles - 1) / tiles + 7) / 8 * 8;  // of a tile, at most
  const int64_t loads = (rows * (a.D / 4) + 127) / 128 * a.num_splits;
  return loads <= g_merge_max_loads.load(std::memory_order_relaxed);
#else
  (void)a, (void)zeroed;
  return false;
#endif
}

// Whether a tensor-core plan that merges in the combine kernel counts arrivals for it
// (g_combine_arrivals, AttnArgs::arrivals): a programmatic launch (else the combine kernel starts
// after the attention kernel's end anyway), a workspace whose counters are zero, and a counter for
// every row tile.
bool combine_arrivals(AttnArgs& a, bool zeroed) {
#if QSDPA_HAVE_MMA
  if (!QSDPA_MMA_ARRIVALS || !zeroed || !a.pdl || a.cluster || a.num_splits < 1 ||
      !g_combine_arrivals.load(std::memory_order_relaxed) ||
      a.B * a.Hkv * cuda::mma_row_tiles(a) > cuda::kInKernelMergeSlots)
    return false;
  a.tile_rows = cuda::mma_tile_rows(a);
  return true;
#else
  (void)a, (void)zeroed;
  return false;
#endif
}

// Which merge a tensor-core plan for p takes: in clusters (sets a.cluster), in the attention
// kernel (returns true), or else the combine kernel.
bool pick_merge(AttnArgs& a, const DeviceFacts& f, const AttentionParams& p) {
  a.cluster = cluster_merge(a, f);
  return in_kernel_merge(a, !p.workspace || p.workspace_zeroed);
}

// Points the counters (with the in-kernel merge) and the partials into the workspace (16-byte
// aligned; partials_bytes() leaves room): the counters first, at a place that does not depend on
// the call.
void place_partials(AttnArgs& a, void* ws, bool in_kernel, bool arrivals = false) {
  const auto align16 = [](uintptr_t x) { return (x + 15) & ~uintptr_t(15); };
  const size_t n = size_t(a.num_splits) * size_t(a.B * a.Hq * a.Lq);
  const uintptr_t counters = align16(reinterpret_cast<uintptr_t>(ws)), base = counters + cuda::kCounterBytes;
  a.counters = in_kernel ? reinterpret_cast<int*>(counters) : nullptr;
  a.arrivals = !in_kernel && arrivals ? reinterpret_cast<int*>(counters) : nullptr;
  a.part_m = reinterpret_cast<float*>(base);
  a.part_l = a.part_m + n;
  a.part_o = reinterpret_cast<float*>(align16(reinterpret_cast<uintptr_t>(a.part_l + n)));
}

// ---- the library's workspace: one buffer per (device, stream), grown when needed -------------
// One per stream rather than per device, so that attention calls on concurrent streams never
// share partials. A buffer is only ever replaced on its own stream's call, outside capture.
struct WorkspaceKey {
  int dev;
  cudaStream_t stream;
  bool operator<(const WorkspaceKey& o) const { return dev != o.dev ? dev < o.dev : stream < o.stream; }
};
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
std::mutex ws_mutex;
std::map<WorkspaceKey, Workspace>& workspaces() {
  static auto* m = new std::map<WorkspaceKey, Workspace>();  // freed by the process exit, never
  return *m;                                                  // by a destructor racing the driver
}

Status library_workspace(int dev, cudaStream_t stream, size_t need, void** out) {
  Workspace& w = workspaces()[WorkspaceKey{dev, stream}];
  if (w.bytes >= need) {
    *out = w.ptr;
    return Status{};
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &cap); e != cudaSuccess) {
    cudaGetLastError();
    return error(StatusCode::invalid_argument,
                 std::string("the attention workspace must grow, which is not possible now (") +
                     cudaGetErrorString(e) + "): pass workspace / workspace_bytes (attention_workspace_size())");
  }
  if (cap != cudaStreamCaptureStatusNone)
    return error(StatusCode::invalid_argument,
                 "workspace is null while the stream is being captured into a CUDA graph, and the library's "
                 "workspace is too small (" + std::to_string(w.bytes) + " < " + std::to_string(need) +
                     " bytes) and cannot grow during capture: pass workspace / workspace_bytes of "
                     "attention_workspace_size() bytes");
  if (w.ptr) {
    cudaError_t e = cudaFree(w.ptr);  // waits for the kernels still reading it
    w.ptr = nullptr;
    w.bytes = 0;
    if (e != cudaSuccess) return cuda_status(e, "cudaFree(workspace)");
  }
  const size_t bytes = std::max(need + need / 4, size_t(1) << 20);  // some headroom for growth
  if (cudaError_t e = cudaMalloc(&w.ptr, bytes); e != cudaSuccess) {
    cudaGetLastError();
    w.ptr = nullptr;
    return cuda_status(e, ("cudaMalloc(workspace, " + std::to_string(bytes) + " bytes)").c_str());
  }
  // The in-kernel merge's counters start at zero (and every call leaves them so).
  if (cudaError_t e = cudaMemsetAsync(w.ptr, 0, cuda::kCounterBytes + 16, stream); e != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w.ptr);
    w.ptr = nullptr;
    return cuda_status(e, "cudaMemsetAsync(workspace counters)");
  }
  w.bytes = bytes;
  *out = w.ptr;
  return Status{};
}

struct Availability {
  bool ok = false;
  std::string why;
};

const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    } else if (n <= 0) {
      r.why = "no CUDA device is present";
    } else {
      r.ok = true;
    }
    return r;
  }();
  return a;
}

}  // namespace

bool cuda_built() { return true; }

bool cuda_available(std::string* why) {
  const Availability& a = availability();
  if (!a.ok && why) *why = a.why;
  return a.ok;
}

bool cuda_is_device_pointer(const void* p) {
  if (!p || !availability().ok) return false;
  cudaPointerAttributes at{};
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

std::string cuda_device_info() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cuda: no device (") + cudaGetErrorString(e) + ")\n";
  }
  std::string s;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp pr{};
    if (cudaGetDeviceProperties(&pr, d) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    char line[512];
    std::snprintf(line, sizeof line, "cuda:%d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB%s\n", d, pr.name, pr.major,
                  pr.minor, pr.multiProcessorCount, double(pr.totalGlobalMem) / double(1 << 30),
                  double(pr.l2CacheSize) / double(1 << 20), QSDPA_HAVE_MMA ? "" : " (generic kernel only)");
    s += line;
  }
  return s;
}

size_t cuda_attention_workspace_size(const AttentionParams& p) {
  if (p.N == 0) return 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (p.q) {  // the device the data lives on
    cudaPointerAttributes at{};
    if (cudaPointerGetAttributes(&at, p.q) == cudaSuccess && at.type == cudaMemoryTypeDevice)
      dev = at.device;
    else
      cudaGetLastError();
  }
  DeviceFacts f;
  if (!device_facts(dev, &f)) return 0;
  DeviceGuard guard(dev);  // the occupancy queries of the plan ask the current device
  AttnArgs a = make_args(p);
  return make_plan(a, f).workspace;
}

namespace {

Status run_attention(const AttentionParams& p, bool allow_mma) {
  int dev = 0;
  const bool kv = p.N > 0;
  if (Status s = check_pointers({{p.q, "q"},
                                 {p.out, "out"},
                                 {kv ? p.k.packed : nullptr, "k.packed"},
                                 {kv ? p.k.scales : nullptr, "k.scales"},
                                 {kv ? p.k.biases : nullptr, "k.biases"},
                                 {kv ? p.v.packed : nullptr, "v.packed"},
                                 {kv ? p.v.scales : nullptr, "v.scales"},
                                 {kv ? p.v.biases : nullptr, "v.biases"},
                                 {p.sinks, "sinks"},
                                 {kv ? p.bool_mask : nullptr, "bool_mask"},
                                 {kv ? p.float_mask : nullptr, "float_mask"},
                                 {kv ? p.k.layout.block_table : nullptr, "k.layout.block_table"},
                                 {kv ? p.v.layout.block_table : nullptr, "v.layout.block_table"},
                                 {p.kv_lens, "kv_lens"},
                                 {p.q_lens, "q_lens"},
                                 {p.workspace, "workspace"}},
                                &dev);
      !s)
    return s;
  DeviceGuard guard(dev);
  const auto stream = static_cast<cudaStream_t>(p.stream);

  DeviceFacts f;
  if (Status s = device_facts(dev, &f); !s) return s;
  const int pdl = p.pdl && f.cc_major >= 9 ? 1 : 0;  // (programmatic launches: sm_90 and newer)

  if (p.N == 0) {  // no key at all: out is zeros, written by the combine step with no splits
    AttnArgs a = make_args(p);
    a.num_splits = 0;
    a.pdl = pdl;
    if (cudaError_t e = cuda::combine_launch(a, stream); e != cudaSuccess)
      return cuda_status(e, "attention (combine kernel) launch");
    return make_status(StatusCode::ok, "", Backend::cuda);
  }

  AttnArgs a = make_args(p);
  a.pdl = pdl;
  const Plan plan = make_plan(a, f, allow_mma);
  if (!plan.use_mma && int64_t(a.num_splits) * a.B * a.Hkv * cuda::generic_row_tiles(a) > INT32_MAX)
    return error(StatusCode::unsupported,
                 "B * Hkv * ceil(Hq / Hkv * Lq / rows per block) (" + std::to_string(a.B * a.Hkv) + " * " +
                     std::to_string(cuda::generic_row_tiles(a)) + ") exceeds one launch of the CUDA backend");

  // The workspace, and with the library's own buffer its lock, held through the launches.
  std::unique_lock<std::mutex> lock;
  void* ws = p.workspace;
  if (ws) {
    if (p.workspace_bytes < plan.workspace)
      return error(StatusCode::invalid_argument,
                   "workspace_bytes (" + std::to_string(p.workspace_bytes) +
                       ") is smaller than attention_workspace_size() (" + std::to_string(plan.workspace) + ")");
  } else {
    lock = std::unique_lock<std::mutex>(ws_mutex);
    if (Status s = library_workspace(dev, stream, plan.workspace, &ws); !s) return s;
  }
  {
    const bool in_kernel = plan.use_mma && pick_merge(a, f, p);
    place_partials(a, ws, in_kernel, plan.use_mma && !in_kernel && combine_arrivals(a, !p.workspace || p.workspace_zeroed));
  }

  cudaError_t e = cudaSuccess;
#if QSDPA_HAVE_MMA
  if (plan.use_mma) {
#if QSDPA_MMA_TRACE
    trace_arm(a, stream);
#endif
    e = cuda::mma_launch(a, stream);
    if (e != cudaSuccess) return cuda_status(e, "attention (tensor-core kernel) launch");
    if (a.cluster || a.counters) {  // it wrote out
#if QSDPA_MMA_TRACE
      trace_dump(a, stream);
#endif
      return make_status(StatusCode::ok, "", Backend::cuda);
    }
  }
#endif
  if (!plan.use_mma) {
    e = cuda::generic_launch(a, stream);
    if (e != cudaSuccess) return cuda_status(e, "attention (generic kernel) launch");
  }
  e = cuda::combine_launch(a, stream);
  if (e != cudaSuccess) {
    // (counted arrivals: the attention kernel has counted its blocks, and no combine will set the
    // counts back to 0 for the next call on this workspace)
    if (a.arrivals) {
      cudaGetLastError();
      cudaMemsetAsync(a.arrivals, 0, cuda::kCounterBytes, stream);
    }
    return cuda_status(e, "attention (combine kernel) launch");
  }
#if QSDPA_MMA_TRACE
  if (plan.use_mma) trace_dump(a, stream);
#endif
  return make_status(StatusCode::ok, "", Backend::cuda);
}

}  // namespace

Status cuda_attention(const AttentionParams& p) { return run_attention(p, true); }

Status cuda_quantize(const QuantizeParams& p) {
  int dev = 0;
  if (Status s = check_pointers({{p.w, "w"}, {p.packed, "packed"}, {p.scales, "scales"}, {p.biases, "biases"}}, &dev);
      !s)
    return s;
  DeviceGuard guard(dev);
  if (cudaError_t e = cuda::quantize_launch(p, static_cast<cudaStream_t>(p.stream)); e != cudaSuccess)
    return cuda_status(e, "quantize kernel launch");
  return make_status(StatusCode::ok, "", Backend::cuda);
}

Status cuda_append(const AppendParams& p) {
  int dev = 0;
  if (Status s = check_pointers({{p.k, "k"},
                                 {p.v, "v"},
                                 {p.k_cache.packed, "k_cache.packed"},
                                 {p.k_cache.scales, "k_cache.scales"},
                                 {p.k_cache.biases, "k_cache.biases"},
                                 {p.v_cache.packed, "v_cache.packed"},
                                 {p.v_cache.scales, "v_cache.scales"},
                                 {p.v_cache.biases, "v_cache.biases"},
                                 {p.k_cache.layout.block_table, "k_cache.layout.block_table"},
                                 {p.v_cache.layout.block_table, "v_cache.layout.block_table"},
                                 {p.kv_lens, "kv_lens"}},
                                &dev);
      !s)
    return s;
  DeviceGuard guard(dev);
  if (cudaError_t e = cuda::append_launch(p, static_cast<cudaStream_t>(p.stream)); e != cudaSuccess)
    return cuda_status(e, "append kernel launch");
  return make_status(StatusCode::ok, "", Backend::cuda);
}

Status cuda_dequantize(const DequantizeParams& p) {
  int dev = 0;
  if (Status s = check_pointers({{p.packed, "packed"}, {p.scales, "scales"}, {p.biases, "biases"}, {p.w, "w"}}, &dev);
      !s)
    return s;
  DeviceGuard guard(dev);
  if (cudaError_t e = cuda::dequantize_launch(p, static_cast<cudaStream_t>(p.stream)); e != cudaSuccess)
    return cuda_status(e, "dequantize kernel launch");
  return make_status(StatusCode::ok, "", Backend::cuda);
}

}  // namespace qsdpa::detail

qsdpa::Status qsdpa::cuda::attention_generic_kernel(const AttentionParams& p) {
  return detail::run_attention(p, false);
}

bool qsdpa::cuda::uses_tensor_cores(const AttentionParams& p, bool sm90a) {
  qsdpa::cuda::AttnArgs a = detail::make_args(p);
  a.sm90a = sm90a ? 1 : 0;
  return detail::use_tensor_cores(a);
}

bool qsdpa::cuda::uses_tensor_cores(const AttentionParams& p) {
  detail::DeviceFacts f;
  return uses_tensor_cores(p, detail::current_device_facts(&f) && detail::runs_sm90a(f));
}

bool qsdpa::cuda::set_cluster_merge(bool on) { return detail::g_cluster_allowed.exchange(on); }

namespace {
// The merge attention(p) would take on a device with facts f (merge_of(p): the current device,
// now): 0 none (no device, no key or no tensor-core plan), 1 clusters, 2 in the attention kernel,
// 3 the combine kernel, 4 the combine kernel with counted arrivals.
int merge_of(const qsdpa::AttentionParams& p, const qsdpa::detail::DeviceFacts& f) {
  if (p.N == 0) return 0;
  qsdpa::cuda::AttnArgs a = qsdpa::detail::make_args(p);
  a.pdl = p.pdl && f.cc_major >= 9 ? 1 : 0;  // (as run_attention sets it)
  if (!qsdpa::detail::make_plan(a, f).use_mma) return 0;
  const bool in_kernel = qsdpa::detail::pick_merge(a, f, p);
  if (a.cluster) return 1;
  if (in_kernel) return 2;
  return qsdpa::detail::combine_arrivals(a, !p.workspace || p.workspace_zeroed) ? 4 : 3;
}

int merge_of(const qsdpa::AttentionParams& p) {
  qsdpa::detail::DeviceFacts f;
  return qsdpa::detail::current_device_facts(&f) ? merge_of(p, f) : 0;
}

// The tile pool attention(p) would take on a device with facts f (AttnArgs::pool: 0 none).
int pool_of(const qsdpa::AttentionParams& p, const qsdpa::detail::DeviceFacts& f) {
  if (p.N == 0) return 0;
  qsdpa::cuda::AttnArgs a = qsdpa::detail::make_args(p);
  return qsdpa::detail::make_plan(a, f).use_mma ? a.pool : 0;
}

// A described device for the planner's tests: `sms` multiprocessors of compute capability 9.0
// (sm90a) or 8.0.
qsdpa::detail::DeviceFacts described(int sms, bool sm90a) {
  qsdpa::detail::DeviceFacts f;
  f.sms = sms;
  f.cc_major = sm90a ? 9 : 8;
  f.cc_minor = 0;
  return f;
}
}  // namespace

int qsdpa::cuda::planned_merge(const AttentionParams& p, int sms, bool sm90a) {
  return sms < 1 ? 0 : merge_of(p, described(sms, sm90a));
}

bool qsdpa::cuda::uses_cluster_merge(const AttentionParams& p) { return merge_of(p) == 1; }

bool qsdpa::cuda::set_in_kernel_merge(bool on) { return detail::g_in_kernel_merge_allowed.exchange(on); }

bool qsdpa::cuda::set_combine_arrivals(bool on) { return detail::g_combine_arrivals.exchange(on); }

bool qsdpa::cuda::uses_in_kernel_merge(const AttentionParams& p) { return merge_of(p) == 2; }

bool qsdpa::cuda::uses_combine_arrivals(const AttentionParams& p) { return merge_of(p) == 4; }

int64_t qsdpa::cuda::set_merge_max_loads(int64_t loads) { return detail::g_merge_max_loads.exchange(loads); }

int qsdpa::cuda::set_block_pool(int mode) { return detail::g_pool_mode.exchange(mode); }

bool qsdpa::cuda::set_pool_cluster(bool on) { return detail::g_pool_cluster.exchange(on); }

bool qsdpa::cuda::set_pool_2bit(bool on) { return detail::g_pool_2bit.exchange(on); }

int qsdpa::cuda::planned_pool(const AttentionParams& p) {
  detail::DeviceFacts f;
  return detail::current_device_facts(&f) ? pool_of(p, f) : 0;
}

int qsdpa::cuda::planned_pool(const AttentionParams& p, int sms, bool sm90a) {
  return sms < 1 ? 0 : pool_of(p, described(sms, sm90a));
}

bool qsdpa::cuda::uses_block_pool(const AttentionParams& p) { return planned_pool(p) != 0; }

int qsdpa::cuda::planned_splits(const AttentionParams& p) {
  detail::DeviceFacts f;
  if (p.N == 0 || !detail::current_device_facts(&f)) return 0;
  qsdpa::cuda::AttnArgs a = detail::make_args(p);
  detail::make_plan(a, f);
  return a.num_splits;
}

bool qsdpa::cuda::uses_fixed_group(const AttentionParams& p, bool sm90a) {
#if QSDPA_HAVE_MMA
  qsdpa::cuda::AttnArgs a = detail::make_args(p);
  a.sm90a = sm90a ? 1 : 0;
  return cuda::mma_fixed_group(a);
#else
  (void)p, (void)sm90a;
  return false;
#endif
}

bool qsdpa::cuda::uses_rows_on_m(const AttentionParams& p, bool sm90a) {
#if QSDPA_HAVE_MMA
  qsdpa::cuda::AttnArgs a = detail::make_args(p);
  a.sm90a = sm90a ? 1 : 0;
  return cuda::mma_rowsm(a);
#else
  (void)p, (void)sm90a;
  return false;
#endif
}

bool qsdpa::cuda::set_rows_on_m(bool on) { return detail::g_rows_on_m.exchange(on); }

bool qsdpa::cuda::fixed_group_build() { return QSDPA_HAVE_MMA && QSDPA_HAVE_G64; }

bool qsdpa::cuda::packed_value_columns_built() {
#if defined(QSDPA_MMA_VPACK) && QSDPA_HAVE_MMA
  return QSDPA_MMA_VPACK != 0;
#else
  return false;
#endif
}

int qsdpa::cuda::tensor_core_layout(const AttentionParams& p) {
#if QSDPA_HAVE_MMA
  return cuda::mma_layout_kind(detail::make_args(p));
#else
  (void)p;
  return -1;
#endif
}
