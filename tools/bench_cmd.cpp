// `qsdpa bench`: a sweep of shapes timed against the copy bandwidth measured in the same run (and,
// on CUDA, against PyTorch's SDPA on an fp16 cache). One JSON record per shape with --json.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "bench.hpp"
#include "commands.hpp"
#include "exec.hpp"

namespace qsdpa_cli {

namespace {

// The host oracle's work budget per shape in `bench`: about 8e6 cache elements touched (a quarter
// of a second), enough to catch a wrong kernel on a few (sequence, head) rows.
constexpr double kBenchCheckBudget = double(1 << 23);

struct BenchShape {
  Shape s;
  bool graph = false;  // also time as CUDA-graph replay
};

Shape make_shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t N, int64_t D, int bits) {
  Shape s;
  s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Lq = Lq, s.N = N, s.D = D;
  s.k_bits = s.v_bits = bits;
  return s;  // group 64, f16
}

// The CUDA sweep: decode shapes from serving (batched, long-context, many short sequences, one
// short sequence where launch overhead shows; the first and that one also as CUDA-graph replay),
// the large head dims, 2-bit, and Lq = 4.
std::vector<BenchShape> cuda_shapes() {
  std::vector<BenchShape> v;
  for (int bits : {4, 8}) v.push_back({make_shape(8, 32, 8, 1, 32768, 128, bits), true});
  for (int bits : {4, 8}) v.push_back({make_shape(1, 32, 8, 1, 131072, 128, bits)});
  for (int bits : {4, 8}) v.push_back({make_shape(32, 32, 8, 1, 4096, 128, bits)});
  for (int bits : {4, 8}) v.push_back({make_shape(1, 32, 8, 1, 4096, 128, bits), true});
  for (int bits : {4, 8}) v.push_back({make_shape(4, 16, 2, 1, 32768, 256, bits)});
  for (int bits : {4, 8}) v.push_back({make_shape(4, 16, 1, 1, 32768, 512, bits)});
  v.push_back({make_shape(8, 32, 8, 1, 32768, 128, 2)});
  for (int bits : {4, 8}) v.push_back({make_shape(8, 32, 8, 4, 32768, 128, bits)});
  return v;
}

// The CPU sweep (about a minute on 2 cores): the decode shape at 4 and 8 bits, then at 4 bits
// other cache lengths, head dims, Lq = 4, and 2-bit.
std::vector<BenchShape> cpu_shapes() {
  std::vector<BenchShape> v;
  for (int bits : {4, 8}) v.push_back({make_shape(1, 32, 8, 1, 8192, 128, bits)});
  for (int64_t n : {1024, 32768, 131072}) v.push_back({make_shape(1, 32, 8, 1, n, 128, 4)});
  for (int64_t d : {64, 256}) v.push_back({make_shape(1, 32, 8, 1, 8192, d, 4)});
  v.push_back({make_shape(1, 32, 8, 4, 8192, 128, 4)});
  v.push_back({make_shape(1, 32, 8, 1, 8192, 128, 2)});
  return v;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Times one shape into `r`. Fills what it measured even when a later step fails.
Status bench_one(const BenchOptions& o, Backend backend, const BenchShape& bs, double copy_gbps, json& r) {
  const Shape& s = bs.s;
  Problem pr;
  if (Status st = make_problem(s, o.seed, &pr); !st) return st;
  const int64_t rotation = backend == Backend::reference ? 0 : (backend == Backend::cuda ? 5 : 4) * last_level_cache_bytes(backend);
  std::unique_ptr<Runner> runner;
  if (Status st = Runner::create(pr, backend, o.threads, rotation, &runner); !st) return st;
  runner->set_pdl(o.pdl);
  runner->set_deterministic(o.deterministic);

  TimeOptions to;
  to.iters = o.iters;
  to.cold_cache = o.cold_l2;
  to.min_iters = 5;   // host: each shape gets about 1.5 s of timed calls, 5 to 50 of them
  to.max_iters = 50;
  Timing t;
  if (Status st = runner->time(to, &t); !st) return st;
  const int64_t bytes = call_bytes(s);
  const double gbps = double(bytes) / t.median_us / 1e3;
  r["time_us"] = t.median_us;
  r["min_time_us"] = t.min_us;
  r["iters"] = t.iters;
  r["warmup"] = t.warmup;
  if (t.cold_bytes > 0) r["cold_l2_bytes"] = t.cold_bytes;  // read before each call (--cold-l2)
  r["copies"] = runner->copies();
  r["rotation_bytes"] = runner->rotation_bytes();
  r["bytes"] = bytes;
  r["gbps"] = gbps;
  r["copy_gbps"] = copy_gbps;
  r["frac_copy"] = gbps / copy_gbps;
  if (const Runner::Plan pl = runner->plan(); pl.valid)
    r["plan"] = {{"tensor_cores", pl.tensor_cores}, {"pool_warps", pl.pool_warps}, {"splits", pl.splits}, {"merge", pl.merge}};

  if (bs.graph && backend == Backend::cuda && !o.cold_l2) {  // (graph replays run back to back: never cold)
    // One call per graph, and a graph of kChain calls one after another (as a decode step's graph
    // holds one call per layer): between the calls of one graph the launch latency can hide behind
    // the previous call (with pdl), between graphs it cannot.
    constexpr int kChain = 10;
    double g = 0, gc = 0;
    if (Status st = runner->time_graph(10, std::max(50, o.iters), 1, &g); !st)
      r["graph_error"] = st.message;
    else if (st = runner->time_graph(2, std::max(5, o.iters / kChain), kChain, &gc); !st)
      r["graph_error"] = st.message;
    if (g > 0) r["graph_time_us"] = g;
    if (gc > 0) r["graph_chain_time_us"] = gc, r["graph_chain_calls"] = kChain;
  }
  std::vector<uint8_t> out;
  if (Status st = runner->output(&out); !st) return st;
  runner.reset();
  Accuracy acc;
  if (Status st = check_accuracy(pr, out, kBenchCheckBudget, &acc); !st) return st;
  r["err_vs_reference"] = acc.err_vs_reference;
  r["quant_err"] = acc.quant_err;
  r["checked_rows"] = acc.rows_checked;
  return Status{};
}

json base_record(const std::string& device, const std::string& date, Backend backend, const Shape& s, int threads,
                 bool pdl) {
  json r;
  r["device"] = device;
  r["date"] = date;
  r["backend"] = qsdpa::to_string(backend);
  r["B"] = s.B, r["Hq"] = s.Hq, r["Hkv"] = s.Hkv, r["Lq"] = s.Lq, r["N"] = s.N, r["D"] = s.D;
  r["bits"] = s.k_bits == s.v_bits ? json(s.k_bits) : json(nullptr);
  r["k_bits"] = s.k_bits, r["v_bits"] = s.v_bits, r["group"] = s.group;
  if (s.paged > 0) r["paged"] = s.paged;
  if (!s.kv_lens.empty()) r["kv_lens"] = s.kv_lens;
  r["dtype"] = qsdpa::to_string(s.dtype);
  if (s.window) r["window"] = s.window;
  if (s.sinks) r["sinks"] = true;
  if (!s.bool_mask.empty()) r["bool_mask"] = s.bool_mask;
  if (s.float_mask) r["float_mask"] = true;
  if (s.scale > 0) r["scale"] = s.scale;
  if (backend == Backend::cpu) r["threads"] = threads;
  if (backend == Backend::cuda) r["pdl"] = pdl;
  return r;
}

std::string cell(const json& r, const char* key, const char* f, double mul = 1.0) {
  return r.contains(key) && r[key].is_number() ? fmt(f, r[key].get<double>() * mul) : std::string("-");
}

}  // namespace

Status bench_command(const BenchOptions& o) {
  const Backend backend = o.backend == Backend::automatic ? fastest_backend() : o.backend;
  if (Status st = check_backend(backend); !st) return st;
  if (o.graph && backend != Backend::cuda)
    return error(StatusCode::invalid_argument, "--graph (CUDA-graph replay) needs the cuda backend");
  std::vector<BenchShape> shapes;
  if (o.custom_shape)
    shapes.push_back({o.shape, o.graph});
  else if (backend == Backend::cuda)
    shapes = cuda_shapes();
  else if (backend == Backend::cpu)
    shapes = cpu_shapes();
  else
    shapes.push_back({make_shape(1, 32, 8, 1, 1024, 128, 4)});  // the oracle is slow: one small shape
  for (const auto& bs : shapes)  // report a bad shape before anything is timed
    if (Status st = validate(bs.s); !st) return st;

  const bool table = !o.json && !o.jsonl;
  std::ostream& info = table ? std::cout : std::cerr;
  const std::string device = device_name(backend), date = utc_now_iso();
  const int threads = o.threads > 0 ? o.threads : hardware_threads();
  double copy_gbps = 0;
  std::string copy_how;
  if (Status st = copy_bandwidth(backend == Backend::cuda ? backend : Backend::cpu, &copy_gbps, &copy_how); !st)
    return st;

  info << "qsdpa bench  backend " << qsdpa::to_string(backend) << " on " << device
       << (backend == Backend::cpu ? " (" + std::to_string(threads) + " threads)" : "") << ", " << date << "\n"
       << "copy bandwidth " << fmt("%.1f GB/s", copy_gbps) << " (" << copy_how << ")\n";
  if (backend == Backend::cuda)
    info << "timing: CUDA events, median of " << (o.iters > 0 ? o.iters : 100)
         << " calls after 10 warm-up; inputs rotated over copies reading >= 5x the "
         << human_mib(double(last_level_cache_bytes(backend))) << " L2 per rotation"
         << (o.pdl ? "; programmatic dependent launch on" : "; programmatic dependent launch off (--no-pdl)")
         << "\ngraph_us: one call per CUDA graph, graphs replayed back to back; graph10_us: per call, in graphs of 10 "
            "calls in a row\n";
  else
    info << "timing: steady_clock, median of "
         << (o.iters > 0 ? std::to_string(o.iters) + " calls" : "5 to 50 calls (about 1.5 s of them; the count is in 'calls')")
         << "; inputs rotated over copies reading >= 4x the " << human_mib(double(last_level_cache_bytes(backend)))
         << " last-level cache per rotation\n";
  info << "bytes per call: packed K and V, scales, biases, q, out; err: relative L2 against the reference "
          "backend on a subset of heads\n";
  size_t w = 5;
  for (const auto& bs : shapes) w = std::max(w, bs.s.describe().size());
  char line[512];
  if (table) {
    std::snprintf(line, sizeof line, "%-*s %11s %6s %10s %9s %7s %10s %10s %9s", int(w), "shape", "time_us", "calls",
                  "MB/call", "GB/s", "of copy", "graph_us", "graph10_us", "err");
    std::cout << line << "\n";
  }

  json records = json::array();
  int failures = 0;
  std::string first_error;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const BenchShape& bs = shapes[i];
    json r = base_record(device, date, backend, bs.s, threads, o.pdl);
    if (o.deterministic) r["deterministic"] = true;
    if (!table) std::cerr << "[" << i + 1 << "/" << shapes.size() << "] " << bs.s.describe() << std::flush;
    const Status st = bench_one(o, backend, bs, copy_gbps, r);
    if (!st) {
      r["error"] = st.message;
      if (failures++ == 0) first_error = st.message;
    }
    if (table) {
      std::snprintf(line, sizeof line, "%-*s %11s %6s %10s %9s %7s %10s %10s %9s", int(w), bs.s.describe().c_str(),
                    cell(r, "time_us", "%.2f").c_str(), cell(r, "iters", "%.0f").c_str(),
                    cell(r, "bytes", "%.2f", 1e-6).c_str(), cell(r, "gbps", "%.1f").c_str(),
                    cell(r, "frac_copy", "%.1f%%", 100.0).c_str(), cell(r, "graph_time_us", "%.2f").c_str(),
                    cell(r, "graph_chain_time_us", "%.2f").c_str(), cell(r, "err_vs_reference", "%.1e").c_str());
      std::cout << line;
      if (!st) std::cout << "  error: " << st.message;
      if (r.contains("graph_error")) std::cout << "  graph: " << r["graph_error"].get<std::string>();
      std::cout << std::endl;
    } else {
      std::cerr << (st ? "" : "  error: " + st.message) << "\n";
    }
    records.push_back(r);
  }

