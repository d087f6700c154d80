#include "bench/gemm_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/io.h"
#include "base/test_expect_error.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;


std::vector<GemmShape> of_kind(const std::vector<GemmShape>& shapes, const std::string& kind) {
  std::vector<GemmShape> out;
  for (const GemmShape& s : shapes)
    if (s.kind == kind) out.push_back(s);
  return out;
}

bool contains(const std::vector<GemmShape>& shapes, int64_t m, int64_t n, int64_t k, bool ta,
              bool tb) {
  return std::any_of(shapes.begin(), shapes.end(), [&](const GemmShape& s) {
    return s.m == m && s.n == n && s.k == k && s.trans_a == ta && s.trans_b == tb;
  });
}

TEST(GemmBench, FlopArithmetic) {
  EXPECT_DOUBLE_EQ(gemm_flops(2, 3, 4), 48);
  EXPECT_DOUBLE_EQ(gemm_rate(1000, 1000, 1000, 0.5), 4e9);
  EXPECT_DOUBLE_EQ(gemm_rate(4096, 4096, 4096, 1.0), 2.0 * 4096 * 4096 * 4096);
  EXPECT_EQ(gemm_rate(10, 10, 10, 0), 0);
}

TEST(GemmBench, EfficiencyIsAgainstTheBestRateOfTheDtype) {
  GemmBenchResult r;
  auto point = [](DType t, double rate) {
    GemmMeasurement p;
    p.dtype = t;
    p.flops_per_s = rate;
    return p;
  };
  r.points = {point(DType::f32, 100e9), point(DType::f32, 400e9), point(DType::bf16, 800e9),
              point(DType::bf16, 200e9)};
  compute_efficiencies(r);
  EXPECT_DOUBLE_EQ(r.best_fp32, 400e9);
  EXPECT_DOUBLE_EQ(r.best_bf16, 800e9);
  EXPECT_DOUBLE_EQ(r.points[0].efficiency, 0.25);
  EXPECT_DOUBLE_EQ(r.points[1].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(r.points[2].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(r.points[3].efficiency, 0.25);
}

TEST(GemmBench, ExpertTokens) {
  EXPECT_EQ(expert_tokens(2048, 2, 8), 512);
  EXPECT_EQ(expert_tokens(2048, 2, 32), 128);
  EXPECT_EQ(expert_tokens(2048, 1, 16), 128);
  EXPECT_EQ(expert_tokens(100, 1, 3), 33);
  EXPECT_EQ(expert_tokens(1, 1, 64), 1);  // never zero rows
}

TEST(GemmBench, DefaultSweepHasTheTransformerShapes) {
  const GemmBenchOptions o;
  const std::vector<GemmShape> shapes = gemm_sweep(o);

  const auto squares = of_kind(shapes, "square");
  ASSERT_EQ(squares.size(), o.square_sizes.size());
  for (size_t i = 0; i < squares.size(); ++i) {
    EXPECT_EQ(squares[i].m, o.square_sizes[i]);
    EXPECT_EQ(squares[i].n, o.square_sizes[i]);
    EXPECT_EQ(squares[i].k, o.square_sizes[i]);
  }

  // tokens 2048, hidden {512, 1024, 2048}, ffn {1024, 4096}: one attention projection per
  // hidden size (not repeated per ffn width), four FFN shapes per (hidden, ffn), less three
  // products that two roles share (measured once): for (hidden, ffn) = (1024, 1024) down fwd
  // is the attention projection of 1024; (1024, 1024) gate|up fwd is (2048, 1024) down fwd;
  // (2048, 1024) gate|up fwd is the attention projection of 2048.
  const auto layer = of_kind(shapes, "transformer");
  EXPECT_EQ(layer.size(), 3u + 3u * 2u * 4u - 3u);
  for (const GemmShape& s : layer)
    if (s.m == 2048 && s.n == 1024 && s.k == 1024 && s.trans_b) {
      EXPECT_NE(s.label.find("attention projection"), std::string::npos) << s.label;
      EXPECT_NE(s.label.find("down fwd"), std::string::npos) << s.label;
    }
  EXPECT_TRUE(contains(layer, 2048, 1024, 1024, false, true));      // attention projection
  EXPECT_TRUE(contains(layer, 2048, 2 * 4096, 1024, false, true));  // gate|up fwd, M = tokens
  EXPECT_TRUE(contains(layer, 2048, 1024, 4096, false, true));      // down fwd
  EXPECT_TRUE(contains(layer, 2048, 512, 2 * 1024, false, false));  // input grad
  EXPECT_TRUE(contains(layer, 2 * 4096, 2048, 2048, true, false));  // weight grad, K = tokens

  // Per-expert rows: 2048·2/8 = 512 and 2048·2/32 = 128.
  const auto experts = of_kind(shapes, "expert");
  // (hidden 1024, ffn 1024) gate|up fwd = (hidden 2048, ffn 1024) down fwd, per expert count.
  EXPECT_EQ(experts.size(), 2u * 3u * 2u * 3u - 2u);
  EXPECT_TRUE(contains(experts, 512, 2 * 1024, 512, false, true));
  EXPECT_TRUE(contains(experts, 128, 2048, 4096, false, true));
  EXPECT_TRUE(contains(experts, 2 * 4096, 1024, 128, true, false));
  for (const GemmShape& s : experts) EXPECT_NE(s.label.find("top-2 of"), std::string::npos);

  // Off-size scan: n = 1008..1040 in steps of 1 with m = k = 1024.
  const auto offsize = of_kind(shapes, "offsize");
  ASSERT_EQ(offsize.size(), 33u);
  for (size_t i = 0; i < offsize.size(); ++i) {
    EXPECT_EQ(offsize[i].n, 1008 + static_cast<int64_t>(i));
    EXPECT_EQ(offsize[i].m, 1024);
    EXPECT_EQ(offsize[i].k, 1024);
  }
  EXPECT_NE(offsize[16].label.find("multiple of 64"), std::string::npos)
      << offsize[16].label;  // 1024
  EXPECT_NE(offsize[0].label.find("multiple of 16"), std::string::npos)
      << offsize[0].label;  // 1008
  EXPECT_NE(offsize[1].label.find("multiple of 1)"), std::string::npos)
      << offsize[1].label;  // 1009
}

TEST(GemmBench, SweepFollowsTheOptions) {
  GemmBenchOptions o;
  o.kinds = {"offsize"};
  o.offsize_dim = "k";
  o.offsize_from = 2040;
  o.offsize_to = 2056;
  o.offsize_base = 512;
  auto shapes = gemm_sweep(o);
  ASSERT_EQ(shapes.size(), 17u);
  EXPECT_EQ(shapes.front().k, 2040);
  EXPECT_EQ(shapes.back().k, 2056);
  EXPECT_EQ(shapes.front().m, 512);
  EXPECT_EQ(shapes.front().n, 512);

  o.kinds = {"expert"};
  o.tokens = {4096};
  o.hidden = {256};
  o.ffn = {512};
  o.experts = {16};
  o.top_k = 4;
  shapes = gemm_sweep(o);
  ASSERT_EQ(shapes.size(), 3u);
  EXPECT_EQ(shapes[0].m, 4096 * 4 / 16);  // 1024 rows per expert
  EXPECT_EQ(shapes[2].k, 1024);           // weight grad: inner dimension = rows

  o.kinds = {"square"};
  o.square_sizes = {64, 64, 128};  // duplicates are measured once
  EXPECT_EQ(gemm_sweep(o).size(), 2u);

  // Decode: per row count, the attention projection and each FFN width's two projections,
  // as stored (B transposed), every one against weights read from memory.
  o.kinds = {"decode"};
  o.decode_rows = {1, 16};
  o.hidden = {512};
  o.ffn = {384, 1024};  // 2F ≠ hidden: no product shared with the attention projection
  shapes = gemm_sweep(o);
  ASSERT_EQ(shapes.size(), 2u * 5u);
  for (const GemmShape& s : shapes) {
    EXPECT_TRUE(s.cold_b && s.trans_b && !s.trans_a) << s.label;
    EXPECT_TRUE(s.m == 1 || s.m == 16);
  }
  EXPECT_EQ(shapes[1].n, 768);  // gate|up of F = 384: N = 2F
  EXPECT_EQ(shapes[2].k, 384);  // down of F = 384: K = F
}

// A cold-weights product cycles through copies of B at least twice the last-level cache and
// still computes the right product.
TEST(GemmBench, ColdWeightsAreRightAndExceedTheCache) {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  EXPECT_GE(cold_weight_bytes(), std::max<int64_t>(int64_t{64} << 20, 2 * int64_t{llc}));
  for (DType t : {DType::f32, DType::bf16}) {
    GemmShape s{3, 96, 80, "decode", "test", false, true};
    s.cold_b = true;
    const GemmMeasurement p = measure_gemm(t, s, 2, 0.0);
    EXPECT_TRUE(p.valid) << dtype_name(t);
    EXPECT_GT(p.seconds, 0);
  }
}

TEST(GemmBench, OptionErrorsNameTheFlag) {
  auto with = [](auto change) {
    GemmBenchOptions o;
    change(o);
    return o;
  };
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.square_sizes = {0}; })); },
               "--sizes 0");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.square_sizes = {}; })); },
               "--sizes is empty");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.tokens = {-4}; })); },
               "--tokens -4");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.top_k = 9; })); },
               "--top-k 9 exceeds --experts 8");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.dtypes = {}; })); }, "--dtype");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.kinds = {"cubes"}; })); },
               "--kinds: unknown kind 'cubes'");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.offsize_dim = "x"; })); },
               "--offsize-dim 'x'");
  expect_error([&] {
    validate(with([](GemmBenchOptions& o) {
      o.offsize_from = 1040;
      o.offsize_to = 1000;
    }));
  }, "--offsize 1040:1000");
  expect_error([&] { validate(with([](GemmBenchOptions& o) { o.repeats = 0; })); }, "--repeats 0");
  // A shape bigger than memory is refused before anything is allocated.
  expect_error([&] {
    validate(with([](GemmBenchOptions& o) {
      o.kinds = {"square"};
      o.square_sizes = {1 << 20};
    }));
  }, "needs");
  // A sweep that does not use a list does not check it.
  validate(with([](GemmBenchOptions& o) {
    o.kinds = {"square"};
    o.tokens = {};
  }));
}

