#include "ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/rng.h"
#include "base/test_temp_dir.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "ckpt/test_support.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config() { return testing::tiny_moe_config(); }

ModelConfig tiny_dense_config() {
  ModelConfig c = tiny_config();
  c.n_experts = 1;
  c.top_k = 1;
  return c;
}

// Parameters and AdamW moments with the table's layout, filled with random bit patterns
// (NaN payloads, denormals and negative zeros included: the round trip must keep bits).
struct TrainingState {
  explicit TrainingState(const ParamTable& table, uint64_t seed)
      : params(random_slab(table, seed)),
        exp_avg(random_slab(table, seed + 1)),
        exp_avg_sq(random_slab(table, seed + 2)) {}

  static std::vector<float> random_slab(const ParamTable& table, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> slab(static_cast<size_t>(table.total_elements()));
    for (float& x : slab) {
      const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
      std::memcpy(&x, &bits, 4);
    }
    return slab;
  }

  std::vector<StateSlabToSave> to_save() const {
    return {{"exp_avg", exp_avg.data()}, {"exp_avg_sq", exp_avg_sq.data()}};
  }
  std::vector<StateSlabToLoad> to_load() {
    return {{"exp_avg", exp_avg.data()}, {"exp_avg_sq", exp_avg_sq.data()}};
  }

  std::vector<float> params, exp_avg, exp_avg_sq;
};

// True if every parameter's elements of `a` and `b` are bitwise equal.
bool same_tensors(const ParamTable& table, const std::vector<float>& a,
                  const std::vector<float>& b) {
  for (const ParamInfo& p : table.params())
    if (std::memcmp(a.data() + p.offset, b.data() + p.offset, p.numel * sizeof(float)) != 0)
      return false;
  return true;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(c);
}

class CheckpointTest : public ::testing::Test {
 protected:
  std::string save(int64_t step, int64_t keep_last = 0, uint64_t seed = 7) {
    TrainingState s(table_, seed + static_cast<uint64_t>(step));
    return save_checkpoint(run_dir_, step, config_, table_, s.params.data(), s.to_save(),
                           {{"step", step}}, keep_last);
  }
  std::string ckpt(int64_t step) const {
    return (fs::path(run_dir_) / "checkpoints" / checkpoint_dir_name(step)).string();
  }
  std::string latest_pointer() const {
    return read_text_file((fs::path(run_dir_) / "checkpoints" / "latest").string());
  }

  foundry::testing::TempDir tmp_;
  const std::string run_dir_ = tmp_.file("run");
  ModelConfig config_ = tiny_config();
  ParamTable table_{config_};
};

TEST_F(CheckpointTest, SaveThenLoadIsBitExact) {
  TrainingState saved(table_, 1);
  const json trainer_state = {{"step", 42},
                              {"rng", {1ull, 18446744073709551615ull, 3ull, 4ull}},
                              {"lr", 2.9999999999999997e-4},
                              {"data", {{"shard", 3}, {"offset", 123456789}}}};
  const std::string dir = save_checkpoint(run_dir_, 42, config_, table_, saved.params.data(),
                                          saved.to_save(), trainer_state, 3);
  EXPECT_EQ(dir, ckpt(42));

  TrainingState loaded(table_, 99);
  const std::vector<float> untouched = loaded.params;
  const json state = load_checkpoint(dir, config_, table_, loaded.params.data(), loaded.to_load());
  EXPECT_EQ(state, trainer_state);
  EXPECT_EQ(state["lr"].get<double>(), 2.9999999999999997e-4);
  EXPECT_TRUE(same_tensors(table_, loaded.params, saved.params));
  EXPECT_TRUE(same_tensors(table_, loaded.exp_avg, saved.exp_avg));
  EXPECT_TRUE(same_tensors(table_, loaded.exp_avg_sq, saved.exp_avg_sq));
  // Alignment padding between tensors is not part of the checkpoint and is left alone.
  const ParamInfo& second = table_.params()[1];
  const ParamInfo& first = table_.params()[0];
  for (int64_t i = first.offset + first.numel; i < second.offset; ++i)
    EXPECT_EQ(std::memcmp(&loaded.params[i], &untouched[i], 4), 0);
}

