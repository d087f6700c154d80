#include <algorithm>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"
#include "kernels/ops.h"

namespace foundry::ops {
std::vector<int64_t> expert_counts(const int32_t* topk_idx, int64_t n, int64_t e, int64_t k) {
  std::vector<int64_t> counts(e, 0);
  for (int64_t a = 0; a < n * k; ++a) {
    FOUNDRY_CHECK(topk_idx[a] >= 0 && topk_idx[a] < e);
    ++counts[topk_idx[a]];
  }
  return counts;
}

namespace {

// The shares f_e of the N*K assignments (E values).
std::vector<double> expert_fractions(const int32_t* topk_idx, int64_t n, int64_t e, int64_t k) {
  const std::vector<int64_t> counts = expert_counts(topk_idx, n, e, k);
  std::vector<double> f(e);
  for (int64_t j = 0; j < e; ++j)
    f[j] = static_cast<double>(counts[j]) / static_cast<double>(n * k);
  return f;
}

}  // namespace

template <typename T>
void router_forward(T* probs, int32_t* topk_idx, T* topk_w, const T* logits, int64_t n,
                    int64_t e, int64_t k, bool renormalize) {
  FOUNDRY_CHECK(k >= 1 && k <= e);
#pragma omp parallel for schedule(static) if (n * e >= detail::kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits + i * e;
    T* p = probs + i * e;
    detail::softmax_row(p, z, e);

    // Selection by repeated arg-max; strict '>' in ascending id order keeps the lower id on ties.
    int32_t* idx = topk_idx + i * k;
    T* w = topk_w + i * k;
    T selected_sum = 0;
    for (int64_t slot = 0; slot < k; ++slot) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j) {
        if (std::find(idx, idx + slot, static_cast<int32_t>(j)) != idx + slot) continue;
        if (best < 0 || p[j] > p[best]) best = j;
      }
      idx[slot] = static_cast<int32_t>(best);
      w[slot] = p[best];
      selected_sum += p[best];
    }
    if (renormalize)
      for (int64_t slot = 0; slot < k; ++slot) w[slot] /= selected_sum;
  }
}

template <typename T>
T router_aux_loss(const T* probs, const int32_t* topk_idx, int64_t n, int64_t e, int64_t k,
                  const double* fractions) {
  std::vector<double> local;
  if (!fractions) {
    local = expert_fractions(topk_idx, n, e, k);
    fractions = local.data();
  }
  // Column sums of probs in double, over fixed row chunks summed in chunk order.
  constexpr int64_t kRowsPerChunk = 256;
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<double> partials(chunks * e, 0.0);
#pragma omp parallel for schedule(static) if (n * e >= detail::kParallelMinElements)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    double* col = partials.data() + chunk * e;
    const int64_t row_end = std::min(n, (chunk + 1) * kRowsPerChunk);
    for (int64_t i = chunk * kRowsPerChunk; i < row_end; ++i)
      for (int64_t j = 0; j < e; ++j) col[j] += probs[i * e + j];
  }
  double aux = 0;
  for (int64_t j = 0; j < e; ++j) {
    double prob_sum = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) prob_sum += partials[chunk * e + j];
    aux += fractions[j] * prob_sum / static_cast<double>(n);
  }
  return static_cast<T>(static_cast<double>(e) * aux);
}

// Per token, the gradient reaches the probabilities from two places:
//   top-k weights: w_j = p_{i_j} / S (S = Σ_j p_{i_j} when renormalizing, else S = 1), so
//     dp_{i_j} += (dw_j − Σ_l dw_l·w_l) / S   (just dw_j without renormalization);
//   aux loss: d(aux_coef·aux)/dp_e = aux_coef·E·f_e / N for every token.
// Then the softmax: dz = p ∘ (dp − <dp, p>).
template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const int32_t* topk_idx,
                     const T* topk_w, int64_t n, int64_t e, int64_t k, bool renormalize,
                     T aux_coef, const double* fractions) {
  std::vector<T> aux_grad(e, T(0));
  if (aux_coef != T(0)) {
    std::vector<double> local;
    if (!fractions) {
      local = expert_fractions(topk_idx, n, e, k);
      fractions = local.data();
    }
    for (int64_t j = 0; j < e; ++j)
      aux_grad[j] = static_cast<T>(static_cast<double>(aux_coef) * static_cast<double>(e) *
                                   fractions[j] / static_cast<double>(n));
  }
#pragma omp parallel if (n * e >= detail::kParallelMinElements)
  {
    std::vector<T> dprobs(e);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T* p = probs + i * e;
      const int32_t* idx = topk_idx + i * k;
      const T* w = topk_w + i * k;
      const T* dw = dtopk_w + i * k;
      std::copy(aux_grad.begin(), aux_grad.end(), dprobs.begin());
      if (renormalize) {
        T selected_sum = 0, dw_dot_w = 0;
        for (int64_t slot = 0; slot < k; ++slot) {
          selected_sum += p[idx[slot]];
          dw_dot_w += dw[slot] * w[slot];
        }
        for (int64_t slot = 0; slot < k; ++slot)
          dprobs[idx[slot]] += (dw[slot] - dw_dot_w) / selected_sum;
      } else {
        for (int64_t slot = 0; slot < k; ++slot) dprobs[idx[slot]] += dw[slot];
      }
      T dot = 0;
      for (int64_t j = 0; j < e; ++j) dot += dprobs[j] * p[j];
      T* dz = dlogits + i * e;
      for (int64_t j = 0; j < e; ++j) dz[j] = p[j] * (dprobs[j] - dot);
    }
  }
}

#define FOUNDRY_INSTANTIATE(T)                                                                 \
  template void router_forward<T>(T*, int32_t*, T*, const T*, int64_t, int64_t, int64_t, bool); \
  template T router_aux_loss<T>(const T*, const int32_t*, int64_t, int64_t, int64_t,          \
                                const double*);                                                \
  template void router_backward<T>(T*, const T*, const T*, const int32_t*, const T*, int64_t,  \
                                   int64_t, int64_t, bool, T, const double*);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE

}  // namespace foundry::ops
