// The contract between the CUDA attention kernels and the split-K combine step.
//
// Every attention kernel processes, for one (sequence b, KV head) pair, a contiguous chunk of
// tokens ("split") for ALL query rows of the GQA group (rep = Hq / Hkv heads x Lq rows), and
// writes one partial online-softmax state per (split, query row):
//   m[split][row]        f32  running max of the visible logits in the chunk (-inf if none)
//   l[split][row]        f32  sum of exp(logit - m) over the chunk's visible keys (0 if none)
//   o[split][row][0..D)  f32  sum of exp(logit - m) * v_hat over the chunk (NOT divided by l)
// where row = (b * Hq + h) * Lq + i indexes [B, Hq, Lq] (whatever the strides of q and out). A
// row past its sequence's q_lens[b] sees no key (m = -inf): the combine writes it as zeros. The combine kernel merges the splits,
// adds the sink (an extra logit sinks[h] with a zero value vector), writes zeros when no key is
// visible, divides, and rounds to T once. The combine reads o[split][row] only where
// m[split][row] is finite, so a split with no visible key may leave its o unwritten.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/layout.hpp"
#include "qsdpa/qsdpa.hpp"

// 1 where the build has the tensor-core kernel's sm_90a instantiations with a constant group size
// (src/cuda/g64/, src/CMakeLists.txt).
#ifndef QSDPA_HAVE_G64
#define QSDPA_HAVE_G64 0
#endif

