// Rows moved between the ranks of a group whose tensors are in a device's memory, which the
// host does not touch (a GPU's): over NCCL where the group has it (every rank on a GPU of its
// own), else copied to host memory, moved by MPI and copied back. Expert parallelism's
// all-to-all and context parallelism's gathers, reduce-scatters and boundary exchanges share
// it; the host's own tensors go straight to the Communicator instead.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"

namespace foundry {

class Backend;
namespace gpu {
class NcclGroup;
}

class DeviceExchange {
 public:
  // Up to this many collectives started at once (start_*'s id).
  static constexpr int kStarted = 4;

  // `group`, `backend` and `nccl` (null: through host memory; else the same ranks as `group`)
  // must outlive this object.
  DeviceExchange(const Communicator& group, Backend& backend, gpu::NcclGroup* nccl);

  // An all-to-all of blocks contiguous per peer in rank order, counts in floats (send_counts[p]
  // to rank p, recv_counts[p] from it; zero: nothing moves). Done for the work queued after it.
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts);

  // Collectives of `n` floats per rank that run beside the work queued after them: an
  // all-gather (recv [C·n], rank order) and a reduce-scatter (send [C·n] summed over the ranks;
  // this rank's block in recv [n]). `id` (0 … kStarted−1) names the started collective;
  // finish(id) makes its result in `recv` ready for the work queued after it. The buffers stay
  // untouched until then.
  void start_all_gather(int id, const float* send, float* recv, int64_t n);
  void start_reduce_scatter(int id, const float* send, float* recv, int64_t n);
  void finish(int id);
  // Lets MPI move the started collectives along (through host memory; NCCL needs no help).
  void progress();

 private:
  struct Started {
    bool active = false;
    Request request;             // through host memory
    int64_t ticket = 0;          // over NCCL
    // Through host memory, the staging (grow-only): one rank's rows and the group's, out and
    // in or in and out; `landed` is the one received into.
    std::vector<float> narrow, wide;
    const float* landed = nullptr;
    float* recv = nullptr;
    int64_t recv_n = 0;
  };
  Started& start(int id);

  const Communicator& group_;
  Backend& backend_;
  gpu::NcclGroup* nccl_;
  Started started_[kStarted];
  std::vector<float> out_, in_;  // all_to_all_v's staging, grow-only
};

}  // namespace foundry
