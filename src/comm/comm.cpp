#include "comm/comm.h"

#include <fmt/format.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>
#include <utility>

#include "base/error.h"
#include "comm/leak_check.h"

namespace foundry {

namespace {

bool g_session_active = false;  // between a session's MPI_Init and MPI_Finalize
bool g_session_used = false;    // some session has initialized MPI in this process

int to_mpi_count(size_t count, const char* call) {
  if (count > static_cast<size_t>(INT_MAX))
    fail(fmt::format("{}: {} elements exceed MPI's count limit of {}", call, count, INT_MAX),
         "split the buffer into several calls");
  return static_cast<int>(count);
}

template <CommElement T>
MPI_Datatype mpi_type() {
  if constexpr (std::same_as<T, float>) return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>) return MPI_DOUBLE;
  else return MPI_INT64_T;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

// Collectives with separate input and output blocks do not support aliasing here: MPI's
// in-place conventions differ per collective, and an accidental alias is a silent bug.
void require_distinct(const void* send, const void* recv, const char* call) {
  if (send == recv && send != nullptr)
    fail(fmt::format("{}: the send and receive buffers are the same", call),
         "pass separate buffers (only allreduce reduces in place)");
}

// alltoallv: MPI takes int counts and displacements; ours are int64 element counts packed
// in rank order, so displacements are their prefix sums. `out` gets 4 arrays of `n` ints:
// send counts, send displacements, receive counts, receive displacements.
void alltoallv_layout(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
                      int n, const char* call, std::vector<int>& out) {
  if (send_counts.size() != static_cast<size_t>(n) || recv_counts.size() != static_cast<size_t>(n))
    fail(fmt::format("{}: {} send counts and {} receive counts for {} ranks", call,
                     send_counts.size(), recv_counts.size(), n),
         "pass one count per rank of the communicator");
  out.assign(4 * static_cast<size_t>(n), 0);
  int64_t send_offset = 0, recv_offset = 0;
  for (int i = 0; i < n; ++i) {
    if (send_counts[i] < 0 || recv_counts[i] < 0)
      fail(fmt::format("{}: negative count for rank {}", call, i));
    out[i] = to_mpi_count(static_cast<size_t>(send_counts[i]), call);
    out[n + i] = to_mpi_count(static_cast<size_t>(send_offset), call);
    out[2 * n + i] = to_mpi_count(static_cast<size_t>(recv_counts[i]), call);
    out[3 * n + i] = to_mpi_count(static_cast<size_t>(recv_offset), call);
    send_offset += send_counts[i];
    recv_offset += recv_counts[i];
  }
}

// Counts per rank for the v-collectives as MPI's int arrays: `out` gets the counts, then their
// prefix sums (displacements). The total must fit an int too: MPI computes buffer extents
// from it.
void v_layout(std::span<const int64_t> counts, int n, const char* call, std::vector<int>& out) {
  if (counts.size() != static_cast<size_t>(n))
    fail(fmt::format("{}: {} counts for {} ranks", call, counts.size(), n),
         "pass one count per rank of the communicator");
  out.assign(2 * static_cast<size_t>(n), 0);
  int64_t offset = 0;
  for (int i = 0; i < n; ++i) {
    if (counts[i] < 0) fail(fmt::format("{}: negative count for rank {}", call, i));
    out[i] = to_mpi_count(static_cast<size_t>(counts[i]), call);
    out[n + i] = to_mpi_count(static_cast<size_t>(offset), call);
    offset += counts[i];
  }
  to_mpi_count(static_cast<size_t>(offset), call);
}

}  // namespace

void check_mpi(int rc, const char* call, MPI_Comm comm) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, message, &length) != MPI_SUCCESS)
    std::snprintf(message, sizeof message, "MPI error code %d", rc);
  int rank = -1, size = -1;
  if (comm == MPI_COMM_NULL && g_session_active) comm = MPI_COMM_WORLD;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  fail(fmt::format("{} failed on rank {} of {}: {}", call, rank, size, message),
       "an MPI error in a collective usually means the ranks disagree (different counts, "
       "roots or call order) or a process of the job died; the other ranks' output may say "
       "more");
}

// ---- Request --------------------------------------------------------------------------

Request::Request(MPI_Request request, const char* call, MPI_Comm comm)
    : request_(request), call_(call), comm_(comm) {}

