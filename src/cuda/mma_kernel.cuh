// The tensor-core attention kernel (f16 / bf16, 2-, 4- and 8-bit MLX caches; keys and values of one
// bit width, or 8-bit keys with 4-bit values, of one group size): one block of 4 warps per
// (b * Hkv, split, query-row tile). Each warp streams its own 32-token tiles (interleaved with the
// other warps') through a private cp.async ring, computes the logits of all query rows of the
// GQA group with mma (tokens on M, rows on N), keeps its own online softmax, accumulates Oᵀ with
// mma (head dims on M, rows on N), and the 4 warps merge into one split-K partial at the end
// (split_kv.cuh). The tile pool (kContigPool, kContigPoolPair) runs blocks of 16 warps instead,
// one per multiprocessor (or of 8, two per multiprocessor), whose warps take their tiles from a
// counter in shared memory. D = 512 is d-split instead (Shape below): the 4 warps stream the same tiles,
// 128 head dims each. mma_format.cuh says how packed words become mma operands.
//
// Why this shape: at full memory speed a 4-bit cache delivers ~32 elements per SM clock, and the
// CUDA cores issue ~128 lane-operations per SM clock, so unpacking and softmax must cost a few
// operations per element. K and V are each read once per block for every query row; integer
// codes go straight into the tensor cores; the per-group affine map is applied per token after
// the dot product; the softmax rescales lazily (only when a logit exceeds the running reference
// by more than kTau, 2^kTau bounding p).
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "mma_format.cuh"
#include "split_kv.cuh"

namespace qsdpa::cuda::mmak {

constexpr int kWarps = 4;
constexpr int kTileTokens = 32;                  // tokens per warp tile
constexpr int kBlockTokens = kWarps * kTileTokens;  // the dispatcher's chunk granularity
// Warps of a block of the tile-pool layout (kContigPool below): one block per multiprocessor.
constexpr int kPoolWarps = kPoolBlockWarps;
static_assert(kPoolTileTokens == kTileTokens, "the planner counts the pool's tiles");
constexpr float kTau = 8.0f;                     // lazy-rescale margin (log2 units): p <= 2^8
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Blocks per multiprocessor the register allocation must allow (__launch_bounds__): one n-tile of
// query rows with D <= 128 (dense caches, other layouts), and the wider instantiations (D = 256 or
// two n-tiles). Build-time knobs for tuning runs (-DQSDPA_MMA_MIN_BLOCKS=...); the defaults are
// the measured best (H200, 2026-12-01: 4 rather than 3 for dense caches, 126 registers and no
// spills: B=32 N=4096 4-bit 64.9 -> 57.5 us, headline 102.7 -> 101.2 us; 4 for the general-layout
// kernel too, though it spilled 16 bytes there: paged 64 4-bit 116.0 -> 114.3 us; 4 for the paged
// instantiations, 128 registers without spills).
#ifndef QSDPA_MMA_MIN_BLOCKS
#define QSDPA_MMA_MIN_BLOCKS 4
#endif
#ifndef QSDPA_MMA_MIN_BLOCKS_LAYOUT
#define QSDPA_MMA_MIN_BLOCKS_LAYOUT 4
#endif
#ifndef QSDPA_MMA_MIN_BLOCKS_WIDE
#define QSDPA_MMA_MIN_BLOCKS_WIDE 2
#endif
#ifndef QSDPA_MMA_MIN_BLOCKS_PAGED
#define QSDPA_MMA_MIN_BLOCKS_PAGED 4
#endif
constexpr int kMinBlocks = QSDPA_MMA_MIN_BLOCKS;
constexpr int kMinBlocksPaged = QSDPA_MMA_MIN_BLOCKS_PAGED;    // the same, paged caches (kPaged, kPaged16)
constexpr int kMinBlocksLayout = QSDPA_MMA_MIN_BLOCKS_LAYOUT;  // the same, the other layouts (kAny)

// The cache layouts an instantiation reads (template parameter LAYOUT), each with only its own
// row arithmetic compiled in (it costs registers and issue slots in the copy path):
//   kContig:  no block table, consecutive tokens in consecutive rows (the dense [B, Hkv, N], or a
//             capacity larger than N, or any head / batch strides mma_supports takes; K and V may
//             differ): a warp's tiles are a fixed number of rows apart;
//   kPaged:   one block table for K and V, pages of 32 tokens or more (a tile lies in one page):
//             one table entry per tile, read one tile ahead;
//   kPaged16: the same with 16-token pages: a tile is two pages, two entries read one tile ahead;
//   kAny:     the rest mma_supports takes (K and V in different layouts): both rows looked up for
//             every tile;
//   kContigCluster: kContig whose splits of a row tile run as one cluster and merge in the kernel
//             (AttnArgs::cluster);
//   kContigWide: kContig for D = 512 (d-split, Shape below: instantiations of their own);
//   kContigPool: kContig in blocks of kPoolWarps warps, one per multiprocessor, whose warps take
//             the split's tiles one at a time from a counter in the block's shared memory
//             (AttnArgs::pool): a warp that runs faster takes more tiles, so all the warps of
//             a multiprocessor end within about a tile of each other;
//   kContigPoolCluster: kContigPool whose splits of a row tile run as one cluster and merge in
//             the kernel (AttnArgs::pool 1 and AttnArgs::cluster);
//   kContigPoolPair: kContigPool in blocks of kPoolPairWarps warps, two per multiprocessor
//             (AttnArgs::pool 2: grids of up to twice as many row tiles as multiprocessors).
constexpr int kContig = 0, kPaged = 1, kAny = 2, kPaged16 = 3, kContigCluster = 4, kContigWide = 5,
              kContigPool = 6, kContigPoolCluster = 7, kContigPoolPair = 8;
// Whether a layout instantiation takes its tiles from the block's pool, and merges in a cluster.
__host__ __device__ constexpr bool is_pool(int layout) {
  return layout == kContigPool || layout == kContigPoolCluster || layout == kContigPoolPair;
}
__host__ __device__ constexpr bool is_cluster(int layout) {
  return layout == kContigCluster || layout == kContigPoolCluster;
}
// Warps per block of a layout instantiation.
__host__ __device__ constexpr int warps_of(int layout) {
  return layout == kContigPoolPair ? kPoolPairWarps : is_pool(layout) ? kPoolWarps : kWarps;
}
// The group size is a runtime value, so that group ends fall at runtime positions of the unrolled
// loops over 32-dim blocks. kFoldEveryBlock: the key logits fold the group scale in at the end of
// every block (more multiply-adds, no branch between the mma of different blocks); else only at
// group ends, behind a branch (measured on an H200, 2026-12-01, folding at every block: headline
// 4-bit 101.0 -> 99.6 us, D=256 8-bit 66.3 -> 57.0 us, Lq=4 4-bit 141.4 -> 133.1 us, no shape
// slower; reading the value scales of a new group by predicated loads instead of behind a branch
// spilled at 128 registers and was not run). A build-time knob for tuning runs.
#ifndef QSDPA_MMA_FOLD_EVERY_BLOCK
#define QSDPA_MMA_FOLD_EVERY_BLOCK 1
#endif
constexpr bool kFoldEveryBlock = QSDPA_MMA_FOLD_EVERY_BLOCK != 0;
// Values of 2 or 4 bits: their scale and bias pairs read at every 32-dim block (unconditionally,
// the same pairs again inside a group) rather than behind a branch at group starts. Measured on an
// H200 (2026-12-01, run 25, same run): D=256 48.0 -> 46.6 us (4-bit), Lq=4 132.7 -> 128.9, 2-bit
// 85.9 -> 84.7, headline 98.5 -> 98.8 (noise); at 8 bits it spilled 16 bytes and was 0.3 % slower,
// so 8-bit values keep the branch. A build-time knob for tuning runs.
#ifndef QSDPA_MMA_VSCALE_EVERY
#define QSDPA_MMA_VSCALE_EVERY 1
#endif
constexpr bool kVScaleEveryPiece = QSDPA_MMA_VSCALE_EVERY != 0;
// f16 values with their scale folded into the softmax weights (kVFold): instead of dequantizing
// every value pair (s n + z: lop3, add, fma per pair), the codes go to the mma bare (Fmt::vcodes:
// one lop3 per pair) and the weights of each token carry its group's scale: Oᵀ += codes · (p s)ᵀ,
// with p s split into hi + lo f16 pairs (two mma: p s to about 22 bits, so the scale's rounding
// does not grow with the codes' offset), and the biases as one more mma per 16 tokens:
// Σ_t p_t z_t for each row and group of the warp's dims (P as the A operand, Z as B). The
// accumulators then hold Σ p s 2^e n 2^-24 (the codes are subnormals, scaled per row by
// Fmt::vfactor), turned into Σ p v after the loop. e is a per-warp exponent that keeps p s 2^e
// inside f16's range for any scale: each tile checks its value scales (|s| 2^e < 2^7, so that
// p s 2^e < 2^15 with p <= 2^kTau), and a tile outside [2^-6, 2^7) moves e (and rescales the
// accumulators) as the softmax moves its reference. bf16 keeps the dequantizing path. Measured
// (2026-12-02, 2 interleaved rounds each, f16, us per call): on an H100 (run 55, everywhere
// against nowhere) the D <= 256 kernels were as fast or slower with it (headline 4-bit 115.5 /
// 115.1, 2-bit 82.5 / 79.3, D=256 46.7 / 46.5, Lq=4 134.1 / 127.7): ~70 fewer instructions per tile
// in the common path did not make them faster, and the second mma per d-tile lengthens the
// accumulators' chains. On an H200 (run 56, the d-split alone against nowhere): D=512 4-bit 69.6 /
// 71.7, 8-bit keys with 4-bit values 72.1 / 75.6, 2-bit 70.6 / 70.7, but 8-bit 76.2 / 74.3. On an
// H200 (run 59, 4-bit values with one n-tile against the d-split alone): D=256 4-bit 37.9 / 38.5,
// but the D = 128 kernels slower (B=32 N=4096 50.4 / 49.7, B=1 N=131072 50.4 / 50.1, headline
// 83.1 / 83.1), and (run 60) D=256 8-bit keys with 4-bit values slower (43.9 / 43.2). So 4 (the
// default) takes it for the d-split's 4-bit values and for D = 256 4-bit, 1 for the d-split's
// alone, 3 for 4-bit values with one n-tile, 2 everywhere, 0 nowhere (tuning knobs).
#ifndef QSDPA_MMA_VFOLD
#define QSDPA_MMA_VFOLD 4
#endif
__host__ __device__ constexpr bool vfold_for(int D, int BITS, int VBITS, int NT) {
  return QSDPA_MMA_VFOLD == 2 || (QSDPA_MMA_VFOLD == 1 && D == 512 && VBITS == 4) ||  // (D = 512: d_split below)
         (QSDPA_MMA_VFOLD == 3 && VBITS == 4 && NT == 1) ||
         (QSDPA_MMA_VFOLD == 4 && VBITS == 4 && (D == 512 || (D == 256 && BITS == 4)));
}
// kVFold with the weights' hi and lo halves in one mma (kVPack): a block of at most 4 query rows
// (a KV head's rows with one n-tile: GQA 4 with one query row, the bench's D = 128 shapes) leaves
// the n-tile's columns 4-7 unused. Their lanes (c >= 2 in the logits, g >= 4 in Pᵀ) take rows
// 0-3's logits (one shuffle per logit, right after the masks), so that they run rows 0-3's softmax
// bit for bit and hold rows 0-3's weights; as the B operand they carry the lo halves of p s where
// columns 0-3 carry the hi halves, and after the loop the lo columns' accumulators are added to
// the hi ones. So the values cost one lop3 per code pair and one mma per d-tile, where the
// dequantizing path takes lop3 + add + fma per pair and kVFold's two-mma form two mma (which made
// the D = 128 kernels slower, runs 55-59). The value scales are read once per group (the
// dequantizing path reads scales and biases at every 32-dim block). Compiled into the f16
// D = 128 one-n-tile instantiations with 2- or 4-bit values that do not fold already, next to
// the dequantizing path, which blocks of 5-8 rows keep (the choice is per block, at run time).
// Static count (sm_90a, scripts/sass_tile_path.py: the path a full 32-token tile takes, its copies
// included): the f16 2-bit kContigPoolCluster kernel 598 -> 547 warp instructions, 4-bit 649 ->
// 587. Off by default until a GPU run holds it to the tests and times it (-DQSDPA_MMA_VPACK=1).
#ifndef QSDPA_MMA_VPACK
#define QSDPA_MMA_VPACK 0
#endif
__host__ __device__ constexpr bool vpack_for(int D, int BITS, int VBITS, int NT) {
  return QSDPA_MMA_VPACK != 0 && D == 128 && NT == 1 && (VBITS == 2 || VBITS == 4) && !vfold_for(D, BITS, VBITS, NT);
}
// T, as a type that depends on I (for code under `if constexpr` on I inside a generic lambda)
template <int I, class T>
struct Dependent {
  using type = T;
};
constexpr int kVExpMin = -14, kVExpMax = 15;  // 2^e as an f16 normal
// f16 bits of 2^k (k >= -24; 2^15 at most, +inf above), and k from the bits of a normal 2^k
__host__ __device__ constexpr uint32_t f16_pow2_bits(int k) {
  return k > 15 ? 0x7c00u : k >= -14 ? uint32_t(k + 15) << 10 : k >= -24 ? 1u << (k + 24) : 0u;
}
__host__ __device__ constexpr int f16_pow2_exp(uint32_t bits) { return int((bits >> 10) & 31u) - 15; }
// kVFold: the warp's exponent e (vexp2, 2^e as an f16 pair) against a tile's value scales, of
// which this lane saw the largest magnitude amax (f16 bits): when |s| 2^e reaches 2^7 in some
// lane, or stays under 2^-6 in every lane, e moves so that the warp's max |s| 2^e lies in [4, 8)
// (within e's range): it returns true and sets f, the factor of the accumulators.
template <class Y>
__device__ __forceinline__ bool vexp_track(uint32_t amax, uint32_t& vexp2, float& f) {
  // (|s| 2^e as f16 bits against 2^7 and 2^-6; no move past the ends of e's range)
  const uint32_t scaled = Y::mul2(amax, vexp2) & 0xffffu;
  const bool big = scaled >= f16_pow2_bits(7) && vexp2 != f16_pow2_bits(kVExpMin) * 0x10001u;
  const bool small = scaled < f16_pow2_bits(-6) && vexp2 != f16_pow2_bits(kVExpMax) * 0x10001u;
  if (!(__any_sync(0xffffffffu, big) || __all_sync(0xffffffffu, small))) return false;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float mx = Y::to_f32(uint16_t(min(amax, 0x7bffu)));
  int ex = 0;
  if (mx > 0.0f) frexpf(mx, &ex);
  const int en = mx > 0.0f ? max(kVExpMin, min(kVExpMax, 3 - ex)) : kVExpMax;
  f = ldexpf(1.0f, en - f16_pow2_exp(vexp2));
  vexp2 = f16_pow2_bits(en) * 0x10001u;
  return true;
}

// The end of the block's token loop: the warps' states merge in shared memory, their o with the
// head dims swizzled against bank conflicts (osw in the kernel). 0: unswizzled (the form before
// 2026-12-02; a tuning knob). 2: the two-n-tile kernels too (their rows' o took 1.3 us (median;
// p90 2.4) from the loop's end to be in shared memory at Lq=4 4-bit, H200 trace, run 75).
#ifndef QSDPA_MMA_OSWIZZLE
#define QSDPA_MMA_OSWIZZLE 2
#endif
constexpr bool kOSwizzle = QSDPA_MMA_OSWIZZLE != 0;
// The warps' merged o read from shared memory and stored (partials, output, or the cluster's
// state) four head dims per thread, in 16-byte loads and stores (0: one dim per thread, the form
// before 2026-12-03). The H200 traces of run 75-76 had 1.8-1.9 us from the per-row step to the
// stores issued at Lq=4 and D=256 (16 dims per thread), 0.7 us at B=8 N=32768 8-bit (8); with
// this form (run 77) 0.6 and 0.8 us. Per call, 2 rounds against 0 in the same run: D=256 4-bit
// 34.2 -> 33.2 us, 8-bit 46.7 -> 45.4, D=512 66.7 -> 65.0 / 69.3 -> 68.2, Lq=4 106.4 -> 105.5, 2-bit
// 75.6 -> 74.9, B=32 N=4096 45.5 -> 45.0, the rest 0-0.4 us faster.
#ifndef QSDPA_MMA_EPI_VEC
#define QSDPA_MMA_EPI_VEC 1
#endif
constexpr bool kEpiVec = QSDPA_MMA_EPI_VEC != 0;
// A grid of one split that merges in the kernel (a.counters, gridDim.y == 1, no cluster): the
// block's merged state is the output, written from the epilogue (divided by the row's l, with its
// sink) instead of stored as a partial that the same block then reads back behind an atomic
// arrival. 0: through the partials (a tuning knob).
#ifndef QSDPA_MMA_DIRECT_OUT
#define QSDPA_MMA_DIRECT_OUT 1
#endif
constexpr bool kDirectOut = QSDPA_MMA_DIRECT_OUT != 0;
// The scale spans' partial last 16-byte piece (a tile whose span does not end at 16 bytes) is
// copied with cp.async and a source size below 16, which reads only those bytes. compute-sanitizer
// memcheck (CUDA 13.0) counts that as a 16-byte read, and reports it out of bounds where the span
// ends a buffer (found on an H200, 2026-12-02: B=2, N=33, 4 bytes of scales per token: 8 valid
// bytes at offset 256 of 264, copied by the second sequence's first tile, whose span of 32 tokens
// ends 4 bytes into that piece). A tile's pieces reach at most 15 bytes past its span, less than a
// tile's scales, so only the split's last two tiles can reach past its last scale. With
// QSDPA_MMA_SPAN_TAIL_SYNC=1 (the default) their partial pieces (one per span and tile) are read
// with 2-byte loads instead and stored zero-filled. Timed on an H200 (run 53, 2 rounds, the same
// run, with the test on the last tile alone, whose SASS differs from this one's in one constant):
// every shape within noise of the cp.async form (headline 85.2 against 85.7 us, Lq=4 117.8 both).
// A test on the piece's exact end instead (run 54) cost Lq=4 4-bit 2.6 us (120.4). 0: the cp.async
// form.
#ifndef QSDPA_MMA_SPAN_TAIL_SYNC
#define QSDPA_MMA_SPAN_TAIL_SYNC 1
#endif
constexpr bool kSpanTailSync = QSDPA_MMA_SPAN_TAIL_SYNC != 0;
// GC (template parameter): the group size as a compile-time constant (kGroupFixed), or 0 for the
// group size of the call. With a constant group the per-group offsets, masks and the positions of
// group ends are known to the compiler: the shared-memory addresses of the scales fold into the
// instructions, the repeated scale loads of one group merge, and the kernel keeps its loop
// invariants in registers instead of recomputing them (measured on an H200, 2026-12-01, run 26, the
// same tree built both ways: B=8 N=32768 4-bit 98.5 -> 91.3 us, D=256 46.8 -> 40.5, Lq=4 129.6 ->
// 116.4, paged 16 105.7 -> 98.1). The host takes it for groups of 64 with D = 128 or 256 on sm_90a
// (attention_mma.cu); every other call takes GC = 0.
constexpr int kGroupFixed = 64;
constexpr int kMinBlocksWide = QSDPA_MMA_MIN_BLOCKS_WIDE;
// The same for the d-split instantiations (D = 512, one n-tile: 163-168 registers, 3 blocks per SM
// by registers; a build-time knob for tuning runs: 3 with two n-tiles, 168 registers and 60-96
// bytes of spills, was measured slower, 88.8 -> 107.5 us, H200 run 31).
#ifndef QSDPA_MMA_MIN_BLOCKS_DSPLIT
#define QSDPA_MMA_MIN_BLOCKS_DSPLIT 2
#endif
constexpr int kMinBlocksDSplit = QSDPA_MMA_MIN_BLOCKS_DSPLIT;
// The d-split's copies of a tile (kDS > 1) in a branch of their own (-DQSDPA_MMA_DSPLIT_COPY=0: the
// form before 2026-12-06, shared with the other kernels): a full tile's 4 scale copies per lane
// without a test per token and at offsets known at compile time, the tile's addresses from a 32-bit
// tile count. ncu source counters of D=512 4-bit (H100, run 91) had ~125 instructions per warp and
// tile around its 12 copies (IMAD, ISETP, IADD3: 64-bit compares per token, selects, moves), ~20 %
// of the kernel's instructions. Measured on an H200 (2026-12-06, run 92, 3 rounds against 0 in the
// same run, medians): 21.07 M -> 19.82 M warp instructions; D=512 4-bit 59.5 -> 58.2 us, 8-bit 62.4 -> 60.4.
#ifndef QSDPA_MMA_DSPLIT_COPY
#define QSDPA_MMA_DSPLIT_COPY 1
#endif
constexpr bool kDSplitCopy = QSDPA_MMA_DSPLIT_COPY != 0;

// The L2 evict-first policy on the cache's copies, per instantiation (QSDPA_MMA_EVICT_FIRST, in
// mma_ptx.cuh: 0 none, 1 all, 2 all but the two kinds of kernel it made slower in run 96 (H100,
// the default sweep, 3 rounds against 0): 2-bit keys and values (+1.5 us) and D = 512 with 4-bit
// keys and values (+0.7 us), which then compile to run 96's code without it; 3 (the default since
// the thirtieth session) also not for D = 128 with 4-bit keys and values. Why 3: the first H200
// run of mode 2 (run 103, 2026-12-06) had every 4-bit D = 128 shape slower than run 92's build
// (evict-first nowhere; the only change to those kernels since): B=8 N=32768 80.3 -> 82.3 us,
// B=1 N=131072 48.5 -> 49.7, B=32 N=4096 44.9 -> 45.9, Lq=4 103.9 -> 108.6 (1.29x -> 1.32x of
// Lq=1), each at or past the top of its range over runs 77-92, while the 8-bit D = 128 shapes,
// D = 256 and D = 512 8-bit gained 0.5-2.7 us. Not yet timed against mode 2 in one H200 run; on
// the H100 (run 96) evict-first had made B=8 4-bit 2.0 us and Lq=4 4-bit 1.5 us faster, and on
// two H100s (runs 104-105, the default sweep) mode 2 was 0.5-1.6 us faster on those shapes, but
// the 8-bit D = 128 shapes, the same code in both modes, were 1.5-4 us apart as well: what a
// shape inherits from the sweep enters these comparisons (docs/PERF.md, runs 104-106), and the
// choice waits for a run with `qsdpa bench --cold-l2`. With it, on two H100s (runs 106 and 117,
// 2026-12-07/08, 3 rounds), mode 2 against 3: B=8 N=32768 4-bit -1.3 / -1.2 us, B=1 N=131072
// -0.7 / -0.8, B=32 N=4096 -0.7 / -0.6 (one n-tile), Lq=4 4-bit +0.5 / +1.2 (two n-tiles). Mode 4,
// a tuning variant not yet timed, is 2 for kernels of one n-tile (NT, 8 query rows per block) and
// 3 for the others: the side of each that the H100 favoured; the H200 decides the default.
__host__ __device__ constexpr bool evict_first_for(int D, int BITS, int VBITS, int NT = 1) {
  const bool four = BITS == 4 && VBITS == 4;
  return QSDPA_MMA_EVICT_FIRST == 1 ||
         (QSDPA_MMA_EVICT_FIRST >= 2 && !(BITS == 2 && VBITS == 2) && !(D == 512 && four) &&
          !(QSDPA_MMA_EVICT_FIRST == 3 && D == 128 && four) &&
          !(QSDPA_MMA_EVICT_FIRST == 4 && D == 128 && four && NT > 1));
}

// The block's first line of each of its six tensors prefetched into L2 before griddepcontrol.wait
// (contiguous caches): a tuning variant, 1, or 0 (the default: not compiled). Why: the traces put
// a block's first tile 2.6-3.0 us after its start even on an idle memory (H200, run 70), and a
// first load of a page may wait for its address translation (tools/experiments/first_touch_bench.cu
// measures that); a block placed early, in the previous call's tail, would take that wait there.
// Not the L2 prefetch of run 88, which asked for the split's first 1024 tokens and queued ahead of
// the grid's own loads: one line per tensor. Written 2026-12-07 and not yet run on a GPU; ptxas
// (CUDA 13.0, sm_90a) gives the pool's kernels other spills with it: the 2-bit ones 0 -> 12 bytes
// of spill stores (kContigPool and kContigPoolCluster), kContigPoolCluster's f16 4-bit 20 -> 8
// (loads 20 -> 24) and bf16 4-bit 8 -> 4 (loads 8 -> 20), kContigPool's 4-bit ones unchanged.
#ifndef QSDPA_MMA_TLB_WARM
#define QSDPA_MMA_TLB_WARM 0
#endif

// Head dims per warp: D = 512 splits the head dims over the 4 warps of a block (kDS, "d-split"),
// which then stream the same tiles, each its 128 dims of every row: the logits' partial sums meet
// in shared memory once per tile, and each warp keeps the Oᵀ of its own dims (the accumulators
// and q operands of 512 dims do not fit one warp's registers). Other head dims: one warp per tile.
constexpr int d_split(int D) { return D == 512 ? 4 : 1; }

// Keys of BITS bits, values of VBITS bits (the same group size), W warps per block.
template <class T, int BITS, int VBITS, int D, int NT, bool KDEN, int STAGES, int W = kWarps>
struct Shape {
  using F = Fmt<T, BITS, KDEN>;    // keys
  using FV = Fmt<T, VBITS, KDEN>;  // values
  static constexpr int kDS = d_split(D);      // warps per tile (d-split)
  static constexpr int kTG = W / kDS;         // warps (or d-split groups) streaming different tiles
  static constexpr int kDW = D / kDS;         // head dims of one warp
  static constexpr int kRBG = D * BITS / 8;   // bytes of one packed key row in memory
  static constexpr int kRBGV = D * VBITS / 8; // the same for a value row
  static constexpr int kRB = kDW * BITS / 8;    // bytes of a warp's part of a packed key row
  static constexpr int kC = kRB / 16;         // 16-byte pieces per key row part
  static constexpr int kRBV = kDW * VBITS / 8;  // the same for a value row
  static constexpr int kCV = kRBV / 16;
  static constexpr int kKS = kDW / 16;      // k-steps of Q·Kᵀ = d-tiles of Oᵀ
  static constexpr int kRT = 8 * NT;        // query rows per block
  static constexpr int kMT = kTileTokens / 16;
  static constexpr int kNGMax = D / 32;     // groups per row at most (group >= 32)
  static constexpr int kNGW = kDW / 32;     // groups of a warp's dims at most
  static constexpr int kNGP = kNGW < 2 ? 2 : kNGW;
  static constexpr int kNA = F::kOffsets ? 2 : 1;  // correction slots: biases (+ scales x offset)
  static constexpr int kNZ = (kNA * kNGP + 7) / 8;  // mma for the per-group corrections
  static constexpr int kSCB = (kTileTokens * kNGW * 2 + 15) / 16 * 16 + 16;  // one scale array
  static constexpr int kStage = kTileTokens * (kRB + kRBV) + 4 * kSCB;
  static constexpr int kPipe = W * STAGES * kStage;
  // the merge of the warps' states: m [kTG][kRT], l [kLW][kRT] (the merged l and m of a row go to
  // l[0] and l[1]: two slots at least), o [kTG][kRT][D]
  static constexpr int kLW = kTG < 2 ? 2 : kTG;
  static constexpr int kMerge = (kTG * kRT * (D + 1) + kLW * kRT) * 4;
  // d-split: the logits' partial sums of a tile, [2 tiles][kWarps][16 values][32 lanes] f32, in
  // the query rows' f32 copy (free once the q operands are in registers)
  static constexpr int kLogits = kMT * NT * 4;
  static constexpr int kRed = kDS > 1 ? 2 * W * kLogits * 32 * 4 : 0;
  static constexpr int kMain = kPipe > kMerge ? kPipe : kMerge;
  static constexpr int kQ = kRT * D * 4 + 2 * kRT * kNGMax * 4 + kRT * 4 + 2 * kRT * 8;
  static constexpr int kPool = W > kWarps ? 16 : 0;  // the tile pool's counter (kContigPool)
  static constexpr int kSmem = kMain + kQ + kPool;
  static_assert(kC >= 2 && (kC & (kC - 1)) == 0, "row pieces: a power of two, at least 2");
  static_assert(kCV >= 2 && (kCV & (kCV - 1)) == 0, "row pieces: a power of two, at least 2");
  static_assert(kStage % 16 == 0, "stages stay 16-byte aligned");
  static_assert(kRed <= kRT * D * 4, "the logits exchange fits the query rows' space");

};

// Swizzle of the 16-byte pieces of a row of C pieces: the 8 rows one ldmatrix phase reads (8
// consecutive tokens, same piece) land in 8 different bank groups. Invariant under token += 16.
__host__ __device__ constexpr int swz(int C, int t) {
  return C >= 8 ? (t & 7) : C == 4 ? ((t >> 1) & 3) : ((t >> 2) & 1);
}

// The swizzled stage offsets of the lane's pieces of a tile of rows of C pieces (piece
// i = lane + 32 k of the tile sits at byte 16 i of the rows in memory).
template <int C>
__device__ __forceinline__ void piece_offsets(int lane, uint32_t (&so)[C]) {
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const int i = lane + 32 * k;
    so[k] = uint32_t((i ^ swz(C, i / C)) << 4);
  }
}

