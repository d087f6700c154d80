#include "train/events.h"

#include <gtest/gtest.h>

#include <fstream>

#include "base/test_expect_error.h"
#include "data/test_util.h"

namespace foundry {
namespace {
using testing::TempDir;

TEST(Events, AppendsLinesInOrderWithTheirTimesAndSkipsATornLine) {
  TempDir tmp;
  append_event(tmp.path(), "launch", "start", {{"attempt", 1}}, 1795543930.25);
  append_event(tmp.path(), "train", "rank_lost", {{"rank", 3}});
  std::ofstream(tmp.path() + "/events.jsonl", std::ios::app) << "{\"time\": \"2026-";  // a crash
  const std::vector<json> events = read_events(tmp.path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["event"], "start");
  EXPECT_EQ(events[0]["source"], "launch");
  EXPECT_EQ(events[0]["attempt"], 1);
  EXPECT_EQ(events[0]["unix"].get<double>(), 1795543930.25);
  EXPECT_EQ(events[0]["time"], utc_timestamp(1795543930.25));
  EXPECT_EQ(events[1]["rank"], 3);
  EXPECT_GE(events[1]["unix"].get<double>(), 1795543930.25);
}

TEST(Events, UtcTimestampsAreIso8601WithMilliseconds) {
  EXPECT_EQ(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(utc_timestamp(86400 + 3661.5), "1970-01-02T01:01:01.500Z");
}

TEST(Events, AMissingRunDirectoryIsAnErrorNamingTheFile) {
  TempDir tmp;
  expect_error([&] { append_event(tmp.path() + "/none", "train", "x"); }, "none/events.jsonl");
  EXPECT_TRUE(read_events(tmp.path() + "/none").empty());
}

}  // namespace
}  // namespace foundry
