// The anomaly detector (window, threshold, warm-up, non-finite values), the monitor's budget,
// record and checkpoint state, the fault injection's syntax, and a vetoed training step.
#include "train/anomaly.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "base/io.h"
#include "train/events.h"
#include "train/optimizer_config.h"
#include "train/test_support.h"
#include "train/trainer.h"

namespace foundry {
namespace {

using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(AnomalyDetector, NonFiniteLossThenGradientNormAreAnomaliesFromTheFirstStep) {
  AnomalyDetector d(2.0, 4, 2);
  EXPECT_EQ(d.check(kNaN, 1.0), AnomalyKind::nan_loss);
  EXPECT_EQ(d.check(kInf, kNaN), AnomalyKind::nan_loss);
  EXPECT_EQ(d.check(3.0, kNaN), AnomalyKind::nan_grad);
  EXPECT_EQ(d.check(3.0, -kInf), AnomalyKind::nan_grad);
  EXPECT_EQ(d.check(1e30, 1.0), AnomalyKind::none);  // no baseline yet
}

TEST(AnomalyDetector, SpikesAreMeasuredAgainstTheMedianOfTheWindowAfterTheWarmUp) {
  AnomalyDetector d(2.0, 4, 3);
  d.accept(5.0);
  d.accept(4.0);
  EXPECT_TRUE(std::isnan(d.baseline())) << "warming up: 2 of 3 losses";
  EXPECT_EQ(d.check(100.0, 1.0), AnomalyKind::none);
  d.accept(100.0);  // an outlier in the window does not move the median far
  EXPECT_EQ(d.baseline(), 5.0);
  EXPECT_EQ(d.check(10.0, 1.0), AnomalyKind::none);  // not above 2 × 5
  EXPECT_EQ(d.check(10.5, 1.0), AnomalyKind::spike);
  d.accept(3.0);  // 4 losses: the mean of the middle two
  EXPECT_EQ(d.baseline(), 4.5);
  d.accept(2.0);  // the window keeps the last 4: 4, 100, 3, 2
  EXPECT_EQ(d.baseline(), 3.5);
  EXPECT_EQ(d.threshold(), 7.0);
  EXPECT_EQ(d.check(7.5, 1.0), AnomalyKind::spike);
}

TEST(AnomalyDetector, FactorZeroTurnsSpikesOffAndTheWindowRoundTrips) {
  AnomalyDetector off(0.0, 4, 1);
  off.accept(1.0);
  EXPECT_EQ(off.check(1e9, 1.0), AnomalyKind::none);
  EXPECT_EQ(off.check(1.0, kInf), AnomalyKind::nan_grad);

  AnomalyDetector a(2.0, 3, 2), b(2.0, 3, 2);
  for (double l : {0.1, 0.30000000000000004, 7.25, 1.0 / 3}) a.accept(l);
  b.restore(json::parse(a.state().dump()));
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.baseline(), a.baseline());
  b.restore(json());
  EXPECT_TRUE(std::isnan(b.baseline()));
}

TEST(TrainFaults, ParsesTheListAndRejectsMalformedEntries) {
  EXPECT_TRUE(TrainFaults::parse("").empty());
  EXPECT_FALSE(TrainFaults::parse("nan_grad@3,loss_spike@12,nan_loss@1").empty());
  EXPECT_FALSE(TrainFaults::parse("sigterm@0").empty());  // while the run starts
  for (const char* bad :
       {"nan_grad", "nan_grad@", "nan_grad@0", "loss_spike@0", "sigterm@-1", "nan_grad@x", "nan@3",
        "nan_grad@3,", "nan_grad@3,,spike@2", "nan_gradx@3", "nan_grad@3x"}) {
    const Error e =
        testing::expect_error([&] { TrainFaults::parse(bad); }, {"FOUNDRY_TRAIN_FAULT"});
    EXPECT_NE(e.hint().find("loss_spike"), std::string::npos) << bad;
  }
}

// A monitor on one process with its run directory.
struct MonitorFixture {
  explicit MonitorFixture(AnomalyPolicy policy, int64_t consecutive = 3, int64_t total = 10)
      : rc(testing::tiny_run_config(dir.path())),
        batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9) {
    rc.train.anomaly_policy = policy;
    rc.train.max_consecutive_anomalies = consecutive;
    rc.train.max_anomalies = total;
    rc.train.spike_warmup = 2;
    rc.train.skip_batches = {20};
    monitor.emplace(rc.train, nullptr, true, batches);
  }
  // Step `step` on the next batch with loss `loss` and gradient norm `norm`: was it vetoed?
  bool step(int64_t step, double loss, double norm) {
    const int64_t b = batches.next();
    ForwardResult f;
    f.loss = f.ce_loss = loss;
    return monitor->veto(step, b, f, norm);
  }
  TempDir dir;
  RunConfig rc;
  TrainBatches batches;
  std::optional<AnomalyMonitor> monitor;
};

