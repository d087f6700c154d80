// The collective benchmark behind `foundry bench comm` (and the collective part of
// `foundry bench all`): time all-reduce, reduce-scatter, all-gather, broadcast and all-to-all
// over a range of message sizes, check every result exactly, and fit t(S) = α + S/β per
// operation and rank count. Usage, output and measured figures: docs/bench-comm.md.
//
// Sizes and bandwidth (the nccl-tests conventions). S, the "size" of a measurement, is the
// whole logical buffer: the full vector for all-reduce and broadcast; count × ranks for
// all-gather and reduce-scatter (count per rank); the full send buffer of one rank for
// all-to-all. algbw = S / t, busbw = algbw × factor with factor 2(n−1)/n for all-reduce,
// (n−1)/n for reduce-scatter, all-gather and all-to-all, and 1 for broadcast: busbw is what
// each rank's link carries, comparable to the link's peak whatever n is.
//
// Timing. Per iteration every rank enters a barrier, then times the operation alone. An
// iteration's time is the maximum over ranks (the collective is done when its slowest rank
// is), taken after the timed loop so the loop itself has no extra communication. Reported:
// the mean of the iteration times, and min / p50 / p99 / max of the same samples.
//
// Correctness. Inputs are small integers in fp32, value(rank, i) = (rank + 1) · (i mod 7 + 1),
// so every sum is exact and each rank knows its expected result in advance. After the timed
// loop, one more run starts from freshly written inputs and sentinel-filled outputs (an
// operation that silently did nothing is caught too) and is compared element by element.
// #wrong is the number of wrong elements summed over ranks.
//
// The library prints nothing; callers print (on rank 0) with the formatters below.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench/latbw_fit.h"
#include "bench/provenance.h"
#include "comm/comm.h"

namespace foundry {

enum class CollectiveOp { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };

inline constexpr CollectiveOp kAllCollectiveOps[] = {
    CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather,
    CollectiveOp::broadcast, CollectiveOp::all_to_all};

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all".
std::string_view op_name(CollectiveOp op);
// The MPI call that implements it, and Open MPI coll/tuned's name for that call in its
// algorithm variables ("allreduce", "reduce_scatter_block", "allgather", "bcast", "alltoall").
std::string_view mpi_call(CollectiveOp op);
std::string_view tuned_collective(CollectiveOp op);
// "all" or a comma list of op names; errors name the --op flag.
std::vector<CollectiveOp> parse_ops(const std::string& list);

// busbw / algbw for `ranks` processes.
double busbw_factor(CollectiveOp op, int ranks);

// "8", "64K", "1M", "2G" (K/M/G are powers of 1024, either case). `flag` names the option
// in errors ("-b/--minbytes").
int64_t parse_byte_size(const std::string& text, const std::string& flag);

// One message size as an operation runs it: S in bytes, `count` fp32 elements in S, and
// `block` elements per rank (count / ranks for the blocked operations, count otherwise).
// The nominal size is rounded down so every rank's block is whole, and up to at least one
// element per block.
struct MessageShape {
  int64_t bytes = 0;
  int64_t count = 0;
  int64_t block = 0;
};
MessageShape message_shape(CollectiveOp op, int ranks, int64_t nominal_bytes);

struct CommBenchOptions {
  int64_t min_bytes = 8;                 // -b
  int64_t max_bytes = int64_t(64) << 20;  // -e
  int64_t step_factor = 2;               // -f
  int warmup = 5;                        // -w
  int iters = 20;                        // -n
  std::vector<CollectiveOp> ops{std::begin(kAllCollectiveOps), std::end(kAllCollectiveOps)};
  // Also run every Open MPI coll/tuned algorithm of each op (see comm/coll_tuning.h); needs
  // an MpiSession created with allow_forced_algorithms.
  bool sweep_algorithms = false;
  // Run the collectives with NCCL on device buffers of this rank's GPU (the caller has made
  // it current: `bench comm --device cuda`), one NCCL group over the communicator's ranks;
  // inputs are written and results checked through host copies, outside the timed calls.
  bool nccl = false;
  // Testing the checker: this rank changes one element of its result after the check run.
  int corrupt_rank = -1;
  // Called on every rank after each measured size: (sizes done, sizes in total, what).
  std::function<void(int64_t, int64_t, const std::string&)> on_progress;

  // Throws foundry::Error naming the flag of the first bad value.
  void validate() const;
};

// The bytes one rank holds for run_comm_bench(options) over `ranks` ranks: the send and
// receive buffers of the largest message, and MPI's temporary copy of it.
int64_t comm_bench_bytes(const CommBenchOptions& options, int ranks);

// The nominal sizes min, min·f, min·f², … ≤ max (validated as in CommBenchOptions).
std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, int64_t factor);

