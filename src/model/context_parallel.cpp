#include "model/context_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "kernels/backend.h"
#include "model/device_exchange.h"

namespace foundry {
namespace {

constexpr int64_t kFloat = sizeof(float);

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

struct ContextParallel::Device {
  Device(const Communicator& group, Backend& backend, gpu::NcclGroup* nccl)
      : backend(backend), moves(group, backend, nccl), halo_send(backend), halo_recv(backend) {
    for (int id = 0; id < 4; ++id) {
      narrow.emplace_back(backend);
      wide.emplace_back(backend);
    }
  }
  // `blocks` blocks of `block` floats on the device, block i from from + i·from_stride to
  // to + i·to_stride (strides in floats).
  void copy_blocks(float* to, int64_t to_stride, const float* from, int64_t from_stride,
                   int64_t block, int64_t blocks) {
    backend.copy_blocks(to, to_stride * kFloat, from, from_stride * kFloat, block * kFloat, blocks);
  }

  Backend& backend;
  DeviceExchange moves;
  // Each exchange's rows, [slot][tensor]: this rank's (a gather's out, a reduce-scatter's
  // in) and the group's (a gather's in, a reduce-scatter's out). An exchange is a gather in
  // forward and a reduce-scatter in backward: the two share the buffers.
  std::vector<GrowingBuffer> narrow, wide;
  GrowingBuffer halo_send, halo_recv;     // the boundary exchanges'
};

ContextParallel::ContextParallel(const Communicator& group, Backend* backend, gpu::NcclGroup* nccl)
    : group_(group) {
  if (backend && !backend->host_memory()) device_ = std::make_unique<Device>(group, *backend, nccl);
  FOUNDRY_CHECK(!nccl || device_);
}

ContextParallel::~ContextParallel() = default;

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

ContextParallel::Exchange& ContextParallel::describe(int slot, int tensor, bool gather, float* out,
                                                     int64_t batch, int64_t tc, int64_t width) {
  Exchange& e = exchange(slot, tensor);
  e.active = true;
  e.gather = gather;
  e.out = out;
  e.batch = batch;
  e.tc = tc;
  e.width = width;
  return e;
}

// A slot's chunks of every sequence are contiguous in full [B, 2C·Tc, width]: chunks 0 … C−1
// (slot 0) and C … 2C−1 (slot 1). Rank p's chunk in the slot is chunk_of(p, slot), at
// full + (b·2C + chunk)·Tc·width. A slot's rows of local [B, 2, Tc, width]: [B, Tc, width] at
// (2b + slot)·Tc·width.
void ContextParallel::start_gather(int slot, int tensor, const float* local, float* full,
                                   int64_t batch, int64_t tc, int64_t width) {
  Exchange& e = describe(slot, tensor, true, full, batch, tc, width);
  if (device_) return start_gather_device(2 * slot + tensor, e, slot, local);
  const int64_t block = tc * width, mine = batch * block;
  e.narrow.resize(static_cast<size_t>(mine));
  e.wide.resize(static_cast<size_t>(mine * size()));
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(e.narrow.data() + b * block, local + (2 * b + slot) * block, block * sizeof(float));
  e.request = group_.iallgather(e.narrow.data(), e.wide.data(), static_cast<size_t>(mine));
}

void ContextParallel::start_reduce_scatter(int slot, int tensor, const float* full, float* local,
                                           int64_t batch, int64_t tc, int64_t width) {
  Exchange& e = describe(slot, tensor, false, local, batch, tc, width);
  if (device_) return start_reduce_scatter_device(2 * slot + tensor, e, slot, full);
  const int64_t block = tc * width, mine = batch * block, c = size();
  e.wide.resize(static_cast<size_t>(mine * c));
  e.narrow.resize(static_cast<size_t>(mine));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < c; ++p)
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(e.wide.data() + p * mine + b * block,
                  full + (b * 2 * c + chunk_of(static_cast<int>(p), slot)) * block,
                  block * sizeof(float));
  e.request = group_.ireduce_scatter(e.wide.data(), e.narrow.data(), static_cast<size_t>(mine));
}

void ContextParallel::finish(int slot) {
  for (int tensor = 0; tensor < 2; ++tensor) {
    Exchange& e = exchanges_[2 * slot + tensor];
    if (!e.active) continue;
    e.active = false;
    if (device_) {
      finish_device(2 * slot + tensor, e, slot);
      continue;
    }
    e.request.wait();
    const int64_t block = e.tc * e.width, mine = e.batch * block, c = size();
    if (e.gather) {
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t p = 0; p < c; ++p)
        for (int64_t b = 0; b < e.batch; ++b)
          std::memcpy(e.out + (b * 2 * c + chunk_of(static_cast<int>(p), slot)) * block,
                      e.wide.data() + p * mine + b * block, block * sizeof(float));
    } else {
      for (int64_t b = 0; b < e.batch; ++b)
        std::memcpy(e.out + (2 * b + slot) * block, e.narrow.data() + b * block,
                    block * sizeof(float));
    }
  }
}

