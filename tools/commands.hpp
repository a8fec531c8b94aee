// The qsdpa program's commands. Each returns a Status; main() prints a failed one as
// `qsdpa: error: <message>` and exits 1.
#pragma once

#include <string>

#include "common.hpp"

namespace qsdpa_cli {

struct RunOptions {
  Shape shape;
  Backend backend = Backend::automatic;
  int threads = 0;  // CPU threads, 0 = all
  int iters = 0;    // timed calls, 0 = automatic
  uint64_t seed = 1;
  bool json = false;
};
Status run_command(const RunOptions& o);

struct BenchOptions {
  Backend backend = Backend::automatic;
  bool custom_shape = false;  // a shape flag was given: run only `shape`
  Shape shape;
  bool graph = false;  // also time `shape` as CUDA-graph replay
  bool pdl = true;     // AttentionParams::pdl of the timed calls (--no-pdl: false)
  bool deterministic = false;  // AttentionParams::deterministic of the timed calls (--deterministic)
  bool cold_l2 = false;  // before each call, read twice the last-level cache of other data (--cold-l2)
  int threads = 0;
  int iters = 0;
  uint64_t seed = 1;
  bool json = false, jsonl = false;
  std::string out;  // write the JSON here too
  bool torch = true;
  std::string torch_script;  // default: bench/torch_sdpa.py of the source tree
};
Status bench_command(const BenchOptions& o);

Status info_command(bool json);

}  // namespace qsdpa_cli
