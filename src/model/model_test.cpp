// Whole-model checks: analytic gradients against finite differences of the loss, and
// incremental decoding against the full forward pass.
#include "model/model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kernels/cpu_backend.h"
#include "model/test_support.h"

namespace foundry {
namespace {

using testing::small_moe_config;

using testing::Batch;

Batch random_batch(const ModelConfig& c, int64_t b, int64_t t, uint64_t seed) {
  return testing::random_batch(c, b * t, seed);
}

void check_gradients(const ModelConfig& c) {
  Model model(c, DType::f32);
  model.init_weights(7);
  testing::expect_gradients_match_finite_differences(model, random_batch(c, 2, 6, 11), 2, 6);
}

TEST(ModelGradient, DenseMatchesFiniteDifferences) { check_gradients(small_moe_config(1, 1)); }
TEST(ModelGradient, MoeTop2MatchesFiniteDifferences) { check_gradients(small_moe_config(4, 2)); }
TEST(ModelGradient, MoeTop1MatchesFiniteDifferences) { check_gradients(small_moe_config(4, 1)); }

TEST(ModelGradient, MoeWithoutRenormalizationMatchesFiniteDifferences) {
  ModelConfig c = small_moe_config(4, 2);
  c.norm_topk_prob = false;
  check_gradients(c);
}

ModelConfig with_qk_norm(ModelConfig c, QkNorm n) {
  c.qk_norm = n;
  c.validate("test");
  return c;
}

// Queries and keys normalized per head (one weight shared by the heads) or over the whole
// projection: the norms' weight gradients and the gradients through them.
TEST(ModelGradient, QkNormPerHeadMatchesFiniteDifferences) {
  check_gradients(with_qk_norm(small_moe_config(4, 2), QkNorm::head));
}
TEST(ModelGradient, QkNormFullMatchesFiniteDifferences) {
  check_gradients(with_qk_norm(small_moe_config(1, 1), QkNorm::full));
}

// Normalizing q and k changes the function (the loss differs from that of the same weights
// without the norms), and a model config round-trips the setting.
TEST(Model, QkNormChangesTheLossAndRoundTrips) {
  const ModelConfig plain = small_moe_config(4, 2);
  const ModelConfig normed = with_qk_norm(plain, QkNorm::head);
  EXPECT_EQ(parse_model_config(to_json(normed), "t").qk_norm, QkNorm::head);
  EXPECT_EQ(parse_model_config(to_json(plain), "t").qk_norm, QkNorm::none);
  EXPECT_FALSE(to_json(plain).contains("qk_norm"));
  Batch batch = random_batch(plain, 2, 6, 11);
  Model a(plain, DType::f32), b(normed, DType::f32);
  a.init_weights(7);
  b.init_weights(7);
  const double la = a.forward(batch.inputs.data(), batch.targets.data(), 2, 6).ce_loss;
  const double lb = b.forward(batch.inputs.data(), batch.targets.data(), 2, 6).ce_loss;
  EXPECT_GT(std::fabs(la - lb), 1e-6) << "per-head RMSNorm of q and k left the loss unchanged";
}

TEST(Model, GradientsFinalHookReportsOnlyFinishedGradients) {
  const ModelConfig c = small_moe_config(4, 2);
  Model model(c, DType::f32);
  model.init_weights(7);
  testing::expect_gradients_final_hook_is_honest(model, random_batch(c, 2, 6, 11), 2, 6);
}

TEST(Model, IncrementalDecodingMatchesFullForward) {
  for (QkNorm qk : {QkNorm::none, QkNorm::head, QkNorm::full}) {
    SCOPED_TRACE(fmt::format("qk_norm {}", qk_norm_name(qk)));
    Model model(with_qk_norm(small_moe_config(4, 2), qk), DType::f32);
    model.init_weights(3);
    testing::expect_decode_matches_forward(model, 7, 5, 1e-4);
  }
}

TEST(Model, BatchedDecodingMatchesSingleSequences) {
  for (const auto& [experts, top_k] : {std::pair{4, 2}, std::pair{1, 1}})
    for (DType precision : {DType::f32, DType::bf16}) {
      Model model(small_moe_config(experts, top_k), precision);
      model.init_weights(3);
      testing::expect_batched_decode_matches_single(model, 5, 7, 9,
                                                    precision == DType::f32 ? 1e-5 : 1e-3);
    }
}

// backward writes the experts' gradients whole (zero_grads leaves them alone): gradients left
// as NaN by an earlier step change nothing, also for experts that get no rows (8 experts,
// top-1, 4 tokens: at least 4 empty), in both architectures and precisions.
TEST(Model, BackwardOverwritesWhatZeroGradsLeaves) {
  for (const bool zaya : {false, true})
    for (const DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(zaya ? "zaya1 " : "moe ") + (dt == DType::bf16 ? "bf16" : "f32"));
      const ModelConfig moe = small_moe_config(8, 1);
      const ModelConfig c = zaya ? testing::small_zaya_config(moe) : moe;
      const Batch batch = random_batch(c, 1, 4, 5);
      Model model(c, dt);
      model.init_weights(3);
      auto gradients = [&] {
        model.zero_grads();
        model.forward(batch.inputs.data(), batch.targets.data(), 1, 4);
        model.backward();
        return std::vector<float>(model.grads(), model.grads() + model.slab_size());
      };
      const std::vector<float> clean = gradients();
      const std::vector<int64_t> loads = model.expert_loads();
      ASSERT_GE(std::count(loads.begin(), loads.end(), 0), 4);
      std::fill(model.grads(), model.grads() + model.slab_size(), std::nanf(""));
      const std::vector<float> again = gradients();
      ASSERT_EQ(std::memcmp(clean.data(), again.data(), clean.size() * sizeof(float)), 0);
      EXPECT_THROW(model.backward(), Error);  // no zero_grads since the last backward
    }
}

TEST(Model, SameSeedSameLossBitwise) {
  ModelConfig c = small_moe_config(4, 2);
  Batch batch = random_batch(c, 2, 6, 1);
  double losses[2];
  for (double& loss : losses) {
    Model model(c, DType::bf16);
    model.init_weights(42);
    loss = model.forward(batch.inputs.data(), batch.targets.data(), 2, 6).loss;
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(Model, RejectsTokenOutsideVocabulary) {
  ModelConfig c = small_moe_config(1, 1);
  Model model(c, DType::f32);
  std::vector<int32_t> inputs(6, 1), targets(6, 1);
  inputs[3] = 50;
  EXPECT_THROW(model.forward(inputs.data(), targets.data(), 1, 6), Error);
}

TEST(ParamTable, MixtralNamesAndCounts) {
  ModelConfig c = small_moe_config(4, 2);
  ParamTable table(c);
  const ParamInfo& w1 = table.get("model.layers.1.block_sparse_moe.experts.3.w1.weight");
  const ParamInfo& w3 = table.get("model.layers.1.block_sparse_moe.experts.3.w3.weight");
  EXPECT_EQ(w1.shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(w3.offset, w1.offset + w1.numel) << "gate and up must be adjacent for the fused GEMM";
  EXPECT_FALSE(table.get("model.norm.weight").weight_decay);
  EXPECT_FALSE(table.get("model.embed_tokens.weight").weight_decay);
  EXPECT_TRUE(table.get("model.layers.0.self_attn.q_proj.weight").weight_decay);
  // embed 128·16 + per layer (2 norms 32, q 256, k 128, v 128, o 256, router 64,
  // experts 4·3·384) + final norm 16.
  const int64_t per_layer = 32 + 256 + 128 + 128 + 256 + 64 + 4 * 3 * 384;
  EXPECT_EQ(table.parameter_count(), 128 * 16 + 2 * per_layer + 16);
  EXPECT_EQ(ParamTable(small_moe_config(1, 1)).find("model.layers.0.mlp.gate_proj.weight")->numel,
            24 * 16);
}

// A model whose backend keeps its memory to itself takes the paths it takes on a GPU: slabs
// and activations allocated through the backend, initialization on the host copied over, the
// batch copied in, the loss, aux losses, class counts and expert offsets copied out, the
// gradients zeroed and the bf16 weights refreshed by the backend. With the CPU's arithmetic
// behind them, those paths must give the host model's numbers bit for bit.
void expect_device_paths_match_host(const ModelConfig& c, DType precision) {
  SCOPED_TRACE(fmt::format("{} {}", c.is_zaya() ? "zaya1" : "moe", dtype_name(precision)));
  Model host(c, precision);
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model device(c, precision, *backend);
  ASSERT_FALSE(host.on_device());
  ASSERT_TRUE(device.on_device());
  host.init_weights(5);
  device.init_weights(5);
  std::vector<float> host_grads, device_grads;
  const std::vector<double> host_losses = testing::sgd_steps(host, 3, 2, 6, 0.05, &host_grads);
  const std::vector<double> device_losses =
      testing::sgd_steps(device, 3, 2, 6, 0.05, &device_grads);
  EXPECT_EQ(host_losses, device_losses);
  EXPECT_TRUE(host_grads == device_grads);
  std::vector<float> host_params(host.slab_size()), device_params(device.slab_size());
  host.read_params(host_params.data());
  device.read_params(device_params.data());
  EXPECT_TRUE(host_params == device_params);
  EXPECT_EQ(host.expert_loads(), device.expert_loads());
  EXPECT_EQ(host.router_class_counts(), device.router_class_counts());
  // The device's slabs are the parameters, the gradients and the bf16 copy, each in whole
  // chunks (pages, posing).
  const int64_t bytes_per_param = precision == DType::bf16 ? 10 : 8;
  EXPECT_GE(device.resident_slab_bytes(), device.slab_size() * bytes_per_param);
  EXPECT_LT(device.resident_slab_bytes(),
            device.slab_size() * bytes_per_param + 3 * sysconf(_SC_PAGESIZE));
}

TEST(ModelOnDevice, DevicePathsMatchTheHostModelBitForBit) {
  for (DType precision : {DType::f32, DType::bf16}) {
    expect_device_paths_match_host(small_moe_config(4, 2), precision);
    expect_device_paths_match_host(testing::small_zaya_config(small_moe_config(4, 1)), precision);
  }
}

// Decoding on a device: the caches, CCA states and segments in the backend's memory, the
// tokens in and the logits out through host memory. With the CPU's arithmetic behind them, the
// host model's logits bit for bit: sequences in step (decode_step), and rows at their own
// positions over a shared prefix segment written as a run of rows in one step (decode_rows).
std::vector<float> decoded_logits(Model& m) {
  const int64_t Vp = m.config().padded_vocab(), B = 3, T = 6;
  std::vector<float> out;
  const auto keep = [&](const float* logits, int64_t rows) {
    out.insert(out.end(), logits, logits + rows * Vp);
  };
  Rng rng(17);
  auto token = [&] { return static_cast<int32_t>(rng.below(m.config().vocab_size)); };
  auto state = m.new_decode_state(T, B);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int32_t> tokens = {token(), token(), token()};
    keep(m.decode_step(state, tokens.data()), B);
  }
  const std::vector<float> rows = testing::shared_prefix_logits(m, rng);
  out.insert(out.end(), rows.begin(), rows.end());
  return out;
}

TEST(ModelOnDevice, DecodesToTheHostModelsBits) {
  for (DType precision : {DType::f32, DType::bf16})
    for (const ModelConfig& c :
         {small_moe_config(4, 2), testing::small_zaya_config(small_moe_config(4, 1))}) {
      SCOPED_TRACE(fmt::format("{} {}", c.is_zaya() ? "zaya1" : "moe", dtype_name(precision)));
      Model host(c, precision);
      const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
      Model device(c, precision, *backend);
      host.init_weights(8);
      device.init_weights(8);
      const std::vector<float> want = decoded_logits(host), got = decoded_logits(device);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(got == want);
      EXPECT_TRUE(std::isinf(got[c.padded_vocab() - 1]) || c.padded_vocab() == c.vocab_size);
    }
}

// A model built for inference on a device holds no gradient slab, decodes like one built for
// training, and refuses what needs gradients with an error that says why.
TEST(ModelOnDevice, AnInferenceModelHasNoGradients) {
  const ModelConfig c = small_moe_config(4, 2);
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model training(c, DType::f32, *backend), inference(c, DType::f32, *backend, ModelUse::inference);
  training.init_weights(3);
  inference.init_weights(3);
  // Slabs in whole pages: the inference model's one, the training model's two.
  const int64_t page = sysconf(_SC_PAGESIZE), n = training.slab_size();
  EXPECT_EQ(inference.resident_slab_bytes(), (n * 4 + page - 1) / page * page);
  EXPECT_EQ(training.resident_slab_bytes(), 2 * ((n * 4 + page - 1) / page * page));
  EXPECT_TRUE(decoded_logits(inference) == decoded_logits(training));
  try {
    inference.zero_grads();
    FAIL() << "zero_grads on an inference model did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built for inference"), std::string::npos) << e.what();
  }
  std::vector<float> grads(inference.slab_size());
  EXPECT_THROW(inference.read_grads(grads.data()), Error);
}

TEST(ModelOnDevice, ShardingTheExpertStorageNeedsExpertParallelism) {
  const std::unique_ptr<Backend> backend = make_cpu_backend_posing_as_device();
  Model model(small_moe_config(4, 2), DType::f32, *backend);
  try {
    model.shard_expert_storage({});
    FAIL() << "sharding the expert storage without expert parallelism did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs expert parallelism"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(model.storage_sharded());
}

}  // namespace
}  // namespace foundry
