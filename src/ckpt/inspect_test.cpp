#include "ckpt/inspect.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/hash.h"
#include "base/io.h"
#include "base/test_expect_error.h"
#include "ckpt/checkpoint.h"
#include "ckpt/test_support.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

class InspectTest : public testing::CheckpointDirTest {
 protected:
  void SetUp() override {
    CheckpointDirTest::SetUp();
    run_dir_ = root_ + "/run";
  }
  // As a Muon run saves: momentum for the matrices it updates, AdamW moments for the rest.
  // `drop`: a Muon matrix whose momentum is left out.
  std::string save_muon_like(int ranks, const std::string& drop = "") {
    auto adamw = [](const ParamInfo& p) { return !is_muon_matrix(p); };
    auto muon = [drop](const ParamInfo& p) { return is_muon_matrix(p) && p.name != drop; };
    return testing::save_from_ranks(run_dir_, 5, ranks, config_,
                                    {{"", &params_, {}},
                                     {"exp_avg", &state_, adamw},
                                     {"exp_avg_sq", &state_, adamw},
                                     {"muon_momentum", &state_, muon}},
                                    {{"step", 5}, {"optimizer", "muon"}});
  }
  std::vector<std::string> names_where(const std::function<bool(const ParamInfo&)>& pred) const {
    std::vector<std::string> names;
    for (const ParamInfo& p : table_.params())
      if (pred(p)) names.push_back(p.name);
    return names;
  }

  ModelConfig config_ = testing::tiny_moe_config();
  ParamTable table_{config_};
  std::vector<float> params_ = testing::random_slab(table_.total_elements(), 1);
  std::vector<float> state_ = testing::random_slab(table_.total_elements(), 2);
  std::string run_dir_;  // under root_, set in SetUp
};

// What the loaders would refuse is a problem for info and verify too: tensors of another shape
// than the recorded model's, and an AdamW run without both moments of every parameter.
TEST_F(InspectTest, ShapesOtherThanTheModelsAndMissingAdamWMomentsAreProblems) {
  const std::string adam = testing::save_from_ranks(run_dir_, 3, 2, config_,
                                                    {{"", &params_, {}}, {"exp_avg", &state_, {}}},
                                                    {{"step", 3}, {"optimizer", "adamw"}});
  const CheckpointInfo without = inspect_checkpoint(adam);
  ASSERT_EQ(without.problems.size(), 1u) << fmt::format("{}", fmt::join(without.problems, "; "));
  EXPECT_EQ(without.problems[0], "the AdamW run saved no exp_avg_sq");
  expect_error([&] { verify_checkpoint_data(adam); }, "the AdamW run saved no exp_avg_sq");

  // Tensors saved from a model of d_model 2·C, described as the config's (C).
  ModelConfig wider = config_;
  wider.d_model *= 2;
  const ParamTable wide(wider);
  const std::vector<float> values = testing::random_slab(wide.total_elements(), 3);
  const std::string staging = staging_dir(run_dir_, 4, "test");
  const json shard =
      write_rank_shard(staging, 0, wide, {{"", 0, wide.total_elements(), values.data()}});
  const std::string dir = commit_sharded_checkpoint(run_dir_, staging, 4, config_, wide, {shard},
                                                    {{"step", 4}}, {1, 1, false}, 0);
  const CheckpointInfo info = inspect_checkpoint(dir);
  const ParamInfo& embed = table_.params().front();
  ASSERT_EQ(info.problems.size(), 1u) << fmt::format("{}", fmt::join(info.problems, "; "));
  EXPECT_EQ(
      info.problems[0],
      fmt::format("{} tensors are of another shape or type than the model of this "
                  "checkpoint's config: '{}' is [{}, {}] where the model needs F32 [{}, {}], ...",
                  table_.params().size(), embed.name, embed.shape[0], wider.d_model, embed.shape[0],
                  embed.shape[1]));
}

// A Muon run keeps momentum for every matrix it updates: one without it is a problem (a resume
// would refuse the checkpoint), not "a parameter its optimizer keeps none for".
TEST_F(InspectTest, AMuonRunWithoutAMatrixsMomentumIsAProblem) {
  const std::vector<std::string> muon = names_where(is_muon_matrix);
  ASSERT_GT(muon.size(), 1u);
  const std::string dir = save_muon_like(2, muon[1]);
  const CheckpointInfo info = inspect_checkpoint(dir);
  ASSERT_EQ(info.problems.size(), 1u) << fmt::format("{}", fmt::join(info.problems, "; "));
  EXPECT_EQ(info.problems[0],
            fmt::format("the Muon run saved no muon_momentum for 1 of the {} parameters it keeps "
                        "one for: {}",
                        muon.size(), muon[1]));
  expect_error([&] { verify_checkpoint_data(dir); }, "the Muon run saved no muon_momentum");
}

