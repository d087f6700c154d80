#include "ckpt/export.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "base/io.h"
#include "base/test_expect_error.h"
#include "ckpt/checkpoint.h"
#include "ckpt/model_state.h"
#include "ckpt/safetensors.h"
#include "ckpt/test_support.h"
#include "model/model.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;
using testing::CheckpointDirTest;

using ExportTest = CheckpointDirTest;

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(ExportTest, AVersionTwoCheckpointFromThreeRanksExportsEveryParameterBitForBit) {
  const ModelConfig config = testing::tiny_moe_config();
  const ParamTable table(config);
  const std::vector<float> params = testing::random_slab(table.total_elements(), 1);
  const std::vector<float> exp_avg = testing::random_slab(table.total_elements(), 2);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 10, 3, config,
                               {{"", &params, {}}, {"exp_avg", &exp_avg, {}}}, {{"step", 10}});

  const ExportReport report = export_hf_model(dir, root_ + "/hf");
  EXPECT_EQ(report.tensors, static_cast<int64_t>(table.params().size()));
  EXPECT_EQ(entries(root_ + "/hf"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"hf", "run"}));  // nothing left over

  const SafetensorsReader file(root_ + "/hf/model.safetensors");
  EXPECT_EQ(report.bytes, static_cast<int64_t>(fs::file_size(file.path())));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.tensors().size(), table.params().size());
  for (size_t i = 0; i < table.params().size(); ++i) {
    const ParamInfo& p = table.params()[i];
    const TensorView& t = file.tensors()[i];  // in table order
    EXPECT_EQ(t.name, p.name);
    EXPECT_EQ(t.dtype, StDtype::F32);
    EXPECT_EQ(t.shape, p.shape);
    EXPECT_EQ(std::memcmp(t.data, params.data() + p.offset, p.numel * sizeof(float)), 0) << p.name;
  }
  EXPECT_EQ(load_json_file(root_ + "/hf/config.json"), hf_config_json(config));
}

// Balancers moved away from their initial state, and the trainer state that holds them.
std::vector<ops::ZayaBalancer> trained_balancers(const ModelConfig& config) {
  const ops::ZayaBalancerOptions o = balancer_options(config);
  std::vector<ops::ZayaBalancer> balancers;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    balancers.emplace_back(config.n_experts, config.router_skip_class, o);
    std::vector<int64_t> counts(static_cast<size_t>(config.router_classes()), 1);
    counts[static_cast<size_t>(l)] = 9;
    const std::vector<int64_t> near(counts.size(), 2);  // boundary counts, for the newton rule
    for (int step = 0; step < 3; ++step)
      balancers.back().update(counts.data(), 8 + counts.size(), near.data());
  }
  return balancers;
}

json state_with(const std::vector<ops::ZayaBalancer>& balancers) {
  json layers = json::array();
  for (const auto& b : balancers)
    layers.push_back({{"bias", b.bias}, {"exp_avg", b.exp_avg}, {"exp_avg_sq", b.exp_avg_sq},
                      {"step", b.step}});
  return {{"step", 3}, {"router_balancers", layers}};
}

TEST_F(ExportTest, Zaya1ExportsAreTheModelFileVersionOneWroteFromEitherVersion) {
  const ModelConfig config = testing::tiny_zaya_config();
  config.validate("tiny_zaya_config");
  const ParamTable table(config);
  const std::vector<float> params = testing::random_slab(table.total_elements(), 3);
  const std::vector<ops::ZayaBalancer> balancers = trained_balancers(config);
  const json state = state_with(balancers);
  const std::string v1 = save_checkpoint(root_ + "/v1", 3, config, table, params.data(), {}, state,
                                         0, balancing_bias_tensors(balancers));
  const std::string v2 =
      testing::save_from_ranks(root_ + "/v2", 3, 3, config, {{"", &params, {}}}, state);
  export_hf_model(v1, root_ + "/hf1");
  export_hf_model(v2, root_ + "/hf2");
  const std::vector<uint8_t> written = read_binary_file(v1 + "/model.safetensors");
  EXPECT_EQ(read_binary_file(root_ + "/hf1/model.safetensors"), written);
  EXPECT_EQ(read_binary_file(root_ + "/hf2/model.safetensors"), written);
  const SafetensorsReader file(root_ + "/hf2/model.safetensors");
  const TensorView& bias = file.get("model.layers.1.mlp.gate.balancing_biases");
  EXPECT_EQ(std::memcmp(bias.data, balancers[1].bias.data(), bias.bytes), 0);
}

