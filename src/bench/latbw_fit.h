// The latency–bandwidth (α–β) model of a collective: t(S) = α + S / β.
//
// α is the fixed cost of one call (software overhead, synchronization, the latency of the
// first message), β the effective bandwidth at which time grows with the message size S.
// `plan` and `simulate` predict communication time from these two numbers, so they are fitted
// per operation and rank count, in the same S convention as algbw (see comm_bench.h).
//
// Weighting. Measured sizes span 8 B to many MiB, so times span three or four orders of
// magnitude. An ordinary least-squares fit would spend all its effort on the largest sizes
// and could return any α, even a negative one, for the small ones. The fit minimizes the
// sum of squared *relative* residuals, Σ ((α + S_i/β − t_i) / t_i)², which treats a 10 %
// miss at 8 B like a 10 % miss at 64 MiB: the same accuracy across the whole range, which is
// what a prediction needs. In the unknowns α and γ = 1/β this is a linear weighted
// least-squares problem (weights 1/t_i²) with a closed-form solution; α and γ are kept
// non-negative (a negative latency or bandwidth has no meaning).
#pragma once
#include <cstdint>
#include <span>

namespace foundry {

struct LatBwSample {
  double bytes = 0;    // S
  double seconds = 0;  // t(S), > 0
};

struct LatBwFit {
  double alpha_s = 0;           // α, seconds
  double beta_bytes_per_s = 0;  // β; 0 when time does not grow with size over the samples
                                // (latency-bound range: the bandwidth is not measurable)
  double max_rel_residual = 0;  // max_i |t_model(S_i) − t_i| / t_i
  double min_bytes = 0, max_bytes = 0;
  int samples = 0;

  // Seconds predicted for S bytes.
  double predict(double bytes) const {
    return alpha_s + (beta_bytes_per_s > 0 ? bytes / beta_bytes_per_s : 0.0);
  }
};

// Fits t(S) = α + S/β by least squares on relative residuals. Needs at least two samples
// with distinct sizes and positive times; throws foundry::Error otherwise.
LatBwFit fit_latency_bandwidth(std::span<const LatBwSample> samples);

}  // namespace foundry
