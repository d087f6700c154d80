// Checkpoints across process layouts (ctest runs this under mpirun at 2, 3 and 4 ranks): a
// checkpoint saved under one layout, loaded under another and saved again there, then loaded
// and saved once more under the first, holds every tensor bit for bit as first saved. The
// layouts are the first k ranks of the world, k = 1, 2 and the whole world, with expert
// parallel 1 or 2, ZeRO-1 on or off, for both architectures and both optimizers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "comm/agree.h"
#include "comm/mpi_test_main.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "train/checkpointer.h"
#include "train/optimizer_config.h"
#include "train/test_support.h"
#include "train/trainer.h"

namespace foundry {

Communicator* g_world = nullptr;

namespace {

namespace fs = std::filesystem;

struct Layout {
  int ranks = 1, ep = 1;
  bool zero1 = true;
};

std::string describe(const Layout& l) {
  return fmt::format("{} ranks, EP {}, ZeRO-1 {}", l.ranks, l.ep, l.zero1 ? "on" : "off");
}

// A model, optimizer and checkpointer over the first `layout.ranks` ranks of the world, as
// the trainer builds them (data parallel, expert parallel groups, sharded expert storage).
struct Run {
  Run(RunConfig config, const Communicator& group, const Layout& layout, uint64_t seed)
      : rc(std::move(config)),
        procs(group.size() > 1 ? &group : nullptr, 0),
        model(rc.model, rc.train.precision),
        batches(nullptr, rc.train.batch_size, rc.train.seq_len, group.rank(), group.size(),
                rc.model.vocab_size, 3) {
    rc.train.zero1 = layout.zero1;
    rc.train.expert_parallel = layout.ep;
    if (group.size() > 1) model.set_data_parallel(&group);
    if (layout.ep > 1) {
      ep_groups.emplace(split_expert_parallel(group, layout.ep));
      model.set_expert_parallel(&ep_groups->expert);
    }
    optimizer = make_optimizer(model.table(), optimizer_options(rc.train),
                               group.size() > 1 ? &group : nullptr);
    if (ep_groups) optimizer->shard_expert_storage(model, layout.ep);
    model.init_weights(seed);
    checkpointer.emplace(rc, lr_schedule(rc.train), model, *optimizer, nullptr, procs, true);
  }
  void step(int64_t s) {
    batches.restart_after(s - 1);  // batch s at step s
    batches.next();
    run_step(model, *optimizer, batches, 1e-2, s, 1.0, false, procs.world(),
             [this] { checkpointer->protect_state(); });
  }

