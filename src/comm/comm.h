// The MPI communicator layer: one RAII session per process, communicators that own their
// MPI_Comm, typed collectives, and non-blocking handles.
//
// Errors. MPI's default error handler aborts the whole job on any error, which loses the
// message and the rank. Every communicator here uses MPI_ERRORS_RETURN instead, and every
// call's return code is checked: a failure becomes a foundry::Error naming the MPI call, the
// rank and the communicator size, with MPI's own error string.
//
// Element types. Collectives take float, double or int64_t buffers (the CommElement
// concept); counts are element counts, sizes of whole buffers are spelled out per function.
// MPI counts are `int`, so a count above INT_MAX is an error rather than a silent wrap.
//
// Threads. The session asks for MPI_THREAD_FUNNELED: OpenMP threads compute, the thread
// that initialized MPI communicates.
#pragma once
// The C API only: MPI's deprecated C++ bindings would otherwise come with mpi.h and need a
// library we do not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "base/slab_range.h"

namespace foundry {

template <class T>
concept CommElement =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, int64_t>;

enum class ReduceOp { sum, max, min };

// Throws foundry::Error when `rc` is not MPI_SUCCESS: "<call> failed on rank R of N: <MPI's
// message>". `comm` gives the rank and size (MPI_COMM_NULL: the world's, if known).
void check_mpi(int rc, const char* call, MPI_Comm comm);

// A pending non-blocking operation. The buffers it was started with must stay alive and
// untouched until wait() returns or test() reports true. Destroying a pending request waits
// for it (a collective cannot be cancelled, and freeing it early would leave MPI writing into
// freed memory); errors found there are printed, since a destructor cannot throw.
class Request {
 public:
  Request() = default;
  Request(MPI_Request request, const char* call, MPI_Comm comm);
  ~Request();
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Blocks until the operation is complete (MPI_Wait: Open MPI polls, using a core).
  void wait();
  // Blocks until complete, polling with MPI_Test and sleeping `poll` between polls, so a rank
  // that waits a long time (for another rank's compute) leaves its core to others.
  void wait_idle(std::chrono::microseconds poll = std::chrono::microseconds(500));
  // True once complete; never blocks.
  bool test();
  // True when there is nothing left to wait for (complete, or default-constructed).
  bool done() const { return request_ == MPI_REQUEST_NULL; }

 private:
  friend class Communicator;
  // A receive (irecv) checks on completion that exactly the expected number of elements
  // arrived; -1 for every other operation.
  void check_received(const MPI_Status& status) const;
  MPI_Request request_ = MPI_REQUEST_NULL;
  const char* call_ = "";
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype recv_type_ = MPI_DATATYPE_NULL;
  int expected_count_ = -1;
  int peer_ = -1;
};

// A group of processes: the world, or a subgroup (data-parallel, expert-parallel) made by
// split(). Owns its MPI_Comm unless it wraps MPI_COMM_WORLD. Movable, not copyable.
class Communicator {
 public:
  // Wraps `comm`; takes ownership (MPI_Comm_free on destruction) when `owned`. Sets
  // MPI_ERRORS_RETURN on it.
  Communicator(MPI_Comm comm, bool owned);
  ~Communicator();
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }

  // A new communicator over the same processes (collective). Open MPI selects collective
  // algorithms when a communicator is created, so a dup also picks up changed coll/tuned
  // settings (see comm/coll_tuning.h).
  Communicator dup() const;
  // Processes with the same `color` form one new communicator, ordered by `key` then by rank
  // here (collective; MPI_Comm_split).
  Communicator split(int color, int key) const;

  void barrier() const;
  // A barrier that does not occupy a core while it waits: MPI_Ibarrier polled with MPI_Test
  // and short sleeps. Open MPI's blocking barrier busy-polls, which would steal a core from
  // a rank that is still computing (rank 0 running a GEMM benchmark while the others wait).
  // Use it for long waits; use barrier() where the exit time matters (timing loops).
  void idle_barrier(std::chrono::microseconds poll = std::chrono::microseconds(500)) const;
  Request ibarrier() const;

  // recv[i] = op over ranks of send[i], i < count. send == recv reduces in place.
  template <CommElement T>
  void allreduce(const T* send, T* recv, size_t count, ReduceOp op = ReduceOp::sum) const;

  // The element-wise sum of every rank's `send` (size() * block elements), cut into size()
  // equal blocks; rank r receives block r in `recv` (block elements).
  template <CommElement T>
  void reduce_scatter(const T* send, T* recv, size_t block) const;

  // Every rank contributes `send` (block elements); every rank receives all contributions in
  // rank order in `recv` (size() * block elements).
  template <CommElement T>
  void allgather(const T* send, T* recv, size_t block) const;

  // Non-blocking forms of the two above: the buffers must stay untouched until the request
  // completes. MPI progresses them inside MPI calls (Request::test), so a caller that wants
  // them to move during its own computation tests the request now and then.
  template <CommElement T>
  Request ireduce_scatter(const T* send, T* recv, size_t block) const;
  template <CommElement T>
  Request iallgather(const T* send, T* recv, size_t block) const;

