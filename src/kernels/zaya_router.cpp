#include "kernels/zaya_router.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/error.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {
namespace {

// Column sums over the N rows of a [N, W] quantity that is never stored: row_work(i, partial)
// adds row i's contribution to partial [W] (and may also do per-row work of its own, such as
// writing input gradients for that row). Rows are cut into fixed chunks of kRowsPerChunk;
// each chunk sums into its own zeroed partial, and the partials are then added in chunk
// order. The chunking depends only on N, so the totals are bitwise the same for any thread
// count. Returns totals [W] (valid until the next call on this thread).
template <typename T, typename RowWork>
const T* sum_rows_fixed_chunks(int64_t n, int64_t width, bool parallel, RowWork&& row_work) {
  constexpr int64_t kRowsPerChunk = 32;
  constexpr int64_t kColumnBlock = 256;
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  thread_local detail::ScratchBuffer<T> buffer;
  T* partials = buffer.get(std::max<int64_t>((chunks + 1) * width, 1));
  T* totals = partials + chunks * width;

#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    T* partial = partials + chunk * width;
    std::fill(partial, partial + width, T(0));
    const int64_t row_end = std::min(n, (chunk + 1) * kRowsPerChunk);
    for (int64_t i = chunk * kRowsPerChunk; i < row_end; ++i) row_work(i, partial);
  }
  const int64_t column_blocks = (width + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (parallel && column_blocks > 1)
  for (int64_t blk = 0; blk < column_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(width, c0 + kColumnBlock);
    std::fill(totals + c0, totals + c1, T(0));
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const T* partial = partials + chunk * width;
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) totals[j] += partial[j];
    }
  }
  return totals;
}

bool is_parallel(int64_t elements) { return elements >= detail::kParallelMinElements; }

}  // namespace

// ---- bias ----------------------------------------------------------------------------------

template <typename T>
void bias_add_forward(T* y, const T* bias, int64_t n, int64_t m) {
#pragma omp parallel for schedule(static) if (is_parallel(n * m))
  for (int64_t i = 0; i < n; ++i) {
    T* row = y + i * m;
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) row[j] += bias[j];
  }
}

template <typename T>
void bias_add_backward(T* dbias, const T* dy, int64_t n, int64_t m) {
  const T* totals = sum_rows_fixed_chunks<T>(n, m, is_parallel(n * m), [&](int64_t i, T* acc) {
    const T* row = dy + i * m;
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) acc[j] += row[j];
  });
  for (int64_t j = 0; j < m; ++j) dbias[j] += totals[j];
}

// ---- GELU ----------------------------------------------------------------------------------

namespace {
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
}  // namespace

// Φ(x) = (1 + erf(x/√2)) / 2. Double: std::erf. Float: a branch-free form the compiler
// vectorizes (std::erf is a scalar library call, and the router evaluates it on 4·N·R values
// per sublayer and step): Abramowitz and Stegun 7.1.26, erfc(z) ≈ t·P(t)·e^{−z²} with
// t = 1/(1 + p·z) for z ≥ 0, absolute error below 1.5e-7 (float rounding is 6e-8), and e^{−z²}
// by range reduction to 2^k·e^r with a degree-6 polynomial for e^r.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // e^-87 ≈ 1.6e-38: the smallest normal float
  // k = x·log2(e) rounded to nearest by adding 1.5·2^23 (std::floor does not vectorize).
  const float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693145752f) - k * 1.42860677e-06f;  // ln 2 in two parts
  const float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f +
                  r * (0.00833333377f + r * 0.00138888892f)))));
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

template <typename T>
inline T normal_cdf(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float z = std::fabs(x) * static_cast<float>(kInvSqrt2);
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                       t * (-1.453152027f + t * 1.061405429f))));
    const float half_erfc = 0.5f * poly * exp_nonpositive(-z * z);  // Φ(−|x|)
    return x >= 0 ? 1.0f - half_erfc : half_erfc;
  } else {
    return T(0.5) * (T(1) + std::erf(x * static_cast<T>(kInvSqrt2)));
  }
}