TEST(GemmBench, ParsesFlags) {
  EXPECT_EQ(parse_dtypes("--dtype", "fp32,bf16"), (std::vector<DType>{DType::f32, DType::bf16}));
  EXPECT_EQ(parse_dtypes("--dtype", "bf16"), (std::vector<DType>{DType::bf16}));
  EXPECT_EQ(parse_dtypes("--dtype", "bf16,bf16"), (std::vector<DType>{DType::bf16}));
  expect_error([] { parse_dtypes("--dtype", "fp16"); }, "--dtype 'fp16': unsupported dtype 'fp16'");
  expect_error([] { parse_dtypes("--dtype", ""); }, "--dtype is empty");
  EXPECT_EQ(parse_int_list("--sizes", "128,256,1024"), (std::vector<int64_t>{128, 256, 1024}));
  expect_error([] { parse_int_list("--sizes", "128,abc"); },
               "--sizes '128,abc': 'abc' is not an integer");
  expect_error([] { parse_int_list("--sizes", "12x"); }, "'12x' is not an integer");
  expect_error([] { parse_int_list("--sizes", "0"); }, "--sizes 0: values must be ≥ 1");
  expect_error([] { parse_int_list("--sizes", "128,,256"); }, "--sizes");
  EXPECT_EQ(parse_range("--offsize", "1000:1040"), (std::pair<int64_t, int64_t>{1000, 1040}));
  expect_error([] { parse_range("--offsize", "1040:1000"); }, "--offsize 1040:1000");
  expect_error([] { parse_range("--offsize", "1000"); }, "not a range");
}

