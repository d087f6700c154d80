#include "bench/comm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <memory>

#include "base/error.h"
#include "base/io.h"
#include "base/timer.h"
#include "bench/membw_bench.h"
#include "bench/profile.h"
#include "comm/coll_tuning.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"
#include "model/backends.h"

namespace foundry {

namespace {

// Outputs start filled with this: no correct result is negative.
constexpr float kSentinel = -1.0f;

int64_t checked_multiply(int64_t a, int64_t b) {
  return (b != 0 && a > INT64_MAX / b) ? INT64_MAX : a * b;
}

std::string fit_text(const CommBenchResult& r) {
  if (!r.fit) return "none (needs at least 2 message sizes)";
  const LatBwFit& f = *r.fit;
  if (f.beta_bytes_per_s <= 0)
    return fmt::format("none (time does not grow with size over {} .. {}; latency {:.2f} us)",
                       format_size(f.min_bytes), format_size(f.max_bytes), f.alpha_s * 1e6);
  return fmt::format("t(S) = {:.2f} us + S / {:.3f} GB/s  over {} .. {} ({} sizes, p50 "
                     "times), worst relative residual {:.1f} %",
                     f.alpha_s * 1e6, f.beta_bytes_per_s / 1e9, format_size(f.min_bytes),
                     format_size(f.max_bytes), f.samples, 100 * f.max_rel_residual);
}

}  // namespace

// ---- names, sizes, factors ------------------------------------------------------------

std::string_view op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::broadcast: return "broadcast";
    case CollectiveOp::all_to_all: return "all_to_all";
  }
  return "?";
}

std::string_view mpi_call(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "MPI_Allreduce";
    case CollectiveOp::reduce_scatter: return "MPI_Reduce_scatter_block";
    case CollectiveOp::all_gather: return "MPI_Allgather";
    case CollectiveOp::broadcast: return "MPI_Bcast";
    case CollectiveOp::all_to_all: return "MPI_Alltoall";
  }
  return "?";
}

std::string_view tuned_collective(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "allreduce";
    case CollectiveOp::reduce_scatter: return "reduce_scatter_block";
    case CollectiveOp::all_gather: return "allgather";
    case CollectiveOp::broadcast: return "bcast";
    case CollectiveOp::all_to_all: return "alltoall";
  }
  return "?";
}

std::vector<CollectiveOp> parse_ops(const std::string& list) {
  const std::string names = "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all";
  std::vector<CollectiveOp> ops;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name == "all") {
      ops.assign(std::begin(kAllCollectiveOps), std::end(kAllCollectiveOps));
    } else {
      bool found = false;
      for (CollectiveOp op : kAllCollectiveOps) {
        if (op_name(op) == name) {
          if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
          found = true;
        }
      }
      if (!found)
        fail(fmt::format("--op: unknown operation '{}'", name),
             fmt::format("use a comma list of {}, or all", names));
    }
    start = end + 1;
  }
  if (ops.empty()) fail("--op: no operation given", fmt::format("use {}, or all", names));
  return ops;
}

double busbw_factor(CollectiveOp op, int ranks) {
  const double n = ranks;
  switch (op) {
    // Ring all-reduce: every rank sends and receives 2(n−1)/n of the vector
    // (reduce-scatter, then all-gather).
    case CollectiveOp::all_reduce: return 2.0 * (n - 1) / n;
    // Every rank must receive (or send) the n−1 blocks it does not own.
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather:
    case CollectiveOp::all_to_all: return (n - 1) / n;
    // A pipelined broadcast moves the whole vector over every link once.
    case CollectiveOp::broadcast: return 1.0;
  }
  return 1.0;
}

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  const std::string hint = "give a byte count with an optional K, M or G suffix (powers of "
                           "1024), e.g. 8, 64K, 1M, 2G";
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits + 1 < text.size())
    fail(fmt::format("{}: '{}' is not a size", flag, text), hint);
  int shift = 0;
  if (digits < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[digits]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: fail(fmt::format("{}: '{}' has an unknown size suffix", flag, text), hint);
    }
  }
  if (digits > 12) fail(fmt::format("{}: '{}' is too large", flag, text), hint);
  const int64_t value = std::stoll(text.substr(0, digits));
  if (value > (INT64_MAX >> shift)) fail(fmt::format("{}: '{}' is too large", flag, text), hint);
  return value << shift;
}

