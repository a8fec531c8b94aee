// Host-side entry points of the kernels in this folder (the tensor-core kernel declares its own in
// attention_mma.cuh). Every launcher enqueues on the given stream and returns the launch error.
#pragma once

#include <cuda_runtime.h>

#include "qsdpa/qsdpa.hpp"
#include "split_kv.cuh"

namespace qsdpa::cuda {

// ---- generic attention (generic_attention.cu): every format, type, head dim and mask ----------
// Token granularity of the generic kernel's splits (a split may start at any token; chunks that
// are multiples of this keep its shared-memory tiles whole).
constexpr int kGenericTokenTile = 64;

// Query-row tiles per (b, KV head): the generic kernel runs one block per (split, b, KV head, row
// tile), so the split planner counts them as independent work.
int64_t generic_row_tiles(const AttnArgs& a);

// Writes the split-K partials of split_kv.cuh for a.num_splits splits of a.chunk tokens, split s
// covering [a.t_begin + s * a.chunk, a.t_begin + (s + 1) * a.chunk) clipped to [0, N).
cudaError_t generic_launch(const AttnArgs& a, cudaStream_t s);

// Blocks of the generic kernel for this problem that one multiprocessor holds at once (occupancy
// query on the current device, cached; 1 when the query fails).
int generic_blocks_per_sm(const AttnArgs& a);

// ---- combine (combine.cu) ---------------------------------------------------------------------
// Merges the partials of every split, adds the sink, writes zeros for rows with no visible key and
// rounds to T: every element of a.out is written.
cudaError_t combine_launch(const AttnArgs& a, cudaStream_t s);

// ---- quantize / dequantize (quantize.cu): bit-identical to the host quantizer ----------------
cudaError_t quantize_launch(const QuantizeParams& p, cudaStream_t s);
cudaError_t dequantize_launch(const DequantizeParams& p, cudaStream_t s);
// append (AppendParams): K and V rows of every layer, sequence and head in one launch.
cudaError_t append_launch(const AppendParams& p, cudaStream_t s);

}  // namespace qsdpa::cuda
