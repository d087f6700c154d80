#include "ckpt/sharded.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/error.h"
#include "base/io.h"
#include "base/rng.h"
#include "base/test_temp_dir.h"
#include "ckpt/checkpoint.h"
#include "ckpt/test_support.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

using testing::random_slab;
using testing::share;

class ShardedTest : public ::testing::Test {
 protected:
  // Saves params and one state slab from `ranks` simulated ranks and commits.
  std::string save(int64_t step, int ranks) {
    const std::string staging = staging_dir(run_dir_, step, "test");
    std::vector<json> shards;
    for (int r = 0; r < ranks; ++r) {
      const auto [b, e] = share(n_, ranks, r);
      shards.push_back(write_rank_shard(
          staging, r, table_,
          {{"", b, e, params_.data() + b}, {"exp_avg", b, e, exp_avg_.data() + b}}));
    }
    return commit_sharded_checkpoint(run_dir_, staging, step, config_, table_, shards,
                                     {{"step", step}}, {ranks, 1, true}, 0);
  }
  // Loads as rank r of `ranks` would: its share of both slabs into zeroed slabs.
  void load_share(const std::string& dir, int ranks, int r, std::vector<float>& params,
                  std::vector<float>& exp_avg) {
    const auto [b, e] = share(n_, ranks, r);
    load_sharded_checkpoint(dir, config_, table_,
                            {{"", b, e, params.data() + b}, {"exp_avg", b, e, exp_avg.data() + b}});
  }
  bool same_tensors(const std::vector<float>& a, const std::vector<float>& b) const {
    for (const ParamInfo& p : table_.params())
      if (std::memcmp(a.data() + p.offset, b.data() + p.offset, p.numel * sizeof(float)) != 0)
        return false;
    return true;
  }

  foundry::testing::TempDir tmp_;
  const std::string run_dir_ = tmp_.file("run");
  ModelConfig config_ = testing::tiny_moe_config();
  ParamTable table_{config_};
  int64_t n_ = table_.total_elements();
  std::vector<float> params_ = random_slab(n_, 1), exp_avg_ = random_slab(n_, 2);
};

TEST_F(ShardedTest, SavedFromFourRanksLoadsBitExactUnderOneTwoThreeAndFive) {
  const std::string dir = save(10, 4);
  for (int ranks : {1, 2, 3, 5}) {
    std::vector<float> params(n_, 0.0f), exp_avg(n_, 0.0f);
    for (int r = 0; r < ranks; ++r) load_share(dir, ranks, r, params, exp_avg);
    EXPECT_TRUE(same_tensors(params, params_)) << ranks << " ranks";
    EXPECT_TRUE(same_tensors(exp_avg, exp_avg_)) << ranks << " ranks";
  }
}

TEST_F(ShardedTest, LayoutOfTheDirectoryAndMetadata) {
  const std::string dir = save(3, 2);
  for (const char* f :
       {"rank_00000.bin", "rank_00001.bin", "metadata.json", "config.json", "COMMITTED"})
    EXPECT_TRUE(path_exists(dir + "/" + f)) << f;
  EXPECT_EQ(read_text_file(run_dir_ + "/checkpoints/latest"), "step_00000003\n");
  const json m = read_sharded_metadata(dir);
  EXPECT_EQ(m["format_version"], 2);
  EXPECT_EQ(m["step"], 3);
  EXPECT_EQ(m["trainer_state"]["step"], 3);
  EXPECT_EQ(m["layout"]["world"], 2);
  // Every piece: a box inside its tensor, 64-byte aligned, one checksum per started MiB.
  for (const json& p : m["pieces"]) {
    EXPECT_EQ(p["byte_offset"].get<int64_t>() % 64, 0);
    const std::vector<int64_t> shape = m["tensors"][p["tensor"].get<std::string>()]["shape"];
    EXPECT_EQ(p["offsets"].size(), shape.size());
  }
  EXPECT_NO_THROW(verify_sharded_data(dir));
  EXPECT_NO_THROW(verify_checkpoint(dir));
  EXPECT_EQ(read_checkpoint_trainer_state(dir)["step"], 3);
}

// verify reads every value: it names the tensors holding NaN or inf (a diverged run's, saved
// faithfully), and their counts.
TEST_F(ShardedTest, VerifyCountsTheNonFiniteValuesOfEachTensor) {
  for (float& x : params_) x = 0.25f;
  for (float& x : exp_avg_) x = 0.5f;
  EXPECT_TRUE(verify_sharded_data(save(1, 2)).empty());
  const ParamInfo& second = table_.params()[1];
  const ParamInfo& last = table_.params().back();
  params_[second.offset] = std::nanf("");
  params_[second.offset + second.numel - 1] = std::numeric_limits<float>::infinity();
  exp_avg_[last.offset + last.numel - 1] = -std::numeric_limits<float>::infinity();
  const std::map<std::string, int64_t> bad = verify_sharded_data(save(2, 3));
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad.at(second.name), 2);
  EXPECT_EQ(bad.begin()->second + std::next(bad.begin())->second, 3);
}