MessageShape message_shape(CollectiveOp op, int ranks, int64_t nominal_bytes) {
  MessageShape s;
  const int64_t elements = std::max<int64_t>(1, nominal_bytes / int64_t(sizeof(float)));
  if (op == CollectiveOp::all_reduce || op == CollectiveOp::broadcast) {
    s.count = elements;
    s.block = elements;
  } else {
    s.block = std::max<int64_t>(1, elements / ranks);
    s.count = s.block * ranks;
  }
  s.bytes = s.count * int64_t(sizeof(float));
  return s;
}

void CommBenchOptions::validate() const {
  if (min_bytes < 1)
    fail(fmt::format("-b/--minbytes must be at least 1 byte (got {})", min_bytes));
  if (max_bytes < min_bytes)
    fail(fmt::format("-b/--minbytes ({}) is larger than -e/--maxbytes ({})",
                     format_size(min_bytes), format_size(max_bytes)),
         "the size range runs from -b up to -e, e.g. -b 8 -e 64M");
  // MPI counts are int: a buffer of max_bytes/4 fp32 elements must fit one; 4 GiB is the
  // documented bound, with room to spare.
  if (max_bytes > (int64_t{4} << 30))
    fail(fmt::format("-e/--maxbytes {} is above 4 GiB, the largest message bench comm sends "
                     "(MPI counts {} fp32 elements at most)",
                     format_size(max_bytes), INT_MAX),
         "use -e 4G or less");
  if (step_factor < 2)
    fail(fmt::format("-f/--stepfactor must be an integer of at least 2 (got {})", step_factor),
         "sizes grow by this factor from -b to -e, e.g. -f 2");
  if (warmup < 0) fail(fmt::format("-w/--warmup must be 0 or more (got {})", warmup));
  if (iters < 1) fail(fmt::format("-n/--iters must be at least 1 (got {})", iters));
  if (ops.empty()) fail("--op: no operation given");
  if (nccl && sweep_algorithms)
    fail("--algorithms forces Open MPI's algorithms, but --device cuda measures NCCL's",
         "leave out --algorithms (NCCL picks its own; NCCL_ALGO and NCCL_PROTO restrict it)");
}

std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, int64_t factor) {
  CommBenchOptions check;
  check.min_bytes = min_bytes;
  check.max_bytes = max_bytes;
  check.step_factor = factor;
  check.validate();
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s <= max_bytes; s = checked_multiply(s, factor)) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;
  }
  return sizes;
}

TimeStats time_stats(std::span<const double> samples) {
  FOUNDRY_CHECK(!samples.empty());
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  auto percentile = [&](double p) {
    const size_t n = sorted.size();
    size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * double(n)));
    return sorted[std::clamp<size_t>(rank, 1, n) - 1];
  };
  TimeStats t;
  double sum = 0;
  for (double s : sorted) sum += s;
  t.avg_s = sum / double(sorted.size());
  t.min_s = sorted.front();
  t.max_s = sorted.back();
  t.p50_s = percentile(50);
  t.p99_s = percentile(99);
  return t;
}

CommBenchPoint summarize_point(CollectiveOp op, int ranks, const MessageShape& shape,
                               std::span<const double> iteration_s, int64_t wrong) {
  CommBenchPoint p;
  p.bytes = shape.bytes;
  p.count = shape.count;
  p.time = time_stats(iteration_s);
  p.algbw_bytes_per_s = double(shape.bytes) / p.time.avg_s;
  p.busbw_bytes_per_s = p.algbw_bytes_per_s * busbw_factor(op, ranks);
  p.wrong = wrong;
  return p;
}

