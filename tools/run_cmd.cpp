// `qsdpa run`: one attention problem (by default a realistic decode step), timed on one backend,
// checked against the reference, with what quantization costs in accuracy and saves in memory.
// `qsdpa info`: what was built and which devices are here.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "exec.hpp"

namespace qsdpa_cli {

namespace {

using json = nlohmann::ordered_json;

// The host oracle's work budget for `run`: about 3.4e7 cache elements touched, a second or two
// (the reference backend takes some 30 ns for each).
constexpr double kRunCheckBudget = double(1 << 25);

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string time_text(double us) {
  return us >= 1e6 ? fmt("%.3f s", us / 1e6) : us >= 1000.0 ? fmt("%.3f ms", us / 1000.0) : fmt("%.2f us", us);
}

// How many copies make one rotation read several times the last-level cache.
int64_t rotation_target(Backend b) {
  if (b == Backend::reference) return 0;  // the oracle is far too slow for caches to matter
  return (b == Backend::cuda ? 5 : 4) * last_level_cache_bytes(b);
}

}  // namespace

Status run_command(const RunOptions& o) {
  const Shape& s = o.shape;
  const Backend backend = o.backend == Backend::automatic ? fastest_backend() : o.backend;
  if (Status st = check_backend(backend); !st) return st;

  Problem pr;
  if (Status st = make_problem(s, o.seed, &pr); !st) return st;
  std::unique_ptr<Runner> runner;
  if (Status st = Runner::create(pr, backend, o.threads, rotation_target(backend), &runner); !st) return st;

  TimeOptions to;
  to.iters = o.iters;
  Timing t;
  if (Status st = runner->time(to, &t); !st) return st;

  std::vector<uint8_t> out;
  if (Status st = runner->output(&out); !st) return st;
  const int copies = runner->copies();
  const int64_t rotation = runner->rotation_bytes();
  runner.reset();
  Accuracy acc;
  if (Status st = check_accuracy(pr, out, kRunCheckBudget, &acc); !st) return st;

  const int64_t bytes = call_bytes(s);
  const double gbps = double(bytes) / t.median_us / 1e3;
  const int64_t qbytes = quantized_cache_bytes(s), fbytes = fp16_cache_bytes(s);
  const double ratio = qbytes > 0 ? double(fbytes) / double(qbytes) : 0.0;
  const int threads = o.threads > 0 ? o.threads : hardware_threads();

  if (o.json) {
    json j;
    j["command"] = "run";
    j["device"] = device_name(backend);
    j["date"] = utc_now_iso();
    j["backend"] = qsdpa::to_string(backend);
    j["B"] = s.B, j["Hq"] = s.Hq, j["Hkv"] = s.Hkv, j["Lq"] = s.Lq, j["N"] = s.N, j["D"] = s.D;
    j["bits"] = s.k_bits == s.v_bits ? json(s.k_bits) : json(nullptr);
    j["k_bits"] = s.k_bits, j["v_bits"] = s.v_bits, j["group"] = s.group;
    if (s.paged > 0) j["paged"] = s.paged;
    if (!s.kv_lens.empty()) j["kv_lens"] = s.kv_lens;
    j["dtype"] = qsdpa::to_string(s.dtype);
    j["window"] = s.window;
    j["sinks"] = s.sinks;
    j["bool_mask"] = s.bool_mask.empty() ? json(nullptr) : json(s.bool_mask);
    j["float_mask"] = s.float_mask;
    j["scale"] = s.effective_scale();
    if (backend == Backend::cpu) j["threads"] = threads;
    j["seed"] = o.seed;
    j["time_us"] = t.median_us;
    j["min_time_us"] = t.min_us;
    j["iters"] = t.iters;
    j["warmup"] = t.warmup;
    j["copies"] = copies;
    j["rotation_bytes"] = rotation;
    j["bytes"] = bytes;
    j["gbps"] = gbps;
    j["err_vs_reference"] = acc.err_vs_reference;
    j["quant_err"] = acc.quant_err;
    j["checked_rows"] = acc.rows_checked;
    j["total_rows"] = acc.rows_total;
    j["check_subset"] = acc.subset;
    j["cache_bytes"] = qbytes;
    j["fp16_cache_bytes"] = fbytes;
    j["cache_ratio"] = ratio;
    std::cout << j.dump() << "\n";
    return Status{};
  }

  std::ostringstream w;
  w << "qsdpa run  " << s.describe() << "\n";
  auto row = [&](const char* k, const std::string& v, const std::string& note) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "  %-20s", k);
    w << buf << v << std::string(v.size() < 13 ? 13 - v.size() : 1, ' ') << '(' << note << ")\n";
  };
  std::string where = device_name(backend);
  if (backend == Backend::cpu) where += ", " + std::to_string(threads) + " threads";
  std::string timing = std::string("median of ") + std::to_string(t.iters) + " calls after " +
                       std::to_string(t.warmup) + " warm-up";
  if (copies > 1)
    timing += ", rotating over " + std::to_string(copies) + " copies (" + human_bytes(double(rotation)) + ")";
  std::string moved = human_bytes(double(bytes));
  moved += " per call: packed K and V, scales, biases, q, out";
  if (s.sinks || !s.bool_mask.empty() || s.float_mask) moved += ", masks, sinks";
  std::string memory = qbytes > 0 ? std::string("quantized; ") + human_bytes(double(fbytes)) + " in fp16: " +
                                        fmt("%.2fx", ratio) + " smaller"
                                  : std::string("an empty cache");
  row("backend", qsdpa::to_string(backend), where);
  row("time per call", time_text(t.median_us), timing);
  row("bandwidth", fmt(gbps >= 10 ? "%.1f GB/s" : "%.3g GB/s", gbps), moved);
  row("error vs reference", fmt("%.2e", acc.err_vs_reference), std::string("relative L2 over ") + acc.subset);
  row("quantization error", fmt("%.2e", acc.quant_err),
      std::string("relative L2: fp64 attention on the unquantized ") + qsdpa::to_string(s.dtype) +
          " cache vs the reference on the quantized one");
  row("KV cache memory", human_bytes(double(qbytes)), memory);
  std::cout << w.str();
  return Status{};
}

Status info_command(bool as_json) {
  const std::string b = qsdpa::build_info(), d = qsdpa::device_info();
#ifdef QSDPA_WITH_CUDA
  const std::string program = "program: CUDA timing built in (runtime API, events, graphs)\n";
#else
  const std::string program = "program: host timing only (built without CUDA)\n";
#endif
  if (as_json) {
    auto lines = [](const std::string& text) {
      json a = json::array();
      std::istringstream in(text);
      for (std::string l; std::getline(in, l);)
        if (!l.empty()) a.push_back(l);
      return a;
    };
    json j;
    j["build"] = lines(b + program);
    j["devices"] = lines(d);
    j["cpu"] = cpu_model_name();
    std::cout << j.dump() << "\n";
    return Status{};
  }
  std::cout << b << program << d << "cpu model: " << cpu_model_name() << "\n";
  return Status{};
}

}  // namespace qsdpa_cli