template <typename T>
inline T normal_pdf(T x) {
  if constexpr (std::is_same_v<T, float>)
    return static_cast<float>(kInvSqrt2Pi) * exp_nonpositive(-0.5f * x * x);
  else
    return static_cast<T>(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
}

template <typename T>
void gelu_forward(T* out, const T* in, int64_t n, int64_t c) {
  const int64_t count = n * c;
#pragma omp parallel for simd schedule(static) if (is_parallel(count))
  for (int64_t i = 0; i < count; ++i) out[i] = in[i] * normal_cdf(in[i]);
}

template <typename T>
inline T gelu_derivative(T x) {
  return normal_cdf(x) + x * normal_pdf(x);
}

template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n, int64_t c) {
  const int64_t count = n * c;
#pragma omp parallel for simd schedule(static) if (is_parallel(count))
  for (int64_t i = 0; i < count; ++i) din[i] = dout[i] * gelu_derivative(in[i]);
}

template <typename T>
void gelu_bias_forward(T* g, T* a, const T* bias, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (is_parallel(n * c))
  for (int64_t i = 0; i < n; ++i) {
    T* x = a + i * c;
    T* out = g + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      const T xj = x[j] + bias[j], cdf = normal_cdf(xj);
      out[j] = xj * cdf;
      x[j] = cdf + xj * normal_pdf(xj);  // gelu_derivative(xj), Φ computed once
    }
  }
}

template <typename T>
void gelu_bias_backward(T* da, T* dbias, const T* dg, const T* derivative, int64_t n,
                        int64_t c) {
  // The rows and chunks of bias_add_backward, so dbias gets the same bits.
  const T* totals = sum_rows_fixed_chunks<T>(n, c, is_parallel(n * c), [&](int64_t i, T* acc) {
    const T* g = dg + i * c;
    const T* d = derivative + i * c;
    T* out = da + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      out[j] = g[j] * d[j];
      acc[j] += out[j];
    }
  });
  for (int64_t j = 0; j < c; ++j) dbias[j] += totals[j];
}

// ---- EDA -----------------------------------------------------------------------------------

template <typename T>
void eda_forward(T* r, const T* r_prev, const T* gamma, int64_t n, int64_t r_dim) {
#pragma omp parallel for schedule(static) if (is_parallel(n * r_dim))
  for (int64_t i = 0; i < n; ++i) {
    T* row = r + i * r_dim;
    const T* prev = r_prev + i * r_dim;
#pragma omp simd
    for (int64_t j = 0; j < r_dim; ++j) row[j] += gamma[j] * prev[j];
  }
}

template <typename T>
void eda_backward(T* dr_prev, T* dgamma, const T* dr, const T* r_prev, const T* gamma,
                  int64_t n, int64_t r_dim) {
  const T* totals =
      sum_rows_fixed_chunks<T>(n, r_dim, is_parallel(n * r_dim), [&](int64_t i, T* acc) {
        const T* g = dr + i * r_dim;
        const T* prev = r_prev + i * r_dim;
        T* dprev = dr_prev + i * r_dim;
#pragma omp simd
        for (int64_t j = 0; j < r_dim; ++j) {
          dprev[j] = gamma[j] * g[j];
          acc[j] += prev[j] * g[j];
        }
      });
  for (int64_t j = 0; j < r_dim; ++j) dgamma[j] += totals[j];
}

// ---- gating --------------------------------------------------------------------------------

template <typename T>
void zaya_gating_forward(T* probs, int32_t* choice, T* gate, const T* logits,
                         const T* balance_bias, BiasOn bias_on, int64_t n, int64_t e, int64_t k,
                         bool skip_class, bool skip_passes_input) {
  const int64_t classes = e + (skip_class ? 1 : 0);
  FOUNDRY_CHECK(e >= 1 && k >= 1 && k <= classes);
  FOUNDRY_CHECK(skip_class || !skip_passes_input);
#pragma omp parallel for schedule(static) if (is_parallel(n * classes))
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits + i * classes;
    T* p = probs + i * classes;
    detail::softmax_row(p, z, classes);
    const T* scores = bias_on == BiasOn::logits ? z : p;

    // Repeated arg-max of score + bias over the classes not yet chosen. Scanning in ascending
    // index with a strict '>' keeps the lower index on ties; starting from the first free
    // class keeps the choice a valid index even if a score is NaN.
    int32_t* idx = choice + i * k;
    T* w = gate + i * k;
    for (int64_t slot = 0; slot < k; ++slot) {
      int64_t best = -1;
      T best_score = 0;
      for (int64_t j = 0; j < classes; ++j) {
        if (std::find(idx, idx + slot, static_cast<int32_t>(j)) != idx + slot) continue;
        const T score = balance_bias ? scores[j] + balance_bias[j] : scores[j];
        if (best < 0 || score > best_score) {
          best = j;
          best_score = score;
        }
      }
      idx[slot] = static_cast<int32_t>(best);
      const bool zero_gate = skip_class && best == e && !skip_passes_input;
      w[slot] = zero_gate ? T(0) : p[best];
    }
  }
}