int64_t CommBenchResult::wrong() const {
  int64_t total = 0;
  for (const CommBenchPoint& p : points) total += p.wrong;
  return total;
}

// ---- exact inputs and the checker -----------------------------------------------------
//
// Every element's value is (source rank + 1) · (g mod 7 + 1), where g is the element's
// index in the source rank's send buffer, offset for all-gather by the rank's block (so the
// gathered vector is one continuous pattern per block). The largest sum, over n ranks, is
// 7 · n(n+1)/2: exact in fp32 for any rank count a benchmark runs.

int64_t send_elements(CollectiveOp op, const MessageShape& shape) {
  switch (op) {
    case CollectiveOp::all_gather: return shape.block;
    case CollectiveOp::broadcast: return 0;  // in place in the receive buffer
    default: return shape.count;
  }
}

int64_t recv_elements(CollectiveOp op, const MessageShape& shape) {
  return op == CollectiveOp::reduce_scatter ? shape.block : shape.count;
}

void fill_comm_inputs(CollectiveOp op, int ranks, int rank, const MessageShape& shape,
                      float* send, float* recv) {
  const int64_t offset = op == CollectiveOp::all_gather ? rank * shape.block : 0;
  for (int64_t i = 0; i < send_elements(op, shape); ++i)
    send[i] = comm_input_value(rank, offset + i);
  const int64_t n = recv_elements(op, shape);
  if (op == CollectiveOp::broadcast && rank == 0) {
    for (int64_t i = 0; i < n; ++i) recv[i] = comm_input_value(0, i);
  } else {
    std::fill(recv, recv + n, kSentinel);
  }
}

int64_t count_wrong(CollectiveOp op, int ranks, int rank, const MessageShape& shape,
                    const float* recv) {
  const float rank_sum = float(ranks) * float(ranks + 1) / 2;  // Σ (r + 1)
  int64_t wrong = 0;
  const int64_t n = recv_elements(op, shape);
  for (int64_t i = 0; i < n; ++i) {
    float expected = 0;
    switch (op) {
      case CollectiveOp::all_reduce:
        expected = rank_sum * float(i % 7 + 1);
        break;
      case CollectiveOp::reduce_scatter:  // block `rank` of the summed vector
        expected = rank_sum * float((rank * shape.block + i) % 7 + 1);
        break;
      case CollectiveOp::all_gather:  // block s came from rank s
        expected = comm_input_value(static_cast<int>(i / shape.block), i);
        break;
      case CollectiveOp::broadcast:
        expected = comm_input_value(0, i);
        break;
      case CollectiveOp::all_to_all: {  // block s came from rank s: its block `rank`
        const int source = static_cast<int>(i / shape.block);
        expected = comm_input_value(source, rank * shape.block + i % shape.block);
        break;
      }
    }
    wrong += recv[i] != expected;
  }
  return wrong;
}

// ---- measurement ----------------------------------------------------------------------

namespace {

// Where the collectives run: MPI on host buffers, or NCCL on device buffers. `send` and
// `recv` are the host side, where inputs are written and results checked.
class Runner {
 public:
  virtual ~Runner() = default;
  // Buffers for the largest message of an op, reused by every size.
  virtual void resize(int64_t send_elements, int64_t recv_elements) {
    send.resize(size_t(std::max<int64_t>(1, send_elements)));
    recv.resize(size_t(std::max<int64_t>(1, recv_elements)));
  }
  // The host buffers to where the calls read them, and the results back.
  virtual void load() {}
  virtual void fetch() {}
  // One call, complete on return.
  virtual void run(CollectiveOp op, const MessageShape& s) = 0;

