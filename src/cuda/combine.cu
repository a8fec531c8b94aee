// The split-K combine step (split_kv.cuh): for each query row, merge the (m, l, o) partials of all
// splits with the row's sink, divide, and round to T once. Rows with no visible key get zeros,
// with or without a sink (SPEC section 3), and so do rows past their sequence's q_lens[b] (no split
// sees a key for them). Every element of `out` is written, at out's strides. With no split at all
// (N = 0) it writes zeros.
//
// One block per row (grid-strided), in W groups of lanes that take every W-th split; each lane
// owns 4 consecutive elements of D, so the o partials of one split are read as coalesced 16-byte
// loads. The per-split scalars (m, l) are read 32 splits at a time, one per lane, and broadcast
// with shuffles, and the o loads are not behind a branch: a decode call has many short splits,
// and the combine is a chain of L2 round trips when the splits are read one after another (it
// sits on the critical path of every call, after the attention kernel; measured on an H200 with
// 32 splits: 12 us under ncu when each o load sat behind its split's visibility test).
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "common.cuh"
#include "kernels.cuh"

namespace qsdpa::cuda {
namespace {

constexpr int64_t kMaxBlocks = 1 << 20;

// (a.arrivals) waits until *count reaches `target` (the attention blocks' arrivals, released after
// their partial stores: an acquire load, a short sleep between reads).
__device__ __forceinline__ void wait_count(const int* count, int target) {
#ifdef __CUDA_ARCH__  // (every architecture built is sm_80 or newer)
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(count) : "memory");
    if (v >= target) return;
    __nanosleep(128);
  }
#endif
}

// W groups of lanes per block, each the splits s = g (mod W) of the row: their o loads are
// independent and have no branch, so that a group has all of its loads of a batch of 32 splits in
// flight at once; the groups' sums meet in shared memory at the end (in group order). Measured on
// an H200 (2026-12-01, ncu; 64 splits of 32 rows, D = 128 / of 64 rows, D = 512): one group, the
// splits one after another, 21.2 / 21.6 us; groups, the two batches of 32 splits one after the
// other, 8.3 / 9.7 us (run 31); the first 64 splits' (m, l) are now read at once and both batches'
// loads issued together.
//
// One group per block (few splits or many rows) and 8 groups of a warp (D <= 128): at most 128 and
// 256 threads. Four groups of up to 4 warps (D <= 512): up to 512 threads.
// PRE: the combine in one round (QSDPA_COMBINE_ONE_ROUND), in every kernel but the one for D > 256:
// there its 512 threads took 128 registers each (136 without a launch bound, and D = 512 failed to
// launch: run 85), the whole register file of a multiprocessor, and its blocks, placed early as
// programmatic dependents, hold it while they wait for the attention grid. Measured on an H200
// (2026-12-04, run 86, against the two-round form in the same run): D=512 4-bit 65.8 -> 67.8 us,
// 8-bit 69.3 -> 74.0 with it; the two-round kernel there takes 72 registers.
// LC: each row's head dims in 2^LC slices of D >> LC, a block per (row, slice) (combine_launch).
// The first 64 splits' (m, l) of a row read once per block of groups (QSDPA_COMBINE_SHARED_ML,
// default 1; 0: by every warp). Run 97's trace (H100, D = 512 4-bit, 2026-12-06): from the end of
// the combine blocks' wait until their first row's (m, l) were in and reduced, 3.4-3.9 us of the
// 4.9 us a block took after its wait, for one round of loads that every warp of every block issued
// at once (8 warps x 4 scattered loads per block). Measured (H100, run 98, 3 rounds against 0 in
// the same run): that step 2.0 us, the combine's end 6.2 -> 4.0 us after the attention grid's;
// D=512 4-bit 58.0 -> 56.0 us, 8-bit 62.1 -> 60.0; D=256 within 0.1 us.
#ifndef QSDPA_COMBINE_SHARED_ML
#define QSDPA_COMBINE_SHARED_ML 1
#endif
constexpr bool kSharedML = QSDPA_COMBINE_SHARED_ML != 0;

