#include "train/heartbeat.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/config_reader.h"
#include "base/io.h"
#include "data/test_util.h"

namespace foundry {
namespace {
using testing::TempDir;

// What a Heartbeat reported, waited for from the test's thread.
struct Reports {
  std::mutex mutex;
  std::string cause, message;
  int rank = -2;
  Heartbeat::FailureHandler handler() {
    return [this](const std::string& c, int r, const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      cause = c, rank = r, message = m;
    };
  }
  // Waits up to `seconds` for a report; its cause ("" if none).
  std::string wait(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!cause.empty()) return cause;
      }
      if (std::chrono::steady_clock::now() >= deadline) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

// A record as a rank that stopped writing (killed) left it.
void write_frozen_record(const std::string& run_dir, int rank, int64_t pid,
                         const std::string& host) {
  make_dirs(heartbeat_dir(run_dir));
  const json j = {{"rank", rank}, {"pid", pid},  {"host", host},         {"beats", 7},
                  {"progress", 9}, {"step", 42}, {"phase", "step"}, {"hang_after_s", 45.0},
                  {"exited", false}};
  write_file_atomic(fmt::format("{}/rank_{:05d}.json", heartbeat_dir(run_dir), rank), j.dump());
}

TEST(ChangeClock, MeasuresTimeSinceTheValueLastChanged) {
  ChangeClock c;
  EXPECT_EQ(c.seen(5, 10.0), 0.0);
  EXPECT_EQ(c.seen(5, 12.5), 2.5);
  EXPECT_EQ(c.seen(6, 13.0), 0.0);
  EXPECT_EQ(c.seen(6, 14.0), 1.0);
}

TEST(Heartbeat, WritesARecordAndMarksItExitedAtTheEnd) {
  TempDir tmp;
  {
    Heartbeat hb(tmp.path(), 0, 1, {0.05, 1, 10},
                 [](auto&&...) { ADD_FAILURE() << "no failure expected"; });
    hb.progress(3, "step");
    // Beats every 50 ms: two within 2 s however loaded the machine.
    auto r = read_heartbeat(tmp.path(), 0);
    for (int i = 0; i < 200 && !(r && r->beats >= 2); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      r = read_heartbeat(tmp.path(), 0);
    }
    ASSERT_TRUE(r);
    EXPECT_EQ(r->pid, getpid());
    EXPECT_EQ(r->step, 3);
    EXPECT_EQ(r->phase, "step");
    EXPECT_GE(r->beats, 2);
    EXPECT_FALSE(r->exited);
  }
  EXPECT_TRUE(read_heartbeat(tmp.path(), 0)->exited);
}

TEST(Heartbeat, ASilentNeighbourIsReportedNamingItAndWhetherItDied) {
  TempDir tmp;
  // Rank 1's record never changes, and its pid is not a live process on this host.
  write_frozen_record(tmp.path(), 1, 999999999, host_name());
  Reports reports;
  Heartbeat hb(tmp.path(), 0, 2, {0.05, 0.3, 10}, reports.handler());
  EXPECT_EQ(reports.wait(3), "rank_lost");
  EXPECT_EQ(reports.rank, 1);
  EXPECT_NE(reports.message.find("rank 1 (pid 999999999 on " + host_name() +
                                 ") at step 42 (step) has died"),
            std::string::npos)
      << reports.message;
}

TEST(Heartbeat, AnExitedNeighbourIsNotWatched) {
  TempDir tmp;
  { Heartbeat neighbour(tmp.path(), 1, 2, {0.05, 0.3, 10}, {}); }
  Reports reports;
  Heartbeat hb(tmp.path(), 0, 2, {0.05, 0.3, 10}, reports.handler());
  EXPECT_EQ(reports.wait(0.8), "");
}

TEST(Heartbeat, NoProgressPastTheThresholdIsAHangWithEveryRanksPosition) {
  TempDir tmp;
  Reports reports;
  Heartbeat hb(tmp.path(), 0, 1, {0.05, 10, 2.0}, reports.handler());
  hb.progress(0, "validation");  // the start, as the trainer marks it
  hb.progress(1, "step");
  hb.progress(2, "step");  // the first step is complete: the threshold is hang_after_s
  EXPECT_EQ(reports.wait(0.5), "");
  EXPECT_EQ(reports.wait(10), "hang");
  EXPECT_NE(reports.message.find("rank 0 has made no progress"), std::string::npos)
      << reports.message;
  EXPECT_NE(reports.message.find("rank 0 at step 2 (step)"), std::string::npos) << reports.message;
  EXPECT_NE(reports.message.find("(limit 2 s)"), std::string::npos) << reports.message;
}

TEST(Heartbeat, TheHangThresholdGrowsWithTheSlowestStep) {
  TempDir tmp;
  Reports reports;
  Heartbeat hb(tmp.path(), 0, 1, {0.05, 10, 2.0}, reports.handler());
  hb.progress(0, "validation");
  hb.progress(1, "step");
  hb.progress(2, "step");
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  hb.progress(3, "step");  // a 0.9 s step: the threshold becomes 3 × 0.9 s = 2.7 s (not 2 s)
  EXPECT_EQ(reports.wait(2.2), "");
  EXPECT_EQ(reports.wait(10), "hang");
  // 2.7 s or more (a loaded machine can stretch the 0.9 s step), never the 2 s it began with.
  EXPECT_NE(reports.message.find("(limit "), std::string::npos) << reports.message;
  EXPECT_EQ(reports.message.find("(limit 2 s)"), std::string::npos) << reports.message;
}

// The first step trained gets 4 × hang_after_s, a resumed run's as a new one's: its first mark
// is the step it resumed from, not step 0.
TEST(Heartbeat, AResumedRunsFirstStepGetsTheStartupThreshold) {
  TempDir tmp;
  Reports reports;  // a stalled machine may report a hang: heard, not asserted
  Heartbeat hb(tmp.path(), 0, 1, {0.05, 10, 2.0}, reports.handler());
  const auto threshold = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a record written since
    const std::optional<HeartbeatRecord> r = read_heartbeat(tmp.path(), 0);
    return r ? r->hang_after_s : -1.0;
  };
  hb.progress(40, "validation");
  hb.progress(41, "step");
  EXPECT_EQ(threshold(), 8.0);
  hb.progress(42, "step");  // step 41 complete
  EXPECT_EQ(threshold(), 2.0);
}

// Start-up marks (a checkpoint's tensors loading) are progress: the start-up threshold runs
// from the last of them, and they leave the first step's mark to decide what the start is.
TEST(Heartbeat, StartUpMarksAreProgressWithoutAStep) {
  TempDir tmp;
  Reports reports;
  Heartbeat hb(tmp.path(), 0, 1, {0.05, 10, 0.5}, reports.handler());  // start-up limit 2 s
  for (int i = 0; i < 12; ++i) {  // 3 s of loading, a mark every 0.25 s
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    hb.starting("loading");
  }
  EXPECT_EQ(reports.wait(0), "");
  const std::optional<HeartbeatRecord> r = read_heartbeat(tmp.path(), 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->phase, "loading");
  EXPECT_GE(r->progress, 7);
  hb.progress(40, "validation");  // resumed at step 40
  hb.progress(41, "step");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(read_heartbeat(tmp.path(), 0)->hang_after_s, 2.0);  // still the start-up limit
  EXPECT_EQ(reports.wait(10), "hang");  // no marks since: a first step that hangs
  EXPECT_NE(reports.message.find("(limit 2 s)"), std::string::npos) << reports.message;
}

// launch's --startup-timeout (or the communication timeout) raises the start-up threshold,
// never the one after the first step.
TEST(Heartbeat, TheStartUpThresholdIsAtLeastStartupAfter) {
  TempDir tmp;
  HeartbeatConfig config{0.05, 10, 2.0};
  config.startup_after_s = 30;
  Reports reports;  // a stalled machine may report a hang: heard, not asserted
  Heartbeat hb(tmp.path(), 0, 1, config, reports.handler());
  const auto threshold = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::optional<HeartbeatRecord> r = read_heartbeat(tmp.path(), 0);
    return r ? r->hang_after_s : -1.0;
  };
  hb.starting("building the model");
  EXPECT_EQ(threshold(), 30.0);
  hb.progress(0, "validation");
  hb.progress(1, "step");
  hb.progress(2, "step");
  EXPECT_EQ(threshold(), 2.0);
}

TEST(Heartbeat, DescribePositionsGroupsRanksByWhereTheyAre) {
  std::map<int, HeartbeatRecord> records;
  for (int r = 0; r < 4; ++r) records[r] = HeartbeatRecord{r, 1, "h", 1, 1, 12, "step", 45, false};
  records[2].step = 11;
  records[2].phase = "validation";
  records[3].exited = true;
  EXPECT_EQ(describe_positions(records),
            "ranks 0, 1 at step 12 (step); rank 2 at step 11 (validation); rank 3 exited");
}

}  // namespace
}  // namespace foundry
