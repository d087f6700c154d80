#include "bench/provenance.h"

#include <fmt/format.h>
#include <mpi.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include "base/build_info.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"

namespace foundry {

namespace {

std::string g_command_line;

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;!#~") == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "unknown";
}

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(version, &len) != MPI_SUCCESS) return "unknown";
  std::string v(version, static_cast<size_t>(len));
  auto comma = v.find(',');  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  if (comma != std::string::npos) v.resize(comma);
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\0')) v.pop_back();
  return v;
}

}  // namespace

void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) {
    if (i) g_command_line += ' ';
    g_command_line += shell_quote(argv[i]);
  }
}

const std::string& command_line() { return g_command_line; }

namespace {

// What the binary links, and how it was compiled.
std::vector<std::pair<std::string, std::string>> linked_libraries() {
  const dnnl_version_t* dv = dnnl_version();
  return {{"oneDNN", fmt::format("{}.{}.{}", dv->major, dv->minor, dv->patch)},
          {"MPI", mpi_library()},
          {"compiler", fmt::format("g++ {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__)},
          {"CUDA backend", gpu::built_with_cuda()
                               ? (gpu::built_with_nccl() ? "built, with NCCL" : "built")
                               : "not built"}};
}

}  // namespace

std::string version_text() {
  std::string text = fmt::format("foundry {}", build_commit());
  for (const auto& [name, version] : linked_libraries())
    text += fmt::format("\n  {}: {}", name, version);
  return text;
}

Provenance collect_provenance(int ranks) {
  Provenance p;
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  p.date = buf;
  p.command = g_command_line;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  p.host = host;
  p.cpu = cpu_model();
  p.cores = static_cast<int>(std::thread::hardware_concurrency());
  p.threads = omp_get_max_threads();
  p.ranks = ranks;
  p.libraries = {{"foundry", build_commit()}};  // Foundry's own commit first
  for (auto& library : linked_libraries()) p.libraries.push_back(std::move(library));
  for (const char* name : {"OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "FOUNDRY_GEMM_ROWS",
                           "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE",
                           "OMPI_MCA_coll_tuned_use_dynamic_rules", "FOUNDRY_POSE_AS_DEVICE"}) {
    if (const char* v = std::getenv(name)) p.env.emplace_back(name, v);
  }
  return p;
}

nlohmann::json to_json(const Provenance& p) {
  nlohmann::json j = {{"date", p.date}, {"command", p.command}, {"host", p.host}, {"cpu", p.cpu},
                      {"cores", p.cores}, {"threads", p.threads}, {"ranks", p.ranks}};
  j["libraries"] = nlohmann::json::object();
  for (const auto& [k, v] : p.libraries) j["libraries"][k] = v;
  j["env"] = nlohmann::json::object();
  for (const auto& [k, v] : p.env) j["env"][k] = v;
  return j;
}

Provenance provenance_from_json(const nlohmann::json& j) {
  Provenance p;
  p.date = j.value("date", "");
  p.command = j.value("command", "");
  p.host = j.value("host", "");
  p.cpu = j.value("cpu", "");
  p.cores = j.value("cores", 0);
  p.threads = j.value("threads", 0);
  p.ranks = j.value("ranks", 1);
  if (j.contains("libraries"))
    for (const auto& [k, v] : j["libraries"].items())
      p.libraries.emplace_back(k, v.get<std::string>());
  if (j.contains("env"))
    for (const auto& [k, v] : j["env"].items()) p.env.emplace_back(k, v.get<std::string>());
  return p;
}

std::string format_provenance(const Provenance& p, const std::string& prefix) {
  std::string out;
  out += fmt::format("{}date: {}\n", prefix, p.date);
  out += fmt::format("{}command: {}\n", prefix, p.command);
  out += fmt::format("{}host: {} | cpu: {} | cores: {} | threads: {} | ranks: {}\n", prefix,
                     p.host, p.cpu, p.cores, p.threads, p.ranks);
  std::string libs;
  for (const auto& [k, v] : p.libraries)
    libs += fmt::format("{}{} {}", libs.empty() ? "" : ", ", k, v);
  out += fmt::format("{}libraries: {}\n", prefix, libs);
  std::string env;
  for (const auto& [k, v] : p.env) env += fmt::format("{}{}={}", env.empty() ? "" : " ", k, v);
  out += fmt::format("{}env: {}\n", prefix,
                     env.empty() ? "(none of the variables that change results)" : env);
  return out;
}

}  // namespace foundry
