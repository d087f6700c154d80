#include "train/run_config.h"

#include <gtest/gtest.h>

#include <tuple>

#include "base/error.h"
#include "base/io.h"
#include "base/test_expect_error.h"
#include "base/test_temp_dir.h"

namespace foundry {
namespace {

constexpr double kTol = 1e-15;

json minimal_config() {
  return json::parse(R"({"model": {"vocab_size": 64, "d_model": 16, "n_layers": 1, "n_heads": 2,
                          "n_kv_heads": 2, "n_experts": 2, "top_k": 1, "ffn_dim": 16,
                          "max_seq_len": 32},
                         "train": {"seq_len": 8}})");
}

TEST(RunConfig, ScheduleFromTrainConfig) {
  TrainConfig t;
  t.lr = 2e-3;
  t.min_lr_ratio = 0.0;
  t.warmup_steps = 20;
  t.steps = 220;
  t.schedule = ScheduleKind::cosine;
  EXPECT_NEAR(learning_rate(lr_schedule(t), 1), 1e-4, kTol);
  EXPECT_NEAR(learning_rate(lr_schedule(t), 120), 1e-3, kTol);
  EXPECT_NEAR(learning_rate(lr_schedule(t), 220), 0.0, kTol);
}

TEST(RunConfig, ChoicesAreParsedIntoTypedValues) {
  json j = minimal_config();
  RunConfig defaults = parse_run_config(j, "test");
  EXPECT_EQ(defaults.train.precision, DType::bf16);
  EXPECT_EQ(defaults.train.optimizer, OptimizerKind::adamw);
  EXPECT_EQ(defaults.train.muon_ns_precision, DType::bf16);
  j["train"]["precision"] = "fp32";
  j["train"]["optimizer"] = "muon";
  j["train"]["muon_ns_precision"] = "fp32";
  RunConfig rc = parse_run_config(j, "test");
  EXPECT_EQ(rc.train.precision, DType::f32);
  EXPECT_EQ(rc.train.optimizer, OptimizerKind::muon);
  EXPECT_EQ(rc.train.muon_ns_precision, DType::f32);
  EXPECT_STREQ(dtype_name(rc.train.precision), "fp32");
  EXPECT_STREQ(optimizer_name(rc.train.optimizer), "muon");
}

TEST(RunConfig, AnomalyKeys) {
  json j = minimal_config();
  const RunConfig defaults = parse_run_config(j, "test");
  EXPECT_EQ(defaults.train.anomaly_policy, AnomalyPolicy::skip);
  EXPECT_TRUE(defaults.train.skip_batches.empty());
  j["train"]["anomaly_policy"] = "rollback";
  j["train"]["spike_factor"] = 0;
  j["train"]["spike_window"] = 4;
  j["train"]["spike_warmup"] = 4;
  j["train"]["max_consecutive_anomalies"] = 2;
  j["train"]["max_anomalies"] = 0;
  j["train"]["skip_batches"] = {17, 3};
  const RunConfig rc = parse_run_config(j, "test");
  EXPECT_EQ(rc.train.anomaly_policy, AnomalyPolicy::rollback);
  EXPECT_EQ(rc.train.spike_factor, 0.0);
  EXPECT_EQ(rc.train.max_anomalies, 0);
  EXPECT_EQ(rc.train.skip_batches, (std::vector<int64_t>{17, 3}));
  for (const auto& [key, value, needle] :
       std::vector<std::tuple<std::string, json, std::string>>{
           {"anomaly_policy", "ignore", "train.anomaly_policy"},
           {"spike_warmup", 5, "train.spike_warmup = 5 exceeds train.spike_window = 4"},
           {"skip_batches", json::array({1, 2.5}), "train.skip_batches holds 2.5"},
           {"skip_batches", json::array({0}), "train.skip_batches holds 0"},
           {"skip_batches", 3, "train.skip_batches = 3 is not a list"},
           {"max_consecutive_anomalies", 0, "train.max_consecutive_anomalies"}}) {
    json bad = j;
    bad["train"][key] = value;
    expect_error([&] { parse_run_config(bad, "test"); }, needle);
  }
}

