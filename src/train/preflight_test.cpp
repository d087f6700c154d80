#include "train/preflight.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>

#include "base/slab_chunks.h"
#include "base/test_expect_error.h"
#include "cuda/nccl.h"
#include "model/info.h"
#include "model/params.h"
#include "optim/device_optimizer.h"
#include "train/processes.h"
#include "train/test_support.h"

namespace foundry {
namespace {

std::map<std::string, int64_t> parts_of(const MemoryNeed& need) {
  return {need.parts.begin(), need.parts.end()};
}

RunConfig wide_run_config() {
  RunConfig rc = testing::tiny_run_config("unused");
  rc.model.n_experts = 8;
  rc.train.batch_size = 64;
  return rc;
}

TEST(TrainingMemory, ShardingOverRanksShrinksWhatEachRankNeeds) {
  RunConfig rc = wide_run_config();
  const auto one = parts_of(training_memory_need(rc, 64, 1));
  const auto four = parts_of(training_memory_need(rc, 64, 4));
  EXPECT_EQ(four.at("weights"), one.at("weights"));
  EXPECT_LT(four.at("optimizer"), one.at("optimizer") / 2);  // ZeRO-1: a quarter, plus a shard
  EXPECT_LT(four.at("checkpoint snapshot"), one.at("checkpoint snapshot") / 2);
  EXPECT_LT(four.at("activations"), one.at("activations") / 2);  // 16 sequences, not 64
  rc.train.expert_parallel = 4;
  const auto ep = parts_of(training_memory_need(rc, 64, 4));
  EXPECT_LT(ep.at("weights"), four.at("weights"));
  EXPECT_LT(ep.at("gradients"), four.at("gradients"));
  rc.train.zero1 = false;
  rc.train.checkpoint_async = false;
  const auto replicated = parts_of(training_memory_need(rc, 64, 4));
  EXPECT_EQ(replicated.at("optimizer"), one.at("optimizer"));
  EXPECT_EQ(replicated.count("checkpoint snapshot"), 0u);
  // The margin: 128 MiB and a tenth of the rest.
  const MemoryNeed need = training_memory_need(rc, 64, 1);
  const int64_t counted = need.per_process() - need.parts.back().second;
  EXPECT_EQ(need.parts.back().first, "margin");
  EXPECT_EQ(need.parts.back().second, (int64_t{128} << 20) + counted / 10);
}

TEST(TrainingMemory, ARefusalNamesTheLargestBatchThatFits) {
  const RunConfig rc = wide_run_config();
  const Processes one(nullptr, 0);
  const int64_t at_40 = training_memory_need(rc, 40, 1).per_process();
  EXPECT_NO_THROW(check_training_memory(
      rc, one, {BudgetSource::cgroup_v2, training_memory_need(rc, 64, 1).total()}));
  try {
    check_training_memory(rc, one, {BudgetSource::cgroup_v2, at_40});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(
        std::regex_search(std::string(e.what()),
                          std::regex("^training needs about [0-9.]+ MiB per process \\(weights .*, "
                                     "margin [0-9.]+ MiB\\), but this process may use "
                                     "[0-9.]+ MiB \\(cgroup memory.max\\)$")))
        << e.what();
    // The largest micro-batch dividing the batch that fits comes first: the batch stays.
    EXPECT_TRUE(
        e.hint().starts_with("set train.micro_batch_size = 32 (--set "
                             "train.micro_batch_size=32)"))
        << e.hint();
  }
  // Micro-batches as small as they go: then a smaller batch.
  RunConfig micro = rc;
  micro.train.micro_batch_size = 1;
  try {
    check_training_memory(micro, one, {BudgetSource::cgroup_v2, 1});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.hint().starts_with("even train.batch_size = 1 does not fit")) << e.hint();
  }
  EXPECT_LT(training_memory_need(micro, 64, 1).per_process(),
            training_memory_need(rc, 64, 1).per_process());  // one sequence's activations
  expect_error([&] { check_training_memory(rc, one, {BudgetSource::meminfo, 1 << 20}); },
               "training needs about");
}

// With Muon a GPU's state slabs hold whole chunks (device_allocate_slab): AdamW's two keep
// every chunk holding an element of a tensor AdamW updates (a norm or the router between two
// Muon matrices takes a whole one), Muon's every chunk of its matrices, and a slab with freed
// chunks one alias chunk for them. Counted here chunk by chunk.
TEST(TrainingMemory, OnAGpuMuonsStateIsCountedInWholeChunks) {
  RunConfig rc = wide_run_config();
  rc.model.ffn_dim = 16384;  // an expert: 3 × 16 × 16384 floats, 3 MiB; 8 a layer
  rc.train.precision = DType::bf16;
  rc.train.optimizer = OptimizerKind::muon;
  const ParamTable table(rc.model);
  const int64_t bytes = 4 * table.total_elements();
  const int64_t chunk = slab_chunk_bytes(bytes, int64_t{2} << 20);
  auto slab = [&](bool of_muon) {
    const int64_t whole = bytes / chunk;  // the chunks wholly inside the slab
    std::vector<bool> holds(whole + 1, false);
    for (const ParamInfo& p : table.params())
      if (is_muon_matrix(p) == of_muon)
        for (int64_t c = 4 * p.offset / chunk; c <= (4 * (p.offset + p.numel) - 1) / chunk; ++c)
          holds[c] = true;
    int64_t freed = 0;
    for (int64_t c = 0; c < whole; ++c) freed += holds[c] ? 0 : 1;
    return bytes - freed * chunk + (freed > 0 ? chunk : 0);
  };
  const int64_t muon = parts_of(gpu_training_memory_need(rc, 64, 1)).at("optimizer");
  EXPECT_EQ(muon, 2 * slab(false) + slab(true));
  // More than the exact elements (model info's count), less than AdamW's two moments of all.
  EXPECT_GT(muon,
            estimate_memory(rc.model, 64, rc.train.seq_len, DType::bf16, true).optimizer_bytes);
  rc.train.optimizer = OptimizerKind::adamw;
  EXPECT_LT(muon, parts_of(gpu_training_memory_need(rc, 64, 1)).at("optimizer"));
  // ZeRO-1 over 4 ranks: a quarter, and more (a range's slabs are whole chunks too, and the
  // ranges move to whole Muon matrices).
  rc.train.optimizer = OptimizerKind::muon;
  rc.train.zero1 = true;
  const int64_t quarter = parts_of(gpu_training_memory_need(rc, 64, 4)).at("optimizer");
  EXPECT_GE(quarter, muon / 4 - 3 * chunk);
  EXPECT_LT(quarter, muon / 2);
}

// Expert parallel with ZeRO-1 on GPUs: a rank keeps its own experts and its state range, and
// the slabs' whole chunks inside the other ranks' experts go back (2 MiB chunks here).
TEST(TrainingMemory, OnGpusExpertParallelismKeepsTheRanksOwnExpertsInWholeChunks) {
  RunConfig rc = wide_run_config();
  rc.model.ffn_dim = 16384;  // an expert: 3 × 16 × 16384 floats, 3 MiB; 8 a layer
  rc.train.precision = DType::bf16;
  rc.train.zero1 = true;
  const auto dp = parts_of(gpu_training_memory_need(rc, 64, 2));
  rc.train.expert_parallel = 2;
  const auto ep = parts_of(gpu_training_memory_need(rc, 64, 2));
  const ParamTable table(rc.model);
  int64_t expert_elements = 0;
  for (const ParamInfo& p : table.params())
    if (p.kind == ParamKind::expert) expert_elements += p.numel;
  // Half the experts are another rank's: all but a few chunks of them go back, less the part
  // of the state range (half the slab) that falls on them.
  EXPECT_LT(ep.at("gradients"), dp.at("gradients") - 4 * expert_elements / 8);
  EXPECT_GT(ep.at("gradients"), dp.at("gradients") - 4 * expert_elements / 2);
  EXPECT_LT(ep.at("weights"), dp.at("weights") - 6 * expert_elements / 8);
  EXPECT_EQ(ep.at("optimizer"), dp.at("optimizer"));
  // Exactly: the rank keeping the most, its slabs less their holes' whole chunks, plus one
  // alias chunk for each slab with holes.
  const int64_t n = table.total_elements(), mib = int64_t{1} << 20;
  int64_t most = 0;
  for (int r = 0; r < 2; ++r) {
    const SlabHoles h = device_expert_holes(table, rc.model.n_experts, 2, 2, r, false, true);
    auto kept = [&](const SlabRanges& holes, int64_t element) {
      const int64_t in_holes =
          slab_bytes_in_holes(to_byte_ranges(holes, element), n * element, 2 * mib);
      return n * element - in_holes + (in_holes > 0 ? slab_chunk_bytes(n * element, 2 * mib) : 0);
    };
    most = std::max(most, 2 * kept(h.params, 4) + kept(h.bf16, 2));
  }
  EXPECT_EQ(ep.at("weights") + ep.at("gradients"), most);
  // A slab's chunks: 2 MiB, or more to keep to 512 of them; the holes free whole chunks.
  EXPECT_EQ(slab_chunk_bytes(mib, 2 * mib), 2 * mib);
  EXPECT_EQ(slab_chunk_bytes(int64_t{7} << 30, 2 * mib), 14 * mib);
  EXPECT_EQ(slab_bytes_in_holes({{mib, 9 * mib}, {10 * mib, 11 * mib}}, 64 * mib, 2 * mib),
            6 * mib);  // the chunks at 2, 4 and 6 MiB inside the first; none inside the second
}

// A GPU run's need is model info's estimate (the figures `model info` prints for the same
// run) and a margin; the refusal names the GPU, the ranks sharing it and the batch that fits.
TEST(TrainingMemory, OnAGpuIsModelInfosEstimateAndNamesTheGpuAndTheBatchThatFits) {
  RunConfig rc = wide_run_config();
  rc.train.precision = DType::bf16;
  const MemoryNeed need = gpu_training_memory_need(rc, 64, 1);
  const MemoryEstimate m = estimate_memory(rc.model, 64, rc.train.seq_len, DType::bf16);
  const int64_t counted = need.per_process() - need.parts.back().second;
  EXPECT_EQ(counted, m.total_bytes);
  EXPECT_EQ(need.parts.back().first, "margin");
  EXPECT_EQ(need.parts.back().second, (int64_t{256} << 20) + int64_t(0.02 * double(counted)));
  // Two ranks: each half the batch.
  EXPECT_LT(parts_of(gpu_training_memory_need(rc, 64, 2)).at("activations"),
            parts_of(need).at("activations"));
  // ZeRO-1 over 4 ranks keeps a quarter of the state (up to a Muon matrix moved to a range's
  // end); replicated, all of it.
  const int64_t whole_state = parts_of(need).at("optimizer");
  rc.train.zero1 = true;
  const int64_t quarter = parts_of(gpu_training_memory_need(rc, 64, 4)).at("optimizer");
  EXPECT_GE(quarter, whole_state / 4);
  EXPECT_LT(quarter, whole_state / 3);
  rc.train.zero1 = false;
  EXPECT_EQ(parts_of(gpu_training_memory_need(rc, 64, 4)).at("optimizer"), whole_state);
  rc.train.zero1 = true;
  // Over NCCL its buffers come on top: NCCL_BUFFSIZE × 2 × 32 channels.
  EXPECT_EQ(parts_of(gpu_training_memory_need(rc, 64, 2)).count("NCCL buffers"), 0u);
  EXPECT_EQ(parts_of(gpu_training_memory_need(rc, 64, 2, 12345)).at("NCCL buffers"), 12345);
  // One set per NCCL group: with expert and context parallelism, three groups.
  rc.train.expert_parallel = 2;
  rc.train.context_parallel = 2;
  EXPECT_EQ(parts_of(gpu_training_memory_need(rc, 64, 4, 12345)).at("NCCL buffers"), 3 * 12345);
  rc.train.expert_parallel = 1;
  rc.train.context_parallel = 1;
  EXPECT_EQ(gpu::nccl_buffer_bytes(nullptr), int64_t{256} << 20);
  EXPECT_EQ(gpu::nccl_buffer_bytes("1048576"), int64_t{64} << 20);
  EXPECT_EQ(gpu::nccl_buffer_bytes("lots"), int64_t{256} << 20);  // unreadable: NCCL's default
  // Context parallelism's exchange buffers are the estimate's (a backward-buffers item, as on
  // the CPU), not a part of their own: with 4 ranks in 2 groups of 2, 64 / 2 sequences a rank.
  rc.train.context_parallel = 2;
  const MemoryEstimate cp = estimate_memory(rc.model, 64 / 2, rc.train.seq_len, DType::bf16,
                                            false, 2);
  const auto cp_parts = parts_of(gpu_training_memory_need(rc, 64, 4));
  EXPECT_EQ(cp_parts.count("context-parallel exchanges"), 0u);
  EXPECT_EQ(cp_parts.at("activations"), cp.activations_bytes + cp.backward_buffers_bytes);
  rc.train.context_parallel = 1;

  const int64_t at_40 = gpu_training_memory_need(rc, 40, 1).per_process();
  EXPECT_EQ(gpu_memory_shortfall(need, {need.per_process(), "GPU"}), "");
  EXPECT_NE(gpu_memory_shortfall(need, {need.per_process() - 1, "GPU"}), "");
  const Processes one(nullptr, 0);
  EXPECT_NO_THROW(check_gpu_training_memory(rc, one, {need.per_process(), "a GPU"}, nullptr));
  try {
    check_gpu_training_memory(rc, one, {at_40, "NVIDIA H200 (cuda:0)"}, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(std::regex_search(
        std::string(e.what()),
        std::regex("^training needs about [0-9.]+ [MG]iB of GPU memory per rank \\(weights .*, "
                   "margin [0-9.]+ [MG]iB\\), but NVIDIA H200 \\(cuda:0\\) has [0-9.]+ [MG]iB free$")))
        << e.what();
    EXPECT_TRUE(
        e.hint().starts_with("set train.micro_batch_size = 32 (--set "
                             "train.micro_batch_size=32)"))
        << e.hint();
  }
  // Ranks sharing the GPU share its free memory.
  EXPECT_NE(gpu_memory_shortfall(need, {2 * need.per_process(), "a GPU", {}, 3})
                .find("× 3 ranks on one GPU, but a GPU has"),
            std::string::npos);
  EXPECT_EQ(gpu_memory_shortfall(need, {3 * need.per_process(), "a GPU", {}, 3}), "");
  expect_error([&] { check_gpu_training_memory(rc, one, {1 << 20, "a GPU"}, nullptr); },
               "of GPU memory per rank");
  EXPECT_NO_THROW(check_gpu_training_memory(rc, one, {1 << 20, "a GPU"}, "off"));
}

// The host side of a GPU run: the snapshot and the in-memory tier as on the CPU, the gradients'
// staging only where several ranks reduce through host memory (with ZeRO-1's share of the
// sums), the exchanges' rows under expert and context parallelism; a host that cannot hold it
// is refused with the parts and what to change, unless the checks are off.
TEST(TrainingMemory, OnAGpuTheHostsShareIsCheckedToo) {
  RunConfig rc = wide_run_config();
  rc.train.zero1 = false;
  const int64_t slab = 4 * ParamTable(rc.model).total_elements();
  const auto staged = parts_of(gpu_host_memory_need(rc, 2, true));
  EXPECT_EQ(staged.at("gradients through host memory"), slab);
  EXPECT_EQ(staged.at("checkpoint snapshot"), rank_checkpoint_bytes(rc, 2));
  EXPECT_EQ(staged.count("in-memory checkpoints"), 0u);
  EXPECT_EQ(staged.count("context-parallel exchanges"), 0u);
  EXPECT_EQ(staged.count("expert-parallel exchanges"), 0u);
  EXPECT_EQ(parts_of(gpu_host_memory_need(rc, 2, false)).count("gradients through host memory"),
            0u);
  EXPECT_EQ(parts_of(gpu_host_memory_need(rc, 1, true)).count("gradients through host memory"), 0u);
  rc.train.zero1 = true;
  const int64_t zero1 =
      parts_of(gpu_host_memory_need(rc, 2, true)).at("gradients through host memory");
  EXPECT_GT(zero1, slab);
  EXPECT_LT(zero1, slab + slab / 2 + slab / 8);
  rc.train.checkpoint_async = false;
  rc.train.memory_checkpoint_every = 5;
  rc.train.context_parallel = 2;
  rc.train.expert_parallel = 2;
  const auto all = parts_of(gpu_host_memory_need(rc, 4, true));
  EXPECT_EQ(all.count("checkpoint snapshot"), 0u);
  EXPECT_EQ(all.at("in-memory checkpoints"), 2 * rank_checkpoint_bytes(rc, 4));
  // Each of k and v of each slot stages this rank's rows of a slot and the group's (1 + C
  // times them): 4 ranks in 2 groups of 2, each rank a quarter of each of its group's sequences
  // in a slot.
  EXPECT_EQ(all.at("context-parallel exchanges"), 4 * 4 * (1 + 2) * (rc.train.batch_size / 2) *
                                                      (rc.train.seq_len / 4) * rc.model.kv_dim());
  EXPECT_GT(all.at("expert-parallel exchanges"), 0);
  const auto over_nccl = parts_of(gpu_host_memory_need(rc, 4, false));
  EXPECT_EQ(over_nccl.count("expert-parallel exchanges"), 0u);
  EXPECT_EQ(over_nccl.count("context-parallel exchanges"), 0u);
  EXPECT_EQ(gpu_host_memory_need(rc, 4, true).parts.back().first, "margin");

  rc = wide_run_config();
  const Processes one(nullptr, 0);
  const GpuMemory roomy{int64_t{1} << 40, "a GPU"};
  const MemoryBudget small{BudgetSource::environment, int64_t{64} << 20};
  expect_error([&] { check_gpu_training_memory(rc, one, roomy, nullptr, small); },
               "training (host memory beside the GPU) needs about");
  const MemoryBudget enough{BudgetSource::environment,
                            gpu_host_memory_need(rc, 1, true).per_process()};
  EXPECT_NO_THROW(check_gpu_training_memory(rc, one, roomy, nullptr, enough));
  EXPECT_NO_THROW(check_gpu_training_memory(rc, one, roomy, "off", small));
}

TEST(InferenceMemory, EvalAndGenerateNameWhatToLower) {
  const RunConfig rc = wide_run_config();
  EXPECT_NO_THROW(check_eval_memory(rc, {BudgetSource::off, 0}));
  EXPECT_NO_THROW(check_generate_memory(rc, 16, {BudgetSource::meminfo, int64_t{1} << 30}));
  try {
    check_eval_memory(rc, {BudgetSource::meminfo, 1 << 20});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("eval needs about")) << e.what();
    EXPECT_TRUE(e.hint().starts_with("even one sequence does not fit")) << e.hint();
  }
  try {
    check_generate_memory(rc, 16, {BudgetSource::meminfo, 1 << 20});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("generate needs about")) << e.what();
    EXPECT_TRUE(e.hint().starts_with("the weights with the runtime's margin do not fit"))
        << e.hint();
  }
}

