// Resolved layouts (qsdpa.hpp: CacheLayout, Strides): every kAuto replaced by its value, in plain
// structs that host code and CUDA kernels share. One function says where a (sequence, head, token)
// row of a cache lives; every backend addresses the cache through it.
#pragma once

#include <cstdint>

#include "qsdpa/qsdpa.hpp"

#if defined(__CUDACC__)
#define QSDPA_HD __host__ __device__ __forceinline__
#else
#define QSDPA_HD inline
#endif

namespace qsdpa::detail {

// Where the rows of a cache live (CacheLayout, resolved).
struct RowMap {
  int64_t token_stride = 1;
  int64_t head_stride = 0;
  int64_t batch_stride = 0;        // contiguous only
  const int32_t* block_table = nullptr;  // nullptr: contiguous
  int64_t bt_stride = 0;
  int64_t page_stride = 0;
  int page_shift = 0;  // log2(page_size); 0 when contiguous

  // The row of token t of KV head h of sequence b.
  QSDPA_HD int64_t row(int64_t b, int64_t h, int64_t t) const {
    if (!block_table) return b * batch_stride + h * head_stride + t * token_stride;
    const int64_t page = block_table[b * bt_stride + (t >> page_shift)];
    return page * page_stride + h * head_stride + (t & ((int64_t(1) << page_shift) - 1)) * token_stride;
  }
  // Tokens from t to the end of its page (contiguous: unbounded).
  QSDPA_HD int64_t page_rest(int64_t t) const {
    if (!block_table) return INT64_MAX;
    return (int64_t(1) << page_shift) - (t & ((int64_t(1) << page_shift) - 1));
  }
  // The default [B, Hkv, N] layout with nothing in between (what the fast paths assume).
  QSDPA_HD bool dense(int64_t Hkv, int64_t N) const {
    return !block_table && token_stride == 1 && head_stride == N && batch_stride == Hkv * N;
  }
};

inline int ilog2_exact(int64_t x) {
  int r = 0;
  while ((int64_t(1) << r) < x) ++r;
  return r;
}

// N: the tokens per sequence that derive the contiguous defaults (attention: N; append: capacity).
inline RowMap resolve_layout(const CacheLayout& l, int64_t Hkv, int64_t N) {
  RowMap m;
  m.token_stride = l.token_stride == kAuto ? 1 : l.token_stride;
  if (l.block_table) {
    const int64_t ps = l.page_size;
    m.block_table = l.block_table;
    m.page_shift = ilog2_exact(ps);
    m.head_stride = l.head_stride == kAuto ? ps : l.head_stride;
    m.page_stride = l.page_stride == kAuto ? Hkv * ps : l.page_stride;
    m.bt_stride = l.block_table_stride == kAuto ? (N + ps - 1) / ps : l.block_table_stride;
  } else {
    m.head_stride = l.head_stride == kAuto ? N : l.head_stride;
    m.batch_stride = l.batch_stride == kAuto ? Hkv * m.head_stride : l.batch_stride;
  }
  return m;
}

// Element strides of a [B, H, L, X] tensor (Strides, resolved).
struct ElemMap {
  int64_t b = 0, h = 0, l = 0;
  QSDPA_HD int64_t at(int64_t bi, int64_t hi, int64_t li) const { return bi * b + hi * h + li * l; }
};

inline ElemMap resolve_strides(const Strides& s, int64_t H, int64_t L, int64_t X) {
  ElemMap m;
  m.l = s.l == kAuto ? X : s.l;
  m.h = s.h == kAuto ? L * X : s.h;
  m.b = s.b == kAuto ? H * L * X : s.b;
  return m;
}

// Per-sequence lengths, clamped to the ranges AttentionParams documents (the host backends have
// checked them already; this keeps a device kernel in bounds whatever it is given).
QSDPA_HD int64_t seq_kv_len(const int32_t* kv_lens, int64_t b, int64_t N) {
  if (!kv_lens) return N;
  const int64_t n = kv_lens[b];
  return n < 0 ? 0 : n > N ? N : n;
}
QSDPA_HD int64_t seq_q_len(const int32_t* q_lens, int64_t b, int64_t Lq, int64_t n) {
  if (!q_lens) return Lq < n ? Lq : n;
  int64_t l = q_lens[b];
  l = l < 0 ? 0 : l > Lq ? Lq : l;
  return l < n ? l : n;
}

}  // namespace qsdpa::detail