Request::~Request() {
  if (done()) return;
  // Destroyed by an error of this rank's own (the others may never join the operation): no
  // wait, which could block forever and keep the error from being printed; the process is on
  // its way out, and its exit ends the job.
  if (std::uncaught_exceptions() > 0) {
    int size = 1;
    if (comm_ != MPI_COMM_NULL && MPI_Comm_size(comm_, &size) == MPI_SUCCESS && size > 1) return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s (while destroying a pending request)\n", e.what());
  }
}

Request::Request(Request&& other) noexcept
    : request_(std::exchange(other.request_, MPI_REQUEST_NULL)), call_(other.call_),
      comm_(other.comm_), recv_type_(other.recv_type_), expected_count_(other.expected_count_),
      peer_(other.peer_) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (!done()) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s (while replacing a pending request)\n", e.what());
      }
    }
    request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
    call_ = other.call_;
    comm_ = other.comm_;
    recv_type_ = other.recv_type_;
    expected_count_ = other.expected_count_;
    peer_ = other.peer_;
  }
  return *this;
}

void Request::wait() {
  if (done()) return;
  // MPI_Wait sets request_ to MPI_REQUEST_NULL; on error the request stays, but a failed
  // collective cannot be waited on again, so drop it either way.
  MPI_Status status;
  int rc = MPI_Wait(&request_, &status);
  request_ = MPI_REQUEST_NULL;
  check_mpi(rc, call_, comm_);
  check_received(status);
}

void Request::check_received(const MPI_Status& status) const {
  if (expected_count_ < 0) return;
  int received = 0;
  check_mpi(MPI_Get_count(&status, recv_type_, &received), "MPI_Get_count", comm_);
  if (received != expected_count_) {
    int rank = -1, size = -1;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &size);
    fail(fmt::format("{} on rank {} of {}: received {} elements from rank {}, expected {}",
                     call_, rank, size, received, peer_, expected_count_),
         "the sending and the receiving rank disagree on the message length");
  }
}

void Request::wait_idle(std::chrono::microseconds poll) {
  while (!test()) std::this_thread::sleep_for(poll);
}

bool Request::test() {
  if (done()) return true;
  int flag = 0;
  MPI_Status status;
  int rc = MPI_Test(&request_, &flag, &status);
  if (rc != MPI_SUCCESS) {
    request_ = MPI_REQUEST_NULL;
    check_mpi(rc, call_, comm_);
  }
  if (flag != 0) check_received(status);
  return flag != 0;
}

// ---- Communicator ---------------------------------------------------------------------

Communicator::Communicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", comm_);
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", comm_);
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", comm_);
}

Communicator::~Communicator() {
  // A communicator that outlives MPI (a static, or one leaked past finalize) has nothing
  // left to free, and MPI_Comm_free would be an error then.
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Communicator::Communicator(Communicator&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), owned_(std::exchange(other.owned_, false)),
      rank_(other.rank_), size_(other.size_) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    Communicator old(std::move(*this));  // frees the previous communicator
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(other.owned_, false);
    rank_ = other.rank_;
    size_ = other.size_;
  }
  return *this;
}

Communicator Communicator::dup() const {
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm_, &copy), "MPI_Comm_dup", comm_);
  return Communicator(copy, true);
}

Communicator Communicator::split(int color, int key) const {
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split", comm_);
  return Communicator(part, true);
}

void Communicator::barrier() const { check_mpi(MPI_Barrier(comm_), "MPI_Barrier", comm_); }

Request Communicator::ibarrier() const {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier", comm_);
  return Request(r, "MPI_Ibarrier", comm_);
}

void Communicator::idle_barrier(std::chrono::microseconds poll) const {
  ibarrier().wait_idle(poll);
}

template <CommElement T>
void Communicator::allreduce(const T* send, T* recv, size_t count, ReduceOp op) const {
  const void* in = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
  check_mpi(MPI_Allreduce(in, recv, to_mpi_count(count, "MPI_Allreduce"), mpi_type<T>(),
                          mpi_op(op), comm_),
            "MPI_Allreduce", comm_);
}

template <CommElement T>
void Communicator::reduce_scatter(const T* send, T* recv, size_t block) const {
  require_distinct(send, recv, "MPI_Reduce_scatter_block");
  to_mpi_count(block * static_cast<size_t>(size_), "MPI_Reduce_scatter_block");
  check_mpi(MPI_Reduce_scatter_block(send, recv, to_mpi_count(block, "MPI_Reduce_scatter_block"),
                                     mpi_type<T>(), MPI_SUM, comm_),
            "MPI_Reduce_scatter_block", comm_);
}