TEST_F(ShardedTest, TheWholeSlabLoaderReadsVersionTwo) {
  const std::string dir = save(5, 3);
  std::vector<float> params(n_, 0.0f), exp_avg(n_, 0.0f);
  const json state =
      load_checkpoint(dir, config_, table_, params.data(), {{"exp_avg", exp_avg.data()}});
  EXPECT_EQ(state["step"], 5);
  EXPECT_TRUE(same_tensors(params, params_));
  EXPECT_TRUE(same_tensors(exp_avg, exp_avg_));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x10));
}

TEST_F(ShardedTest, AFlippedByteFailsTheReadsThatCoverItNamingFileAndBytes) {
  const std::string dir = save(7, 2);
  const json m = read_sharded_metadata(dir);
  const json& piece = m["pieces"][0];  // rank 0's first piece
  flip_byte(dir + "/rank_00000.bin", piece["byte_offset"].get<int64_t>() + 8);
  std::vector<float> params(n_, 0.0f), exp_avg(n_, 0.0f);
  const std::string e = error_of([&] { load_share(dir, 2, 0, params, exp_avg); });
  EXPECT_NE(e.find("rank_00000.bin: bytes ["), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  // Rank 1's share lies in the other file: it loads.
  EXPECT_NO_THROW(load_share(dir, 2, 1, params, exp_avg));
  EXPECT_NE(error_of([&] { verify_sharded_data(dir); }).find("rank_00000.bin"), std::string::npos);
}

TEST_F(ShardedTest, ATruncatedShardMakesTheCheckpointInvalidAndTheOlderOneIsFound) {
  save(1, 2);
  const std::string dir = save(2, 2);
  fs::resize_file(dir + "/rank_00001.bin", fs::file_size(dir + "/rank_00001.bin") - 4);
  const std::string e = error_of([&] { verify_checkpoint(dir); });
  EXPECT_NE(e.find("rank_00001.bin has"), std::string::npos) << e;
  ::testing::internal::CaptureStderr();
  const auto found = find_latest_checkpoint(run_dir_);
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, run_dir_ + "/checkpoints/step_00000001");
}

TEST_F(ShardedTest, AGapInTheParametersIsRefusedAndNothingIsCommitted) {
  save(1, 2);
  const std::string staging = staging_dir(run_dir_, 2, "gap");
  const auto [b, e] = share(n_, 2, 0);
  std::vector<json> shards = {write_rank_shard(staging, 0, table_, {{"", b, e, params_.data()}})};
  const std::string err = error_of([&] {
    commit_sharded_checkpoint(run_dir_, staging, 2, config_, table_, shards, {}, {2, 1, true}, 0);
  });
  EXPECT_NE(err.find("in no piece"), std::string::npos) << err;
  EXPECT_FALSE(path_exists(run_dir_ + "/checkpoints/step_00000002"));
  EXPECT_EQ(read_text_file(run_dir_ + "/checkpoints/latest"), "step_00000001\n");
}

TEST_F(ShardedTest, MissingStateIsAnErrorNamingTheTensor) {
  const std::string dir = save(4, 1);
  std::vector<float> momentum(n_, 0.0f);
  const std::string e = error_of([&] {
    load_sharded_checkpoint(dir, config_, table_, {{"muon_momentum", 0, n_, momentum.data()}});
  });
  EXPECT_NE(e.find("has no tensor 'model.embed_tokens.weight.muon_momentum'"), std::string::npos)
      << e;
}

TEST_F(ShardedTest, AnotherModelConfigIsRefused) {
  const std::string dir = save(4, 1);
  ModelConfig other = config_;
  other.d_model = 32;
  ParamTable table(other);
  std::vector<float> params(table.total_elements());
  const std::string e = error_of([&] {
    load_sharded_checkpoint(dir, other, table, {{"", 0, table.total_elements(), params.data()}});
  });
  EXPECT_NE(e.find("model.d_model"), std::string::npos) << e;
}

