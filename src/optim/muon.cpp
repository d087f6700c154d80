#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "kernels/gemm.h"
#include "model/info.h"

namespace foundry {

namespace {

// Quintic Newton–Schulz coefficients: a steep slope at 0 (a) pulls small singular values up
// fast; the fixed point is traded away, so values settle in about [0.68, 1.2].
constexpr float kNsA = 3.4445f;
constexpr float kNsB = -4.7750f;
constexpr float kNsC = 2.0315f;

// Elementwise loops below this size run on one thread: forking costs more than it saves on
// the small matrices (each element's result is the same either way).
constexpr int64_t kParallelElements = 1 << 15;

// Blocks of the Frobenius-norm sum: fixed, so the sum's order never depends on threads.
constexpr int64_t kNormBlockElements = 8192;

double frobenius_norm(const float* x, int64_t n, std::vector<double>& block_sums) {
  const int64_t blocks = (n + kNormBlockElements - 1) / kNormBlockElements;
  block_sums.assign(blocks, 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kNormBlockElements);
    double sum = 0;
    for (int64_t i = b * kNormBlockElements; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
    block_sums[b] = sum;
  }
  double total = 0;
  for (double s : block_sums) total += s;
  return std::sqrt(total);
}

}  // namespace

bool muon_applies(const ParamInfo& info) {
  // See the header for why the embedding (tied LM head), norms and the router stay with
  // AdamW.
  return is_muon_matrix(info);
}

std::string optimizer_for(const ParamInfo& info, bool muon_enabled) {
  return optimizer_name(muon_enabled && muon_applies(info) ? OptimizerKind::muon
                                                           : OptimizerKind::adamw);
}

void NewtonSchulz::run(const float* g, float* out, int64_t rows, int64_t cols, int steps,
                       bool use_bf16) {
  FOUNDRY_CHECK(rows > 0 && cols > 0 && steps >= 0);
  const int64_t n = rows * cols;
  // Work on the Gram matrix of the short side: r × r with r = min(rows, cols).
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows;
  const DType dtype = use_bf16 ? DType::bf16 : DType::f32;

  const float inv_norm = static_cast<float>(1.0 / (frobenius_norm(g, n, block_sums_) + 1e-7));
  y_.resize(n);
  a_.resize(r * r);
  b_.resize(r * r);
  if (use_bf16) {
    x16_.resize(n);
    a16_.resize(r * r);
    b16_.resize(r * r);
  }
  // X lives in `out` and in y_ by turns; `out` may alias g, which is read only here.
  float* x = out;
  float* y = y_.data();
  float* a = a_.data();
  float* b = b_.data();
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) x[i] = g[i] * inv_norm;

  for (int s = 0; s < steps; ++s) {
    const void* x_in = x;
    if (use_bf16) {
      convert_to_bf16(x, x16_.data(), n);
      x_in = x16_.data();
    }
    // A = X Xᵀ (wide) or Xᵀ X (tall).
    if (tall)
      gemm(x_in, true, x_in, false, a, r, r, rows, dtype);
    else
      gemm(x_in, false, x_in, true, a, r, r, cols, dtype);

    // B = b A + c A·A.
    const void* a_in = a;
    if (use_bf16) {
      convert_to_bf16(a, a16_.data(), r * r);
      a_in = a16_.data();
    }
    gemm(a_in, false, a_in, false, b, r, r, r, dtype);
#pragma omp parallel for simd schedule(static) if (r * r >= kParallelElements)
    for (int64_t i = 0; i < r * r; ++i) b[i] = kNsB * a[i] + kNsC * b[i];

    // Y = a X + B X (wide) or a X + X B (tall; B is symmetric, so this is the wide step
    // on Xᵀ, transposed back).
    const void* b_in = b;
    if (use_bf16) {
      convert_to_bf16(b, b16_.data(), r * r);
      b_in = b16_.data();
    }
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) y[i] = kNsA * x[i];
    if (tall)
      gemm(x_in, false, b_in, false, y, rows, cols, cols, dtype, /*accumulate=*/true);
    else
      gemm(b_in, false, x_in, false, y, rows, cols, rows, dtype, /*accumulate=*/true);
    std::swap(x, y);
  }
  if (x != out) std::memcpy(out, x, sizeof(float) * n);
}