template <int W, bool PRE>
__global__ void combine_kernel(const AttnArgs a, int64_t rows, int lc) {
#if QSDPA_MMA_TRACE
  // (trace builds) when the block was placed: before its wait, which it may begin while the
  // attention grid still runs
  const unsigned long long tr_start = global_ns();
  unsigned long long tr_loaded = 0ull, tr_summed = 0ull;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the attention kernel (combine_launch): wait for it to
  // finish and its partials to be visible (A no-op when launched the ordinary way), unless its
  // blocks count their arrivals (a.arrivals): then each row waits for its own row tile below.
  // Then the next kernel of the stream may be placed: it waits in its turn before it touches memory.
  if (!a.arrivals) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#if QSDPA_MMA_TRACE
  // (trace builds) when its wait ended (the grid's end, or its first row's row tile), when its
  // first row's (m, l) were in and reduced, when that row's sum was complete, and when it ended
  unsigned long long tr_waited = a.arrivals ? 0ull : global_ns();
#endif
  constexpr int kLanes = W == 8 ? 32 : W == 4 ? 128 : 1;  // lanes of a group at most (groups 1..)
  __shared__ float4 red_o[W][kLanes];        // groups 1.. : their sums
  __shared__ float red_d[W][kLanes];
  __shared__ float2 ml_s[W > 1 ? 64 : 1];  // (kSharedML) the first 64 splits' (m, l) of the row
  const int D = int(a.D), S = a.num_splits, DS = D >> lc;  // DS: the head dims of a slice
  const int T4 = int(blockDim.x) / W;  // lanes of a group (a multiple of 32)
  const int grp = int(threadIdx.x) / T4, t = int(threadIdx.x) - grp * T4, lane = t & 31;
  const bool active = t * 4 < DS;
  // Lanes past the slice read its column 0 (in bounds) and write nothing.
  const int dt = active ? t * 4 : 0;
  const int64_t slots = rows << lc;
  for (int64_t slot = blockIdx.x; slot < slots; slot += gridDim.x) {
    const int64_t row = slot >> lc;
    const int d0 = (int(slot) & ((1 << lc) - 1)) * DS + dt;  // (the lane's first head dim)
    // (a.arrivals) the row's row tile of the attention kernel, and its rows
    int64_t tile = 0;
    int tile_n = 0, readers = 0;
    if (a.arrivals) {
      const int64_t rep = a.Hq / a.Hkv, R = rep * a.Lq, bh = row / a.Lq, b = bh / a.Hq, h = bh - b * a.Hq;
      const int64_t kvh = h / rep, r = (h - kvh * rep) * a.Lq + (row - bh * a.Lq), rt = r / a.tile_rows;
      tile = (b * a.Hkv + kvh) * ((R + a.tile_rows - 1) / a.tile_rows) + rt;
      tile_n = int(std::min<int64_t>(a.tile_rows, R - rt * a.tile_rows));
      if (threadIdx.x == 0) {
        wait_count(a.arrivals + tile, S);
        // The row counts itself as read now (every split has arrived), so that the atomic's round
        // trip overlaps the merge; the last of the tile's rows sets the count back to 0 at the end.
        readers = atomicAdd(a.arrivals + tile, 1) - S;
      }
      __syncthreads();
      __threadfence();  // (the partials, behind the count)
#if QSDPA_MMA_TRACE
      if (!tr_waited) tr_waited = global_ns();
#endif
    }
    const float* pm = a.part_m + row;
    const float* pl = a.part_l + row;
    const float* po = a.part_o + row * D + d0;
    const int64_t so = rows * D;
    // Lane j holds the (m, l) of splits j and j + 32 (the first 64), read once (a decode call rarely
    // has more); the max over all splits and a split that attains it (its o is written: every split
    // that sees a key writes o, others may not).
    float mh[2] = {-INFINITY, -INFINITY}, lh[2] = {0.f, 0.f};
    // (QSDPA_COMBINE_ONE_ROUND, split_kv.cuh) the o of the group's splits of the first two batches
    // (W = 1: of the first kPre splits, when there are no more), loaded in the same round as the
    // (m, l): every split writes its o, so no load waits for the max. A split past S reads split
    // S - 1's (weighted by 0), and a weight of 0 never touches the sum (a select, not a product).
    // The splits that wrote their o: with per-sequence lengths, the tensor-core kernel's splits past
    // the sequence's end write only m and l (its split s covers t_begin + s chunk on); a split past
    // them reads the last one's o instead (weighted by 0).
    int sv = S;
    if (PRE && a.kv_lens)
      sv = splits_with_tokens(detail::seq_kv_len(a.kv_lens, row / (a.Hq * a.Lq), a.N), a.t_begin, a.chunk, S);
    constexpr int kPre = W == 1 ? 8 : 32 / W, kPreB = W == 1 ? 1 : 2;
    float4 ob[kPreB][kPre];
    const bool pre = PRE && sv >= 1 && (W > 1 || S <= kPre);
    if (pre) {
#pragma unroll
      for (int bt = 0; bt < kPreB; ++bt)
#pragma unroll
        for (int j = 0; j < kPre; ++j) {
          const int sp = 32 * bt + (W == 1 ? j : j * W + grp);
          ob[bt][j] = bt == 0 || S > 32
                          ? __ldcg(reinterpret_cast<const float4*>(po + int64_t(sp < sv ? sp : sv - 1) * so))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    if constexpr (W > 1 && kSharedML) {
      // (groups: the first 64 splits' (m, l) loaded once per block, by its first two warps, and
      // passed on in shared memory, rather than by every warp: 8x fewer scattered L2 requests when
      // all the blocks start at once at the attention grid's end; the barrier at the end of the
      // row's step orders the next row's writes after these reads)
      if (threadIdx.x < 64) {
        const int s = int(threadIdx.x);
        ml_s[s] = s < S ? make_float2(__ldcg(pm + int64_t(s) * rows), __ldcg(pl + int64_t(s) * rows))
                        : make_float2(-INFINITY, 0.f);
      }
      __syncthreads();
#pragma unroll
      for (int bt = 0; bt < 2; ++bt) {
        const float2 v = ml_s[32 * bt + lane];
        mh[bt] = v.x, lh[bt] = v.y;
      }
    } else {
#pragma unroll
      for (int bt = 0; bt < 2; ++bt)
        if (32 * bt + lane < S) {
          mh[bt] = __ldcg(pm + int64_t(32 * bt + lane) * rows);
          lh[bt] = __ldcg(pl + int64_t(32 * bt + lane) * rows);
        }
    }
    float mx = -INFINITY;  // (a NaN m is never the max, as with fmaxf)
    int arg = 0;
    if (mh[0] > mx) mx = mh[0], arg = lane;
    if (mh[1] > mx) mx = mh[1], arg = 32 + lane;
    for (int s0 = 64; s0 < S; s0 += 32) {
      const int s = s0 + lane;
      if (s < S) {
        const float v = __ldcg(pm + int64_t(s) * rows);
        if (v > mx) mx = v, arg = s;
      }
    }
    warp_max_arg(mx, arg);
#if QSDPA_MMA_TRACE
    if (!tr_loaded) tr_loaded = global_ns();
#endif
    float r[4] = {0.f, 0.f, 0.f, 0.f};
    float denom = 0.f;
    // one split's terms: its weight w times its l and its o
    const auto add = [&](float w, float l, const float4& o) {
      denom = fmaf(w, l, denom);
      r[0] = fmaf(w, o.x, r[0]);
      r[1] = fmaf(w, o.y, r[1]);
      r[2] = fmaf(w, o.z, r[2]);
      r[3] = fmaf(w, o.w, r[3]);
    };
    // The weighted sum of one batch of 32 splits from s0 (lane j's m and l: split s0 + j's, -inf and
    // 0 when it sees no key or lies past S: its o, possibly never written, is not read, the load
    // takes split arg's instead, weighted by 0): the group's splits of the batch in order (a
    // sequential sum per group); every lane runs it (the shuffles need the whole warp).
    const auto batch = [&](int s0, float mj, float lj) {
      const bool visj = mj != -INFINITY;
      const float wj = visj ? expf(mj - mx) : 0.f;
      const auto one = [&](int k) {
        const float w = __shfl_sync(0xffffffffu, wj, k);
        const float l = __shfl_sync(0xffffffffu, lj, k);
        const bool vis = __shfl_sync(0xffffffffu, visj ? 1 : 0, k) != 0;
        // (an invisible split has w = 0 and l = 0, and the o read in its place is finite)
        add(w, l, __ldcg(reinterpret_cast<const float4*>(po + int64_t(vis ? s0 + k : arg) * so)));
      };
      if constexpr (W == 1) {  // (few splits: only the batch's own)
        const int n = min(32, S - s0);
#pragma unroll 16
        for (int k = 0; k < n; ++k) one(k);
      } else {  // every group's share of the batch, loads without a branch
#pragma unroll
        for (int kk = 0; kk < 32 / W; ++kk) one(kk * W + grp);
      }
    };
    // The same for batch bt (0 or 1) from the o loaded with the (m, l) (pre).
    const auto batch_pre = [&](auto btc, float mj, float lj) {
      constexpr int bt = decltype(btc)::value;
      const bool visj = mj != -INFINITY;
      const float wj = visj ? expf(mj - mx) : 0.f;
#pragma unroll
      for (int j = 0; j < kPre; ++j) {
        const int k = W == 1 ? j : j * W + grp;
        if (W == 1 && k >= S) break;  // (S is the same in every lane)
        const float w = __shfl_sync(0xffffffffu, wj, k);
        const float l = __shfl_sync(0xffffffffu, lj, k);
        if (w != 0.f) add(w, l, ob[bt][j]);
      }
    };
    // (mx and arg are the same in every lane of the block; mx = -inf: no key is visible)
    if (mx != -INFINITY) {
      if (a.sinks) {  // (its term counted once, by group 0)
        const float sink = a.sinks[(row / a.Lq) % a.Hq];
        mx = fmaxf(mx, sink);
        if (grp == 0) denom = expf(sink - mx);
      }
      if (pre) {
        batch_pre(std::integral_constant<int, 0>{}, mh[0], lh[0]);
        if constexpr (kPreB > 1)
          if (S > 32) batch_pre(std::integral_constant<int, kPreB - 1>{}, mh[1], lh[1]);
      } else {
        batch(0, mh[0], lh[0]);
        // the second batch: with groups, unconditionally (its loads in flight with the first's)
        if (W > 1 || S > 32) batch(32, mh[1], lh[1]);
      }
      for (int s0 = 64; s0 < S; s0 += 32) {
        const int sj = s0 + lane;
        float mj = -INFINITY, lj = 0.f;
        if (sj < S) {
          mj = __ldcg(pm + int64_t(sj) * rows);
          lj = __ldcg(pl + int64_t(sj) * rows);
        }
        batch(s0, mj, lj);
      }
    }
    if constexpr (W > 1) {
      if (grp > 0) {
        red_o[grp][t] = make_float4(r[0], r[1], r[2], r[3]);
        red_d[grp][t] = denom;
      }
      __syncthreads();
      if (grp == 0) {
#pragma unroll
        for (int g2 = 1; g2 < W; ++g2) {
          const float4 v = red_o[g2][t];
          r[0] += v.x, r[1] += v.y, r[2] += v.z, r[3] += v.w;
          denom += red_d[g2][t];
        }
      }
      __syncthreads();  // (the next row's writes wait for these reads)
    }
#if QSDPA_MMA_TRACE
    if (!tr_summed) tr_summed = global_ns();
#endif
    // (a.arrivals) the last of the row tile's rows sets its count back to 0 for the next call (which
    // waits for this kernel's end before it touches memory)
    if (a.arrivals && threadIdx.x == 0 && readers == tile_n - 1) a.arrivals[tile] = 0;
    if (grp != 0 || !active) continue;
    if (mx != -INFINITY) {
      const float inv = 1.f / denom;
#pragma unroll
      for (int e = 0; e < 4; ++e) r[e] *= inv;
    }
    const int64_t bq = row / a.Lq, b = bq / a.Hq, h = bq - b * a.Hq, i = row - bq * a.Lq;
    const int64_t base = a.omap.at(b, h, i) + d0;
    store4_t(a.out, a.dtype, base, make_float4(r[0], r[1], r[2], r[3]));
  }
#if QSDPA_MMA_TRACE
  if (threadIdx.x == 0 && a.trace && blockIdx.x < unsigned(kTraceCombineBlocks)) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long* e = a.trace + kTraceCombineBase + kTraceCombineWords * blockIdx.x;
    e[0] = tr_start, e[1] = tr_waited, e[2] = global_ns(), e[3] = smid, e[4] = tr_loaded, e[5] = tr_summed;
  }
#endif
}

constexpr bool kOneRound = QSDPA_COMBINE_ONE_ROUND != 0;
// Rows of D = 512 merged in 4 slices of 128 head dims, a block per (row, slice), with 8 groups of
// one warp, where a call has few rows of many splits (W > 1 below, no arrivals): at D = 512, B=4
// Hq=16 (64 rows of 32-43 splits), the one block per row of 512 threads ran 5-6 us after the
// attention grid had ended (H200 trace, 2026-12-04, run 82), on 64 of the 132 SMs. Measured on an
// H100 (2026-12-05, run 90, 3 rounds against 0 in the same run): D=512 4-bit 59.6 -> 59.0 us, 8-bit
// 67.6 -> 67.0; in 2 slices, D=256 4-bit was slower, 39.3 -> 40.0 (8-bit 59.7 -> 59.6), so 1 (the
// default) slices D = 512 only, 2 slices D = 256 as well, 0 keeps one block per row. On an H200
// (run 92, 3 rounds) D=512 was within 0.2 us either way (58.1 / 60.4 us with slices, 58.0 / 60.6
// without).
#ifndef QSDPA_COMBINE_SLICES
#define QSDPA_COMBINE_SLICES 1
#endif

}  // namespace