TEST(AnomalyMonitor, SkipDropsTheBatchAndRecordsItWithEvents) {
  MonitorFixture f(AnomalyPolicy::skip);
  EXPECT_TRUE(f.batches.skipped().count(20)) << "train.skip_batches";
  EXPECT_FALSE(f.step(1, 5.0, 1.0));
  EXPECT_FALSE(f.step(2, 5.0, 1.0));
  EXPECT_TRUE(f.step(3, 5.0, kNaN));
  EXPECT_EQ(f.monitor->handle(), AnomalyAction::skip);
  EXPECT_TRUE(f.batches.skipped().count(3));
  EXPECT_TRUE(f.step(3, 50.0, 1.0)) << "a spike on batch 4";
  EXPECT_EQ(f.monitor->handle(), AnomalyAction::skip);
  const json record = load_json_file(f.dir.path() + "/skipped_batches.json");
  ASSERT_EQ(record["batches"].size(), 2u);
  EXPECT_EQ(record["batches"][0]["batch"], 3);
  EXPECT_EQ(record["batches"][0]["kind"], "nan_grad");
  EXPECT_TRUE(record["batches"][0]["grad_norm"].is_null());
  EXPECT_EQ(record["batches"][1]["batch"], 4);
  EXPECT_EQ(record["batches"][1]["kind"], "spike");
  EXPECT_EQ(record["batches"][1]["spike_threshold"], 10.0);
  const std::vector<json> events = read_events(f.dir.path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0]["event"], "anomaly");
  EXPECT_EQ(events[0]["step"], 3);
  EXPECT_EQ(events[0]["batch"], 3);
  EXPECT_EQ(events[0]["action"], "skip");
  EXPECT_EQ(events[1]["event"], "skip");
  EXPECT_EQ(events[3]["batch"], 4);

  // A later process of the run drops them too; a fresh run forgets them.
  TrainBatches resumed(nullptr, 4, f.rc.train.seq_len, 0, 1, f.rc.model.vocab_size, 9);
  AnomalyMonitor again(f.rc.train, nullptr, true, resumed);
  again.load_record();
  EXPECT_EQ(resumed.skipped(), (std::set<int64_t>{3, 4, 20}));
  again.clear_record();
  EXPECT_FALSE(path_exists(f.dir.path() + "/skipped_batches.json"));
}

TEST(AnomalyMonitor, ConsecutiveAnomaliesStopTheRunWithAReport) {
  MonitorFixture f(AnomalyPolicy::rollback, /*consecutive=*/2);
  EXPECT_TRUE(f.step(1, kNaN, 1.0));
  EXPECT_EQ(f.monitor->handle(), AnomalyAction::rollback);
  EXPECT_FALSE(f.step(1, 5.0, 1.0));  // a good step ends the streak
  EXPECT_TRUE(f.step(2, 5.0, kInf));
  EXPECT_EQ(f.monitor->handle(), AnomalyAction::rollback);
  EXPECT_TRUE(f.step(2, 5.0, kNaN));
  EXPECT_EQ(f.monitor->handle(), AnomalyAction::stop);
  EXPECT_FALSE(f.batches.skipped().count(4)) << "the batch the run stops on is not dropped";
  const Error e = testing::expect_error([&] { f.monitor->stop(); }, {"2 anomalies in a row"});
  EXPECT_NE(std::string(e.what()).find("step 2 (batch 3): gradient norm inf"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("step 2 (batch 4): gradient norm nan"), std::string::npos);
  EXPECT_NE(e.hint().find("--auto-resume --set 'train.skip_batches=[3,4]'"), std::string::npos)
      << e.hint();
  EXPECT_EQ(read_events(f.dir.path()).back()["event"], "stop");
}

TEST(AnomalyMonitor, TheTotalBudgetAndPolicyStop) {
  MonitorFixture budget(AnomalyPolicy::skip, 100, /*total=*/2);
  EXPECT_TRUE(budget.step(1, kNaN, 1.0));
  EXPECT_EQ(budget.monitor->handle(), AnomalyAction::skip);
  EXPECT_FALSE(budget.step(1, 5.0, 1.0));
  EXPECT_TRUE(budget.step(2, kNaN, 1.0));
  EXPECT_EQ(budget.monitor->handle(), AnomalyAction::stop);
  testing::expect_error([&] { budget.monitor->stop(); },
                        {"train.max_anomalies = 2", "step 2 (batch 3): loss nan",
                         "batches dropped earlier in the run: 1"});

  MonitorFixture stop(AnomalyPolicy::stop);
  EXPECT_TRUE(stop.step(1, 5.0, kNaN));
  EXPECT_EQ(stop.monitor->handle(), AnomalyAction::stop);
  const Error e =
      testing::expect_error([&] { stop.monitor->stop(); }, {"train.anomaly_policy = stop"});
  EXPECT_NE(e.hint().find("train.anomaly_policy=skip"), std::string::npos) << e.hint();
}

TEST(AnomalyMonitor, TrainerStateKeepsThePositionTheDroppedBatchesAndTheWindow) {
  MonitorFixture f(AnomalyPolicy::skip);
  for (int64_t s = 1; s <= 3; ++s) EXPECT_FALSE(f.step(s, 4.0 + s, 1.0));
  EXPECT_TRUE(f.step(4, 5.0, kNaN));
  f.monitor->handle();
  json state = {{"step", 3}};
  f.monitor->save_state(state);
  EXPECT_EQ(state["batch"], 4);
  EXPECT_EQ(state["skipped_batches"], json({4, 20}));

  TrainBatches other(nullptr, 4, f.rc.train.seq_len, 0, 1, f.rc.model.vocab_size, 9);
  AnomalyMonitor restored(f.rc.train, nullptr, true, other);
  other.skip(7);  // dropped since the checkpoint: kept
  restored.restore_state(state);
  EXPECT_EQ(other.batch(), 4);
  EXPECT_EQ(other.skipped(), (std::set<int64_t>{4, 7, 20}));
  json again = {{"step", 3}};
  restored.save_state(again);
  EXPECT_EQ(again["loss_window"], state["loss_window"]);
  // A checkpoint from before batch numbers: the batch is the step.
  restored.restore_state({{"step", 9}});
  EXPECT_EQ(other.batch(), 9);
}

// train.skip_batches naming a batch the checkpoint's run trained on cannot undo it: it is
// neither skipped nor recorded, and the resume says so; later ones are skipped.
TEST(AnomalyMonitor, ASkipOfABatchTrainedBeforeTheCheckpointIsNotRecordedAndSaidSo) {
  MonitorFixture f(AnomalyPolicy::skip);
  f.rc.train.skip_batches = {5, 12};
  TrainBatches batches(nullptr, 4, f.rc.train.seq_len, 0, 1, f.rc.model.vocab_size, 9);
  AnomalyMonitor resumed(f.rc.train, nullptr, true, batches);
  ::testing::internal::CaptureStderr();
  resumed.restore_state({{"step", 10}, {"batch", 10}, {"skipped_batches", json::array()}});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("train.skip_batches names batch(es) 5 that the run trained on before this "
                     "checkpoint (its last batch is 10)"),
            std::string::npos)
      << log;
  EXPECT_EQ(batches.skipped(), std::set<int64_t>{12});
  json state = {{"step", 10}};
  resumed.save_state(state);
  EXPECT_EQ(state["skipped_batches"], json({12}));
}

