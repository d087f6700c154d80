#include "train/run_config.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/test_expect_error.h"

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

}  // namespace
}  // namespace foundry
