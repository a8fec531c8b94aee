// The multithreaded CPU backend (SPEC sections 2-3): planning, threads, split-K and output.
//
// Work is split over (sequence, KV head, row block, token chunk). A row block holds the query
// rows of one GQA group (all rep = Hq / Hkv query heads that read the KV head, times all Lq rows):
// they are contiguous in q and out, and each K/V row read from the cache serves all of them.
// A group larger than a few tens of KiB of state is cut into several row blocks.
//
// A task (one unit, one token chunk) runs one of two kernels (kernel.hpp): the SIMD kernel on the
// best instruction set the machine has (simd_kernel.cpp), or the portable one (portable_kernel.cpp)
// where there is none or when asked for. Either leaves unnormalized states (m, l, o) per row.
// When there are fewer (sequence, KV head, row block) units than the threads can keep busy, the
// token range is also cut into chunks whose partial states are merged by whichever task finishes a
// unit's last chunk. Chunks get smaller from first to last (weights n, n-1, ..., 1) and are handed
// out in that order, all units' first chunks first: threads take tasks from a shared counter, so the
// small tasks at the end even out a thread that fell behind (a core shared with another process).
// Everything is accumulated in f32; out is rounded to T once, at the end.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../core/backends.hpp"
#include "../core/half.hpp"
#include "kernel.hpp"
#include "softmax_state.hpp"
#include "thread_pool.hpp"