template <CommElement T>
void Communicator::allgather(const T* send, T* recv, size_t block) const {
  require_distinct(send, recv, "MPI_Allgather");
  const int n = to_mpi_count(block, "MPI_Allgather");
  to_mpi_count(block * static_cast<size_t>(size_), "MPI_Allgather");
  check_mpi(MPI_Allgather(send, n, mpi_type<T>(), recv, n, mpi_type<T>(), comm_), "MPI_Allgather",
            comm_);
}

template <CommElement T>
Request Communicator::ireduce_scatter(const T* send, T* recv, size_t block) const {
  require_distinct(send, recv, "MPI_Ireduce_scatter_block");
  to_mpi_count(block * static_cast<size_t>(size_), "MPI_Ireduce_scatter_block");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ireduce_scatter_block(send, recv,
                                      to_mpi_count(block, "MPI_Ireduce_scatter_block"),
                                      mpi_type<T>(), MPI_SUM, comm_, &r),
            "MPI_Ireduce_scatter_block", comm_);
  return Request(r, "MPI_Ireduce_scatter_block", comm_);
}

template <CommElement T>
Request Communicator::iallgather(const T* send, T* recv, size_t block) const {
  require_distinct(send, recv, "MPI_Iallgather");
  const int n = to_mpi_count(block, "MPI_Iallgather");
  to_mpi_count(block * static_cast<size_t>(size_), "MPI_Iallgather");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(send, n, mpi_type<T>(), recv, n, mpi_type<T>(), comm_, &r),
            "MPI_Iallgather", comm_);
  return Request(r, "MPI_Iallgather", comm_);
}

template <CommElement T>
void Communicator::broadcast(T* data, size_t count, int root) const {
  check_mpi(MPI_Bcast(data, to_mpi_count(count, "MPI_Bcast"), mpi_type<T>(), root, comm_),
            "MPI_Bcast", comm_);
}

template <CommElement T>
void Communicator::alltoall(const T* send, T* recv, size_t block) const {
  require_distinct(send, recv, "MPI_Alltoall");
  const int n = to_mpi_count(block, "MPI_Alltoall");
  to_mpi_count(block * static_cast<size_t>(size_), "MPI_Alltoall");
  check_mpi(MPI_Alltoall(send, n, mpi_type<T>(), recv, n, mpi_type<T>(), comm_), "MPI_Alltoall",
            comm_);
}

template <CommElement T>
void Communicator::alltoallv(const T* send, std::span<const int64_t> send_counts, T* recv,
                             std::span<const int64_t> recv_counts) const {
  require_distinct(send, recv, "MPI_Alltoallv");
  std::vector<int> layout;
  alltoallv_layout(send_counts, recv_counts, size_, "MPI_Alltoallv", layout);
  const int* l = layout.data();
  const int n = size_;
  check_mpi(MPI_Alltoallv(send, l, l + n, mpi_type<T>(), recv, l + 2 * n, l + 3 * n, mpi_type<T>(),
                          comm_),
            "MPI_Alltoallv", comm_);
}

template <CommElement T>
void Communicator::allgatherv_in_place(T* data, std::span<const int64_t> counts) const {
  std::vector<int> layout;
  v_layout(counts, size_, "MPI_Allgatherv", layout);
  const int* l = layout.data();
  check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, l, l + size_, mpi_type<T>(),
                           comm_),
            "MPI_Allgatherv", comm_);
}

template <CommElement T>
void Communicator::send(const T* data, size_t count, int dest, int tag) const {
  check_mpi(MPI_Send(data, to_mpi_count(count, "MPI_Send"), mpi_type<T>(), dest, tag, comm_),
            "MPI_Send", comm_);
}

template <CommElement T>
Request Communicator::isend(const T* data, size_t count, int dest, int tag) const {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, to_mpi_count(count, "MPI_Isend"), mpi_type<T>(), dest, tag, comm_, &r),
            "MPI_Isend", comm_);
  return Request(r, "MPI_Isend", comm_);
}

