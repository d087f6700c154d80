// Helpers for the kernel tests: random inputs, central finite differences, error norms.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include <omp.h>

#include "base/rng.h"

namespace foundry::testing {

// Sets the OpenMP thread count for a scope.
class WithThreads {
 public:
  explicit WithThreads(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~WithThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

template <typename T = double>
std::vector<T> random_normal(int64_t count, uint64_t seed, double stddev = 1.0) {
  Rng rng(seed);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(stddev * rng.normal());
  return v;
}

template <typename To, typename From>
std::vector<To> cast_vector(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d f / d x by central differences; x is restored afterwards.
inline std::vector<double> numeric_gradient(std::vector<double>& x,
                                            const std::function<double()>& f,
                                            double step = 1e-5) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double up = f();
    x[i] = saved - step;
    const double down = f();
    x[i] = saved;
    grad[i] = (up - down) / (2 * step);
  }
  return grad;
}

// max |a − b| / max |b|: the error relative to the scale of the expected values.
template <typename A, typename B>
double max_relative_error(const std::vector<A>& actual, const std::vector<B>& expected) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_err = std::max(max_err, std::abs(static_cast<double>(actual[i]) - expected[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(expected[i])));
  }
  return max_err / std::max(max_ref, 1e-300);
}

// ‖a − b‖₂ / ‖b‖₂.
template <typename A, typename B>
double norm_relative_error(const std::vector<A>& actual, const std::vector<B>& expected) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff = static_cast<double>(actual[i]) - static_cast<double>(expected[i]);
    err += diff * diff;
    ref += static_cast<double>(expected[i]) * static_cast<double>(expected[i]);
  }
  return std::sqrt(err) / std::max(std::sqrt(ref), 1e-300);
}

}  // namespace foundry::testing
