#include "train/checkpointer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "base/build_info.h"
#include "base/test_expect_error.h"
#include "ckpt/checkpoint_dir.h"
#include "kernels/cpu_backend.h"
#include "model/info.h"
#include "model/model.h"
#include "train/memory_tier.h"
#include "train/optimizer_config.h"
#include "train/test_support.h"
#include "train/trainer.h"

namespace foundry {
namespace {

using testing::TempDir;

// A model, its optimizer and a checkpointer over one run directory, in one process; the
// model on `backend` when given (the CPU's otherwise).
struct TinyRun {
  explicit TinyRun(const RunConfig& config, uint64_t init_seed, Backend* backend = nullptr,
                   bool quiet = true)
      : rc(config),
        procs(nullptr, 0),
        model(rc.model, rc.train.precision, backend ? *backend : cpu_backend()),
        optimizer(make_optimizer(model.table(), optimizer_options(rc.train), nullptr)),
        batches(nullptr, rc.train.batch_size, rc.train.seq_len, 0, 1, rc.model.vocab_size, 3),
        checkpointer(rc, lr_schedule(rc.train), model, *optimizer, nullptr, procs, quiet) {
    model.init_weights(init_seed);
  }
  void step(int64_t s) {
    batches.restart_after(s - 1);  // batch s at step s
    batches.next();
    run_step(model, *optimizer, batches, 1e-2, s, 1.0, false, nullptr,
             [this] { checkpointer.protect_state(); });
  }
  std::vector<float> params() const {
    std::vector<float> p(model.slab_size());
    model.read_params(p.data());
    return p;
  }
  RunConfig rc;
  Processes procs;
  Model model;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  TrainBatches batches;
  Checkpointer checkpointer;
};

class CheckpointerTest : public ::testing::TestWithParam<bool> {};  // arch zaya1 or moe

TEST_P(CheckpointerTest, ResumeRestoresEverythingBitwise) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path(), GetParam());
  rc.train.optimizer = OptimizerKind::muon;
  TinyRun trained(rc, 1);
  make_dirs(rc.train.run_dir);
  trained.step(1);
  trained.step(2);
  trained.checkpointer.save(2);
  trained.checkpointer.finish();

  TinyRun resumed(rc, 99);  // other weights until the checkpoint is loaded
  EXPECT_EQ(resumed.checkpointer.resume(), 2);
  EXPECT_EQ(resumed.params(), trained.params());
  if (GetParam()) {
    EXPECT_EQ(resumed.model.balancer_state(), trained.model.balancer_state());
  }
  trained.step(3);
  resumed.step(3);  // optimizer state restored too: the next step is the same
  const std::vector<float> a = trained.params(), b = resumed.params();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A model whose slabs are not host memory (a CPU backend posing as a device, which takes the
// paths a GPU run takes): its parameters are saved through a host copy and loaded back into
// the device, so the checkpoint resumes on a device or on the host, bit for bit either way.
TEST_P(CheckpointerTest, ADeviceModelSavesAndResumesThroughAHostCopy) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path(), GetParam());
  rc.train.precision = DType::bf16;  // the bf16 copy is refreshed on the device after a load
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  TinyRun trained(rc, 1, device.get());
  ASSERT_TRUE(trained.model.on_device());
  make_dirs(rc.train.run_dir);
  trained.step(1);
  trained.step(2);
  trained.checkpointer.save(2);
  trained.checkpointer.finish();

  TinyRun on_device(rc, 99, device.get()), on_host(rc, 98);
  EXPECT_EQ(on_device.checkpointer.resume(), 2);
  EXPECT_EQ(on_host.checkpointer.resume(), 2);
  EXPECT_EQ(on_device.params(), trained.params());
  EXPECT_EQ(on_host.params(), trained.params());
  trained.step(3);
  on_device.step(3);
  on_host.step(3);
  EXPECT_TRUE(on_device.params() == trained.params());
  EXPECT_TRUE(on_host.params() == trained.params());
}

