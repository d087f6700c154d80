// Shared helpers for the optimizer tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/rng.h"
#include "comm/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/muon.h"
#include "optim/optimizer.h"

namespace foundry::test {

// The process's MPI world, one session for the whole test binary (a singleton without mpirun).
inline Communicator& mpi_world() {
  static MpiSession session;
  return session.world();
}

// A tiny MoE with grouped-query attention: every tensor kind, several chunks per run.
inline ModelConfig tiny_moe_config() {
  ModelConfig c;
  c.vocab_size = 1000;  // padded to 1024 rows: the embedding alone spans several chunks
  c.d_model = 36;  // norm weights of 36 floats leave alignment padding after them
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.n_experts = 4;
  c.top_k = 2;
  c.ffn_dim = 48;
  return c;
}

// A slab with normal(0, scale) values in every tensor and `padding_value` in the gaps.
inline std::vector<float> random_slab(const ParamTable& table, uint64_t seed, double scale,
                                      float padding_value = 0.0f) {
  std::vector<float> slab(table.total_elements(), padding_value);
  Rng rng(seed);
  for (const ParamInfo& p : table.params())
    for (int64_t i = 0; i < p.numel; ++i)
      slab[p.offset + i] = static_cast<float>(scale * rng.normal());
  return slab;
}

// Offsets of the slab elements that belong to no tensor (alignment padding).
inline std::vector<int64_t> padding_offsets(const ParamTable& table) {
  std::vector<bool> used(table.total_elements(), false);
  for (const ParamInfo& p : table.params())
    for (int64_t i = 0; i < p.numel; ++i) used[p.offset + i] = true;
  std::vector<int64_t> gaps;
  for (int64_t i = 0; i < table.total_elements(); ++i)
    if (!used[i]) gaps.push_back(i);
  return gaps;
}

// The optimizer pair of a run: AdamW (weight decay 0.1) for everything, or, with Muon, for
// what Muon does not update; Muon with its defaults.
// Where each tensor starts, the last first: the order a backward reports them final in.
inline std::vector<int64_t> offsets_last_first(const ParamTable& table) {
  std::vector<int64_t> offsets;
  for (const ParamInfo& p : table.params()) offsets.push_back(p.offset);
  std::sort(offsets.rbegin(), offsets.rend());
  return offsets;
}

// "ZeRO-1, muon", "replicated, adamw": a data-parallel case, for SCOPED_TRACE.
inline std::string layout_case(bool zero1, bool with_muon) {
  return std::string(zero1 ? "ZeRO-1" : "replicated") + (with_muon ? ", muon" : ", adamw");
}

inline AdamWOptions adamw_options(bool with_muon) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  if (with_muon) o.applies = [](const ParamInfo& info) { return !muon_applies(info); };
  return o;
}

inline std::optional<MuonOptions> muon_options(bool with_muon) {
  if (!with_muon) return std::nullopt;
  return MuonOptions{};
}

// Both, for make_optimizer and make_device_optimizer.
inline OptimizerOptions optimizer_options(bool with_muon) {
  OptimizerOptions o;
  o.adamw = adamw_options(with_muon);
  o.muon = muon_options(with_muon);
  return o;
}

inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
}

}  // namespace foundry::test