TEST(GemmBench, MeasuresEveryLayoutCorrectly) {
  // Odd sizes, all three layouts the sweep uses, both dtypes: the result check passes and
  // the numbers are sane.
  for (DType t : {DType::f32, DType::bf16})
    for (auto [ta, tb] :
         {std::pair{false, false}, std::pair{false, true}, std::pair{true, false}}) {
      const GemmShape s{67, 45, 93, "square", "test", ta, tb};
      const GemmMeasurement p = measure_gemm(t, s, 2, 0.0);
      EXPECT_TRUE(p.valid) << dtype_name(t) << " trans_a " << ta << " trans_b " << tb;
      EXPECT_GT(p.seconds, 0);
      EXPECT_DOUBLE_EQ(p.flops_per_s, gemm_rate(67, 45, 93, p.seconds));
      EXPECT_GE(p.calls_per_run, 1);
    }
}

TEST(GemmBench, TinyRunAndItsOutputs) {
  GemmBenchOptions o;
  o.square_sizes = {32, 64};
  o.tokens = {64};
  o.hidden = {32};
  o.ffn = {48};
  o.experts = {4};
  o.offsize_from = 30;
  o.offsize_to = 34;
  o.offsize_base = 32;
  o.repeats = 2;
  o.min_seconds = 0.0005;
  int64_t calls = 0;
  o.on_progress = [&](int64_t, int64_t, const std::string&) { ++calls; };
  const GemmBenchResult r = run_gemm_bench(o);
  const size_t shapes = gemm_sweep(o).size();
  ASSERT_EQ(r.points.size(), 2 * shapes);
  EXPECT_EQ(calls, static_cast<int64_t>(2 * shapes * o.repeats));  // dtypes × shapes × passes
  EXPECT_TRUE(r.all_valid);
  double top_fp32 = 0, top_bf16 = 0;
  for (const GemmMeasurement& p : r.points) {
    EXPECT_GT(p.efficiency, 0);
    // Decode products never set the best rate (at these tiny shapes one may beat it).
    if (p.shape.kind == "decode") continue;
    EXPECT_LE(p.efficiency, 1.0);
    (p.dtype == DType::bf16 ? top_bf16 : top_fp32) =
        std::max(p.dtype == DType::bf16 ? top_bf16 : top_fp32, p.efficiency);
  }
  EXPECT_DOUBLE_EQ(top_fp32, 1.0);
  EXPECT_DOUBLE_EQ(top_bf16, 1.0);

  CpuPeak peak;
  peak.fp32.flops_per_s = 1e12;
  peak.fp32.basis = "test fp32";
  peak.bf16.flops_per_s = 2e12;
  peak.bf16.basis = "test bf16";
  const nlohmann::json compute = compute_profile_section(r, peak, Provenance{});
  EXPECT_DOUBLE_EQ(compute["bf16"]["spec_flops_per_s"].get<double>(), 2e12);
  EXPECT_EQ(compute["fp32"]["spec_basis"], "test fp32");
  EXPECT_DOUBLE_EQ(compute["bf16"]["measured_flops_per_s"].get<double>(), r.best_bf16);
  EXPECT_EQ(compute["fp32"]["source"], "measured");

  const nlohmann::json gemm = gemm_profile_section(r, Provenance{});
  ASSERT_EQ(gemm["points"].size(), r.points.size());
  for (const char* key :
       {"dtype", "m", "n", "k", "kind", "label", "seconds", "flops_per_s", "efficiency"})
    EXPECT_TRUE(gemm["points"][0].contains(key)) << key;
  EXPECT_EQ(gemm["points"][0]["dtype"], "fp32");
  EXPECT_EQ(gemm["points"][0]["m"], 32);
  EXPECT_DOUBLE_EQ(gemm["best_flops_per_s"]["fp32"].get<double>(), r.best_fp32);
  EXPECT_DOUBLE_EQ(gemm["best_flops_per_s"]["bf16"].get<double>(), r.best_bf16);
  EXPECT_EQ(gemm["source"], "measured");

  const std::string csv = gemm_csv(r, Provenance{});
  EXPECT_EQ(csv.rfind("# date:", 0), 0u);
  EXPECT_NE(csv.find("\ndtype,kind,m,n,k,layout,seconds,gflops_per_s,efficiency,valid,label\n"),
            std::string::npos);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5 + 1 + static_cast<long>(r.points.size()));

  const std::string tables = format_gemm_tables(r, peak);
  for (const char* kind :
       {"square GEMMs", "transformer GEMMs", "expert GEMMs", "offsize GEMMs", "test bf16"})
    EXPECT_NE(tables.find(kind), std::string::npos) << kind;
}