namespace qsdpa::detail {

namespace {

using cpu::Plan;
using cpu::SoftmaxState;
using cpu::Task;
using cpu::ThreadPool;
using cpu::ensure;

constexpr int64_t kMinChunk = 64;         // fewest tokens worth a split-K chunk
constexpr int64_t kBlockFloats = 8192;    // rows per block: at most this many floats of o
constexpr int64_t kInlineWork = 1 << 18;  // below this many multiply-adds, stay on one thread
constexpr int64_t kTasksPerThread = 4;    // quantizer: split so that each thread gets a few tasks
constexpr int64_t kChunkTasks = 8;        // attention: split so that each thread gets this many
constexpr int64_t kChunkAlign = 128;      // chunk bounds on whole tiles of the SIMD kernel

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The kernel choice: set by tests, or by QSDPA_CPU_TARGET=portable for a whole process.
std::atomic<int> g_choice{-1};  // -1: not read from the environment yet

cpu::KernelChoice current_choice() {
  int c = g_choice.load(std::memory_order_relaxed);
  if (c < 0) {
    const char* env = std::getenv("QSDPA_CPU_TARGET");
    c = int(env && std::strcmp(env, "portable") == 0 ? cpu::KernelChoice::portable : cpu::KernelChoice::automatic);
    int expected = -1;
    g_choice.compare_exchange_strong(expected, c);
    c = g_choice.load(std::memory_order_relaxed);
  }
  return cpu::KernelChoice(c);
}

// Per-thread buffers for one task's states, kept for the next call.
struct TaskScratch {
  std::vector<float> m, l, o;
};

TaskScratch& task_scratch() {
  thread_local TaskScratch s;
  return s;
}

void run_kernel(const Plan& pl, const Task& t, bool portable) {
  if (portable || !cpu::simd_attend(pl, t)) cpu::portable_attend(pl, t);
}

// The query rows [r0, r1) of unit `u` and the tokens they can see at all.
struct UnitRange {
  int64_t b, kvh, r0, r1, tlo, thi;
  int64_t n, lq;  // the sequence's tokens and query rows
};

UnitRange unit_range(const Plan& pl, int64_t u) {
  const AttentionParams& p = *pl.p;
  UnitRange ur;
  const int64_t blk = u % pl.nrb;
  const int64_t g = u / pl.nrb;
  ur.b = g / p.Hkv;
  ur.kvh = g % p.Hkv;
  ur.r0 = blk * pl.rb;
  ur.r1 = std::min(pl.R, ur.r0 + pl.rb);
  // Positions of the rows: row r sits at n - lq + r % Lq (rows with r % Lq >= lq see nothing).
  ur.n = seq_kv_len(p.kv_lens, ur.b, p.N);
  ur.lq = seq_q_len(p.q_lens, ur.b, p.Lq, ur.n);
  int64_t imin = p.Lq, imax = -1;
  if (ur.r1 - ur.r0 >= p.Lq) {
    imin = 0;
    imax = p.Lq - 1;
  } else {
    for (int64_t r = ur.r0; r < ur.r1; ++r) {
      imin = std::min(imin, r % p.Lq);
      imax = std::max(imax, r % p.Lq);
    }
  }
  imax = std::min(imax, ur.lq - 1);
  const int64_t pmin = ur.n - ur.lq + imin, pmax = ur.n - ur.lq + imax;
  ur.tlo = pl.window > 0 ? std::max<int64_t>(0, pmin - pl.window + 1) : 0;
  ur.thi = imax < imin ? ur.tlo : std::max<int64_t>(ur.tlo, std::min(ur.n, pmax + 1));
  return ur;
}

// Rounds the rows' states (scaled by their output factors) into out.
template <DType T>
void write_rows(const Plan& pl, const UnitRange& ur, const float* m, const float* l, const float* o,
                int64_t ostride) {
  const AttentionParams& p = *pl.p;
  const int64_t D = p.D;
  for (int64_t r = ur.r0; r < ur.r1; ++r) {
    const int64_t i = r - ur.r0;
    const int64_t h = ur.kvh * pl.rep + r / p.Lq;
    const SoftmaxState st{m[i], l[i], nullptr};  // only m and l are read
    const float f = st.out_factor(p.sinks != nullptr, p.sinks ? p.sinks[h] : 0.0f);
    const float* orow = o + i * ostride;
    const int64_t base = pl.om.at(ur.b, h, r % p.Lq);
    for (int64_t d = 0; d < D; ++d) store_f32(p.out, T, base + d, orow[d] * f);
  }
}

// The token bound of chunk c of a span cut into n chunks of weights n, n-1, ..., 1 (on whole
// tiles; the last bound is the span).
int64_t chunk_bound(int64_t span, int64_t n, int64_t c) {
  if (c >= n) return span;
  const int64_t w = c * n - c * (c - 1) / 2, total = n * (n + 1) / 2;
  return std::min(span, span * w / total / kChunkAlign * kChunkAlign);
}

template <DType T>
void phase2(const Plan& pl, int64_t u);

// Phase 1: one task. Without split-K the task is unit `task` and writes its rows of out; with it,
// it is chunk c = task / units of unit u = task % units and writes the partial states; the last
// chunk of a unit to finish merges them (phase 2).
template <DType T>
void phase1(const Plan& pl, int64_t task, std::atomic<int64_t>* done, bool portable) {
  const int64_t u = pl.nchunks == 1 ? task : task % pl.units, c = pl.nchunks == 1 ? 0 : task / pl.units;
  const UnitRange ur = unit_range(pl, u);
  const int64_t span = ur.thi - ur.tlo;
  const int64_t t0 = ur.tlo + chunk_bound(span, pl.nchunks, c), t1 = ur.tlo + chunk_bound(span, pl.nchunks, c + 1);
  const int64_t nr = ur.r1 - ur.r0, D = pl.p->D;
  TaskScratch& s = task_scratch();
  ensure(s.m, nr);
  ensure(s.l, nr);
  ensure(s.o, nr * D);
  run_kernel(pl, Task{ur.b, ur.kvh, ur.r0, ur.r1, t0, t1, ur.n, ur.lq, s.m.data(), s.l.data(), s.o.data()},
             portable);
  if (pl.nchunks == 1) {
    write_rows<T>(pl, ur, s.m.data(), s.l.data(), s.o.data(), D);
    return;
  }
  float* dst = pl.partial + (u * pl.nchunks + c) * pl.rb * (D + 2);
  for (int64_t r = 0; r < nr; ++r) {
    float* st = dst + r * (D + 2);
    st[0] = s.m[size_t(r)];
    st[1] = s.l[size_t(r)];
    std::copy(s.o.data() + r * D, s.o.data() + (r + 1) * D, st + 2);
  }
  // acq_rel: the last one sees every other chunk's states.
  if (done[u].fetch_add(1, std::memory_order_acq_rel) == pl.nchunks - 1) phase2<T>(pl, u);
}

// Phase 2 (split-K only): merges the chunks of unit u in order and writes its rows of out.
template <DType T>
void phase2(const Plan& pl, int64_t u) {
  const UnitRange ur = unit_range(pl, u);
  const int64_t nr = ur.r1 - ur.r0, D = pl.p->D, stride = D + 2;
  float* base = pl.partial + u * pl.nchunks * pl.rb * stride;
  TaskScratch& s = task_scratch();
  ensure(s.m, nr);
  ensure(s.l, nr);
  ensure(s.o, nr * D);
  for (int64_t r = 0; r < nr; ++r) {
    SoftmaxState acc{kNegInf, 0.0f, s.o.data() + r * D};
    acc.reset(D);
    for (int64_t c = 0; c < pl.nchunks; ++c) {
      float* st = base + c * pl.rb * stride + r * stride;
      const SoftmaxState part{st[0], st[1], st + 2};
      acc.merge(part, D);
    }
    s.m[size_t(r)] = acc.m;
    s.l[size_t(r)] = acc.l;
  }
  write_rows<T>(pl, ur, s.m.data(), s.l.data(), s.o.data(), D);
}

template <DType T>
Status run_attention(const AttentionParams& p) {
  const int threads = cpu::resolve_threads(p.num_threads);
  const bool portable = current_choice() == cpu::KernelChoice::portable;
  Plan pl{};
  pl.p = &p;
  pl.rep = p.Hq / p.Hkv;
  pl.R = pl.rep * p.Lq;
  pl.rb = std::clamp<int64_t>(kBlockFloats / p.D, 1, pl.R);
  pl.nrb = (pl.R + pl.rb - 1) / pl.rb;
  pl.units = p.B * p.Hkv * pl.nrb;
  pl.scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(float(p.D));
  // A window of N or more hides nothing (every row sits at a position below N); treating it as
  // no window also keeps `pos - window` far from overflow.
  pl.window = p.window < p.N ? p.window : 0;
  pl.km = resolve_layout(p.k.layout, p.Hkv, p.N);
  pl.vm = resolve_layout(p.v.layout, p.Hkv, p.N);
  pl.qm = resolve_strides(p.q_strides, p.Hq, p.Lq, p.D);
  pl.om = resolve_strides(p.out_strides, p.Hq, p.Lq, p.D);
  pl.mm = resolve_strides(p.mask_strides, p.Hq, p.Lq, p.N);

  // The longest token range of a group (the rows of one group see at most these keys).
  const int64_t span = pl.window > 0 ? std::min(p.N, pl.window + p.Lq - 1) : p.N;
  const double work = double(p.B * p.Hq * p.Lq) * double(std::max<int64_t>(span, 1)) * double(p.D);
  const int use = work < double(kInlineWork) ? 1 : threads;
  pl.nchunks = 1;
  if (use > 1 && pl.units < kChunkTasks * use) {
    const int64_t want = (kChunkTasks * use + pl.units - 1) / pl.units;
    // The smallest chunk, span / (n (n + 1) / 2) tokens, keeps at least kMinChunk of them.
    int64_t n = 1;
    while (n < want && span * 2 / ((n + 1) * (n + 2)) >= kMinChunk) ++n;
    pl.nchunks = n;
  }

  std::vector<float> partial;
  std::unique_ptr<std::atomic<int64_t>[]> done;
  if (pl.nchunks > 1) {
    partial.resize(size_t(pl.units * pl.nchunks * pl.rb * (p.D + 2)));
    pl.partial = partial.data();
    done.reset(new std::atomic<int64_t>[size_t(pl.units)]);
    for (int64_t u = 0; u < pl.units; ++u) done[size_t(u)].store(0, std::memory_order_relaxed);
  }
  ThreadPool& pool = ThreadPool::global();
  const bool ok =
      pool.parallel_for(use, pl.units * pl.nchunks, [&](int64_t t) { phase1<T>(pl, t, done.get(), portable); });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

// Rows per quantizer task: enough that a task is worth waking a thread for.
int64_t rows_per_task(int64_t rows, int64_t dim, int threads) {
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1));
  const int64_t even = (rows + int64_t(threads) * kTasksPerThread - 1) / (int64_t(threads) * kTasksPerThread);
  return std::max(min_rows, even);
}

}  // namespace

