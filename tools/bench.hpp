// Pieces of `qsdpa bench` shared between its files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common.hpp"

namespace qsdpa_cli {

using json = nlohmann::ordered_json;

// Whether python3 can import torch and torch sees a GPU.
bool torch_available();

// Runs the PyTorch timing script for the shapes of `records` (keys B, Hq, Hkv, Lq, N, D, dtype)
// and adds torch_time_us, torch_gbps and speedup_vs_torch (torch time / ours) to each record
// that has a time_us. `iters`: timed calls per shape; `cold_l2`: the script reads twice the L2 of
// other data before each call, as `qsdpa bench --cold-l2` does.
Status torch_compare(json& records, const std::string& script, int iters, bool cold_l2);

// The script's path: `given`, else bench/torch_sdpa.py in the source tree, else in the
// current directory; empty when none exists.
std::string find_torch_script(const std::string& given);

}  // namespace qsdpa_cli
