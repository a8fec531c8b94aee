// Runner: copies of a problem in host or device memory, attention calls on them in rotation, and
// their timing (steady_clock on the host, CUDA events on the GPU). Also the copy bandwidth that
// the attention bandwidth is compared with. The CUDA parts are compiled under QSDPA_WITH_CUDA and
// use the runtime API only, so the program starts on machines without a GPU driver.
#include "exec.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#ifdef QSDPA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/testing.hpp"
#endif

namespace qsdpa_cli {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#ifdef QSDPA_WITH_CUDA
Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status{};
  return error(StatusCode::backend_error, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define QSDPA_CUDA_TRY(call)                                     \
  do {                                                           \
    if (Status st_ = cuda_check((call), #call); !st_) return st_; \
  } while (0)
#endif

// The tensors of one copy, in the order they are laid out in its arena.
struct Segment {
  const void* src;
  size_t bytes;
  bool is_out = false;  // the output: poisoned with NaN, not copied
  size_t offset = 0;
};

}  // namespace

Backend fastest_backend() { return qsdpa::backend_available(Backend::cuda) ? Backend::cuda : Backend::cpu; }

Status check_backend(Backend b) {
  if (b != Backend::cuda) return Status{};
#ifndef QSDPA_WITH_CUDA
  return error(StatusCode::not_built,
               "backend (cuda) is not built into this program: configure with -DQSDPA_CUDA=ON");
#else
  std::string why;
  if (!qsdpa::backend_available(Backend::cuda, &why))
    return error(StatusCode::no_device, "backend (cuda) has no device: " + why);
  return Status{};
#endif
}

Status Runner::create(const Problem& pr, Backend backend, int threads, int64_t rotation_bytes,
                      std::unique_ptr<Runner>* out) {
  const Shape& s = pr.shape;
  if (backend == Backend::automatic) backend = fastest_backend();
  if (Status st = check_backend(backend); !st) return st;
  std::unique_ptr<Runner> r(new Runner());
  r->backend_ = backend;
  r->bytes_per_call_ = call_bytes(s);

  const size_t ts = qsdpa::dtype_size(s.dtype);
  const bool paged = s.paged > 0;
  std::vector<Segment> seg = {
      {pr.q.data(), pr.q.size()},
      paged ? Segment{pr.k_pool_packed.data(), pr.k_pool_packed.size() * 4}
            : Segment{pr.k_packed.data(), pr.k_packed.size() * 4},
      paged ? Segment{pr.k_pool_scales.data(), pr.k_pool_scales.size()} : Segment{pr.k_scales.data(), pr.k_scales.size()},
      paged ? Segment{pr.k_pool_biases.data(), pr.k_pool_biases.size()} : Segment{pr.k_biases.data(), pr.k_biases.size()},
      paged ? Segment{pr.v_pool_packed.data(), pr.v_pool_packed.size() * 4}
            : Segment{pr.v_packed.data(), pr.v_packed.size() * 4},
      paged ? Segment{pr.v_pool_scales.data(), pr.v_pool_scales.size()} : Segment{pr.v_scales.data(), pr.v_scales.size()},
      paged ? Segment{pr.v_pool_biases.data(), pr.v_pool_biases.size()} : Segment{pr.v_biases.data(), pr.v_biases.size()},
      {pr.sinks.data(), pr.sinks.size() * 4},
      {pr.bool_mask.data(), pr.bool_mask.size()},
      {pr.float_mask.data(), pr.float_mask.size()},
      {pr.block_table.data(), pr.block_table.size() * 4},
      {s.kv_lens.data(), s.kv_lens.size() * 4},
      {nullptr, size_t(s.q_elems()) * ts, true},
  };
  size_t arena = 0;
  for (auto& g : seg) {
    g.offset = arena;
    arena += align_up(std::max<size_t>(g.bytes, 1), kAlign);
  }
  r->out_offset_ = seg.back().offset;
  r->out_bytes_ = seg.back().bytes;

  // How many copies: enough to read `rotation_bytes` per rotation, within the memory at hand.
  int64_t copies = std::clamp<int64_t>((rotation_bytes + r->bytes_per_call_ - 1) / std::max<int64_t>(r->bytes_per_call_, 1), 1, 64);
  double room = 0.5 * double(physical_memory_bytes());
#ifdef QSDPA_WITH_CUDA
  if (backend == Backend::cuda) {
    size_t free_b = 0, total_b = 0;
    QSDPA_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    room = 0.8 * double(free_b);
    void* stream = nullptr;
    QSDPA_CUDA_TRY(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&stream), cudaStreamNonBlocking));
    r->stream_ = stream;
  }
#endif
  if (room > 0 && double(arena) > room)
    return error(StatusCode::invalid_argument, "the problem needs " + human_bytes(double(arena)) + " of " +
                                                   (backend == Backend::cuda ? "device" : "host") +
                                                   " memory; " + human_bytes(room) + " is at hand");
  if (room > 0) copies = std::min<int64_t>(copies, std::max<int64_t>(1, int64_t(room / double(arena))));

  for (int64_t c = 0; c < copies; ++c) {
    uint8_t* base = nullptr;
    if (backend == Backend::cuda) {
#ifdef QSDPA_WITH_CUDA
      void* d = nullptr;
      QSDPA_CUDA_TRY(cudaMalloc(&d, arena));
      r->arenas_.push_back(d);
      base = static_cast<uint8_t*>(d);
      for (const auto& g : seg) {
        if (g.is_out)
          QSDPA_CUDA_TRY(cudaMemset(base + g.offset, 0xff, g.bytes));  // NaN poison
        else if (g.bytes)
          QSDPA_CUDA_TRY(cudaMemcpy(base + g.offset, g.src, g.bytes, cudaMemcpyHostToDevice));
      }
#endif
    } else if (c == 0) {
      // The first host copy reads the problem's own buffers; only its output is separate.
      void* h = std::aligned_alloc(4096, align_up(std::max<size_t>(r->out_bytes_, 1), 4096));
      if (!h) return error(StatusCode::invalid_argument, "out of host memory for the output");
      r->arenas_.push_back(h);
      std::memset(h, 0xff, r->out_bytes_);  // NaN poison
    } else {
      void* h = std::aligned_alloc(4096, align_up(arena, 4096));
      if (!h) return error(StatusCode::invalid_argument, "out of host memory for copy " + std::to_string(c));
      r->arenas_.push_back(h);
      base = static_cast<uint8_t*>(h);
      for (const auto& g : seg) {
        if (g.is_out)
          std::memset(base + g.offset, 0xff, g.bytes);  // NaN poison
        else if (g.bytes)
          std::memcpy(base + g.offset, g.src, g.bytes);
      }
    }
    const bool borrowed = backend != Backend::cuda && c == 0;
    auto at = [&](const Segment& g) -> const void* { return borrowed ? g.src : base + g.offset; };
    qsdpa::AttentionParams p = pr.params(borrowed ? r->arenas_.back() : base + r->out_offset_);
    p.q = at(seg[0]);
    p.k.packed = static_cast<const uint32_t*>(at(seg[1]));
    p.k.scales = at(seg[2]);
    p.k.biases = at(seg[3]);
    p.v.packed = static_cast<const uint32_t*>(at(seg[4]));
    p.v.scales = at(seg[5]);
    p.v.biases = at(seg[6]);
    if (p.sinks) p.sinks = static_cast<const float*>(at(seg[7]));
    if (p.bool_mask) p.bool_mask = at(seg[8]);
    if (p.float_mask) p.float_mask = at(seg[9]);
    if (paged) p.k.layout.block_table = p.v.layout.block_table = static_cast<const int32_t*>(at(seg[10]));
    if (p.kv_lens) p.kv_lens = static_cast<const int32_t*>(at(seg[11]));
    p.backend = backend;
    p.num_threads = threads;
    p.stream = r->stream_;
    r->params_.push_back(p);
  }
  *out = std::move(r);
  return Status{};
}

Runner::~Runner() {
#ifdef QSDPA_WITH_CUDA
  if (backend_ == Backend::cuda) {
    if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    for (void* a : arenas_) cudaFree(a);
    if (workspace_) cudaFree(workspace_);
    if (other_) cudaFree(other_);
    if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    return;
  }
#endif
  for (void* a : arenas_) std::free(a);
  std::free(other_);
}

int64_t Runner::rotation_bytes() const { return bytes_per_call_ * int64_t(params_.size()); }

Status Runner::call(int copy) { return qsdpa::attention(params_[size_t(copy) % params_.size()]); }

Status Runner::sync() {
#ifdef QSDPA_WITH_CUDA
  if (backend_ == Backend::cuda) QSDPA_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
  return Status{};
}

Status Runner::read_other() {
  if (!other_) {
    // Twice the last-level cache, filled (host: so that the pages are real memory, not the zero
    // page), plus 16 bytes for the device's sum.
    const int64_t bytes = (2 * last_level_cache_bytes(backend_) + 63) / 64 * 64;
#ifdef QSDPA_WITH_CUDA
    if (backend_ == Backend::cuda) {
      const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
      QSDPA_CUDA_TRY(cudaMalloc(&other_, size_t(bytes) + 16));
      QSDPA_CUDA_TRY(cudaMemsetAsync(other_, 0x5b, size_t(bytes) + 16, stream));
    }
#endif
    if (backend_ != Backend::cuda) {
      other_ = std::aligned_alloc(64, size_t(bytes));
      if (!other_) return error(StatusCode::invalid_argument, "out of host memory for --cold-l2's buffer");
      std::memset(other_, 0x5b, size_t(bytes));
    }
    other_bytes_ = bytes;
  }
#ifdef QSDPA_WITH_CUDA
  if (backend_ == Backend::cuda) {
    uint8_t* base = static_cast<uint8_t*>(other_);
    return qsdpa::cuda::read_through_l2(base, size_t(other_bytes_), reinterpret_cast<uint32_t*>(base + other_bytes_),
                                        stream_);
  }
#endif
  const uint64_t* w = static_cast<const uint64_t*>(other_);
  uint64_t s = 0;
  for (int64_t i = 0; i < other_bytes_ / 8; ++i) s += w[i];
  other_sum_ = other_sum_ + s;
  return Status{};
}

Status Runner::time(const TimeOptions& o, Timing* t) {
  int next = 0;
  // (TimeOptions::cold_cache: before each call, outside its timing)
  auto cold = [&]() { return o.cold_cache ? read_other() : Status{}; };
  if (backend_ != Backend::cuda) {
    if (Status st = cold(); !st) return st;
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = call(next++); !st) return st;
    const double first = seconds_since(t0);
    t->warmup = o.warmup >= 0 ? o.warmup : (first < 0.2 ? 3 : 1);
    for (int i = 1; i < t->warmup; ++i) {
      if (Status st = cold(); !st) return st;
      if (Status st = call(next++); !st) return st;
    }
    t->iters = o.iters > 0 ? o.iters
                           : int(std::clamp(o.target_s / std::max(first, 1e-9), double(o.min_iters), double(o.max_iters)));
    std::vector<double> us;
    for (int i = 0; i < t->iters; ++i) {
      if (Status st = cold(); !st) return st;
      const auto c0 = std::chrono::steady_clock::now();
      if (Status st = call(next++); !st) return st;
      us.push_back(seconds_since(c0) * 1e6);
    }
    t->median_us = median(us);
    t->min_us = *std::min_element(us.begin(), us.end());
    t->cold_bytes = o.cold_cache ? other_bytes_ : 0;
    return Status{};
  }
#ifdef QSDPA_WITH_CUDA
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  t->warmup = o.warmup >= 0 ? o.warmup : 10;
  t->iters = o.iters > 0 ? o.iters : o.device_iters;
  for (int i = 0; i < t->warmup; ++i) {
    if (Status st = cold(); !st) return st;
    if (Status st = call(next++); !st) return st;
  }
  std::vector<cudaEvent_t> ev(size_t(2 * t->iters), nullptr);
  Status result;
  for (auto& e : ev)
    if (Status st = cuda_check(cudaEventCreate(&e), "cudaEventCreate"); !st) result = st;
  for (int i = 0; i < t->iters && result; ++i) {
    result = cold();
    if (result) result = cuda_check(cudaEventRecord(ev[size_t(2 * i)], stream), "cudaEventRecord");
    if (result) result = call(next++);
    if (result) result = cuda_check(cudaEventRecord(ev[size_t(2 * i + 1)], stream), "cudaEventRecord");
  }
  if (result) result = sync();
  std::vector<double> us;
  for (int i = 0; i < t->iters && result; ++i) {
    float ms = 0;
    result = cuda_check(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "cudaEventElapsedTime");
    us.push_back(double(ms) * 1e3);
  }
  for (auto& e : ev)
    if (e) cudaEventDestroy(e);
  if (!result) return result;
  t->median_us = median(us);
  t->min_us = *std::min_element(us.begin(), us.end());
  t->cold_bytes = o.cold_cache ? other_bytes_ : 0;
  return Status{};
#else
  return error(StatusCode::not_built, "backend (cuda) is not built into this program");
#endif
}