std::vector<float> slab(const Model& m) { return {m.params(), m.params() + m.slab_size()}; }

// A vetoed step changes nothing: the model, its router balancers and the optimizer continue
// as if it had not run, and the run equals the run without its batch. Batch 2 gets a NaN in
// its gradient (FOUNDRY_TRAIN_FAULT), batch 4 a loss spike.
TEST(RunStep, AnAnomalousStepChangesNothing) {
  TempDir dir;
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::muon}) {
    RunConfig rc = testing::tiny_run_config(dir.path(), /*zaya=*/true);
    rc.train.optimizer = kind;
    rc.train.spike_warmup = 1;
    Model model(rc.model, DType::f32), reference(rc.model, DType::f32);
    model.init_weights(3);
    reference.init_weights(3);
    auto optimizer = make_optimizer(model.table(), optimizer_options(rc.train), nullptr);
    auto ref_optimizer = make_optimizer(reference.table(), optimizer_options(rc.train), nullptr);
    TrainBatches batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9);
    TrainBatches ref_batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9);
    ::setenv("FOUNDRY_TRAIN_FAULT", "nan_grad@2,loss_spike@4", 1);
    AnomalyMonitor anomalies(rc.train, nullptr, true, batches);
    ::unsetenv("FOUNDRY_TRAIN_FAULT");
    ref_batches.skip(2);
    ref_batches.skip(4);
    for (int64_t step = 1; step <= 3; ++step) {
      for (;;) {
        batches.next();
        const json balancers = model.balancer_state();
        const std::vector<float> before = slab(model);
        const StepResult r = run_step(model, *optimizer, batches, 1e-2, step, 1.0, false,
                                      nullptr, {}, &anomalies);
        if (r.applied) break;
        EXPECT_TRUE(batches.batch() == 2 || batches.batch() == 4) << batches.batch();
        EXPECT_EQ(anomalies.handle(), AnomalyAction::skip);
        EXPECT_TRUE(slab(model) == before) << "batch " << batches.batch();
        EXPECT_EQ(model.balancer_state(), balancers);
      }
      ref_batches.next();
      EXPECT_EQ(batches.batch(), ref_batches.batch());
      run_step(reference, *ref_optimizer, ref_batches, 1e-2, step, 1.0, false, nullptr);
    }
    EXPECT_EQ(batches.batch(), 5);
    EXPECT_TRUE(slab(model) == slab(reference)) << optimizer_name(kind);
    EXPECT_EQ(model.balancer_state(), reference.balancer_state());
    const std::vector<json> events = read_events(dir.path());
    EXPECT_EQ(events.at(events.size() - 2)["kind"], "spike");
  }
}

}  // namespace
}  // namespace foundry