namespace cpu {

void set_kernel_choice(KernelChoice c) { g_choice.store(int(c), std::memory_order_relaxed); }
KernelChoice kernel_choice() { return current_choice(); }

}  // namespace cpu

Status cpu_attention(const AttentionParams& p) {
  if (p.num_threads < 0)
    return make_status(StatusCode::invalid_argument,
                       "num_threads (" + std::to_string(p.num_threads) + ") is negative: use 0 for all hardware threads",
                       Backend::cpu);
  try {
    switch (p.dtype) {
      case DType::f32: return run_attention<DType::f32>(p);
      case DType::f16: return run_attention<DType::f16>(p);
      case DType::bf16: return run_attention<DType::bf16>(p);
    }
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::backend_error, "cpu backend: out of memory", Backend::cpu);
  } catch (const std::exception& e) {
    return make_status(StatusCode::backend_error, std::string("cpu backend: ") + e.what(), Backend::cpu);
  }
  return make_status(StatusCode::unsupported, "cpu backend: dtype is not supported", Backend::cpu);
}

Status cpu_quantize(const QuantizeParams& p) {
  const int threads = cpu::resolve_threads(0);
  const int64_t per = rows_per_task(p.rows, p.dim, threads);
  const int64_t tasks = (p.rows + per - 1) / per;
  const bool ok = ThreadPool::global().parallel_for(threads, tasks, [&](int64_t t) {
    host_quantize_rows(p, t * per, std::min(p.rows, (t + 1) * per));
  });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

Status cpu_dequantize(const DequantizeParams& p) {
  const int threads = cpu::resolve_threads(0);
  const int64_t per = rows_per_task(p.rows, p.dim, threads);
  const int64_t tasks = (p.rows + per - 1) / per;
  const bool ok = ThreadPool::global().parallel_for(threads, tasks, [&](int64_t t) {
    host_dequantize_rows(p, t * per, std::min(p.rows, (t + 1) * per));
  });
  if (!ok) return make_status(StatusCode::backend_error, "cpu backend: a worker failed (out of memory?)", Backend::cpu);
  return make_status(StatusCode::ok, "", Backend::cpu);
}

}  // namespace qsdpa::detail