void Runner::set_pdl(bool on) {
  for (auto& p : params_) p.pdl = on;
}

void Runner::set_deterministic(bool on) {
  for (auto& p : params_) p.deterministic = on;
}

Runner::Plan Runner::plan() const {
  Plan pl;
#ifdef QSDPA_WITH_CUDA
  if (backend_ != Backend::cuda || params_.empty()) return pl;
  const qsdpa::AttentionParams& p = params_[0];
  pl.valid = true;
  pl.tensor_cores = qsdpa::cuda::uses_tensor_cores(p);
  const int pool = qsdpa::cuda::planned_pool(p);
  pl.pool_warps = pool == 1 ? 16 : pool == 2 ? 8 : 0;
  pl.splits = qsdpa::cuda::planned_splits(p);
  pl.merge = qsdpa::cuda::uses_cluster_merge(p) ? "cluster" : qsdpa::cuda::uses_in_kernel_merge(p) ? "in_kernel" : "combine";
#endif
  return pl;
}

Status Runner::time_graph(int warmup, int iters, int chain, double* median_us) {
#ifdef QSDPA_WITH_CUDA
  if (backend_ != Backend::cuda) return error(StatusCode::invalid_argument, "graph timing needs the cuda backend");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  const size_t ws = qsdpa::attention_workspace_size(params_[0]);
  if (!workspace_) {
    QSDPA_CUDA_TRY(cudaMalloc(&workspace_, std::max<size_t>(ws, kAlign)));
    // zero-filled once: the graphs' calls then merge their splits in the attention kernel
    QSDPA_CUDA_TRY(cudaMemsetAsync(workspace_, 0, std::max<size_t>(ws, kAlign), stream));
  }
  std::vector<cudaGraphExec_t> execs;
  Status result;
  chain = std::max(1, chain);
  const size_t n = params_.size();
  for (size_t c = 0; c < n && result; ++c) {
    result = cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    if (!result) break;
    Status st;
    for (int j = 0; j < chain && st; ++j) {  // graph c: the calls on copies c, c + 1, ... (mod n)
      qsdpa::AttentionParams p = params_[(c + size_t(j)) % n];
      p.workspace = workspace_;
      p.workspace_bytes = ws;
      p.workspace_zeroed = true;
      st = qsdpa::attention(p);
    }
    cudaGraph_t graph = nullptr;
    result = cuda_check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    if (!st) result = error(st.code, "during CUDA graph capture: " + st.message);
    cudaGraphExec_t exec = nullptr;
#if CUDART_VERSION >= 12000
    if (result) result = cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
#else
    if (result) result = cuda_check(cudaGraphInstantiateWithFlags(&exec, graph, 0), "cudaGraphInstantiate");
#endif
    if (graph) cudaGraphDestroy(graph);
    // Upload now, so that no timed launch pays for moving the graph to the device.
    if (result && exec) result = cuda_check(cudaGraphUpload(exec, stream), "cudaGraphUpload");
    if (exec) execs.push_back(exec);
  }
  // Replays are timed back to back, as the steps of a decode loop run: one event pair around a
  // batch of kBatch replays gives the time per call once the stream is busy (launch latency and
  // host work overlap the previous replay); the median over the batches is reported. Every graph
  // is replayed once before timing.
  constexpr int kBatch = 10;
  const int batches = std::max(1, iters / kBatch);
  std::vector<cudaEvent_t> ev(size_t(2 * batches), nullptr);
  for (auto& e : ev)
    if (result) result = cuda_check(cudaEventCreate(&e), "cudaEventCreate");
  size_t next = 0;
  const size_t warm = std::max<size_t>(size_t(std::max(warmup, 0)), execs.size());
  for (size_t i = 0; i < warm && result; ++i)
    result = cuda_check(cudaGraphLaunch(execs[next++ % execs.size()], stream), "cudaGraphLaunch");
  if (result) result = sync();
  for (int b = 0; b < batches && result; ++b) {
    result = cuda_check(cudaEventRecord(ev[size_t(2 * b)], stream), "cudaEventRecord");
    for (int i = 0; i < kBatch && result; ++i)
      result = cuda_check(cudaGraphLaunch(execs[next++ % execs.size()], stream), "cudaGraphLaunch");
    if (result) result = cuda_check(cudaEventRecord(ev[size_t(2 * b + 1)], stream), "cudaEventRecord");
  }
  if (result) result = sync();
  std::vector<double> us;
  for (int b = 0; b < batches && result; ++b) {
    float ms = 0;
    result = cuda_check(cudaEventElapsedTime(&ms, ev[size_t(2 * b)], ev[size_t(2 * b + 1)]), "cudaEventElapsedTime");
    us.push_back(double(ms) * 1e3 / (kBatch * chain));
  }
  for (auto& e : ev)
    if (e) cudaEventDestroy(e);
  for (auto& x : execs) cudaGraphExecDestroy(x);
  if (result) *median_us = median(us);
  return result;
#else
  (void)warmup, (void)iters, (void)chain, (void)median_us;
  return error(StatusCode::not_built, "CUDA graphs need the cuda backend, which is not built into this program");
#endif
}

