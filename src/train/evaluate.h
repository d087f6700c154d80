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

// The whole batches the validation split holds: windows / batch size (the loader's last,
// partial batch would wrap around to the split's first windows and count them twice).
int64_t whole_validation_batches(const data::BatchLoader& loader);

// The validation batches to evaluate: `requested`, or the whole batches the split holds when
// it holds fewer (more would repeat windows and weigh them twice). A count the user gave on
// the command line (`flag`, e.g. "--batches") beyond the split is an error naming the flag; one
// from the config (train.eval_batches) is cut to the split with a warning. A split without one
// whole batch is an error.
int64_t validation_batches(const data::BatchLoader& loader, int64_t requested,
                           const char* flag = nullptr);

// Mean cross-entropy of `model` over the first `batches` validation batches of `loader`
// (rewound first; its batch is the global batch). Under data parallelism (`world` with
// several ranks) each rank evaluates its slice of every batch and the result is the mean
// over ranks: collective over `world`, and the same on every rank. `micro_rows` (> 0, dividing
// a rank's rows) forwards them that many at a time (train.micro_batch_size: the activations of
// one micro-batch in memory, as in training).
double evaluate_loss(Model& model, data::BatchLoader& loader, int64_t batches,
                     const Communicator* world = nullptr, int64_t micro_rows = 0);

}  // namespace foundry
