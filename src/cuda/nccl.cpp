#include "cuda/nccl.h"

#include <fmt/format.h>

#include <cstdlib>

#include "base/error.h"

namespace foundry::gpu {

int64_t nccl_buffer_bytes(const char* buffsize_env) {
  int64_t buffer = int64_t{4} << 20;
  if (buffsize_env && *buffsize_env) {
    char* end = nullptr;
    const long long v = std::strtoll(buffsize_env, &end, 10);
    if (end && *end == '\0' && v > 0) buffer = v;
  }
  constexpr int64_t kChannels = 32;
  return 2 * kChannels * buffer;
}

}  // namespace foundry::gpu

#if defined(FOUNDRY_HAS_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <exception>

namespace foundry::gpu {
namespace {

ncclComm_t native(void* comm) { return static_cast<ncclComm_t>(comm); }

void check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  fail(fmt::format("NCCL {}: {} ({})", what, ncclGetErrorString(result),
                   ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : ""),
       "check that every rank has a GPU of its own and that NCCL can reach the others "
       "(NCCL_DEBUG=INFO says more)");
}

// NCCL counts are size_t, but one call of 2^31 elements or more is split anyway: the same
// pieces on every rank, in order.
constexpr int64_t kPiece = int64_t{1} << 30;

// ncclGroupStart ... ncclGroupEnd around the calls of one operation; the group is ended even
// when a call inside it throws, so that the thread is not left inside an open group.
class CallGroup {
 public:
  explicit CallGroup(const char* what) : what_(what) { check(ncclGroupStart(), what); }
  ~CallGroup() {
    if (open_) ncclGroupEnd();
  }
  CallGroup(const CallGroup&) = delete;
  CallGroup& operator=(const CallGroup&) = delete;
  void end() {
    open_ = false;
    check(ncclGroupEnd(), what_);
  }

 private:
  const char* what_;
  bool open_ = true;
};

}  // namespace

bool built_with_nccl() { return true; }

NcclGroup::NcclGroup(int rank, int size,
                     const std::function<void(void* bytes, size_t n)>& share_id)
    : rank_(rank), size_(size), exceptions_(std::uncaught_exceptions()) {
  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), "unique id");
  share_id(&id, sizeof(id));
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "opening the group");
  comm_ = comm;
}

NcclGroup::~NcclGroup() {
  // Unwinding from an error, a collective may wait for a peer that will never join it: abort
  // the communicator (local, it does not wait) instead of waiting for its stream.
  const bool unwinding = std::uncaught_exceptions() > exceptions_;
  if (comm_ && unwinding) ncclCommAbort(native(comm_));
  if (side_) {
    if (!unwinding) cudaStreamSynchronize(static_cast<cudaStream_t>(side_));
    cudaEventDestroy(static_cast<cudaEvent_t>(queued_));
    cudaEventDestroy(static_cast<cudaEvent_t>(side_done_));
    for (void* mark : marks_)
      if (mark) cudaEventDestroy(static_cast<cudaEvent_t>(mark));
    cudaStreamDestroy(static_cast<cudaStream_t>(side_));
  }
  if (!comm_ || unwinding) return;
  ncclCommFinalize(native(comm_));
  ncclCommDestroy(native(comm_));
}

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail(
        fmt::format("NCCL's stream, {}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)),
        "a CUDA call beside NCCL failed; NCCL_DEBUG=INFO says more");
}

void allreduce_mean_on(ncclComm_t comm, float* data, int64_t n, cudaStream_t stream) {
  for (int64_t at = 0; at < n; at += kPiece)
    check(ncclAllReduce(data + at, data + at, static_cast<size_t>(std::min(kPiece, n - at)),
                        ncclFloat, ncclAvg, comm, stream),
          "all-reduce");
}

}  // namespace

void NcclGroup::allreduce_mean(float* data, int64_t n) {
  allreduce_mean_on(native(comm_), data, n, nullptr);
}

void* NcclGroup::side_stream() {
  if (!side_) {
    cudaStream_t stream = nullptr;
    cudaEvent_t queued = nullptr, done = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating it");
    check_cuda(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), "creating an event");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creating an event");
    side_ = stream, queued_ = queued, side_done_ = done;
  }
  const auto stream = static_cast<cudaStream_t>(side_);
  const auto queued = static_cast<cudaEvent_t>(queued_);
  check_cuda(cudaEventRecord(queued, nullptr), "ordering it after the default stream");
  check_cuda(cudaStreamWaitEvent(stream, queued, 0), "ordering it after the default stream");
  return stream;
}