Status Runner::output(std::vector<uint8_t>* out) {
  out->resize(out_bytes_);
  const uint8_t* src = static_cast<const uint8_t*>(params_[0].out);
#ifdef QSDPA_WITH_CUDA
  if (backend_ == Backend::cuda) {
    if (Status st = sync(); !st) return st;
    QSDPA_CUDA_TRY(cudaMemcpy(out->data(), src, out_bytes_, cudaMemcpyDeviceToHost));
    return Status{};
  }
#endif
  std::memcpy(out->data(), src, out_bytes_);
  return Status{};
}

std::string device_name(Backend b) {
#ifdef QSDPA_WITH_CUDA
  if (b == Backend::cuda) {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) return prop.name;
    return "unknown NVIDIA GPU";
  }
#endif
  (void)b;
  return cpu_model_name();
}

int64_t last_level_cache_bytes(Backend b) {
#ifdef QSDPA_WITH_CUDA
  if (b == Backend::cuda) {
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0)
      return l2;
    return int64_t(60) << 20;  // an H200's L2
  }
#endif
  (void)b;
  return cpu_l3_bytes();
}

Status copy_bandwidth(Backend b, double* gbps, std::string* how) {
  if (b == Backend::cuda) {
#ifdef QSDPA_WITH_CUDA
    size_t free_b = 0, total_b = 0;
    QSDPA_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t bytes = size_t(1) << 30;  // 1 GiB, or less where memory is short
    while (bytes > (size_t(64) << 20) && 2 * bytes > free_b / 2) bytes /= 2;
    void *src = nullptr, *dst = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    Status st = cuda_check(cudaMalloc(&src, bytes), "cudaMalloc");
    if (st) st = cuda_check(cudaMalloc(&dst, bytes), "cudaMalloc");
    if (st) st = cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (st) st = cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
    if (st) st = cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
    if (st) st = cuda_check(cudaMemsetAsync(src, 0x3c, bytes, stream), "cudaMemsetAsync");
    if (st) st = cuda_check(cudaMemsetAsync(dst, 0x5a, bytes, stream), "cudaMemsetAsync");
    std::vector<double> s;
    for (int i = 0; i < 12 && st; ++i) {  // 2 warm-up copies, then 10 timed
      st = cuda_check(cudaEventRecord(e0, stream), "cudaEventRecord");
      if (st) st = cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      if (st) st = cuda_check(cudaEventRecord(e1, stream), "cudaEventRecord");
      if (st) st = cuda_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      if (st) st = cuda_check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (st && i >= 2) s.push_back(double(ms) * 1e-3);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (stream) cudaStreamDestroy(stream);
    if (src) cudaFree(src);
    if (dst) cudaFree(dst);
    if (!st) return st;
    *gbps = 2.0 * double(bytes) / median(s) / 1e9;
    *how = "cudaMemcpyAsync device to device, " + human_bytes(double(bytes)) +
           ", median of 10, CUDA events, read + write";
    return Status{};
#else
    return error(StatusCode::not_built, "backend (cuda) is not built into this program");
#endif
  }
  // Host: memcpy of a large buffer split over all hardware threads, as the CPU backend reads.
  size_t bytes = size_t(512) << 20;
  const uint64_t phys = physical_memory_bytes();
  while (phys > 0 && bytes > (size_t(64) << 20) && 2 * bytes > phys / 8) bytes /= 2;
  const int nt = hardware_threads();
  uint8_t* src = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  uint8_t* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (!src || !dst) {
    std::free(src), std::free(dst);
    return error(StatusCode::invalid_argument, "out of host memory for the copy-bandwidth buffers");
  }
  auto each = [&](const std::function<void(size_t, size_t)>& f) {
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
      th.emplace_back(f, bytes / 4096 * size_t(t) / size_t(nt) * 4096, bytes / 4096 * size_t(t + 1) / size_t(nt) * 4096);
    for (auto& x : th) x.join();
  };
  each([&](size_t a, size_t z) {  // first touch by the thread that copies the range later
    std::memset(src + a, 0x3c, z - a);
    std::memset(dst + a, 0x5a, z - a);
  });
  std::vector<double> s;
  for (int i = 0; i < 6; ++i) {  // 1 warm-up, then 5 timed
    const auto t0 = std::chrono::steady_clock::now();
    each([&](size_t a, size_t z) { std::memcpy(dst + a, src + a, z - a); });
    if (i > 0) s.push_back(seconds_since(t0));
  }
  std::free(src), std::free(dst);
  *gbps = 2.0 * double(bytes) / median(s) / 1e9;
  *how = "memcpy on " + std::to_string(nt) + " threads, " + human_bytes(double(bytes)) +
         ", median of 5, read + write";
  return Status{};
}

}  // namespace qsdpa_cli
