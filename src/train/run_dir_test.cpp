#include "train/run_dir.h"

#include <gtest/gtest.h>

#include "base/io.h"
#include "base/test_expect_error.h"
#include "ckpt/checkpoint_dir.h"
#include "data/test_util.h"
#include "train/events.h"
#include "train/processes.h"
#include "train/test_support.h"
#include "train/trainer.h"

namespace foundry {
namespace {
using testing::TempDir;

TrainConfig at(const std::string& dir) {
  TrainConfig tc;
  tc.run_dir = dir;
  return tc;
}

// A run directory as a finished run leaves it: metrics and one checkpoint directory.
void fake_previous_run(const std::string& dir, bool with_checkpoint) {
  make_dirs(dir + "/checkpoints");
  write_file_atomic(dir + "/metrics.jsonl", "{\"step\":1}\n{\"step\":2}\n");
  if (with_checkpoint) make_dirs(dir + "/checkpoints/step_00000002");
}

void fake_committed_checkpoint(const std::string& dir, int64_t step) {
  const std::string name = fmt::format("{}/checkpoints/step_{:08d}", dir, step);
  make_dirs(name);
  write_file_atomic(name + "/COMMITTED",
                    "{\"format_version\":2,\"metadata_xxh3_64\":\"0123456789abcdef\"}\n");
  write_file_atomic(dir + "/checkpoints/latest", fmt::format("step_{:08d}\n", step));
}

TEST(RunDir, InspectCountsCheckpointsAndMetricsLines) {
  TempDir tmp;
  EXPECT_FALSE(inspect_run_dir(tmp.path() + "/none").exists);
  fake_previous_run(tmp.path(), true);
  make_dirs(tmp.path() + "/checkpoints/step_00000004.abc.tmp");  // an interrupted save
  write_file_atomic(tmp.path() + "/checkpoints/latest", "step_00000002\n");  // not counted
  const RunDirContents c = inspect_run_dir(tmp.path());
  EXPECT_EQ(c.checkpoints, 1);
  EXPECT_TRUE(c.latest);
  EXPECT_EQ(c.metrics_lines, 2);
  EXPECT_EQ(c.describe(), "1 checkpoint(s) and 2 line(s) of metrics.jsonl");
}

TEST(RunDir, ASecondLockOnTheSameDirectoryIsRefusedNamingTheHolder) {
  TempDir tmp;
  {
    RunDirLock first(tmp.path());
    expect_error([&] { RunDirLock second(tmp.path()); },
                 fmt::format("is in use by another training job (pid {} on host", getpid()));
  }
  RunDirLock again(tmp.path());  // released with its holder
}

TEST(RunDir, ANewRunIntoAnotherRunsDirectoryIsRefusedAndNothingChanges) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, true);
  Processes one(nullptr, 0);
  expect_error([&] { RunDir d(at(dir), StartMode::fresh, one); },
               "already holds a run (1 checkpoint(s)");
  EXPECT_TRUE(path_exists(dir + "/checkpoints/step_00000002"));
  EXPECT_EQ(read_text_file(dir + "/metrics.jsonl"), "{\"step\":1}\n{\"step\":2}\n");
}

// A new run would replace skipped_batches.json: one Foundry did not write stops every start
// mode that begins a new run, before --overwrite removes anything; a resume keeps it.
TEST(RunDir, ASkippedBatchesFileFoundryDidNotWriteStopsANewRun) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, true);
  write_file_atomic(dir + "/skipped_batches.json", "my own notes\n");
  Processes one(nullptr, 0);
  for (StartMode mode : {StartMode::fresh, StartMode::overwrite})
    expect_error([&] { RunDir d(at(dir), mode, one); },
                 dir + "/skipped_batches.json is not a record of skipped batches");
  EXPECT_TRUE(path_exists(dir + "/checkpoints/step_00000002"));
  EXPECT_EQ(read_text_file(dir + "/skipped_batches.json"), "my own notes\n");
  const std::string empty = tmp.path() + "/empty";
  make_dirs(empty);
  write_file_atomic(empty + "/skipped_batches.json", "[1, 2]\n");
  expect_error([&] { RunDir d(at(empty), StartMode::auto_resume, one); }, "not a record");
  // A record Foundry wrote does not stop a new run.
  write_file_atomic(empty + "/skipped_batches.json",
                    "{\"format\": \"foundry-skipped-batches\", "
                    "\"batches\": []}\n");
  EXPECT_FALSE(RunDir(at(empty), StartMode::fresh, one).resume());
}

