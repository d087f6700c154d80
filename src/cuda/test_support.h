// Helpers for the GPU tests: random inputs, device copies of host vectors and back, outputs
// poisoned with NaN, and the comparison every kernel test makes against the CPU.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/rng.h"
#include "cuda/runtime.h"

namespace foundry::gpu::testing {

// Skips the test where no GPU is visible; otherwise makes GPU 0 current.
#define SKIP_WITHOUT_GPU()                                                     \
  if (::foundry::gpu::visible_gpus() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
  ::foundry::gpu::open_gpu(0, "test")

inline std::vector<float> randn(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(std::max<int64_t>(1, static_cast<int64_t>(v.size() * sizeof(T))));
  if (!v.empty()) b.upload(v.data(), static_cast<int64_t>(v.size() * sizeof(T)));
  return b;
}

// `bytes` of device memory, every byte 0xFF (NaN in fp32 and bf16): an element a kernel
// should write but does not fails the comparison.
inline DeviceBuffer poisoned(int64_t bytes) {
  DeviceBuffer b(std::max<int64_t>(bytes, 4));
  b.fill_bytes(0xFF);
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, int64_t n) {
  std::vector<T> v(n);
  b.download(v.data(), n * static_cast<int64_t>(sizeof(T)));
  return v;
}

// The root mean square of v: the typical size of its elements. Where an element is a
// difference of larger terms (a gradient through a softmax, a sum of signed products), its
// rounding error scales with those terms, not with the element: tolerances use rms as scale.
inline double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// |gpu − cpu| ≤ rel·(|cpu| + scale) elementwise (NaN fails), the first mismatches reported.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                         double scale, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < cpu.size() && bad < 5; ++i)
    if (!(std::abs(gpu[i] - cpu[i]) <= rel * (std::abs(cpu[i]) + scale))) {
      ADD_FAILURE() << what << "[" << i << "]: GPU " << gpu[i] << ", CPU " << cpu[i];
      ++bad;
    }
}

}  // namespace foundry::gpu::testing