TEST(GemmBench, MergesIntoAProfileKeepingOtherSections) {
  const fs::path dir = fs::path(testing::TempDir()) / "gemm_bench_profile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "profile.json").string();
  Provenance prov;
  prov.host = "testhost";

  // Absent: created with the header.
  const nlohmann::json cpu = {{"kind", "cpu"}, {"name", "Test CPU"}};
  merge_profile_sections(path, {{"gemm", {{"source", "measured"}}}}, prov, cpu);
  nlohmann::json j = nlohmann::json::parse(read_text_file(path));
  EXPECT_EQ(j["format"], "foundry-hardware-profile");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["name"], "testhost");
  EXPECT_TRUE(j.contains("provenance"));
  EXPECT_EQ(j["gemm"]["source"], "measured");

  // Present: other sections kept, ours replaced.
  j["collectives"] = nlohmann::json::array({{{"op", "all_reduce"}}});
  j["name"] = "kept";
  write_file_atomic(path, j.dump());
  merge_profile_sections(
      path, {{"gemm", {{"points", nlohmann::json::array()}}}, {"memory", {{"x", 1}}}}, prov, cpu);
  j = nlohmann::json::parse(read_text_file(path));
  EXPECT_EQ(j["collectives"][0]["op"], "all_reduce");
  EXPECT_EQ(j["name"], "kept");
  EXPECT_TRUE(j["gemm"].contains("points"));
  EXPECT_FALSE(j["gemm"].contains("source"));
  EXPECT_EQ(j["memory"]["x"], 1);

  // Something else: refused and left alone.
  write_file_atomic(path, std::string("{\"model\": {}}"));
  expect_error(
      [&] {
        merge_profile_sections(path, {{"gemm", 1}}, prov, cpu);
      },
      "not a foundry hardware profile");
  EXPECT_EQ(read_text_file(path), "{\"model\": {}}");
  write_file_atomic(path, std::string("{oops"));
  expect_error([&] { merge_profile_sections(path, {{"gemm", 1}}, prov, cpu); }, "not valid JSON");
  EXPECT_EQ(read_text_file(path), "{oops");
  fs::remove_all(dir);
}