TEST_F(ExportTest, AnOutputThatIsNotAnEmptyDirectoryIsRefusedAndLeftAsItWas) {
  const ModelConfig config = testing::tiny_moe_config();
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 4);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 1, 1, config, {{"", &params, {}}}, {{"step", 1}});
  fs::create_directories(root_ + "/full");
  std::ofstream(root_ + "/full/keep.txt") << "mine";
  expect_error([&] { export_hf_model(dir, root_ + "/full"); }, "'" + root_ + "/full' is not empty");
  EXPECT_EQ(entries(root_ + "/full"), std::vector<std::string>{"keep.txt"});
  std::ofstream(root_ + "/file") << "x";
  expect_error([&] { export_hf_model(dir, root_ + "/file"); }, "is not a directory");
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"file", "full", "run"}));

  fs::create_directories(root_ + "/empty");
  export_hf_model(dir, root_ + "/empty/");  // an empty directory is fine
  EXPECT_TRUE(path_exists(root_ + "/empty/model.safetensors"));
}

TEST_F(ExportTest, ALinkToAnEmptyDirectoryExportsIntoThatDirectory) {
  const ModelConfig config = testing::tiny_moe_config();
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 4);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 1, 1, config, {{"", &params, {}}}, {{"step", 1}});
  fs::create_directories(root_ + "/models/empty");
  fs::create_directory_symlink(root_ + "/models/empty", root_ + "/link");
  export_hf_model(dir, root_ + "/link");
  EXPECT_TRUE(fs::is_symlink(root_ + "/link"));
  EXPECT_EQ(entries(root_ + "/models/empty"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(entries(root_ + "/models"), std::vector<std::string>{"empty"});

  fs::create_directory_symlink(root_ + "/missing", root_ + "/dangling");
  expect_error([&] { export_hf_model(dir, root_ + "/dangling"); },
               "'" + root_ + "/dangling' is a symbolic link to a missing path");
  EXPECT_FALSE(fs::exists(root_ + "/missing"));
}

// The working directory, empty, as "." (or a directory as "dir/."): the files go into it, the
// directory stays the same one (a shell in it is not left in a removed directory).
TEST_F(ExportTest, TheEmptyWorkingDirectoryTakesTheExportInPlace) {
  const ModelConfig config = testing::tiny_moe_config();
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 4);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 1, 1, config, {{"", &params, {}}}, {{"step", 1}});
  fs::create_directories(root_ + "/here");
  struct stat before {};
  ASSERT_EQ(::stat((root_ + "/here").c_str(), &before), 0);
  const fs::path cwd = fs::current_path();
  fs::current_path(root_ + "/here");
  try {
    export_hf_model(dir, ".");
  } catch (...) {
    fs::current_path(cwd);
    throw;
  }
  fs::current_path(cwd);
  struct stat after {};
  ASSERT_EQ(::stat((root_ + "/here").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the directory itself was replaced";
  EXPECT_EQ(entries(root_ + "/here"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"here", "run"}));  // no staging left

  fs::create_directories(root_ + "/other");
  export_hf_model(dir, root_ + "/other/.");
  EXPECT_EQ(entries(root_ + "/other"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_error([&] { export_hf_model(dir, root_ + "/other/."); }, "is not empty");
}

TEST_F(ExportTest, AFailedExportLeavesNothingBehind) {
  const ModelConfig config = testing::tiny_moe_config();
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 5);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 2, 2, config, {{"", &params, {}}}, {{"step", 2}});
  const json metadata = read_sharded_metadata(dir);
  int64_t offset = -1;
  for (const json& p : metadata["pieces"])
    if (p["file"] == 1) offset = p["byte_offset"].get<int64_t>() + 4;
  ASSERT_GE(offset, 0);
  {
    std::fstream f(dir + "/rank_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(offset);
    f.get(c);
    f.seekp(offset);
    f.put(static_cast<char>(c ^ 0x10));
  }
  // Into missing parents: they go too.
  expect_error([&] { export_hf_model(dir, root_ + "/new/deep/hf"); }, "rank_00001.bin: bytes [");
  EXPECT_EQ(entries(root_), std::vector<std::string>{"run"});
}

// What an export killed before it finished left (OUT.tmp-HOST-PID of a process of this host
// that is gone) is removed by the next export to OUT; a live process's, or another host's,
// staging is left alone.
TEST_F(ExportTest, AKilledExportsStagingIsRemovedByTheNext) {
  const ModelConfig config = testing::tiny_moe_config();
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 5);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 2, 1, config, {{"", &params, {}}}, {{"step", 2}});
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ::waitpid(gone, nullptr, 0);
  const std::string dead = fmt::format("{}/hf.tmp-{}-{}", root_, host_name(), gone);
  const std::string live = fmt::format("{}/hf.tmp-{}-{}", root_, host_name(), ::getppid());
  const std::string other_host = fmt::format("{}/hf.tmp-elsewhere-{}", root_, gone);
  make_dirs(other_host);
  make_dirs(dead);
  make_dirs(live);
  write_file_atomic(dead + "/model.safetensors", "partial");
  export_hf_model(dir, root_ + "/hf");
  EXPECT_FALSE(path_exists(dead));
  EXPECT_TRUE(path_exists(live));
  EXPECT_TRUE(path_exists(other_host));  // another host's export, maybe running
  EXPECT_TRUE(path_exists(root_ + "/hf/model.safetensors"));
}