TEST(RunConfig, ScheduleAndPrecisionAreParsedOnce) {
  json j = minimal_config();
  j["train"]["schedule"] = "wsd";
  j["train"]["precision"] = "float32";
  j["train"]["muon_ns_precision"] = "bfloat16";
  const RunConfig rc = parse_run_config(j, "test");
  EXPECT_EQ(rc.train.schedule, ScheduleKind::wsd);
  EXPECT_EQ(lr_schedule(rc.train).kind, ScheduleKind::wsd);
  EXPECT_EQ(rc.train.precision, DType::f32);
  EXPECT_EQ(rc.train.muon_ns_precision, DType::bf16);
  j["train"]["precision"] = "fp8";
  expect_error([&] { parse_run_config(j, "test"); },
               "test: 'train.precision' = \"fp8\" is not one of: fp32, bf16");
  j["train"]["precision"] = "fp32";
  j["train"]["schedule"] = "linear";
  expect_error([&] { parse_run_config(j, "test"); },
               "test: 'train.schedule' = \"linear\" is not one of: cosine, wsd, constant");
}

// A file may leave out whole sections of defaults: --set makes them; a misspelt section is the
// override's error, not the file's.
// The ZAYA1 balancer's settings shape training: a resume names their changes like train's.
TEST(RunConfig, BalancerChangesNameTheZaya1BalancerSettings) {
  ModelConfig before;
  before.arch = Arch::zaya1;
  ModelConfig now = before;
  EXPECT_TRUE(balancer_changes(before, now).empty());
  now.balance_rule = "adamw";
  now.balance_bias_lr = 0.5;
  EXPECT_EQ(balancer_changes(before, now),
            (std::vector<std::string>{"model.balance_rule: newton -> adamw",
                                      "model.balance_bias_lr: 0 -> 0.5"}));
  before.arch = now.arch = Arch::moe;  // no balancer
  EXPECT_TRUE(balancer_changes(before, now).empty());
}

TEST(RunConfig, OverridesMakeTheSectionsAFileLeavesOut) {
  testing::TempDir dir;
  write_file_atomic(dir.file("empty.json"), "{}\n");
  const RunConfig rc =
      load_run_config(dir.file("empty.json"), {"model.d_model=64", "train.batch_size=3"});
  EXPECT_EQ(rc.model.d_model, 64);
  EXPECT_EQ(rc.train.batch_size, 3);
  expect_error([&] { load_run_config(dir.file("empty.json"), {"trian.lr=1"}); },
               "bad override 'trian.lr=1': unknown section 'trian'");
  expect_error([&] { load_run_config(dir.file("empty.json"), {"steps=5"}); },
               "bad override 'steps=5': unknown section 'steps'");
  expect_error([&] { load_run_config(dir.file("empty.json"), {"lr"}); }, "expected key=value");
  expect_error([&] { load_run_config(dir.file("empty.json"), {"train.nope.x=1"}); },
               "unknown key 'train.nope.x'");
}

TEST(RunConfig, UnknownChoiceNamesTheKeyAndTheChoices) {
  json j = minimal_config();
  j["train"]["optimizer"] = "sgd";
  try {
    parse_run_config(j, "test");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.optimizer"), std::string::npos) << what;
    EXPECT_NE(what.find("sgd"), std::string::npos) << what;
    EXPECT_NE(what.find("muon"), std::string::npos) << what;
  }
}

TEST(RunConfig, TrajectoryChangesNameTheSettingsThatShapeTheRun) {
  TrainConfig before, now;
  EXPECT_TRUE(trajectory_changes(before, now).empty());
  now.steps = before.steps * 2;  // operational: free to change on a resume
  now.log_every = 3;
  now.skip_batches = {7};
  EXPECT_TRUE(trajectory_changes(before, now).empty());
  now.lr = 1e-3;
  now.precision = before.precision == DType::bf16 ? DType::f32 : DType::bf16;
  now.seed = before.seed + 1;
  const std::vector<std::string> changes = trajectory_changes(before, now);
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0], fmt::format("train.seed: {} -> {}", before.seed, now.seed));
  EXPECT_EQ(changes[1], fmt::format("train.precision: {} -> {}", dtype_name(before.precision),
                                    dtype_name(now.precision)));
  EXPECT_EQ(changes[2], fmt::format("train.lr: {} -> 0.001", before.lr));
}

}  // namespace
}  // namespace foundry