// One profile, one device: a GPU's profile takes no CPU figures (nor another CPU's), and the
// file is left as it was.
TEST(GemmBench, AProfileOfAnotherDeviceIsRefused) {
  const fs::path dir = fs::path(testing::TempDir()) / "gemm_bench_device";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "h100.json").string();
  const std::string text = nlohmann::json{{"format", "foundry-hardware-profile"},
                                          {"version", 1},
                                          {"device", {{"kind", "gpu"}, {"name", "H100"}}}}
                               .dump();
  write_file_atomic(path, text);
  expect_error(
      [&] {
        merge_profile_sections(path, {{"gemm", 1}}, Provenance{},
                               {{"kind", "cpu"}, {"name", "EPYC"}});
      },
      "describes the gpu 'H100', and this run measures the cpu 'EPYC'");
  expect_error(
      [&] {
        merge_profile_sections(path, {{"gemm", 1}}, Provenance{},
                               {{"kind", "gpu"}, {"name", "A100"}});
      },
      "the gpu 'A100'");
  EXPECT_EQ(read_text_file(path), text);
  merge_profile_sections(path, {{"gemm", 1}}, Provenance{}, {{"kind", "gpu"}, {"name", "H100"}});
  EXPECT_EQ(nlohmann::json::parse(read_text_file(path))["gemm"], 1);
  fs::remove_all(dir);
}

