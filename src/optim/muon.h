// Muon (MomentUm Orthogonalized by Newton–Schulz) for the 2-D hidden matrices of the model,
// to be combined with AdamW for every other tensor (AdamWOptions::applies = !muon_applies).
//
// For each Muon tensor W (rows × cols) with gradient g, momentum buffer buf, step lr:
//   buf = momentum * buf + g
//   u   = nesterov ? g + momentum * buf : buf
//   O   = NewtonSchulz(u)                       (≈ the orthogonal factor U Vᵀ of u = U S Vᵀ)
//   W   = W * (1 - lr * weight_decay) - lr * rms_scale * sqrt(max(rows, cols)) * O
//
// RMS matching: O has (nearly) unit singular values, so for rows ≤ cols it has ‖O‖_F² ≈ rows
// and an element RMS of sqrt(rows / (rows * cols)) = 1 / sqrt(max(rows, cols)). Multiplying
// by sqrt(max(rows, cols)) brings the RMS to 1 whatever the shape, and rms_scale = 0.2 sets
// it to the typical RMS of an AdamW update. Muon and AdamW can therefore share one learning
// rate, one schedule and one weight-decay coefficient.
//
// Which tensors (muon_applies): the attention projections and every expert matrix (w1, w3
// and w2 each on its own). Everything else stays with AdamW:
//  - the embedding, which is also the tied LM head: as an input table only the rows of the
//    tokens in the batch receive gradient, and orthogonalizing would spread the update over
//    every row; as the output layer its rows are per-token logit directions, not a hidden
//    linear map whose singular directions should move at one rate;
//  - norms and any other 1-D tensor: orthogonalization is not defined for them;
//  - the router gate (n_experts × d_model): each row scores one expert, and top-k selection
//    and load balancing depend on the rows' relative scale. Orthogonalizing would give every
//    singular direction the same step whatever its gradient, moving rarely-routed experts as
//    far as busy ones, and the sqrt(max) scaling would make steps on this short, wide matrix
//    comparatively large.
// Although w1 and w3 sit back to back in the slab (one GEMM in the forward pass), they are
// two linear maps: orthogonalizing their stack would couple their spectra.
//
// Newton–Schulz: X = u / (‖u‖_F + 1e-7), then `steps` times  A = X Xᵀ;  B = b A + c A A;
// X = a X + B X  with the quintic coefficients (a, b, c) = (3.4445, -4.7750, 2.0315), on the
// wide orientation (rows ≤ cols; a tall matrix uses A = Xᵀ X and X = a X + X B, which is the
// same iteration on Xᵀ). These coefficients trade exact convergence for speed: singular
// values end up in about [0.68, 1.2] rather than at 1, which Muon tolerates.
// The products run through foundry::gemm (fp32, or bf16 inputs with fp32 accumulation).
//
// State: one fp32 momentum slab laid out like the parameter slab ("muon_momentum"); only the
// Muon tensors' elements are used, the rest stay zero.
//
// Deterministic: elementwise updates are per element and the Frobenius norm is summed in
// double over fixed blocks in a fixed order, so those parts do not depend on the thread
// count; the GEMMs are oneDNN's, which give the same result run to run at a fixed thread
// count (oneDNN may partition a product differently for another thread count).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/bf16.h"
#include "base/page_slab.h"
#include "model/params.h"
#include "optim/adamw.h"

namespace foundry {

// Is the tensor updated by Muon (true) or by AdamW (false) when Muon is enabled?
bool muon_applies(const ParamInfo& info);

// "muon" or "adamw": the optimizer that updates the tensor, for reports such as model info.
std::string optimizer_for(const ParamInfo& info, bool muon_enabled);

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0.1;  // decoupled, as in AdamW; only tensors with weight_decay set
  // The update is scaled by rms_scale * sqrt(max(rows, cols)) so its RMS matches AdamW's.
  double rms_scale = 0.2;
  bool bf16_newton_schulz = false;  // bf16 GEMM inputs in Newton–Schulz (fp32 accumulation)
};

// Muon's elementwise steps for one matrix of n elements (Muon::step's, and the device
// optimizer's on the CPU's kernels): g' = g·grad_scale, stored before use; buf = mu·buf + g';
// u = nesterov ? g' + mu·buf : buf (u may be g: element by element, in place). And
// w = w·keep − step_size·u, with w16 (when not null) its bf16 copy.
void muon_momentum(float* u, float* buf, const float* g, int64_t n, float mu, bool nesterov,
                   float grad_scale);
void muon_apply(float* w, const float* u, int64_t n, float keep, float step_size, bf16* w16);

// The Newton–Schulz orthogonalization with scratch buffers kept between calls, so a run
// over many tensors allocates once for the largest shape.
class NewtonSchulz {
 public:
  // out (rows × cols, row-major) = NS_steps(g / (‖g‖_F + 1e-7)). `out` may equal `g`.
  void run(const float* g, float* out, int64_t rows, int64_t cols, int steps, bool use_bf16);

 private:
  std::vector<float> x_, y_, a_, b_;
  std::vector<bf16> x16_, a16_, b16_;
  std::vector<double> block_sums_;
};

// One-off form of NewtonSchulz::run (allocates its scratch), for tests and tools.
void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int steps,
                   bool use_bf16);

class Muon {
 public:
  // Allocates a zeroed momentum slab of table.total_elements() floats. Fails on bad options.
  Muon(const ParamTable& table, const MuonOptions& options);

  // Updates the Muon tensors of `params` from `grads` (slabs of table.total_elements()
  // floats); every other element, padding included, is left alone. `step` is the 1-based
  // index of this update (Muon has no bias correction; it is checked for symmetry with
  // AdamW so both are driven the same way). `fusion` as for AdamW (optim/adamw.h).
  void step(float* params, const float* grads, double lr, int64_t step,
            const StepFusion& fusion = {});

  // The momentum slab by name ("muon_momentum"), for checkpoints. Fails on an unknown name.
  std::span<float> state(std::string_view name);
  std::span<const float> state(std::string_view name) const;
  static const std::vector<std::string>& state_names();

  void reset();  // zeroes the momentum
  const MuonOptions& options() const { return options_; }
  const std::vector<ParamInfo>& tensors() const { return tensors_; }  // those Muon updates

 private:
  MuonOptions options_;
  std::vector<ParamInfo> tensors_;
  PageSlab<float> momentum_;
  std::vector<float> update_;  // u, then O, for one tensor at a time
  NewtonSchulz newton_schulz_;
};

}  // namespace foundry