template <CommElement T>
Request Communicator::irecv(T* data, size_t count, int source, int tag) const {
  const int n = to_mpi_count(count, "MPI_Irecv");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(data, n, mpi_type<T>(), source, tag, comm_, &r), "MPI_Irecv", comm_);
  Request request(r, "MPI_Irecv", comm_);
  request.recv_type_ = mpi_type<T>();
  request.expected_count_ = n;
  request.peer_ = source;
  return request;
}

template <CommElement T>
std::vector<Request> Communicator::isend_ranges(
    const T* base, std::span<const SlabRange> ranges, int dest, int tag) const {
  std::vector<Request> requests;
  for (const auto& [b, e] : ranges)
    if (e > b) requests.push_back(isend(base + b, static_cast<size_t>(e - b), dest, tag));
  return requests;
}

template <CommElement T>
std::vector<Request> Communicator::irecv_ranges(
    T* base, std::span<const SlabRange> ranges, int source, int tag) const {
  std::vector<Request> requests;
  for (const auto& [b, e] : ranges)
    if (e > b) requests.push_back(irecv(base + b, static_cast<size_t>(e - b), source, tag));
  return requests;
}

#define FOUNDRY_COMM_INSTANTIATE(T)                                                           \
  template void Communicator::allreduce<T>(const T*, T*, size_t, ReduceOp) const;             \
  template void Communicator::reduce_scatter<T>(const T*, T*, size_t) const;                  \
  template void Communicator::allgather<T>(const T*, T*, size_t) const;                       \
  template Request Communicator::ireduce_scatter<T>(const T*, T*, size_t) const;              \
  template Request Communicator::iallgather<T>(const T*, T*, size_t) const;                   \
  template void Communicator::broadcast<T>(T*, size_t, int) const;                            \
  template void Communicator::alltoall<T>(const T*, T*, size_t) const;                        \
  template void Communicator::alltoallv<T>(const T*, std::span<const int64_t>, T*,            \
                                           std::span<const int64_t>) const;                   \
  template void Communicator::allgatherv_in_place<T>(T*, std::span<const int64_t>) const;     \
  template void Communicator::send<T>(const T*, size_t, int, int) const;                      \
  template Request Communicator::isend<T>(const T*, size_t, int, int) const;                  \
  template Request Communicator::irecv<T>(T*, size_t, int, int) const;                       \
  template std::vector<Request> Communicator::isend_ranges<T>(                                \
      const T*, std::span<const SlabRange>, int, int) const;                \
  template std::vector<Request> Communicator::irecv_ranges<T>(                                \
      T*, std::span<const SlabRange>, int, int) const;
FOUNDRY_COMM_INSTANTIATE(float)
FOUNDRY_COMM_INSTANTIATE(double)
FOUNDRY_COMM_INSTANTIATE(int64_t)
#undef FOUNDRY_COMM_INSTANTIATE

// ---- MpiSession -----------------------------------------------------------------------

MpiSession::MpiSession(const MpiSessionOptions& options)
    : uncaught_at_start_(std::uncaught_exceptions()) {
  if (g_session_used)
    fail("MPI was already initialized in this process",
         "create one MpiSession per process and pass its communicators around");
  int already = 0;
  MPI_Initialized(&already);
  if (already)
    fail("MPI was initialized outside MpiSession",
         "let MpiSession own MPI initialization and finalization");
  if (options.allow_forced_algorithms)
    setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", /*overwrite=*/0);
  {
    LeakCheckPause pause;  // see comm/leak_check.h
    // MPI_Init's own failures go to MPI_ERRORS_ARE_FATAL (no communicator exists yet to
    // carry another handler): Open MPI prints why and exits.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &thread_level_);
  }
  g_session_used = true;
  g_session_active = true;
  // Errors outside any communicator (MPI_COMM_SELF, windows, files) return too.
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  world_ = std::make_unique<Communicator>(MPI_COMM_WORLD, /*owned=*/false);
}

MpiSession::~MpiSession() {
  if (finalized_) return;
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_start_;
  if (unwinding && world_ && world_->size() > 1) return;  // see the header
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
}

void MpiSession::finalize() {
  if (finalized_) return;
  finalized_ = true;
  world_.reset();
  g_session_active = false;
  LeakCheckPause pause;
  check_mpi(MPI_Finalize(), "MPI_Finalize", MPI_COMM_NULL);
}

bool MpiSession::active() { return g_session_active; }

void abort_job(int exit_code) {
  std::fflush(stderr);
  if (MpiSession::active()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace foundry