// A model on a device saved while the next steps run, to either tier: the snapshot is copied
// out of device memory beside the next step's forward and backward (the posing backend makes
// the copies only when the writer waits for them), and holds the state of its step.
TEST_P(CheckpointerTest, ADeviceModelsSnapshotHoldsItsStepWhileTheNextStepsRun) {
  for (const bool in_memory : {false, true}) {
    SCOPED_TRACE(in_memory ? "in-memory checkpoint" : "durable checkpoint");
    TempDir dir;
    RunConfig rc = testing::tiny_run_config(dir.path() + "/run", GetParam());
    rc.train.memory_checkpoint_every = in_memory ? 1 : 0;
    rc.train.memory_checkpoint_dir = dir.path() + "/shm";
    make_dirs(rc.train.run_dir);
    make_dirs(rc.train.memory_checkpoint_dir);
    ASSERT_TRUE(rc.train.checkpoint_async);
    const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
    TinyRun run(rc, 1, device.get());
    run.step(1);
    run.step(2);
    const std::vector<float> at_step_2 = run.params();
    if (in_memory) run.checkpointer.save_in_memory(2);
    else run.checkpointer.save(2);
    run.step(3);  // changes the parameters and the optimizer state once the snapshot is taken
    run.checkpointer.poll();
    run.step(4);
    const std::vector<float> at_step_4 = run.params();
    run.checkpointer.poll();
    run.checkpointer.finish();
    ASSERT_NE(at_step_4, at_step_2);

    for (Backend* backend : {device.get(), static_cast<Backend*>(nullptr)}) {
      TinyRun resumed(rc, 7, backend);
      EXPECT_EQ(resumed.checkpointer.resume(), 2);
      EXPECT_EQ(resumed.params(), at_step_2);
      resumed.step(3);  // the optimizer state of step 2 came back too
      resumed.step(4);
      EXPECT_EQ(resumed.params(), at_step_4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CheckpointerTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Zaya1" : "Moe"; });

TEST(Checkpointer, KeepsTheNewestCheckpointsAndResumesTheLatest) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path());
  rc.train.keep_checkpoints = 2;
  TinyRun run(rc, 1);
  make_dirs(rc.train.run_dir);
  TinyRun nothing_yet(rc, 1);
  EXPECT_EQ(nothing_yet.checkpointer.resume(), 0);
  for (int64_t s = 1; s <= 3; ++s) {
    run.step(s);
    run.checkpointer.save(s);
    run.checkpointer.finish();
  }
  const auto dirs = list_checkpoint_dirs(rc.train.run_dir);
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0].step, 2);
  EXPECT_EQ(dirs[1].step, 3);
  const json state = read_checkpoint_trainer_state(dirs[1].path);
  EXPECT_EQ(state.at("step"), 3);
  EXPECT_EQ(state.at("optimizer"), "adamw");
  EXPECT_EQ(state.at("foundry"), build_commit());
  EXPECT_EQ(state.at("tokens"), 3 * rc.train.batch_size * rc.train.seq_len);
  EXPECT_EQ(state.at("schedule").at("total_steps"), rc.train.steps);
  EXPECT_DOUBLE_EQ(state.at("schedule").at("lr").get<double>(),
                   learning_rate(lr_schedule(rc.train), 3));
  TinyRun resumed(rc, 7);
  EXPECT_EQ(resumed.checkpointer.resume(), 3);
}

// The step loop goes on while the save is written: the checkpoint holds the state of the
// step it was taken at, whatever the steps after it change (async save, snapshot first).
TEST(Checkpointer, AnAsynchronousSaveHoldsTheStateOfItsStep) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path());
  ASSERT_TRUE(rc.train.checkpoint_async);
  TinyRun run(rc, 1);
  make_dirs(rc.train.run_dir);
  run.step(1);
  run.step(2);
  const std::vector<float> at_step_2 = run.params();
  run.checkpointer.save(2);
  run.step(3);  // updates the parameters and the optimizer state while the write may run
  run.checkpointer.poll();
  run.step(4);
  run.checkpointer.finish();
  ASSERT_EQ(list_checkpoint_dirs(rc.train.run_dir).size(), 1u);
  TinyRun resumed(rc, 7);
  EXPECT_EQ(resumed.checkpointer.resume(), 2);
  EXPECT_EQ(resumed.params(), at_step_2);
}