  // `data` (count elements) of rank `root` is copied to every rank's `data`.
  template <CommElement T>
  void broadcast(T* data, size_t count, int root) const;

  // `send` holds size() blocks of `block` elements, block j for rank j; `recv` receives
  // size() blocks, block i from rank i. This is MoE token dispatch with equal loads.
  template <CommElement T>
  void alltoall(const T* send, T* recv, size_t block) const;

  // All-to-all with a count per peer: `send` holds send_counts[j] elements for rank j, packed
  // contiguously in rank order; `recv` receives recv_counts[i] elements from rank i, packed
  // the same way. Both count arrays have size() entries, and recv_counts[i] on this rank must
  // equal send_counts[this rank] on rank i (exchange the counts with alltoall first). This
  // is MoE token dispatch with uneven expert loads.
  template <CommElement T>
  void alltoallv(const T* send, std::span<const int64_t> send_counts, T* recv,
                 std::span<const int64_t> recv_counts) const;

  // All-gather with a count per rank, in place: `data` holds counts[0] + … + counts[size()-1]
  // elements; rank r's block (counts[r] elements at offset counts[0] + … + counts[r-1]) is its
  // contribution, and every other block is overwritten with the owning rank's block.
  // `counts` is the same on every rank.
  template <CommElement T>
  void allgatherv_in_place(T* data, std::span<const int64_t> counts) const;

  // ---- point to point ----
  // Messages between a pair of ranks with the same tag arrive in the order they were sent.
  // Tags lie in [0, 32767] (the upper bound every MPI library supports).
  //
  // send() may return as soon as the data is buffered (small messages) or only once the
  // matching receive has started (large ones): two ranks that both send to each other
  // before receiving can deadlock. Post the receives first with irecv(), or order the calls
  // so that the send/receive pairs form no cycle.

  // Sends `count` elements of `data` to rank `dest`.
  template <CommElement T>
  void send(const T* data, size_t count, int dest, int tag) const;
  template <CommElement T>
  Request isend(const T* data, size_t count, int dest, int tag) const;

  // Receives exactly `count` elements from rank `source` into `data`. A longer message is
  // MPI's truncation error, a shorter one an error naming both lengths (raised by the
  // request's wait() or test()).
  template <CommElement T>
  Request irecv(T* data, size_t count, int source, int tag) const;

  // Several element ranges [begin, end) of `base`, one message each, in order: the sender's
  // and the receiver's ranges must have the same lengths in the same order (they may lie at
  // other offsets); messages between a pair with one tag match in posting order. Contiguous
  // messages, because Open MPI's shared-memory transport copies those once, directly between
  // the processes, while a derived datatype is packed and copied in fragments: an MPI indexed
  // datatype here made the expert-parallel gradient reduce-scatter 150–650 ms slower per
  // step (docs/expert-parallel.md). Used where a rank needs only parts of another's block
  // (ZeRO-1's all-gather when ranks do not store every expert).
  template <CommElement T>
  std::vector<Request> isend_ranges(const T* base, std::span<const SlabRange> ranges, int dest,
                                    int tag) const;
  template <CommElement T>
  std::vector<Request> irecv_ranges(T* base, std::span<const SlabRange> ranges, int source,
                                    int tag) const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 0;
};

struct MpiSessionOptions {
  // Let Open MPI's coll/tuned component take a forced algorithm per collective at run time
  // (coll_tuned_use_dynamic_rules = 1). It is read once in MPI_Init, so it has to be set
  // before; with no algorithm forced, tuned uses its default decision rules as usual. Has no
  // effect when the variable is already set in the environment (the user's choice wins).
  bool allow_forced_algorithms = false;
};

// Ends this process and, under mpirun, every rank of the job (MPI_Abort; a process without
// an MPI session just exits), with `exit_code`. For failures found off the main thread (a
// watchdog), where unwinding is not possible.
[[noreturn]] void abort_job(int exit_code);

// MPI for the lifetime of this object: MPI_Init_thread in the constructor, MPI_Finalize in
// finalize() or the destructor. Commands that need MPI create one; everything else never
// touches MPI. Without mpirun the process is an MPI singleton (world size 1).
//
// MPI can be initialized once per process: a second session, or one created after a
// finalize, is an error.
class MpiSession {
 public:
  explicit MpiSession(const MpiSessionOptions& options = {});
  // Finalizes, except while an exception unwinds in a job of several ranks: MPI_Finalize is
  // collective, and a rank that failed alone would wait in it forever for ranks still blocked
  // in a collective with it. Exiting without finalizing makes mpirun end the whole job and
  // say which rank failed, which is the behaviour we want there.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  Communicator& world() { return *world_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided

  // Collective: every rank must call it. Idempotent.
  void finalize();

  // True between a session's MPI_Init and its MPI_Finalize.
  static bool active();

 private:
  std::unique_ptr<Communicator> world_;
  int thread_level_ = 0;
  int uncaught_at_start_ = 0;
  bool finalized_ = false;
};

}  // namespace foundry
