// Provenance of a measurement: when, where and how it was taken. Every output of `foundry
// bench` (profile JSON, CSV, Markdown report) starts with it, so a number can always be
// traced back to its machine, command line and libraries.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace foundry {

struct Provenance {
  std::string date;          // UTC, ISO 8601 ("2026-11-23T01:20:00Z")
  std::string command;       // the exact command line
  std::string host;
  std::string cpu;           // /proc/cpuinfo "model name"
  int cores = 0;             // online logical CPUs
  int threads = 0;           // OpenMP threads in use
  int ranks = 1;             // MPI ranks of the run (1 without mpirun)
  std::vector<std::pair<std::string, std::string>> libraries;  // name, version
  std::vector<std::pair<std::string, std::string>> env;        // variables that change results
};

// Records argv once at start-up (main); provenance reports it as the command line.
void set_command_line(int argc, char** argv);
const std::string& command_line();

// Reads the machine now. `ranks` is the MPI world size of the run.
Provenance collect_provenance(int ranks = 1);

// `foundry --version`: the commit and the libraries the binary was built with.
std::string version_text();

nlohmann::json to_json(const Provenance& p);
Provenance provenance_from_json(const nlohmann::json& j);
// The same, as comment lines: each starts with `prefix` ("# " for CSV, "" for Markdown lists).
std::string format_provenance(const Provenance& p, const std::string& prefix = "# ");

}  // namespace foundry
