// The tensor-core attention kernel for f16 and bf16 (mma.sync, sm_80 and newer): reads the
// MLX-quantized cache once per (sequence, KV head) for all query rows of the GQA group and writes
// split-K partials (split_kv.cuh). The generic kernel takes every problem this one does not.
#pragma once

#include <cuda_runtime.h>

#include "split_kv.cuh"

namespace qsdpa::cuda {

// True when the tensor-core kernel handles the problem: T f16 or bf16; K and V with one group size
// (32, 64 or 128) and bits 4 or 8 for both, or 8-bit keys with 4-bit values; D 64, 128 or 256; at most 64 query rows per KV head
// (rep * Lq; each block takes 16 rows, 8 for D = 256, and every further row tile is another block
// that reads the cache again); the packed words, scales and biases 16-byte aligned. Masks,
// windows and sinks are all supported.
bool mma_supports(const AttnArgs& a);

// The layout instantiation that reads a's caches (mmak::kContig, kPaged, kPaged16 or kAny), -1 when
// mma_supports(a) is false.
int mma_layout_kind(const AttnArgs& a);
// Whether `a` runs on the instantiations with the group size 64 as a constant (sm_90a builds and
// devices of compute capability 9.0; AttnArgs::sm90a).
bool mma_fixed_group(const AttnArgs& a);

// Whether the tile pool (AttnArgs::pool: one block of 16 warps per multiprocessor, its warps taking
// tiles from a counter in shared memory) can run `a`: contiguous caches, groups of 64 on sm_90a,
// 4-bit keys and values, D = 128, at most 8 query rows per KV head.
bool mma_pool_fits(const AttnArgs& a);

// Whether `a` runs on the D = 512 kernel with the query rows on the mma's M dimension
// (mma_rowsm.cuh: f16, 4- or 8-bit keys and values of one width, groups of 64 on sm_90a,
// contiguous caches, 9 to 16 query rows per KV head, one block of 8 warps per 16 rows), when
// a.rowsm asks for it.
bool mma_rowsm(const AttnArgs& a);

// Token granularity of the splits: the dispatcher makes a.chunk a multiple of this.
int mma_token_tile(const AttnArgs& a);

// Blocks per (b * Hkv, split): the query-row tiles of the grid (1 while rep * Lq <= 16, D <= 128).
int64_t mma_row_tiles(const AttnArgs& a);
// Query rows of one of those row tiles (8 or 16; 16 for mma_rowsm).
int mma_tile_rows(const AttnArgs& a);

// Blocks of this kernel that one multiprocessor holds at once for this problem (occupancy). The
// kernel is sensitive to waves: measured on an H200 (132 SMs, 3 blocks each) for B = 8, Hkv = 8,
// N = 32768, D = 128, the time was lowest with B * Hkv * row_tiles * num_splits just under one
// full wave (6 splits: 384 blocks) and 10-25 % higher with 5, 8 or 12 splits. Planners should aim for
// num_splits = max(1, SMs * mma_blocks_per_sm() / (B * Hkv * mma_row_tiles())).
int mma_blocks_per_sm(const AttnArgs& a);

// How many thread-block clusters of `splits` blocks can be resident at once (0: none), each the
// splits of one (b, KV head, row tile) merging in the kernel instead of through the combine
// kernel (AttnArgs::cluster; compute capability 9.0 and newer, at most mmak::kMaxClusterSplits,
// contiguous caches only).
int mma_max_clusters(const AttnArgs& a, int splits);

// Writes a.part_m / part_l / part_o for a.num_splits splits of a.chunk tokens, split s covering
// [a.t_begin + s * a.chunk, a.t_begin + (s + 1) * a.chunk) clipped to [0, N). Grid: one block
// per (b * Hkv, split, tile of query rows); with a.cluster the splits of a row tile form one
// cluster and write `out` instead (mma_max_clusters must allow all of them at once). Returns the launch error.
cudaError_t mma_launch(const AttnArgs& a, cudaStream_t s);

}  // namespace qsdpa::cuda
