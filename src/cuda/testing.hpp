// Test hooks of the CUDA backend (not part of the public API): the GPU tests hold the generic
// kernel to the SPEC also on the problems that the tensor-core kernel takes in normal use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qsdpa/qsdpa.hpp"

namespace qsdpa::cuda {

// attention() on Backend::cuda (arguments already checked) with the generic kernel, even where
// the tensor-core kernel applies. Uses the library's workspace when p.workspace is null.
Status attention_generic_kernel(const AttentionParams& p);

// Whether attention() on Backend::cuda would run the tensor-core kernel for p (tests check that
// the layouts they mean for it reach it): on the current device (none: as on one without sm_90a),
// or on a device that runs sm_90a code (sm90a) or not. (sm_90a matters for D = 512 alone: its
// instantiations exist for sm_90a only.)
bool uses_tensor_cores(const AttentionParams& p);
bool uses_tensor_cores(const AttentionParams& p, bool sm90a);

// Allows (true, the default) or forbids the tensor-core kernel's in-kernel merge of a row tile's
// splits through a thread-block cluster (sm_90; otherwise partials and the combine kernel), for
// the whole process; returns the previous setting. Tests run both paths.
bool set_cluster_merge(bool on);
// Whether attention(p) on Backend::cuda would merge in clusters on the current device now.
bool uses_cluster_merge(const AttentionParams& p);
// Allows (true, the default) or forbids the tensor-core kernel's in-kernel merge of the splits
// through counters in the workspace (AttnArgs::counters; otherwise the combine kernel) for the
// whole process; returns the previous setting. Whether attention(p) would take it now.
bool set_in_kernel_merge(bool on);
bool uses_in_kernel_merge(const AttentionParams& p);
// The merge attention(p) would take on a described device (none needed: `sms` multiprocessors of
// compute capability 9.0 (sm90a) or 8.0; host logic, for the planner's tests in CI): 0 none (no key
// or no tensor-core plan), 1 clusters, 2 in the attention kernel, 3 the combine kernel, 4 the
// combine kernel with counted arrivals. (Clusters and the blocks per SM are asked of the current
// device where there is one, so the splits, and with them the merge, may differ without a GPU.)
int planned_merge(const AttentionParams& p, int sms, bool sm90a);
// Turns on or off (the default: off, or QSDPA_COMBINE_ARRIVALS=1 in the environment) the counted
// arrivals for the combine kernel (AttnArgs::arrivals: with a programmatic launch and a zeroed
// workspace, each row of the combine waits for its own row tile's splits instead of the whole
// attention grid) for the whole process; returns the previous setting.
bool set_combine_arrivals(bool on);
// Whether attention(p) would take them now (the combine kernel, a programmatic launch: p.pdl on
// compute capability 9.0 or newer, a zeroed workspace).
bool uses_combine_arrivals(const AttentionParams& p);
// The most 16-byte loads of partial outputs per thread for which a plan merges in the kernel
// rather than in the combine kernel (the default 32, or 16 << QSDPA_MERGE_LOADS), for the whole
// process; returns the previous value.
int64_t set_merge_max_loads(int64_t loads);
// The tensor-core kernel's tile pool (AttnArgs::pool: blocks of 16 warps, or of 8, taking tiles
// from a counter in shared memory): 0 never, 1 (the default) on problems large enough, 2 wherever
// its instantiations fit (contiguous caches, g64 keys and values, D = 128, sm_90a: 4-bit with at
// most 8 query rows per KV head, or 2-bit f16) in blocks of 16 warps, 3 the same in blocks of 8,
// for the whole process; returns the previous mode. Whether attention(p) would take it now on the
// current device, and which (planned_pool: 0 none, 1 blocks of 16 warps, 2 blocks of 8).
int set_block_pool(int mode);
bool uses_block_pool(const AttentionParams& p);
int planned_pool(const AttentionParams& p);
// The same plan on a described device, none needed: `sms` multiprocessors of compute capability
// 9.0 (sm90a) or 8.0 (host logic; the tests of the planner's rules run in CI this way).
int planned_pool(const AttentionParams& p, int sms, bool sm90a);
// Allows (true, the default) or forbids (false) the tile pool's blocks of 16 warps to merge their
// splits in clusters (sm_90, where they fit as the cluster merge's rule takes them;
// uses_cluster_merge says whether attention(p) would); returns the previous setting.
bool set_pool_cluster(bool on);
// Lets (true, the default) or keeps (false) the planner's default choice (set_block_pool(1)) take
// the tile pool for 2-bit f16 caches; the forced modes take it either way. Returns the previous
// setting.
bool set_pool_2bit(bool on);
// The number of splits (token ranges merged by the combine) attention(p) would plan on the current
// device; 0 without a device or with N = 0.
int planned_splits(const AttentionParams& p);

// Which layout instantiation of the tensor-core kernel would read p's caches: 0 contiguous, 1 paged
// (one block table for K and V, pages of 32 tokens or more), 3 the same with 16-token pages, 2 any
// other layout; -1 when the tensor-core kernel does not take p (as on a device without sm_90a:
// D = 512, whose contiguous caches are layout 5, is -1 here).
int tensor_core_layout(const AttentionParams& p);

// Whether the tensor-core kernel would take its instantiations with the group size 64 as a
// constant for p, on a device that runs sm_90a code (sm90a) or not; false when the build has none
// (fixed_group_build() false: no sm_90a among the CUDA architectures).
bool uses_fixed_group(const AttentionParams& p, bool sm90a);
bool fixed_group_build();
// Whether the build compiled the packed form of the folded values (mma_kernel.cuh, kVPack:
// -DQSDPA_MMA_VPACK=1 among the CUDA flags; off by default), which the f16 D = 128 one-n-tile
// kernels with 2- or 4-bit values then take for blocks of at most 4 query rows.
bool packed_value_columns_built();
// Whether the tensor-core kernel would run p on its D = 512 kernel with the query rows on the mma's
// M dimension (mma_rowsm.cuh: f16, 4- or 8-bit keys and values of one width, groups of 64,
// contiguous caches, 9 to 16 query rows per KV head), on a device that runs sm_90a code (sm90a) or
// not; false when the build has no sm_90a.
bool uses_rows_on_m(const AttentionParams& p, bool sm90a);
// Turns that kernel on or off for the whole process (the default: QSDPA_MMA_ROWSM at build time,
// QSDPA_ROWSM=0 / 1 in the environment); returns the previous setting. Off, its calls run on the
// d-split kernel.
bool set_rows_on_m(bool on);

// Reads `bytes` of device memory at p (16-byte aligned, a whole number of 32-bit words) with the
// normal L2 policy on `stream` (a cudaStream_t), as the kernel before an attention call in a model
// (a GEMM reading its weights) would, and writes the wrapping sum of its 32-bit words to the
// (4-byte aligned) device word *sum (so that the reads happen, and can be checked). Asynchronous.
// For the bench's --cold-l2 (tools/exec.cpp).
Status read_through_l2(const void* p, size_t bytes, uint32_t* sum, void* stream);

// An experiment toward a two-pass path for D = 256 and 512 (logits_qk.cu; attention() does not
// use it; measured slower than the fused kernel, docs/PERF.md runs 109-110): the logits
// S[bh][t][r] = scale Σ_d q_{r,d} k̂_{t,d} of the (at most 16) query rows r of each KV head's
// group (row r: query head h * (Hq / Hkv) + r / Lq, position r % Lq) against every token t of a
// contiguous MLX-layout key cache: f16 q [B, Hq, Lq, D], keys packed 4- or 8-bit
// [B, Hkv, N, D * bits / 32] with f16 scales and biases [B, Hkv, N, D / 64] (groups of 64), S f32
// [B * Hkv][N][RS] with RS = 8 for at most 8 rows, else 16 (rows past the group's 0).
// Asynchronous on `stream` (a cudaStream_t).
struct LogitsQK {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* k_scales = nullptr;
  const void* k_biases = nullptr;
  float* s = nullptr;
  int B = 0, Hq = 0, Hkv = 0, Lq = 1, N = 0, D = 0, bits = 4;
  float scale = 1.0f;
  int tiles_per_warp = 0;  // 32-token tiles per warp of a block (0: the default, 4)
};
Status logits_qk(const LogitsQK& p, void* stream);
// The experiment's two passes (pv_slices.cu): logits_qk into the workspace, then per split of the
// tokens and 128-dim slice the softmax-weighted values, as wide as the keys (v packed [B, Hkv, N,
// D * bits / 32], f16 scales and biases as the keys'), then the splits merged into out (f16
// [B, Hq, Lq, D]). The SPEC's causal rule for Lq > 1; no mask, sinks or window; `splits` token
// ranges; the workspace holds two_pass_workspace_bytes(p, splits).
size_t two_pass_workspace_bytes(const LogitsQK& p, int splits);
Status two_pass_attention(const LogitsQK& p, const void* v, const void* v_scales, const void* v_biases, void* out,
                          void* workspace, int splits, void* stream);

}  // namespace qsdpa::cuda
