// The PyTorch comparison of `qsdpa bench`: runs bench/torch_sdpa.py (F.scaled_dot_product_attention
// on an fp16 cache, timed with CUDA events) for the same shapes, in a child process, after our
// own timing has released the GPU memory.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "bench.hpp"

namespace qsdpa_cli {

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool file_exists(const std::string& p) { return !p.empty() && access(p.c_str(), R_OK) == 0; }

}  // namespace

bool torch_available() {
  const int rc = std::system(
      "python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1");
  return rc == 0;
}

std::string find_torch_script(const std::string& given) {
  if (!given.empty()) return file_exists(given) ? given : "";
#ifdef QSDPA_SOURCE_DIR
  if (const std::string p = std::string(QSDPA_SOURCE_DIR) + "/bench/torch_sdpa.py"; file_exists(p)) return p;
#endif
  if (file_exists("bench/torch_sdpa.py")) return "bench/torch_sdpa.py";
  return "";
}

Status torch_compare(json& records, const std::string& script, int iters, bool cold_l2) {
  json shapes = json::array();
  for (const auto& r : records)
    shapes.push_back({{"B", r["B"]}, {"Hq", r["Hq"]}, {"Hkv", r["Hkv"]}, {"Lq", r["Lq"]},
                      {"N", r["N"]}, {"D", r["D"]}, {"dtype", r["dtype"]}});
  char path[] = "/tmp/qsdpa_torch_shapes_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return error(StatusCode::backend_error, "torch comparison: cannot create a temporary file");
  close(fd);
  {
    std::ofstream f(path);
    f << json{{"shapes", shapes}}.dump();
  }
  const std::string cmd = "python3 " + shell_quote(script) + " --shapes " + shell_quote(path) +
                          " --iters " + std::to_string(iters) + (cold_l2 ? " --cold-l2" : "");
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    const int rc = pclose(p);
    std::remove(path);
    if (rc != 0)
      return error(StatusCode::backend_error, "torch comparison: " + script + " failed (exit status " +
                                                  std::to_string(rc) + ")");
  } else {
    std::remove(path);
    return error(StatusCode::backend_error, "torch comparison: cannot start python3");
  }
  // The script prints one JSON array, one result per shape, as its last line.
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  json results = json::parse(last, nullptr, false);
  if (!results.is_array() || results.size() != records.size())
    return error(StatusCode::backend_error, "torch comparison: unexpected output from " + script);
  for (size_t i = 0; i < records.size(); ++i) {
    const json& t = results[i];
    json& r = records[i];
    if (t.contains("error")) {
      r["torch_error"] = t["error"];
      continue;
    }
    r["torch_time_us"] = t["torch_time_us"];
    r["torch_gbps"] = t["torch_gbps"];
    if (t.contains("torch_variant")) r["torch_variant"] = t["torch_variant"];
    if (r.contains("time_us") && r["time_us"].is_number() && r["time_us"].get<double>() > 0)
      r["speedup_vs_torch"] = t["torch_time_us"].get<double>() / r["time_us"].get<double>();
  }
  return Status{};
}

}  // namespace qsdpa_cli
