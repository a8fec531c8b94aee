// The CPU backend's internal interface between the planner (cpu_backend.cpp: threads, split-K,
// merging, writing out) and the two attention kernels that compute one task:
//   - the portable kernel (portable_kernel.cpp): plain loops, any machine, the fallback;
//   - the SIMD kernel (simd_kernel.cpp): Google Highway, compiled once per instruction set and
//     dispatched at run time to the best one the machine has.
// Both leave the same thing behind: per query row, the unnormalized online-softmax state (m, l, o)
// over the task's keys (softmax_state.hpp), o in natural element order.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "../core/layout.hpp"
#include "qsdpa/qsdpa.hpp"

namespace qsdpa::detail::cpu {

// What every task of one attention call shares.
struct Plan {
  const AttentionParams* p;
  int64_t rep;      // query heads per KV head
  int64_t R;        // rows of a group: rep * Lq
  int64_t rb;       // rows per block
  int64_t nrb;      // row blocks per group
  int64_t units;    // B * Hkv * nrb
  int64_t nchunks;  // token chunks per unit (1: no split-K)
  float scale;
  int64_t window;   // the sliding window, 0 when it hides nothing
  float* partial;   // nchunks > 1: [units, nchunks, rb, D + 2] states (m, l, o)
  // Where things live (qsdpa.hpp's layouts, resolved): cache rows, and element offsets of the
  // rows of q, out and the masks.
  RowMap km, vm;
  ElemMap qm, om, mm;
};

// One task: the rows [r0, r1) of the group of (b, kvh) (row r of the group is query head
// kvh * rep + r / Lq, query row r % Lq) over the keys [t0, t1). The kernel writes m[0, nr),
// l[0, nr) and o[0, nr * D) with nr = r1 - r0.
// n and lq are the sequence's tokens and query rows (per-sequence lengths; else N and Lq): query
// row i sits at position n - lq + i, and rows i >= lq see no key.
struct Task {
  int64_t b, kvh, r0, r1, t0, t1;
  int64_t n, lq;
  float* m;
  float* l;
  float* o;
};

// Grows a per-thread scratch vector to at least n elements (never shrinks it).
template <class V>
void ensure(V& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}

// The portable kernel: always available.
void portable_attend(const Plan& pl, const Task& t);

// The SIMD kernel on the instruction set chosen at run time. Returns false, having written
// nothing, when that instruction set has no SIMD kernel (Highway's one-lane scalar target); the
// caller then runs the portable kernel.
bool simd_attend(const Plan& pl, const Task& t);

// Micro-benchmark hook (bench/cpu_kernels_bench.cpp): runs one inner kernel of the SIMD kernel, on
// the instruction set chosen at run time, `reps` times over a synthetic tile of 64 tokens that
// stays in L1: which = 0 is K (unpack + integer dot products + the affine map, for `rows` query
// rows), which = 1 is V (unpack + weighted accumulate). `f32`: the kernels of f32 inputs (K: the
// two-piece q; V: f32 multiply-adds) instead of those of f16 / bf16 (K: one int16 piece; V: int16
// weights). Returns false where that instruction set has no SIMD kernel.
struct MicroArgs {
  int which = 0;
  int bits = 4;
  int rows = 4;
  bool f32 = false;
  int64_t D = 128;
  int64_t group = 64;
};
bool simd_micro(const MicroArgs& a, int64_t reps);
constexpr int64_t kMicroTokens = 128;

// Which kernel the CPU backend runs. `automatic` (the default) is the SIMD kernel on the best
// instruction set the machine supports; `portable` forces the plain-loop kernel. The environment
// variable QSDPA_CPU_TARGET=portable selects the portable kernel for a whole process; any other
// value (or none) leaves the choice automatic. Tests pick an instruction set with Highway's
// hwy::SetSupportedTargetsForTest.
enum class KernelChoice : int { automatic = 0, portable = 1 };
void set_kernel_choice(KernelChoice c);
KernelChoice kernel_choice();

// The name of the kernel a call would run now: "portable" or the Highway target ("AVX2",
// "AVX3", "AVX3_DL", "SSE4", "NEON", ...).
std::string kernel_name();

// Bitfield of the Highway targets (HWY_AVX2, ...) the SIMD kernel was compiled for, and the
// subset that this machine can run (what a test iterates over).
int64_t simd_compiled_targets();
int64_t simd_runnable_targets();

// Tasks the SIMD kernel ran twice, the second time with V on f32 weights, because a row's
// estimated rounding error of the int16 weights (f16 / bf16) was not small against its result
// (simd_kernel.cpp, AttendWith): a cache whose codes' and biases' parts cancel. Tests read it to
// see that the check fires where it must and nowhere else.
std::atomic<int64_t>& v_recheck_count();

}  // namespace qsdpa::detail::cpu