// Per token, dp is dgate placed at the chosen classes (a skip choice with the constant gate 0
// contributes nothing), so dz_j = p_j·(dp_j − <dp, p>) with <dp, p> = Σ_slots dgate·p[choice].
template <typename T>
void zaya_gating_backward(T* dlogits, const T* dgate, const T* probs, const int32_t* choice,
                          int64_t n, int64_t e, int64_t k, bool skip_class,
                          bool skip_passes_input) {
  const int64_t classes = e + (skip_class ? 1 : 0);
  FOUNDRY_CHECK(e >= 1 && k >= 1 && k <= classes);
  FOUNDRY_CHECK(skip_class || !skip_passes_input);
#pragma omp parallel for schedule(static) if (is_parallel(n * classes))
  for (int64_t i = 0; i < n; ++i) {
    const T* p = probs + i * classes;
    const int32_t* idx = choice + i * k;
    const T* dg = dgate + i * k;
    T* dz = dlogits + i * classes;
    T dot = 0;
    for (int64_t slot = 0; slot < k; ++slot) {
      if (skip_class && idx[slot] == e && !skip_passes_input) continue;
      dot += dg[slot] * p[idx[slot]];
    }
#pragma omp simd
    for (int64_t j = 0; j < classes; ++j) dz[j] = -p[j] * dot;
    for (int64_t slot = 0; slot < k; ++slot) {
      if (skip_class && idx[slot] == e && !skip_passes_input) continue;
      dz[idx[slot]] += p[idx[slot]] * dg[slot];
    }
  }
}

// ---- load statistics and the balancing bias --------------------------------------------------

void zaya_class_counts(int64_t* counts, const int32_t* choice, int64_t n, int64_t k,
                       int64_t classes) {
  std::fill(counts, counts + classes, int64_t{0});
  for (int64_t a = 0; a < n * k; ++a) {
    FOUNDRY_CHECK(choice[a] >= 0 && choice[a] < classes);
    ++counts[choice[a]];
  }
}

template <typename T>
void zaya_boundary_counts(int64_t* near, const T* probs, const T* logits, const T* balance_bias,
                          BiasOn bias_on, const int32_t* choice, int64_t n, int64_t classes,
                          int64_t k, double window) {
  FOUNDRY_CHECK(classes >= 1 && k >= 1 && k <= classes && window > 0);
  std::fill(near, near + classes, int64_t{0});
  if (k == classes) return;  // every class always chosen: no boundary to cross
  // Per token, nothing allocated: the biased scores are recomputed, and membership in the
  // choice is a scan of its K entries.
  for (int64_t i = 0; i < n; ++i) {
    const T* z = (bias_on == BiasOn::logits ? logits : probs) + i * classes;
    const int32_t* idx = choice + i * k;
    auto score = [&](int64_t j) {
      return static_cast<double>(z[j]) + (balance_bias ? balance_bias[j] : T(0));
    };
    auto chosen = [&](int64_t j) { return std::find(idx, idx + k, j) != idx + k; };
    double lowest_chosen = std::numeric_limits<double>::infinity();
    double best_unchosen = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < classes; ++j) {
      if (chosen(j))
        lowest_chosen = std::min(lowest_chosen, score(j));
      else
        best_unchosen = std::max(best_unchosen, score(j));
    }
    for (int64_t j = 0; j < classes; ++j) {
      const double gap = chosen(j) ? score(j) - best_unchosen : lowest_chosen - score(j);
      if (gap < window) ++near[j];
    }
  }
}