// Copies the lane's pieces of one tile of rows (C pieces each) from p to the stage at dst: all of
// them (FULL), or those of the rows < left, the others zero-filled (a copy of 0 bytes reads
// nothing, from `zero`). RS: the bytes from one row to the next in memory (16 C, or more when the
// rows are parts of wider rows: d-split). HALF (a tile over two 16-token pages): pieces k >= C / 2
// (rows 16..31) are read from p2, the lane's first piece of the second page, instead.
template <int C, int RS, bool FULL, bool HALF = false, bool EF = (QSDPA_MMA_EVICT_FIRST != 0)>
__device__ __forceinline__ void copy_rows(uint32_t dst, const uint32_t (&so)[C], const uint8_t* p, const void* zero,
                                          int lane, int64_t left, const uint8_t* p2 = nullptr) {
#pragma unroll
  for (int k = 0; k < C; ++k) {
    constexpr int kStep = 32 / C * RS;  // bytes from piece k to piece k + 1 of a lane
    const uint8_t* src = HALF && k >= C / 2 ? p2 + kStep * (k - C / 2) : p + kStep * k;
    if constexpr (FULL) {
      cp_async16<EF>(dst + so[k], src, 16);
    } else {
      const bool in = (lane + 32 * k) / C < left;
      cp_async16<EF>(dst + so[k], in ? src : zero, in ? 16 : 0);
    }
  }
}

// A 4- or 8-byte asynchronous copy (zero-filled when !in, reading nothing).
template <int BYTES>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src, bool in) {
  static_assert(BYTES == 4 || BYTES == 8, "cp.async.ca: 4 or 8 bytes here");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES), "r"(in ? BYTES : 0)
               : "memory");
}

__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// Eight 16-bit elements from src: one 16-byte load where src is 16-byte aligned, else element by
// element (the query rows' pieces, which q's strides may leave unaligned).
__device__ __forceinline__ uint4 ldg_piece8(const uint16_t* src) {
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) return __ldg(reinterpret_cast<const uint4*>(src));
  uint16_t e[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = __ldg(src + j);
  return make_uint4(e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                    e[6] | uint32_t(e[7]) << 16);
}

// The power of two e that a query row of largest magnitude amax is scaled by before it becomes an
// mma operand (F::kPrescale formats: the row's top near 2^kT0; 0 for a zero or non-finite row).
template <class F>
__device__ __forceinline__ int prescale_exp(float amax) {
  int e = 0;
  if (F::kPrescale && amax > 0.0f && amax <= 3.0e38f) {
    int ex;
    frexpf(amax, &ex);
    e = max(-100, min(100, F::kT0 + 1 - ex));
  }
  return e;
}

// Query row r of a KV head's rep * Lq rows: head hl = r / Lq of the group and row i = r % Lq
// (no division in the common Lq = 1).
__device__ __forceinline__ int row_head(int r, int Lq, int& i) {
  const int hl = Lq == 1 ? r : r / Lq;
  i = r - hl * Lq;
  return hl;
}

