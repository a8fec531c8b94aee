// Running and timing attention where a backend runs: the problem is copied to host or device
// memory several times over, so that successive timed calls read different memory and the
// caches (the GPU's L2, the CPU's last level) cannot hold the data between calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common.hpp"

namespace qsdpa_cli {

struct TimeOptions {
  int warmup = -1;        // calls before timing; -1: automatic (10 on CUDA, 1-3 on the host)
  int iters = 0;          // timed calls; 0: automatic
  double target_s = 1.5;  // host, automatic iters: aim at this much timed work
  int min_iters = 3, max_iters = 200;  // host, automatic iters: bounds
  int device_iters = 100;  // CUDA, automatic iters
  // Before each call (warm-up and timed, outside its timing): a read of twice the last-level cache
  // of other data (CUDA: a kernel with the normal L2 policy; host: one thread), so that no call
  // starts with the cache as the call before it, or the shape before it, left it.
  bool cold_cache = false;
};

struct Timing {
  double median_us = 0, min_us = 0;
  int iters = 0, warmup = 0;
  int64_t cold_bytes = 0;  // bytes read before each call (TimeOptions::cold_cache), 0 without
};

class Runner {
 public:
  // Copies `p` to where `backend` runs, as many times as it takes for one rotation over the
  // copies to read at least `rotation_bytes` (at least one copy, at most 64). On the host the
  // first copy is `p`'s own buffers (only the output is new): keep `p` alive while the Runner is.
  static Status create(const Problem& p, Backend backend, int threads, int64_t rotation_bytes,
                       std::unique_ptr<Runner>* out);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  Backend backend() const { return backend_; }
  int copies() const { return int(params_.size()); }
  // Bytes one rotation over all copies reads (copies * bytes per call).
  int64_t rotation_bytes() const;

  Status call(int copy);  // one attention call on copy `copy` (asynchronous on CUDA)
  Status time(const TimeOptions& o, Timing* t);
  // CUDA only: `chain` consecutive calls (on copies c, c + 1, ...; a caller workspace) captured
  // into one CUDA graph for each copy c, as a decode step's graph holds one call per layer, the
  // graphs replayed in rotation; the median time of one call (a replay's time / chain).
  Status time_graph(int warmup, int iters, int chain, double* median_us);
  // AttentionParams::pdl of every copy's call (default true).
  void set_pdl(bool on);
  void set_deterministic(bool on);  // AttentionParams::deterministic of every call
  // CUDA only: how the library plans copy 0's call on the current device (the tensor-core kernel
  // or the generic one, the tile pool's block size, the splits, the merge), as the record's
  // "plan"; empty elsewhere.
  struct Plan {
    bool valid = false, tensor_cores = false;
    int pool_warps = 0;  // 0: no tile pool; 16 or 8 warps per block
    int splits = 0;
    const char* merge = "";  // "cluster", "in_kernel", "combine"
  };
  Plan plan() const;
  // The output of copy 0 on the host ([B, Hq, Lq, D] T).
  Status output(std::vector<uint8_t>* out);

 private:
  Runner() = default;
  Status sync();
  // TimeOptions::cold_cache: reads other_ (allocated on first use, twice the last-level cache).
  Status read_other();
  Backend backend_ = Backend::cpu;
  int64_t bytes_per_call_ = 0;
  size_t out_offset_ = 0, out_bytes_ = 0;
  std::vector<void*> arenas_;  // one per copy: host (aligned_alloc) or device (cudaMalloc)
  std::vector<qsdpa::AttentionParams> params_;
  void* stream_ = nullptr;  // cudaStream_t
  void* workspace_ = nullptr;
  void* other_ = nullptr;  // host (aligned_alloc) or device (cudaMalloc; its last 16 bytes: the sum)
  int64_t other_bytes_ = 0;
  volatile uint64_t other_sum_ = 0;  // host: what the reads summed (kept, so that they happen)
};

// What the timing runs on: the GPU's name, or the CPU model and thread count.
std::string device_name(Backend b);
// The last-level cache that timed data must exceed: the GPU's L2, or the CPU's L3.
int64_t last_level_cache_bytes(Backend b);
// Copy bandwidth of the memory the backend reads, counting read + write, in GB/s; `how` says how it
// was measured.
Status copy_bandwidth(Backend b, double* gbps, std::string* how);

// The backend `auto` means for the program: CUDA when a device is there, else the CPU.
Backend fastest_backend();
// Whether `b` can run here (said before any data is made): not_built / no_device otherwise.
Status check_backend(Backend b);

}  // namespace qsdpa_cli