TEST_F(InspectTest, InfoOfVersionTwoListsLayoutSlabsWhatEachLacksAndFiles) {
  const std::string dir = save_muon_like(3);
  const CheckpointInfo info = inspect_checkpoint(dir);
  EXPECT_EQ(info.format_version, 2);
  EXPECT_TRUE(info.committed);
  EXPECT_EQ(info.step, 5);
  ASSERT_TRUE(info.layout.has_value());
  EXPECT_EQ(info.layout->world, 3);
  EXPECT_TRUE(info.layout->zero1);
  EXPECT_EQ(info.optimizer, "muon");
  EXPECT_EQ(info.model_tensors, static_cast<int64_t>(table_.params().size()));
  EXPECT_EQ(info.model_parameters, table_.parameter_count());
  ASSERT_EQ(info.slabs.size(), 4u);
  EXPECT_EQ(info.slabs[0].name, "params");
  EXPECT_EQ(info.slabs[0].tensors, info.model_tensors);
  EXPECT_EQ(info.slabs[0].bytes, table_.parameter_count() * 4);
  EXPECT_TRUE(info.slabs[0].without.empty());
  const auto matrices = names_where(is_muon_matrix);
  const auto vectors = names_where([](const ParamInfo& p) { return !is_muon_matrix(p); });
  EXPECT_EQ(info.slabs[1].name, "exp_avg");
  EXPECT_EQ(info.slabs[1].without, matrices);
  EXPECT_EQ(info.slabs[2].name, "exp_avg_sq");
  EXPECT_EQ(info.slabs[3].name, "muon_momentum");
  EXPECT_EQ(info.slabs[3].without, vectors);
  EXPECT_TRUE(info.extra_tensors.empty());
  EXPECT_TRUE(info.problems.empty()) << info.problems.front();

  std::vector<std::string> files;
  int64_t total = 0;
  for (const SavedFile& f : info.files) {
    files.push_back(f.name);
    EXPECT_EQ(f.bytes, static_cast<int64_t>(fs::file_size(dir + "/" + f.name))) << f.name;
    total += f.bytes;
  }
  EXPECT_EQ(files, (std::vector<std::string>{"rank_00000.bin", "rank_00001.bin", "rank_00002.bin",
                                             "metadata.json", "config.json", "COMMITTED"}));
  EXPECT_EQ(info.total_bytes, total);

  const std::string text = format_checkpoint_info(info);
  EXPECT_NE(text.find("version 2 (sharded), committed"), std::string::npos) << text;
  EXPECT_NE(text.find("3 ranks, expert_parallel 1, ZeRO-1 on"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("note: no exp_avg, exp_avg_sq for {} of", matrices.size())),
            std::string::npos)
      << text;
  const json j = to_json(info);
  EXPECT_EQ(j["slabs"][3]["without"], json(vectors));
  EXPECT_EQ(j["model"]["arch"], "moe");
}

TEST_F(InspectTest, InfoOfVersionOneListsItsFiles) {
  const std::string dir = save_checkpoint(run_dir_, 7, config_, table_, params_.data(),
                                          {{"exp_avg", state_.data()}}, {{"step", 7}}, 0);
  const CheckpointInfo info = inspect_checkpoint(dir);
  EXPECT_EQ(info.format_version, 1);
  EXPECT_EQ(info.step, 7);
  EXPECT_FALSE(info.layout.has_value());
  ASSERT_EQ(info.slabs.size(), 2u);
  EXPECT_EQ(info.slabs[1].name, "exp_avg");
  EXPECT_EQ(info.slabs[1].tensors, info.model_tensors);
  std::vector<std::string> files;
  for (const SavedFile& f : info.files) files.push_back(f.name);
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors",
                                             "optimizer.safetensors", "trainer_state.json",
                                             "manifest.json", "COMMITTED"}));
  EXPECT_TRUE(info.problems.empty());
  EXPECT_NE(format_checkpoint_info(info).find("not recorded (format version 1)"),
            std::string::npos);
  const VerifyReport report = verify_checkpoint_data(dir);
  EXPECT_EQ(report.files, 4);

  // A diverged run's values are counted per tensor, as in version 2 (the slabs above are
  // random bit patterns, NaN among them; these are finite but for the ones set).
  std::vector<float> diverged(params_.size(), 0.5f), moments(state_.size(), -0.25f);
  const ParamInfo& last = table_.params().back();
  diverged[last.offset] = NAN;
  diverged[last.offset + 1] = INFINITY;
  moments[0] = NAN;
  const std::string bad = save_checkpoint(run_dir_, 8, config_, table_, diverged.data(),
                                          {{"exp_avg", moments.data()}}, {{"step", 8}}, 0);
  const VerifyReport counted = verify_checkpoint_data(bad);
  EXPECT_EQ(counted.non_finite,
            (std::map<std::string, int64_t>{{last.name, 2},
                                            {table_.params().front().name + ".exp_avg", 1}}));
}

