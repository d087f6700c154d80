// metrics.jsonl: one JSON object per training step (docs/formats.md), written by rank 0.
#pragma once
#include <cstdint>
#include <string>

#include "base/config_reader.h"

namespace foundry {

// Keeps only the lines of steps ≤ last_step in the metrics file at `path` (a resumed run
// continues without duplicates; a torn last line from a crash is dropped). No file: nothing.
// Returns the step of the last line kept (0 when none).
int64_t truncate_metrics(const std::string& path, int64_t last_step);

class MetricsWriter {
 public:
  // Appends to `path` after truncating it to the steps ≤ start_step. Fails naming the file
  // when it cannot be opened.
  MetricsWriter(const std::string& path, int64_t start_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept;

  // One line per step, in one write(2). A failed or short write (a full disk) is an Error
  // naming the file, and the torn line is cut off again, so the file stays whole lines.
  void write(const json& step_metrics);
  // The step of the file's last line (0 when it has none).
  int64_t last_step() const { return last_step_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t last_step_ = 0;
};

}  // namespace foundry
