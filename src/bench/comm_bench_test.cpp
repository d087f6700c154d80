// Tests of the collective benchmark that need no second process: bandwidth conventions,
// sizes, statistics, the exact-input checker (against collectives simulated here), outputs
// and the profile merge. The measurement loop itself runs under mpirun in
// tests/bench_comm_test.sh.
#include "bench/comm_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "base/test_temp_dir.h"

namespace foundry {
namespace {

template <class F>
void expect_error(F body, const std::vector<std::string>& needles) {
  try {
    body();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << e.what() << "' does not mention '" << needle << "'";
  }
}

TEST(CommBench, BusbwFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_reduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_reduce, 8), 1.75);
  for (CollectiveOp op :
       {CollectiveOp::reduce_scatter, CollectiveOp::all_gather, CollectiveOp::all_to_all}) {
    EXPECT_DOUBLE_EQ(busbw_factor(op, 2), 0.5);
    EXPECT_DOUBLE_EQ(busbw_factor(op, 3), 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(busbw_factor(op, 4), 0.75);
  }
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::broadcast, 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::broadcast, 7), 1.0);
}

TEST(CommBench, AlgbwUsesTheWholeLogicalBuffer) {
  // All-gather at 4 ranks, 1 MiB: S is count × ranks (the whole gathered vector), 1 ms per
  // iteration gives algbw 1.048576 GB/s and busbw 3/4 of it.
  const MessageShape shape = message_shape(CollectiveOp::all_gather, 4, 1 << 20);
  EXPECT_EQ(shape.bytes, 1 << 20);
  EXPECT_EQ(shape.block, (1 << 18) / 4);
  const std::vector<double> times(10, 1e-3);
  const CommBenchPoint p = summarize_point(CollectiveOp::all_gather, 4, shape, times, 0);
  EXPECT_DOUBLE_EQ(p.algbw_bytes_per_s, 1048576.0 / 1e-3);
  EXPECT_DOUBLE_EQ(p.busbw_bytes_per_s, 0.75 * 1048576.0 / 1e-3);
  EXPECT_EQ(p.count, 1 << 18);
  // All-reduce: S is the vector; busbw 2(n−1)/n.
  const MessageShape ar = message_shape(CollectiveOp::all_reduce, 4, 4096);
  const CommBenchPoint q = summarize_point(CollectiveOp::all_reduce, 4, ar, times, 0);
  EXPECT_DOUBLE_EQ(q.algbw_bytes_per_s, 4096 / 1e-3);
  EXPECT_DOUBLE_EQ(q.busbw_bytes_per_s, 1.5 * 4096 / 1e-3);
}

TEST(CommBench, MessageShapesHaveWholeBlocks) {
  // 8 B at 3 ranks: one float per block is the minimum, so S grows to 12 B.
  MessageShape s = message_shape(CollectiveOp::all_gather, 3, 8);
  EXPECT_EQ(s.block, 1);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.bytes, 12);
  // 1 MiB at 3 ranks rounds down to whole blocks.
  s = message_shape(CollectiveOp::all_to_all, 3, 1 << 20);
  EXPECT_EQ(s.block, 87381);
  EXPECT_EQ(s.count, 3 * 87381);
  EXPECT_EQ(s.bytes, 4 * 3 * 87381);
  // All-reduce and broadcast need no blocks; at least one element.
  s = message_shape(CollectiveOp::all_reduce, 3, 8);
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(s.block, 2);
  s = message_shape(CollectiveOp::broadcast, 3, 1);
  EXPECT_EQ(s.count, 1);
  EXPECT_EQ(s.bytes, 4);
}

TEST(CommBench, ParsesSizesWithSuffixes) {
  EXPECT_EQ(parse_byte_size("8", "-b/--minbytes"), 8);
  EXPECT_EQ(parse_byte_size("64K", "-b/--minbytes"), 65536);
  EXPECT_EQ(parse_byte_size("64M", "-e/--maxbytes"), 64 << 20);
  EXPECT_EQ(parse_byte_size("2g", "-e/--maxbytes"), int64_t(2) << 30);
  for (const char* bad : {"12Q", "", "1.5M", "-8", "M", "8MB", " 8"})
    expect_error([&] { parse_byte_size(bad, "-b/--minbytes"); }, {"-b/--minbytes"});
  expect_error([] { parse_byte_size("12Q", "-b/--minbytes"); }, {"'12Q'"});
  expect_error([] { parse_byte_size("99999999999999G", "-e/--maxbytes"); }, {"too large"});
}