void NcclGroup::allreduce_mean_beside(float* data, int64_t n) {
  allreduce_mean_on(native(comm_), data, n, static_cast<cudaStream_t>(side_stream()));
}

void NcclGroup::join() {
  if (!side_) return;
  const auto done = static_cast<cudaEvent_t>(side_done_);
  check_cuda(cudaEventRecord(done, static_cast<cudaStream_t>(side_)), "joining it");
  check_cuda(cudaStreamWaitEvent(nullptr, done, 0), "joining it");
}

int64_t NcclGroup::mark_side() {
  const int64_t ticket = tickets_++;
  void*& mark = marks_[ticket % kMarks];
  if (!mark) {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating an event");
    mark = event;
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(mark), static_cast<cudaStream_t>(side_)),
             "marking it");
  return ticket;
}

int64_t NcclGroup::all_gather_beside(const float* send, float* recv, int64_t block) {
  const auto stream = static_cast<cudaStream_t>(side_stream());
  check(ncclAllGather(send, recv, static_cast<size_t>(block), ncclFloat, native(comm_), stream),
        "all-gather");
  return mark_side();
}

int64_t NcclGroup::reduce_scatter_beside(const float* send, float* recv, int64_t block) {
  const auto stream = static_cast<cudaStream_t>(side_stream());
  check(ncclReduceScatter(send, recv, static_cast<size_t>(block), ncclFloat, ncclSum, native(comm_),
                          stream),
        "reduce-scatter");
  return mark_side();
}

void NcclGroup::join(int64_t ticket) {
  FOUNDRY_CHECK(ticket >= 0 && ticket < tickets_);
  check_cuda(cudaStreamWaitEvent(nullptr, static_cast<cudaEvent_t>(marks_[ticket % kMarks]), 0),
             "joining it");
}

namespace {
// The calls of each range (cut in pieces as above) in one NCCL group: every rank makes the
// same calls in the same order.
template <typename Call>
void grouped_over_ranges(const std::vector<SlabRange>& ranges, const char* what, Call call) {
  CallGroup group(what);
  for (size_t q = 0; q < ranges.size(); ++q)
    for (int64_t at = ranges[q].begin; at < ranges[q].end; at += kPiece)
      call(static_cast<int>(q), at, static_cast<size_t>(std::min(kPiece, ranges[q].end - at)));
  group.end();
}
}  // namespace

void NcclGroup::reduce_mean_to_ranges(float* data, const std::vector<SlabRange>& ranges) {
  grouped_over_ranges(ranges, "reduce-scatter", [&](int root, int64_t at, size_t n) {
    check(ncclReduce(data + at, data + at, n, ncclFloat, ncclAvg, root, native(comm_), nullptr),
          "reduce-scatter");
  });
}

void NcclGroup::reduce_mean_to_ranges_beside(float* data, const std::vector<SlabRange>& ranges) {
  const auto stream = static_cast<cudaStream_t>(side_stream());
  grouped_over_ranges(ranges, "reduce-scatter", [&](int root, int64_t at, size_t n) {
    check(ncclReduce(data + at, data + at, n, ncclFloat, ncclAvg, root, native(comm_), stream),
          "reduce-scatter");
  });
}

void NcclGroup::broadcast_ranges(float* data, const std::vector<SlabRange>& ranges) {
  grouped_over_ranges(ranges, "all-gather", [&](int root, int64_t at, size_t n) {
    check(ncclBroadcast(data + at, data + at, n, ncclFloat, root, native(comm_), nullptr),
          "all-gather");
  });
}

void NcclGroup::all_reduce(const float* send, float* recv, int64_t count) {
  check(ncclAllReduce(send, recv, static_cast<size_t>(count), ncclFloat, ncclSum, native(comm_),
                      nullptr),
        "all-reduce");
}

void NcclGroup::reduce_scatter(const float* send, float* recv, int64_t block) {
  check(ncclReduceScatter(send, recv, static_cast<size_t>(block), ncclFloat, ncclSum,
                          native(comm_), nullptr),
        "reduce-scatter");
}

void NcclGroup::all_gather(const float* send, float* recv, int64_t block) {
  check(ncclAllGather(send, recv, static_cast<size_t>(block), ncclFloat, native(comm_), nullptr),
        "all-gather");
}

void NcclGroup::broadcast(float* data, int64_t count, int root) {
  check(ncclBroadcast(data, data, static_cast<size_t>(count), ncclFloat, root, native(comm_),
                      nullptr),
        "broadcast");
}

