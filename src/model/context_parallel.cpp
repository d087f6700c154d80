#include "model/context_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "kernels/backend.h"

namespace foundry {
namespace {

// Message tags of the boundary exchange and of its gradients (slot 0 with the tag, slot 1
// with tag + 1).
constexpr int kSlotTag = 7101, kSlotGradTag = 7103;

// Slot `slot` of packed [B, 2, rows, width] ↔ contiguous [B, rows, width].
void pack_slot(const float* packed, float* slot_rows, int64_t batch, int64_t block, int slot) {
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(slot_rows + b * block, packed + (2 * b + slot) * block, block * sizeof(float));
}
void unpack_slot(const float* slot_rows, float* packed, int64_t batch, int64_t block, int slot,
                 bool add) {
  for (int64_t b = 0; b < batch; ++b) {
    float* to = packed + (2 * b + slot) * block;
    const float* from = slot_rows + b * block;
    if (add)
      for (int64_t i = 0; i < block; ++i) to[i] += from[i];
    else
      std::memcpy(to, from, block * sizeof(float));
  }
}

}  // namespace

ContextParallel::ContextParallel(const Communicator& group, Backend* backend)
    : group_(group), backend_(backend) {}

bool ContextParallel::staged() const { return backend_ && !backend_->host_memory(); }

int64_t ContextParallel::chunk_length(int64_t seq) const {
  const int64_t chunks = 2 * static_cast<int64_t>(size());
  if (seq % chunks != 0)
    fail(fmt::format("sequence length {} cannot be cut into {} equal chunks (2 per rank for "
                     "train.context_parallel = {})",
                     seq, chunks, size()),
         fmt::format("use a sequence length that is a multiple of {}", chunks));
  return seq / chunks;
}

template <typename T>
void ContextParallel::take_local(const T* full, T* local, int64_t batch, int64_t seq,
                                 int64_t width) const {
  const int64_t tc = chunk_length(seq), block = tc * width;
  for (int64_t b = 0; b < batch; ++b)
    for (int slot = 0; slot < 2; ++slot)
      std::copy_n(full + (b * seq + chunk(slot) * tc) * width, block,
                  local + (2 * b + slot) * block);
}
template void ContextParallel::take_local<int32_t>(const int32_t*, int32_t*, int64_t, int64_t,
                                                   int64_t) const;
template void ContextParallel::take_local<float>(const float*, float*, int64_t, int64_t,
                                                 int64_t) const;

void ContextParallel::gather(const float* local, float* full, int64_t batch, int64_t tc,
                             int64_t width) {
  for (int slot = 0; slot < 2; ++slot) start_gather(slot, 0, local, full, batch, tc, width);
  finish(0);
  finish(1);
}

void ContextParallel::reduce_scatter(const float* full, float* local, int64_t batch, int64_t tc,
                                     int64_t width) {
  for (int slot = 0; slot < 2; ++slot)
    start_reduce_scatter(slot, 0, full, local, batch, tc, width);
  finish(0);
  finish(1);
}

ContextParallel::Exchange& ContextParallel::exchange(int slot, int tensor) {
  FOUNDRY_CHECK(slot >= 0 && slot < 2 && tensor >= 0 && tensor < 2);
  Exchange& e = exchanges_[2 * slot + tensor];
  FOUNDRY_CHECK(!e.active);
  return e;
}

// A slot's chunks of every sequence are contiguous in full [B, 2C·Tc, width]: chunks 0 … C−1
// (slot 0) and C … 2C−1 (slot 1). Rank p's chunk in the slot is the region's chunk
// chunk_of(p, slot) − slot·C.
ContextParallel::SlotRegion ContextParallel::slot_region(Exchange& e, float* full, int slot) const {
  const int64_t c = size(), slot_rows = c * e.tc * e.width;
  if (!staged()) return {full + slot * slot_rows, 2 * slot_rows};
  e.region.resize(static_cast<size_t>(e.batch * slot_rows));
  return {e.region.data(), slot_rows};
}

void ContextParallel::region_to_host(Exchange& e, const float* full, int slot) const {
  const int64_t slot_rows = size() * e.tc * e.width;
  for (int64_t b = 0; b < e.batch; ++b)
    backend_->to_host(e.region.data() + b * slot_rows, full + (2 * b + slot) * slot_rows,
                      slot_rows * static_cast<int64_t>(sizeof(float)));
}

void ContextParallel::region_from_host(const Exchange& e, float* full, int slot) const {
  const int64_t slot_rows = size() * e.tc * e.width;
  for (int64_t b = 0; b < e.batch; ++b)
    backend_->from_host(full + (2 * b + slot) * slot_rows, e.region.data() + b * slot_rows,
                        slot_rows * static_cast<int64_t>(sizeof(float)));
}

// A slot's rows of local [B, 2, Tc, width]: [B, Tc, width] at (2b + slot)·Tc·width.
void ContextParallel::start_gather(int slot, int tensor, const float* local, float* full,
                                   int64_t batch, int64_t tc, int64_t width) {
  Exchange& e = exchange(slot, tensor);
  const int64_t block = tc * width, mine = batch * block;
  e.send.resize(static_cast<size_t>(mine));
  e.recv.resize(static_cast<size_t>(mine * size()));
  for (int64_t b = 0; b < batch; ++b) {
    float* to = e.send.data() + b * block;
    const float* from = local + (2 * b + slot) * block;
    if (staged())
      backend_->to_host(to, from, block * static_cast<int64_t>(sizeof(float)));
    else
      std::memcpy(to, from, block * sizeof(float));
  }
  e.request = group_.iallgather(e.send.data(), e.recv.data(), static_cast<size_t>(mine));
  e.active = true;
  e.gather = true;
  e.out = full;
  e.batch = batch;
  e.tc = tc;
  e.width = width;
}

void ContextParallel::start_reduce_scatter(int slot, int tensor, const float* full, float* local,
                                           int64_t batch, int64_t tc, int64_t width) {
  Exchange& e = exchange(slot, tensor);
  const int64_t block = tc * width, mine = batch * block, c = size();
  e.send.resize(static_cast<size_t>(mine * c));
  e.recv.resize(static_cast<size_t>(mine));
  e.gather = false;
  e.out = local;
  e.batch = batch;
  e.tc = tc;
  e.width = width;
  const SlotRegion region = slot_region(e, const_cast<float*>(full), slot);
  if (staged()) region_to_host(e, full, slot);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < c; ++p)
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(e.send.data() + p * mine + b * block,
                  region.base + b * region.stride +
                      (chunk_of(static_cast<int>(p), slot) - slot * c) * block,
                  block * sizeof(float));
  e.request = group_.ireduce_scatter(e.send.data(), e.recv.data(), static_cast<size_t>(mine));
  e.active = true;
}