// checkpoint_bytes (model/info.h), which plan's goodput prices a checkpoint by, is what a
// checkpoint's rank files hold, under AdamW and Muon (which stores no AdamW moments of its
// matrices), for both architectures: up to each piece's alignment (64 bytes).
TEST(Checkpointer, CheckpointBytesIsWhatTheRankFilesHold) {
  for (bool zaya : {false, true})
    for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::muon}) {
      TempDir dir;
      RunConfig rc = testing::tiny_run_config(dir.path(), zaya);
      rc.train.optimizer = kind;
      TinyRun run(rc, 1);
      make_dirs(rc.train.run_dir);
      run.step(1);
      run.checkpointer.save(1);
      run.checkpointer.finish();
      const std::string ckpt = list_checkpoint_dirs(rc.train.run_dir).back().path;
      const int64_t expected = checkpoint_bytes(rc.model, kind == OptimizerKind::muon);
      const int64_t bytes =
          static_cast<int64_t>(std::filesystem::file_size(ckpt + "/rank_00000.bin"));
      const int64_t pieces = 3 * static_cast<int64_t>(run.model.table().params().size());
      EXPECT_GE(bytes, expected) << (zaya ? "zaya1 " : "moe ") << optimizer_name(kind);
      EXPECT_LT(bytes - expected, 64 * pieces)
          << (zaya ? "zaya1 " : "moe ") << optimizer_name(kind);
    }
}

TEST(Checkpointer, ASaveDueWhileOneIsInFlightWaitsOrIsSkipped) {
  for (CheckpointOverlap overlap : {CheckpointOverlap::wait, CheckpointOverlap::skip}) {
    TempDir dir;
    RunConfig rc = testing::tiny_run_config(dir.path());
    rc.train.checkpoint_overlap = overlap;
    rc.train.keep_checkpoints = 0;
    TinyRun run(rc, 1, nullptr, /*quiet=*/false);  // the waits are reported unless quiet
    make_dirs(rc.train.run_dir);
    run.step(1);
    ::testing::internal::CaptureStderr();
    run.checkpointer.save(1);
    run.checkpointer.save(1 + 1);  // the first is still in flight (no poll in between)
    run.checkpointer.finish();
    const std::string log = ::testing::internal::GetCapturedStderr();
    const auto dirs = list_checkpoint_dirs(rc.train.run_dir);
    if (overlap == CheckpointOverlap::wait) {
      EXPECT_EQ(dirs.size(), 2u);
      EXPECT_NE(log.find("waits for step 1"), std::string::npos) << log;
    } else {
      ASSERT_EQ(dirs.size(), 1u);
      EXPECT_EQ(dirs[0].step, 1);
      EXPECT_NE(log.find("skipping the checkpoint of step 2"), std::string::npos) << log;
      // The last checkpoint of a process (the end, a stop) is never skipped: it waits.
      run.step(3);
      ::testing::internal::CaptureStderr();
      run.checkpointer.save(3);
      run.checkpointer.save(4, /*last=*/true);
      run.checkpointer.finish();
      const std::string last_log = ::testing::internal::GetCapturedStderr();
      const auto after = list_checkpoint_dirs(rc.train.run_dir);
      ASSERT_EQ(after.size(), 3u);
      EXPECT_EQ(after.back().step, 4);
      EXPECT_NE(last_log.find("waits for step 3"), std::string::npos) << last_log;
    }
  }
}

