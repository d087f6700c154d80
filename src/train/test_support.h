// Shared helpers of the trainer's unit tests: a tiny run config and a scratch directory.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "data/test_util.h"
#include "model/test_support.h"
#include "train/run_config.h"

namespace foundry::testing {

// A run of the tiny MoE (or ZAYA1) model of model/test_support.h: batch 4 × 8 tokens,
// AdamW, no periodic evaluation or checkpoints, its run directory in `run_dir`.
inline RunConfig tiny_run_config(const std::string& run_dir, bool zaya = false) {
  RunConfig rc;
  rc.model = zaya ? small_zaya_config(small_moe_config()) : small_moe_config();
  TrainConfig& t = rc.train;
  t.steps = 6;
  t.batch_size = 4;
  t.seq_len = rc.model.max_seq_len;
  t.lr = 1e-2;
  t.warmup_steps = 2;
  t.precision = DType::f32;
  t.eval_every = 0;
  t.eval_batches = 2;
  t.checkpoint_every = 0;
  t.log_every = 1000;
  t.peak_gflops = 1;
  t.run_dir = run_dir;
  // A run config's shape that no config reader takes (a resume then compares nothing).
  rc.source = {{"train", {{"test", "tiny run"}}}};
  return rc;
}

}  // namespace foundry::testing