void ContextParallel::finish(int slot) {
  for (int tensor = 0; tensor < 2; ++tensor) {
    Exchange& e = exchanges_[2 * slot + tensor];
    if (!e.active) continue;
    e.request.wait();
    e.active = false;
    const int64_t block = e.tc * e.width, mine = e.batch * block, c = size();
    if (e.gather) {
      const SlotRegion region = slot_region(e, e.out, slot);
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t p = 0; p < c; ++p)
        for (int64_t b = 0; b < e.batch; ++b)
          std::memcpy(region.base + b * region.stride +
                          (chunk_of(static_cast<int>(p), slot) - slot * c) * block,
                      e.recv.data() + p * mine + b * block, block * sizeof(float));
      if (staged()) region_from_host(e, e.out, slot);
    } else {
      for (int64_t b = 0; b < e.batch; ++b) {
        float* to = e.out + (2 * b + slot) * block;
        const float* from = e.recv.data() + b * block;
        if (staged())
          backend_->from_host(to, from, block * static_cast<int64_t>(sizeof(float)));
        else
          std::memcpy(to, from, block * sizeof(float));
      }
    }
  }
}

void ContextParallel::progress() {
  for (Exchange& e : exchanges_)
    if (e.active) e.request.test();
}

// On a device the (few) boundary rows are copied to the host whole and back.
void ContextParallel::exchange_halo(const float* tails, float* halos, int64_t batch, int64_t rows,
                                    int64_t width) {
  if (!staged()) return exchange_halo_host(tails, halos, batch, rows, width);
  const int64_t n = 2 * batch * rows * width, bytes = n * static_cast<int64_t>(sizeof(float));
  halo_in_.resize(static_cast<size_t>(n));
  halo_out_.resize(static_cast<size_t>(n));
  backend_->to_host(halo_in_.data(), tails, bytes);
  exchange_halo_host(halo_in_.data(), halo_out_.data(), batch, rows, width);
  backend_->from_host(halos, halo_out_.data(), bytes);
}

void ContextParallel::return_halo_gradient(const float* dhalos, float* dtails, int64_t batch,
                                           int64_t rows, int64_t width) {
  if (!staged()) return return_halo_gradient_host(dhalos, dtails, batch, rows, width);
  const int64_t n = 2 * batch * rows * width, bytes = n * static_cast<int64_t>(sizeof(float));
  halo_in_.resize(static_cast<size_t>(n));
  halo_out_.resize(static_cast<size_t>(n));
  backend_->to_host(halo_in_.data(), dhalos, bytes);
  backend_->to_host(halo_out_.data(), dtails, bytes);
  return_halo_gradient_host(halo_in_.data(), halo_out_.data(), batch, rows, width);
  backend_->from_host(dtails, halo_out_.data(), bytes);
}