TEST_F(CheckpointTest, DirectoryHoldsHuggingFaceFilesAndAManifest) {
  const std::string dir = save(5);
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "config.json",
                           "trainer_state.json", "manifest.json", "COMMITTED"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / name)) << name;
  EXPECT_EQ(latest_pointer(), "step_00000005\n");
  EXPECT_FALSE(fs::exists(dir + ".tmp"));

  // The manifest's sizes and checksums are the files' own.
  const json manifest = json::parse(read_text_file(dir + "/manifest.json"));
  EXPECT_EQ(manifest["format_version"], 1);
  EXPECT_EQ(manifest["step"], 5);
  ASSERT_EQ(manifest["files"].size(), 4u);
  for (const auto& [name, entry] : manifest["files"].items()) {
    const auto bytes = read_binary_file(dir + "/" + name);
    EXPECT_EQ(entry["bytes"], bytes.size()) << name;
    EXPECT_EQ(entry["xxh3_64"], hash64_hex(hash64(bytes.data(), bytes.size()))) << name;
  }
  const std::string manifest_text = read_text_file(dir + "/manifest.json");
  const json committed = json::parse(read_text_file(dir + "/COMMITTED"));
  EXPECT_EQ(committed["manifest_xxh3_64"],
            hash64_hex(hash64(manifest_text.data(), manifest_text.size())));

  // Weights under Mixtral names, with the table's shapes; optimizer states per parameter.
  SafetensorsReader model(dir + "/model.safetensors");
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_EQ(model.tensors().size(), table_.params().size());
  const TensorView& w1 = model.get("model.layers.0.block_sparse_moe.experts.3.w1.weight");
  EXPECT_EQ(w1.dtype, StDtype::F32);
  EXPECT_EQ(w1.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(model.get("model.embed_tokens.weight").shape, (std::vector<int64_t>{256, 16}));
  EXPECT_EQ(model.get("model.layers.1.block_sparse_moe.gate.weight").shape,
            (std::vector<int64_t>{4, 16}));
  SafetensorsReader optimizer(dir + "/optimizer.safetensors");
  EXPECT_EQ(optimizer.tensors().size(), 2 * table_.params().size());
  EXPECT_NE(optimizer.find("model.layers.1.self_attn.k_proj.weight.exp_avg_sq"), nullptr);
  EXPECT_NE(optimizer.find("model.norm.weight.exp_avg"), nullptr);

  // config.json: Mixtral keys, and the Foundry config round trips exactly.
  const json config = json::parse(read_text_file(dir + "/config.json"));
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(config["vocab_size"], 256);
  EXPECT_EQ(config["hidden_size"], 16);
  EXPECT_EQ(config["intermediate_size"], 32);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 2);
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["max_position_embeddings"], 32);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(to_json(read_checkpoint_model_config(dir)), to_json(config_));
}