  std::vector<float> send, recv;
};

class MpiRunner final : public Runner {
 public:
  explicit MpiRunner(const Communicator& comm) : comm_(&comm) {}
  void set_comm(const Communicator& comm) { comm_ = &comm; }
  void run(CollectiveOp op, const MessageShape& s) override {
    switch (op) {
      case CollectiveOp::all_reduce:
        comm_->allreduce(send.data(), recv.data(), size_t(s.count));
        break;
      case CollectiveOp::reduce_scatter:
        comm_->reduce_scatter(send.data(), recv.data(), size_t(s.block));
        break;
      case CollectiveOp::all_gather:
        comm_->allgather(send.data(), recv.data(), size_t(s.block));
        break;
      case CollectiveOp::broadcast:
        comm_->broadcast(recv.data(), size_t(s.count), /*root=*/0);
        break;
      case CollectiveOp::all_to_all:
        comm_->alltoall(send.data(), recv.data(), size_t(s.block));
        break;
    }
  }

 private:
  const Communicator* comm_;
};

class NcclRunner final : public Runner {
 public:
  // Collective over `comm`.
  explicit NcclRunner(const Communicator& comm) : group_(open_nccl_group(comm)) {}
  void resize(int64_t send_elements, int64_t recv_elements) override {
    Runner::resize(send_elements, recv_elements);
    d_send_ = gpu::DeviceBuffer();  // the last op's buffers go before the next op's come
    d_recv_ = gpu::DeviceBuffer();
    d_send_ = gpu::DeviceBuffer(bytes(send));
    d_recv_ = gpu::DeviceBuffer(bytes(recv));
  }
  void load() override {
    d_send_.upload(send.data(), bytes(send));
    d_recv_.upload(recv.data(), bytes(recv));
  }
  void fetch() override { d_recv_.download(recv.data(), bytes(recv)); }
  void run(CollectiveOp op, const MessageShape& s) override {
    const float* in = d_send_.as<float>();
    float* out = d_recv_.as<float>();
    switch (op) {
      case CollectiveOp::all_reduce: group_->all_reduce(in, out, s.count); break;
      case CollectiveOp::reduce_scatter: group_->reduce_scatter(in, out, s.block); break;
      case CollectiveOp::all_gather: group_->all_gather(in, out, s.block); break;
      case CollectiveOp::broadcast: group_->broadcast(out, s.count, /*root=*/0); break;
      case CollectiveOp::all_to_all: group_->all_to_all(in, out, s.block); break;
    }
    group_->synchronize();
  }

 private:
  static int64_t bytes(const std::vector<float>& v) {
    return int64_t(v.size() * sizeof(float));
  }
  std::unique_ptr<gpu::NcclGroup> group_;
  gpu::DeviceBuffer d_send_, d_recv_;
};

CommBenchPoint measure_size(const Communicator& comm, CollectiveOp op, Runner& b,
                            const MessageShape& shape, const CommBenchOptions& options) {
  const int rank = comm.rank(), ranks = comm.size();
  fill_comm_inputs(op, ranks, rank, shape, b.send.data(), b.recv.data());
  b.load();
  for (int i = 0; i < options.warmup; ++i) {
    comm.barrier();
    b.run(op, shape);
  }
  // The barrier lines the ranks up so each iteration measures the collective, not the
  // previous iteration's skew; each rank times only the call itself.
  std::vector<double> samples(size_t(options.iters));
  for (int i = 0; i < options.iters; ++i) {
    comm.barrier();
    const double start = now_seconds();
    b.run(op, shape);
    samples[size_t(i)] = now_seconds() - start;
  }

  // The check run: fresh inputs (broadcast works in place and has overwritten them), outputs
  // reset to the sentinel so a stale correct result from the timed loop cannot hide a call
  // that did nothing.
  fill_comm_inputs(op, ranks, rank, shape, b.send.data(), b.recv.data());
  b.load();
  comm.barrier();
  b.run(op, shape);
  b.fetch();
  if (rank == options.corrupt_rank) b.recv[0] += 1.0f;
  int64_t wrong = count_wrong(op, ranks, rank, shape, b.recv.data());

  // One reduction per size, after the loop: the iteration's time is its slowest rank's.
  comm.allreduce(samples.data(), samples.data(), samples.size(), ReduceOp::max);
  comm.allreduce(&wrong, &wrong, 1, ReduceOp::sum);

  return summarize_point(op, ranks, shape, samples, wrong);
}

// The sizes an op really runs at this rank count: nominal sizes rounded to whole blocks,
// with the duplicates that rounding makes at the small end removed.
std::vector<MessageShape> shapes_for(CollectiveOp op, int ranks, std::span<const int64_t> sizes) {
  std::vector<MessageShape> shapes;
  for (int64_t nominal : sizes) {
    const MessageShape s = message_shape(op, ranks, nominal);
    if (shapes.empty() || shapes.back().bytes != s.bytes) shapes.push_back(s);
  }
  return shapes;
}

struct Variant {
  int id = 0;  // 0: tuned's decision rules
  std::string name = "default";
};

// The algorithms to run `op` with. Without a sweep, one variant: whatever the library does,
// which is tuned's decision rules unless the user forced an algorithm with `mpirun --mca`;
// that is detected so the label does not lie. With a sweep, every algorithm tuned offers.
std::vector<Variant> variants_for(CollectiveOp op, int ranks, const CollTuning* tuning,
                                  bool sweep) {
  const std::string coll(tuned_collective(op));
  std::vector<Variant> variants;
  const int forced = tuning && tuning->available() && tuning->dynamic_rules()
                         ? tuning->forced(coll) : 0;
  if (forced != 0) variants.push_back({forced, tuning->algorithm_name(coll, forced)});
  else variants.push_back({});
  if (sweep) {
    for (const TunedAlgorithm& a : tuning->algorithms(coll)) {
      // tuned's two-process algorithms return an error on any other rank count.
      if (a.name.find("two_proc") != std::string::npos && ranks != 2) continue;
      if (a.id != forced) variants.push_back({a.id, a.name});
    }
  }
  return variants;
}

}  // namespace

