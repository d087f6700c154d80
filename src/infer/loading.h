// A trained model, ready to use: the checkpoint to read, its weights on a backend (with the
// router balancers it was trained with), and the tokenizer it was trained with, each checked
// against the others.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "model/model.h"
#include "train/run_config.h"

namespace foundry::infer {

// An explicit checkpoint directory (verified), or the latest valid one of the run.
std::string resolve_checkpoint(const std::string& explicit_dir, const RunConfig& rc);

// The weights of a checkpoint, which must be finite, and, for arch zaya1, the router
// balancing biases from trainer_state.json, so that tokens are routed as they were in
// training, in a model built for inference (no gradients). On a device (a GPU backend) the
// weights are read into host memory (checked against the host's budget) and copied in.
std::unique_ptr<Model> load_model(const RunConfig& rc, const std::string& ckpt_dir,
                                  DType precision, Backend& backend = cpu_backend());

// The tokenizer to generate with: `explicit_path`, or data.dir/tokenizer.model. Fails unless
// its vocabulary is model.vocab_size. `path` (if set) receives the file it read.
data::Tokenizer load_tokenizer(const RunConfig& rc, const std::string& explicit_path,
                               std::string* path = nullptr);
// Fails unless the tokenizer file at `tokenizer_path` is the one checkpoint `ckpt_dir` was
// trained with (its recorded checksum).
void check_tokenizer_of(const std::string& ckpt_dir, const std::string& tokenizer_path);

}  // namespace foundry::infer