// Checkpoints of format version 1 (whole safetensors files, written before format 2) still
// resume, bit for bit.
TEST(Checkpointer, ResumesAVersionOneCheckpoint) {
  TempDir dir;
  RunConfig rc = testing::tiny_run_config(dir.path());
  TinyRun trained(rc, 1);
  make_dirs(rc.train.run_dir);
  trained.step(1);
  trained.step(2);
  // The single-process optimizer's runs point into its whole state slabs.
  std::vector<StateSlabToSave> states;
  for (const StateRun& r : trained.optimizer->states_to_save_runs())
    if (r.begin == 0) states.push_back({r.state, r.data});
  ASSERT_EQ(states.size(), 2u);  // exp_avg and exp_avg_sq of the first tensor, at offset 0
  save_checkpoint(rc.train.run_dir, 2, rc.model, trained.model.table(), trained.model.params(),
                  states, {{"step", 2}, {"optimizer", "adamw"}}, 0);
  TinyRun resumed(rc, 99);
  EXPECT_EQ(resumed.checkpointer.resume(), 2);
  EXPECT_EQ(resumed.params(), trained.params());
  trained.step(3);
  resumed.step(3);
  EXPECT_EQ(resumed.params(), trained.params());
}

TEST(Checkpointer, RefusesTheStateOfTheOtherOptimizer) {
  try {
    check_same_optimizer("runs/x/step_1", {{"optimizer", "muon"}}, OptimizerKind::adamw);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("runs/x/step_1 was written with train.optimizer = \"muon\""),
        std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("--set train.optimizer=muon"), std::string::npos) << e.hint();
  }
  // Checkpoints from before train.optimizer existed were written by AdamW.
  check_same_optimizer("old", json::object(), OptimizerKind::adamw);
  expect_error([] { check_same_optimizer("old", {{"optimizer", 3}}, OptimizerKind::adamw); },
               "\"optimizer\" is not a string");
}

// ---- the memory tier ------------------------------------------------------------------------

RunConfig memory_tier_config(const TempDir& dir) {
  RunConfig rc = testing::tiny_run_config(dir.path() + "/run");
  rc.train.keep_checkpoints = 0;
  rc.train.memory_checkpoint_every = 1;
  rc.train.memory_checkpoint_dir = dir.path() + "/shm";
  make_dirs(rc.train.run_dir);
  make_dirs(rc.train.memory_checkpoint_dir);
  return rc;
}

TEST(MemoryTier, ARestartResumesFromTheNewerInMemoryCheckpointBitwise) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  TinyRun run(rc, 1);
  const std::string root = memory_tier_root(rc.train);
  const auto inode = [](const std::string& dir) {
    struct stat st;
    return ::stat((dir + "/rank_00000.bin").c_str(), &st) == 0 ? st.st_ino : 0;
  };
  std::vector<float> after_5, after_6;
  ino_t step_3_file = 0;
  for (int64_t s = 1; s <= 6; ++s) {
    run.step(s);
    run.checkpointer.poll();
    if (s == 5) {
      after_5 = run.params();
      step_3_file = inode(list_checkpoint_dirs(root).at(0).path);
    }
    if (s == 6) after_6 = run.params();
    if (s <= 2) {
      run.checkpointer.save(s);
      run.checkpointer.finish();
    } else if (s < 6) {
      run.checkpointer.save_in_memory(s);
    }
  }
  // The memory tier keeps its two newest checkpoints, beside the run directory's; the newest
  // wrote over the oldest's file.
  const std::vector<CheckpointDir> kept = list_checkpoint_dirs(root);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].step, 4);
  EXPECT_EQ(kept[1].step, 5);
  EXPECT_NE(step_3_file, 0u);
  EXPECT_EQ(inode(kept[1].path), step_3_file);
  EXPECT_EQ(list_checkpoint_dirs(rc.train.run_dir).size(), 2u);
  EXPECT_EQ(latest_resume_step(rc.train), 5);

  TinyRun resumed(rc, 99);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(resumed.checkpointer.resume(), 5);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("an in-memory checkpoint"), std::string::npos) << log;
  EXPECT_EQ(resumed.params(), after_5);
  resumed.step(6);
  EXPECT_EQ(resumed.params(), after_6);
}