  RunConfig rc;
  Processes procs;
  Model model;
  std::optional<ExpertParallelGroups> ep_groups;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  TrainBatches batches;
  std::optional<Checkpointer> checkpointer;
};

// Every tensor of a checkpoint, read whole (rank 0 of the world only).
struct Contents {
  std::vector<float> params;
  std::vector<std::vector<float>> states;
};
Contents read_all(const RunConfig& rc, const std::string& dir) {
  const ParamTable table(rc.model);
  const int64_t n = table.total_elements();
  Contents c{std::vector<float>(n), {}};
  std::vector<SlabTarget> targets = {{"", 0, n, c.params.data()}};
  const std::vector<std::string> names =
      rc.train.optimizer == OptimizerKind::muon
          ? std::vector<std::string>{"exp_avg", "exp_avg_sq", "muon_momentum"}
          : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  c.states.assign(names.size(), std::vector<float>(n));
  // Each state only for the tensors its optimizer updates: read tensor by tensor.
  const json meta = read_sharded_metadata(dir);
  for (size_t s = 0; s < names.size(); ++s)
    for (const ParamInfo& p : table.params())
      if (meta["tensors"].contains(p.name + "." + names[s]))
        targets.push_back({names[s], p.offset, p.offset + p.numel, c.states[s].data() + p.offset});
  load_checkpoint_targets(dir, rc.model, table, targets);
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Saves under `a` after two steps, loads and saves under `b`, loads and saves under `a`.
void round_trip(const RunConfig& base, const Layout& a, const Layout& b) {
  Communicator& world = *g_world;
  // Rank 0's pid names the directory: the runs at 2, 3 and 4 ranks may run side by side.
  const std::string root = allgather_strings(
      world, (fs::temp_directory_path() / fmt::format("foundry_ckpt_layouts_{}", ::getpid()))
                 .string())[0];
  const std::string dirs[3] = {root + "/first", root + "/second", root + "/third"};
  if (world.rank() == 0) {
    fs::remove_all(root);
    for (const std::string& d : dirs) fs::create_directories(d);
  }
  world.barrier();
  auto under = [&](const Layout& l, const std::string& run_dir, bool resume) {
    Communicator group = world.split(world.rank() < l.ranks ? 0 : 1, world.rank());
    if (world.rank() < l.ranks) {
      RunConfig rc = base;
      rc.train.run_dir = run_dir;
      Run run(rc, group, l, resume ? 99 : 1);
      if (resume) {
        EXPECT_EQ(run.checkpointer->resume(), 2) << describe(l);
      } else {
        run.step(1);
        run.step(2);
      }
      run.checkpointer->save(2);
      run.checkpointer->finish();
    }
    world.barrier();
  };
  auto copy_checkpoint = [&](const std::string& from, const std::string& to) {
    if (world.rank() == 0)
      fs::copy(from + "/checkpoints", to + "/checkpoints", fs::copy_options::recursive);
    world.barrier();
  };
  under(a, dirs[0], false);
  copy_checkpoint(dirs[0], dirs[1]);
  under(b, dirs[1], true);
  copy_checkpoint(dirs[1], dirs[2]);
  under(a, dirs[2], true);
  if (world.rank() == 0) {
    const std::string step = "/checkpoints/" + checkpoint_dir_name(2);
    const Contents first = read_all(base, dirs[0] + step);
    for (int i = 1; i < 3; ++i) {
      const Contents again = read_all(base, dirs[i] + step);
      EXPECT_TRUE(same_bits(first.params, again.params))
          << describe(a) << " -> " << describe(b) << ": parameters differ after " << i;
      for (size_t s = 0; s < first.states.size(); ++s)
        EXPECT_TRUE(same_bits(first.states[s], again.states[s]))
            << describe(a) << " -> " << describe(b) << ": state " << s << " differs after " << i;
    }
    fs::remove_all(root);
  }
  world.barrier();
}

class LayoutRoundTrip : public ::testing::TestWithParam<std::tuple<bool, OptimizerKind>> {};

TEST_P(LayoutRoundTrip, EveryTensorBitExactAcrossLayouts) {
  const auto [zaya, optimizer] = GetParam();
  RunConfig rc = testing::tiny_run_config("", zaya);
  rc.train.optimizer = optimizer;
  rc.train.batch_size = 12;  // divides among 1, 2, 3 and 4 ranks
  const int w = g_world->size();
  // The world's layouts (expert parallel 2 needs an even rank count), paired so that each
  // is both the first and the second layout of some round trip.
  std::vector<Layout> layouts = {{1, 1, true}, {w, 1, true}, {w, 1, false}, {2, 2, true}};
  if (w % 2 == 0) layouts.push_back({w, 2, true});
  if (w % 2 == 0) layouts.push_back({w, 2, false});
  for (size_t i = 0; i < layouts.size(); ++i)
    round_trip(rc, layouts[i], layouts[(i + 1) % layouts.size()]);
}

INSTANTIATE_TEST_SUITE_P(
    ArchsAndOptimizers, LayoutRoundTrip,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(OptimizerKind::adamw, OptimizerKind::muon)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "Zaya1" : "Moe") +
             (std::get<1>(info.param) == OptimizerKind::muon ? "Muon" : "AdamW");
    });

}  // namespace
}  // namespace foundry

int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &foundry::g_world); }
