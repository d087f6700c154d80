// Validation loss: one function for the trainer and `foundry eval`.
#pragma once
#include <cstdint>

#include "data/loader.h"

namespace foundry {

class Communicator;
class Model;

// The mean of `local` over the ranks of `world` (null: `local` itself). With equal token
// counts per rank, the mean over the global batch.
double mean_over_ranks(const Communicator* world, double local);

// Mean cross-entropy of `model` over the first `batches` validation batches of `loader`
// (rewound first; its batch is the global batch). Under data parallelism (`world` with
// several ranks) each rank evaluates its slice of every batch and the result is the mean
// over ranks: collective over `world`, and the same on every rank.
double evaluate_loss(Model& model, data::BatchLoader& loader, int64_t batches,
                     const Communicator* world = nullptr);

}  // namespace foundry