// The memory tier is used only while it is newer than the run directory and descends from a
// checkpoint still there: going back by deleting checkpoints sets it aside.
TEST(MemoryTier, IsSetAsideWhenOlderOrWhenItsDurableCheckpointIsGone) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  TinyRun run(rc, 1);
  for (int64_t s = 1; s <= 4; ++s) {
    run.step(s);
    run.checkpointer.poll();
    if (s <= 2) {
      run.checkpointer.save(s);
      run.checkpointer.finish();
    } else {
      run.checkpointer.save_in_memory(s);
    }
  }
  run.checkpointer.finish();
  const std::string memory = list_checkpoint_dirs(memory_tier_root(rc.train)).back().path;
  EXPECT_EQ(read_checkpoint_trainer_state(memory).at("durable_step"), 2);
  ASSERT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)), memory);

  remove_all(list_checkpoint_dirs(rc.train.run_dir).at(1).path);  // step 2: back to step 1
  EXPECT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)),
            std::nullopt);
  TinyRun resumed(rc, 99);
  EXPECT_EQ(resumed.checkpointer.resume(), 1);

  // A durable checkpoint of a later step wins over the memory tier.
  resumed.step(2);
  resumed.step(3);
  resumed.step(4);
  resumed.step(5);
  resumed.checkpointer.save(5);
  resumed.checkpointer.finish();
  EXPECT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)),
            std::nullopt);
  EXPECT_EQ(latest_resume_step(rc.train), 5);
}

// A tier checkpoint written before its run had a durable one does not go with a durable
// checkpoint older than itself: that is another run's (the tier of an earlier run of the
// directory, left in a train.memory_checkpoint_dir a later run did not clear).
TEST(MemoryTier, OneWrittenBeforeAnyDurableCheckpointIsSetAsideWhenTheDirectoryHasAnOlderOne) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  {
    TinyRun earlier(rc, 1);
    for (int64_t s = 1; s <= 3; ++s) {
      earlier.step(s);
      earlier.checkpointer.poll();
      earlier.checkpointer.save_in_memory(s);
    }
    earlier.checkpointer.finish();
  }
  const std::string memory = list_checkpoint_dirs(memory_tier_root(rc.train)).back().path;
  EXPECT_EQ(read_checkpoint_trainer_state(memory).at("durable_step"), 0);
  ASSERT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)), memory);
  RunConfig later_rc = rc;
  later_rc.train.memory_checkpoint_every = 0;  // its tier elsewhere, or off
  TinyRun later(later_rc, 2);
  later.step(1);
  later.step(2);
  later.checkpointer.save(2);
  later.checkpointer.finish();
  EXPECT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)),
            std::nullopt);
  EXPECT_EQ(latest_resume_step(rc.train), 2);
}

// One written while the run's first durable save was in flight goes with that save once it
// has committed: a crash then resumes from the newer tier checkpoint.
TEST(MemoryTier, OneWrittenWhileTheFirstDurableSaveIsInFlightGoesWithIt) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  ASSERT_TRUE(rc.train.checkpoint_async);
  TinyRun run(rc, 1);
  run.step(1);
  run.step(2);
  run.checkpointer.save(2);  // in flight until finish()
  run.step(3);
  run.checkpointer.save_in_memory(3);
  run.checkpointer.finish();
  const std::string memory = list_checkpoint_dirs(memory_tier_root(rc.train)).back().path;
  const json state = read_checkpoint_trainer_state(memory);
  EXPECT_EQ(state.at("durable_step"), 0);
  EXPECT_EQ(state.at("durable_in_flight"), 2);
  ASSERT_EQ(find_latest_checkpoint(rc.train.run_dir),
            rc.train.run_dir + "/checkpoints/step_00000002");
  EXPECT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)), memory);
  EXPECT_EQ(latest_resume_step(rc.train), 3);
}

