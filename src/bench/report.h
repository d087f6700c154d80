// The human side of a hardware profile: CSV tables, gnuplot PNGs and a Markdown report,
// all derived from the profile JSON alone (so a profile merged from several runs, e.g.
// collectives at 2 and at 4 ranks, reports as one).
#pragma once
#include <string>
#include <vector>

#include "base/config_reader.h"

namespace foundry {

struct ReportFiles {
  std::vector<std::string> csv, png;
  std::string markdown;
  std::string plot_warning;  // non-empty when gnuplot was unavailable or failed
};

// Writes into `dir` (created if needed): gemm.csv, memory_stream.csv,
// memory_working_set.csv, collectives.csv (each with a provenance header), the PNG plots
// and report.md. Every file is written atomically.
ReportFiles write_report(const json& profile, const std::string& dir);

// The Markdown report (what report.md holds), with `plot_dir` links to the PNGs.
std::string format_report(const json& profile, const std::vector<std::string>& pngs);

}  // namespace foundry