// Slot 0 of rank r is chunk r: its halo is the tail of chunk r − 1, slot 0 of rank r − 1.
// Slot 1 of rank r is chunk 2C − 1 − r: its halo is the tail of chunk 2C − 2 − r, slot 1 of
// rank r + 1, except on the last rank, where it is the rank's own slot 0 (chunk C − 1).
void ContextParallel::exchange_halo_host(const float* tails, float* halos, int64_t batch,
                                         int64_t rows, int64_t width) {
  const int me = rank(), last = size() - 1;
  const int64_t n = batch * rows * width;
  const SlotMessages m = swap_slots(tails, batch, rows * width, me > 0 ? me - 1 : -1,
                                    me < last ? me + 1 : -1, kSlotTag);
  if (me == 0) std::fill(m.recv0, m.recv0 + n, 0.0f);
  if (me == last) std::memcpy(m.recv1, m.send0, n * sizeof(float));
  unpack_slot(m.recv0, halos, batch, rows * width, 0, false);
  unpack_slot(m.recv1, halos, batch, rows * width, 1, false);
}

// The adjoint: every message of exchange_halo travels back.
void ContextParallel::return_halo_gradient_host(const float* dhalos, float* dtails, int64_t batch,
                                                int64_t rows, int64_t width) {
  const int me = rank(), last = size() - 1;
  const SlotMessages m = swap_slots(dhalos, batch, rows * width, me < last ? me + 1 : -1,
                                    me > 0 ? me - 1 : -1, kSlotGradTag);
  // Rank 0's slot 0 halo was zero (no chunk before chunk 0): its gradient goes nowhere.
  if (me < last) unpack_slot(m.recv0, dtails, batch, rows * width, 0, true);
  if (me > 0) unpack_slot(m.recv1, dtails, batch, rows * width, 1, true);
  if (me == last) unpack_slot(m.send1, dtails, batch, rows * width, 0, true);
}

// One neighbour exchange of packed [B, 2, rows, width] (block = rows·width): slot 0 is
// received from `slot0_peer` and sent to `slot1_peer`, slot 1 received from `slot1_peer` and
// sent to `slot0_peer` (-1: no such neighbour, nothing moves).
ContextParallel::SlotMessages ContextParallel::swap_slots(const float* packed, int64_t batch,
                                                          int64_t block, int slot0_peer,
                                                          int slot1_peer, int tag) {
  const int64_t n = batch * block;
  send_.resize(static_cast<size_t>(2 * n));
  recv_.resize(static_cast<size_t>(2 * n));
  const SlotMessages m{send_.data(), send_.data() + n, recv_.data(), recv_.data() + n};
  pack_slot(packed, m.send0, batch, block, 0);
  pack_slot(packed, m.send1, batch, block, 1);
  std::vector<Request> requests;
  if (slot0_peer >= 0) requests.push_back(group_.irecv(m.recv0, n, slot0_peer, tag));
  if (slot1_peer >= 0) requests.push_back(group_.irecv(m.recv1, n, slot1_peer, tag + 1));
  if (slot1_peer >= 0) requests.push_back(group_.isend(m.send0, n, slot1_peer, tag));
  if (slot0_peer >= 0) requests.push_back(group_.isend(m.send1, n, slot0_peer, tag + 1));
  for (Request& r : requests) r.wait();
  return m;
}

void take_chunk_rows(Backend& ops, const float* local, float* packed, int64_t batch, int64_t tc,
                     int64_t width, int64_t row0, int64_t rows) {
  FOUNDRY_CHECK(row0 >= 0 && row0 + rows <= tc);
  for (int64_t bs = 0; bs < 2 * batch; ++bs)
    ops.copy(packed + bs * rows * width, local + (bs * tc + row0) * width,
             rows * width * static_cast<int64_t>(sizeof(float)));
}

void add_chunk_rows(Backend& ops, const float* packed, float* local, int64_t batch, int64_t tc,
                    int64_t width, int64_t row0, int64_t rows) {
  FOUNDRY_CHECK(row0 >= 0 && row0 + rows <= tc);
  for (int64_t bs = 0; bs < 2 * batch; ++bs)
    ops.add(local + (bs * tc + row0) * width, packed + bs * rows * width, rows * width);
}

}  // namespace foundry