int64_t comm_bench_bytes(const CommBenchOptions& options, int ranks) {
  const std::vector<int64_t> sizes =
      size_sweep(options.min_bytes, options.max_bytes, options.step_factor);
  int64_t most = 0;
  for (CollectiveOp op : options.ops) {
    const MessageShape largest = shapes_for(op, ranks, sizes).back();
    // Open MPI's reduction and all-to-all algorithms allocate a temporary buffer of the
    // message's size besides the benchmark's own.
    const int64_t elements = send_elements(op, largest) + 2 * recv_elements(op, largest);
    most = std::max(most, int64_t(sizeof(float)) * elements);
  }
  return most;
}

namespace {

// Open MPI's collective tuning (MPI_T), where this process can use it; a sweep of algorithms
// needs it, and NCCL's algorithms are NCCL's: nothing to label. (CollTuning does not move.)
void open_tuning(const CommBenchOptions& options, std::optional<CollTuning>& tuning) {
  try {
    if (!options.nccl) tuning.emplace();
  } catch (const Error&) {
    if (options.sweep_algorithms) throw;  // no MPI_T: the sweep is impossible
  }
  if (options.sweep_algorithms && !(tuning && tuning->dynamic_rules()))
    fail(fmt::format("--algorithms cannot choose algorithms in this process: {}",
                     tuning ? tuning->unavailable_reason() : "MPI_T is not available"),
         fmt::format("sweep them one run at a time instead, e.g. {} foundry bench comm --op "
                     "all_reduce (ompi_info --param coll tuned --level 9 lists the values)",
                     mpirun_mca_flags("allreduce", 4)));
}

// Counts the measurements of the whole run, for progress.
struct SweepProgress {
  const CommBenchOptions& options;
  int64_t total = 0;
  int64_t done = 0;
  void step(CollectiveOp op, const Variant& variant, const MessageShape& shape) {
    ++done;
    if (options.on_progress)
      options.on_progress(
          done, total,
          fmt::format("{} {} {}", op_name(op), variant.name, format_size(shape.bytes)));
  }
};

// One algorithm (or library) over every message size, and its latency-bandwidth fit.
CommBenchResult measure_variant(const Communicator& c, CollectiveOp op, const Variant& variant,
                                Runner& runner, const std::vector<MessageShape>& shapes,
                                const CommBenchOptions& options, SweepProgress& progress) {
  CommBenchResult result;
  result.op = op;
  result.ranks = c.size();
  result.algorithm = variant.name;
  result.algorithm_id = variant.id;
  for (const MessageShape& shape : shapes) {
    result.points.push_back(measure_size(c, op, runner, shape, options));
    progress.step(op, variant, shape);
  }
  if (result.points.size() >= 2) {
    std::vector<LatBwSample> samples;
    for (const CommBenchPoint& p : result.points)
      samples.push_back({double(p.bytes), p.time.p50_s});
    result.fit = fit_latency_bandwidth(samples);
  }
  return result;
}

}  // namespace