TEST(RunDir, ResumeNeedsACheckpointAutoResumeStartsWithoutOne) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, false);
  Processes one(nullptr, 0);
  expect_error([&] { RunDir d(at(dir), StartMode::resume, one); },
               "has no checkpoint to resume from");
  EXPECT_FALSE(RunDir(at(dir), StartMode::auto_resume, one).resume());
  fake_committed_checkpoint(dir, 2);
  EXPECT_TRUE(RunDir(at(dir), StartMode::auto_resume, one).resume());
  EXPECT_TRUE(RunDir(at(dir), StartMode::resume, one).resume());
}

// A refused start leaves no directory it made (here --resume of a directory that did not
// exist: every missing level goes), and keeps one that was there.
TEST(RunDir, ARefusedStartRemovesTheDirectoriesItMade) {
  TempDir tmp;
  Processes one(nullptr, 0);
  expect_error([&] { RunDir d(at(tmp.path() + "/x/y/z"), StartMode::resume, one); },
               "has no checkpoint to resume from");
  EXPECT_FALSE(path_exists(tmp.path() + "/x"));
  make_dirs(tmp.path() + "/kept");
  expect_error([&] { RunDir d(at(tmp.path() + "/kept"), StartMode::resume, one); },
               "has no checkpoint to resume from");
  EXPECT_TRUE(path_exists(tmp.path() + "/kept"));
  EXPECT_FALSE(path_exists(tmp.path() + "/kept/" + std::string(kLockFile)));
}

// What the saver leaves: a committed step directory (its marker is written before it takes
// the name), a staging directory and `latest`.

TEST(RunDir, OverwriteRemovesOnlyWhatFoundryWroteAndNamesIt) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, false);
  fake_committed_checkpoint(dir, 2);
  make_dirs(dir + "/checkpoints/step_00000004.abc.tmp");  // an interrupted save
  // A file of the user's and a step directory no save wrote (no commit marker): refused,
  // and nothing at all is removed.
  write_file_atomic(dir + "/checkpoints/mine.txt", "notes\n");
  make_dirs(dir + "/checkpoints/step_00000007");
  // A step directory whose COMMITTED is not a marker a save writes is not Foundry's either.
  make_dirs(dir + "/checkpoints/step_00000009");
  write_file_atomic(dir + "/checkpoints/step_00000009/COMMITTED", "done\n");
  expect_error([&] { RunDir d(at(dir), StartMode::overwrite, Processes(nullptr, 0)); },
               "holds what Foundry did not write there: mine.txt (not a checkpoint file), "
               "step_00000007 (a step directory without a commit marker), step_00000009 (a "
               "step directory whose COMMITTED Foundry did not write); nothing was removed");
  EXPECT_TRUE(path_exists(dir + "/checkpoints/step_00000002/COMMITTED"));
  EXPECT_TRUE(path_exists(dir + "/checkpoints/step_00000004.abc.tmp"));
  EXPECT_TRUE(path_exists(dir + "/metrics.jsonl"));
  EXPECT_EQ(read_text_file(dir + "/checkpoints/mine.txt"), "notes\n");
  // Once they are moved away, the run's own files go, each named in the event.
  remove_all(dir + "/checkpoints/mine.txt");
  remove_all(dir + "/checkpoints/step_00000007");
  EXPECT_EQ(read_text_file(dir + "/checkpoints/step_00000009/COMMITTED"), "done\n");
  remove_all(dir + "/checkpoints/step_00000009");
  {
    RunDir d(at(dir), StartMode::overwrite, Processes(nullptr, 0));
    d.replace_previous_run(Processes(nullptr, 0));
  }
  EXPECT_FALSE(inspect_run_dir(dir).any());
  EXPECT_FALSE(path_exists(dir + "/checkpoints/step_00000004.abc.tmp"));
  const std::vector<json> events = read_events(dir);
  ASSERT_EQ(events.size(), 1u);
  const std::vector<std::string> entries = events[0]["entries"];
  EXPECT_EQ(entries, (std::vector<std::string>{"checkpoints/latest", "checkpoints/step_00000002",
                                               "checkpoints/step_00000004.abc.tmp",
                                               "metrics.jsonl (2 line(s))"}));
}