  // PyTorch on the same shapes (fp16 cache), when it can use the GPU.
  if (backend == Backend::cuda && o.torch) {
    const std::string script = find_torch_script(o.torch_script);
    if (script.empty()) {
      info << "PyTorch comparison skipped: bench/torch_sdpa.py not found (give --torch-script)\n";
    } else if (!torch_available()) {
      info << "PyTorch comparison skipped: python3 cannot import torch, or torch sees no GPU\n";
    } else if (Status st = torch_compare(records, script, std::max(50, o.iters > 0 ? o.iters : 100), o.cold_l2); !st) {
      info << "PyTorch comparison failed: " << st.message << "\n";
    } else if (table) {
      std::cout << "\nPyTorch F.scaled_dot_product_attention on an fp16 cache (" << script
                << "; CUDA events, median, rotated inputs):\n";
      std::snprintf(line, sizeof line, "%-*s %11s %11s %9s %9s", int(w), "shape", "time_us", "torch_us",
                    "torch GB/s", "speedup");
      std::cout << line << "\n";
      for (size_t i = 0; i < shapes.size(); ++i) {
        const json& r = records[i];
        std::snprintf(line, sizeof line, "%-*s %11s %11s %9s %9s", int(w), shapes[i].s.describe().c_str(),
                      cell(r, "time_us", "%.2f").c_str(), cell(r, "torch_time_us", "%.2f").c_str(),
                      cell(r, "torch_gbps", "%.1f").c_str(), cell(r, "speedup_vs_torch", "%.2fx").c_str());
        std::cout << line;
        if (r.contains("torch_error")) std::cout << "  torch error: " << r["torch_error"].get<std::string>();
        std::cout << "\n";
      }
    }
  }

  std::string text;
  if (o.jsonl)
    for (const auto& r : records) text += r.dump() + "\n";
  else
    text = records.dump(1) + "\n";
  if (!table) std::cout << text;
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    if (!(f << text)) return error(StatusCode::invalid_argument, "cannot write " + o.out);
    info << "wrote " << records.size() << " records to " << o.out << "\n";
  }
  if (failures)
    return error(StatusCode::backend_error, std::to_string(failures) + " of " + std::to_string(shapes.size()) +
                                                " shapes failed; the first: " + first_error);
  return Status{};
}

}  // namespace qsdpa_cli