std::vector<CommBenchResult> run_comm_bench(const Communicator& comm,
                                            const CommBenchOptions& options) {
  options.validate();
  if (comm.size() < 2)
    fail(fmt::format("foundry bench comm needs at least 2 ranks (got {}); run it under mpirun, "
                     "e.g. mpirun -np 2 foundry bench comm",
                     comm.size()),
         "as root add --allow-run-as-root; with more ranks than cores add --oversubscribe and "
         "set OMP_NUM_THREADS=1");
  const int ranks = comm.size();
  const std::vector<int64_t> sizes =
      size_sweep(options.min_bytes, options.max_bytes, options.step_factor);
  std::optional<CollTuning> tuning;
  open_tuning(options, tuning);

  std::vector<std::vector<Variant>> variants;
  SweepProgress progress{options};
  for (CollectiveOp op : options.ops) {
    variants.push_back(options.nccl ? std::vector<Variant>{{0, "nccl"}}
                                    : variants_for(op, ranks, tuning ? &*tuning : nullptr,
                                                   options.sweep_algorithms));
    progress.total += int64_t(variants.back().size() * shapes_for(op, ranks, sizes).size());
  }

  std::unique_ptr<NcclRunner> nccl;
  if (options.nccl) nccl = std::make_unique<NcclRunner>(comm);
  MpiRunner mpi(comm);
  Runner& runner = nccl ? static_cast<Runner&>(*nccl) : mpi;
  std::vector<CommBenchResult> results;
  for (size_t k = 0; k < options.ops.size(); ++k) {
    const CollectiveOp op = options.ops[k];
    const std::string coll(tuned_collective(op));
    const std::vector<MessageShape> shapes = shapes_for(op, ranks, sizes);
    // Sized once for the largest message, reused by every size.
    runner.resize(send_elements(op, shapes.back()), recv_elements(op, shapes.back()));
    const int initially_forced = options.sweep_algorithms ? tuning->forced(coll) : 0;
    for (const Variant& variant : variants[k]) {
      // A forced algorithm applies to communicators created after it is set (coll_tuning.h),
      // so each variant of a sweep runs on its own duplicate of `comm`.
      std::optional<Communicator> forced_comm;
      if (options.sweep_algorithms) {
        tuning->force(coll, variant.id);
        forced_comm.emplace(comm.dup());
      }
      const Communicator& c = forced_comm ? *forced_comm : comm;
      mpi.set_comm(c);
      results.push_back(measure_variant(c, op, variant, runner, shapes, options, progress));
    }
    if (options.sweep_algorithms) tuning->force(coll, initially_forced);
  }
  return results;
}

// ---- output ---------------------------------------------------------------------------

std::string_view nccl_call(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "ncclAllReduce";
    case CollectiveOp::reduce_scatter: return "ncclReduceScatter";
    case CollectiveOp::all_gather: return "ncclAllGather";
    case CollectiveOp::broadcast: return "ncclBroadcast";
    case CollectiveOp::all_to_all: return "ncclSend/ncclRecv";
  }
  return "?";
}

std::string describe_algorithm(const CommBenchResult& r) {
  if (r.algorithm == "nccl") return "NCCL";
  if (r.algorithm_id == 0) return "default (tuned decision rules)";
  return fmt::format("{} (coll_tuned_{}_algorithm={})", r.algorithm, tuned_collective(r.op),
                     r.algorithm_id);
}

