// Context parallelism (docs/long-context.md): every sequence of a batch is cut into 2C chunks
// of equal length Tc = T / 2C, and rank r of a context-parallel group of C ranks holds chunks
// r and 2C−1−r, one early and one late, so that every rank has the same causal attention
// work. A rank's rows are [B, 2·Tc]: for each sequence its first chunk ("slot 0"), then its
// second ("slot 1"). Everything token-local (projections, norms, experts, the loss) runs on
// those rows unchanged; what mixes positions needs the other ranks:
//   attention      the keys and values of the whole sequence: one all-gather per layer
//                  (gather), and their gradients summed back to their owners (reduce_scatter);
//   CCA            the convolutions and the value shift read a few rows before each chunk:
//                  the last rows of the chunk before it (exchange_halo), whose gradients go
//                  back to that chunk's owner (return_halo_gradient);
//   RoPE           each chunk's rows sit at positions chunk·Tc + i (position).
// The tensors are in a backend's memory: on a device the exchanged rows are packed and
// unpacked by the backend's copies and move over NCCL where the group has it, else through
// host memory and MPI (model/device_exchange.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.h"

namespace foundry {

class Backend;
namespace gpu {
class NcclGroup;
}

class ContextParallel {
 public:
  // `group` (C ranks, rank order = CP rank) and `backend`, whose memory holds the tensors
  // passed to the exchanges (null: host memory), must outlive this object, as must `nccl`
  // (the same ranks over NCCL, for a device's tensors; null: through host memory).
  explicit ContextParallel(const Communicator& group, Backend* backend = nullptr,
                           gpu::NcclGroup* nccl = nullptr);
  ~ContextParallel();

  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  const Communicator& group() const { return group_; }

  // The chunk held in `slot` (0 or 1) by CP rank `rank` (default: this rank).
  int64_t chunk(int slot) const { return chunk_of(rank(), slot); }
  int64_t chunk_of(int rank, int slot) const {
    return slot == 0 ? rank : 2 * static_cast<int64_t>(size()) - 1 - rank;
  }
  // Chunk length for sequences of `seq` tokens; fails, naming the values, unless 2C | seq.
  int64_t chunk_length(int64_t seq) const;

  // This rank's rows of full [B, T, width] rows: local [B, 2·Tc, width] (host memory).
  template <typename T>
  void take_local(const T* full, T* local, int64_t batch, int64_t seq, int64_t width) const;

  // All-gather over the group: every rank's local [B, 2·Tc, width] → full [B, 2C·Tc, width]
  // in position order, on every rank.
  void gather(const float* local, float* full, int64_t batch, int64_t tc, int64_t width);
  // The inverse's adjoint: full [B, 2C·Tc, width] of every rank, summed over the group, and
  // this rank's rows of the sum in local [B, 2·Tc, width] (writes).
  void reduce_scatter(const float* full, float* local, int64_t batch, int64_t tc,
                      int64_t width);

  // The same, one slot at a time and non-blocking, so that an exchange can run while the
  // other slot computes: the chunks all ranks hold in `slot` (slot 0: chunks 0 … C−1, all
  // that the slot-0 queries read). `tensor` (0 or 1) tells two exchanges of one slot apart
  // (k and v). Buffers must stay untouched until the matching finish_*.
  void start_gather(int slot, int tensor, const float* local, float* full, int64_t batch,
                    int64_t tc, int64_t width);
  void start_reduce_scatter(int slot, int tensor, const float* full, float* local,
                            int64_t batch, int64_t tc, int64_t width);
  // Waits for the slot's started exchanges and writes their results: a gather the rows of
  // the slot's chunks in full, a reduce-scatter this rank's slot rows of local.
  void finish(int slot);
  // Lets MPI move the started exchanges along (call between pieces of computation).
  void progress();

  // Boundary rows. tails [B, 2, rows, width]: the last `rows` rows of each of this rank's
  // chunks (or any per-chunk rows a neighbour needs). halos [B, 2, rows, width] (writes): for
  // each slot, the tails of the chunk just before it, zero before chunk 0. Messages with the
  // neighbours in chunk order (on a device, an all-to-all over the group whose only blocks
  // are the neighbours'); no gather or reduce-scatter may be started then.
  void exchange_halo(const float* tails, float* halos, int64_t batch, int64_t rows,
                     int64_t width);
  // The adjoint: dhalos [B, 2, rows, width], gradients with respect to this rank's halos,
  // are sent back to the chunks they came from and added to their owners' dtails (+=).
  void return_halo_gradient(const float* dhalos, float* dtails, int64_t batch, int64_t rows,
                            int64_t width);

 private:
  // One started exchange: its request, host staging (grow-only, reused every layer: this
  // rank's rows and the group's, a gather's out and in, a reduce-scatter's in and out) and
  // where its result goes.
  struct Exchange {
    Request request;
    bool active = false, gather = false;
    std::vector<float> narrow, wide;
    float* out = nullptr;
    int64_t batch = 0, tc = 0, width = 0;
  };
  // On a device: the exchanges' rows in device memory and how they move.
  struct Device;

  Exchange& exchange(int slot, int tensor);
  Exchange& describe(int slot, int tensor, bool gather, float* out, int64_t batch, int64_t tc,
                     int64_t width);
  // The device's side of start_gather, start_reduce_scatter and finish.
  void start_gather_device(int id, const Exchange& e, int slot, const float* local);
  void start_reduce_scatter_device(int id, const Exchange& e, int slot, const float* full);
  void finish_device(int id, const Exchange& e, int slot);
  // exchange_halo and return_halo_gradient on host arrays and on a device's.
  void exchange_halo_host(const float* tails, float* halos, int64_t batch, int64_t rows,
                          int64_t width);
  void return_halo_gradient_host(const float* dhalos, float* dtails, int64_t batch, int64_t rows,
                                 int64_t width);
  void exchange_halo_device(const float* tails, float* halos, int64_t batch, int64_t rows,
                            int64_t width);
  void return_halo_gradient_device(const float* dhalos, float* dtails, int64_t batch, int64_t rows,
                                   int64_t width);
  // The two slots' messages of a boundary exchange, in the halo staging.
  struct SlotMessages {
    float *send0, *send1, *recv0, *recv1;
  };
  SlotMessages swap_slots(const float* packed, int64_t batch, int64_t block, int slot0_peer,
                          int slot1_peer, int tag);
  // On a device: slot s of packed [B, 2, block] goes to rank to[s] and a block for slot s comes
  // from rank from[s] (-1: none); returns where each slot's block landed (null: none).
  struct Landed {
    const float* slot[2];
  };
  Landed swap_slots_device(const float* packed, int64_t batch, int64_t block, const int to[2],
                           const int from[2]);

  const Communicator& group_;
  std::unique_ptr<Device> device_;
  std::vector<float> send_, recv_;  // staging of the host's halo exchanges, grow-only
  Exchange exchanges_[4];           // [slot][tensor]
};

// Rows [row0, row0 + rows) of each chunk of local [B, 2·Tc, width] into packed
// [B, 2, rows, width] (take_chunk_rows) and back, added (add_chunk_rows); in `ops`' memory.
void take_chunk_rows(Backend& ops, const float* local, float* packed, int64_t batch, int64_t tc,
                     int64_t width, int64_t row0, int64_t rows);
void add_chunk_rows(Backend& ops, const float* packed, float* local, int64_t batch, int64_t tc,
                    int64_t width, int64_t row0, int64_t rows);

}  // namespace foundry