// What a run did not measure stays: a dtype without a rate, the (dtype, kind) pairs of points
// it did not run, a memory bandwidth a working-set-only run has none of.
TEST(GemmBench, APartialRunKeepsWhatItDidNotMeasure) {
  using nlohmann::json;
  const json old_compute = {{"bf16", {{"measured_flops_per_s", 500e9}}},
                            {"fp32", {{"measured_flops_per_s", 250e9}}}};
  const json fresh_compute = {{"bf16", {{"measured_flops_per_s", nullptr}}},
                              {"fp32", {{"measured_flops_per_s", 260e9}}}};
  const json compute = merged_profile_section("compute", old_compute, fresh_compute);
  EXPECT_EQ(compute["bf16"]["measured_flops_per_s"], 500e9);
  EXPECT_EQ(compute["fp32"]["measured_flops_per_s"], 260e9);

  auto point = [](const char* dtype, const char* kind, int m) {
    return json{{"dtype", dtype}, {"kind", kind}, {"m", m}};
  };
  const json old_gemm = {
      {"points",
       {point("bf16", "square", 1), point("bf16", "decode", 2), point("fp32", "square", 3)}},
      {"best_flops_per_s", {{"bf16", 500e9}, {"fp32", 250e9}}}};
  const json fresh_gemm = {{"points", {point("bf16", "decode", 4)}},
                           {"best_flops_per_s", json::object()}};
  const json gemm = merged_profile_section("gemm", old_gemm, fresh_gemm);
  std::vector<int> ms;
  for (const json& p : gemm["points"]) ms.push_back(p["m"]);
  EXPECT_EQ(ms, (std::vector<int>{4, 1, 3}));
  EXPECT_EQ(gemm["best_flops_per_s"]["bf16"], 500e9);

  const json memory = merged_profile_section(
      "memory", {{"measured_bytes_per_s", 4e10}, {"stream", {1}}, {"working_set", {2}}},
      {{"measured_bytes_per_s", nullptr}, {"stream", json::array()}, {"working_set", {3}}});
  EXPECT_EQ(memory["measured_bytes_per_s"], 4e10);
  EXPECT_EQ(memory["stream"], json({1}));
  EXPECT_EQ(memory["working_set"], json({3}));
}

// Decode products are bound by memory by design: they never set a dtype's best rate.
TEST(GemmBench, DecodeProductsDoNotSetTheBestRate) {
  GemmBenchResult r;
  GemmMeasurement square, decode;
  square.dtype = decode.dtype = DType::bf16;
  square.shape.kind = "square";
  square.flops_per_s = 400e9;
  decode.shape.kind = "decode";
  decode.flops_per_s = 100e9;
  r.points = {decode};
  compute_efficiencies(r);
  EXPECT_EQ(r.best_bf16, 0);
  r.points = {square, decode};
  compute_efficiencies(r);
  EXPECT_DOUBLE_EQ(r.best_bf16, 400e9);
  EXPECT_DOUBLE_EQ(r.points[1].efficiency, 0.25);
}

}  // namespace
}  // namespace foundry