// Splits merged in one cluster at most (the non-portable cluster size limit of sm_90).
constexpr int kMaxClusterSplits = 16;
// The cluster merge has instantiations of its own (layout kContigCluster): compiled into every
// kernel, its code cost the kernels that never take it 1-6 % (H200, 2026-12-01, against a build
// without it: B=8 N=32768 4-bit 100.9 -> 100.0 us, 8-bit 144.8 -> 143.1, D=256 4-bit 50.8 -> 47.7,
// Lq=4 138.4 -> 135.7). -DQSDPA_MMA_NO_CLUSTER_CODE leaves it out altogether (a tuning knob).
#ifdef QSDPA_MMA_NO_CLUSTER_CODE
constexpr bool kClusterCode = false;
#else
constexpr bool kClusterCode = true;
#endif
// The query rows' loads issued before the cache's first tiles, in the one-n-tile kernels
// (-DQSDPA_MMA_Q_FIRST=0: after them everywhere, as before; 2: in every kernel). H200 traces
// (2026-12-03, run 69, a block's steps): with the rows' loads behind the first tiles, a block had
// its query rows ready 4.5 us after its start at B=8 N=32768 and B=32 N=4096 (9.6 MB of first tiles
// in flight ahead of them), 2.8 us at B=1 N=4096; nothing of the token loop runs before. Loaded
// first (run 70, 2 rounds against 0): 2.6-2.7 us; B=8 N=32768 4-bit 81.9 -> 80.0 us per call, B=32
// N=4096 46.7 -> 45.0, B=1 N=131072 50.0 -> 48.5, 2-bit 77.5 -> 76.5, B=1 N=4096 8-bit in graphs of
// 10 10.5 -> 10.1; but the two-n-tile kernels (Lq=4, whose rows were ready only after 6.7-7.0 us
// either way) 110.7 -> 111.6, so those kept the order before. With their rows read in two 16-byte
// loads per thread (QSDPA_MMA_Q_VEC, run 74) loading first pays there too: run 75 (2 rounds against
// 1), Lq=4 4-bit 109.9 -> 108.8 us, 8-bit 146.3 -> 144.9; the one-n-tile shapes unchanged.
#ifndef QSDPA_MMA_Q_FIRST
#define QSDPA_MMA_Q_FIRST 2
#endif
// The two-n-tile kernels' query rows read in 16-byte pieces, a thread's pieces consecutive dims of
// one row, each row's largest magnitude and group sums reduced across its threads, all rows at once
// (kQVec below; -DQSDPA_MMA_Q_VEC=0: as the one-n-tile kernels, element by element, each warp
// reducing 4 rows one after another with 32-lane shuffles). H200 traces (2026-12-03, run 72, Lq=4
// 4-bit): the query rows were in shared memory 4.8 us after the block's start and their reductions
// took 2.0 us more, against 2.6 us for the whole of it in the one-n-tile kernels. Run 73 (16-byte
// loads, the reductions as before but one per group): 3.3 us and 1.9 us; Lq=4 f16 4-bit 111.5 ->
// 110.7 us per call, bf16 118.1 -> 115.9, 8-bit 148.3 -> 147.5, 3 rounds each. Run 74 (this form,
// 3 rounds against 0): rows ready 6.8 -> 3.6 us; Lq=4 f16 4-bit 112.1 -> 109.2 us, bf16 118.7 ->
// 114.6, 8-bit 148.5 -> 145.8, Lq=3 110.0 -> 107.9. 2 (the default since run 75): in every kernel
// whose rows' pieces fall evenly on all its threads, a row on at most 32 lanes (the 4-warp blocks of
// one n-tile at D = 128 and 256 too; not the pool's blocks of 16 warps; the d-split kernels by
// QSDPA_MMA_Q_VEC_DSPLIT below). Run 75 (2 rounds against 1): D=256 4-bit 37.2 -> 34.1 us, 8-bit 51.8 -> 46.5, 2-bit 76.9 -> 75.8, B=1
// N=4096 4-bit 12.4 -> 11.6, 8-bit 13.2 -> 12.6; the other shapes within 0.5 us. In the pool's
// blocks too (one piece per thread on their first 4 warps; run 76, 2 rounds): 1.4-3.3 us slower.
#ifndef QSDPA_MMA_Q_VEC
#define QSDPA_MMA_Q_VEC 2
#endif
// The same 16-byte row pieces in the d-split kernels (D = 512: 8 rows of 512 dims over 128 threads,
// 32 dims each, 16 lanes per row). H200 trace (2026-12-04, run 82, D=512 4-bit, element by element
// and each warp reducing its 2 rows one after another with 32-lane shuffles): the rows were in
// shared memory 5.2-6.4 us after the block's start and reduced 2.9-3.7 us later, so the token loop
// began 8.7-10 us into a 60 us call, with the cache's first tiles long in. 0: element by element.
#ifndef QSDPA_MMA_Q_VEC_DSPLIT
#define QSDPA_MMA_Q_VEC_DSPLIT 1
#endif

// (trace builds, -DQSDPA_MMA_TRACE=1) the words of a block's record (AttnArgs::trace) from
// kTraceWarp0: when warp w left its loop (kTraceWarp0 + w), when thread 0 had issued its partial
// stores (kTraceStores), when its arrival returned (kTraceArrival). Then thread 0's steps (0: not
// reached): kTraceProlog the query rows ready (the token loop's start), kTraceFirst warp 0's first
// tile in shared memory, kTraceOStored the warps' o stored (the barrier after it), kTraceRowStep the
// per-row step's barrier, kTraceMerge1 / kTraceMerge2 the merge's first steps (cluster merge: the
// first cluster barrier passed, the weights' barrier; in-kernel merge: the m and l loaded, the
// weights' barrier); inside the prologue, kTraceQIn the query rows' f32 copy in shared memory (their
// loads landed; kQVec kernels: thread 0's own pieces converted, no barrier) and kTraceBOps the mma
// B operands of the rows in thread 0's registers.
constexpr int kTraceWarp0 = 4, kTraceStores = kTraceWarp0 + kWarps, kTraceArrival = kTraceStores + 1;
constexpr int kTraceProlog = kTraceArrival + 1, kTraceFirst = kTraceProlog + 1, kTraceOStored = kTraceFirst + 1,
              kTraceRowStep = kTraceOStored + 1, kTraceMerge1 = kTraceRowStep + 1, kTraceMerge2 = kTraceMerge1 + 1,
              kTraceQIn = kTraceMerge2 + 1, kTraceBOps = kTraceQIn + 1;
static_assert(kTraceBOps < kTraceBlockWords, "a word per warp, the stores, the arrival, the steps");
#if QSDPA_MMA_TRACE
// (trace builds) this block's record, or null: no trace, or a block past kTraceMaxBlocks
__device__ __forceinline__ unsigned long long* trace_record(const AttnArgs& a) {
  const uint64_t blk = uint64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  return a.trace && blk < uint64_t(kTraceMaxBlocks) ? a.trace + 4 + kTraceBlockWords * blk : nullptr;
}
inline __device__ __noinline__ void trace_block(const AttnArgs& a, unsigned long long t0, unsigned long long t1, bool merged) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned long long t2 = global_ns();
  unsigned long long* e = trace_record(a);
  if (!e) return;
  e[0] = t0, e[1] = t1, e[2] = t2, e[3] = smid | (uint64_t(merged) << 32);
  if (blockIdx.x == 0 && blockIdx.y == 0) a.trace[0] = gridDim.x, a.trace[1] = gridDim.y;
}
#endif
// Thread 0 records word `w` of its block's record now (trace builds; nothing in the others).
__device__ __forceinline__ void trace_step([[maybe_unused]] const AttnArgs& a, [[maybe_unused]] int w) {
#if QSDPA_MMA_TRACE
  if (threadIdx.x == 0)
    if (unsigned long long* e = trace_record(a)) e[w] = global_ns();
#endif
}

// The in-kernel combine of a cluster (a.cluster): every block of the cluster holds its split's
// merged state of the tile's rows in shared memory at the same offsets, cm[row] (log2 units, -inf
// when the split sees no key), cl[row] and co[row][D] (co may be unwritten where cm is -inf).
// After a cluster barrier, each block takes every row's S (m, l) (one thread per row) and turns
// them, with the row's sink, into the weights w[row][s] of the splits' o (0 for a split that sees
// no key: its o is never read), in its own scratch space `wgt` ([kRT][kMaxClusterSplits]); then
// block r of S combines element pairs r * 128 + tid, stepping by S * 128, of the tile's nrows x D
// outputs from all S blocks' o, as combine.cu does, and writes them to out. A second cluster
// barrier keeps every block's shared memory alive until all reads are done.
template <int D, int RT, int W = kWarps>
__device__ __forceinline__ void cluster_combine(const AttnArgs& a, const float* cm, const float* cl, const float* co,
                                                float* wgt, int nrows, int r0, int64_t b, int64_t kvh, int rep,
                                                int Lq) {
  cluster_sync();
  trace_step(a, kTraceMerge1);
  const int rank = int(cluster_rank()), S = int(cluster_size()), tid = int(threadIdx.x);
  const uint32_t am = smem_addr(cm), al = smem_addr(cl), ao = smem_addr(co);
  const auto head_of = [&](int lr, int& i) { return kvh * rep + row_head(r0 + lr, Lq, i); };
  if (tid < nrows) {
    const int lr = tid;
    float ms[kMaxClusterSplits], ls[kMaxClusterSplits];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {  // all loads first: they are in flight together
      ms[s] = s < S ? ld_cluster_f32(am + uint32_t(lr * 4), uint32_t(s)) : -INFINITY;
      ls[s] = s < S ? ld_cluster_f32(al + uint32_t(lr * 4), uint32_t(s)) : 0.0f;
      mx = fmaxf(mx, ms[s]);
    }
    float denom = 0.0f;
    if (mx != -INFINITY && a.sinks) {  // (no visible key: zeros, with or without a sink)
      int i;
      const float sk = a.sinks[head_of(lr, i)] * kLog2e;
      mx = fmaxf(mx, sk);
      denom = ex2(sk - mx);
    }
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      ms[s] = ms[s] == -INFINITY ? 0.0f : ex2(ms[s] - mx);
      denom = fmaf(ms[s], ls[s], denom);
    }
    const float inv = mx == -INFINITY ? 0.0f : 1.0f / denom;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) wgt[lr * kMaxClusterSplits + s] = ms[s] * inv;
  }
  __syncthreads();
  trace_step(a, kTraceMerge2);
  for (int idx = rank * W * 32 + tid; idx < nrows * (D / 2); idx += S * W * 32) {
    const int lr = idx / (D / 2), d = 2 * (idx - lr * (D / 2));
    float2 os[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s)
      os[s] = s < S ? ld_cluster_f32x2(ao + uint32_t((lr * D + d) * 4), uint32_t(s)) : make_float2(0.0f, 0.0f);
    float r0v = 0.0f, r1v = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const float w = wgt[lr * kMaxClusterSplits + s];
      if (w != 0.0f) {  // (a split with no visible key may have left its o unwritten)
        r0v = fmaf(w, os[s].x, r0v);
        r1v = fmaf(w, os[s].y, r1v);
      }
    }
    int i;
    const int64_t h = head_of(lr, i);
    const int64_t o = a.omap.at(b, h, i) + d;
    store_t(a.out, a.dtype, o, r0v);
    store_t(a.out, a.dtype, o + 1, r1v);
  }
  cluster_sync();
}


// The in-kernel merge's arrival, two ways: sequentially consistent fences (__threadfence,
// MEMBAR.SC.GPU in SASS) in every thread before it and after it, with a relaxed atomicAdd; or the
// block's barrier, one atom.add.acq_rel.gpu by thread 0 (release: the block's partial stores
// before the barrier; acquire: the other splits', before their arrivals), then the barrier again,
// as a grid barrier of release / acquire semantics does. -DQSDPA_MMA_FENCE_ACQREL=0: fences
// everywhere, 1: acq_rel everywhere, 2 (the default): acq_rel in the two-n-tile kernels (RT = 16)
// only. Measured on an H200 (2026-12-01, run 41, with MERGE_BATCH below, 2 rounds): B=8 N=32768
// Lq=4 4-bit 120.3 -> 117.5 us, 8-bit 154.5 -> 154.6; everywhere (1), the Lq=1 shapes gained
// nothing beyond noise and D=256, which merges in the combine kernel, lost 0.7-1.4 us (the merge's
// code changed its kernels' register allocation).
#ifndef QSDPA_MMA_FENCE_ACQREL
#define QSDPA_MMA_FENCE_ACQREL 2
#endif

// The in-kernel merge of the splits (a.counters non-null; split_kv.cuh), called by every thread of
// the block once its share of the block's partials (part_m, part_l, part_o of the tile's nrows
// rows) is stored. The block counts its arrival in counters[blockIdx.x]; the last of the
// gridDim.y splits to arrive sets the counter back to 0 and merges the partials as the combine
// kernel does (combine.cu: the splits' weights exp(m_s - max), the row's sink, zeros where no key
// is visible, one division, one rounding to T), in `scratch` (shared memory: 16 bytes, then
// [RT][S] m (turned into weights in place) and l, then RT (1 / denominator, split attaining the
// max) pairs). The partials are read from L2 (ld.cg): other multiprocessors wrote them, and the
// L1 of this one does not see their stores. It sits on the critical path of the call (the last
// row tile's last split), so its loads go out in few rounds: all (m, l) at once, then all o
// (the host takes it only when that is a few loads per thread: in_kernel_merge, backend.cu).
// The arrival (below): whether this block is the row tile's last split to arrive (then it merges).
template <int RT>
__device__ __forceinline__ bool arrive_last(const AttnArgs& a, float* scratch) {
  const int tid = int(threadIdx.x), S = int(gridDim.y);
  int* last = reinterpret_cast<int*>(scratch);
  constexpr bool kAcqRel = QSDPA_MMA_FENCE_ACQREL == 1 || (QSDPA_MMA_FENCE_ACQREL == 2 && RT >= 16);
  if constexpr (!kAcqRel) __threadfence();  // this thread's partials are visible on the device before the arrival is
  __syncthreads();
  if (tid == 0) {
    int before;
    if constexpr (kAcqRel)
      asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;\n"
                   : "=r"(before)
                   : "l"(a.counters + blockIdx.x)
                   : "memory");
    else
      before = atomicAdd(a.counters + blockIdx.x, 1);
    *last = before == S - 1;
    if (before == S - 1) a.counters[blockIdx.x] = 0;  // (all splits arrived: zero for the next call)
    trace_step(a, kTraceArrival);  // (its atomic returned)
  }
  __syncthreads();
  if (!*last) return false;
  if constexpr (!kAcqRel) __threadfence();  // (the other splits' partials, behind their arrivals)
  return true;
}

// The arrival alone (a.arrivals: the combine kernel merges, row tile by row tile as their splits
// arrive; combine.cu): every thread's partial stores are visible on the device before the count.
__device__ __forceinline__ void arrive_count(const AttnArgs& a) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(a.arrivals + blockIdx.x, 1);
    trace_step(a, kTraceArrival);
  }
}