TEST_F(CheckpointTest, DenseModelUsesLlamaNames) {
  config_ = tiny_dense_config();
  ParamTable table(config_);
  TrainingState saved(table, 3);
  const std::string dir = save_checkpoint(run_dir_, 1, config_, table, saved.params.data(),
                                          saved.to_save(), json::object(), 0);
  const json config = json::parse(read_text_file(dir + "/config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_FALSE(config.contains("num_local_experts"));
  SafetensorsReader model(dir + "/model.safetensors");
  EXPECT_EQ(model.get("model.layers.1.mlp.gate_proj.weight").shape,
            (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(model.get("model.layers.1.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(model.find("model.layers.0.block_sparse_moe.gate.weight"), nullptr);

  TrainingState loaded(table, 4);
  load_checkpoint(dir, config_, table, loaded.params.data(), loaded.to_load());
  EXPECT_TRUE(same_tensors(table, loaded.params, saved.params));
  EXPECT_TRUE(same_tensors(table, loaded.exp_avg_sq, saved.exp_avg_sq));
}

// A tiny arch zaya1 model: one balancing-bias buffer [n_experts + 1] per MoE sublayer.
ModelConfig tiny_zaya_config() {
  ModelConfig c = tiny_config();
  c.arch = Arch::zaya1;
  c.top_k = 1;
  c.router_latent_dim = 8;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  return c;
}

TEST_F(CheckpointTest, ExtraModelTensorsAreWrittenAndIgnoredOnLoad) {
  config_ = tiny_zaya_config();
  ParamTable table(config_);
  TrainingState saved(table, 21);
  const int64_t S = config_.router_classes();
  ASSERT_EQ(S, 5);
  std::vector<std::vector<float>> biases;
  std::vector<ExtraTensorToSave> extras;
  for (int64_t l = 0; l < config_.n_layers; ++l)
    biases.push_back({0.5f * l, -0.25f, 1e-3f, -7.0f, -1.0f - l});
  for (int64_t l = 0; l < config_.n_layers; ++l)
    extras.push_back({fmt::format("model.layers.{}.mlp.gate.balancing_biases", l), {S},
                      biases[l].data()});
  const json trainer_state = {{"step", 3}, {"optimizer", "muon"}};
  const std::string dir = save_checkpoint(run_dir_, 3, config_, table, saved.params.data(),
                                          saved.to_save(), trainer_state, 0, extras);

  // model.safetensors: every parameter, then each buffer as F32 [S] with its values.
  SafetensorsReader model(dir + "/model.safetensors");
  ASSERT_EQ(model.tensors().size(), table.params().size() + 2);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const TensorView& t = model.get(fmt::format("model.layers.{}.mlp.gate.balancing_biases", l));
    EXPECT_EQ(t.dtype, StDtype::F32);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{S}));
    ASSERT_EQ(t.bytes, static_cast<uint64_t>(S) * 4);
    EXPECT_EQ(std::memcmp(t.data, biases[l].data(), t.bytes), 0) << "layer " << l;
  }
  EXPECT_EQ(model.tensors().back().name, "model.layers.1.mlp.gate.balancing_biases");
  // Not optimizer state: the optimizer file has states of the parameters only.
  SafetensorsReader optimizer(dir + "/optimizer.safetensors");
  EXPECT_EQ(optimizer.tensors().size(), 2 * table.params().size());

  // Loading ignores the buffers and restores parameters and states bit for bit.
  TrainingState loaded(table, 22);
  const json state = load_checkpoint(dir, config_, table, loaded.params.data(), loaded.to_load());
  EXPECT_EQ(state, trainer_state);
  EXPECT_TRUE(same_tensors(table, loaded.params, saved.params));
  EXPECT_TRUE(same_tensors(table, loaded.exp_avg, saved.exp_avg));
  EXPECT_TRUE(same_tensors(table, loaded.exp_avg_sq, saved.exp_avg_sq));
  EXPECT_EQ(read_checkpoint_trainer_state(dir), trainer_state);
}

TEST_F(CheckpointTest, ExtraModelTensorsMustHaveNamesOfTheirOwn) {
  TrainingState saved(table_, 23);
  const float value[4] = {1, 2, 3, 4};
  auto save_with = [&](std::vector<ExtraTensorToSave> extras) {
    return error_of([&] {
      save_checkpoint(run_dir_, 1, config_, table_, saved.params.data(), saved.to_save(),
                      json::object(), 0, extras);
    });
  };
  std::string message = save_with({{"model.norm.weight", {4}, value}});
  EXPECT_NE(message.find("'model.norm.weight'"), std::string::npos) << message;
  message = save_with({{"buffer", {4}, value}, {"buffer", {2}, value}});
  EXPECT_NE(message.find("'buffer'"), std::string::npos) << message;
  message = save_with({{"buffer", {4}, nullptr}});
  EXPECT_NE(message.find("'buffer'"), std::string::npos) << message;
  // A failed save publishes nothing.
  EXPECT_TRUE(list_checkpoint_dirs(run_dir_).empty());
  EXPECT_EQ(find_latest_checkpoint(run_dir_), std::nullopt);
}

TEST_F(CheckpointTest, LoadStillRequiresEveryParameter) {
  // A model file that lacks a parameter (here: written for a table without it, under the
  // same config) is refused, naming the tensor, even though extra tensors are tolerated.
  TrainingState saved(table_, 24);
  const std::string dir = save(8);
  const std::string path = dir + "/model.safetensors";
  {
    SafetensorsReader full(path);
    std::vector<TensorToWrite> tensors;
    std::vector<std::vector<uint8_t>> copies;
    for (const TensorView& t : full.tensors()) {
      if (t.name == "model.norm.weight") continue;
      copies.emplace_back(t.data, t.data + t.bytes);
    }
    size_t i = 0;
    for (const TensorView& t : full.tensors())
      if (t.name != "model.norm.weight")
        tensors.push_back({t.name, t.dtype, t.shape, copies[i++].data()});
    tensors.push_back({"model.norm.weight.renamed", StDtype::F32, {16},
                       saved.params.data()});
    write_safetensors(path + ".new", tensors, {{"format", "pt"}});
  }
  fs::rename(path + ".new", path);
  // Re-commit the edited file so only the missing tensor is wrong.
  json manifest = json::parse(read_text_file(dir + "/manifest.json"));
  const auto bytes = read_binary_file(path);
  manifest["files"]["model.safetensors"] = {
      {"bytes", bytes.size()}, {"xxh3_64", hash64_hex(hash64(bytes.data(), bytes.size()))}};
  const std::string manifest_text = manifest.dump(2) + "\n";
  write_file_atomic(dir + "/manifest.json", manifest_text);
  write_file_atomic(dir + "/COMMITTED",
                    json({{"format_version", 1},
                          {"manifest_xxh3_64",
                           hash64_hex(hash64(manifest_text.data(), manifest_text.size()))}})
                        .dump());
  ASSERT_NO_THROW(verify_checkpoint(dir));
  TrainingState target(table_, 25);
  const std::string message = error_of(
      [&] { load_checkpoint(dir, config_, table_, target.params.data(), target.to_load()); });
  EXPECT_NE(message.find("has no tensor 'model.norm.weight'"), std::string::npos) << message;
}

TEST_F(CheckpointTest, CheckpointWithoutCommittedIsNotFound) {
  save(1);
  save(2);
  fs::remove(ckpt(2) + "/COMMITTED");
  EXPECT_NE(error_of([&] { verify_checkpoint(ckpt(2)); }).find("COMMITTED"), std::string::npos);

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(1));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find(ckpt(2)), std::string::npos) << warnings;

  // Without the pointer the scan meets step 2 first, and says why it skips it.
  fs::remove(run_dir_ + "/checkpoints/latest");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(1));
  const std::string scan_warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(scan_warnings.find("skipping invalid checkpoint " + ckpt(2)), std::string::npos)
      << scan_warnings;

  fs::remove(ckpt(1) + "/COMMITTED");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), std::nullopt);
  ::testing::internal::GetCapturedStderr();
}

