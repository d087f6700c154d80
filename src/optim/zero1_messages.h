// The messages of ZeRO-1's point-to-point exchanges (private to optim/zero1*.cpp).
#pragma once
#include <vector>

#include "comm/comm.h"

namespace foundry {

// Message tags on the optimizer's own communicator. Between two ranks there is at most one
// message of each kind per step (a rank owns at most one split matrix and holds a piece of
// at most one other), so a tag per kind is enough to match them.
constexpr int kTagGradientPiece = 1;  // holder → owner: the clipped gradient of its piece
constexpr int kTagUpdatedPiece = 2;   // owner → holder: the updated parameters of the piece
constexpr int kTagStateGather = 3;    // rank r → rank 0: state for a checkpoint
constexpr int kTagStateLoad = 4;      // rank 0 → rank r: state from a checkpoint
constexpr int kTagSparseGather = 5;   // shard owner → rank r: the parameters r stores
constexpr int kTagReleasedGather = 6; // shard owner → root: root's released parameters

inline void append_requests(std::vector<Request>& to, std::vector<Request> more) {
  for (Request& r : more) to.push_back(std::move(r));
}

}  // namespace foundry
