// Helpers shared by the checkpoint layer's tests: small model configs, random slabs, and
// version 2 checkpoints saved from simulated ranks.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/rng.h"
#include "ckpt/sharded.h"
#include "model/params.h"

namespace foundry::testing {

inline ModelConfig tiny_moe_config() {
  ModelConfig c;
  c.vocab_size = 200;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.n_experts = 4;
  c.top_k = 2;
  c.ffn_dim = 32;
  c.max_seq_len = 32;
  return c;
}

inline ModelConfig tiny_zaya_config() {
  ModelConfig c = tiny_moe_config();
  c.arch = Arch::zaya1;
  c.top_k = 1;
  c.router_latent_dim = 8;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  c.rope_fraction = 0.5;
  return c;
}

// Any bit pattern: a round trip must keep bits.
inline std::vector<float> random_slab(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> slab(static_cast<size_t>(n));
  for (float& x : slab) {
    const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
    std::memcpy(&x, &bits, 4);
  }
  return slab;
}

// Rank r of `ranks` holds slab elements [r·B, min((r+1)·B, n)), B = ceil(n / ranks): shards
// that cut tensors at arbitrary elements, as ZeRO-1's do.
inline std::pair<int64_t, int64_t> share(int64_t n, int ranks, int r) {
  const int64_t b = (n + ranks - 1) / ranks;
  return {std::min(n, r * b), std::min(n, (r + 1) * b)};
}

// A slab to save: "" for the parameters or a state name, its values (the table's layout),
// and which tensors have it (all when empty), as an optimizer that keeps a state for some
// tensors only.
struct SlabToSave {
  std::string name;
  const std::vector<float>* values = nullptr;
  std::function<bool(const ParamInfo&)> has;
};

// Saves `slabs` from `ranks` simulated ranks into run_dir and commits; returns the
// checkpoint directory.
inline std::string save_from_ranks(const std::string& run_dir, int64_t step, int ranks,
                                   const ModelConfig& config, const std::vector<SlabToSave>& slabs,
                                   const json& trainer_state) {
  const ParamTable table(config);
  const std::string staging = staging_dir(run_dir, step, "test");
  std::vector<json> shards;
  for (int r = 0; r < ranks; ++r) {
    const auto [b, e] = share(table.total_elements(), ranks, r);
    std::vector<SlabRun> runs;
    for (const SlabToSave& s : slabs)
      for (const ParamInfo& p : table.params()) {
        const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
        if (lo < hi && (!s.has || s.has(p)))
          runs.push_back({s.name, lo, hi, s.values->data() + lo});
      }
    shards.push_back(write_rank_shard(staging, r, table, runs));
  }
  return commit_sharded_checkpoint(run_dir, staging, step, config, table, shards, trainer_state,
                                   {ranks, 1, ranks > 1}, 0);
}

// A fresh directory per test, removed afterwards.
class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = (std::filesystem::temp_directory_path() /
             fmt::format("foundry_{}_{}_{}", info->test_suite_name(), ::getpid(), info->name()))
                .string();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string root_;
};

}  // namespace foundry::testing
