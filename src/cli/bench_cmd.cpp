// foundry bench: characterize the machine (collectives, GEMMs, memory bandwidth) and write a
// hardware profile. Each measurement has its own subcommand; `bench all` runs them together
// and writes the profile, CSV tables, plots and a Markdown report into one directory.
#include <omp.h>
#include <sched.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "base/device.h"
#include "base/error.h"
#include "base/io.h"
#include "base/progress.h"
#include "bench/comm_bench.h"
#include "bench/cpu_peak.h"
#include "bench/gemm_bench.h"
#include "bench/gpu_bench.h"
#include "bench/membw_bench.h"
#include "bench/profile.h"
#include "bench/provenance.h"
#include "bench/report.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "cuda/runtime.h"

namespace foundry::cli {

namespace {

struct BenchAllOptions {
  std::string out;
  std::string name;
  bool quick = false;
  bool merge = false;
  std::string only = "comm,gemm,membw";
  std::string device = "cpu";
};

int64_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

// A progress callback for the library benchmarks (rank 0 only).
std::function<void(int64_t, int64_t, const std::string&)> progress_to(
    std::unique_ptr<Progress>& bar, const std::string& label) {
  return [&bar, label](int64_t done, int64_t total, const std::string& what) {
    if (!bar) bar = std::make_unique<Progress>(label, total);
    bar->update(done, what);
  };
}

// The "gemm" and "compute" sections: cuBLASLt on the GPU, or oneDNN on this process's cores.
void measure_gemms(const BenchAllOptions& o, const std::optional<gpu::GpuInfo>& gpu,
                   const Provenance& provenance, json& sections) {
  GemmBenchOptions go = gpu ? (o.quick ? gpu_gemm_quick() : gpu_gemm_defaults()) : GemmBenchOptions{};
  if (o.quick && !gpu) {
    go.square_sizes = {256, 512, 1024};
    go.hidden = {512};
    go.ffn = {1024};
    go.experts = {8};
    go.offsize_from = 1016;
    go.offsize_to = 1032;
    go.repeats = 3;
  }
  std::unique_ptr<Progress> bar;
  go.on_progress = progress_to(bar, gpu ? "gemm (GPU)" : "gemm");
  const GemmBenchResult g = gpu ? run_gpu_gemm_bench(go, *gpu) : run_gemm_bench(go);
  if (bar) bar->finish();
  CpuPeak peak;
  if (gpu) {
    peak = gpu_peak(*gpu);
  } else {
    CpuInfo cpu = read_cpu_info();
    if (cpu.max_freq_hz == 0) cpu.measured_clock_hz = measure_clock_hz();  // no cpufreq (VMs)
    peak = cpu_peak(cpu, std::min(omp_get_max_threads(), std::max(1, cpu.physical_cores)));
  }
  sections["gemm"] = gemm_profile_section(g, provenance);
  sections["compute"] = compute_profile_section(g, peak, provenance);
  std::printf("%s\n", format_gemm_tables(g, peak).c_str());
  if (!g.all_valid)
    fail("bench all: a GEMM result did not match its reference", "see the table above");
}

// The "memory" section: the GPU's bandwidth kernels, or STREAM on this process's cores.
void measure_memory(const BenchAllOptions& o, const std::optional<gpu::GpuInfo>& gpu,
                    const Provenance& provenance, json& sections) {
  MembwOptions mo = gpu && o.quick ? gpu_membw_quick() : MembwOptions{};
  if (o.quick && !gpu) {
    mo.repeats = 4;
    mo.points_per_doubling = 1;
    mo.threads = {omp_get_max_threads()};
    mo.auto_bytes_cap = int64_t{512} << 20;  // a VM may report a GiB-sized LLC
  }
  std::unique_ptr<Progress> bar;
  if (!gpu) mo.on_progress = progress_to(bar, "membw");
  const MembwResult m = gpu ? run_gpu_membw_bench(mo, *gpu) : run_membw_bench(mo);
  if (bar) bar->finish();
  sections["memory"] = gpu ? gpu_memory_section(m, *gpu, provenance)
                           : memory_profile_section(m, provenance);
  std::printf("%s\n", (gpu ? format_gpu_membw_tables(m, *gpu) : format_membw_tables(m)).c_str());
  if (!m.all_valid)
    fail("bench all: a memory bandwidth result failed validation", "see the table above");
}

// The profile's "device" section: the GPU measured, or this machine's CPU.
json device_section(const std::optional<gpu::GpuInfo>& gpu, const Provenance& provenance) {
  if (gpu) return gpu_device_section(*gpu, gpu::visible_gpus());
  return {{"kind", "cpu"},
          {"name", provenance.cpu},
          {"memory_bytes", mem_total_bytes()},
          {"devices_per_node", 1},
          {"cores", provenance.cores},
          {"source", "measured: /proc/cpuinfo, /proc/meminfo"}};
}

// --only's benchmarks: {comm, gemm, membw}.
std::tuple<bool, bool, bool> parse_only(const std::string& only) {
  bool comm = false, gemm = false, membw = false;
  size_t start = 0;
  while (start <= only.size()) {
    const size_t comma = only.find(',', start);
    const std::string part =
        only.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part == "comm") comm = true;
    else if (part == "gemm") gemm = true;
    else if (part == "membw") membw = true;
    else
      fail(fmt::format("--only '{}': unknown benchmark '{}'", only, part),
           "choose from comm, gemm, membw (comma-separated)");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {comm, gemm, membw};
}

// The profile in --out to merge into (--merge), checked to be one; null for a new profile.
json profile_to_merge(const BenchAllOptions& o, const std::string& profile_path) {
  json profile;
  if (!o.merge || !path_exists(profile_path)) return profile;
  try {
    profile = json::parse(read_text_file(profile_path));
  } catch (const json::parse_error& e) {
    fail(fmt::format("{}: not valid JSON ({}), cannot --merge into it", profile_path, e.what()),
         "remove it or choose another --out");
  }
  parse_profile(profile, profile_path);  // validates it is a profile
  return profile;
}

// The collectives, on every rank (none with one rank: said on rank 0).
std::vector<CommBenchResult> measure_collectives(const BenchAllOptions& o, Communicator& world) {
  if (world.size() < 2) {
    if (world.rank() == 0)
      std::fprintf(stderr,
                   "bench all: 1 rank, collectives skipped (run under mpirun -np N to measure "
                   "them; add --merge to keep other rank counts in the profile)\n");
    return {};
  }
  CommBenchOptions co;
  if (o.quick) {
    co.max_bytes = int64_t{1} << 20;
    co.step_factor = 4;
    co.warmup = 2;
    co.iters = 5;
  }
  std::unique_ptr<Progress> bar;
  if (world.rank() == 0) co.on_progress = progress_to(bar, "collectives");
  std::vector<CommBenchResult> results = run_comm_bench(world, co);
  if (bar) bar->finish();
  return results;
}

// Rank 0: the profile (the measured sections and collectives merged into `profile`) written to
// --out with its report, tables and plots.
void write_profile(const BenchAllOptions& o, json profile, const std::string& profile_path,
                   const json& sections, const std::vector<CommBenchResult>& comm_results,
                   const std::optional<gpu::GpuInfo>& gpu_info, const Provenance& provenance) {
  std::vector<json> entries;
  for (const auto& r : comm_results) entries.push_back(collective_entry_json(r));
  const std::string name =
      !o.name.empty() ? o.name
                      : provenance.host + " (" + (gpu_info ? gpu_info->name : provenance.cpu) + ")";
  profile = merge_profile_collectives(profile, entries, provenance, name);
  for (auto& [key, value] : sections.items())
    profile[key] = merged_profile_section(key, profile.value(key, json()), value);
  // The device measured; a collectives-only run keeps the merged profile's (and its name).
  const bool measured_device = sections.contains("gemm") || sections.contains("memory");
  if (measured_device || !profile.contains("device")) {
    profile["device"] = device_section(gpu_info, provenance);
    profile["name"] = name;
  }
  if (!o.name.empty()) profile["name"] = o.name;
  profile["provenance"] = to_json(provenance);
  parse_profile(profile, profile_path);  // what plan will read must parse
  write_file_atomic(profile_path, profile.dump(2) + "\n");
  const ReportFiles files = write_report(profile, o.out);
  std::printf("wrote %s, %s/report.md, %zu CSV tables and %zu plots in %s\n", profile_path.c_str(),
              o.out.c_str(), files.csv.size(), files.png.size(), o.out.c_str());
  if (!files.plot_warning.empty())
    std::fprintf(stderr, "warning: %s\n", files.plot_warning.c_str());
}

void run_bench_all(const BenchAllOptions& o) {
  const DeviceSpec device = parse_device("--device", o.device);
  const auto [do_comm, do_gemm, do_membw] = parse_only(o.only);
  const std::string profile_path = o.out + "/profile.json";
  const json profile = profile_to_merge(o, profile_path);  // null: a new profile
  // A profile needs a compute rate: without gemm it can only come from the merged profile
  // (every rank reads it, so every rank refuses, before anything is measured).
  if (!do_gemm && !(profile.is_object() && profile.contains("compute")))
    fail(fmt::format("--only '{}' measures no GEMMs, and a hardware profile needs the compute "
                     "rate they give",
                     o.only),
         fmt::format("add gemm to --only, or --merge into a profile in {} that has one", o.out));

  // Every rank, before MPI starts: a missing GPU fails the job at once, not after the collectives.
  if (device.cuda && (do_gemm || do_membw)) gpu::check_gpu_visible(device.index, "--device " + device.name());
  // The profile merged into must be this machine's when a device is measured (its CPU's name,
  // or a GPU's kind here and its name once rank 0 has opened it); the collectives alone are
  // the interconnect's, for a profile of either kind.
  const bool on_gpu = device.cuda && (do_gemm || do_membw);
  if (do_gemm || do_membw)
    check_profile_device(
        profile,
        on_gpu ? json{{"kind", "gpu"}} : json{{"kind", "cpu"}, {"name", collect_provenance(1).cpu}},
        profile_path + " (--merge)");

  MpiSession session;
  Communicator& world = session.world();
  const int rank = world.rank(), ranks = world.size();
  std::optional<gpu::GpuInfo> gpu_info;  // --device cuda: GEMMs and bandwidth on rank 0's GPU
  if (rank == 0 && on_gpu) {
    gpu_info = gpu::open_gpu(device.index, "--device " + device.name());
    check_profile_device(profile, {{"kind", "gpu"}, {"name", gpu_info->name}},
                         profile_path + " (--merge)");
  }
  if (rank == 0 && !device.cuda && (do_gemm || do_membw))
    check_cpus_for_threads("bench all", omp_get_max_threads());
  const Provenance provenance = collect_provenance(ranks);
  if (rank == 0) {
    make_dirs(o.out);
    std::fprintf(stderr, "%s", format_provenance(provenance).c_str());
  }
  const std::vector<CommBenchResult> comm_results =
      do_comm ? measure_collectives(o, world) : std::vector<CommBenchResult>{};
  // Every rank has the counts summed over ranks: all refuse together, before anything is written.
  int64_t wrong = 0;
  for (const CommBenchResult& r : comm_results) wrong += r.wrong();
  if (wrong > 0) {
    if (rank == 0)
      for (const auto& r : comm_results) std::printf("%s\n", format_comm_table(r).c_str());
    fail(fmt::format("bench all: {} wrong collective result element{} (see the #wrong column); "
                     "no profile was written",
                     wrong, wrong == 1 ? "" : "s"),
         "a collective returned wrong data: rerun to see whether it repeats, and check the MPI "
         "installation (ompi_info) and any --mca settings");
  }
  // GEMMs and memory bandwidth: rank 0 alone, the others wait without spinning.
  if (rank == 0) {
    json sections = json::object();
    if (do_gemm) measure_gemms(o, gpu_info, provenance, sections);
    if (do_membw) measure_memory(o, gpu_info, provenance, sections);
    for (const auto& r : comm_results) std::printf("%s\n", format_comm_table(r).c_str());
    write_profile(o, profile, profile_path, sections, comm_results, gpu_info, provenance);
  }
  world.idle_barrier();
  session.finalize();
}

}  // namespace

// mpirun binds each rank to a core by default; rank 0's GEMM and STREAM threads would then
// share one core and the profile would report half the machine.
void check_cpus_for_threads(const std::string& command, int threads, const std::string& fix) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < threads)
    fail(fmt::format("{}: this process may run on {} CPU(s) but would use {} threads; the "
                     "figures would measure threads waiting for each other, not the machine",
                     command, CPU_COUNT(&set), threads),
         fix.empty() ? "run it with `mpirun --bind-to none ...` (Open MPI binds ranks to cores by "
                       "default), or set OMP_NUM_THREADS to the CPUs it has"
                     : fix);
}