template <int RT, int W = kWarps>
__device__ __forceinline__ void merge_if_last(const AttnArgs& a, float* scratch, int nrows, int r0, int64_t b,
                                              int64_t kvh, int rep, int Lq) {
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, S = int(gridDim.y), D = int(a.D);
  if (!arrive_last<RT>(a, scratch)) return;
  const int64_t rows_total = a.B * a.Hq * a.Lq;
  float* wm = scratch + 4;                        // [RT][S] m, then the weights
  float* wl = wm + RT * S;                        // [RT][S] l
  float* rinv = wl + RT * S;                      // [RT] 1 / denominator, 0: no key visible
  int* rarg = reinterpret_cast<int*>(rinv + RT);  // [RT] a split attaining the max
  const auto row_of = [&](int lr, int64_t& h, int& i) {
    h = kvh * rep + row_head(r0 + lr, Lq, i);
    return (b * a.Hq + h) * a.Lq + i;
  };
  for (int idx = tid; idx < nrows * S; idx += W * 32) {
    const int lr = idx / S, sp = idx - lr * S;
    int64_t h;
    int i;
    const int64_t at = int64_t(sp) * rows_total + row_of(lr, h, i);
    wm[idx] = __ldcg(a.part_m + at);
    wl[idx] = __ldcg(a.part_l + at);
  }
  __syncthreads();
  trace_step(a, kTraceMerge1);
  // Per row, one warp: lanes over the splits.
  for (int lr = warp; lr < nrows; lr += W) {
    int64_t h;
    int i;
    row_of(lr, h, i);
    float mx = -INFINITY;  // (a NaN m is never the max, as with fmaxf)
    int arg = 0;
    for (int sp = lane; sp < S; sp += 32) {
      const float v = wm[lr * S + sp];
      if (v > mx) mx = v, arg = sp;
    }
    warp_max_arg(mx, arg);
    const float m_all = mx;  // -inf: no key visible (zeros, with or without a sink)
    if (m_all != -INFINITY && a.sinks) mx = fmaxf(mx, a.sinks[h]);
    float denom = 0.0f;
    for (int sp = lane; sp < S; sp += 32) {
      const float ms = wm[lr * S + sp];
      const float w = ms == -INFINITY || m_all == -INFINITY ? 0.0f : expf(ms - mx);
      denom = fmaf(w, wl[lr * S + sp], denom);
      wm[lr * S + sp] = w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, off);
    if (lane == 0) {
      if (m_all != -INFINITY && a.sinks) denom += expf(a.sinks[h] - mx);
      rinv[lr] = m_all == -INFINITY ? 0.0f : 1.0f / denom;
      rarg[lr] = arg;
    }
  }
  __syncthreads();
  trace_step(a, kTraceMerge2);
  // Four consecutive elements of a row per thread: 16-byte loads of every split's o, 8 splits per
  // round (a split with no visible key, weight 0, may have left its o unwritten: split arg's is
  // read in its place).
  const int D4 = D / 4;
  // The batch merge (QSDPA_MMA_MERGE_BATCH, split_kv.cuh): up to 8 splits and kEB elements per
  // thread, every load in one round, then the sums and stores. The loop below takes one element
  // per round trip: 4 for 16 rows of 128 dims (Lq=4), ~1 us each under load.
  constexpr bool kBatch = QSDPA_MMA_MERGE_BATCH == 1 || (QSDPA_MMA_MERGE_BATCH == 2 && RT >= 16);
  constexpr int kEB = RT >= 16 ? 4 : 2;  // (4 x 8 float4 fit the two-n-tile kernels' registers)
  if (kBatch && S <= 8 && nrows * D4 <= kEB * W * 32) {
    float4 ob[kEB][8];
    float wb[kEB][8], invb[kEB];
    int64_t outb[kEB];  // (the element's first output)
#pragma unroll
    for (int e = 0; e < kEB; ++e) {
      const int idx = tid + e * W * 32;
      const bool ok = idx < nrows * D4;
      const int lr = ok ? idx / D4 : 0, d = ok ? 4 * (idx - lr * D4) : 0;
      int64_t h;
      int i;
      const int64_t row = row_of(lr, h, i);
      invb[e] = rinv[lr];
      outb[e] = a.omap.at(b, h, i) + d;
      const bool live = ok && invb[e] != 0.0f;
      const int arg = rarg[lr];
      const float* po = a.part_o + row * D + d;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        wb[e][k] = live && k < S ? wm[lr * S + k] : 0.0f;
        // (weight 0: the split may have left its o unwritten; split arg's is read in its place)
        ob[e][k] = live && k < S ? __ldcg(reinterpret_cast<const float4*>(
                                       po + (int64_t(wb[e][k] != 0.0f ? k : arg) * rows_total) * D))
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int e = 0; e < kEB; ++e) {
      if (tid + e * W * 32 >= nrows * D4) continue;
      const float inv = invb[e];
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        acc.x = fmaf(wb[e][k], ob[e][k].x, acc.x), acc.y = fmaf(wb[e][k], ob[e][k].y, acc.y);
        acc.z = fmaf(wb[e][k], ob[e][k].z, acc.z), acc.w = fmaf(wb[e][k], ob[e][k].w, acc.w);
      }
      acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
      store4_t(a.out, a.dtype, outb[e], acc);
    }
    return;
  }
  for (int idx = tid; idx < nrows * D4; idx += W * 32) {
    const int lr = idx / D4, d = 4 * (idx - lr * D4);
    int64_t h;
    int i;
    const int64_t row = row_of(lr, h, i);
    const float inv = rinv[lr];
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (inv != 0.0f) {
      const int arg = rarg[lr];
      const float* po = a.part_o + row * D + d;
      for (int s0 = 0; s0 < S; s0 += 8) {
        float4 o[8];
        float w[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int sp = s0 + k < S ? s0 + k : arg;
          w[k] = s0 + k < S ? wm[lr * S + sp] : 0.0f;
          o[k] = __ldcg(reinterpret_cast<const float4*>(po + (int64_t(w[k] != 0.0f ? sp : arg) * rows_total) * D));
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc.x = fmaf(w[k], o[k].x, acc.x), acc.y = fmaf(w[k], o[k].y, acc.y);
          acc.z = fmaf(w[k], o[k].z, acc.z), acc.w = fmaf(w[k], o[k].w, acc.w);
        }
      }
      acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    }
    // (the same as store4_t, written out: with the call, the register allocation of every
    // kernel's token loop changed (SASS), a change not yet timed on a GPU)
    const int64_t o = a.omap.at(b, h, i) + d;
    if (a.dtype == kF32 && (reinterpret_cast<uintptr_t>(static_cast<float*>(a.out) + o) & 15) == 0) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + o) = acc;
    } else {
      store_t(a.out, a.dtype, o, acc.x);
      store_t(a.out, a.dtype, o + 1, acc.y);
      store_t(a.out, a.dtype, o + 2, acc.z);
      store_t(a.out, a.dtype, o + 3, acc.w);
    }
  }
}

// The epilogue of the two-n-tile kernels in compact form (QSDPA_MMA_COMPACT_EPI, default on): the
// partials' row of each query row found once per row, not once per element, and the in-kernel
// merge below. Measured before it (H200, 2026-12-03, run 62, ncu source counters of B=8 N=32768
// Lq=4 4-bit): the partial stores took 1292 warp instructions per warp (a division by Lq and 64-bit
// index arithmetic per element), and the merge of the last split, ~45 KB of straight-line SASS
// run once (8 splits x 4 elements unrolled, 64-bit index arithmetic per load, the output type
// chosen at run time per store), waited mostly on instruction fetch: the traces of run 59 put
// 5.3 us between a block's loop end and its last partial store and ~9 us in the merge of the
// call's last block.
#ifndef QSDPA_MMA_COMPACT_EPI
#define QSDPA_MMA_COMPACT_EPI 1
#endif
constexpr bool kCompactEpi = QSDPA_MMA_COMPACT_EPI != 0;

// Four consecutive outputs of type T (f16 or bf16) from element i: one 8-byte store where aligned.
template <class T>
__device__ __forceinline__ void store4_out(void* out, int64_t i, float4 v) {
  uint16_t* p = static_cast<uint16_t*>(out) + i;
  const uint32_t lo = Ty<T>::pack(v.x, v.y), hi = Ty<T>::pack(v.z, v.w);
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  } else {
    p[0] = uint16_t(lo), p[1] = uint16_t(lo >> 16), p[2] = uint16_t(hi), p[3] = uint16_t(hi >> 16);
  }
}

// merge_if_last in compact form (the two-n-tile kernels, kCompactEpi): the same arithmetic (the
// splits' weights exp(m_s - max) with the row's sink, zeros where no key is visible, Σ_s w_s o_s
// in split order, times 1 / denominator, one rounding to T), with T and D as constants, each row's
// partial index and output offset found once (by the thread that loads its first split's m and
// l), one thread per row for the weights (the splits are few here: the host takes the in-kernel
// merge for at most 32 loads of o per thread, in_kernel_merge), and every load of o of a round in
// flight at once (splits in rounds of 8). A split with weight 0 (no visible key) may have left its
// o unwritten: it is not read. Scratch: 16 bytes, then [RT] partial rows and [RT] output offsets
// (int64), [RT][S] m (then the weights) and l, [RT] 1 / denominator.
template <class T, int D, int RT, int W>
__device__ __forceinline__ void merge_if_last_compact(const AttnArgs& a, float* scratch, int nrows, int r0, int64_t b,
                                                      int64_t kvh, int rep, int Lq) {
  if (!arrive_last<RT>(a, scratch)) return;
  const int tid = int(threadIdx.x), S = int(gridDim.y);
  const int64_t rows_total = a.B * a.Hq * a.Lq;
  int64_t* prow = reinterpret_cast<int64_t*>(scratch + 4);  // [RT]
  int64_t* orow = prow + RT;                                 // [RT]
  float* wm = reinterpret_cast<float*>(orow + RT);           // [RT][S]
  float* wl = wm + RT * S;                                   // [RT][S]
  float* rinv = wl + RT * S;                                 // [RT]
  for (int idx = tid; idx < nrows * S; idx += W * 32) {
    const int lr = idx / S, sp = idx - lr * S;
    int i;
    const int64_t h = kvh * rep + row_head(r0 + lr, Lq, i), row = (b * a.Hq + h) * a.Lq + i;
    wm[idx] = __ldcg(a.part_m + int64_t(sp) * rows_total + row);
    wl[idx] = __ldcg(a.part_l + int64_t(sp) * rows_total + row);
    if (sp == 0) prow[lr] = row, orow[lr] = a.omap.at(b, h, i);
  }
  __syncthreads();
  trace_step(a, kTraceMerge1);
  if (tid < nrows) {
    const int lr = tid;
    float mx = -INFINITY;  // (a NaN m is never the max, as with fmaxf)
    for (int sp = 0; sp < S; ++sp) mx = fmaxf(mx, wm[lr * S + sp]);
    const float m_all = mx;  // -inf: no key visible (zeros, with or without a sink)
    float sink = 0.0f;
    if (m_all != -INFINITY && a.sinks) {
      int i;
      sink = a.sinks[kvh * rep + row_head(r0 + lr, Lq, i)];
      mx = fmaxf(mx, sink);
    }
    float denom = 0.0f;
    for (int sp = 0; sp < S; ++sp) {
      const float ms = wm[lr * S + sp];
      const float w = ms == -INFINITY || m_all == -INFINITY ? 0.0f : expf(ms - mx);
      denom = fmaf(w, wl[lr * S + sp], denom);
      wm[lr * S + sp] = w;
    }
    if (m_all != -INFINITY && a.sinks) denom += expf(sink - mx);
    rinv[lr] = m_all == -INFINITY ? 0.0f : 1.0f / denom;
  }
  __syncthreads();
  trace_step(a, kTraceMerge2);
  constexpr int D4 = D / 4, kEB = RT * D4 / (W * 32) < 1 ? 1 : RT * D4 / (W * 32);
  const int64_t stride = rows_total * D;  // from one split's partials to the next
  for (int base = tid; base < nrows * D4; base += kEB * W * 32) {
    float4 acc[kEB];
#pragma unroll
    for (int e = 0; e < kEB; ++e) acc[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < S; s0 += 8) {
      float4 ob[kEB][8];
      float wb[kEB][8];
#pragma unroll
      for (int e = 0; e < kEB; ++e) {
        const int idx = base + e * W * 32, lr = idx / D4, d = 4 * (idx - lr * D4);
        const bool ok = idx < nrows * D4;
        const float* po = a.part_o + (ok ? prow[lr] : 0) * D + d;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          wb[e][k] = ok && s0 + k < S ? wm[lr * S + s0 + k] : 0.0f;
          ob[e][k] = wb[e][k] != 0.0f ? __ldcg(reinterpret_cast<const float4*>(po + (s0 + k) * stride))
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
#pragma unroll
      for (int e = 0; e < kEB; ++e)
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc[e].x = fmaf(wb[e][k], ob[e][k].x, acc[e].x), acc[e].y = fmaf(wb[e][k], ob[e][k].y, acc[e].y);
          acc[e].z = fmaf(wb[e][k], ob[e][k].z, acc[e].z), acc[e].w = fmaf(wb[e][k], ob[e][k].w, acc[e].w);
        }
    }
#pragma unroll
    for (int e = 0; e < kEB; ++e) {
      const int idx = base + e * W * 32, lr = idx / D4, d = 4 * (idx - lr * D4);
      if (idx >= nrows * D4) continue;
      const float inv = rinv[lr];
      store4_out<T>(a.out, orow[lr] + d, make_float4(acc[e].x * inv, acc[e].y * inv, acc[e].z * inv, acc[e].w * inv));
    }
  }
}

// The same for a split that sees no token (the early exit of attention_kernel), out of line: a
// second inlined copy of the merge made every kernel ~1200 instructions longer, in front of its
// token loop. (`a` points to the kernel's parameter, __grid_constant__: no copy.)
// -DQSDPA_MMA_MERGE_COLD_INLINE=1 inlines it again (a tuning knob).
#ifndef QSDPA_MMA_MERGE_COLD_INLINE
#define QSDPA_MMA_MERGE_COLD_INLINE 0
#endif
template <int RT, int W = kWarps>
__device__ __noinline__ void merge_if_last_cold(const AttnArgs* a, float* scratch, int nrows, int r0, int64_t b,
                                                int64_t kvh, int rep, int Lq) {
  merge_if_last<RT, W>(*a, scratch, nrows, r0, b, kvh, rep, Lq);
}

#if QSDPA_MMA_TLB_WARM
// Before griddepcontrol.wait (QSDPA_MMA_TLB_WARM): thread t < 6 prefetches into L2 the first line
// of the block's split in K, V and the four scale and bias tensors of a contiguous cache, from the
// arguments alone (nothing the previous kernel writes is read), rows inside [0, N). Not inlined, so
// that its arithmetic stays out of the kernel's own (common subexpressions hoisted above the wait
// changed the token loop's register allocation: spills in 6 of the pool's 9 kernels).
__device__ __noinline__ void tlb_warm(const AttnArgs* ap, int rtile, int rbg, int rbgv, int d, int gc) {
  const AttnArgs& a = *ap;
  const int64_t rt = (a.Hq / a.Hkv * a.Lq + rtile - 1) / rtile;
  const int64_t bh = int64_t(blockIdx.x) / rt, b = bh / a.Hkv, h = bh - b * a.Hkv;
  const int64_t t0 = a.t_begin + int64_t(blockIdx.y) * a.chunk;
  if (t0 >= a.N) return;
  const int t = int(threadIdx.x);
  const int64_t krow = b * a.kmap.batch_stride + h * a.kmap.head_stride + t0;
  const int64_t vrow = b * a.vmap.batch_stride + h * a.vmap.head_stride + t0;
  const int64_t sb = int64_t(d / (gc ? gc : a.k_group)) * 2;  // scale bytes per row
  const void* base = t == 0 ? a.k_packed : t == 1 ? a.v_packed : t == 2 ? a.k_scales
                     : t == 3 ? a.k_biases : t == 4 ? a.v_scales : a.v_biases;
  const int64_t off = t == 0 ? krow * rbg : t == 1 ? vrow * rbgv : (t < 4 ? krow : vrow) * sb;
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(static_cast<const uint8_t*>(base) + off));
}
#endif

