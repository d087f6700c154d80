// The optimizer of a training run, whatever the process layout: one interface, three
// implementations chosen once by make_optimizer.
//
//   single process   AdamW for every tensor, or Muon for the 2-D hidden matrices plus AdamW
//                    for the rest (they update disjoint tensors, so their order is irrelevant).
//   replicated       data parallel without sharding (train.zero1 = false): the gradients are
//                    all-reduced (optim/grad_reduce.h) and every rank runs the single-process
//                    step on the averaged gradient, so the replicas stay identical.
//   ZeRO-1           data parallel with the optimizer state sharded over the ranks
//                    (optim/zero1.h): reduce-scatter, a local step on the shard, all-gather.
//
// Every implementation clips the global gradient norm before updating, and lets the caller
// veto the update once that norm is known (the trainer's anomaly checks, train/anomaly.h). For
// checkpoints each names the runs of state it keeps, in the single-process optimizers' slab
// coordinates and state names, so a checkpoint written under one layout loads under any other.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/slab_range.h"
#include "base/timer.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_reduce.h"
#include "optim/muon.h"

namespace foundry {

class Backend;
class Communicator;
class Model;

// A run of optimizer state slab `state` this rank keeps: slab elements [begin, end), values
// at data[0 .. end − begin).
struct StateRun {
  std::string state;
  int64_t begin = 0, end = 0;
  float* data = nullptr;
  bool on_device = false;  // data is in the model backend's memory, not the host's
};

struct OptimizerOptions {
  AdamWOptions adamw;               // with Muon, `applies` excludes what Muon updates
  std::optional<MuonOptions> muon;  // set: Muon for the 2-D hidden matrices (muon_applies)
  bool zero1 = true;                // data parallel: shard the state (false: replicate it)
  int64_t bucket_elements = GradientReducerOptions{}.bucket_elements;  // reduction bucket
};

class DataParallelOptimizer {
 public:
  virtual ~DataParallelOptimizer() = default;

  // Overlap: arms the gradient reduction before backward; the model's hook then reports
  // finished gradients (Model::set_gradients_final_hook). No-ops in one process.
  virtual void begin_backward(float* grads) = 0;
  virtual void gradients_final(int64_t offset) = 0;

  // Clips the global gradient to `max_norm` (0 = off) and updates `params` (the full slab,
  // identical on every rank before and after); returns the norm before clipping. `veto`,
  // when set, sees that norm before anything changes and may drop the update (optim/clip.h);
  // a non-finite norm drops it too. A dropped update leaves every parameter and state
  // unchanged, so the next step() is as if this one had not been called (the step number
  // is the caller's). `grads` is this rank's gradient of its local mean loss (scratch: it
  // may be clipped in place). Collective under data parallelism.
  virtual double step(float* params, float* grads, double lr, int64_t step, double max_norm,
                      const UpdateVeto& veto = {}) = 0;
  // The last step's gradient reduction; null in one process.
  virtual const GradientReduceStats* last_reduce() const = 0;

  // Asks step() to write the bf16 GEMM copy of every weight it updates into `mirror` (a
  // slab laid out like the parameters; null: stop), in the update's own pass. Returns false
  // when this layout cannot: the caller then refreshes the copy after each step
  // (Model::sync_weights).
  virtual bool write_bf16_weights(bf16* mirror) {
    (void)mirror;
    return false;
  }

  // Optimizer memory of this rank (bytes): the state it keeps and its buffers.
  virtual int64_t state_bytes() const = 0;

  // ---- sharded checkpoints (format 2): each rank saves and loads its own part in place ----
  // The parameter slab range this rank saves; the ranks' ranges tile the slab.
  virtual SlabRange parameters_to_save() const = 0;
  // The runs of the state slabs this rank saves: over the ranks, every element the
  // optimizer keeps, once. Pointers into the optimizer's own buffers.
  virtual std::vector<StateRun> states_to_save_runs() = 0;
  // The runs this rank fills when it loads (every element it keeps in this layout).
  virtual std::vector<StateRun> states_to_load_runs() = 0;
  // The runs of states_to_save_runs() where the state lives, copied nowhere first: for an
  // optimizer whose state is in device memory, device pointers (on_device), which a
  // checkpoint copies out beside the next step's forward and backward.
  virtual std::vector<StateRun> live_state_runs() { return states_to_save_runs(); }

  // Under ZeRO-1 with expert parallelism (`ep_size` > 1): `model` stops storing the other EP
  // ranks' experts outside this rank's shard, and the reductions skip them
  // (Model::shard_expert_storage). A no-op for the layouts that update every parameter on
  // every rank.
  virtual void shard_expert_storage(Model& model, int ep_size) = 0;
  // "muon (12 tensors, 1.20M params) + adamw (rest: 9 tensors, 40.5k params)" or
  // "adamw (all 21 tensors, 1.24M params)", with the layout (", ZeRO-1 over N ranks").
  virtual std::string describe() const = 0;
  virtual const char* layout_name() const = 0;  // "single process" | "replicated" | "ZeRO-1"

  // Times the step's phases into `times` (null: not timed): "optimizer" for the local
  // update, "comm: …" for the communication.
  virtual void set_op_times(OpTimes* times) = 0;

  // Gives up the collectives in flight (an NCCL group is aborted, not waited for): for a run
  // unwinding from an error, before anything waits for the device. A no-op where the layout
  // has no such group.
  virtual void abort_collectives() {}
};

// "muon (12 tensors, 1.20M params) + adamw (rest: 9 tensors, 40.5k params)" or
// "adamw (all 21 tensors, 1.24M params)": which optimizer updates what.
std::string describe_optimizer_split(const ParamTable& table, bool muon_on);

// The optimizer for `world` (null or one rank: single process; otherwise data parallel over
// its ranks, ZeRO-1 or replicated as options.zero1 says). Collective over `world`.
std::unique_ptr<DataParallelOptimizer> make_optimizer(const ParamTable& table,
                                                      const OptimizerOptions& options,
                                                      const Communicator* world);

}  // namespace foundry