// A resume saves step_N directories by name: one Foundry did not commit stops it at the start,
// and a save that meets one anyway (made meanwhile) leaves it as it was.
TEST(RunDir, AResumeIsRefusedOverAStepDirectoryFoundryDidNotWrite) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, false);
  fake_committed_checkpoint(dir, 2);
  write_file_atomic(dir + "/checkpoints/mine.txt", "notes\n");  // harmless to a resume
  { EXPECT_TRUE(RunDir(at(dir), StartMode::resume, Processes(nullptr, 0)).resume()); }
  make_dirs(dir + "/checkpoints/step_00000006");
  write_file_atomic(dir + "/checkpoints/step_00000006/notes.txt", "keep\n");
  for (StartMode mode : {StartMode::resume, StartMode::auto_resume})
    expect_error([&] { RunDir d(at(dir), mode, Processes(nullptr, 0)); },
                 "holds step directories Foundry did not write: step_00000006 (a step directory "
                 "without a commit marker); a save of that step would replace them");
  make_dirs(dir + "/checkpoints/step_00000004.x.tmp");
  expect_error(
      [&] {
        publish_dir(dir + "/checkpoints/step_00000004.x.tmp", dir + "/checkpoints/step_00000006");
      },
      "exists and is not a checkpoint Foundry wrote");
  EXPECT_EQ(read_text_file(dir + "/checkpoints/step_00000006/notes.txt"), "keep\n");
}

// The previous run goes only once the new one is ready to train: a job that fails or is
// stopped while it starts (its model built, its checks made) leaves it whole.
TEST(RunDir, OverwriteRemovesThePreviousRunOnlyWhenTheNewOneStartsAndRecordsIt) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  fake_previous_run(dir, false);
  fake_committed_checkpoint(dir, 2);
  { EXPECT_FALSE(RunDir(at(dir), StartMode::overwrite, Processes(nullptr, 0)).resume()); }
  EXPECT_TRUE(path_exists(dir + "/checkpoints/step_00000002/COMMITTED"));
  EXPECT_TRUE(inspect_run_dir(dir).any());
  EXPECT_FALSE(path_exists(dir + "/events.jsonl"));
  {
    RunDir d(at(dir), StartMode::overwrite, Processes(nullptr, 0));
    d.replace_previous_run(Processes(nullptr, 0));
    d.replace_previous_run(Processes(nullptr, 0));  // once: the second finds nothing to do
  }
  EXPECT_FALSE(inspect_run_dir(dir).any());
  const std::vector<json> events = read_events(dir);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["event"], "overwrite");
  EXPECT_EQ(events[0]["removed"], "1 checkpoint(s) and 2 line(s) of metrics.jsonl");
}

TEST(RunDir, ADirectoryCreatedForARunThatNeverStartedIsRemoved) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/new/run";
  { RunDir d(at(dir), StartMode::fresh, Processes(nullptr, 0)); }
  EXPECT_FALSE(path_exists(tmp.path() + "/new"));
  {
    RunDir d(at(dir), StartMode::fresh, Processes(nullptr, 0));
    d.started();
  }
  EXPECT_TRUE(path_exists(dir));
}

// A process killed while it wrote config.json leaves its copy; the next run removes it.
TEST(RunDir, AKilledWritersCopyOfTheConfigIsRemoved) {
  TempDir tmp;
  RunConfig rc = testing::tiny_run_config(tmp.path());
  rc.train.steps = 1;
  write_file_atomic(tmp.path() + "/config.json.tmp.999999", "{\"mod");
  TrainOptions opt;
  opt.synthetic_data = true;
  opt.quiet = true;
  train(rc, opt);
  EXPECT_FALSE(path_exists(tmp.path() + "/config.json.tmp.999999"));
  EXPECT_TRUE(path_exists(tmp.path() + "/config.json"));
}

TEST(RunDir, TrainingTwiceIntoOneDirectoryNeedsResumeOrOverwrite) {
  TempDir tmp;
  RunConfig rc = testing::tiny_run_config(tmp.path());
  rc.train.steps = 2;
  TrainOptions opt;
  opt.synthetic_data = true;
  opt.quiet = true;
  train(rc, opt);
  const std::string metrics = read_text_file(tmp.path() + "/metrics.jsonl");
  expect_error([&] { train(rc, opt); }, "already holds a run");
  opt.steps = 0;  // once emptied metrics.jsonl; now refused before the directory is looked at
  expect_error([&] { train(rc, opt); }, "train.steps is 0: nothing to train");
  EXPECT_EQ(read_text_file(tmp.path() + "/metrics.jsonl"), metrics);
  opt.start = StartMode::overwrite;
  opt.steps = 1;
  EXPECT_EQ(train(rc, opt).final_step, 1);
}

}  // namespace
}  // namespace foundry
