// Shared by the infer tests: a small trained tokenizer and tiny models of both architectures
// over its vocabulary, with random weights.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "data/test_util.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "model/test_support.h"

namespace foundry::infer::testing {

constexpr int64_t kVocab = 300;

inline const data::Tokenizer& small_tokenizer() {
  static const data::Tokenizer tok = [] {
    data::BpeTrainingOptions options;
    options.vocab_size = kVocab;
    return data::train_bpe_tokenizer(foundry::testing::generated_sentences(300, 7), options);
  }();
  return tok;
}

// The small test models (model/test_support.h) over kVocab tokens, max_seq_len 24.
inline ModelConfig small_config(Arch arch) {
  ModelConfig c = foundry::testing::small_moe_config();
  c.vocab_size = kVocab;
  c.max_seq_len = 24;
  if (arch == Arch::zaya1) c = foundry::testing::small_zaya_config(c);
  c.validate("test");
  return c;
}

inline std::unique_ptr<Model> small_model(Arch arch, uint64_t seed = 3) {
  auto m = std::make_unique<Model>(small_config(arch), DType::f32);
  m->init_weights(seed);
  return m;
}

}  // namespace foundry::infer::testing