// A `latest` that cannot be read (a directory in its place) is no pointer: the scan decides.
TEST_F(CheckpointTest, AnUnreadableLatestFallsBackToTheScan) {
  save(1);
  save(2);
  fs::remove(run_dir_ + "/checkpoints/latest");
  fs::create_directory(run_dir_ + "/checkpoints/latest");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(2));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("it is a directory, not a file; looking for checkpoints"),
            std::string::npos)
      << warnings;
}

// One flipped byte in any file makes the checkpoint invalid, and the search falls back.
class CorruptionTest : public CheckpointTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(CorruptionTest, OneFlippedByteFailsVerifyAndFallsBack) {
  const std::string file = GetParam();
  save(10);
  save(20);
  ASSERT_NO_THROW(verify_checkpoint(ckpt(20)));
  const std::string path = ckpt(20) + "/" + file;
  flip_byte(path, fs::file_size(path) / 2);

  const std::string message = error_of([&] { verify_checkpoint(ckpt(20)); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(10));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("warning"), std::string::npos);
  EXPECT_NE(warnings.find(file), std::string::npos) << warnings;
}

INSTANTIATE_TEST_SUITE_P(EachFile, CorruptionTest,
                         ::testing::Values("model.safetensors", "optimizer.safetensors",
                                           "config.json", "trainer_state.json", "manifest.json"),
                         [](const auto& info) {
                           std::string name = info.param;
                           return name.substr(0, name.find('.')) + "_" +
                                  name.substr(name.find('.') + 1);
                         });

