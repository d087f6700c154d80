#include "train/checkpointer.h"

#include <algorithm>
#include <cstdio>

#include "base/error.h"
#include "base/timer.h"
#include "ckpt/model_state.h"
#include "model/model.h"

namespace foundry {

void check_same_optimizer(const std::string& dir, const json& saved_state,
                          OptimizerKind configured) {
  std::string saved = "adamw";
  if (auto it = saved_state.find("optimizer"); it != saved_state.end()) {
    if (!it->is_string())
      fail(fmt::format("{}/trainer_state.json: \"optimizer\" is not a string", dir),
           "the checkpoint is corrupt; resume from another one or start a new run directory");
    saved = it->get<std::string>();
  }
  const std::string wanted = optimizer_name(configured);
  if (parse_optimizer(saved) != configured)
    fail(fmt::format("{} was written with train.optimizer = \"{}\", but the config says "
                     "train.optimizer = \"{}\"; the optimizer state of one cannot continue "
                     "the other",
                     dir, saved, wanted),
         fmt::format("resume with --set train.optimizer={}, or train with {} in a new run "
                     "directory (train.run_dir)",
                     saved, wanted));
}

Checkpointer::Checkpointer(const RunConfig& rc, const LrSchedule& schedule, Model& model,
                           DataParallelOptimizer& optimizer, data::BatchLoader* train_loader,
                           Processes& processes, bool quiet)
    : rc_(rc),
      schedule_(schedule),
      model_(model),
      optimizer_(optimizer),
      train_loader_(train_loader),
      processes_(processes),
      quiet_(quiet) {}

int64_t Checkpointer::resume() {
  const std::string& run_dir = rc_.train.run_dir;
  auto latest = find_latest_checkpoint(run_dir);
  if (!latest) {
    std::fprintf(stderr, "resume: no valid checkpoint in %s/checkpoints, starting fresh\n",
                 run_dir.c_str());
    return 0;
  }
  // Before loading anything: a checkpoint of the other optimizer lacks (or has extra) state
  // slabs, and the plain message says more than a missing tensor would.
  check_same_optimizer(*latest, read_checkpoint_trainer_state(*latest), rc_.train.optimizer);
  auto g = processes_.guard("loading " + *latest);
  std::vector<StateSlabToLoad> states;
  for (const OptimizerStateSlab& s : optimizer_.states_to_load()) states.push_back({s.name, s.data});
  json state = load_checkpoint(*latest, rc_.model, model_.table(), model_.params(), states);
  optimizer_.finish_load();
  model_.release_again();  // the checkpoint filled every parameter
  const int64_t step = state.at("step").get<int64_t>();
  if (train_loader_) train_loader_->restore(state.at("data_cursor"));
  restore_router_balancers(model_, state, *latest, /*required=*/true);
  model_.sync_weights();
  if (processes_.root())
    std::fprintf(stderr, "resumed from %s (step %lld)\n", latest->c_str(),
                 static_cast<long long>(step));
  return step;
}

// Everything random in training derives from the seed and the step (initialization,
// synthetic batches) or lives in the data cursor, so this state fully determines the future.
json Checkpointer::trainer_state(int64_t step) const {
  const TrainConfig& tc = rc_.train;
  json state = {{"step", step},
                {"format", "foundry-trainer-state"},
                {"seed", tc.seed},
                {"optimizer", optimizer_name(tc.optimizer)},
                {"config", rc_.source}};
  if (train_loader_) state["data_cursor"] = train_loader_->cursor();
  // The balancers are model state outside the parameter slab: saved here in full (bias and
  // its AdamW state, for a bitwise resume) and, as biases only, in model.safetensors.
  if (!model_.balancers().empty()) state["router_balancers"] = model_.balancer_state();
  state["schedule"] = {{"lr", learning_rate(schedule_, std::max<int64_t>(step, 1))},
                       {"total_steps", schedule_.total_steps}};
  return state;
}

void Checkpointer::save(int64_t step) {
  const json state = trainer_state(step);
  const double t0 = now_seconds();
  auto g = processes_.guard(fmt::format("checkpoint of step {}", step));
  std::vector<StateSlabToSave> states;
  for (const OptimizerStateSlab& s : optimizer_.states_to_save())  // collective
    states.push_back({s.name, s.data});
  optimizer_.gather_parameters_to_root(model_.params());  // collective
  if (processes_.root()) {
    const std::string path =
        save_checkpoint(rc_.train.run_dir, step, rc_.model, model_.table(), model_.params(),
                        states, state, rc_.train.keep_checkpoints, balancing_bias_tensors(model_));
    model_.release_again();
    if (!quiet_)
      std::fprintf(stderr, "saved checkpoint %s (%.2f s)\n", path.c_str(), now_seconds() - t0);
  }
  // Nobody goes on (or exits) before the checkpoint is committed.
  processes_.barrier();
}

}  // namespace foundry