void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int steps,
                   bool use_bf16) {
  NewtonSchulz ns;
  ns.run(g, out, rows, cols, steps, use_bf16);
}

Muon::Muon(const ParamTable& table, const MuonOptions& options)
    : options_(options), momentum_(static_cast<size_t>(table.total_elements())) {
  if (!(options.momentum >= 0 && options.momentum < 1))
    fail(fmt::format("Muon momentum {} must lie in [0, 1)", options.momentum),
         "0.95 is the usual value");
  if (options.ns_steps < 1 || options.ns_steps > 100)
    fail(fmt::format("Muon ns_steps = {} must lie in [1, 100]", options.ns_steps),
         "5 Newton–Schulz steps is the usual choice");
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay))
    fail(fmt::format("Muon weight_decay = {} must be finite and non-negative",
                     options.weight_decay));
  if (!(options.rms_scale > 0) || !std::isfinite(options.rms_scale))
    fail(fmt::format("Muon rms_scale = {} must be finite and positive", options.rms_scale),
         "0.2 matches the RMS of a typical AdamW update");
  int64_t largest = 0;
  for (const ParamInfo& info : table.params()) {
    if (!muon_applies(info) || info.numel == 0) continue;
    tensors_.push_back(info);
    largest = std::max(largest, info.numel);
  }
  update_.resize(largest);
}

void muon_momentum(float* u, float* __restrict buf, const float* g, int64_t n, float mu,
                   bool nesterov, float grad_scale) {
  // A clipped gradient is stored (rounded) before the momentum arithmetic reads it, as a
  // scaled slab would be: a fused multiply-add must not absorb the scaling.
  const float* gs = g;
  if (grad_scale != 1.0f) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) u[i] = g[i] * grad_scale;
    gs = u;
  }
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gs[i];
    const float b = mu * buf[i] + gi;
    buf[i] = b;
    u[i] = nesterov ? gi + mu * b : b;
  }
}

void muon_apply(float* __restrict w, const float* __restrict u, int64_t n, float keep,
                float step_size, bf16* w16) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] * keep - step_size * u[i];
  if (w16) convert_to_bf16(w, w16, n);
}

void Muon::step(float* params, const float* grads, double lr, int64_t step,
                const StepFusion& fusion) {
  if (step < 1) fail(fmt::format("Muon step number {} must be >= 1 (steps are 1-based)", step));
  float* u = update_.data();
  // One tensor at a time: the GEMMs inside Newton–Schulz use every thread through oneDNN.
  for (const ParamInfo& t : tensors_) {
    const int64_t rows = t.shape[0], cols = t.shape[1], n = t.numel;
    muon_momentum(u, momentum_.data() + t.offset, grads + t.offset, n,
                  static_cast<float>(options_.momentum), options_.nesterov, fusion.grad_scale);
    newton_schulz_.run(u, u, rows, cols, options_.ns_steps, options_.bf16_newton_schulz);
    const float keep = t.weight_decay ? static_cast<float>(1.0 - lr * options_.weight_decay) : 1.0f;
    const float step_size = static_cast<float>(
        lr * options_.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols))));
    muon_apply(params + t.offset, u, n, keep, step_size,
               fusion.weights_bf16 ? fusion.weights_bf16 + t.offset : nullptr);
  }
}

const std::vector<std::string>& Muon::state_names() {
  static const std::vector<std::string> names = {"muon_momentum"};
  return names;
}

std::span<float> Muon::state(std::string_view name) {
  if (name == "muon_momentum") return momentum_;
  fail(fmt::format("Muon has no state named '{}'", name), "the state is muon_momentum");
}

std::span<const float> Muon::state(std::string_view name) const {
  return const_cast<Muon*>(this)->state(name);
}

void Muon::reset() { std::fill(momentum_.begin(), momentum_.end(), 0.0f); }

}  // namespace foundry
