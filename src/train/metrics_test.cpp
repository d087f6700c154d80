#include "train/metrics.h"

#include <gtest/gtest.h>

#include "base/io.h"
#include "train/test_support.h"

namespace foundry {
namespace {

using testing::TempDir;

TEST(Metrics, TruncateKeepsStepsUpToTheResumedOneAndDropsATornLine) {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  write_file_atomic(path, "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n"
                          "{\"step\":3,\"loss\":1}\n{\"step\":4,\"lo");
  truncate_metrics(path, 2);
  EXPECT_EQ(read_text_file(path), "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n");
  truncate_metrics(dir.path() + "/absent.jsonl", 2);  // nothing to truncate: no file made
  EXPECT_FALSE(path_exists(dir.path() + "/absent.jsonl"));
}

// A long run's file is cut at its end only: a last line kept whole without its newline gets
// one, and the steps before stay byte for byte (several blocks of the backward read).
TEST(Metrics, TruncateCutsALongFileAtItsEnd) {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  std::string text;
  for (int step = 1; step <= 5000; ++step)
    text += "{\"step\":" + std::to_string(step) + ",\"loss\":1.25}\n";
  write_file_atomic(path, text + "{\"step\":5001,\"loss\":1}");
  EXPECT_EQ(truncate_metrics(path, 5001), 5001);
  EXPECT_EQ(read_text_file(path), text + "{\"step\":5001,\"loss\":1}\n");
  EXPECT_EQ(truncate_metrics(path, 2), 2);
  EXPECT_EQ(read_text_file(path), "{\"step\":1,\"loss\":1.25}\n{\"step\":2,\"loss\":1.25}\n");
  EXPECT_EQ(truncate_metrics(path, 0), 0);
  EXPECT_EQ(read_text_file(path), "");
}

TEST(Metrics, WriterAppendsOneLinePerStepAfterTheResumedStep) {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  write_file_atomic(path, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
  {
    MetricsWriter writer(path, 1);
    writer.write({{"step", 2}, {"loss", 0.5}});
    EXPECT_EQ(read_text_file(path), "{\"step\":1}\n{\"loss\":0.5,\"step\":2}\n");  // flushed
  }
  MetricsWriter fresh(path, 0);
  EXPECT_EQ(read_text_file(path), "");
}

TEST(Metrics, UnwritablePathNamesTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/missing-dir/metrics.jsonl";
  try {
    MetricsWriter writer(path, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace foundry