TEST_F(ExportTest, AModelNoHuggingFaceClassReadsIsRefusedBeforeAnythingIsWritten) {
  ModelConfig config = testing::tiny_moe_config();
  config.qk_norm = QkNorm::full;
  const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 5);
  const std::string dir =
      testing::save_from_ranks(root_ + "/run", 2, 1, config, {{"", &params, {}}}, {{"step", 2}});
  expect_error([&] { export_hf_model(dir, root_ + "/hf"); }, "model.qk_norm = \"full\"");
  EXPECT_EQ(entries(root_), std::vector<std::string>{"run"});
}

// Settings Mixtral has no key for: its model would compute something else.
TEST_F(ExportTest, ASettingTheHuggingFaceClassCannotExpressIsRefused) {
  for (const auto& [setting, expected] :
       std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>>{
           {[](ModelConfig& c) { c.norm_topk_prob = false; }, "model.norm_topk_prob = false"},
           {[](ModelConfig& c) { c.rope_fraction = 0.5; }, "model.rope_fraction = 0.5"}}) {
    ModelConfig config = testing::tiny_moe_config();
    setting(config);
    const std::vector<float> params = testing::random_slab(ParamTable(config).total_elements(), 5);
    const std::string dir =
        testing::save_from_ranks(root_ + "/run", 1, 1, config, {{"", &params, {}}}, {{"step", 2}});
    expect_error([&] { export_hf_model(dir, root_ + "/hf"); }, expected);
    EXPECT_EQ(entries(root_), std::vector<std::string>{"run"});
    remove_all(root_ + "/run");
  }
}

TEST_F(ExportTest, ADirectoryThatIsNotACheckpointIsNamed) {
  expect_error([&] { export_hf_model(root_ + "/nothing", root_ + "/hf"); },
               "checkpoint '" + root_ + "/nothing' does not exist");
  expect_error([&] { export_hf_model(root_, root_ + "/hf"); },
               "'" + root_ + "' is not a Foundry checkpoint");
}

}  // namespace
}  // namespace foundry