std::string format_comm_table(const CommBenchResult& r) {
  std::string out;
  out += fmt::format("# {} ({}) | ranks {} | float32 | algorithm: {}\n", op_name(r.op),
                     r.algorithm == "nccl" ? nccl_call(r.op) : mpi_call(r.op), r.ranks,
                     describe_algorithm(r));
  out += fmt::format("#{:>11} {:>11} {:>6} {:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} "
                     "{:>7}\n",
                     "size", "count", "type", "op", "avg", "min", "p50", "p99", "max", "algbw",
                     "busbw", "#wrong");
  out += fmt::format("#{:>11} {:>11} {:>6} {:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
                     "(B)", "(elements)", "", "", "(us)", "(us)", "(us)", "(us)", "(us)", "(GB/s)",
                     "(GB/s)");
  for (const CommBenchPoint& p : r.points)
    out += fmt::format("{:>12} {:>11} {:>6} {:>14} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} "
                       "{:>10.2f} {:>8.3f} {:>8.3f} {:>7}\n",
                       p.bytes, p.count, "float", op_name(r.op), p.time.avg_s * 1e6,
                       p.time.min_s * 1e6, p.time.p50_s * 1e6, p.time.p99_s * 1e6,
                       p.time.max_s * 1e6, p.algbw_bytes_per_s / 1e9, p.busbw_bytes_per_s / 1e9,
                       p.wrong);
  out += fmt::format("# fit: {}\n", fit_text(r));
  return out;
}

std::string format_comm_csv(std::span<const CommBenchResult> results,
                            const Provenance& provenance) {
  std::string out = format_provenance(provenance, "# ");
  out += "op,ranks,algorithm,dtype,bytes,count,avg_us,min_us,p50_us,p99_us,max_us,algbw_GBps,"
         "busbw_GBps,wrong\n";
  for (const CommBenchResult& r : results)
    for (const CommBenchPoint& p : r.points)
      out += fmt::format("{},{},{},float32,{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.6f},{:.6f},"
                         "{}\n",
                         op_name(r.op), r.ranks, r.algorithm, p.bytes, p.count, p.time.avg_s * 1e6,
                         p.time.min_s * 1e6, p.time.p50_s * 1e6, p.time.p99_s * 1e6,
                         p.time.max_s * 1e6, p.algbw_bytes_per_s / 1e9,
                         p.busbw_bytes_per_s / 1e9, p.wrong);
  for (const CommBenchResult& r : results)
    out += fmt::format("# fit {} ranks={} algorithm={}: {}\n", op_name(r.op), r.ranks,
                       r.algorithm, fit_text(r));
  return out;
}

nlohmann::json collective_entry_json(const CommBenchResult& r) {
  nlohmann::json entry = {{"op", std::string(op_name(r.op))},
                          {"ranks", r.ranks},
                          {"dtype", "float32"},
                          {"algorithm", r.algorithm}};
  // Readers predict from "fit" when present; an entry without one (a single size, or times
  // that did not grow with size) still carries its points.
  if (r.fit && r.fit->beta_bytes_per_s > 0) {
    const LatBwFit& f = *r.fit;
    entry["fit"] = {{"alpha_s", f.alpha_s},
                    {"beta_bytes_per_s", f.beta_bytes_per_s},
                    {"max_rel_residual", f.max_rel_residual},
                    {"min_bytes", int64_t(f.min_bytes)},
                    {"max_bytes", int64_t(f.max_bytes)}};
  }
  nlohmann::json points = nlohmann::json::array();
  for (const CommBenchPoint& p : r.points)
    points.push_back({{"bytes", p.bytes},
                      {"count", p.count},
                      {"avg_s", p.time.avg_s},
                      {"min_s", p.time.min_s},
                      {"p50_s", p.time.p50_s},
                      {"p99_s", p.time.p99_s},
                      {"max_s", p.time.max_s},
                      {"algbw_bytes_per_s", p.algbw_bytes_per_s},
                      {"busbw_bytes_per_s", p.busbw_bytes_per_s},
                      {"wrong", p.wrong}});
  entry["points"] = std::move(points);
  entry["source"] = "measured";
  return entry;
}

