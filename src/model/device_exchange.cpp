#include "model/device_exchange.h"

#include <numeric>

#include "base/error.h"
#include "cuda/nccl.h"
#include "kernels/backend.h"

namespace foundry {
namespace {

constexpr int64_t kFloat = sizeof(float);

int64_t total(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

}  // namespace

DeviceExchange::DeviceExchange(const Communicator& group, Backend& backend, gpu::NcclGroup* nccl)
    : group_(group), backend_(backend), nccl_(nccl) {
  FOUNDRY_CHECK(!nccl || nccl->size() == group.size());
}

void DeviceExchange::all_to_all_v(const float* send, const std::vector<int64_t>& send_counts,
                                  float* recv, const std::vector<int64_t>& recv_counts) {
  if (nccl_) return nccl_->all_to_all_v(send, send_counts, recv, recv_counts);
  const int64_t out = total(send_counts), in = total(recv_counts);
  out_.resize(static_cast<size_t>(out));
  in_.resize(static_cast<size_t>(in));
  if (out > 0) backend_.to_host(out_.data(), send, out * kFloat);
  group_.alltoallv(out_.data(), std::span<const int64_t>(send_counts), in_.data(),
                   std::span<const int64_t>(recv_counts));
  if (in > 0) backend_.from_host(recv, in_.data(), in * kFloat);
}

DeviceExchange::Started& DeviceExchange::start(int id) {
  FOUNDRY_CHECK(id >= 0 && id < kStarted);
  Started& s = started_[id];
  FOUNDRY_CHECK(!s.active);
  s.active = true;
  return s;
}

void DeviceExchange::start_all_gather(int id, const float* send, float* recv, int64_t n) {
  Started& s = start(id);
  const int64_t c = group_.size();
  s.recv = recv;
  s.recv_n = c * n;
  if (nccl_) {
    s.ticket = nccl_->all_gather_beside(send, recv, n);
    return;
  }
  s.narrow.resize(static_cast<size_t>(n));
  s.wide.resize(static_cast<size_t>(c * n));
  backend_.to_host(s.narrow.data(), send, n * kFloat);
  s.request = group_.iallgather(s.narrow.data(), s.wide.data(), static_cast<size_t>(n));
  s.landed = s.wide.data();
}

void DeviceExchange::start_reduce_scatter(int id, const float* send, float* recv, int64_t n) {
  Started& s = start(id);
  const int64_t c = group_.size();
  s.recv = recv;
  s.recv_n = n;
  if (nccl_) {
    s.ticket = nccl_->reduce_scatter_beside(send, recv, n);
    return;
  }
  s.wide.resize(static_cast<size_t>(c * n));
  s.narrow.resize(static_cast<size_t>(n));
  backend_.to_host(s.wide.data(), send, c * n * kFloat);
  s.request = group_.ireduce_scatter(s.wide.data(), s.narrow.data(), static_cast<size_t>(n));
  s.landed = s.narrow.data();
}

void DeviceExchange::finish(int id) {
  FOUNDRY_CHECK(id >= 0 && id < kStarted);
  Started& s = started_[id];
  if (!s.active) return;
  s.active = false;
  if (nccl_) return nccl_->join(s.ticket);
  s.request.wait();
  backend_.from_host(s.recv, s.landed, s.recv_n * kFloat);
}

void DeviceExchange::progress() {
  if (nccl_) return;
  for (Started& s : started_)
    if (s.active) s.request.test();
}

}  // namespace foundry
