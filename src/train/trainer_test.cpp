#include "train/trainer.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/io.h"
#include "base/rng.h"
#include "base/test_expect_error.h"
#include "kernels/gemm.h"
#include "model/info.h"
#include "train/optimizer_config.h"
#include "train/signals.h"
#include "train/test_support.h"

namespace foundry {
namespace {

using testing::TempDir;

std::vector<float> slab(const Model& m) { return {m.params(), m.params() + m.slab_size()}; }

class RunStepTest : public ::testing::TestWithParam<bool> {};  // arch zaya1 or moe

// run_step is the composition the model and optimizer document: zero, forward, backward,
// clipped step, weight refresh, balancers (arch zaya1).
TEST_P(RunStepTest, IsForwardBackwardStepAndBalancers) {
  const RunConfig rc = testing::tiny_run_config("unused", GetParam());
  Model model(rc.model, DType::f32), reference(rc.model, DType::f32);
  model.init_weights(3);
  reference.init_weights(3);
  auto optimizer = make_optimizer(model.table(), optimizer_options(rc.train), nullptr);
  auto ref_optimizer = make_optimizer(reference.table(), optimizer_options(rc.train), nullptr);
  TrainBatches batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9);
  for (int64_t step = 1; step <= 2; ++step) {
    batches.next();
    const StepResult r = run_step(model, *optimizer, batches, 1e-2, step, 1.0, false, nullptr);

    reference.zero_grads();
    const ForwardResult f = reference.forward(batches.local_inputs(), batches.local_targets(), 4,
                                              rc.train.seq_len);
    const std::vector<int64_t> counts = reference.router_class_counts();
    const std::vector<int64_t> near = reference.router_boundary_counts();
    reference.backward();
    const double norm = ref_optimizer->step(reference.params(), reference.grads(), 1e-2, step, 1.0);
    reference.sync_weights();
    if (!counts.empty())
      reference.update_balancers(counts.data(), 4 * rc.train.seq_len * rc.model.top_k,
                                 near.empty() ? nullptr : near.data());

    EXPECT_EQ(r.losses.loss, f.loss);
    EXPECT_EQ(r.losses.ce_loss, f.ce_loss);
    EXPECT_EQ(r.grad_norm, norm);
    EXPECT_EQ(r.lr, 1e-2);
    EXPECT_EQ(slab(model), slab(reference));
    if (GetParam()) {
      EXPECT_GT(r.balance.max_load_error, 0);
      EXPECT_EQ(model.balancer_state(), reference.balancer_state());
    }
  }
}

// Largest |a - b| over the largest |b|: 0 for equal slabs.
double relative_difference(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// Micro-batches: the step's gradient is the sum of the micro-batches' gradients, each loss
// weighted 1/n (the experts' gradients added, not written), so the whole batch's step up to
// rounding; the losses are their mean, the balancers see the whole batch's counts.
TEST_P(RunStepTest, MicroBatchesAccumulateTheWholeBatchsGradient) {
  RunConfig rc = testing::tiny_run_config("unused", GetParam());
  rc.model.aux_loss_coef = 0;  // a micro-batch's aux loss is its own, not the batch's
  Model model(rc.model, DType::f32), reference(rc.model, DType::f32);
  model.init_weights(3);
  reference.init_weights(3);
  auto optimizer = make_optimizer(model.table(), optimizer_options(rc.train), nullptr);
  auto ref_optimizer = make_optimizer(reference.table(), optimizer_options(rc.train), nullptr);
  TrainBatches batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9);
  for (int64_t step = 1; step <= 3; ++step) {
    batches.next();
    const StepResult whole = run_step(reference, *ref_optimizer, batches, 1e-2, step, 1.0, false,
                                      nullptr, {}, nullptr, /*micro_rows=*/0);
    const int64_t micro = step == 2 ? 2 : 1;  // four micro-batches, then two, then four
    const StepResult r =
        run_step(model, *optimizer, batches, 1e-2, step, 1.0, false, nullptr, {}, nullptr, micro);
    EXPECT_NEAR(r.losses.ce_loss, whole.losses.ce_loss, 1e-6 * whole.losses.ce_loss);
    EXPECT_NEAR(r.grad_norm, whole.grad_norm, 1e-5 * whole.grad_norm);
    EXPECT_LT(relative_difference(model.grads(), reference.grads(), model.slab_size()), 1e-5)
        << "step " << step;
    EXPECT_LT(relative_difference(model.params(), reference.params(), model.slab_size()), 1e-5)
        << "step " << step;
    if (GetParam()) {
      EXPECT_EQ(model.balancer_state(), reference.balancer_state());
    }
  }
  // Afterwards a whole batch's backward is the model's own again: its losses weighted 1.
  model.zero_grads();
  reference.zero_grads();
  const ForwardResult f =
      model.forward(batches.local_inputs(), batches.local_targets(), 4, rc.train.seq_len);
  const ForwardResult g =
      reference.forward(batches.local_inputs(), batches.local_targets(), 4, rc.train.seq_len);
  model.backward();
  reference.backward();
  EXPECT_NEAR(f.ce_loss, g.ce_loss, 1e-5 * g.ce_loss);
  EXPECT_LT(relative_difference(model.grads(), reference.grads(), model.slab_size()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Archs, RunStepTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Zaya1" : "Moe"; });

TEST(RunStep, NonFiniteLossStopsNamingTheStep) {
  RunConfig rc = testing::tiny_run_config("unused");
  Model model(rc.model, DType::f32);
  model.init_weights(3);
  model.params()[model.table().params().front().offset] = std::numeric_limits<float>::infinity();
  auto optimizer = make_optimizer(model.table(), optimizer_options(rc.train), nullptr);
  TrainBatches batches(nullptr, 4, rc.train.seq_len, 0, 1, rc.model.vocab_size, 9);
  batches.restart_after(6);
  batches.next();
  try {
    run_step(model, *optimizer, batches, 1e-2, 7, 1.0, false, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 7: loss"), std::string::npos) << e.what();
  }
}

std::vector<std::string> metrics_lines(const std::string& run_dir) {
  std::istringstream in(read_text_file(run_dir + "/metrics.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The loss fields of metrics lines (timings differ from run to run).
std::vector<json> losses(const std::vector<std::string>& lines) {
  std::vector<json> out;
  for (const std::string& l : lines) {
    const json j = json::parse(l);
    out.push_back({j.at("step"), j.at("loss"), j.at("grad_norm"), j.at("lr")});
  }
  return out;
}

TEST(Train, RunsWritesMetricsAndResumesBitwise) {
  TempDir whole_dir, split_dir;
  TrainOptions opt;
  opt.synthetic_data = true;
  opt.quiet = true;
  const TrainSummary whole = train(testing::tiny_run_config(whole_dir.path(), true), opt);
  EXPECT_EQ(whole.start_step, 0);
  EXPECT_EQ(whole.final_step, 6);
  EXPECT_FALSE(whole.interrupted);
  const auto lines = metrics_lines(whole_dir.path());
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(json::parse(lines.back()).at("loss").get<double>(), whole.last_train_loss);
  EXPECT_TRUE(path_exists(whole_dir.path() + "/config.json"));

  opt.stop_at_step = 3;
  const RunConfig split = testing::tiny_run_config(split_dir.path(), true);
  EXPECT_EQ(train(split, opt).final_step, 3);
  opt.stop_at_step = -1;
  opt.start = StartMode::resume;
  const TrainSummary resumed = train(split, opt);
  EXPECT_EQ(resumed.start_step, 3);
  EXPECT_EQ(resumed.final_step, 6);
  EXPECT_EQ(losses(metrics_lines(split_dir.path())), losses(lines));
}

// A ZAYA1 step's MFU counts the FLOPs it ran: its expert products only for the choices that
// did not go to the skip class.
TEST(Train, Zaya1MfuLeavesOutTheSkipClassesExpertProducts) {
  TempDir dir;
  TrainOptions opt;
  opt.synthetic_data = true;
  opt.quiet = true;
  const RunConfig rc = testing::tiny_run_config(dir.path(), true);
  ASSERT_TRUE(rc.model.router_skip_class);
  train(rc, opt);
  const double all = train_flops_per_token(rc.model, rc.train.seq_len);
  const double experts = expert_train_flops_per_token(rc.model);
  ASSERT_GT(experts, 0.1 * all);
  double most_skipped = 0;
  for (const std::string& line : metrics_lines(dir.path())) {
    const json m = json::parse(line);
    const double skip = m.at("skip_fraction").get<double>();
    most_skipped = std::max(most_skipped, skip);
    const double ran = m.at("tokens_per_s").get<double>() * (all - skip * experts);
    EXPECT_NEAR(m.at("mfu").get<double>(), ran / (m.at("peak_gflops").get<double>() * 1e9),
                1e-9 * m.at("mfu").get<double>())
        << line;
  }
  EXPECT_GT(most_skipped, 0);  // the skip class took some choices: the test tells the counts apart
}

TEST(Train, ValidatesTheLayoutFirst) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path());
  TrainOptions opt;
  opt.synthetic_data = true;
  rc.train.expert_parallel = 2;
  expect_error([&] { train(rc, opt); }, "train.expert_parallel = 2 needs that many MPI ranks");
  rc.train.expert_parallel = 1;
  opt.synthetic_data = false;
  expect_error([&] { train(rc, opt); }, "no dataset: data.dir is empty");
  EXPECT_FALSE(path_exists(dir.path() + "/metrics.jsonl"));
}

int g_previous_handler_calls = 0;
void previous_handler(int) { ++g_previous_handler_calls; }

TEST(StopSignals, CatchesSigtermWhileInstalledAndRestoresThePreviousHandler) {
  std::signal(SIGTERM, previous_handler);
  {
    StopSignals signals;
    EXPECT_EQ(signals.received(), 0);
    std::raise(SIGTERM);
    EXPECT_EQ(signals.received(), SIGTERM);
    EXPECT_EQ(signals.agreed(nullptr).signal, SIGTERM);
    EXPECT_EQ(g_previous_handler_calls, 0);
  }
  std::raise(SIGTERM);
  EXPECT_EQ(g_previous_handler_calls, 1);
  std::signal(SIGTERM, SIG_DFL);
}

// oneDNN 2.6's JIT fp32 GEMM kernels run with the stack pointer in the heap: a stop signal
// taken there on the thread's own stack writes its frame over the heap. Signals sent to the
// process every 0.2 ms while fp32 products (oneDNN's runtime-M GEMM, the affected kernels)
// run on every thread, allocations between them: each reaches the handler, on its own stack,
// and the heap stays intact. (The corruption itself did not reproduce on demand on the AVX2
// CPU where a training run aborted after a SIGTERM, so this guards the arrangement rather
// than replaying that abort.)
TEST(StopSignals, SignalsDuringProductsReachTheHandlerAndLeaveTheHeapIntact) {
  const GemmRows restore = gemm_rows_mode();
  set_gemm_rows_mode(GemmRows::runtime);
  StopSignals signals(/*block_on_workers=*/true);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    sigset_t set;  // the signals go to the process, never to this thread
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    while (!done.load()) {
      kill(getpid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Rng rng(5);
  const int64_t k = 384, n = 512;
  std::vector<float> w(k * n);
  for (float& x : w) x = static_cast<float>(rng.normal());
  double sum = 0;
  for (int i = 0; i < 300; ++i) {
    const int64_t m = 64 + (i * 37) % 200;
    std::vector<float> a(m * k, 0.5f), c(m * n);
    gemm(a.data(), false, w.data(), true, c.data(), m, n, k, DType::f32);
    sum += c[0];
  }
  done.store(true);
  sender.join();
  set_gemm_rows_mode(restore);
  EXPECT_EQ(signals.received(), SIGTERM);
  EXPECT_TRUE(std::isfinite(sum));
}

}  // namespace
}  // namespace foundry
