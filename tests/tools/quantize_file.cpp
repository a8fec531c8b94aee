// quantize_file: runs qsdpa::quantize on a raw binary file so that a script can compare the result
// with another quantizer (tests/python/test_mlx_quantize.py compares it with MLX's mx.quantize).
//
//   quantize_file IN ROWS DIM BITS GROUP DTYPE OUT_PREFIX
//
// IN holds ROWS * DIM values of DTYPE (f32, f16 or bf16; native byte order). The output goes to
// OUT_PREFIX.packed (u32 words), OUT_PREFIX.scales and OUT_PREFIX.biases (DTYPE). The file is
// quantized with Backend::reference and again with Backend::cpu; the program fails when the two
// differ in any byte, so one comparison with MLX covers both host backends.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "qsdpa/qsdpa.hpp"

namespace {

struct Output {
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
};

bool parse_int(const char* s, int64_t* v) {
  char* end = nullptr;
  const long long x = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0') return false;
  *v = x;
  return true;
}

bool parse_dtype(const std::string& s, qsdpa::DType* t) {
  if (s == "f32") *t = qsdpa::DType::f32;
  else if (s == "f16") *t = qsdpa::DType::f16;
  else if (s == "bf16") *t = qsdpa::DType::bf16;
  else return false;
  return true;
}

bool write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(bytes));
  return bool(f);
}

// Quantizes `w` with one backend; the outputs are filled with a byte pattern first so that an
// unwritten element shows as a difference between the backends.
bool run(qsdpa::Backend b, const std::vector<uint8_t>& w, qsdpa::DType t, qsdpa::QuantFormat f,
         int64_t rows, int64_t dim, Output* o, uint8_t poison) {
  o->packed.assign(size_t(rows * qsdpa::packed_words_per_row(f, dim)), poison * 0x01010101u);
  o->scales.assign(size_t(rows * qsdpa::groups_per_row(f, dim)) * qsdpa::dtype_size(t), poison);
  o->biases.assign(o->scales.size(), poison);
  qsdpa::QuantizeParams p;
  p.dtype = t;
  p.format = f;
  p.rows = rows;
  p.dim = dim;
  p.w = w.data();
  p.packed = o->packed.data();
  p.scales = o->scales.data();
  p.biases = o->biases.data();
  p.backend = b;
  const qsdpa::Status s = qsdpa::quantize(p);
  if (!s) {
    std::fprintf(stderr, "quantize_file: backend %s failed (%s): %s\n", qsdpa::to_string(b),
                 qsdpa::to_string(s.code), s.message.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s IN ROWS DIM BITS GROUP DTYPE OUT_PREFIX\n", argv[0]);
    return 2;
  }
  int64_t rows = 0, dim = 0, bits = 0, group = 0;
  qsdpa::DType t{};
  if (!parse_int(argv[2], &rows) || !parse_int(argv[3], &dim) || !parse_int(argv[4], &bits) ||
      !parse_int(argv[5], &group) || !parse_dtype(argv[6], &t)) {
    std::fprintf(stderr, "quantize_file: bad argument (ROWS DIM BITS GROUP must be integers, "
                         "DTYPE one of f32, f16, bf16)\n");
    return 2;
  }
  const qsdpa::QuantFormat f{int(bits), int(group)};

  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "quantize_file: cannot open %s\n", argv[1]);
    return 2;
  }
  std::vector<uint8_t> w((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (rows < 0 || dim < 0 || uint64_t(w.size()) != uint64_t(rows) * uint64_t(dim) * qsdpa::dtype_size(t)) {
    std::fprintf(stderr, "quantize_file: %s holds %zu bytes, expected ROWS * DIM * %zu\n", argv[1],
                 w.size(), qsdpa::dtype_size(t));
    return 2;
  }

  Output ref, cpu;
  if (!run(qsdpa::Backend::reference, w, t, f, rows, dim, &ref, 0x5a)) return 1;
  if (!run(qsdpa::Backend::cpu, w, t, f, rows, dim, &cpu, 0xa5)) return 1;
  if (ref.packed != cpu.packed || ref.scales != cpu.scales || ref.biases != cpu.biases) {
    std::fprintf(stderr, "quantize_file: the reference and cpu backends differ (packed %s, scales %s, "
                         "biases %s)\n",
                 ref.packed == cpu.packed ? "equal" : "differ",
                 ref.scales == cpu.scales ? "equal" : "differ",
                 ref.biases == cpu.biases ? "equal" : "differ");
    return 1;
  }

  const std::string prefix = argv[7];
  if (!write_file(prefix + ".packed", ref.packed.data(), ref.packed.size() * 4) ||
      !write_file(prefix + ".scales", ref.scales.data(), ref.scales.size()) ||
      !write_file(prefix + ".biases", ref.biases.data(), ref.biases.size())) {
    std::fprintf(stderr, "quantize_file: cannot write %s.*\n", prefix.c_str());
    return 1;
  }
  return 0;
}