void ContextParallel::progress() {
  if (device_) return device_->moves.progress();
  for (Exchange& e : exchanges_)
    if (e.active) e.request.test();
}

// On a device the same blocks are packed into and unpacked from device buffers by the
// backend's copies, and moved whole.
void ContextParallel::start_gather_device(int id, const Exchange& e, int slot, const float* local) {
  Device& d = *device_;
  const int64_t block = e.tc * e.width, mine = e.batch * block;
  float* send = d.narrow[id].get_as<float>(mine);
  float* recv = d.wide[id].get_as<float>(mine * size());
  d.copy_blocks(send, block, local + slot * block, 2 * block, block, e.batch);
  d.moves.start_all_gather(id, send, recv, mine);
}

void ContextParallel::start_reduce_scatter_device(int id, const Exchange& e, int slot,
                                                  const float* full) {
  Device& d = *device_;
  const int64_t block = e.tc * e.width, mine = e.batch * block, c = size();
  float* send = d.wide[id].get_as<float>(mine * c);
  float* recv = d.narrow[id].get_as<float>(mine);
  // Rank p's chunk of every sequence: send's blocks p·B … p·B + B − 1.
  for (int p = 0; p < c; ++p)
    d.copy_blocks(send + p * mine, block, full + chunk_of(p, slot) * block, 2 * c * block, block,
                  e.batch);
  d.moves.start_reduce_scatter(id, send, recv, mine);
}

void ContextParallel::finish_device(int id, const Exchange& e, int slot) {
  Device& d = *device_;
  d.moves.finish(id);
  const int64_t block = e.tc * e.width, c = size();
  const float* recv = static_cast<const float*>((e.gather ? d.wide : d.narrow)[id].data());
  if (e.gather)
    for (int p = 0; p < c; ++p)
      d.copy_blocks(e.out + chunk_of(p, slot) * block, 2 * c * block, recv + p * e.batch * block,
                    block, block, e.batch);
  else
    d.copy_blocks(e.out + slot * block, 2 * block, recv, block, block, e.batch);
}

void ContextParallel::exchange_halo(const float* tails, float* halos, int64_t batch, int64_t rows,
                                    int64_t width) {
  // On a device over NCCL the started collectives run on another stream of the same group.
  FOUNDRY_CHECK(std::none_of(std::begin(exchanges_), std::end(exchanges_),
                             [](const Exchange& e) { return e.active; }));
  if (device_) return exchange_halo_device(tails, halos, batch, rows, width);
  exchange_halo_host(tails, halos, batch, rows, width);
}

