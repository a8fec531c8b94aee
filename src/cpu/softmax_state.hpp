// The online-softmax state of one query row over the keys it has seen so far (SPEC section 3):
//
//   m    = the largest logit seen,
//   l    = sum_t exp(x_t - m),
//   o[d] = sum_t exp(x_t - m) * v[t, d]   (D floats, owned by the caller).
//
// A row that has seen no visible key has m = -inf, l = 0 and o = 0. Two states over disjoint
// sets of keys combine with merge(), so the keys of one row can be split across threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace qsdpa::detail::cpu {

struct SoftmaxState {
  float m;
  float l;
  float* o;

  static constexpr float neg_inf = -std::numeric_limits<float>::infinity();

  bool empty() const { return m == neg_inf; }

  void reset(int64_t D) {
    m = neg_inf;
    l = 0.0f;
    std::fill(o, o + D, 0.0f);
  }

  // Raises the running maximum to m_new (>= m), rescaling l and o to it.
  void raise_max(float m_new, int64_t D) {
    if (!(m_new > m)) return;  // unchanged (or NaN, which then reaches l through the weights)
    if (!empty()) {
      const float a = std::exp(m - m_new);
      l *= a;
      for (int64_t d = 0; d < D; ++d) o[d] *= a;
    }
    m = m_new;
  }

  // Folds in the state of the same row over another, disjoint, set of keys.
  void merge(const SoftmaxState& other, int64_t D) {
    if (other.empty()) return;
    if (empty()) {
      m = other.m;
      l = other.l;
      std::copy(other.o, other.o + D, o);
      return;
    }
    const float mn = std::max(m, other.m);
    const float a = std::exp(m - mn), b = std::exp(other.m - mn);
    l = l * a + other.l * b;
    for (int64_t d = 0; d < D; ++d) o[d] = o[d] * a + other.o[d] * b;
    m = mn;
  }

  // The factor that turns o into the output row: 1 / (l + exp(sink - m)) in the frame of the
  // larger of m and the sink (the sink being one extra logit whose value vector is zero).
  // A row with no visible key gives 0 (an all-zero output), with or without a sink.
  float out_factor(bool has_sink, float sink) const {
    if (empty()) return 0.0f;
    if (!has_sink) return 1.0f / l;
    const float mn = std::max(m, sink);
    const float a = std::exp(m - mn);
    return a / (l * a + std::exp(sink - mn));
  }
};

}  // namespace qsdpa::detail::cpu
