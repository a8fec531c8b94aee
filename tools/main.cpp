// qsdpa: the command-line program. Flags and help come from CLI11; every error ends as one line
// on stderr and a non-zero exit, never a crash:
//   - a bad flag: CLI11's message, exit code from CLI11;
//   - an error from the library (a Status): `qsdpa: error: <message>`, exit 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <new>

#include "commands.hpp"

namespace {

using namespace qsdpa_cli;

// Flags that describe the attention problem; shared by `run` and `bench`.
struct ShapeFlags {
  int bits = 4, k_bits = 0, v_bits = 0;
  std::string dtype = "f16", backend = "auto";
  std::vector<int64_t> kv_lens;
  std::vector<CLI::Option*> shape_opts;  // any of these given: `bench` runs just that shape
};

const std::map<std::string, Backend> kBackends = {
    {"auto", Backend::automatic}, {"reference", Backend::reference}, {"cpu", Backend::cpu}, {"cuda", Backend::cuda}};

// A validator for integer flags with a lower bound: "--N: must be at least 0 (got -4)".
CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& v) -> std::string {
        long long x = 0;
        if (!CLI::detail::lexical_cast(v, x)) return "not an integer (got " + v + ")";
        if (x < min) return "must be at least " + std::to_string(min) + " (got " + v + ")";
        return "";
      },
      min == 0 ? "NONNEGATIVE" : min == 1 ? "POSITIVE" : ">=" + std::to_string(min));
}

void add_problem_flags(CLI::App* app, Shape& s, ShapeFlags& f, int& threads, int& iters, uint64_t& seed) {
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag wins
  auto shape = [&](CLI::Option* o) { f.shape_opts.push_back(o); };
  shape(app->add_option("--B", s.B, "batch: sequences")->check(at_least(1))->capture_default_str());
  shape(app->add_option("--Hq", s.Hq, "query heads")->check(at_least(1))->capture_default_str());
  shape(app->add_option("--Hkv", s.Hkv, "key/value heads; Hq must be a multiple (grouped-query attention)")
            ->check(at_least(1))
            ->capture_default_str());
  shape(app->add_option("--Lq", s.Lq, "query rows per sequence (1 = decode; more: speculative decoding, chunked prefill)")
            ->check(at_least(1))
            ->capture_default_str());
  shape(app->add_option("--N", s.N, "tokens in the KV cache of each sequence")
            ->check(at_least(0))
            ->capture_default_str());
  shape(app->add_option("--D", s.D, "head dim: a multiple of 32 up to 512")->check(at_least(1))->capture_default_str());
  shape(app->add_option("--bits", f.bits, "bits per K and V value: 2, 4 or 8")
            ->check(CLI::IsMember({2, 4, 8}))
            ->capture_default_str());
  shape(app->add_option("--k-bits", f.k_bits, "bits per K value (overrides --bits for K)")->check(CLI::IsMember({2, 4, 8})));
  shape(app->add_option("--v-bits", f.v_bits, "bits per V value (overrides --bits for V)")->check(CLI::IsMember({2, 4, 8})));
  shape(app->add_option("--group", s.group, "quantization group size: 32, 64 or 128 values per scale and bias")
            ->check(CLI::IsMember({32, 64, 128}))
            ->capture_default_str());
  shape(app->add_option("--dtype", f.dtype, "element type of q, scales, biases, float mask and out: f32, f16 or bf16")
            ->check(CLI::IsMember({"f32", "f16", "bf16"}))
            ->capture_default_str());
  shape(app->add_option("--window", s.window, "sliding window in tokens (0 = none)")
            ->check(at_least(0))
            ->capture_default_str());
  shape(app->add_flag("--sinks", s.sinks, "add per-head attention sinks (gpt-oss style), drawn uniformly from [-10, 10]"));
  shape(app->add_option("--bool-mask", s.bool_mask,
                        "add a boolean mask of this element type (u8 or u32): a left padding of up to N/8 tokens "
                        "per sequence and about 1 key in 16 hidden")
            ->check(CLI::IsMember({"u8", "u32"})));
  shape(app->add_flag("--float-mask", s.float_mask,
                      "add a float mask: ALiBi position biases per head, -inf on a left padding"));
  shape(app->add_option("--scale", s.scale, "logit scale (0 = 1/sqrt(D))")->capture_default_str());
  shape(app->add_option("--paged", s.paged,
                        "a paged KV cache: pages of this many tokens (a power of two, 16 to 256) in a shuffled pool, "
                        "with a block table (0 = contiguous)")
            ->check(CLI::IsMember({0, 16, 32, 64, 128, 256})));
  shape(app->add_option("--kv-lens", f.kv_lens,
                        "per-sequence cache lengths, comma-separated (sets B to their count and N to their maximum)")
            ->delimiter(',')
            ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX))));
  app->add_option("--backend", f.backend, "auto (cuda when a GPU is present, else cpu), reference, cpu or cuda")
      ->check(CLI::IsMember({"auto", "reference", "cpu", "cuda"}))
      ->capture_default_str();
  app->add_option("--threads", threads, "CPU threads (0 = all hardware threads)")
      ->check(at_least(0))
      ->capture_default_str();
  app->add_option("--iters", iters,
                  "timed calls (0 = automatic: 100 on CUDA; on the host as many as fit in about 1.5 s, "
                  "within bounds)")
      ->check(at_least(0))
      ->capture_default_str();
  app->add_option("--seed", seed, "seed of the random data")->capture_default_str();
}