nlohmann::json comm_bench_json(std::span<const CommBenchResult> results,
                               const CommBenchOptions& options, const Provenance& provenance) {
  nlohmann::json ops = nlohmann::json::array();
  for (CollectiveOp op : options.ops) ops.push_back(std::string(op_name(op)));
  nlohmann::json entries = nlohmann::json::array();
  for (const CommBenchResult& r : results) entries.push_back(collective_entry_json(r));
  return {{"format", "foundry-bench-comm"},
          {"version", 1},
          {"provenance", to_json(provenance)},
          {"settings",
           {{"min_bytes", options.min_bytes},
            {"max_bytes", options.max_bytes},
            {"step_factor", options.step_factor},
            {"warmup", options.warmup},
            {"iters", options.iters},
            {"dtype", "float32"},
            {"ops", ops},
            {"algorithm_sweep", options.sweep_algorithms},
            {"timing", "per iteration: barrier, then each rank times the call; an iteration's "
                       "time is the max over ranks; fit on p50 times, relative residuals"}}},
          {"collectives", entries}};
}

nlohmann::json merge_profile_collectives(nlohmann::json profile,
                                         std::span<const nlohmann::json> entries,
                                         const Provenance& provenance, const std::string& name) {
  if (profile.is_null()) {
    profile = {{"format", kHardwareProfileFormat},
               {"version", 1},
               {"name", name},
               {"provenance", to_json(provenance)},
               {"collectives", nlohmann::json::array()}};
  }
  if (!profile.is_object() || profile.value("format", "") != "foundry-hardware-profile")
    fail("not a hardware profile (\"format\" is not \"foundry-hardware-profile\")",
         "pass a profile written by foundry bench, or a path that does not exist yet");
  if (!profile.contains("collectives")) profile["collectives"] = nlohmann::json::array();
  nlohmann::json& list = profile["collectives"];
  if (!list.is_array()) fail("hardware profile: \"collectives\" is not an array");
  for (const nlohmann::json& entry : entries) {
    auto same = [&](const nlohmann::json& e) {
      return e.is_object() && e.value("op", "") == entry.at("op").get<std::string>() &&
             e.value("ranks", -1) == entry.at("ranks").get<int>() &&
             e.value("algorithm", "") == entry.at("algorithm").get<std::string>();
    };
    auto it = std::find_if(list.begin(), list.end(), same);
    if (it == list.end()) {
      list.push_back(entry);
    } else if (it->contains("fit") && !entry.contains("fit")) {
      // An entry of one message size (no fit) does not replace a fitted sweep: readers
      // predict from the fit, and without one would have nothing for this collective.
      fmt::print(stderr,
                 "note: kept the profile's fitted {} over {} ranks ({}): this run's {} point(s) "
                 "fit no line (measure two sizes or more to replace it)\n",
                 entry.at("op").get<std::string>(), entry.at("ranks").get<int>(),
                 entry.at("algorithm").get<std::string>(),
                 entry.contains("points") ? entry.at("points").size() : size_t{0});
    } else {
      *it = entry;
    }
  }
  return profile;
}

void update_profile_file(const std::string& path, std::span<const CommBenchResult> results,
                         const Provenance& provenance) {
  nlohmann::json profile = nullptr;
  if (path_exists(path)) {
    try {
      profile = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("--profile {}: not valid JSON ({})", path, e.what()),
           "fix or remove the file; a new profile is created when the path does not exist");
    }
  }
  std::vector<nlohmann::json> entries;
  for (const CommBenchResult& r : results) entries.push_back(collective_entry_json(r));
  try {
    profile = merge_profile_collectives(std::move(profile), entries, provenance, provenance.host);
  } catch (const Error& e) {
    fail(fmt::format("--profile {}: {}", path, e.what()), e.hint());
  }
  write_file_atomic(path, profile.dump(2) + "\n");
}

}  // namespace foundry