TEST(CommBench, SizeSweepAndItsErrorsNameTheFlags) {
  EXPECT_EQ(size_sweep(8, 64, 2), (std::vector<int64_t>{8, 16, 32, 64}));
  EXPECT_EQ(size_sweep(8, 100, 4), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(size_sweep(1 << 20, 1 << 20, 2), (std::vector<int64_t>{1 << 20}));
  EXPECT_EQ(size_sweep(8, int64_t(64) << 20, 2).size(), 24u);
  expect_error([] { size_sweep(1 << 20, 8, 2); }, {"-b/--minbytes", "-e/--maxbytes", "1 MiB"});
  expect_error([] { size_sweep(8, 64, 1); }, {"-f/--stepfactor", "got 1"});
  expect_error([] { size_sweep(0, 64, 2); }, {"-b/--minbytes"});
  expect_error([] { size_sweep(8, int64_t(16) << 30, 2); }, {"-e/--maxbytes"});
  // The documented bound, 4 GiB: 5 GiB (within MPI's int counts of fp32) is refused too.
  EXPECT_EQ(size_sweep(int64_t(4) << 30, int64_t(4) << 30, 2).size(), 1u);
  expect_error([] { size_sweep(8, int64_t(5) << 30, 2); }, {"-e/--maxbytes 5 GiB is above 4 GiB"});
  CommBenchOptions o;
  o.iters = 0;
  expect_error([&] { o.validate(); }, {"-n/--iters"});
  o.iters = 1;
  o.warmup = -1;
  expect_error([&] { o.validate(); }, {"-w/--warmup"});
}

TEST(CommBench, ParsesOpLists) {
  EXPECT_EQ(parse_ops("all").size(), 5u);
  EXPECT_EQ(parse_ops("broadcast, all_reduce"),
            (std::vector<CollectiveOp>{CollectiveOp::broadcast, CollectiveOp::all_reduce}));
  EXPECT_EQ(parse_ops("all_to_all,all_to_all").size(), 1u);
  expect_error([] { parse_ops("all_reduce,allreduce"); }, {"--op", "'allreduce'"});
  expect_error([] { parse_ops(""); }, {"--op"});
}

TEST(CommBench, TimeStatsUseNearestRankPercentiles) {
  std::vector<double> samples;
  for (int i = 20; i >= 1; --i) samples.push_back(i);  // unsorted on purpose
  TimeStats t = time_stats(samples);
  EXPECT_DOUBLE_EQ(t.avg_s, 10.5);
  EXPECT_DOUBLE_EQ(t.min_s, 1);
  EXPECT_DOUBLE_EQ(t.p50_s, 10);
  EXPECT_DOUBLE_EQ(t.p99_s, 20);
  EXPECT_DOUBLE_EQ(t.max_s, 20);
  samples.clear();
  for (int i = 1; i <= 200; ++i) samples.push_back(i);
  t = time_stats(samples);
  EXPECT_DOUBLE_EQ(t.p50_s, 100);
  EXPECT_DOUBLE_EQ(t.p99_s, 198);
  const std::vector<double> one = {3.0};
  t = time_stats(one);
  EXPECT_DOUBLE_EQ(t.p50_s, 3.0);
  EXPECT_DOUBLE_EQ(t.p99_s, 3.0);
}

// Each rank's buffers for a simulated run of `op` over `ranks` processes.
struct SimRank {
  std::vector<float> send, recv;
};

// Runs `op` the slow, obvious way on the simulated ranks' inputs: an independent statement
// of what each collective computes, against which the checker is tested.
std::vector<SimRank> simulate(CollectiveOp op, int ranks, const MessageShape& shape) {
  std::vector<SimRank> r(static_cast<size_t>(ranks));
  for (int k = 0; k < ranks; ++k) {
    r[k].send.resize(size_t(std::max<int64_t>(1, send_elements(op, shape))));
    r[k].recv.resize(size_t(recv_elements(op, shape)));
    fill_comm_inputs(op, ranks, k, shape, r[k].send.data(), r[k].recv.data());
  }
  const int64_t b = shape.block;
  for (int d = 0; d < ranks; ++d) {
    std::vector<float>& out = r[d].recv;
    for (int64_t i = 0; i < int64_t(out.size()); ++i) {
      switch (op) {
        case CollectiveOp::all_reduce:
          out[i] = 0;
          for (int s = 0; s < ranks; ++s) out[i] += r[s].send[i];
          break;
        case CollectiveOp::reduce_scatter:
          out[i] = 0;
          for (int s = 0; s < ranks; ++s) out[i] += r[s].send[d * b + i];
          break;
        case CollectiveOp::all_gather: out[i] = r[i / b].send[i % b]; break;
        case CollectiveOp::broadcast: out[i] = r[0].recv[i]; break;
        case CollectiveOp::all_to_all: out[i] = r[i / b].send[d * b + i % b]; break;
      }
    }
  }
  return r;
}

TEST(CommBench, CheckerAcceptsCorrectResultsAndCatchesCorruption) {
  for (CollectiveOp op : kAllCollectiveOps) {
    for (int ranks : {2, 3, 5}) {
      for (int64_t bytes : {8, 100, 4096}) {
        const MessageShape shape = message_shape(op, ranks, bytes);
        std::vector<SimRank> r = simulate(op, ranks, shape);
        for (int k = 0; k < ranks; ++k)
          ASSERT_EQ(count_wrong(op, ranks, k, shape, r[k].recv.data()), 0)
              << op_name(op) << " ranks " << ranks << " rank " << k << " bytes " << bytes;
        // One flipped element on one rank is exactly one wrong element.
        const int victim = ranks - 1;
        std::vector<float>& out = r[victim].recv;
        out[out.size() / 2] += 1.0f;
        EXPECT_EQ(count_wrong(op, ranks, victim, shape, out.data()), 1) << op_name(op);
        // Data from the wrong rank (two blocks swapped) is caught too.
        if (op == CollectiveOp::all_gather || op == CollectiveOp::all_to_all) {
          std::vector<float>& o = r[0].recv;
          std::swap_ranges(o.begin(), o.begin() + shape.block, o.begin() + shape.block);
          EXPECT_GT(count_wrong(op, ranks, 0, shape, o.data()), 0) << op_name(op);
        }
      }
    }
  }
}

TEST(CommBench, CheckerCatchesAnOperationThatDidNothing) {
  // fill_comm_inputs leaves the outputs at a sentinel: a call that never wrote them fails
  // every element (for broadcast, on every rank but the root, which already has the data).
  for (CollectiveOp op : kAllCollectiveOps) {
    const int ranks = 3;
    const MessageShape shape = message_shape(op, ranks, 1024);
    std::vector<float> send(size_t(std::max<int64_t>(1, send_elements(op, shape))));
    std::vector<float> recv(size_t(recv_elements(op, shape)));
    fill_comm_inputs(op, ranks, 1, shape, send.data(), recv.data());
    EXPECT_EQ(count_wrong(op, ranks, 1, shape, recv.data()), int64_t(recv.size())) << op_name(op);
  }
}

TEST(CommBench, InputsStayExactInFp32) {
  // The largest value a check compares is 7 · n(n+1)/2; every partial sum along the way is
  // an integer below 2^24, so any summation order gives the exact answer.
  const int ranks = 1024;
  EXPECT_LT(7.0 * ranks * (ranks + 1) / 2, double(1 << 24));
  EXPECT_EQ(comm_input_value(0, 0), 1.0f);
  EXPECT_EQ(comm_input_value(2, 13), 3.0f * 7.0f);
}

CommBenchResult sample_result(CollectiveOp op, int ranks, const std::string& algorithm,
                              int points) {
  CommBenchResult r;
  r.op = op;
  r.ranks = ranks;
  r.algorithm = algorithm;
  r.algorithm_id = algorithm == "default" ? 0 : 4;
  for (int i = 0; i < points; ++i) {
    const MessageShape shape = message_shape(op, ranks, int64_t(8) << (4 * i));
    const std::vector<double> times = {1e-5 + shape.bytes / 2e9, 2e-5 + shape.bytes / 2e9};
    r.points.push_back(summarize_point(op, ranks, shape, times, 0));
  }
  if (points >= 2) {
    std::vector<LatBwSample> samples;
    for (const CommBenchPoint& p : r.points) samples.push_back({double(p.bytes), p.time.p50_s});
    r.fit = fit_latency_bandwidth(samples);
  }
  return r;
}

TEST(CommBench, CollectiveEntryJsonHasTheProfileKeys) {
  const nlohmann::json e = collective_entry_json(sample_result(CollectiveOp::all_reduce, 2,
                                                               "default", 3));
  EXPECT_EQ(e["op"], "all_reduce");
  EXPECT_EQ(e["ranks"], 2);
  EXPECT_EQ(e["dtype"], "float32");
  EXPECT_EQ(e["algorithm"], "default");
  EXPECT_EQ(e["source"], "measured");
  for (const char* key : {"alpha_s", "beta_bytes_per_s", "max_rel_residual", "min_bytes",
                          "max_bytes"})
    EXPECT_TRUE(e["fit"].contains(key)) << key;
  EXPECT_EQ(e["fit"]["min_bytes"], 8);
  EXPECT_EQ(e["fit"]["max_bytes"], 8 << 8);
  ASSERT_EQ(e["points"].size(), 3u);
  const nlohmann::json& p = e["points"][0];
  for (const char* key : {"bytes", "count", "avg_s", "min_s", "p50_s", "p99_s", "max_s",
                          "algbw_bytes_per_s", "busbw_bytes_per_s", "wrong"})
    EXPECT_TRUE(p.contains(key)) << key;
  EXPECT_EQ(p["bytes"], 8);
  EXPECT_EQ(p["count"], 2);
  EXPECT_DOUBLE_EQ(p["avg_s"].get<double>(), 1.5e-5 + 8 / 2e9);
  // One size: no fit, only points.
  const nlohmann::json single =
      collective_entry_json(sample_result(CollectiveOp::broadcast, 2, "default", 1));
  EXPECT_FALSE(single.contains("fit"));
  EXPECT_EQ(single["points"].size(), 1u);
}

TEST(CommBench, TableAndCsvShowEveryColumn) {
  const CommBenchResult r = sample_result(CollectiveOp::all_gather, 3, "default", 2);
  const std::string table = format_comm_table(r);
  for (const char* column : {"size", "count", "type", "avg", "min", "p50", "p99", "max", "algbw",
                             "busbw", "#wrong", "default (tuned decision rules)", "# fit: t(S)"})
    EXPECT_NE(table.find(column), std::string::npos) << column << "\n" << table;
  Provenance prov;
  prov.command = "foundry bench comm";
  const std::vector<CommBenchResult> rs = {r};
  const std::string csv = format_comm_csv(rs, prov);
  EXPECT_NE(csv.find("# command: foundry bench comm\n"), std::string::npos);
  EXPECT_NE(csv.find("\nop,ranks,algorithm,dtype,bytes,count,avg_us,min_us,p50_us,p99_us,max_us,"
                     "algbw_GBps,busbw_GBps,wrong\n"),
            std::string::npos);
  EXPECT_NE(csv.find("\nall_gather,3,default,float32,12,3,"), std::string::npos) << csv;
}

TEST(CommBench, ProfileMergeReplacesMatchingEntriesAndKeepsTheRest) {
  Provenance prov;
  prov.host = "node7";
  const std::vector<nlohmann::json> first = {
      collective_entry_json(sample_result(CollectiveOp::all_reduce, 2, "default", 2)),
      collective_entry_json(sample_result(CollectiveOp::broadcast, 2, "default", 2))};
  nlohmann::json profile = merge_profile_collectives(nullptr, first, prov, "node7");
  EXPECT_EQ(profile["format"], "foundry-hardware-profile");
  EXPECT_EQ(profile["version"], 1);
  EXPECT_EQ(profile["name"], "node7");
  EXPECT_EQ(profile["provenance"]["host"], "node7");
  ASSERT_EQ(profile["collectives"].size(), 2u);
  profile["gemm"] = {{"owned", "by someone else"}};

  // Same op+ranks+algorithm: replaced where it was. Other ranks or algorithm: appended.
  CommBenchResult again = sample_result(CollectiveOp::all_reduce, 2, "default", 3);
  const std::vector<nlohmann::json> second = {
      collective_entry_json(again),
      collective_entry_json(sample_result(CollectiveOp::all_reduce, 4, "default", 2)),
      collective_entry_json(sample_result(CollectiveOp::all_reduce, 2, "ring", 2))};
  profile = merge_profile_collectives(profile, second, prov, "ignored");
  const nlohmann::json& c = profile["collectives"];
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0]["op"], "all_reduce");
  EXPECT_EQ(c[0]["points"].size(), 3u);  // the new measurement
  EXPECT_EQ(c[1]["op"], "broadcast");
  EXPECT_EQ(c[2]["ranks"], 4);
  EXPECT_EQ(c[3]["algorithm"], "ring");
  EXPECT_EQ(profile["gemm"]["owned"], "by someone else");
  EXPECT_EQ(profile["name"], "node7");

  expect_error([&] { merge_profile_collectives({{"format", "other"}}, first, prov, "x"); },
               {"not a hardware profile"});
}

