#include "train/metrics.h"

#include <sstream>

#include "base/error.h"
#include "base/io.h"

namespace foundry {

void truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return;
  std::istringstream in(read_text_file(path));
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      json j = json::parse(line);
      if (j.value("step", int64_t{0}) > last_step) continue;
    } catch (const json::parse_error&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t start_step) : path_(path) {
  truncate_metrics(path, start_step);
  out_.open(path, std::ios::app);
  if (!out_) fail(fmt::format("cannot open '{}' for writing", path));
}

void MetricsWriter::write(const json& step_metrics) {
  out_ << step_metrics.dump() << "\n";
  out_.flush();
}

}  // namespace foundry