// eval forwards a batch in train.micro_batch_size pieces: one that does not divide the batch
// is refused; a batch that does not fit is told the largest micro-batch that does.
TEST(InferenceMemory, EvalCountsAndSuggestsMicroBatches) {
  RunConfig rc = wide_run_config();  // batch 64
  rc.train.micro_batch_size = 48;
  EXPECT_THROW(eval_micro_batch_rows(rc), Error);
  rc.train.micro_batch_size = 4;
  EXPECT_EQ(eval_micro_batch_rows(rc), 4);
  // The smallest budget (in steps of 1 MiB) that fits micro-batches of 4.
  int64_t bytes = int64_t{1} << 20;
  for (;; bytes += int64_t{1} << 20) {
    try {
      check_eval_memory(rc, {BudgetSource::meminfo, bytes});
      break;
    } catch (const Error&) {
    }
  }
  rc.train.micro_batch_size = 0;  // the whole batch of 64 needs more
  try {
    check_eval_memory(rc, {BudgetSource::meminfo, bytes});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string hint = e.hint();
    ASSERT_TRUE(hint.starts_with("set train.micro_batch_size = ")) << hint;
    const int64_t m = std::stoll(hint.substr(std::string("set train.micro_batch_size = ").size()));
    EXPECT_GE(m, 4);
    EXPECT_LT(m, 64);
    EXPECT_EQ(64 % m, 0);
    rc.train.micro_batch_size = m;
    EXPECT_NO_THROW(check_eval_memory(rc, {BudgetSource::meminfo, bytes}));
  }
}

// A --kv-memory that the weights leave no room for is warned about; one that fits, or no
// budget, is not.
TEST(InferenceMemory, AKvBudgetBeyondTheMemoryBudgetIsWarnedAbout) {
  const RunConfig rc = wide_run_config();
  const MemoryBudget budget{BudgetSource::environment, int64_t{1} << 30};
  for (const auto& [kv, warned] :
       {std::pair{int64_t{1} << 20, false}, std::pair{int64_t{2} << 30, true}}) {
    ::testing::internal::CaptureStderr();
    warn_kv_memory_over_budget(rc, kv, budget);
    warn_kv_memory_over_budget(rc, kv, {BudgetSource::off, 0});
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(said.find("warning: --kv-memory") != std::string::npos, warned) << kv << ": " << said;
    if (warned) {
      EXPECT_NE(said.find("(FOUNDRY_MEMORY_LIMIT)"), std::string::npos) << said;
    }
  }
}

}  // namespace
}  // namespace foundry