namespace qsdpa::cuda {

// Device-side view of AttentionParams (plain values, passed by value to kernels).
// -DQSDPA_MMA_TRACE=1: a diagnostic build whose tensor-core kernel records when each block starts,
// ends its token loop and ends (AttnArgs::trace), dumped by the host (backend.cu). Never for timing.
#ifndef QSDPA_MMA_TRACE
#define QSDPA_MMA_TRACE 0
#endif
// The in-kernel merge of at most 8 splits issues all of a thread's loads of o in one round, rather
// than a round per four elements (mma_kernel.cuh, merge_if_last). -DQSDPA_MMA_MERGE_BATCH=0: never,
// 1: in every kernel, 2 (the default): in the two-n-tile kernels (16 rows a block, Lq=4 at GQA 4)
// only. Measured on an H200 (2026-12-01, run 41, with the acq_rel arrival, mma_kernel.cuh): B=8
// N=32768 Lq=4 4-bit 120.3 -> 117.5 us; in every kernel it gained nothing at Lq=1 and cost D=256
// (whose splits merge in the combine kernel) 0.7-1.4 us through its kernels' register allocation.
#ifndef QSDPA_MMA_MERGE_BATCH
#define QSDPA_MMA_MERGE_BATCH 2
#endif

// The combine kernel reads the o of its first 64 splits in the same round as their (m, l), not
// after the max (combine.cu): 1 (the default), or 0 (o after the max, an invisible split's o read
// from the split attaining it). No read is of unwritten memory: the generic kernel then writes
// zeros as the o of rows that see no key, and the tensor-core kernel writes o in every split but
// those past a sequence's end (per-sequence lengths), which the combine kernel does not read.
// Measured on an H200 (2026-12-04, against 0 in the same run): D=256 4-bit 32.8 -> 31.5 us per call
// (run 87, 3 rounds; run 86: 33.1 -> 32.2; run 85, a first form: 32.8 -> 31.0), 8-bit within the
// noise (45.3 -> 45.6 in run 87, 46.1 -> 45.0 in run 86); not in the
// D = 512 kernel, where it was slower (combine.cu). The same in the tensor-core kernel's in-kernel
// merge (its first element's o for up to 16 splits loaded before the (m, l)) was slower in run 86
// (B=1 N=131072 4-bit 48.6 -> 49.7 us, Lq=4 4-bit +1.3) and was removed: a32373a holds it.
#ifndef QSDPA_COMBINE_ONE_ROUND
#define QSDPA_COMBINE_ONE_ROUND 1
#endif

// The tensor-core kernel's counted arrivals for the combine kernel (AttnArgs::arrivals): compiled in
// (1, the default) or out (0: a tuning knob; the planner then never sets them). The code changes
// the register allocation of some instantiations by a few registers even where it never runs.
#ifndef QSDPA_MMA_ARRIVALS
#define QSDPA_MMA_ARRIVALS 1
#endif

// Whether the D = 512 kernel with the query rows on the mma's M dimension (mma_rowsm.cuh) runs
// the calls it fits by default: 1, or 0 (they run the d-split kernel unless QSDPA_ROWSM=1 is in
// the environment or cuda::set_rows_on_m turns it on). QSDPA_ROWSM=0 in the environment turns it
// off in a build where it is on. 0: it passes the tests, but was measured slower than the d-split
// kernel (H100, 2026-12-06, run 94, 3 rounds in the same run: D=512 4-bit 74.1 against 57.7 us,
// 8-bit 73.2 against 65.0; docs/PERF.md).
#ifndef QSDPA_MMA_ROWSM
#define QSDPA_MMA_ROWSM 0
#endif

struct AttnArgs {
  const void* q;
  const uint32_t* k_packed;
  const void* k_scales;
  const void* k_biases;
  const uint32_t* v_packed;
  const void* v_scales;
  const void* v_biases;
  const float* sinks;
  const void* bool_mask;
  const void* float_mask;
  void* out;
  int64_t B, Hq, Hkv, Lq, N, D;
  int64_t window;
  float scale;  // resolved (never 0)
  int k_bits, k_group, v_bits, v_group;
  int bool_mask_u32;  // 1 when bool_mask holds u32, 0 for u8
  int dtype;          // DType as int
  int num_splits;     // token chunks per (b, kv head)
  int64_t chunk;      // tokens per split (a multiple of the kernel's token tile)
  // split-K partials (see above)
  float* part_m;
  float* part_l;
  float* part_o;
  // First token of split 0: split s covers [t_begin + s * chunk, t_begin + (s + 1) * chunk)
  // clipped to [0, N). Tokens before t_begin are outside every row's window, so a sliding window
  // does not pay for splits that see nothing. Every attention kernel honors it.
  int64_t t_begin;
  // Serving layouts (qsdpa.hpp): where the cache rows live, q / out / mask element strides, and
  // per-sequence lengths (nullptr: N and Lq; read through seq_kv_len / seq_q_len, which clamp).
  // `dense`: both caches are [B, Hkv, N] with nothing in between (the kernels' fast addressing).
  detail::RowMap kmap, vmap;
  detail::ElemMap qmap, omap, mmap;
  const int32_t* kv_lens;
  const int32_t* q_lens;
  int dense;
  int same_layout;  // K and V rows at the same places (one block-table lookup serves both)
  // 1: the splits of each (b, KV head, query-row tile) run as one thread-block cluster (sm_90)
  // and merge in the tensor-core kernel through distributed shared memory, which writes `out` as
  // the combine kernel would (no partials, no combine launch).
  int cluster;
  // The tensor-core kernel's tile pool, whose warps take the split's tiles from a counter in the
  // block's shared memory: 0 none; 1 blocks of 16 warps, one per multiprocessor (mmak::kContigPool,
  // with `cluster` mmak::kContigPoolCluster, where allowed: cuda::set_pool_cluster); 2 blocks of 8
  // warps, two per multiprocessor (mmak::kContigPoolPair, never with `cluster`). Set by the
  // planner before it asks for the kernel's occupancy.
  int pool;
  // 1: the device runs sm_90a code (compute capability 9.0): the tensor-core kernel may take its
  // instantiations with a constant group size (attention_mma.cu, fixed_group).
  int sm90a;
  // 1: launch as a programmatic dependent (AttentionParams::pdl on a device of compute capability
  // 9.0 or newer, set by run_attention alone; 0 from make_args); the kernels wait in
  // griddepcontrol.wait before touching memory either way.
  int pdl;
  int64_t plan_b;  // (host only) sequences the split planner assumes: B, or the batch's tokens / N
  // Non-null: the tensor-core kernel merges the splits itself. Each block counts its arrival in
  // counters[blockIdx.x] once its partials are written; the last of a row tile's splits merges
  // them and writes `out` as the combine kernel would, and sets the counter back to 0 (no combine
  // launch). The counters are zero before the call (the workspace's first kInKernelMergeSlots int32,
  // zero-filled once) and again after it.
  int* counters;
  // Non-null (the combine kernel launched as a programmatic dependent, a zeroed workspace; never
  // with `counters` or `cluster`): each block of the tensor-core kernel counts its arrival in
  // arrivals[blockIdx.x] once its partials are written, and the combine kernel's block of a query
  // row waits for its row tile's count to reach num_splits instead of for the end of the whole
  // attention grid (griddepcontrol.wait), so that rows whose splits are done merge while other row
  // tiles still stream. The last of a row tile's rows to be merged sets its count back to 0.
  // tile_rows: the tensor-core kernel's query rows per row tile (8 or 16).
  int* arrivals;
  int tile_rows;
  // 1: the calls that the D = 512 kernel with the rows on M fits run on it (mma_rowsm.cuh; set by
  // make_args from the process's setting: QSDPA_MMA_ROWSM, QSDPA_ROWSM, cuda::set_rows_on_m).
  int rowsm;
  // (host only) 1: AttentionParams::deterministic: the planner takes no tile pool (pool_wanted).
  int deterministic;
#if QSDPA_MMA_TRACE
  // (trace builds, -DQSDPA_MMA_TRACE=1: backend.cu) per block of the tensor-core kernel,
  // kTraceBlockWords u64 from index 4 + kTraceBlockWords (blockIdx.y * gridDim.x + blockIdx.x):
  // %globaltimer at its start, after its token loop (all warps) and at its end, then smid | (did the
  // in-kernel merge) << 32, then when each of its 4 warps left its own loop, then (thread 0) when
  // it had issued its partial stores and when its arrival's atomic returned (0: no in-kernel
  // merge), then thread 0's steps (mma_kernel.cuh, kTraceProlog ... kTraceBOps); [0], [1]:
  // gridDim.x, gridDim.y
  unsigned long long* trace;
#endif
};

// (trace builds) the u64 words of a block's record, and the blocks recorded (the first of the
// grid): see AttnArgs::trace
constexpr int kTraceBlockWords = 18;
constexpr int64_t kTraceMaxBlocks = 1 << 16;
// (trace builds) then the combine kernel's blocks (the first kTraceCombineBlocks), kTraceCombineWords
// u64 each from kTraceCombineBase + kTraceCombineWords blockIdx.x: %globaltimer when it was placed
// (before its wait), when its wait ended (the attention grid's end, or with arrivals its first row's
// row tile), at its end, then its smid, then (its first row) when the splits' (m, l) were in and
// their max reduced, and when the row's sum was complete (before its store)
constexpr int64_t kTraceCombineBlocks = 1 << 12;
constexpr int64_t kTraceCombineWords = 6;
constexpr int64_t kTraceCombineBase = 4 + kTraceBlockWords * kTraceMaxBlocks;

// The tensor-core kernel's token tile (one warp's 32 tokens), and the warps of a block of its tile
// pool (AttnArgs::pool 1: one block per multiprocessor; 2: two of kPoolPairWarps), for the planner.
constexpr int kPoolTileTokens = 32;
constexpr int kPoolBlockWarps = 16;
constexpr int kPoolPairWarps = kPoolBlockWarps / 2;

// Of the splits 0 .. S-1 of a sequence of n tokens, how many hold a token: split s covers
// [t_begin + s chunk, t_begin + (s + 1) chunk) clipped to n, and the tensor-core kernel's splits
// past the end (no token) write only their m and l, not o (the combine kernel in one round reads o
// from these alone: QSDPA_COMBINE_ONE_ROUND).
QSDPA_HD int splits_with_tokens(int64_t n, int64_t t_begin, int64_t chunk, int S) {
  if (n <= t_begin || S <= 0 || chunk <= 0) return 0;
  const int64_t k = (n - t_begin + chunk - 1) / chunk;
  return k < S ? int(k) : S;
}

// The workspace: kInKernelMergeSlots int32 counters first (at a fixed place, so that no call's
// partials overwrite another call's counters), then the partials (16-byte aligned).
constexpr int64_t kInKernelMergeSlots = 16384;
constexpr size_t kCounterBytes = size_t(kInKernelMergeSlots) * sizeof(int);
// The most splits the in-kernel merge takes (its weights, [rows of a tile][splits] f32, live in the
// kernel's shared memory); more go to the combine kernel.
constexpr int kInKernelMergeMaxSplits = 128;

// Workspace bytes for a given number of splits (the counters, then the partials).
inline size_t partials_bytes(int64_t rows, int64_t D, int num_splits) {
  const size_t s = size_t(num_splits) * size_t(rows);
  return kCounterBytes + s * sizeof(float) * (2 + size_t(D)) + 256;
}

}  // namespace qsdpa::cuda