// Turns the string-valued flags into the shape and the backend (their values are checked already).
void finish_shape(Shape& s, const ShapeFlags& f, Backend* backend) {
  s.k_bits = f.k_bits ? f.k_bits : f.bits;
  s.v_bits = f.v_bits ? f.v_bits : f.bits;
  if (!f.kv_lens.empty()) {
    s.kv_lens.assign(f.kv_lens.begin(), f.kv_lens.end());
    s.B = int64_t(f.kv_lens.size());
    s.N = *std::max_element(f.kv_lens.begin(), f.kv_lens.end());
  }
  parse_dtype(f.dtype, &s.dtype);  // checked by IsMember
  *backend = kBackends.at(f.backend);
}

int fail(const Status& st) {
  std::fprintf(stderr, "qsdpa: error: %s\n", st.message.empty() ? qsdpa::to_string(st.code) : st.message.c_str());
  return 1;
}

int real_main(int argc, char** argv) {
  CLI::App app{"qsdpa: attention computed straight from an MLX-affine-quantized KV cache.\n"
               "Commands: run (one problem, timed and checked), bench (a sweep of shapes), info.",
               "qsdpa"};
  app.require_subcommand(1);
  app.get_formatter()->column_width(28);

  RunOptions ro;
  ShapeFlags rf;
  CLI::App* run = app.add_subcommand(
      "run",
      "Run one attention problem (default: a decode step, B=1 Hq=32 Hkv=8 D=128 N=8192 Lq=1, 4-bit K and V, "
      "group 64, f16) on one backend: time per call, GB/s, error against the reference backend, the error "
      "quantization itself causes, and the cache memory against fp16.");
  add_problem_flags(run, ro.shape, rf, ro.threads, ro.iters, ro.seed);
  run->add_flag("--json", ro.json, "print the result as one JSON object");

  BenchOptions bo;
  ShapeFlags bf;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Time a sweep of shapes (or the one the shape flags describe) against the copy bandwidth measured in the "
      "same run; with the cuda backend, also against PyTorch's SDPA on an fp16 cache when torch can use the GPU.");
  add_problem_flags(bench, bo.shape, bf, bo.threads, bo.iters, bo.seed);
  bench->add_flag("--graph", bo.graph, "with a shape given: also time it as CUDA-graph replay");
  bench->add_flag("--json", bo.json, "print the results as a JSON array, one record per shape");
  bench->add_flag("--jsonl", bo.jsonl, "print the results as JSON lines, one record per shape");
  bench->add_option("--out", bo.out, "also write the JSON (array, or lines with --jsonl) to this file");
  bool no_torch = false, no_pdl = false;
  bench->add_flag("--no-torch", no_torch, "skip the PyTorch comparison");
  bench->add_flag("--no-pdl", no_pdl, "cuda: launch without programmatic dependent launch (AttentionParams::pdl false)");
  bench->add_flag("--deterministic", bo.deterministic,
                  "the same output bits on every call (AttentionParams::deterministic; cuda: no tile pool)");
  bench->add_flag("--cold-l2", bo.cold_l2,
                  "before each call (outside its timing), read twice the GPU's L2 (the CPU's L3) of other data, "
                  "as the kernel before an attention call in a model would: every call starts with the cache "
                  "holding someone else's lines, whatever the shape before it left (host: one thread reads, "
                  "so the other cores' private caches keep theirs); no CUDA-graph timings then");
  bench->add_option("--torch-script", bo.torch_script, "the PyTorch timing script (default: bench/torch_sdpa.py)");

  bool info_json = false;
  CLI::App* info = app.add_subcommand("info", "Print the build configuration and the devices present.");
  info->add_flag("--json", info_json, "print as one JSON object");

  if (argc <= 1) {
    std::cout << app.help();
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "qsdpa: error: %s (see qsdpa --help)\n", e.what());
    return e.get_exit_code();
  }

  if (run->parsed()) {
    finish_shape(ro.shape, rf, &ro.backend);
    if (Status st = run_command(ro); !st) return fail(st);
    return 0;
  }
  if (bench->parsed()) {
    finish_shape(bo.shape, bf, &bo.backend);
    for (CLI::Option* o : bf.shape_opts)
      if (o->count() > 0) bo.custom_shape = true;
    bo.torch = !no_torch;
    bo.pdl = !no_pdl;
    if (Status st = bench_command(bo); !st) return fail(st);
    return 0;
  }
  if (info->parsed()) {
    if (Status st = info_command(info_json); !st) return fail(st);
    return 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return real_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "qsdpa: error: out of host memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qsdpa: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "qsdpa: error: unexpected failure\n");
  }
  return 1;
}
