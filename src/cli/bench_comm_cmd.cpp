// foundry bench comm: time the collectives (all-reduce, reduce-scatter, all-gather,
// broadcast, all-to-all) over a range of message sizes under mpirun, nccl-tests style, check
// every result, and fit t(S) = α + S/β per operation and rank count. The measuring is in
// bench/comm_bench.h; this file parses flags, starts MPI and prints on rank 0.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/device.h"
#include "base/error.h"
#include "base/format.h"
#include "base/io.h"
#include "base/memory_budget.h"
#include "base/progress.h"
#include "bench/comm_bench.h"
#include "bench/gemm_bench.h"
#include "bench/membw_bench.h"
#include "bench/provenance.h"
#include "cli/commands.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"
#include "kernels/gemm.h"

namespace foundry::cli {

namespace {

struct BenchCommArgs {
  std::string min_bytes = "8";
  std::string max_bytes = "64M";
  std::string step_factor = "2";
  int warmup = 5;
  int iters = 20;
  std::string ops = "all";
  std::string dtype = "float";
  bool algorithms = false;
  std::string json_path, csv_path, profile_path;
  std::string device = "cpu";
  int inject_error = -1;  // hidden: corrupt one element on this rank (tests the checker)
};

int64_t parse_step_factor(const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    fail(fmt::format("-f/--stepfactor: '{}' is not an integer", text),
         "sizes grow by this integer factor from -b to -e, e.g. -f 2");
  return value;
}

CommBenchOptions options_from(const BenchCommArgs& a) {
  CommBenchOptions o;
  o.min_bytes = parse_byte_size(a.min_bytes, "-b/--minbytes");
  o.max_bytes = parse_byte_size(a.max_bytes, "-e/--maxbytes");
  o.step_factor = parse_step_factor(a.step_factor);
  o.warmup = a.warmup;
  o.iters = a.iters;
  o.ops = parse_ops(a.ops);
  if (parse_dtype(a.dtype) != DType::f32)
    fail(fmt::format("--dtype {}: only float (fp32) is measured", a.dtype),
         "the exact-result check relies on small integers in fp32; use --dtype float");
  o.sweep_algorithms = a.algorithms;
  o.corrupt_rank = a.inject_error;
  o.nccl = parse_device("--device", a.device).cuda;
  o.validate();
  return o;
}

// Rank 0's share of the work after the measurement: print and write files.
void report(const std::vector<CommBenchResult>& results, const CommBenchOptions& options,
            const Provenance& provenance, const BenchCommArgs& a) {
  for (const CommBenchResult& r : results) std::printf("\n%s", format_comm_table(r).c_str());
  std::fflush(stdout);
  if (!a.json_path.empty())
    write_file_atomic(a.json_path, comm_bench_json(results, options, provenance).dump(2) + "\n");
  if (!a.csv_path.empty()) write_file_atomic(a.csv_path, format_comm_csv(results, provenance));
  if (a.profile_path.empty()) return;
  int64_t wrong = 0;
  for (const CommBenchResult& r : results) wrong += r.wrong();
  // A collective that returned wrong data has no figure to plan with.
  if (wrong > 0)
    std::fprintf(stderr, "not merged into %s: some results are wrong\n", a.profile_path.c_str());
  else
    update_profile_file(a.profile_path, results, provenance);
}

// --device cuda: this rank's GPU (plain cuda: each rank of a host its own, as training picks
// them), a GPU per rank (NCCL refuses two ranks on one, with an error that does not say which)
// and room on each for the buffers and NCCL's own. Collective: every rank learns every rank's
// outcome and all fail together, with the first failing rank's reason. Returns the GPU's name.
std::string open_rank_gpu(const Communicator& world, const std::string& device_text,
                          const CommBenchOptions& options) {
  DeviceSpec device = parse_device("--device", device_text);
  std::string name, error;
  std::array<int64_t, 2> uuid{};
  try {
    if (!device.index_given) {
      const int gpus = gpu::visible_gpus();
      device.index = gpus > 0 ? rank_on_this_host(world) % gpus : 0;
    }
    name = gpu::open_gpu(device.index, "--device " + device.name()).name;
    uuid = gpu::current_gpu_uuid();
    const int64_t need = comm_bench_bytes(options, world.size()) +
                         gpu::nccl_buffer_bytes(std::getenv("NCCL_BUFFSIZE"));
    if (need > gpu::memory_free())
      error = fmt::format("bench comm needs {} of GPU memory (its buffers and NCCL's), but {} "
                          "({}) has {} free; lower -e/--maxbytes",
                          format_bytes(double(need), ByteUnit::MiB, 0), name, device.name(),
                          format_bytes(double(gpu::memory_free()), ByteUnit::MiB, 0));
  } catch (const Error& e) {
    error = e.what();
  }
  const std::vector<std::string> errors = allgather_strings(world, error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      fail(fmt::format("rank {}: {}", r, errors[r]),
           "bench comm --device cuda needs a visible GPU with room on every rank");
  std::vector<int64_t> all(2 * size_t(world.size()));
  world.allgather(uuid.data(), all.data(), 2);
  for (int r = 0; r < world.size(); ++r)
    for (int q = 0; q < r; ++q)
      if (all[2 * size_t(r)] == all[2 * size_t(q)] &&
          all[2 * size_t(r) + 1] == all[2 * size_t(q) + 1])
        fail(fmt::format("--device {}: ranks {} and {} share one GPU, and NCCL needs a GPU per "
                         "rank",
                         device_text, q, r),
             "run at most as many ranks as there are GPUs, with plain --device cuda (each rank "
             "takes its own), or measure MPI on the host with --device cpu");
  return name;
}

// Runs `work` on rank 0 and tells every rank whether it failed (rank 0 keeps the exception in
// `error`): a failure there must not leave the others waiting for it.
template <typename F>
bool failed_on_root(const Communicator& world, std::exception_ptr& error, F&& work) {
  if (world.rank() == 0) {
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
  }
  int64_t failed = error ? 1 : 0;
  world.broadcast(&failed, 1, /*root=*/0);
  return failed != 0;
}

void run_bench_comm(const BenchCommArgs& a) {
  // Flags are checked before MPI starts: a bad flag fails every rank the same way, at once.
  const CommBenchOptions parsed = options_from(a);
  MpiSession session(MpiSessionOptions{.allow_forced_algorithms = a.algorithms});
  const Communicator& world = session.world();
  const bool root = world.rank() == 0;
  // Rank 0 writes the files, so it checks them (another host need not have their directory).
  std::exception_ptr output_error;
  if (failed_on_root(world, output_error, [&] {
        check_bench_outputs(a.json_path, a.csv_path, a.profile_path);
        // A --profile that is not a hardware profile fails now, not after the
        // whole benchmark.
        if (!a.profile_path.empty()) read_profile_for_merge(a.profile_path);
      })) {
    session.finalize();
    if (!root) std::exit(0);  // only rank 0 explains, as at the end
    std::rethrow_exception(output_error);
  }
  check_memory_on_every_host(
      world, {"bench comm", {{"buffers", comm_bench_bytes(parsed, world.size())}}}, memory_budget(),
      [](const MemoryNeed&, const MemoryBudget&) { return std::string("lower -e/--maxbytes"); });

  const std::string gpu_name = parsed.nccl ? open_rank_gpu(world, a.device, parsed) : "";

  Provenance provenance;
  std::unique_ptr<Progress> progress;
  CommBenchOptions options = parsed;
  if (root && world.size() >= 2) {
    provenance = collect_provenance(world.size());
    if (!gpu_name.empty()) provenance.libraries.emplace_back("gpu", gpu_name);
    std::printf("%s", format_provenance(provenance, "# ").c_str());
    std::printf("# foundry bench comm: %s .. %s by x%lld, warm-up %d, iterations %d, float32%s\n"
                "# time per iteration = max over ranks (barrier, then each rank times the "
                "call); algbw = S/avg, busbw = algbw x factor (nccl-tests conventions)\n",
                format_size(options.min_bytes).c_str(),
                format_size(options.max_bytes).c_str(),
                static_cast<long long>(options.step_factor), options.warmup, options.iters,
                options.nccl ? ", NCCL on the GPUs' buffers" : "");
    std::fflush(stdout);
    options.on_progress = [&progress](int64_t done, int64_t total, const std::string& what) {
      if (!progress) progress = std::make_unique<Progress>("bench comm", total, "sizes");
      progress->update(done, what);
    };
  }

  const std::vector<CommBenchResult> results = run_comm_bench(world, options);
  // On a terminal, close the bar's line; plain logs already have their 100 % line.
  if (progress && Progress::stderr_is_terminal()) progress->finish();

  // Rank 0 prints and writes files; a failure there must not leave the other ranks waiting
  // in MPI_Finalize for it, so the outcome is shared first and every rank finalizes.
  std::exception_ptr report_error;
  const bool failed =
      failed_on_root(world, report_error, [&] { report(results, options, provenance, a); });
  int64_t wrong = 0;
  for (const CommBenchResult& r : results) wrong += r.wrong();  // already summed over ranks
  session.finalize();

  // Only rank 0 explains, and its non-zero exit fails the job. The others leave quietly: a
  // non-zero exit of theirs would make mpirun kill rank 0, possibly before it printed why.
  if (!root && (failed || wrong > 0)) std::exit(0);
  if (report_error) std::rethrow_exception(report_error);
  if (wrong > 0)
    fail(fmt::format("{} wrong result element{} (see the #wrong column)", wrong,
                     wrong == 1 ? "" : "s"),
         "a collective returned wrong data: rerun to see whether it repeats, and check the "
         "MPI installation (ompi_info) and any --mca settings");
}

}  // namespace

void register_bench_comm_command(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "comm",
      "Time collectives (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all) "
      "under mpirun; report algbw/busbw and a latency-bandwidth fit");
  cmd->footer(
      "Run it under mpirun with at least 2 ranks, e.g.\n"
      "  OMP_NUM_THREADS=1 mpirun -np 2 foundry bench comm -b 8 -e 64M -f 2\n"
      "As root add --allow-run-as-root; with more ranks than cores add --oversubscribe.\n"
      "Sizes take K/M/G suffixes (powers of 1024). S is the whole logical buffer (nccl-tests):\n"
      "the vector for all_reduce and broadcast, count x ranks for all_gather and\n"
      "reduce_scatter, one rank's send buffer for all_to_all. See docs/bench-comm.md.");
  auto a = std::make_shared<BenchCommArgs>();
  cmd->add_option("-b,--minbytes", a->min_bytes, "Smallest message size S (default 8)")
      ->type_name("SIZE");
  cmd->add_option("-e,--maxbytes", a->max_bytes, "Largest message size S (default 64M)")
      ->type_name("SIZE");
  cmd->add_option("-f,--stepfactor", a->step_factor, "Size multiplier between steps (default 2)")
      ->type_name("INT");
  cmd->add_option("-w,--warmup", a->warmup, "Untimed iterations per size (default 5)");
  cmd->add_option("-n,--iters", a->iters, "Timed iterations per size (default 20)");
  cmd->add_option("--op", a->ops,
                  "Operations: all, or a comma list of all_reduce, reduce_scatter, all_gather, "
                  "broadcast, all_to_all (default all)")
      ->type_name("LIST");
  cmd->add_option("--dtype", a->dtype, "Element type: float (fp32; the only one)");
  cmd->add_flag("--algorithms", a->algorithms,
                "Also run every Open MPI coll/tuned algorithm of each operation (forced at run "
                "time through MPI_T; one table per algorithm)");
  cmd->add_option("--device", a->device,
                  "cpu (MPI on host buffers, the default), or cuda / cuda:N: NCCL on GPU buffers, "
                  "each rank on its own GPU (plain cuda) or all on GPU N")
      ->type_name("DEVICE");
  cmd->add_option("--json", a->json_path, "Write results and provenance as JSON to FILE")
      ->type_name("FILE");
  cmd->add_option("--csv", a->csv_path, "Write results as CSV to FILE")->type_name("FILE");
  cmd->add_option("--profile", a->profile_path,
                  "Merge the fits into hardware profile FILE (created if absent; entries with "
                  "the same op, ranks and algorithm are replaced)")
      ->type_name("FILE");
  cmd->add_option("--inject-error", a->inject_error,
                  "Corrupt one result element on this rank (tests the checker)")
      ->group("");
  cmd->callback([a] { run_bench_comm(*a); });
}

}  // namespace foundry::cli