void zaya_load_error(double* err, const int64_t* counts, int64_t assignments, int64_t classes) {
  FOUNDRY_CHECK(assignments > 0 && classes > 0);
  const double uniform = 1.0 / static_cast<double>(classes);
  for (int64_t s = 0; s < classes; ++s)
    err[s] = static_cast<double>(counts[s]) / static_cast<double>(assignments) - uniform;
}

const char* balance_rule_name(BalanceRule rule) {
  switch (rule) {
    case BalanceRule::proportional: return "proportional";
    case BalanceRule::adamw: return "adamw";
    case BalanceRule::newton: return "newton";
    case BalanceRule::sign_adaptive: break;
  }
  return "sign_adaptive";
}

ZayaBalancer::ZayaBalancer(int64_t experts, bool skip_class, const ZayaBalancerOptions& opts)
    : options(opts) {
  if (experts < 1) fail(fmt::format("the router needs at least one expert, got {}", experts));
  if (!(opts.lr >= 0) || !(opts.beta1 >= 0 && opts.beta1 < 1) ||
      !(opts.beta2 >= 0 && opts.beta2 < 1) || !(opts.eps >= 0))
    fail(fmt::format("balancing-bias optimizer: lr = {}, betas = ({}, {}), eps = {} out of range",
                     opts.lr, opts.beta1, opts.beta2, opts.eps),
         "use lr >= 0, betas in [0, 1) and eps >= 0");
  if (!(opts.step_min > 0 && opts.step_min <= opts.step_max) || !(opts.increase >= 1) ||
      !(opts.decrease > 0 && opts.decrease <= 1))
    fail(fmt::format("balancing-bias steps: min {}, max {}, increase {}, decrease {} out of range",
                     opts.step_min, opts.step_max, opts.increase, opts.decrease),
         "use 0 < step_min <= step_max, increase >= 1 and 0 < decrease <= 1");
  if (!(opts.window > 0) || !(opts.gain_max > 0))
    fail(fmt::format("newton balancing: window {} and gain_max {} must be positive",
                     opts.window, opts.gain_max));
  const int64_t classes = experts + (skip_class ? 1 : 0);
  bias.assign(classes, 0.0f);
  if (skip_class) bias[experts] = opts.skip_bias_init;
  if (opts.rule == BalanceRule::adamw) {
    exp_avg.assign(classes, 0.0f);
    exp_avg_sq.assign(classes, 0.0f);
  } else if (opts.rule == BalanceRule::sign_adaptive) {
    const double initial = std::clamp(opts.lr, opts.step_min, opts.step_max);
    step_size.assign(classes, static_cast<float>(initial));
    last_sign.assign(classes, 0.0f);
  }
}

namespace {

// A balancer's rule state vectors by checkpoint name, the one place that says which they are
// (const or mutable with the balancer).
template <typename Balancer>
auto rule_vectors(Balancer& b) -> std::vector<std::pair<const char*, decltype(&b.bias)>> {
  switch (b.options.rule) {
    case BalanceRule::proportional:
    case BalanceRule::newton: return {};
    case BalanceRule::adamw: return {{"exp_avg", &b.exp_avg}, {"exp_avg_sq", &b.exp_avg_sq}};
    case BalanceRule::sign_adaptive: break;
  }
  return {{"step_size", &b.step_size}, {"last_sign", &b.last_sign}};
}

}  // namespace

std::vector<const char*> ZayaBalancer::rule_state_names() const {
  std::vector<const char*> names;
  for (const auto& v : rule_vectors(*this)) names.push_back(v.first);
  return names;
}

std::vector<const std::vector<float>*> ZayaBalancer::rule_state() const {
  std::vector<const std::vector<float>*> state;
  for (const auto& v : rule_vectors(*this)) state.push_back(v.second);
  return state;
}

void ZayaBalancer::update(const int64_t* counts, int64_t assignments, const int64_t* near) {
  std::vector<double> err(classes());
  zaya_load_error(err.data(), counts, assignments, classes());
  if (options.rule != BalanceRule::newton) return update_from_error(err.data());
  if (!near)
    fail("the newton balancing rule needs the boundary counts of the tokens",
         "pass them to update() (ops::zaya_boundary_counts)");
  ++step;
  newton_update(err.data(), near, assignments);
}

