// ZeRO-1's state in checkpoints: whole slabs gathered on rank 0 to save, scattered from
// rank 0 on load, and the parameters a rank does not store gathered for the writer.
#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "optim/zero1.h"
#include "optim/zero1_messages.h"

namespace foundry {

void Zero1Optimizer::gather_released(float* params, int root) {
  if (released_.empty()) return;
  const int rank = comm_.rank(), size = comm_.size();
  std::vector<Request> requests;
  if (rank == root) {
    for (int q = 0; q < size; ++q)
      if (q != root)
        append_requests(requests, comm_.irecv_ranges(params, shard_parts(q, root, false), q,
                                                     kTagReleasedGather));
  } else {
    append_requests(requests, comm_.isend_ranges<float>(params, shard_parts(rank, root, false),
                                                        root, kTagReleasedGather));
  }
  for (Request& q : requests) q.wait();
}

// ---- checkpoint state ---------------------------------------------------------------------

std::vector<std::string> Zero1Optimizer::state_names() const {
  std::vector<std::string> names = AdamW::state_names();
  if (muon_options_)
    for (const std::string& n : Muon::state_names()) names.push_back(n);
  return names;
}

void Zero1Optimizer::check_state_name(std::string_view name) const {
  for (const std::string& n : state_names())
    if (n == name) return;
  fail(fmt::format("ZeRO-1 on rank {} of {}: no optimizer state named '{}'", comm_.rank(),
                   comm_.size(), name),
       fmt::format("the states are {}", fmt::join(state_names(), ", ")));
}

void Zero1Optimizer::export_state(std::string_view name, float* range_values) const {
  const SlabRange range = layout_.state_range(comm_.rank());
  if (name == "exp_avg" || name == "exp_avg_sq") {
    const PageSlab<float>& moment = name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    for (const AdamWChunk& c : adamw_chunks_) {
      FOUNDRY_CHECK(c.offset >= range.begin && c.offset + c.size <= range.end);
      std::memcpy(range_values + (c.offset - range.begin), moment.data() + c.state_offset,
                  sizeof(float) * c.size);
    }
    return;
  }
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (momentum_offset_[m] < 0) continue;
    FOUNDRY_CHECK(matrices[m].offset >= range.begin &&
                  matrices[m].offset + matrices[m].numel <= range.end);
    std::memcpy(range_values + (matrices[m].offset - range.begin),
                momentum_.data() + momentum_offset_[m], sizeof(float) * matrices[m].numel);
  }
}

void Zero1Optimizer::import_state(std::string_view name, const float* range_values) {
  const SlabRange range = layout_.state_range(comm_.rank());
  if (name == "exp_avg" || name == "exp_avg_sq") {
    PageSlab<float>& moment = name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    for (const AdamWChunk& c : adamw_chunks_)
      std::memcpy(moment.data() + c.state_offset, range_values + (c.offset - range.begin),
                  sizeof(float) * c.size);
    return;
  }
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (momentum_offset_[m] < 0) continue;
    std::memcpy(momentum_.data() + momentum_offset_[m],
                range_values + (matrices[m].offset - range.begin),
                sizeof(float) * matrices[m].numel);
  }
}

std::vector<float> Zero1Optimizer::gather_state(std::string_view name) const {
  check_state_name(name);
  const int rank = comm_.rank(), size = comm_.size();
  const int64_t W = options_.max_message_elements;
  const SlabRange mine = layout_.state_range(rank);
  if (rank != 0) {
    // Only rank 0 receives, and it has posted every receive: blocking sends cannot wait on
    // each other.
    std::vector<float> values(mine.size(), 0.0f);
    export_state(name, values.data());
    for (int64_t at = 0; at < mine.size(); at += W)
      comm_.send(values.data() + at, std::min(W, mine.size() - at), 0, kTagStateGather);
    return {};
  }
  std::vector<float> full(layout_.slab_elements(), 0.0f);
  std::vector<Request> receives;
  for (int r = 1; r < size; ++r) {
    const SlabRange theirs = layout_.state_range(r);
    for (int64_t at = 0; at < theirs.size(); at += W)
      receives.push_back(comm_.irecv(full.data() + theirs.begin + at,
                                     std::min(W, theirs.size() - at), r, kTagStateGather));
  }
  export_state(name, full.data() + mine.begin);
  for (Request& r : receives) r.wait();
  return full;
}

void Zero1Optimizer::load_state(std::string_view name, std::span<const float> full_slab) {
  check_state_name(name);
  const int rank = comm_.rank(), size = comm_.size();
  const int64_t W = options_.max_message_elements;
  // Rank 0 decides whether the slab fits, for everyone: a rank failing alone would leave
  // the others waiting for its messages.
  int64_t given = rank == 0 ? static_cast<int64_t>(full_slab.size()) : 0;
  comm_.broadcast(&given, 1, 0);
  if (given != layout_.slab_elements())
    fail(fmt::format("ZeRO-1 load_state('{}') on rank {} of {}: rank 0 passed {} elements, the "
                     "state slab has {}",
                     name, rank, size, given, layout_.slab_elements()),
         "the checkpoint's state was written for another parameter table (model config)");
  const SlabRange mine = layout_.state_range(rank);
  if (rank != 0) {
    std::vector<float> values(mine.size());
    std::vector<Request> receives;
    for (int64_t at = 0; at < mine.size(); at += W)
      receives.push_back(
          comm_.irecv(values.data() + at, std::min(W, mine.size() - at), 0, kTagStateLoad));
    for (Request& r : receives) r.wait();
    import_state(name, values.data());
    return;
  }
  std::vector<Request> sends;
  for (int r = 1; r < size; ++r) {
    const SlabRange theirs = layout_.state_range(r);
    for (int64_t at = 0; at < theirs.size(); at += W)
      sends.push_back(comm_.isend(full_slab.data() + theirs.begin + at,
                                  std::min(W, theirs.size() - at), r, kTagStateLoad));
  }
  import_state(name, full_slab.data() + mine.begin);
  for (Request& r : sends) r.wait();
}

std::vector<Zero1Optimizer::StateRun> Zero1Optimizer::state_runs(std::string_view name) {
  check_state_name(name);
  std::vector<StateRun> runs;
  if (name == "exp_avg" || name == "exp_avg_sq") {
    PageSlab<float>& moment = name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    for (const AdamWChunk& c : adamw_chunks_)
      runs.push_back({c.offset, c.offset + c.size, moment.data() + c.state_offset});
    return runs;
  }
  const std::vector<MuonPlacement>& matrices = layout_.muon_matrices();
  for (size_t m = 0; m < matrices.size(); ++m)
    if (momentum_offset_[m] >= 0)
      runs.push_back({matrices[m].offset, matrices[m].offset + matrices[m].numel,
                      momentum_.data() + momentum_offset_[m]});
  return runs;
}

void Zero1Optimizer::reset() {
  std::fill(exp_avg_.begin(), exp_avg_.end(), 0.0f);
  std::fill(exp_avg_sq_.begin(), exp_avg_sq_.end(), 0.0f);
  std::fill(momentum_.begin(), momentum_.end(), 0.0f);
}

}  // namespace foundry