cudaError_t combine_launch(const AttnArgs& a, cudaStream_t s) {
  const int64_t rows = a.B * a.Hq * a.Lq;
  const int lanes = std::max(32, int((a.D / 4 + 31) / 32 * 32));  // one group's: 4 elements of D each
  // One group for a few splits or many rows (measured on an H200, ncu, 1024 rows of 2 splits, B=32
  // N=4096: 5.2 us with one group, 7.8 with 8, while Lq=4 on the B=8 N=32768 shape, 1024 rows of
  // 6 splits, went 116 -> 120 us end to end); else 8 groups of one warp (D <= 128), or 4 of up to 4
  // warps (D <= 512): the few rows of a long-cache call with many splits (B=1 N=131072, 32 rows of
  // 64 splits: 21.2 -> 5.5 us).
  const bool few = a.num_splits > 4 && rows < 512;
  // slices of 128 head dims (QSDPA_COMBINE_SLICES): then a slice is one warp's 4 dims per lane
  const int lc = QSDPA_COMBINE_SLICES && few && !a.arrivals && lanes > 32 && a.D % 128 == 0
                     ? (a.D == 512 ? 2 : a.D == 256 && QSDPA_COMBINE_SLICES == 2 ? 1 : 0)
                     : 0;
  const int lanes_s = lanes >> lc;
  const int W = !few ? 1 : lanes_s == 32 ? 8 : 4;
  const int threads = lanes_s * W;
  auto* kern = W == 1   ? combine_kernel<1, kOneRound>
               : W == 8 ? combine_kernel<8, kOneRound>
               : lanes_s <= 64 ? combine_kernel<4, kOneRound>
                               : combine_kernel<4, false>;
  const int64_t blocks = std::min(rows << lc, kMaxBlocks);
  // Once per device (devices 0..63): the same shared-memory carveout as the attention kernels
  // (max shared), so that the multiprocessors need not switch their L1 / shared split between
  // the two launches of a call.
  // With a.pdl (compute capability 9.0 and newer, backend.cu) it is launched as a programmatic
  // dependent of the attention kernel before it (which signals launch_dependents as it starts):
  // its blocks are placed while the attention kernel runs and wait in griddepcontrol.wait for its
  // end, instead of the launch starting only after it. (Stream-captured as a programmatic graph
  // edge.)
  static std::atomic<uint64_t> opted{0};
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (!(opted.load(std::memory_order_acquire) & bit)) {
    if (cudaError_t e = cudaFuncSetAttribute(combine_kernel<8, kOneRound>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared));
        e != cudaSuccess)
      return e;
    for (auto* k : {combine_kernel<1, kOneRound>, combine_kernel<4, kOneRound>, combine_kernel<4, false>})
      if (cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               int(cudaSharedmemCarveoutMaxShared));
          e != cudaSuccess)
        return e;
    opted.fetch_or(bit, std::memory_order_acq_rel);
  }
  if (a.pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(blocks), 1u, 1u);
    cfg.blockDim = dim3(unsigned(threads), 1u, 1u);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute attr[1] = {programmatic_launch_attribute()};
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kern, a, rows, lc) == cudaSuccess) return cudaSuccess;
    cudaGetLastError();  // not supported here: the ordinary launch below
  }
  kern<<<unsigned(blocks), threads, 0, s>>>(a, rows, lc);
  return cudaGetLastError();
}

}  // namespace qsdpa::cuda