// One message size fits no line: it does not replace a fitted sweep, which the planner reads.
TEST(CommBench, ProfileMergeKeepsAFitOverAnEntryWithout) {
  const Provenance prov;
  const nlohmann::json fitted =
      collective_entry_json(sample_result(CollectiveOp::reduce_scatter, 2, "default", 3));
  ASSERT_TRUE(fitted.contains("fit"));
  nlohmann::json profile = merge_profile_collectives(nullptr, {{fitted}}, prov, "n");
  const nlohmann::json single =
      collective_entry_json(sample_result(CollectiveOp::reduce_scatter, 2, "default", 1));
  ASSERT_FALSE(single.contains("fit"));
  ::testing::internal::CaptureStderr();
  profile = merge_profile_collectives(profile, {{single}}, prov, "n");
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("kept the profile's fitted"),
            std::string::npos);
  ASSERT_EQ(profile["collectives"].size(), 1u);
  EXPECT_EQ(profile["collectives"][0], fitted);
}

TEST(CommBench, ProfileFileIsCreatedThenUpdated) {
  const testing::TempDir dir;
  const std::string path = dir.file("profile.json");
  Provenance prov;
  prov.host = "node7";
  std::vector<CommBenchResult> results = {sample_result(CollectiveOp::all_to_all, 2, "default", 2)};
  update_profile_file(path, results, prov);
  nlohmann::json p = nlohmann::json::parse(read_text_file(path));
  EXPECT_EQ(p["collectives"].size(), 1u);
  results.push_back(sample_result(CollectiveOp::all_to_all, 3, "default", 2));
  update_profile_file(path, results, prov);
  p = nlohmann::json::parse(read_text_file(path));
  EXPECT_EQ(p["collectives"].size(), 2u);
  // A broken file is reported with its path, and left alone.
  write_file_atomic(path, std::string_view("{not json"));
  expect_error([&] { update_profile_file(path, results, prov); }, {"--profile", path});
  EXPECT_EQ(read_text_file(path), "{not json");
}

TEST(CommBench, OneRankIsAClearError) {
  // MPI starts as a singleton here (no mpirun): every collective is degenerate.
  static MpiSession session;
  CommBenchOptions options;
  expect_error([&] { run_comm_bench(session.world(), options); },
               {"needs at least 2 ranks (got 1)", "mpirun -np 2 foundry bench comm"});
  // Bad options are reported before anything runs.
  options.step_factor = 1;
  expect_error([&] { run_comm_bench(session.world(), options); }, {"-f/--stepfactor"});
}

}  // namespace
}  // namespace foundry