void ZayaBalancer::update_from_error(const double* err) {
  ++step;
  switch (options.rule) {
    case BalanceRule::newton:
      fail("the newton balancing rule needs the boundary counts of the tokens",
           "call update() with them");
    case BalanceRule::proportional: return proportional_update(err);
    case BalanceRule::adamw: return adamw_update(err);
    case BalanceRule::sign_adaptive: return sign_adaptive_update(err);
  }
}

void ZayaBalancer::proportional_update(const double* err) {
  for (int64_t s = 0; s < classes(); ++s)
    bias[s] = static_cast<float>(bias[s] - options.lr * err[s]);
}

void ZayaBalancer::newton_update(const double* err, const int64_t* near, int64_t assignments) {
  const double floor = options.lr / options.gain_max;
  for (int64_t s = 0; s < classes(); ++s) {
    const double slope = static_cast<double>(near[s]) /
                         (2.0 * options.window * static_cast<double>(assignments));
    bias[s] = static_cast<float>(bias[s] - options.lr / std::max(slope, floor) * err[s]);
  }
}

void ZayaBalancer::adamw_update(const double* err) {
  const double t = static_cast<double>(step);
  const double correction1 = 1.0 - std::pow(options.beta1, t);
  const double sqrt_correction2 = std::sqrt(1.0 - std::pow(options.beta2, t));
  const double step_size_now = options.lr / correction1;
  for (int64_t s = 0; s < classes(); ++s) {
    const double m = options.beta1 * exp_avg[s] + (1.0 - options.beta1) * err[s];
    const double v = options.beta2 * exp_avg_sq[s] + (1.0 - options.beta2) * err[s] * err[s];
    exp_avg[s] = static_cast<float>(m);
    exp_avg_sq[s] = static_cast<float>(v);
    bias[s] = static_cast<float>(bias[s] - step_size_now * m / (std::sqrt(v) / sqrt_correction2 +
                                                                 options.eps));
  }
}

void ZayaBalancer::sign_adaptive_update(const double* err) {
  for (int64_t s = 0; s < classes(); ++s) {
    const double sign = (err[s] > 0) - (err[s] < 0);
    const double agreement = sign * last_sign[s];
    double size = step_size[s];
    if (agreement < 0) {  // the error changed sign: the last move overshot
      step_size[s] = static_cast<float>(std::max(size * options.decrease, options.step_min));
      last_sign[s] = 0.0f;
      continue;
    }
    if (agreement > 0) size = std::min(size * options.increase, options.step_max);
    step_size[s] = static_cast<float>(size);
    bias[s] = static_cast<float>(bias[s] - sign * size);
    last_sign[s] = static_cast<float>(sign);
  }
}

void ZayaBalancer::load_state(std::vector<float> bias_in, std::vector<std::vector<float>> rule_in,
                              int64_t step_in) {
  const size_t classes_here = bias.size();
  const std::vector<const char*> names = rule_state_names();
  if (rule_in.size() != names.size())
    fail(fmt::format("balancing-bias state has {} vectors for the {} rule, which keeps {}",
                     rule_in.size(), balance_rule_name(options.rule), names.size()),
         "the checkpoint was written under another balance rule");
  std::string sizes = fmt::format("bias {}", bias_in.size());
  bool sizes_ok = bias_in.size() == classes_here;
  for (size_t i = 0; i < names.size(); ++i) {
    sizes += fmt::format(", {} {}", names[i], rule_in[i].size());
    sizes_ok = sizes_ok && rule_in[i].size() == classes_here;
  }
  if (!sizes_ok)
    fail(fmt::format("balancing-bias state has sizes {}; this router has {} classes", sizes,
                     classes_here),
         "the checkpoint was written for a different number of experts or skip setting");
  if (step_in < 0) fail(fmt::format("balancing-bias step count {} is negative", step_in));
  auto all = [](const std::vector<float>& v, auto&& ok) {
    return std::all_of(v.begin(), v.end(), ok);
  };
  auto finite = [](float x) { return std::isfinite(x); };
  bool rule_ok = true;
  if (options.rule == BalanceRule::adamw)
    rule_ok = all(rule_in[0], finite) &&
              all(rule_in[1], [](float x) { return std::isfinite(x) && x >= 0; });
  else if (options.rule == BalanceRule::sign_adaptive)
    rule_ok = all(rule_in[0], [](float x) { return std::isfinite(x) && x > 0; }) &&
              all(rule_in[1], [](float x) { return x == -1.0f || x == 0.0f || x == 1.0f; });
  if (!all(bias_in, finite) || !rule_ok)
    fail(fmt::format("balancing-bias state holds values its {} rule cannot hold (non-finite, a "
                     "negative second moment or step size, a sign outside {{-1, 0, 1}})",
                     balance_rule_name(options.rule)),
         "the checkpoint is corrupt; resume from an earlier one");
  bias = std::move(bias_in);
  const auto targets = rule_vectors(*this);
  for (size_t i = 0; i < targets.size(); ++i) *targets[i].second = std::move(rule_in[i]);
  step = step_in;
}