void ContextParallel::return_halo_gradient(const float* dhalos, float* dtails, int64_t batch,
                                           int64_t rows, int64_t width) {
  FOUNDRY_CHECK(std::none_of(std::begin(exchanges_), std::end(exchanges_),
                             [](const Exchange& e) { return e.active; }));
  if (device_) return return_halo_gradient_device(dhalos, dtails, batch, rows, width);
  return_halo_gradient_host(dhalos, dtails, batch, rows, width);
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

// The same messages between device buffers: exchange_halo's slot 0 goes to rank r + 1 and its
// slot 1 to rank r − 1; the gradients travel back.
void ContextParallel::exchange_halo_device(const float* tails, float* halos, int64_t batch,
                                           int64_t rows, int64_t width) {
  Device& d = *device_;
  const int me = rank(), last = size() - 1;
  const int64_t block = rows * width;
  const int to[2] = {me < last ? me + 1 : -1, me > 0 ? me - 1 : -1};
  const int from[2] = {me > 0 ? me - 1 : -1, me < last ? me + 1 : -1};
  const Landed in = swap_slots_device(tails, batch, block, to, from);
  for (int slot = 0; slot < 2; ++slot)
    if (in.slot[slot])
      d.copy_blocks(halos + slot * block, 2 * block, in.slot[slot], block, block, batch);
  if (me == 0)
    for (int64_t b = 0; b < batch; ++b) d.backend.zero(halos + 2 * b * block, block * kFloat);
  if (me == last) d.copy_blocks(halos + block, 2 * block, tails, 2 * block, block, batch);
}

void ContextParallel::return_halo_gradient_device(const float* dhalos, float* dtails, int64_t batch,
                                                  int64_t rows, int64_t width) {
  Device& d = *device_;
  const int me = rank(), last = size() - 1;
  const int64_t block = rows * width;
  const int to[2] = {me > 0 ? me - 1 : -1, me < last ? me + 1 : -1};
  const int from[2] = {me < last ? me + 1 : -1, me > 0 ? me - 1 : -1};
  const Landed in = swap_slots_device(dhalos, batch, block, to, from);
  for (int slot = 0; slot < 2; ++slot)
    if (in.slot[slot])
      for (int64_t b = 0; b < batch; ++b)
        d.backend.add(dtails + (2 * b + slot) * block, in.slot[slot] + b * block, block);
  if (me == last)
    for (int64_t b = 0; b < batch; ++b)
      d.backend.add(dtails + 2 * b * block, dhalos + (2 * b + 1) * block, block);
}

ContextParallel::Landed ContextParallel::swap_slots_device(const float* packed, int64_t batch,
                                                           int64_t block, const int to[2],
                                                           const int from[2]) {
  Device& d = *device_;
  const int64_t n = batch * block, c = size();
  std::vector<int64_t> send_counts(static_cast<size_t>(c)), recv_counts(send_counts);
  for (int slot = 0; slot < 2; ++slot) {
    if (to[slot] >= 0) send_counts[static_cast<size_t>(to[slot])] = n;
    if (from[slot] >= 0) recv_counts[static_cast<size_t>(from[slot])] = n;
  }
  // Blocks are in rank order; the two peers of a slot pair are different ranks.
  const auto offset = [](const std::vector<int64_t>& counts, int peer) {
    int64_t at = 0;
    for (int p = 0; p < peer; ++p) at += counts[static_cast<size_t>(p)];
    return at;
  };
  float* send = d.halo_send.get_as<float>(2 * n);
  float* recv = d.halo_recv.get_as<float>(2 * n);
  for (int slot = 0; slot < 2; ++slot)
    if (to[slot] >= 0) {
      d.copy_blocks(send + offset(send_counts, to[slot]), block, packed + slot * block, 2 * block,
                    block, batch);
    }
  d.moves.all_to_all_v(send, send_counts, recv, recv_counts);
  Landed in{};
  for (int slot = 0; slot < 2; ++slot)
    in.slot[slot] = from[slot] >= 0 ? recv + offset(recv_counts, from[slot]) : nullptr;
  return in;
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