// KDEN: f16 keys as subnormal codes, else as magic-number codes (ignored for bf16). LAYOUT: kContig,
// kPaged, kPaged16, kAny, kContigCluster, kContigWide or kContigPool (above; warps_of(LAYOUT) warps
// per block). GC: the group size, or 0 for a.k_group (above).
template <class T, int BITS, int VBITS, int D, int NT, bool KDEN, int STAGES, int LAYOUT, int GC>
__global__ void __launch_bounds__(warps_of(LAYOUT) * 32, is_pool(LAYOUT) ? kPoolWarps / warps_of(LAYOUT)
                                               : d_split(D) > 1 ? kMinBlocksDSplit
                                               : (D >= 256 || NT == 2) ? kMinBlocksWide
                                               : LAYOUT == kContig || LAYOUT == kContigCluster ? kMinBlocks
                                               : LAYOUT == kAny      ? kMinBlocksLayout
                                                                     : kMinBlocksPaged) attention_kernel(const __grid_constant__ AttnArgs a) {
  constexpr int W = warps_of(LAYOUT);
  using S = Shape<T, BITS, VBITS, D, NT, KDEN, STAGES, W>;
  using F = typename S::F;
  using FV = typename S::FV;
  using Y = Ty<T>;
  constexpr bool kCl = kClusterCode && is_cluster(LAYOUT);  // merge in the cluster (a.cluster)
  constexpr bool kPl = is_pool(LAYOUT);  // the warps take their tiles from the block's pool
  constexpr bool kVF = vfold_for(D, BITS, VBITS, NT) && FV::kVCodes;  // values folded (kVFold)
  constexpr bool kVP = vpack_for(D, BITS, VBITS, NT) && FV::kVCodes && d_split(D) == 1;  // kVPack compiled in
  static_assert(!kPl || (STAGES == 2 && d_split(D) == 1), "the pool's loop: two stages, one warp per tile");
  constexpr int kRB = S::kRB, kC = S::kC, kKS = S::kKS, kRT = S::kRT, kMT = S::kMT;
  constexpr int kRBV = S::kRBV, kCV = S::kCV, kRBG = S::kRBG, kRBGV = S::kRBGV;
  constexpr int kTW = kTileTokens, kSCB = S::kSCB, kNZ = S::kNZ, kNGP = S::kNGP, kNGMax = S::kNGMax;
  constexpr int kDS = S::kDS, kTG = S::kTG, kDW = S::kDW;
  constexpr bool kEF = evict_first_for(D, BITS, VBITS, NT);  // the cache's copies evict-first in L2
  static_assert(kDS == 1 || (GC != 0 && LAYOUT == kContigWide), "d-split: contiguous caches, a constant group");
  static_assert(16 + kRT * kInKernelMergeMaxSplits * 8 + kRT * 16 + kRT * 8 <= S::kMain, "the in-kernel merge's scratch fits");
  extern __shared__ __align__(16) uint8_t smem[];
#if QSDPA_MMA_TLB_WARM
  // (a tuning variant, -DQSDPA_MMA_TLB_WARM=1, off by default: see the macro)
  if constexpr (LAYOUT == kContig || LAYOUT == kContigCluster || LAYOUT == kContigWide || is_pool(LAYOUT))
    if (threadIdx.x < 6) tlb_warm(&a, S::kRT, S::kRBG, S::kRBGV, D, GC);
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (AttnArgs::pdl), the block may be placed while the
  // stream's previous kernel still runs: nothing here reads or writes memory before that kernel
  // has completed and its writes are visible. (A no-op after an ordinary launch.)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The next kernel (the combine, or the next call) may be placed now: it waits in its turn for
  // this grid's end before it touches memory, so this changes when it is scheduled, not what it
  // reads.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#if QSDPA_MMA_TRACE
  const unsigned long long tr_start = global_ns();
#endif

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  // d-split: warp = tgrp * kDS + dc streams the tiles of group tgrp, head dims [dc kDW, (dc + 1) kDW)
  const int tgrp = kDS == 1 ? warp : warp / kDS, dc = kDS == 1 ? 0 : warp - tgrp * kDS;
  const int64_t N = a.N;
  const int rep = int(a.Hq / a.Hkv), Lq = int(a.Lq), R = rep * Lq;
  // blockIdx.x = (b * Hkv + kv head) * row tiles + row tile: the row tiles of one (b, kv head,
  // split) are neighbours in launch order, so they run together and share the cache reads in L2.
  const int row_tiles = (R + kRT - 1) / kRT;
  const int64_t bh = int64_t(blockIdx.x) / row_tiles;
  const int rtile = int(int64_t(blockIdx.x) - bh * row_tiles);
  const int split = int(blockIdx.y);
  const int64_t b = bh / a.Hkv, kvh = bh - b * a.Hkv;
  const int r0 = rtile * kRT, nrows = min(kRT, R - r0);
  const bool vp = kVP && nrows <= 4;  // kVPack: this block's rows fit columns 0-3 (uniform)
  const bool folded = kVF || vp;  // this block's values go folded (kVFold or kVPack): exponent, zacc
  // This sequence's tokens and query rows (per-sequence lengths; N and Lq without them). Row i
  // sits at position n - lq + i; rows i >= lq are padding that sees no key.
  const int64_t n = detail::seq_kv_len(a.kv_lens, b, N);
  const int lq = int(detail::seq_q_len(a.q_lens, b, Lq, n));
  // ng: groups of the warp's head dims (a row's with one warp per tile), ngf: of a row in memory
  const int G = GC ? GC : a.k_group, ng = kDW / G, ngf = D / G, lbpg = G == 32 ? 0 : G == 64 ? 1 : 2,
            bpg_mask = (1 << lbpg) - 1;
  const int64_t rows_total = a.B * a.Hq * a.Lq;

  // ---- this block's tokens; tiles before the sliding window of every row are skipped --------
  int64_t tb = a.t_begin + int64_t(split) * a.chunk;
  const int64_t te = n < tb + a.chunk ? n : tb + a.chunk;
  // The query rows' region of shared memory (filled below; after the token loop it holds the
  // block's merged state for cluster_combine: o in qf, m and l in qc).
  float* qf = reinterpret_cast<float*>(smem + S::kMain);  // [kRT][D]
  float* qc = qf + kRT * D;                               // [kRT][kNGMax]  Σ_g q
  // one split, merged here: the epilogue writes the output (kDirectOut; D <= 128 and one n-tile
  // only: compiled into the others, it changed their token loop's register allocation and cost
  // them 1-3 % without ever running there, H200 run 61, as the o swizzle below did Lq=4)
  constexpr bool kDirect = kDirectOut && NT == 1 && D <= 128;
  const bool direct = kDirect && !kCl && a.counters && gridDim.y == 1;
  // the compact epilogue (kCompactEpi): the two-n-tile kernels that do not merge in clusters
  constexpr bool kCompact = kCompactEpi && NT == 2 && !kCl;
  // The compact merge also in the d-split kernels (D = 512), where the planner takes the in-kernel
  // merge only for 4 splits or fewer: measured on an H200 (2026-12-03, run 67, 2 rounds, the same
  // tree built both ways, with -DQSDPA_MMA_COMPACT_EPI=2, which takes it in every one-n-tile
  // kernel): D=512 4-bit 69.0 -> 66.3 us, 8-bit 74.9 -> 70.3 (the kernels' register allocation:
  // those calls merge in the combine kernel); in the D = 128 kernels it was slower where they merge
  // 16-32 splits in the kernel (B=1 N=131072 8-bit 80.8 -> 82.7), so 2 (every one-n-tile kernel)
  // stays a tuning knob. (Two tiles of a warp in flight, issued after the math, was measured slower
  // on an H200, run 66, and removed: e9bd3f3 holds it.)
  constexpr bool kCompactMerge =
      kCompact || (!kCl && (QSDPA_MMA_COMPACT_EPI == 2 || (kCompactEpi && d_split(D) > 1)));
  if (tb >= te) {  // a split past this sequence's end (per-sequence lengths): no key, nothing else
    if (direct) {  // (no visible key: zeros, with or without a sink)
      for (int idx = tid; idx < nrows * D; idx += W * 32) {
        const int lr = idx / D, d = idx - lr * D;
        int i;
        const int hl = row_head(r0 + lr, Lq, i);
        store_t(a.out, a.dtype, a.omap.at(b, kvh * rep + hl, i) + d, 0.0f);
      }
      return;
    }
    if (kCl) {  // the cluster's other splits still merge with this one's (empty) state
      for (int lr = tid; lr < kRT; lr += W * 32) qc[lr] = -INFINITY, qc[kRT + lr] = 0.0f;
      cluster_combine<D, kRT, W>(a, qc, qc + kRT, qf, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
      return;
    }
    const int64_t rows_all = a.B * a.Hq * a.Lq;
    for (int lr = tid; lr < nrows; lr += W * 32) {
      int i;
      const int hl = row_head(r0 + lr, Lq, i);
      const int64_t prow = int64_t(split) * rows_all + (b * a.Hq + kvh * rep + hl) * a.Lq + i;
      a.part_m[prow] = -INFINITY;
      a.part_l[prow] = 0.0f;
    }
    if (a.counters) {
      if constexpr (QSDPA_MMA_MERGE_COLD_INLINE != 0)
        merge_if_last<kRT, W>(a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
      else
        merge_if_last_cold<kRT, W>(&a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
    } else if (QSDPA_MMA_ARRIVALS && a.arrivals) {
      arrive_count(a);
    }
    return;
  }
  if (a.window > 0) {
    const int64_t lo = n - lq - a.window + 1;
    if (lo > tb) tb += (lo - tb) / kTW * kTW;
  }
  const int64_t ntiles = te > tb ? (te - tb + kTW - 1) / kTW : 0;
  // (the pool: the warp's first tile is tile `warp`, the rest come from the pool's counter)
  const int64_t my_tiles = kPl ? 0 : ntiles > tgrp ? (ntiles - tgrp + kTG - 1) / kTG : 0;

  // ---- the warp's copy ring -------------------------------------------------------------------
  // A tile is kTW consecutive rows: kTW * kRB contiguous bytes of K (kTW * kRBV of V), and for each of
  // the 4 scale / bias tensors kTW * ng * 2 contiguous bytes, copied as the 16-byte-aligned span
  // around them (the offset soff of the tile inside that span is the same for every tile of the
  // block, since tiles advance by multiples of 16 bytes).
  const uint32_t wring = smem_addr(smem) + uint32_t(warp * STAGES * S::kStage);
  // Tokens from one of the warp's tiles to the next, and its first tile's first token. The pool
  // numbers the split's tiles from tb instead: issue(j, ...) copies tile j of the split.
  const int64_t tile_step = int64_t(kPl ? 1 : kTG) * kTW;
  const int64_t t_first = tb + int64_t(kPl ? 0 : tgrp) * kTW;
  // The cache rows of the warp's first tile. Every layout (mma_supports) has token stride 1, tiles
  // that lie in one page (or two 16-token pages), and strides that keep the 16-byte phase of the
  // scale spans (the same for K and V).
  const bool in = t_first < te;
  constexpr bool kCt = LAYOUT == kContig || LAYOUT == kContigCluster || LAYOUT == kContigWide || kPl;
  // (16-token pages: the head's offset only; each tile's rows are looked up whole, below)
  constexpr bool half = LAYOUT == kPaged16;  // the tile's second half lies in the next table entry
  const int64_t krow_first = kCt   ? b * a.kmap.batch_stride + kvh * a.kmap.head_stride + t_first
                             : half ? kvh * a.kmap.head_stride
                             : in   ? a.kmap.row(b, kvh, t_first)
                                    : 0;
  constexpr bool kPg = LAYOUT == kPaged || LAYOUT == kPaged16;
  const int64_t vrow_first = kCt ? b * a.vmap.batch_stride + kvh * a.vmap.head_stride + t_first
                             : kPg              ? krow_first
                             : in               ? a.vmap.row(b, kvh, t_first)
                                                : 0;
  // lane's first piece of the warp's first tile (piece i = lane + 32 k sits at byte 16 i; d-split:
  // piece i is piece i % kC of the warp's part of row i / kC)
  const int lane_k = kDS == 1 ? lane * 16 : (lane / kC) * kRBG + dc * kRB + (lane % kC) * 16;
  const int lane_v = kDS == 1 ? lane * 16 : (lane / kCV) * kRBGV + dc * kRBV + (lane % kCV) * 16;
  const uint8_t* gk = reinterpret_cast<const uint8_t*>(a.k_packed) + krow_first * kRBG + lane_k;
  const uint8_t* gv = reinterpret_cast<const uint8_t*>(a.v_packed) + vrow_first * kRBGV + lane_v;
  const int sc_lane_arr = lane >> 3, sc_lane_k = lane & 7;  // this lane copies scale tensor lane/8
  const int64_t o_first = (sc_lane_arr < 2 ? krow_first : vrow_first) * ngf * 2;
  // (0 with 16-token pages, whose first row is the head's offset, and with the d-split)
  const int soff = kDS == 1 && !half ? int(o_first & 15) : 0;
  // (d-split: the lane's tokens are sc_lane_k + 8 j, each the ng groups of the warp's dims)
  const uint8_t* gsc = static_cast<const uint8_t*>(sc_lane_arr == 0   ? a.k_scales
                                                   : sc_lane_arr == 1 ? a.k_biases
                                                   : sc_lane_arr == 2 ? a.v_scales
                                                                      : a.v_biases) +
                       (o_first - soff) + (kDS == 1 ? sc_lane_k * 16 : (sc_lane_k * ngf + dc * ng) * 2);
  const int nch = (soff + kTW * ng * 2 + 15) >> 4;  // 16-byte pieces of a full tile's span
  constexpr int kSPL = (kSCB / 16 + 7) / 8;         // pieces of a span per lane, at most
  uint32_t so[kC], sov[kCV];  // swizzled destinations of the lane's pieces of K and of V rows
  piece_offsets(lane, so);
  piece_offsets(lane, sov);

  // A paged cache whose K and V share one layout: the page of the warp's next tile is read at the
  // issue before (one int32 in flight), so that no issue waits for a block-table load.
  const int32_t* bt_b = kPg ? a.kmap.block_table + b * a.kmap.bt_stride : nullptr;
  int next_page = kPg && in ? bt_b[t_first >> a.kmap.page_shift] : 0;
  int next_page2 = half && t_first + 16 < te ? bt_b[(t_first >> a.kmap.page_shift) + 1] : 0;
  auto issue = [&](int64_t it, int stage) {
    const int64_t left = te - (t_first + it * tile_step);
    const uint32_t sk = wring + uint32_t(stage * S::kStage), sv = sk + kTW * kRB, ss = sv + kTW * kRBV;
    if constexpr (kDS > 1 && kDSplitCopy) {  // (d-split: kDSplitCopy above)
      // (the d-split's warps stream the same tiles: tile_step = kTW; ngf = D / GC)
      static_assert(kTG == 1 && !kPl && GC != 0, "d-split: one tile group, no pool, a constant group");
      const uint64_t tiles = uint64_t(uint32_t(it));  // (it < 2^31: a split's tiles)
      const uint8_t* pk = gk + tiles * uint32_t(kTW * kRBG);
      const uint8_t* pv = gv + tiles * uint32_t(kTW * kRBGV);
      const uint8_t* ps = gsc + tiles * uint32_t(kTW * (D / GC) * 2);
      constexpr int kSB = 2 * kDW / GC;  // scale bytes of one token's part of the warp
      const uint32_t sd = ss + uint32_t(sc_lane_arr * kSCB + sc_lane_k * kSB);
      if (left >= kTW) {
        copy_rows<kC, kRBG, true, false, kEF>(sk, so, pk, a.k_packed, lane, kTW);
        copy_rows<kCV, kRBGV, true, false, kEF>(sv, sov, pv, a.v_packed, lane, kTW);
#pragma unroll
        for (int j = 0; j < kTW / 8; ++j) cp_async_small<kSB>(sd + uint32_t(8 * j * kSB), ps + 8 * j * (D / GC) * 2, true);
      } else {  // the last, partial tile: rows past the end are zero-filled, never read
        const int lf = int(left);  // (0 < left < kTW)
        copy_rows<kC, kRBG, false, false, kEF>(sk, so, pk, a.k_packed, lane, lf);
        copy_rows<kCV, kRBGV, false, false, kEF>(sv, sov, pv, a.v_packed, lane, lf);
#pragma unroll
        for (int j = 0; j < kTW / 8; ++j) {
          const bool in = sc_lane_k + 8 * j < lf;
          cp_async_small<kSB>(sd + uint32_t(8 * j * kSB), in ? ps + 8 * j * (D / GC) * 2 : a.k_scales, in);
        }
      }
      return;
    }
    const uint32_t sd = ss + uint32_t(sc_lane_arr * kSCB + sc_lane_k * 16);
    // The lane's first piece of the tile in K, V and its scale span (16-token pages: of rows 0..15,
    // and pk2, pv2, ps2 of rows 16..31)
    const uint8_t *pk, *pv, *ps, *pk2 = nullptr, *pv2 = nullptr, *ps2 = nullptr;
    if constexpr (half) {
      // rows 0..15 of the tile start page next_page, rows 16..31 page next_page2 (tiles start at
      // multiples of 32 tokens: t_begin, chunk and the window skip are, so a tile starts at a
      // page). Absolute rows from the head's offset: no distances between pages.
      const int64_t r0p = int64_t(next_page) * a.kmap.page_stride, r1p = int64_t(next_page2) * a.kmap.page_stride;
      if (it + 1 < my_tiles) {
        const int64_t tn = t_first + (it + 1) * tile_step;
        const int32_t* bn = bt_b + (tn >> 4);
        next_page = bn[0];
        if (tn + 16 < te) next_page2 = bn[1];
      }
      pk = gk + r0p * kRBG, pk2 = gk + r1p * kRBG;
      pv = gv + r0p * kRBGV, pv2 = gv + r1p * kRBGV;
      // (the spans start at a page, soff = 0: pieces k >= 2 ngf of a span are rows 16..31, whose
      // span in the second page starts 32 ngf bytes earlier)
      ps = gsc + r0p * (ngf * 2), ps2 = gsc + r1p * (ngf * 2) - 32 * ngf;
    } else {
      // rows from the first tile to this one (K and V in one layout: one lookup)
      int64_t dk = it * tile_step, dv = dk;
      if constexpr (kPg) {
        const int64_t t = t_first + it * tile_step;
        const int64_t pmask = (int64_t(1) << a.kmap.page_shift) - 1;
        const int64_t hoff = kvh * a.kmap.head_stride;
        dk = dv = int64_t(next_page) * a.kmap.page_stride + hoff + (t & pmask) - krow_first;
        if (it + 1 < my_tiles) next_page = bt_b[(t + tile_step) >> a.kmap.page_shift];
      } else if constexpr (LAYOUT == kAny) {
        const int64_t t = t_first + it * tile_step;
        dk = a.kmap.row(b, kvh, t) - krow_first;
        dv = a.same_layout ? dk : a.vmap.row(b, kvh, t) - vrow_first;
      }
      pk = gk + dk * kRBG, pv = gv + dv * kRBGV;
      ps = gsc + (sc_lane_arr < 2 ? dk : dv) * ngf * 2;
    }
    if (left >= kTW) {
      copy_rows<kC, kRBG, true, half, kEF>(sk, so, pk, a.k_packed, lane, left, pk2);
      copy_rows<kCV, kRBGV, true, half, kEF>(sv, sov, pv, a.v_packed, lane, left, pv2);
    } else {  // the last, partial tile: rows past the end are zero-filled, never read
      copy_rows<kC, kRBG, false, half, kEF>(sk, so, pk, a.k_packed, lane, left, pk2);
      copy_rows<kCV, kRBGV, false, half, kEF>(sv, sov, pv, a.v_packed, lane, left, pv2);
    }
    if constexpr (kDS > 1) {  // d-split: the 2 ng bytes of each of the lane's 4 tokens
#pragma unroll
      for (int j = 0; j < kTW / 8; ++j) {
        const bool in = sc_lane_k + 8 * j < left;
        cp_async_small<2 * kDW / (GC ? GC : 32)>(ss + uint32_t(sc_lane_arr * kSCB + (sc_lane_k + 8 * j) * ng * 2),
                                                in ? ps + 8 * j * ngf * 2 : a.k_scales, in);
      }
      return;
    }
    const int vlen = soff + int(left < kTW ? left : kTW) * ng * 2;  // valid bytes of the span
    // the piece k = sc_lane_k + 8 j of the span
    const auto span_piece = [&](int j, int k) { return (half && k >= 2 * ngf ? ps2 : ps) + 128 * j; };
    // (unrolled to the most pieces a lane can have: a runtime trip count cost ~60 instructions per
    // tile for what is one or two copies)
    if (left >= kTW && soff == 0) {  // a full tile whose spans start at 16 bytes: whole pieces
#pragma unroll
      for (int j = 0; j < kSPL; ++j) {
        const int k = sc_lane_k + 8 * j;
        if (k < nch) cp_async16<kEF>(sd + 128 * j, span_piece(j, k), 16);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kSPL; ++j) {
        const int k = sc_lane_k + 8 * j;
        if (k < nch) {
          const int rest = vlen - 16 * k, nb = rest <= 0 ? 0 : rest >= 16 ? 16 : rest;
          if (kSpanTailSync && nb > 0 && nb < 16 && left <= 2 * kTW) {
            // A partial piece in the split's last two tiles, whose 16 bytes may reach past its
            // last scale, which may end a buffer (kSpanTailSync above): read the nb bytes (2-byte
            // units) and store the piece zero-filled.
            const uint16_t* src = reinterpret_cast<const uint16_t*>(span_piece(j, k));
            uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int h = 0; h < 8; ++h)
              if (2 * h < nb) w[h >> 1] |= uint32_t(src[h]) << (16 * (h & 1));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(sd + 128 * j), "r"(w[0]), "r"(w[1]),
                         "r"(w[2]), "r"(w[3])
                         : "memory");
          } else {
            cp_async16<kEF>(sd + 128 * j, nb > 0 ? span_piece(j, k) : a.k_scales, nb);
          }
        }
      }
    }
  };

  // ---- query rows: their loads (kQFirst, the one-n-tile kernels: issued before the first tiles'
  // copies, so that they do not wait behind them in the memory system; the block computes nothing
  // before the rows are in) -------------------------------------------------------------------
  float* qo = qc + kRT * kNGMax;                          // [kRT][kNGMax]  Σ_g mu q
  float* rowc = qo + kRT * kNGMax;                        // [kRT] logit factor (log2 units)
  int64_t* rpos = reinterpret_cast<int64_t*>(rowc + kRT);  // [kRT] position N - Lq + i (-1: none)
  int64_t* rmrow = rpos + kRT;                             // [kRT] first mask element of the row
  const auto qrow_of = [&](int lr) {
    int i;
    const int hl = row_head(r0 + lr, Lq, i);
    return (b * a.Hq + kvh * rep + hl) * a.Lq + i;
  };
  // element offsets of row lr in q and in the masks
  const auto q_off = [&](int lr) {
    int i;
    const int hl = row_head(r0 + lr, Lq, i);
    return a.qmap.at(b, kvh * rep + hl, i);
  };
  const auto m_off = [&](int lr) {
    int i;
    const int hl = row_head(r0 + lr, Lq, i);
    return a.mmap.at(b, kvh * rep + hl, i);
  };
  // All loads first, then the stores: one memory latency for the block, not one per element
  // (the generic stores could otherwise alias the loads and serialize them).
  const uint16_t* q16 = static_cast<const uint16_t*>(a.q);
  // kQVec (the two-n-tile kernels): 16-byte pieces of 8 elements, one row offset per piece (a
  // piece whose address is not 16-byte aligned is read element by element), instead of one
  // element and one row offset (a division by Lq, 64-bit products) per load.
  constexpr bool kQVecFits = (S::kDS == 1 || QSDPA_MMA_Q_VEC_DSPLIT != 0) && (kRT * D / 8) % (W * 32) == 0 && (W * 32) % kRT == 0 && W * 32 / kRT <= 32;
  constexpr bool kQVec = kQVecFits && ((QSDPA_MMA_Q_VEC == 1 && NT == 2) || QSDPA_MMA_Q_VEC == 2);
  constexpr int kQE = kQVec ? 8 : 1;  // elements per load
  constexpr int kQPer = (kRT * D / kQE + W * 32 - 1) / (W * 32);
  uint16_t qv[kQPer][kQE];
  const auto load_q = [&]() {
#pragma unroll
    for (int k = 0; k < kQPer; ++k) {
      // (kQVec: a thread's pieces are consecutive, kQPer * 8 dims of one row)
      const int idx = kQVec ? tid * kQPer + k : tid + k * W * 32, lr = idx / (D / kQE),
                d = (idx - lr * (D / kQE)) * kQE;
      if constexpr (kQVec) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (idx < kRT * D / kQE && lr < nrows) {
          v = ldg_piece8(q16 + (q_off(lr) + d));
        }
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) qv[k][j] = uint16_t(w[j >> 1] >> (16 * (j & 1)));
      } else {
        qv[k][0] = idx < kRT * D && lr < nrows ? __ldg(q16 + (q_off(lr) + d)) : uint16_t(0);
      }
    }
  };
  constexpr bool kQFirst = QSDPA_MMA_Q_FIRST == 2 || (QSDPA_MMA_Q_FIRST == 1 && NT == 1);
  if constexpr (kQFirst) load_q();

  // The pool's counter: the next tile no warp has taken (warps 0..W-1 start with tiles 0..W-1).
  int* pool = kPl ? reinterpret_cast<int*>(smem + S::kMain + S::kQ) : nullptr;
  if constexpr (kPl) {
    if (tid == 0) *pool = W;  // (read only after the barriers below)
    if (warp < ntiles) issue(warp, 0);
    cp_commit();
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < my_tiles) issue(s, s);
      cp_commit();
    }
  }

  // ---- query rows: scaled copy in f32, per-row scale, per-group sums --------------------------
  if constexpr (!kQFirst) load_q();
  if constexpr (kQVec) {
    // A row's D dims over kTPR consecutive lanes, kDPT each (its 16-byte pieces, above): the row's
    // largest magnitude and its groups' sums reduced across those lanes, every row at once.
    constexpr int kDPT = kQPer * kQE, kTPR = D / kDPT;
    static_assert(kTPR * kRT == W * 32 && kDPT * kTPR == D && kTPR <= 32 && kDPT <= 32 && kDPT % 4 == 0,
                  "a row's dims over consecutive lanes, at most 32 dims (a group at least) each");
    const int lr = tid / kTPR, d0 = (tid - lr * kTPR) * kDPT;
    float f[kDPT];
#pragma unroll
    for (int k = 0; k < kQPer; ++k)
#pragma unroll
      for (int j = 0; j < kQE; ++j) f[k * kQE + j] = Y::to_f32(qv[k][j]);
    trace_step(a, kTraceQIn);
    if (tid < kRT) {
      int i;
      row_head(r0 + tid, Lq, i);
      rpos[tid] = tid < nrows && i < lq ? n - lq + i : -1;
      rmrow[tid] = tid < nrows ? m_off(tid) : 0;
    }
    // (a padding row is zeros: amax 0, no prescale, sums 0, the plain logit factor)
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kDPT; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
    for (int o = kTPR / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int e = prescale_exp<F>(amax);
    const float sc = ldexpf(1.0f, e);
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kDPT; ++j) {
      f[j] *= sc;
      s1 += f[j];
      s2 += f[j] * F::mu(d0 + j);
    }
#pragma unroll
    for (int j = 0; j < kDPT; j += 4)
      *reinterpret_cast<float4*>(qf + lr * D + d0 + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
    // a group's dims: G / kDPT consecutive lanes
#pragma unroll
    for (int o = 1; o < kTPR; o <<= 1)
      if (o * kDPT < G) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
      }
    if ((d0 & (G - 1)) == 0) {
      qc[lr * kNGMax + (d0 >> (5 + lbpg))] = s1;
      qo[lr * kNGMax + (d0 >> (5 + lbpg))] = s2;
    }
    if (d0 == 0) rowc[lr] = a.scale * kLog2e * ldexpf(1.0f, -e) / F::kKappa;
    __syncthreads();
  } else {
#pragma unroll
    for (int k = 0; k < kQPer; ++k) {
      const int idx = tid + k * W * 32;
      if (idx < kRT * D) qf[idx] = Y::to_f32(qv[k][0]);
    }
    if (tid < kRT) {
      int i;
      row_head(r0 + tid, Lq, i);
      rpos[tid] = tid < nrows && i < lq ? n - lq + i : -1;
      rmrow[tid] = tid < nrows ? m_off(tid) : 0;
    }
    __syncthreads();
    trace_step(a, kTraceQIn);
    static_assert(kRT % W == 0 || W % kRT == 0, "rows per warp: a whole number, or warps per row");
    // (unrolled: the rows' reduction chains interleave; every warp takes kRT / W rows, or one
    // when there are more warps than rows)
#pragma unroll
    for (int k = 0; k < (kRT + W - 1) / W; ++k) {
      const int lr = warp + k * W;
      if (W > kRT && lr >= kRT) break;
      if (lr >= nrows) {  // a padding row (all zeros): what the reductions below would give
        for (int k = lane; k < kNGMax; k += 32) qc[lr * kNGMax + k] = qo[lr * kNGMax + k] = 0.0f;
        if (lane == 0) rowc[lr] = a.scale * kLog2e / F::kKappa;
        continue;
      }
      float amax = 0.0f;
      for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(qf[lr * D + d]));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const int e = prescale_exp<F>(amax);
      const float sc = ldexpf(1.0f, e);
      float gs = 0.0f, go = 0.0f;
#pragma unroll
      for (int bl = 0; bl < D / 32; ++bl) {
        const int d = 32 * bl + lane;
        const float v = qf[lr * D + d] * sc;
        qf[lr * D + d] = v;
        float s1 = v, s2 = v * F::mu(d);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
          s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        }
        gs += s1;
        go += s2;
        if (((bl + 1) & bpg_mask) == 0) {
          if (lane == 0) {
            qc[lr * kNGMax + (bl >> lbpg)] = gs;
            qo[lr * kNGMax + (bl >> lbpg)] = go;
          }
          gs = go = 0.0f;
        }
      }
      if (lane == 0) rowc[lr] = a.scale * kLog2e * ldexpf(1.0f, -e) / F::kKappa;
    }
    __syncthreads();
  }
  trace_step(a, kTraceProlog);

  // B operands: q (permuted to the key unpacking order), and the correction slots.
  uint32_t bq[NT][kKS][2];
  uint32_t bz[NT][kNZ][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int lr = nt * 8 + g;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int d0 = F::kdim(ks, 2 * c + 8 * j), d1 = F::kdim(ks, 2 * c + 8 * j + 1);
        const float* qr = qf + lr * D + dc * kDW;  // (beta: d0 and dc kDW + d0 alike, kDW % 4 == 0)
        bq[nt][ks][j] = Y::pack(qr[d0] * F::beta(d0), qr[d1] * F::beta(d1));
      }