// ---- residual scaling ------------------------------------------------------------------------

template <typename T>
void residual_scale_forward(T* out, const T* res, const T* h, const T* alpha_res,
                            const T* beta_res, const T* alpha_h, const T* beta_h, int64_t n,
                            int64_t c) {
#pragma omp parallel for schedule(static) if (is_parallel(n * c))
  for (int64_t i = 0; i < n; ++i) {
    const T* r = res + i * c;
    const T* x = h + i * c;
    T* y = out + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j)
      y[j] = (r[j] + beta_res[j]) * alpha_res[j] + (x[j] + beta_h[j]) * alpha_h[j];
  }
}

// One pass over the rows: the input gradients row by row, and three column sums
// [Σ dout | Σ (res + β_res)·dout | Σ (h + β_h)·dout] from which the four parameter
// gradients follow (dβ = α ⊙ Σ dout).
namespace {

// out [c] = scale ⊙ x, stored as T or rounded to bf16.
template <typename T>
inline void scaled_row(T* out, const T* scale, const T* x, int64_t c) {
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) out[j] = scale[j] * x[j];
}
inline void scaled_row(bf16* out, const float* scale, const float* x, int64_t c) {
  constexpr int64_t kBlock = 64;
  float block[kBlock];
  for (int64_t j0 = 0; j0 < c; j0 += kBlock) {
    const int64_t len = std::min(kBlock, c - j0);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) block[j] = scale[j0 + j] * x[j0 + j];
    to_bf16_serial(block, out + j0, len);
  }
}

// One pass over the rows: dres (unless null) and dh row by row, and three column sums
// [Σ dout | Σ (res + β_res)·dout | Σ (h + β_h)·dout] from which the four parameter
// gradients follow (dβ = α ⊙ Σ dout).
template <typename T, typename DH>
void residual_scale_backward_rows(T* dres, DH* dh, T* dalpha_res, T* dbeta_res, T* dalpha_h,
                                  T* dbeta_h, const T* dout, const T* res, const T* h,
                                  const T* alpha_res, const T* beta_res, const T* alpha_h,
                                  const T* beta_h, int64_t n, int64_t c) {
  const T* totals =
      sum_rows_fixed_chunks<T>(n, 3 * c, is_parallel(n * c), [&](int64_t i, T* acc) {
        const T* g = dout + i * c;
        const T* r = res + i * c;
        const T* x = h + i * c;
        T* sum_g = acc;
        T* sum_rg = acc + c;
        T* sum_hg = acc + 2 * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          sum_g[j] += g[j];
          sum_rg[j] += (r[j] + beta_res[j]) * g[j];
          sum_hg[j] += (x[j] + beta_h[j]) * g[j];
        }
        if (dres) scaled_row(dres + i * c, alpha_res, g, c);
        scaled_row(dh + i * c, alpha_h, g, c);
      });
  for (int64_t j = 0; j < c; ++j) {
    dbeta_res[j] += alpha_res[j] * totals[j];
    dalpha_res[j] += totals[c + j];
    dalpha_h[j] += totals[2 * c + j];
    dbeta_h[j] += alpha_h[j] * totals[j];
  }
}

}  // namespace