void NcclGroup::all_to_all(const float* send, float* recv, int64_t block) {
  const size_t n = static_cast<size_t>(block);
  CallGroup group("all-to-all");
  for (int peer = 0; peer < size_; ++peer) {
    check(ncclSend(send + peer * block, n, ncclFloat, peer, native(comm_), nullptr), "all-to-all");
    check(ncclRecv(recv + peer * block, n, ncclFloat, peer, native(comm_), nullptr), "all-to-all");
  }
  group.end();
}

void NcclGroup::all_to_all_v(const float* send, const std::vector<int64_t>& send_counts,
                             float* recv, const std::vector<int64_t>& recv_counts) {
  FOUNDRY_CHECK(static_cast<int>(send_counts.size()) == size_ &&
                static_cast<int>(recv_counts.size()) == size_);
  CallGroup group("all-to-all");
  int64_t sent = 0, received = 0;
  for (int peer = 0; peer < size_; ++peer) {
    for (int64_t at = 0; at < send_counts[peer]; at += kPiece) {
      const auto n = static_cast<size_t>(std::min(kPiece, send_counts[peer] - at));
      check(ncclSend(send + sent + at, n, ncclFloat, peer, native(comm_), nullptr), "all-to-all");
    }
    for (int64_t at = 0; at < recv_counts[peer]; at += kPiece) {
      const auto n = static_cast<size_t>(std::min(kPiece, recv_counts[peer] - at));
      check(ncclRecv(recv + received + at, n, ncclFloat, peer, native(comm_), nullptr),
            "all-to-all");
    }
    sent += send_counts[peer];
    received += recv_counts[peer];
  }
  group.end();
}

void NcclGroup::abort() {
  if (comm_) ncclCommAbort(native(comm_));
  comm_ = nullptr;
}

void NcclGroup::synchronize() {
  const cudaError_t e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess)
    fail(fmt::format("waiting for NCCL: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e)),
         "a collective failed on the GPU; NCCL_DEBUG=INFO says more");
}

}  // namespace foundry::gpu

#else  // no NCCL in this build

namespace foundry::gpu {

namespace {
[[noreturn]] void fail_no_nccl() {
  fail("this foundry was built without NCCL, so GPUs cannot exchange data directly",
       "build with the CUDA toolkit's NCCL (nccl.h and libnccl) where CMake can find them; "
       "without it, data-parallel ranks average their gradients through host memory");
}
}  // namespace

bool built_with_nccl() { return false; }
NcclGroup::NcclGroup(int, int, const std::function<void(void*, size_t)>&) { fail_no_nccl(); }
NcclGroup::~NcclGroup() = default;
void NcclGroup::allreduce_mean(float*, int64_t) { fail_no_nccl(); }
void NcclGroup::reduce_mean_to_ranges(float*, const std::vector<SlabRange>&) { fail_no_nccl(); }
void NcclGroup::broadcast_ranges(float*, const std::vector<SlabRange>&) { fail_no_nccl(); }
void NcclGroup::allreduce_mean_beside(float*, int64_t) { fail_no_nccl(); }
void NcclGroup::reduce_mean_to_ranges_beside(float*, const std::vector<SlabRange>&) {
  fail_no_nccl();
}
void NcclGroup::join() { fail_no_nccl(); }
int64_t NcclGroup::all_gather_beside(const float*, float*, int64_t) { fail_no_nccl(); }
int64_t NcclGroup::reduce_scatter_beside(const float*, float*, int64_t) { fail_no_nccl(); }
void NcclGroup::join(int64_t) { fail_no_nccl(); }
void NcclGroup::all_reduce(const float*, float*, int64_t) { fail_no_nccl(); }
void NcclGroup::reduce_scatter(const float*, float*, int64_t) { fail_no_nccl(); }
void NcclGroup::all_gather(const float*, float*, int64_t) { fail_no_nccl(); }
void NcclGroup::broadcast(float*, int64_t, int) { fail_no_nccl(); }
void NcclGroup::all_to_all(const float*, float*, int64_t) { fail_no_nccl(); }
void NcclGroup::all_to_all_v(const float*, const std::vector<int64_t>&, float*,
                             const std::vector<int64_t>&) {
  fail_no_nccl();
}
void NcclGroup::synchronize() { fail_no_nccl(); }
void NcclGroup::abort() {}

}  // namespace foundry::gpu

#endif