TEST_F(CheckpointTest, LoadOfACorruptCheckpointWritesNothing) {
  save(3);
  const std::string optimizer_file = ckpt(3) + "/optimizer.safetensors";
  flip_byte(optimizer_file, fs::file_size(optimizer_file) - 3);
  TrainingState target(table_, 11);
  const TrainingState before = target;
  EXPECT_THROW(load_checkpoint(ckpt(3), config_, table_, target.params.data(), target.to_load()),
               Error);
  EXPECT_EQ(std::memcmp(target.params.data(), before.params.data(), target.params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(target.exp_avg.data(), before.exp_avg.data(), target.exp_avg.size() * 4),
            0);
}

TEST_F(CheckpointTest, LoadRefusesAnotherModelConfigAndNamesTheKeys) {
  const std::string dir = save(4);
  ModelConfig other = config_;
  other.d_model = 32;
  other.rope_theta = 500000.0;
  ParamTable other_table(other);
  TrainingState target(other_table, 5);
  const TrainingState before = target;
  const std::string message = error_of(
      [&] { load_checkpoint(dir, other, other_table, target.params.data(), target.to_load()); });
  EXPECT_NE(message.find("checkpoint has model.d_model = 16, the config says 32"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("model.rope_theta"), std::string::npos) << message;
  EXPECT_EQ(message.find("model.n_layers"), std::string::npos) << message;
  EXPECT_EQ(std::memcmp(target.params.data(), before.params.data(), target.params.size() * 4), 0);
}

TEST_F(CheckpointTest, LoadRefusesMissingOptimizerStateAndCanLoadWeightsOnly) {
  TrainingState saved(table_, 8);
  const std::string dir = save_checkpoint(run_dir_, 6, config_, table_, saved.params.data(),
                                          saved.to_save(), json::object(), 0);
  TrainingState target(table_, 9);
  std::vector<float> momentum(target.params.size(), 0.0f);
  const std::string message = error_of([&] {
    load_checkpoint(dir, config_, table_, target.params.data(), {{"momentum", momentum.data()}});
  });
  EXPECT_NE(message.find("'momentum'"), std::string::npos) << message;
  EXPECT_NE(message.find("exp_avg, exp_avg_sq"), std::string::npos) << message;
  EXPECT_FALSE(same_tensors(table_, target.params, saved.params));

  load_checkpoint(dir, config_, table_, target.params.data(), {});
  EXPECT_TRUE(same_tensors(table_, target.params, saved.params));
}

TEST_F(CheckpointTest, RetentionKeepsTheNewestKAndLatestNamesTheNewest) {
  for (int64_t step = 1; step <= 5; ++step) save(step * 100, /*keep_last=*/2);
  const auto dirs = list_checkpoint_dirs(run_dir_);
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0].step, 400);
  EXPECT_EQ(dirs[1].step, 500);
  EXPECT_EQ(latest_pointer(), "step_00000500\n");
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(500));
  // Nothing but the checkpoints and the pointer is left behind.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(run_dir_ + "/checkpoints"))
    ++entries;
  EXPECT_EQ(entries, 3u);
}

TEST_F(CheckpointTest, RetentionZeroKeepsAll) {
  for (int64_t step = 1; step <= 4; ++step) save(step, /*keep_last=*/0);
  EXPECT_EQ(list_checkpoint_dirs(run_dir_).size(), 4u);
  save(5, /*keep_last=*/1);
  ASSERT_EQ(list_checkpoint_dirs(run_dir_).size(), 1u);
  EXPECT_EQ(list_checkpoint_dirs(run_dir_)[0].step, 5);
}