TEST(MemoryTier, SavesAtDurableStepsTooButNotAtTheEnd) {
  TrainConfig tc;
  tc.checkpoint_every = 4;
  tc.memory_checkpoint_every = 2;
  auto due = [&](int64_t step, bool last) {
    const SavesDue d = saves_due(tc, step, last, /*completes=*/last);
    return std::pair<bool, bool>{d.durable, d.memory};
  };
  EXPECT_EQ(due(1, false), std::make_pair(false, false));
  EXPECT_EQ(due(2, false), std::make_pair(false, true));
  EXPECT_EQ(due(4, false), std::make_pair(true, true));
  EXPECT_EQ(due(5, true), std::make_pair(true, false));
  EXPECT_EQ(due(6, true), std::make_pair(true, false));
  tc.memory_checkpoint_every = 0;
  EXPECT_EQ(due(4, false), std::make_pair(true, false));
  tc.checkpoint_every = 0;
  EXPECT_EQ(due(4, false), std::make_pair(false, false));
  EXPECT_EQ(due(3, true), std::make_pair(true, false));
}

TEST(SavesDue, CheckpointAtEndOffSkipsOnlyTheCompletedRunsLastSave) {
  TrainConfig tc;
  tc.checkpoint_every = 4;
  tc.checkpoint_at_end = false;
  EXPECT_FALSE(saves_due(tc, 6, /*last=*/true, /*completes=*/true).durable);
  EXPECT_TRUE(saves_due(tc, 8, true, true).durable);   // a periodic step still saves
  EXPECT_TRUE(saves_due(tc, 6, true, false).durable);  // a stop on a signal saves
  tc.checkpoint_at_end = true;
  EXPECT_TRUE(saves_due(tc, 6, true, true).durable);
}

// Both tiers at one step: a failure before the durable checkpoint commits resumes from the
// memory tier's checkpoint of the same step, not from the one before it.
TEST(MemoryTier, HoldsADurableStepUntilItsDurableCheckpointCommits) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  TinyRun run(rc, 1);
  for (int64_t s = 1; s <= 4; ++s) {
    run.step(s);
    run.checkpointer.poll();
    if (s == 2 || s == 4) run.checkpointer.save(s);
    run.checkpointer.save_in_memory(s);
  }
  const std::vector<float> after_4 = run.params();
  run.checkpointer.finish();
  EXPECT_EQ(list_checkpoint_dirs(memory_tier_root(rc.train)).back().step, 4);
  EXPECT_EQ(latest_resume_step(rc.train), 4);
  // As if the job had died before step 4's durable checkpoint committed: step 2 is the latest.
  const std::vector<CheckpointDir> durable = list_checkpoint_dirs(rc.train.run_dir);
  ASSERT_EQ(durable.size(), 2u);
  remove_all(durable[1].path);
  write_latest(rc.train.run_dir + "/checkpoints",
               std::filesystem::path(durable[0].path).filename().string());
  EXPECT_EQ(latest_resume_step(rc.train), 4);
  TinyRun resumed(rc, 99);
  EXPECT_EQ(resumed.checkpointer.resume(), 4);
  EXPECT_EQ(resumed.params(), after_4);
}

TEST(MemoryTier, ANewRunClearsItAndTheEndOfARunRetiresIt) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  const std::string root = memory_tier_root(rc.train);
  EXPECT_EQ(root.rfind(rc.train.memory_checkpoint_dir + "/foundry-", 0), 0u) << root;
  TinyRun run(rc, 1);
  run.step(1);
  run.checkpointer.save_in_memory(1);
  run.step(2);
  run.checkpointer.poll();
  ASSERT_EQ(list_checkpoint_dirs(root).size(), 1u);
  run.checkpointer.clear_memory_tier();
  EXPECT_FALSE(path_exists(root));
  run.checkpointer.save_in_memory(2);
  run.step(3);
  run.checkpointer.save(3);
  run.checkpointer.retire_memory_tier();  // commits both, then removes the tier
  EXPECT_FALSE(path_exists(root));
  EXPECT_EQ(list_checkpoint_dirs(rc.train.run_dir).size(), 1u);
}