struct TimeStats {
  double avg_s = 0, min_s = 0, p50_s = 0, p99_s = 0, max_s = 0;
};
// Mean, and nearest-rank percentiles: the p-th percentile is the smallest sample with at
// least p % of the samples at or below it (so it is always a measured value; with 20
// samples p99 is the maximum).
TimeStats time_stats(std::span<const double> samples);

struct CommBenchPoint {
  int64_t bytes = 0;  // S
  int64_t count = 0;  // fp32 elements in S
  TimeStats time;
  double algbw_bytes_per_s = 0;
  double busbw_bytes_per_s = 0;
  int64_t wrong = 0;  // wrong elements, summed over ranks
};

// One measured size from its per-iteration times (already the max over ranks): the time
// statistics, algbw = S / avg and busbw = algbw × busbw_factor.
CommBenchPoint summarize_point(CollectiveOp op, int ranks, const MessageShape& shape,
                               std::span<const double> iteration_s, int64_t wrong);

struct CommBenchResult {
  CollectiveOp op = CollectiveOp::all_reduce;
  int ranks = 0;
  // "default" when coll/tuned's decision rules chose per call; otherwise Open MPI's name of
  // the forced algorithm, whose variable value is algorithm_id; "nccl" for NCCL's.
  std::string algorithm = "default";
  int algorithm_id = 0;
  std::vector<CommBenchPoint> points;
  std::optional<LatBwFit> fit;  // fitted on p50 times; absent with fewer than 2 sizes

  int64_t wrong() const;
};

// Runs the benchmark on every rank of `comm` (collective: all ranks call it with the same
// options) and returns the same results on every rank. Needs at least 2 ranks.
std::vector<CommBenchResult> run_comm_bench(const Communicator& comm,
                                            const CommBenchOptions& options);

// Correctness pieces, exposed for tests. The exact input of `rank` at element `index`.
inline float comm_input_value(int rank, int64_t index) {
  return static_cast<float>((rank + 1) * (index % 7 + 1));
}
// Writes rank `rank`'s inputs for `op` into `send` (and, for broadcast, into `recv`, the
// in-place buffer) and fills the rest of `recv` with a sentinel no correct result contains.
// Buffer sizes: see send_elements / recv_elements.
void fill_comm_inputs(CollectiveOp op, int ranks, int rank, const MessageShape& shape,
                      float* send, float* recv);
int64_t send_elements(CollectiveOp op, const MessageShape& shape);  // 0 for broadcast
int64_t recv_elements(CollectiveOp op, const MessageShape& shape);
// The number of elements of rank `rank`'s result that differ from the exact answer.
int64_t count_wrong(CollectiveOp op, int ranks, int rank, const MessageShape& shape,
                    const float* recv);

// The NCCL call that implements it ("ncclAllReduce", …, "ncclSend/ncclRecv" for all-to-all).
std::string_view nccl_call(CollectiveOp op);

// "default (tuned decision rules)", "ring (coll_tuned_allreduce_algorithm=4)" or "NCCL".
std::string describe_algorithm(const CommBenchResult& result);

// The nccl-tests style table of one result, with a heading and the fit below it.
std::string format_comm_table(const CommBenchResult& result);
// All points as CSV, provenance first as "# " comment lines, one line per fit at the end.
std::string format_comm_csv(std::span<const CommBenchResult> results, const Provenance& provenance);

// One hardware-profile collective entry (keys and SI units as in docs/bench-comm.md):
// {"op", "ranks", "dtype", "algorithm", "fit": {...}, "points": [...], "source"}. "fit" is
// left out when there is none to give (a single size, or times that do not grow with size).
nlohmann::json collective_entry_json(const CommBenchResult& result);
// The whole run: {"format": "foundry-bench-comm", "version": 1, "provenance", "settings",
// "collectives": [entries]}.
nlohmann::json comm_bench_json(std::span<const CommBenchResult> results,
                               const CommBenchOptions& options, const Provenance& provenance);

// Merges collective entries into a hardware profile: an entry replaces the one with the same
// op, ranks and algorithm (in place), others are appended, everything else is kept. A null
// `profile` starts a new one: {"format": "foundry-hardware-profile", "version": 1, "name",
// "provenance", "collectives": []}. Throws when `profile` is not a hardware profile.
nlohmann::json merge_profile_collectives(nlohmann::json profile,
                                         std::span<const nlohmann::json> entries,
                                         const Provenance& provenance, const std::string& name);
// The same on a file: read it if present, merge, write atomically.
void update_profile_file(const std::string& path, std::span<const CommBenchResult> results,
                         const Provenance& provenance);

}  // namespace foundry