#pragma unroll
    for (int zi = 0; zi < kNZ; ++zi) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int slot = 8 * zi + 2 * c + h, arr = slot / kNGP, gg = slot % kNGP;
        v[h] = 0.0f;
        const int gq = lr * kNGMax + dc * ng + gg;  // the row's group of the warp's group gg
        if (arr < S::kNA && gg < ng) v[h] = arr == 0 ? qc[gq] : -qo[gq];
      }
      // value = hi + lo, both in T
      const uint32_t hi = Y::pack(v[0], v[1]);
      const float h0 = Y::to_f32(uint16_t(hi & 0xffffu)), h1 = Y::to_f32(uint16_t(hi >> 16));
      bz[nt][zi][0] = hi;
      bz[nt][zi][1] = Y::pack(v[0] - h0, v[1] - h1);
    }
  }
  float crow[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) crow[nt][e] = rowc[nt * 8 + 2 * c + e];
  trace_step(a, kTraceBOps);
  if constexpr (kDS > 1) __syncthreads();  // (the query rows' f32 copy becomes the logits exchange)

  // ---- online softmax state (log2 units) --------------------------------------------------------
  float m[NT][2], mb[NT][2], thr[NT][2], lsum[NT][2];
  float o[kKS][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m[nt][e] = -INFINITY;  // reference: -inf until a visible key shows up
      mb[nt][e] = 0.0f;      // the reference as subtracted (0 while m is -inf)
      thr[nt][e] = -INFINITY;
      lsum[nt][e] = 0.0f;
    }