// A run with the tier off leaves a newer in-memory checkpoint unused, saying so, and removes
// it once it goes on from an older step (a later resume with the tier on must not go back to
// the steps it replaces); another run's checkpoint of the step the tier descends from does
// not make the tier usable.
TEST(MemoryTier, OffItIsLeftUnusedAndRetiredAndAnotherRunDoesNotAdoptIt) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  const std::string root = memory_tier_root(rc.train);
  auto run_a = [&] {
    TinyRun a(rc, 1);
    a.step(1);
    a.checkpointer.save(1);
    a.checkpointer.finish();
    a.step(2);
    a.checkpointer.save_in_memory(2);
    a.step(3);
    a.checkpointer.finish();
  };
  run_a();
  ASSERT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)),
            list_checkpoint_dirs(root).back().path);

  RunConfig off = rc;
  off.train.memory_checkpoint_every = 0;
  {
    TinyRun resumed(off, 99);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(resumed.checkpointer.resume(), 1);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("is left unused: in-memory checkpoints are off"), std::string::npos) << log;
    EXPECT_NE(log.find("removing the in-memory checkpoint"), std::string::npos) << log;
    EXPECT_TRUE(list_checkpoint_dirs(root).empty());
    EXPECT_EQ(latest_resume_step(rc.train), 1);  // with the tier on, too
    resumed.checkpointer.retire_memory_tier();
    EXPECT_FALSE(path_exists(root));
  }

  // Run A again, then another run's checkpoint of step 1 where A's was.
  remove_all(rc.train.run_dir);
  make_dirs(rc.train.run_dir);
  run_a();
  remove_all(rc.train.run_dir);
  make_dirs(rc.train.run_dir);
  {
    TinyRun b(off, 7);
    b.step(1);
    b.checkpointer.save(1);
    b.checkpointer.finish();
  }
  ASSERT_TRUE(path_exists(root));
  EXPECT_EQ(usable_memory_checkpoint(rc.train, find_latest_checkpoint(rc.train.run_dir)),
            std::nullopt);
  TinyRun resumed(rc, 99);
  EXPECT_EQ(resumed.checkpointer.resume(), 1);
}

// A failing memory tier only costs its checkpoints: the run goes on without them.
TEST(MemoryTier, AFailedSaveTurnsTheTierOffAndTrainingGoesOn) {
  TempDir dir;
  const RunConfig rc = memory_tier_config(dir);
  const std::string root = memory_tier_root(rc.train);
  write_file_atomic(root, std::string_view("not a directory"));  // every write there fails
  TinyRun run(rc, 1);
  ASSERT_TRUE(run.checkpointer.memory_tier_on());
  run.step(1);
  run.checkpointer.save_in_memory(1);
  run.step(2);
  ::testing::internal::CaptureStderr();
  run.checkpointer.poll();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("in-memory checkpoints are off for the rest of this run"), std::string::npos)
      << log;
  EXPECT_FALSE(run.checkpointer.memory_tier_on());
  run.checkpointer.save_in_memory(2);  // nothing: the tier is off
  run.step(3);
  run.checkpointer.save(3);
  run.checkpointer.finish();
  EXPECT_EQ(list_checkpoint_dirs(rc.train.run_dir).size(), 1u);
}

TEST(MemoryTier, RefusesADirectoryThatIsNotThereOrTooSmall) {
  TempDir dir;
  RunConfig rc = memory_tier_config(dir);
  check_memory_tier_room(rc.train, 1e6);
  expect_error([&] { check_memory_tier_room(rc.train, 1e18); },
               "train.memory_checkpoint_dir = '" + rc.train.memory_checkpoint_dir + "' has ");
  rc.train.memory_checkpoint_dir = dir.path() + "/missing";
  expect_error([&] { check_memory_tier_room(rc.train, 1e6); },
               "train.memory_checkpoint_dir = '" + rc.train.memory_checkpoint_dir +
                   "' is not a directory");
}

}  // namespace
}  // namespace foundry
