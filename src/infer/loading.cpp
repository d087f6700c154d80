#include "infer/loading.h"

#include <fmt/format.h>

#include <vector>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/memory_budget.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/inspect.h"
#include "ckpt/model_state.h"
#include "train/checkpointer.h"

namespace foundry::infer {

std::string resolve_checkpoint(const std::string& explicit_dir, const RunConfig& rc) {
  if (!explicit_dir.empty()) {
    checkpoint_format_version(explicit_dir);  // a directory of something else says so first
    verify_checkpoint(explicit_dir);
    return explicit_dir;
  }
  auto latest = find_latest_checkpoint(rc.train.run_dir);
  if (!latest)
    fail(fmt::format("no valid checkpoint in '{}/checkpoints'", rc.train.run_dir),
         "train first, or pass --checkpoint DIR");
  return *latest;
}

std::unique_ptr<Model> load_model(const RunConfig& rc, const std::string& ckpt_dir,
                                  DType precision, Backend& backend) {
  auto model = std::make_unique<Model>(rc.model, precision, backend, ModelUse::inference);
  std::vector<float> staged;
  if (model->on_device()) {  // read into host memory first: its room is checked here
    const int64_t bytes = model->slab_size() * static_cast<int64_t>(sizeof(float));
    check_memory({"loading the checkpoint", {{"weights staged in host memory", bytes}}},
                 memory_budget(), "load on a machine with more host memory");
    staged.resize(static_cast<size_t>(model->slab_size()));
  }
  float* params = model->on_device() ? staged.data() : model->params();
  const json trainer_state = load_checkpoint(ckpt_dir, rc.model, model->table(), params, {});
  check_finite_weights(ckpt_dir, model->table(), params);
  restore_router_balancers(*model, trainer_state, ckpt_dir, /*required=*/false);
  if (model->on_device())
    model->write_params(staged.data());  // and its bf16 copy
  else
    model->sync_weights();
  return model;
}

data::Tokenizer load_tokenizer(const RunConfig& rc, const std::string& explicit_path,
                               std::string* path) {
  if (explicit_path.empty() && rc.data.dir.empty())
    fail("data.dir is empty and no --tokenizer is given: generation needs a tokenizer",
         "pass --tokenizer FILE, or set data.dir to the dataset the model was trained on");
  const std::string file = explicit_path.empty() ? rc.data.dir + "/tokenizer.model" : explicit_path;
  data::Tokenizer tok = data::Tokenizer::load(file);
  if (tok.vocab_size() != rc.model.vocab_size)
    fail(fmt::format("tokenizer '{}' has {} pieces but model.vocab_size = {}", file,
                     tok.vocab_size(), rc.model.vocab_size),
         "pass the tokenizer of the dataset the model was trained on");
  if (path) *path = file;
  return tok;
}

void check_tokenizer_of(const std::string& ckpt_dir, const std::string& tokenizer_path) {
  const std::string bytes = read_text_file(tokenizer_path);
  const json state = read_checkpoint_trainer_state(ckpt_dir);
  const std::string source = fmt::format("tokenizer '{}'", tokenizer_path);
  check_checkpoint_tokenizer(ckpt_dir, state, hash64(bytes.data(), bytes.size()), source);
  warn_if_synthetic(ckpt_dir, state, source);
}

}  // namespace foundry::infer