#pragma unroll
  for (int dt = 0; dt < kKS; ++dt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][nt][e] = 0.0f;
  // kVFold: Σ_t p_t z_t as one mma accumulator for up to 16 query rows and 8 groups (P on M: rows
  // g and g + 8 = n-tiles 0 and 1; groups 2c, 2c + 1 on N), and the warp's 2^e as an f16 pair
  float zacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint32_t vexp2 = 0x3C003C00u;
  static_assert(!kVF || (NT <= 2 && S::kNGW <= 8), "kVFold: the biases' accumulator holds 16 rows, 8 groups");

  // Per-lane ldmatrix row offsets: lane l addresses matrix l/8 (token half, piece parity), row l%8.
  uint32_t ldo[kC / 2], ldov[kCV / 2];
  {
    const int mi = lane >> 3, tok = (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int u = 0; u < kC / 2; ++u)
      ldo[u] = uint32_t(tok * kRB + (((2 * u + (mi >> 1)) ^ swz(kC, tok)) << 4));
#pragma unroll
    for (int u = 0; u < kCV / 2; ++u)
      ldov[u] = uint32_t(tok * kRBV + (((2 * u + (mi >> 1)) ^ swz(kCV, tok)) << 4));
  }
  const bool has_mask = a.bool_mask != nullptr || a.float_mask != nullptr;
  // The first position of the block's rows (-1 with padding rows: those take the per-element path).
  const int64_t minpos = lq < Lq ? -1 : n - lq;
  // Per-lane byte offsets inside a tile's scale arrays ([token][group] of T).
  const uint32_t rb_g = uint32_t(g * ng * 2), rb_g8 = uint32_t((g + 8) * ng * 2), rb_mt = uint32_t(32 * ng);
  const uint32_t rb_c2 = uint32_t(2 * c * ng * 2), rb_1 = uint32_t(ng * 2), rb_8 = uint32_t(16 * ng);
  // Correction slots this lane reads (A operand of the correction mma): a pair of groups of
  // the biases (slot array 0) or the scales (array 1, offsets only).
  uint32_t zsl[kNZ], zmask[kNZ];
#pragma unroll
  for (int zi = 0; zi < kNZ; ++zi) {
    const int slot = 8 * zi + 2 * c, arr = slot / kNGP, gg = slot % kNGP;
    const bool v0 = arr < S::kNA && gg < ng, v1 = arr < S::kNA && gg + 1 < ng;
    zsl[zi] = v0 ? uint32_t((arr == 0 ? kSCB : 0) + gg * 2) : 0u;  // (an unused lane reads group 0)
    zmask[zi] = v1 ? 0xffffffffu : v0 ? 0x0000ffffu : 0u;
  }

  int stage = 0;
  int64_t t0 = t_first;
  // The pool: the warp's tile (cur) and the one it took next (nxt), copied one iteration ahead;
  // the tile after that is taken during the iteration (taken, lane 0's atomic), a shared-memory
  // round trip hidden behind the tile's math. Numbers at or past ntiles end the loop.
  int64_t cur = kPl ? warp : 0, nxt = 0;
  if constexpr (kPl) nxt = __shfl_sync(0xffffffffu, lane == 0 ? atomicAdd(pool, 1) : 0, 0);
  for (int64_t it = 0; kPl ? cur < ntiles : it < my_tiles;
       ++it, t0 += tile_step, stage = stage + 1 == STAGES ? 0 : stage + 1) {
    cp_wait<STAGES - 2>();
    __syncwarp();
    if (it == 0) trace_step(a, kTraceFirst);
    int taken = 0;
    if constexpr (kPl) {
      t0 = tb + cur * kTW;
      if (nxt < ntiles) issue(nxt, stage ^ 1);
      if (lane == 0) taken = atomicAdd(pool, 1);
    } else if (it + STAGES - 1 < my_tiles) {
      issue(it + STAGES - 1, stage == 0 ? STAGES - 1 : stage - 1);
    }
    cp_commit();

    const uint32_t sk = wring + uint32_t(stage * S::kStage), sv = sk + kTW * kRB;
    const uint32_t sks = sv + kTW * kRBV + uint32_t(soff);  // k scales of the tile's first token
    const uint32_t svs = sks + 2 * kSCB, svz = sks + 3 * kSCB;

    // ---- logits: Σ_g s_g (q·k̃)_g + Σ_g (z_g Σq_g - s_g Σ mu q_g), per token and row ----------
    float sc[kMT][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const uint32_t smt = sks + mt * rb_mt;
      uint32_t za[kNZ][4];
#pragma unroll
      for (int zi = 0; zi < kNZ; ++zi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t p = smt + zsl[zi] + (h ? rb_g8 : rb_g);
          // one group per token (ng == 1) is only 2-byte aligned; pairs are 4-byte aligned
          za[zi][h] = za[zi][h + 2] = (ng == 1 ? lds16(p) : lds32(p)) & zmask[zi];
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float z4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int zi = 0; zi < kNZ; ++zi) Y::mma(z4, za[zi], bz[nt][zi][0], bz[nt][zi][1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = z4[e] * F::kKappa;
      }
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
      for (int u = 0; u < kC / 2; ++u) {
        uint32_t w[4];
        ldsm_x4(sk + uint32_t(mt * 16 * kRB) + ldo[u], w);
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          const int ch = 2 * u + hc;
          uint32_t rg[F::kKRegs], rg8[F::kKRegs];
          F::kunpack(w[2 * hc], rg);
          F::kunpack(w[2 * hc + 1], rg8);
#pragma unroll
          for (int mm = 0; mm < F::kKMma; ++mm) {
            const uint32_t A[4] = {rg[2 * mm], rg8[2 * mm], rg[2 * mm + 1], rg8[2 * mm + 1]};
            const int ks = F::kstep(ch, mm);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) Y::mma(acc[nt], A, bq[nt][ks][0], bq[nt][ks][1]);
          }
          if (F::block_end(ch)) {
            const int blk = F::block_last(ch);
            if (kFoldEveryBlock || ((blk + 1) & bpg_mask) == 0) {  // fold the group's scale in
              const uint32_t gb = smt + uint32_t((blk >> lbpg) * 2);
              const float s0 = Y::to_f32(uint16_t(lds16(gb + rb_g)));
              const float s8 = Y::to_f32(uint16_t(lds16(gb + rb_g8)));
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                sc[mt][nt][0] = fmaf(s0, acc[nt][0], sc[mt][nt][0]);
                sc[mt][nt][1] = fmaf(s0, acc[nt][1], sc[mt][nt][1]);
                sc[mt][nt][2] = fmaf(s8, acc[nt][2], sc[mt][nt][2]);
                sc[mt][nt][3] = fmaf(s8, acc[nt][3], sc[mt][nt][3]);
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
              }
            }
          }
        }
      }
    }

    // ---- d-split: the logits are the sum of the kDS warps' partial sums, added in one order by
    // every warp of the group (the same softmax in each, to the bit); two buffers by tile parity,
    // so one barrier per tile suffices (a warp writes a buffer again only after the next barrier,
    // which every warp reaches after its reads).
    if constexpr (kDS > 1) {
      constexpr int kV4 = S::kLogits / 4;
      float4* xb = reinterpret_cast<float4*>(qf) + int(it & 1) * W * kV4 * 32;  // [warp][v4][lane]
      float4* mine = xb + warp * kV4 * 32 + lane;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mine[(mt * NT + nt) * 32] = make_float4(sc[mt][nt][0], sc[mt][nt][1], sc[mt][nt][2], sc[mt][nt][3]);
      if constexpr (kTG == 1) asm volatile("bar.sync 1, %0;\n" ::"n"(kDS * 32) : "memory");
      else asm volatile("bar.sync %0, %1;\n" ::"r"(1 + tgrp), "n"(kDS * 32) : "memory");
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float4 acc4 = xb[(tgrp * kDS * kV4 + mt * NT + nt) * 32 + lane];
#pragma unroll
          for (int w2 = 1; w2 < kDS; ++w2) {
            const float4 v4 = xb[((tgrp * kDS + w2) * kV4 + mt * NT + nt) * 32 + lane];
            acc4.x += v4.x, acc4.y += v4.y, acc4.z += v4.z, acc4.w += v4.w;
          }
          sc[mt][nt][0] = acc4.x, sc[mt][nt][1] = acc4.y, sc[mt][nt][2] = acc4.z, sc[mt][nt][3] = acc4.w;
        }
    }

    // ---- softmax: y = logit * log2e - reference ----------------------------------------------
    float y[kMT][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) y[mt][nt][e] = fmaf(sc[mt][nt][e], crow[nt][e & 1], -mb[nt][e & 1]);

    const bool fast = !has_mask && t0 + kTW <= te && t0 + kTW - 1 <= minpos && (a.window == 0 || t0 >= n - a.window);
    if (!fast) {  // partial tile, causal or window edge, or masks: per element
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t tok = t0 + mt * 16 + g + 8 * (e >> 1);
            const int lr = nt * 8 + 2 * c + (e & 1);
            const int64_t pos = rpos[lr];
            bool vis = tok < te && tok <= pos && (a.window == 0 || tok > pos - a.window);
            if (vis && has_mask) {
              const int64_t mi = rmrow[lr] + tok;
              if (a.bool_mask)
                vis = a.bool_mask_u32 ? static_cast<const uint32_t*>(a.bool_mask)[mi] != 0u
                                      : static_cast<const uint8_t*>(a.bool_mask)[mi] != 0;
              if (vis && a.float_mask) {
                const float fm = Y::to_f32(static_cast<const uint16_t*>(a.float_mask)[mi]);
                if (fm == -INFINITY) vis = false;
                else y[mt][nt][e] = fmaf(fm, kLog2e, y[mt][nt][e]);
              }
            }
            if (!vis) y[mt][nt][e] = -INFINITY;
          }
    }
    if constexpr (kVP) {
      if (vp) {  // kVPack: columns 4-7 (lanes c >= 2) become rows 0-3 again, bit for bit
        const int src = c >= 2 ? lane - 2 : lane;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) y[mt][0][e] = __shfl_sync(0xffffffffu, y[mt][0][e], src);
      }
    }

    bool trig = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) trig |= y[mt][nt][e] > thr[nt][e & 1];
    if (__any_sync(0xffffffffu, trig)) {  // a new maximum: move the reference, rescale
      float valpha[NT][2];  // kVFold: each row's factor (1: not moved), for the biases' accumulator
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) valpha[nt][0] = valpha[nt][1] = 1.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          float mx = -INFINITY;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) mx = fmaxf(mx, fmaxf(y[mt][nt][e2], y[mt][nt][e2 + 2]));
#pragma unroll
          for (int off = 4; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
          const float xa = mx + mb[nt][e2];
          if (xa > m[nt][e2]) {
            const float alpha = m[nt][e2] == -INFINITY ? 0.0f : ex2(m[nt][e2] - xa);
            const float dl = xa - mb[nt][e2];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              y[mt][nt][e2] -= dl;
              y[mt][nt][e2 + 2] -= dl;
            }
            lsum[nt][e2] *= alpha;
            if constexpr (kVF || kVP) valpha[nt][e2] = alpha;
#pragma unroll
            for (int dt = 0; dt < kKS; ++dt) {
              o[dt][nt][e2] *= alpha;
              o[dt][nt][e2 + 2] *= alpha;
            }
            m[nt][e2] = mb[nt][e2] = xa;
            thr[nt][e2] = kTau;
          }
        }
      if constexpr (kVF || kVP) {  // row g (n-tile nt) of zacc: row 2 (g/2) + g%2's factor, from lane g/2
        if (folded) {  // (kVPack's blocks of 5-8 rows dequantize: no zacc)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const float a0 = __shfl_sync(0xffffffffu, valpha[nt][0], g >> 1);
            const float a1 = __shfl_sync(0xffffffffu, valpha[nt][1], g >> 1);
            const float ag = (g & 1) ? a1 : a0;
            zacc[2 * nt] *= ag;
            zacc[2 * nt + 1] *= ag;
          }
        }
      }
    }

    // p, and Pᵀ as the B operand of Oᵀ += Vᵀ Pᵀ (movmatrix turns the accumulator layout around)
    uint32_t pt[kMT][NT][2];
    float pv[kMT][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float* p = pv[mt][nt];
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = ex2(y[mt][nt][e]);
        lsum[nt][0] += p[0] + p[2];
        lsum[nt][1] += p[1] + p[3];
        pt[mt][nt][0] = movm_t(Y::pack(p[0], p[1]));
        pt[mt][nt][1] = movm_t(Y::pack(p[2], p[3]));
      }

    // ---- kVFold: the tile's value scales against the warp's exponent ---------------------------
    if constexpr (kVF || kVP) {
      if (folded) {
        // |s| of the tile's 32 ng value scales (this lane: lane + 32 j), as f16 bits (ordered as
        // the magnitudes; NaN and inf above every finite one)
        uint32_t amax = 0u;
#pragma unroll
        for (int j = 0; j < S::kNGW; ++j)
          if (j < ng) amax = max(amax, lds16(svs + uint32_t(2 * (lane + 32 * j))) & 0x7fffu);
        // (e such that the warp's max |s| 2^e lies in [4, 8): the accumulators' units follow)
        if (float f; vexp_track<Y>(amax, vexp2, f)) {
#pragma unroll
          for (int dt = 0; dt < kKS; ++dt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) o[dt][nt][e] *= f;
        }
      }
    }

    // ---- Oᵀ += Vᵀ Pᵀ, V dequantized per token pair (kVFold: bare codes, Pᵀ times the scales) ----
    // kFold: 0 dequantized, 1 kVFold (hi and lo in two mma), 2 kVPack (hi in columns 0-3, lo in 4-7)
    const auto values = [&](auto fold) {
      constexpr int kFold = decltype(fold)::value;
      using YF = typename Dependent<kFold, Y>::type;  // (Y, named through kFold: bf16 has no folded forms)
      const bool lo_lane = g >= 4;  // kVPack: this lane's B column carries a lo half
      (void)lo_lane;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kFold != 0) {  // Σ_t p_t z_t += P · Z: P as the A operand (Pᵀ's fragments are P's),
          // Z [16 tokens][8 groups] as B: column g = group g of the warp's dims (0 past ng)
          const uint32_t zp = svz + mt * rb_mt + rb_c2 + uint32_t(2 * g);
          const uint32_t zm = g < ng ? 0xffffffffu : 0u;
          const uint32_t zb0 = (lds16(zp) | (lds16(zp + rb_1) << 16)) & zm;
          const uint32_t zb1 = (lds16(zp + rb_8) | (lds16(zp + rb_8 + rb_1) << 16)) & zm;
          const uint32_t A[4] = {pt[mt][0][0], NT > 1 ? pt[mt][NT - 1][0] : 0u, pt[mt][0][1],
                                 NT > 1 ? pt[mt][NT - 1][1] : 0u};
          Y::mma(zacc, A, zb0, zb1);
        }
        uint32_t s01 = 0, z01 = 0, s89 = 0, z89 = 0;
        uint32_t ph[NT][2], pl[NT][2];  // kVFold: Pᵀ times the group's scales, hi and lo (kVPack: ph, the lane's half)
        const uint32_t prow = mt * rb_mt + rb_c2;  // tokens 2c (+1, +8, +9)
        const uint32_t pstep = rb_1, p8 = rb_8;