// Rewrites metadata.json without tensor `name` and commits it again.
void drop_tensor(const std::string& dir, const std::string& name) {
  json m = load_json_file(dir + "/metadata.json");
  m["tensors"].erase(name);
  json pieces = json::array();
  for (const json& p : m["pieces"])
    if (p["tensor"] != name) pieces.push_back(p);
  m["pieces"] = pieces;
  const std::string text = m.dump(2) + "\n";
  write_file_atomic(dir + "/metadata.json", text);
  write_file_atomic(dir + "/COMMITTED",
                    json{{"format_version", 2},
                         {"metadata_xxh3_64", hash64_hex(hash64(text.data(), text.size()))}}
                        .dump());
}

TEST_F(InspectTest, AMissingParameterIsAProblemAndFailsVerify) {
  const std::string dir = save_muon_like(2);
  drop_tensor(dir, "model.norm.weight");
  const CheckpointInfo info = inspect_checkpoint(dir);
  ASSERT_EQ(info.problems.size(), 1u);
  EXPECT_NE(info.problems[0].find("1 of"), std::string::npos) << info.problems[0];
  EXPECT_NE(info.problems[0].find("parameters are not saved: model.norm.weight"),
            std::string::npos)
      << info.problems[0];
  expect_error([&] { verify_checkpoint_data(dir); }, "not saved: model.norm.weight");
}

TEST_F(InspectTest, AnUnknownFormatVersionIsRefusedNotDescribed) {
  const std::string dir = save_muon_like(2);
  json m = load_json_file(dir + "/metadata.json");
  m["format_version"] = 3;
  const std::string text = m.dump(2) + "\n";
  write_file_atomic(dir + "/metadata.json", text);
  write_file_atomic(dir + "/COMMITTED",
                    json{{"format_version", 2},
                         {"metadata_xxh3_64", hash64_hex(hash64(text.data(), text.size()))}}
                        .dump());
  expect_error([&] { inspect_checkpoint(dir); }, "format_version 3 is not supported");
  expect_error([&] { verify_checkpoint_data(dir); }, "format_version 3 is not supported");
}

TEST_F(InspectTest, VerifyCountsWhatItCheckedAndNamesTheFaultyFileAndBytes) {
  const std::string dir = save_muon_like(3);
  const json m = read_sharded_metadata(dir);
  const VerifyReport report = verify_checkpoint_data(dir);
  EXPECT_EQ(report.format_version, 2);
  EXPECT_EQ(report.files, 3);
  EXPECT_EQ(report.pieces, static_cast<int64_t>(m["pieces"].size()));
  int64_t bytes = 0;
  for (const json& p : m["pieces"]) bytes += p["byte_length"].get<int64_t>();
  EXPECT_EQ(report.bytes, bytes);
  EXPECT_NE(format_verify_report(dir, report).find("pieces in 3 files"), std::string::npos);

  const int64_t offset = m["pieces"][0]["byte_offset"].get<int64_t>();
  {
    std::fstream f(dir + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(offset);
    f.get(c);
    f.seekp(offset);
    f.put(static_cast<char>(c ^ 1));
  }
  expect_error([&] { verify_checkpoint_data(dir); },
               fmt::format("rank_00000.bin: bytes [{}, ", offset));
  fs::resize_file(dir + "/rank_00002.bin", fs::file_size(dir + "/rank_00002.bin") - 8);
  expect_error([&] { verify_checkpoint_data(dir); }, "rank_00002.bin has");
  const CheckpointInfo info = inspect_checkpoint(dir);  // info still shows it, with the problem
  ASSERT_EQ(info.problems.size(), 1u);
  EXPECT_NE(info.problems[0].find("rank_00002.bin has"), std::string::npos);
}

TEST_F(InspectTest, AnUncommittedCheckpointIsAProblem) {
  const std::string dir = save_muon_like(1);
  fs::remove(dir + "/COMMITTED");
  const CheckpointInfo info = inspect_checkpoint(dir);
  EXPECT_FALSE(info.committed);
  ASSERT_EQ(info.problems.size(), 1u);
  EXPECT_NE(info.problems[0].find("no COMMITTED marker"), std::string::npos);
  expect_error([&] { verify_checkpoint_data(dir); }, "no COMMITTED marker");
}

TEST_F(InspectTest, ARunDirectoryIsNotACheckpointAndTheHintNamesOne) {
  save_muon_like(1);
  try {
    inspect_checkpoint(run_dir_);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + run_dir_ + "' is not a Foundry checkpoint"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find(run_dir_ + "/checkpoints/step_00000005"), std::string::npos)
        << e.hint();
  }
  expect_error([&] { inspect_checkpoint(root_ + "/none"); }, "does not exist");
}

}  // namespace
}  // namespace foundry