template <typename T>
void residual_scale_backward(T* dres, T* dh, T* dalpha_res, T* dbeta_res, T* dalpha_h,
                             T* dbeta_h, const T* dout, const T* res, const T* h,
                             const T* alpha_res, const T* beta_res, const T* alpha_h,
                             const T* beta_h, int64_t n, int64_t c) {
  residual_scale_backward_rows(dres, dh, dalpha_res, dbeta_res, dalpha_h, dbeta_h, dout, res, h,
                               alpha_res, beta_res, alpha_h, beta_h, n, c);
}

template <typename T, typename DH>
void residual_scale_backward_params(DH* dh, T* dalpha_res, T* dbeta_res, T* dalpha_h,
                                    T* dbeta_h, const T* dout, const T* res, const T* h,
                                    const T* alpha_res, const T* beta_res, const T* alpha_h,
                                    const T* beta_h, int64_t n, int64_t c) {
  residual_scale_backward_rows<T, DH>(nullptr, dh, dalpha_res, dbeta_res, dalpha_h, dbeta_h,
                                      dout, res, h, alpha_res, beta_res, alpha_h, beta_h, n, c);
}

void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                         int64_t n, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = (x[i * c + j] + beta[j]) * alpha[j];
}

// Each thread owns a block of channels and walks the tokens in order (rows stay contiguous in
// memory), so every sum has a fixed order whatever the thread count.
void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                          const float* x, const float* alpha, const float* beta, int64_t n,
                          int64_t c) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < c; j0 += kBlock) {
    const int64_t j1 = std::min(c, j0 + kBlock);
    double sa[kBlock] = {}, sb[kBlock] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* g = dout + i * c;
      const float* xi = x + i * c;
      float* dxi = dx + i * c;
      for (int64_t j = j0; j < j1; ++j) {
        sa[j - j0] += static_cast<double>((xi[j] + beta[j]) * g[j]);
        sb[j - j0] += g[j];
        dxi[j] = alpha[j] * g[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dalpha[j] += static_cast<float>(sa[j - j0]);
      dbeta[j] += static_cast<float>(alpha[j] * sb[j - j0]);
    }
  }
}

#define FOUNDRY_INSTANTIATE(T)                                                                 \
  template void bias_add_forward<T>(T*, const T*, int64_t, int64_t);                           \
  template void bias_add_backward<T>(T*, const T*, int64_t, int64_t);                          \
  template void gelu_forward<T>(T*, const T*, int64_t, int64_t);                               \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, int64_t);                    \
  template void gelu_bias_forward<T>(T*, T*, const T*, int64_t, int64_t);                      \
  template void gelu_bias_backward<T>(T*, T*, const T*, const T*, int64_t, int64_t);           \
  template void eda_forward<T>(T*, const T*, const T*, int64_t, int64_t);                      \
  template void eda_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t);       \
  template void zaya_gating_forward<T>(T*, int32_t*, T*, const T*, const T*, BiasOn, int64_t,  \
                                       int64_t, int64_t, bool, bool);                          \
  template void zaya_gating_backward<T>(T*, const T*, const T*, const int32_t*, int64_t,       \
                                        int64_t, int64_t, bool, bool);                         \
  template void zaya_boundary_counts<T>(int64_t*, const T*, const T*, const T*, BiasOn,       \
                                        const int32_t*, int64_t, int64_t, int64_t, double);    \
  template void residual_scale_forward<T>(T*, const T*, const T*, const T*, const T*,          \
                                          const T*, const T*, int64_t, int64_t);               \
  template void residual_scale_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*,         \
                                           const T*, const T*, const T*, const T*, const T*,   \
                                           int64_t, int64_t);                                  \
  template void residual_scale_backward_params<T, T>(T*, T*, T*, T*, T*, const T*, const T*,   \
                                                     const T*, const T*, const T*, const T*,   \
                                                     const T*, int64_t, int64_t);
FOUNDRY_INSTANTIATE(float)
FOUNDRY_INSTANTIATE(double)
#undef FOUNDRY_INSTANTIATE
template void residual_scale_backward_params<float, bf16>(bf16*, float*, float*, float*, float*,
                                                          const float*, const float*,
                                                          const float*, const float*,
                                                          const float*, const float*,
                                                          const float*, int64_t, int64_t);

}  // namespace foundry::ops