#pragma unroll
        for (int u = 0; u < kCV / 2; ++u) {
          uint32_t w[4];
          ldsm_x4_t(sv + uint32_t(mt * 16 * kRBV) + ldov[u], w);
#pragma unroll
          for (int hc = 0; hc < 2; ++hc) {
            const int ch = 2 * u + hc;
            if (FV::block_start(ch)) {
              const int blk = FV::block_first(ch);
              // a new group's pairs (kVPack: its scales at group starts only, kept in ph)
              const bool every = kFold != 2 && kVScaleEveryPiece && VBITS != 8;
              if (every || blk == 0 || (blk & bpg_mask) == 0) {
                const uint32_t go = prow + uint32_t((blk >> lbpg) * 2);
                if constexpr (kFold != 0) {  // the weights times the group's scales (and 2^e), hi and lo
                  s01 = YF::mul2(lds16(svs + go) | (lds16(svs + go + pstep) << 16), vexp2);
                  s89 = YF::mul2(lds16(svs + go + p8) | (lds16(svs + go + p8 + pstep) << 16), vexp2);
#pragma unroll
                  for (int nt = 0; nt < NT; ++nt) {
                    if constexpr (kFold == 2) {
                      ph[nt][0] = YF::mul2_part(pt[mt][nt][0], s01, lo_lane);
                      ph[nt][1] = YF::mul2_part(pt[mt][nt][1], s89, lo_lane);
                    } else {
                      YF::mul2_split(pt[mt][nt][0], s01, ph[nt][0], pl[nt][0]);
                      YF::mul2_split(pt[mt][nt][1], s89, ph[nt][1], pl[nt][1]);
                    }
                  }
                } else {
                  s01 = lds16(svs + go) | (lds16(svs + go + pstep) << 16);
                  z01 = lds16(svz + go) | (lds16(svz + go + pstep) << 16);
                  s89 = lds16(svs + go + p8) | (lds16(svs + go + p8 + pstep) << 16);
                  z89 = lds16(svz + go + p8) | (lds16(svz + go + p8 + pstep) << 16);
                }
              }
            }
            uint32_t ul[FV::kVRegs], uh[FV::kVRegs];
            if constexpr (kFold != 0) {
              FV::vcodes(w[2 * hc], ul);
              FV::vcodes(w[2 * hc + 1], uh);
            } else {
              FV::vunpack(w[2 * hc], s01, z01, ul);
              FV::vunpack(w[2 * hc + 1], s89, z89, uh);
            }
#pragma unroll
            for (int t = 0; t < FV::kVTiles; ++t) {
              const uint32_t A[4] = {ul[2 * t], ul[2 * t + 1], uh[2 * t], uh[2 * t + 1]};
              const int dt = ch * FV::kVTiles + t;
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                if constexpr (kFold == 1) {
                  Y::mma(o[dt][nt], A, ph[nt][0], ph[nt][1]);
                  Y::mma(o[dt][nt], A, pl[nt][0], pl[nt][1]);
                } else if constexpr (kFold == 2) {
                  Y::mma(o[dt][nt], A, ph[nt][0], ph[nt][1]);
                } else {
                  Y::mma(o[dt][nt], A, pt[mt][nt][0], pt[mt][nt][1]);
                }
              }
            }
          }
        }
      }
    };
    if constexpr (kVF) {
      values(std::integral_constant<int, 1>{});
    } else if constexpr (kVP) {
      if (vp) values(std::integral_constant<int, 2>{});
      else values(std::integral_constant<int, 0>{});
    } else {
      values(std::integral_constant<int, 0>{});
    }
    if constexpr (kPl) cur = nxt, nxt = __shfl_sync(0xffffffffu, taken, 0);
  }

  // ---- kVFold: the accumulators back to Σ p v (codes were c 2^-24 with c = n vfactor, weights
  // p s 2^e), plus Σ p z of the element's group (lane (group, c) holds it)
  // (kVPack: first the lo columns 4-7, lanes c + 2, added to the hi columns 0-3 of lanes c)
  if constexpr (kVF || kVP) {
    if (folded) {
      if constexpr (kVP) {
#pragma unroll
        for (int dt = 0; dt < kKS; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[dt][0][e] += __shfl_xor_sync(0xffffffffu, o[dt][0][e], 2);
      }
      const float unit = ldexpf(1.0f, 24 - f16_pow2_exp(vexp2));
      // group gg of row 2c + e (n-tile nt) sits in lane (2c + e, gg / 2), element 2 nt + gg % 2
      float zb[S::kNGW][NT][2];
#pragma unroll
      for (int gg = 0; gg < S::kNGW; ++gg)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            zb[gg][nt][e] = __shfl_sync(0xffffffffu, zacc[2 * nt + (gg & 1)], 4 * (2 * c + e) + (gg >> 1));
#pragma unroll
      for (int dt = 0; dt < kKS; ++dt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = 2 * (dt % FV::kVTiles) + (e >> 1);
            const int grp = FV::vdim(dt, g + 8 * (e >> 1)) >> (lbpg + 5);
            float z = zb[0][nt][e & 1];
#pragma unroll
            for (int gg = 1; gg < S::kNGW; ++gg)
              if (grp == gg) z = zb[gg][nt][e & 1];
            o[dt][nt][e] = fmaf(o[dt][nt][e], unit * (1.0f / float(FV::vfactor(k))), z);
          }
    }
  }

  // ---- merge the warps into one partial per row ----------------------------------------------
#if QSDPA_MMA_TRACE
  // (this warp's loop; the pool's blocks record their first kWarps warps)
  if (unsigned long long* e = trace_record(a); e && lane == 0 && warp < kWarps) e[kTraceWarp0 + warp] = global_ns();
#endif
  cp_wait<0>();
  __syncthreads();
#if QSDPA_MMA_TRACE
  const unsigned long long tr_loop = global_ns();
#endif
  // (one state per tile group: the kDS warps of a d-split group share m and l, each its dims of o)
  float* mw = reinterpret_cast<float*>(smem);  // [kTG][kRT]
  float* lw = mw + kTG * kRT;                  // [kLW][kRT]
  float* ow = lw + S::kLW * kRT;               // [kTG][kRT][D], head dims swizzled (osw)
  // The 32 lanes of one store below hold 8 head dims (g) of 4 rows (c) whose rows lie D floats
  // apart, in one bank without a swizzle: 4 ways (8 with 2-bit values, whose g + 4 falls on g's
  // bank too), so 32 stores of 4 wavefronts for each of the pool's 16 warps, ~1 us at its blocks'
  // end. Flipping low bits of the head dim by the row (and, 2-bit, by bit 5 of the dim) puts every
  // lane on its own bank; a row's 32 consecutive dims stay in one 32-dim block, which the merge
  // reads without conflicts.
  // osw(lr, d): where head dim d of row lr lies; the flipped bits (kOswMask) are constant in each
  // store's d, so that a store's address is one of a few per-lane bases plus an immediate.
  // (Not in the two-n-tile kernels: with it, their register allocation in the token loop changed
  // and Lq=4 4-bit took 120.3 us against 117.0, H200 run 59.)
  constexpr int kOswMask = !kOSwizzle || (NT == 2 && QSDPA_MMA_OSWIZZLE < 2) ? 0 : VBITS == 4 ? 3 : VBITS == 8 ? 0x11 : 7;
  const auto osw_flip = [](int lr, int d) {  // (the bits flipped in d: kOswMask's at most)
    const int c2 = (lr >> 1) & 3;
    (void)d;
    if constexpr (VBITS == 4) return c2;                            // g on bits 2..4
    else if constexpr (VBITS == 8) return (c2 & 1) | ((c2 & 2) << 3);  // g on bits 1..3
    else return c2 | (((d >> 5) & 1) << 2);                         // g on bits 3..5
  };
  const auto osw = [&](int lr, int d) { return kOswMask ? d ^ osw_flip(lr, d) : d; };
  // this lane's flip, the same in each of its stores (rows 2c + 8 nt (+1); 2-bit: bit 5 of 8 g)
  const int oflip = kOswMask ? osw_flip(2 * c, 8 * g) : 0;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = lsum[nt][e];
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
      if (g == 0 && dc == 0) {
        const int lr = nt * 8 + 2 * c + e;
        mw[tgrp * kRT + lr] = m[nt][e];
        lw[tgrp * kRT + lr] = l;
      }
    }
#pragma unroll
  for (int dt = 0; dt < kKS; ++dt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lr = nt * 8 + 2 * c + (e & 1);
        const int dd = dc * kDW + FV::vdim(dt, g + 8 * (e >> 1));  // (bits of kOswMask: constant)
        ow[(tgrp * kRT + lr) * D + (dd & ~kOswMask) + ((dd & kOswMask) ^ oflip)] = o[dt][nt][e];
      }
  __syncthreads();
  trace_step(a, kTraceOStored);
  // Per row (one thread each): the warps' weights ex2(m_w - m) in place of m_w, the merged l and
  // m in lw[0][row] and lw[1][row] (only this thread touches the row's entries).
  if (tid < nrows) {
    const int lr = tid;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kTG; ++w) mx = fmaxf(mx, mw[w * kRT + lr]);
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kTG; ++w) {
      const float mwv = mw[w * kRT + lr];
      const float f = mwv == -INFINITY ? 0.0f : ex2(mwv - mx);
      l = fmaf(f, lw[w * kRT + lr], l);
      mw[w * kRT + lr] = f;
    }
    lw[lr] = l;
    lw[kRT + lr] = mx;
    if constexpr (kCompact) rpos[lr] = int64_t(split) * rows_total + qrow_of(lr);  // (free after the loop)
  }
  __syncthreads();
  trace_step(a, kTraceRowStep);
  if constexpr (kEpiVec) {
    // Four consecutive head dims per thread: one 16-byte load per warp's o (the swizzle keeps an
    // aligned four together, permuted by the low bits of the row's flip), one 16-byte store.
    static_assert(D % 4 == 0 && ((kTG + S::kLW) * kRT) % 4 == 0 && S::kMain % 16 == 0, "16-byte aligned o rows");
    for (int idx = tid; idx < nrows * (D / 4); idx += W * 32) {
      const int lr = idx / (D / 4), d = (idx - lr * (D / 4)) * 4;
      const int f = kOswMask ? osw_flip(lr, d) & kOswMask : 0, ds = d ^ (f & ~3), sw = f & 3;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kTG; ++w) {
        const float wt = mw[w * kRT + lr];
        const float4 u = *reinterpret_cast<const float4*>(ow + (w * kRT + lr) * D + ds);
        v.x = fmaf(wt, u.x, v.x), v.y = fmaf(wt, u.y, v.y), v.z = fmaf(wt, u.z, v.z), v.w = fmaf(wt, u.w, v.w);
      }
      // element j of the four is v[j ^ sw]
      float4 acc = v;
      if (sw & 1) acc = make_float4(acc.y, acc.x, acc.w, acc.z);
      if (sw & 2) acc = make_float4(acc.z, acc.w, acc.x, acc.y);
      const float l = lw[lr], mx = lw[kRT + lr];
      if (kCl) {  // this split's state, for cluster_combine (the query rows' space is free now)
        *reinterpret_cast<float4*>(qf + lr * D + d) = acc;
        if (d == 0) qc[lr] = mx, qc[kRT + lr] = l;
        continue;
      }
      if (direct) {  // as below, four at a time
        int i;
        const int64_t h = kvh * rep + row_head(r0 + lr, Lq, i);
        float wgt = 0.0f;
        if (mx != -INFINITY) {
          float den = l, f2 = 1.0f;
          if (a.sinks) {
            const float sk = a.sinks[h] * kLog2e, mm = fmaxf(mx, sk);
            f2 = ex2(mx - mm);
            den = fmaf(l, f2, ex2(sk - mm));
          }
          wgt = f2 / den;
        }
        store4_t(a.out, a.dtype, a.omap.at(b, h, i) + d, make_float4(acc.x * wgt, acc.y * wgt, acc.z * wgt, acc.w * wgt));
        continue;
      }
      const int64_t prow = kCompact ? rpos[lr] : int64_t(split) * rows_total + qrow_of(lr);
      *reinterpret_cast<float4*>(a.part_o + prow * D + d) = acc;
      if (d == 0) {
        a.part_m[prow] = mx == -INFINITY ? -INFINITY : mx * kLn2;
        a.part_l[prow] = l;
      }
    }
  } else  // (QSDPA_MMA_EPI_VEC=0: one head dim per thread)
  for (int idx = tid; idx < nrows * D; idx += W * 32) {
    const int lr = idx / D, d = idx - lr * D, ds = osw(lr, d);
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kTG; ++w) acc = fmaf(mw[w * kRT + lr], ow[(w * kRT + lr) * D + ds], acc);
    const float l = lw[lr], mx = lw[kRT + lr];
    if (kCl) {  // this split's state, for cluster_combine (the query rows' space is free now)
      qf[lr * D + d] = acc;
      if (d == 0) qc[lr] = mx, qc[kRT + lr] = l;
      continue;
    }
    if (direct) {  // out = acc / l, or with the row's sink acc e^(m - m') / (l e^(m - m') + e^(sink - m'))
      int i;
      const int64_t h = kvh * rep + row_head(r0 + lr, Lq, i);
      float wgt = 0.0f;  // (m = -inf: no visible key, zeros with or without a sink)
      if (mx != -INFINITY) {
        float den = l, f = 1.0f;
        if (a.sinks) {
          const float sk = a.sinks[h] * kLog2e, mm = fmaxf(mx, sk);
          f = ex2(mx - mm);
          den = fmaf(l, f, ex2(sk - mm));
        }
        wgt = f / den;
      }
      store_t(a.out, a.dtype, a.omap.at(b, h, i) + d, acc * wgt);
      continue;
    }
    // (kCompact: the row's partial index from the per-row step, not a division by Lq per element)
    const int64_t prow = kCompact ? rpos[lr] : int64_t(split) * rows_total + qrow_of(lr);
    a.part_o[prow * D + d] = acc;
    if (d == 0) {
      a.part_m[prow] = mx == -INFINITY ? -INFINITY : mx * kLn2;
      a.part_l[prow] = l;
    }
  }
  trace_step(a, kTraceStores);  // (its stores issued)
  if (kCl) cluster_combine<D, kRT, W>(a, qc, qc + kRT, qf, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
  // (its scratch space: the warps' states, free once every thread has passed its first barrier)
  else if (a.counters && !direct) {
    if constexpr (kCompactMerge) merge_if_last_compact<T, D, kRT, W>(a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
    else merge_if_last<kRT, W>(a, reinterpret_cast<float*>(smem), nrows, r0, b, kvh, rep, Lq);
  } else if (QSDPA_MMA_ARRIVALS && a.arrivals) {
    arrive_count(a);
  }
#if QSDPA_MMA_TRACE
  if (tid == 0 && a.trace)
    trace_block(a, tr_start, tr_loop, !kCl && a.counters && !direct && *reinterpret_cast<const int*>(smem));
#endif
}

// A launch of `kern`'s blocks (`threads` each, dynamic shared memory smem): in clusters of `splits` along y when
// splits > 0, as a programmatic dependent of the stream's previous work when pdl; `attr` holds
// the attributes the config points to.
inline cudaLaunchConfig_t launch_config(dim3 grid, int threads, int smem, cudaStream_t stream, int splits, bool pdl,
                                        cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads), 1u, 1u);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  unsigned n = 0;
  if (splits > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = unsigned(splits);
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) attr[n++] = programmatic_launch_attribute();
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

// The kernel's dynamic shared-memory opt-in (smem bytes) and the max-shared carveout, once per
// device (devices 0..63, recorded in `opted`; others ask on every launch). The combine kernel
// that follows asks for the same carveout (combine.cu): no switch of the L1 / shared split
// between the two.
template <class K>
cudaError_t opt_in_once(K* kern, int smem, std::atomic<uint64_t>& opted) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (opted.load(std::memory_order_acquire) & bit) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared));
      e != cudaSuccess)
    return e;
  opted.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

// Launches one instantiation: grid (B * Hkv * query-row tiles of 8 * NT, num_splits).
template <class T, int BITS, int VBITS, int D, int NT, bool KDEN, int STAGES, int LAYOUT, int GC>
cudaError_t launch(const AttnArgs& a, cudaStream_t stream) {
  constexpr int W = warps_of(LAYOUT);
  using S = Shape<T, BITS, VBITS, D, NT, KDEN, STAGES, W>;
  auto* kern = attention_kernel<T, BITS, VBITS, D, NT, KDEN, STAGES, LAYOUT, GC>;
  static std::atomic<uint64_t> opted{0};
  if (cudaError_t e = opt_in_once(kern, S::kSmem, opted); e != cudaSuccess) return e;
  const int64_t R = a.Hq / a.Hkv * a.Lq, row_tiles = (R + S::kRT - 1) / S::kRT;
  if (a.B * a.Hkv * row_tiles > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.B * a.Hkv * row_tiles), unsigned(a.num_splits), 1u);
  // (clusters: the splits of a row tile as one cluster, cluster_fits says they are resident)
  const int cluster = is_cluster(LAYOUT) ? a.num_splits : 0;
  if (cluster > 0 || a.pdl) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = launch_config(grid, W * 32, S::kSmem, stream, cluster, a.pdl != 0, attr);
    return cudaLaunchKernelEx(&cfg, kern, a);
  }
  kern<<<grid, W * 32, S::kSmem, stream>>>(a);
  return cudaGetLastError();
}

// How many clusters of `splits` blocks of this instantiation can be resident at once (0: none;
// the kernel's attributes set as launch() sets them, plus the non-portable sizes above 8).
template <class T, int BITS, int VBITS, int D, int NT, bool KDEN, int STAGES, int LAYOUT, int GC>
int cluster_fits(int splits) {
  if (!kClusterCode || !is_cluster(LAYOUT)) return 0;
  constexpr int W = warps_of(LAYOUT);
  using S = Shape<T, BITS, VBITS, D, NT, KDEN, STAGES, W>;
  auto* kern = attention_kernel<T, BITS, VBITS, D, NT, KDEN, STAGES, LAYOUT, GC>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
      cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      launch_config(dim3(1u, unsigned(splits), 1u), W * 32, S::kSmem, nullptr, splits, false, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace qsdpa::cuda::mmak