void check_bench_outputs(const std::string& json_path, const std::string& csv_path,
                         const std::string& profile_path) {
  if (!json_path.empty())
    check_output_file("--json", json_path, {{"--profile", profile_path}, {"--csv", csv_path}},
                      is_bench_output);
  if (!csv_path.empty())
    check_output_file("--csv", csv_path, {{"--profile", profile_path}, {"--json", json_path}},
                      is_bench_output);
}

void register_bench_commands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Characterize this machine: collectives, GEMM throughput, memory bandwidth");
  bench->require_subcommand(1);
  register_bench_comm_command(*bench);
  register_bench_gemm_commands(*bench);
  register_bench_decode_command(*bench);

  CLI::App* all = bench->add_subcommand(
      "all", "Run every benchmark and write a hardware profile (JSON), CSV tables, plots and a "
             "Markdown report. Under mpirun the collectives are measured at the job's rank count.");
  auto o = std::make_shared<BenchAllOptions>();
  all->add_option("--out", o->out, "Output directory (profile.json, report.md, *.csv, *.png)")
      ->required();
  all->add_option("--name", o->name, "Profile name (default: host and CPU)");
  all->add_flag("--quick", o->quick,
                "Short sweeps (under a minute on a small machine; for smoke tests)");
  all->add_option("--device", o->device,
                  "Where the GEMMs and bandwidth run: cpu, or a GPU (cuda, cuda:N); collectives "
                  "stay MPI's")
      ->capture_default_str();
  all->add_flag("--merge", o->merge,
                "Keep what an existing OUT/profile.json has that this run does not measure (e.g. "
                "collectives at other rank counts)");
  all->add_option("--only", o->only,
                  "Benchmarks to run, comma-separated (default comm,gemm,membw)");
  all->callback([o] { run_bench_all(*o); });

  CLI::App* report = bench->add_subcommand(
      "report",
      "Rewrite the CSV tables, plots and Markdown report of a profile JSON (no measuring)");
  auto ro = std::make_shared<std::pair<std::string, std::string>>();
  report->add_option("--profile", ro->first, "Profile JSON (e.g. written by bench all)")
      ->required();
  report->add_option("--out", ro->second, "Output directory")->required();
  report->callback([ro] {
    // Any profile bench writes, a partial one too (only collectives, or only memory): the
    // report shows the sections it has.
    if (!path_exists(ro->first))
      fail(fmt::format("--profile {}: no such file", ro->first),
           "pass a profile JSON written by foundry bench (e.g. OUT/profile.json of bench all)");
    const json profile = read_profile_for_merge(ro->first);
    if (profile.value("version", json()) != 1)
      fail(fmt::format("{}: unsupported profile version {}", ro->first,
                       profile.contains("version") ? profile["version"].dump() : "(none)"),
           "this foundry reads version 1");
    const ReportFiles files = write_report(profile, ro->second);
    std::printf("wrote %s/report.md, %zu CSV tables and %zu plots\n", ro->second.c_str(),
                files.csv.size(), files.png.size());
    if (!files.plot_warning.empty())
      std::fprintf(stderr, "warning: %s\n", files.plot_warning.c_str());
  });
}

}  // namespace foundry::cli