TEST_F(CheckpointTest, RetentionLeavesAStepDirectoryWhoseMarkerFoundryDidNotWrite) {
  save(1);
  // Someone's own step directory, with a COMMITTED of their own: not a checkpoint to prune.
  fs::create_directories(ckpt(2));
  std::ofstream(ckpt(2) + "/COMMITTED") << "{\"format_version\": 1}";
  EXPECT_FALSE(has_commit_marker(ckpt(2)));
  EXPECT_FALSE(is_foundry_checkpoint_dir(ckpt(2)));
  EXPECT_TRUE(has_commit_marker(ckpt(1)));
  save(3, /*keep_last=*/1);
  EXPECT_FALSE(fs::exists(ckpt(1)));
  EXPECT_TRUE(fs::exists(ckpt(2) + "/COMMITTED"));
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(3));
  // A checkpoint of Foundry's whose marker was lost is still Foundry's, though no longer a
  // committed one that retention counts.
  fs::remove(ckpt(3) + "/COMMITTED");
  EXPECT_FALSE(has_commit_marker(ckpt(3)));
  EXPECT_TRUE(is_foundry_checkpoint_dir(ckpt(3)));
}

TEST_F(CheckpointTest, LeftoverTmpDirectoryIsIgnoredAndCleanedUp) {
  save(1);
  // What a crash in the middle of saving step 2 leaves behind, even with a marker inside.
  const std::string leftover = ckpt(2) + ".tmp";
  fs::create_directories(leftover);
  std::ofstream(leftover + "/model.safetensors") << "partial";
  std::ofstream(leftover + "/COMMITTED") << "{}";
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(1));
  EXPECT_EQ(list_checkpoint_dirs(run_dir_).size(), 1u);

  save(3);
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(3));
}

TEST_F(CheckpointTest, SavingTheSameStepAgainReplacesIt) {
  save(7, 0, /*seed=*/1);
  save(7, 0, /*seed=*/2);
  TrainingState expected(table_, 2 + 7);
  TrainingState loaded(table_, 0);
  load_checkpoint(ckpt(7), config_, table_, loaded.params.data(), loaded.to_load());
  EXPECT_TRUE(same_tensors(table_, loaded.params, expected.params));
  EXPECT_EQ(list_checkpoint_dirs(run_dir_).size(), 1u);
  EXPECT_FALSE(fs::exists(ckpt(7) + ".tmp"));
}

TEST_F(CheckpointTest, BadLatestPointerFallsBackToScanning) {
  save(1);
  save(2);
  const std::string pointer = run_dir_ + "/checkpoints/latest";
  write_file_atomic(pointer, "step_00000009\n");  // names a checkpoint that does not exist
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(2));
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("step_00000009"), std::string::npos);

  write_file_atomic(pointer, "../../etc\n");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(2));
  ::testing::internal::GetCapturedStderr();

  fs::remove(pointer);
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(2));
  EXPECT_EQ(find_latest_checkpoint(run_dir_ + "/nothing-here"), std::nullopt);
}

TEST_F(CheckpointTest, LatestPointerWinsOverHigherSteps) {
  // A run resumed from step 1 after a rollback keeps the abandoned step 2 until retention
  // removes it; `latest` still says which checkpoint is current.
  save(2);
  save(1);
  EXPECT_EQ(latest_pointer(), "step_00000001\n");
  EXPECT_EQ(find_latest_checkpoint(run_dir_), ckpt(1));
}

TEST_F(CheckpointTest, NewerFormatVersionIsRefused) {
  save(1);
  const std::string committed = ckpt(1) + "/COMMITTED";
  json marker = json::parse(read_text_file(committed));
  marker["format_version"] = 2;
  write_file_atomic(committed, marker.dump());
  const std::string message = error_of([&] { verify_checkpoint(ckpt(1)); });
  EXPECT_NE(message.find("format_version 2"), std::string::npos) << message;
}

TEST_F(CheckpointTest, DirectoryNamesHaveEightDigits) {
  EXPECT_EQ(checkpoint_dir_name(0), "step_00000000");
  EXPECT_EQ(checkpoint_dir_name(1234), "step_00001234");
  EXPECT_EQ(checkpoint_dir_name(123456789), "step_123456789");
}

}  // namespace
}  // namespace foundry