// The balancer's rule and its rates shape training only: a checkpoint loads under another
// (its biases kept, the rule started afresh by the model), and another model is still refused.
TEST(ShardedCheckpoint, TheBalancersRuleMayChangeTheModelMayNot) {
  testing::TempDir tmp;
  ModelConfig saved = testing::tiny_zaya_config();
  saved.balance_rule = "adamw";
  const ParamTable table(saved);
  const std::vector<float> values = testing::random_slab(table.total_elements(), 5);
  const std::string staging = staging_dir(tmp.path(), 3, "t");
  const json shard =
      write_rank_shard(staging, 0, table, {{"", 0, table.total_elements(), values.data()}});
  const std::string dir = commit_sharded_checkpoint(tmp.path(), staging, 3, saved, table, {shard},
                                                    {{"step", 3}}, {1, 1, false}, 0);
  ModelConfig now = saved;
  now.balance_rule = "newton";
  now.balance_bias_lr = 0.25;
  now.skip_bias_init = -2.0;
  std::vector<float> loaded(table.total_elements());
  load_sharded_checkpoint(dir, now, table, {{"", 0, table.total_elements(), loaded.data()}});
  for (const ParamInfo& p : table.params())  // (the slab pads between tensors)
    EXPECT_EQ(
        std::memcmp(loaded.data() + p.offset, values.data() + p.offset, p.numel * sizeof(float)), 0)
        << p.name;
  now.balance_bias_on = "probs";
  EXPECT_THROW(
      load_sharded_checkpoint(dir, now, table, {{"", 0, table.total_elements(), loaded.data()}}),
      Error);
}

TEST_F(ShardedTest, LeftoverStagingIsIgnoredAndRemovedByTheNextCommit) {
  const std::string leftover = staging_dir(run_dir_, 9, "dead");
  write_rank_shard(leftover, 0, table_, {{"", 0, 10, params_.data()}});
  save(1, 1);
  EXPECT_FALSE(path_exists(leftover));
  EXPECT_TRUE(list_checkpoint_dirs(run_dir_).size() == 1);
}

// Pages of `path` in the page cache (mincore over a mapping of it).
int64_t cached_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  const size_t bytes = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  int64_t n = -1;
  if (::mincore(p, bytes, in_core.data()) == 0)
    n = std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; });
  ::munmap(p, bytes);
  return n;
}

// Several staging buffers of data (direct I/O writes 8 MiB at a time) and a size that is no
// multiple of the device block: written directly, and through the page cache into a recycled
// file, the shard files are the same bytes and load the same tensors.
TEST_F(ShardedTest, DirectAndBufferedWritesGiveTheSameFile) {
  ModelConfig big = config_;
  big.vocab_size = 20011;
  big.d_model = 320;
  const ParamTable table(big);
  const int64_t n = table.total_elements();
  ASSERT_GT(n * 4, int64_t{17} << 20);  // two whole staging buffers and a part
  const std::vector<float> params = random_slab(n, 5);
  const std::vector<SlabRun> runs = {{"", 0, n, const_cast<float*>(params.data())}};

  const std::string direct_dir = run_dir_ + "/direct", old_dir = run_dir_ + "/old",
                    recycled_dir = run_dir_ + "/recycled";
  const json direct = write_rank_shard(direct_dir, 0, table, runs);
  write_rank_shard(old_dir, 0, table, {{"", 0, 10, const_cast<float*>(params.data())}});
  const json buffered = write_rank_shard(recycled_dir, 0, table, runs, old_dir);
  EXPECT_FALSE(buffered.at("direct_io").get<bool>());
  EXPECT_FALSE(path_exists(old_dir + "/rank_00000.bin"));  // moved and overwritten

  const std::string a = read_text_file(direct_dir + "/rank_00000.bin");
  const std::string b = read_text_file(recycled_dir + "/rank_00000.bin");
  EXPECT_EQ(static_cast<int64_t>(a.size()), direct.at("bytes").get<int64_t>());
  EXPECT_NE(a.size() % 4096, 0u);
  EXPECT_TRUE(a == b) << "the two writes differ";
  EXPECT_EQ(direct.at("pieces"), buffered.at("pieces"));
  // Every piece holds its tensor's values at its byte offset.
  for (const json& piece : direct.at("pieces")) {
    const std::string name = piece.at("tensor");
    const ParamInfo* info = nullptr;
    for (const ParamInfo& p : table.params())
      if (p.name == name) info = &p;
    ASSERT_NE(info, nullptr) << name;
    ASSERT_EQ(piece.at("byte_length").get<int64_t>(), info->numel * 4);
    EXPECT_EQ(std::memcmp(a.data() + piece.at("byte_offset").get<int64_t>(),
                          params.data() + info->offset, info->numel * 4),
              0)
        << name;
  }
  // Direct I/O leaves the page cache alone (a RAM-backed filesystem caches what it holds).
  struct statfs fs_info {};
  ::statfs(direct_dir.c_str(), &fs_info);
  if (direct.at("direct_io").get<bool>() && fs_info.f_type != TMPFS_MAGIC) {
    const std::string again = direct_dir + "/again";
    const json shard = write_rank_shard(again, 0, table, runs);
    EXPECT_LT(cached_pages(again + "/rank_00000.bin"), 16);
  }
}

}  // namespace
}  // namespace foundry
