// gpu::ops' decode kernels (cuda/decode.h) against the CPU's on fresh random inputs: attention
// over chains of spans of uneven lengths (shared prefixes, grouped query heads; per row and by
// groups of rows sharing a span), cache stores, RoPE at each row's position, and the CCA decode
// states with several rows of one sequence in one step. Outputs are poisoned (NaN) first. Skips
// where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/decode.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/cca.h"
#include "kernels/ops.h"

namespace foundry {
namespace {

using gpu::testing::expect_close;
using gpu::testing::randn;
using gpu::testing::rms;
using gpu::testing::to_device;

gpu::DeviceBuffer poisoned(int64_t floats) { return gpu::testing::poisoned(floats * 4); }
std::vector<float> to_host(const gpu::DeviceBuffer& b, int64_t n) {
  return gpu::testing::to_host<float>(b, n);
}

// One span's k and v on the host and on the device, the same values.
struct Span {
  int64_t len, capacity;
  std::vector<float> k, v;
  gpu::DeviceBuffer gk, gv;
};

// Spans of (len, capacity) for kvh heads of d dims, random. With `nan_tail`, the positions at
// len and after are NaN: a kernel that reads past a span's length fails the comparison.
std::vector<Span> make_spans(const std::vector<std::pair<int64_t, int64_t>>& shapes, int64_t kvh,
                             int64_t d, bool nan_tail, uint64_t seed) {
  std::vector<Span> spans;
  for (auto [len, capacity] : shapes) {
    const int64_t padded = (capacity + 15) / 16 * 16, head = padded * d;
    Span s{len, capacity, randn(kvh * head, seed++), randn(kvh * head, seed++), {}, {}};
    if (nan_tail)
      for (int64_t g = 0; g < kvh; ++g)
        for (int64_t t = len; t < padded; ++t)
          for (int64_t i = 0; i < d; ++i) {
            s.k[g * head + (t / 16) * 16 * d + i * 16 + t % 16] = NAN;
            s.v[g * head + t * d + i] = NAN;
          }
    s.gk = to_device(s.k);
    s.gv = to_device(s.v);
    spans.push_back(std::move(s));
  }
  return spans;
}

// Each row's chain of span indices, flattened: the CPU's and the GPU's descriptors and first.
struct Chains {
  std::vector<ops::DecodeSpan> cpu;
  std::vector<gpu::ops::DecodeSpan> gpu;
  std::vector<int64_t> first{0};
  int64_t longest = 0;
};
// A chain entry that reads span s to `len` positions (rows of one sequence in one step read
// its last span to successive lengths).
struct Read {
  int s;
  int64_t len;
};
Chains make_chains(std::vector<Span>& spans, const std::vector<std::vector<Read>>& rows) {
  Chains c;
  for (const std::vector<Read>& chain : rows) {
    int64_t len = 0;
    for (Read e : chain) {
      Span& sp = spans[e.s];
      c.cpu.push_back({sp.k.data(), sp.v.data(), e.len, sp.capacity});
      c.gpu.push_back({sp.gk.as<float>(), sp.gv.as<float>(), e.len, sp.capacity});
      len += e.len;
    }
    c.first.push_back(static_cast<int64_t>(c.cpu.size()));
    c.longest = std::max(c.longest, len);
  }
  return c;
}
// Each span read to its whole length.
Chains make_chains(std::vector<Span>& spans, const std::vector<std::vector<int>>& rows) {
  std::vector<std::vector<Read>> reads;
  for (const std::vector<int>& chain : rows) {
    reads.emplace_back();
    for (int s : chain) reads.back().push_back({s, spans[s].len});
  }
  return make_chains(spans, reads);
}

// Six rows over spans of lengths that are not multiples of 16: chains of 1 to 3 spans, span 0
// a prefix of rows 0, 1 and 3 (rows 0 and 3 the same chain), span 3 at different depths.
const std::vector<std::pair<int64_t, int64_t>> kSpanShapes = {{37, 40}, {5, 21}, {19, 19},
                                                               {1, 3},   {50, 64}, {23, 30}};
const std::vector<std::vector<int>> kChains = {{0, 1}, {0, 2, 3}, {4}, {0, 1}, {5, 3}, {3}};

TEST(GpuDecode, AttentionOverChainsOfSpansMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t h = 4, kvh = 2;
  uint64_t seed = 1;
  for (int64_t d : {64, 80}) {
    std::vector<Span> spans = make_spans(kSpanShapes, kvh, d, true, seed);
    seed += 100;
    const Chains c = make_chains(spans, kChains);
    const int64_t rows = static_cast<int64_t>(kChains.size()), max_len = c.longest + 9;
    const auto q = randn(rows * h * d, seed++);
    std::vector<float> out(rows * h * d), scores(rows * h * max_len);
    ops::attention_decode_rows(out.data(), scores.data(), max_len, q.data(), c.cpu.data(),
                               c.first.data(), rows, h, kvh, d);

    auto gq = to_device(q), gspans = to_device(c.gpu), gfirst = to_device(c.first);
    auto gout = poisoned(rows * h * d), gscores = poisoned(rows * h * max_len);
    auto run = [&] {
      gpu::ops::attention_decode_rows(gout.as<float>(), gscores.as<float>(), max_len,
                                      gq.as<float>(), gspans.as<gpu::ops::DecodeSpan>(),
                                      gfirst.as<int64_t>(), rows, h, kvh, d);
      return to_host(gout, rows * h * d);
    };
    const std::vector<float> first_run = run();
    expect_close(first_run, out, 1e-5, rms(out), "attention out");
    // Deterministic: the same bits again.
    const std::vector<float> second_run = run();
    EXPECT_EQ(0, std::memcmp(first_run.data(), second_run.data(), first_run.size() * 4));
  }
}

// The grouped path (decode.h: plan_attention_decode, attention_decode_grouped): 40 rows share
// a 1,000-position prefix (span 0), so its chunks go in parts of at most 16 rows; rows 0–39
// then read an own span each (lengths not multiples of 16 or 32), rows 40–45 are a run of one
// sequence reading span 1 to lengths 7 … 12 behind an empty span, row 46 reads a 600-position
// span alone, row 47 a single position. Then the same through the backend, which plans alike:
// the same bits.
TEST(GpuDecode, GroupedAttentionOverASharedPrefixMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Heads {
    int64_t h, kvh, d;
  };
  uint64_t seed = 300;
  for (Heads hd : {Heads{8, 2, 64}, Heads{8, 1, 80}, Heads{3, 3, 80}, Heads{4, 2, 42}}) {
    const int64_t h = hd.h, kvh = hd.kvh, d = hd.d;
    std::vector<std::pair<int64_t, int64_t>> shapes = {{1000, 1003}, {12, 20}, {0, 16}, {600, 610}};
    for (int64_t r = 0; r < 40; ++r) shapes.push_back({1 + (r * 37) % 71, 80});
    std::vector<Span> spans = make_spans(shapes, kvh, d, true, seed);
    seed += 100;
    std::vector<std::vector<Read>> reads;
    for (int r = 0; r < 40; ++r) reads.push_back({{0, 1000}, {4 + r, spans[4 + r].len}});
    for (int64_t len = 7; len <= 12; ++len) reads.push_back({{2, 0}, {1, len}});
    reads.push_back({{3, 600}});
    reads.push_back({{4, 1}});
    const Chains c = make_chains(spans, reads);
    const int64_t rows = static_cast<int64_t>(reads.size()), max_len = c.longest;
    const auto q = randn(rows * h * d, seed++);
    std::vector<float> out(rows * h * d), scores(rows * h * max_len);
    ops::attention_decode_rows(out.data(), scores.data(), max_len, q.data(), c.cpu.data(),
                               c.first.data(), rows, h, kvh, d);

    const gpu::ops::DecodePlan plan =
        gpu::ops::plan_attention_decode(c.gpu.data(), c.first.data(), rows, h, kvh);
    int64_t prefix_items = 0, prefix_rows = 0;
    for (const gpu::ops::DecodeWork& w : plan.work)
      if (w.span.k == c.gpu[0].k) ++prefix_items, prefix_rows += w.rows;
    EXPECT_EQ(prefix_rows, 4 * 40);  // chunks of 256, 256, 256 and 232 positions, 40 rows each
    EXPECT_GT(prefix_items, 4);      // in parts
    ASSERT_GE(gpu::ops::attention_decode_query_cap(d), plan.queries);

    auto gq = to_device(q), gwork = to_device(plan.work), grows = to_device(plan.work_rows),
         gslots = to_device(plan.slots);
    auto gout = poisoned(rows * h * d),
         partials = poisoned(gpu::ops::attention_decode_partials(plan, h, d));
    auto run = [&] {
      gpu::ops::attention_decode_grouped(
          gout.as<float>(), partials.as<float>(), gq.as<float>(), gwork.as<gpu::ops::DecodeWork>(),
          static_cast<int64_t>(plan.work.size()), grows.as<gpu::ops::DecodeWorkRow>(),
          gslots.as<int32_t>(), rows, h, kvh, d, plan.queries);
      return to_host(gout, rows * h * d);
    };
    const std::vector<float> first_run = run();
    expect_close(first_run, out, 1e-5, rms(out), "grouped attention out");
    const std::vector<float> second_run = run();
    EXPECT_EQ(0, std::memcmp(first_run.data(), second_run.data(), first_run.size() * 4));

    std::unique_ptr<Backend> backend = gpu::make_cuda_backend(0, "test");
    std::vector<ops::DecodeSpan> device_spans;
    for (const gpu::ops::DecodeSpan& s : c.gpu)
      device_spans.push_back({s.k, s.v, s.len, s.capacity});
    auto bout = poisoned(rows * h * d), bscores = poisoned(rows * h * max_len);
    backend->attention_decode_rows(bout.as<float>(), bscores.as<float>(), max_len, gq.as<float>(),
                                   device_spans.data(), c.first.data(), rows, h, kvh, d);
    const std::vector<float> backend_run = to_host(bout, rows * h * d);
    EXPECT_EQ(0, std::memcmp(first_run.data(), backend_run.data(), first_run.size() * 4));
  }
}

TEST(GpuDecode, KvStoreThenAttentionMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t h = 4, kvh = 2, d = 80;
  // Each row's last span is its own and takes the new position at its last index; span 0 is a
  // prefix of rows 0 and 2.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{21, 21}, {6, 20}, {17, 33},
                                                            {1, 16},  {40, 45}};
  const std::vector<std::vector<int>> chains = {{0, 1}, {2}, {0, 3}, {4}};
  std::vector<Span> spans = make_spans(shapes, kvh, d, false, 50);
  const Chains c = make_chains(spans, chains);
  const int64_t rows = static_cast<int64_t>(chains.size()), max_len = c.longest + 3;
  std::vector<int64_t> store_at;
  std::vector<ops::DecodeSpan> cpu_last;
  std::vector<gpu::ops::DecodeSpan> gpu_last;
  for (int64_t r = 0; r < rows; ++r) {
    cpu_last.push_back(c.cpu[c.first[r + 1] - 1]);
    gpu_last.push_back(c.gpu[c.first[r + 1] - 1]);
    store_at.push_back(cpu_last.back().len - 1);
  }
  const auto k = randn(rows * kvh * d, 60), v = randn(rows * kvh * d, 61),
             q = randn(rows * h * d, 62);
  for (int64_t r = 0; r < rows; ++r)
    ops::decode_span_store(cpu_last[r], store_at[r], k.data() + r * kvh * d,
                           v.data() + r * kvh * d, kvh, d);
  std::vector<float> out(rows * h * d), scores(rows * h * max_len);
  ops::attention_decode_rows(out.data(), scores.data(), max_len, q.data(), c.cpu.data(),
                             c.first.data(), rows, h, kvh, d);

  auto gk = to_device(k), gv = to_device(v), gq = to_device(q), glast = to_device(gpu_last),
       gat = to_device(store_at), gspans = to_device(c.gpu), gfirst = to_device(c.first);
  gpu::ops::decode_kv_store(glast.as<gpu::ops::DecodeSpan>(), gat.as<int64_t>(), gk.as<float>(),
                            gv.as<float>(), rows, kvh, d);
  auto gout = poisoned(rows * h * d), gscores = poisoned(rows * h * max_len);
  gpu::ops::attention_decode_rows(gout.as<float>(), gscores.as<float>(), max_len, gq.as<float>(),
                                  gspans.as<gpu::ops::DecodeSpan>(), gfirst.as<int64_t>(), rows,
                                  h, kvh, d);
  for (const Span& s : spans) {  // copies: exact, and nothing else written
    EXPECT_EQ(to_host(s.gk, static_cast<int64_t>(s.k.size())), s.k);
    EXPECT_EQ(to_host(s.gv, static_cast<int64_t>(s.v.size())), s.v);
  }
  expect_close(to_host(gout, rows * h * d), out, 1e-5, rms(out), "attention out");
}

TEST(GpuDecode, RopeAtEachRowsPositionIsRopeApplyPerRow) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 5, h = 3, d = 64;
  const std::vector<int64_t> pos = {0, 7, 1000, 31, 123456};
  for (int64_t rotary : {64, 48, 0}) {
    const auto x0 = randn(rows * h * d, 70);
    std::vector<float> x = x0;
    for (int64_t r = 0; r < rows; ++r)
      ops::rope_apply(x.data() + r * h * d, 1, 1, h, d, rotary, pos[r], 10000.0, false);
    auto gx = to_device(x0), gpos = to_device(pos), gper_row = to_device(x0);
    gpu::ops::rope_apply_rows(gx.as<float>(), gpos.as<int64_t>(), rows, h, d, rotary, 10000.0);
    for (int64_t r = 0; r < rows; ++r)
      gpu::ops::rope_apply(gper_row.as<float>() + r * h * d, 1, 1, h, d, rotary, pos[r], 10000.0,
                           false);
    const std::vector<float> rotated = to_host(gx, rows * h * d);
    expect_close(rotated, x, 1e-5, 1e-3, "rope rows");
    EXPECT_EQ(rotated, to_host(gper_row, rows * h * d));  // the GPU's rope_apply's bits
  }
}

TEST(GpuDecode, AddIsTheSum) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1001;
  const auto y0 = randn(n, 80), x = randn(n, 81);
  std::vector<float> y = y0;
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  auto gy = to_device(y0), gx = to_device(x);
  gpu::ops::add(gy.as<float>(), gx.as<float>(), n);
  gpu::ops::add(gy.as<float>(), gx.as<float>(), 0);  // nothing
  EXPECT_EQ(to_host(gy, n), y);
}

// Four rows of one step: rows 0–2 successive tokens of sequence A, row 3 of sequence B, from
// random states and from zero ones (sequences' starts, where both read b0 before position 0);
// two steps, so that the second starts from the first's states.
TEST(GpuDecode, CcaConvAndValueShiftMatchTheCpuWithRowsSharingAState) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4;
  uint64_t seed = 200;
  for (bool zero_start : {false, true})
    for (auto [t0, t1] : {std::pair<int64_t, int64_t>{2, 2}, {3, 3}, {1, 2}}) {
      SCOPED_TRACE(::testing::Message() << "t0 " << t0 << " t1 " << t1 << " zero " << zero_start);
      const ops::CcaDims dims{4, 2, 5, t0, t1};
      const int64_t ch = dims.channels(), half = dims.value_half(),
                    floats = ops::decode_state_floats(dims);
      const auto w0 = randn(ch * t0, seed++), b0 = randn(ch, seed++),
                 w1 = randn(ch * dims.d * t1, seed++), b1 = randn(ch, seed++);
      std::vector<float> states = randn(2 * floats, seed++);
      if (zero_start) std::fill(states.begin(), states.end(), 0.0f);
      const std::vector<float*> cpu_states = {states.data(), states.data(), states.data(),
                                              states.data() + floats};
      auto gw0 = to_device(w0), gb0 = to_device(b0), gw1 = to_device(w1), gb1 = to_device(b1),
           gstates = to_device(states);
      float* const gbase = gstates.as<float>();
      auto gstate_rows = to_device(std::vector<float*>{gbase, gbase, gbase, gbase + floats});
      for (int step = 0; step < 2; ++step) {
        const auto c_new = randn(rows * ch, seed++), v0 = randn(rows * 2 * half, seed++);
        std::vector<float> qk(rows * ch), v = v0;
        ops::cca_conv_decode(qk.data(), dims, cpu_states.data(), rows, c_new.data(), w0.data(),
                             b0.data(), w1.data(), b1.data());
        ops::cca_value_shift_decode(v.data(), dims, cpu_states.data(), rows);

        auto gc = to_device(c_new), gv = to_device(v0);
        auto gqk = poisoned(rows * ch), window = poisoned(rows * ch * t1);
        gpu::ops::cca_conv_decode(gqk.as<float>(), window.as<float>(), gstate_rows.as<float*>(),
                                  rows, dims.hq, dims.hk, dims.d, t0, t1, gc.as<float>(),
                                  gw0.as<float>(), gb0.as<float>(), gw1.as<float>(),
                                  gb1.as<float>());
        gpu::ops::cca_value_shift_decode(gv.as<float>(), gstate_rows.as<float*>(), rows, dims.hq,
                                         dims.hk, dims.d, t0, t1);
        expect_close(to_host(gqk, rows * ch), qk, 1e-5, rms(qk), "qk");
        EXPECT_EQ(to_host(gv, rows * 2 * half), v);  // swaps: exact
        // c_hist and v_prev are copies, y_hist the depthwise sums.
        expect_close(to_host(gstates, 2 * floats), states, 1e-5, rms(states), "states");
      }
    }
}

// The grouped attention's work plan (host code, tested in every build): each row's positions
// in each span of its chain are covered exactly once, by work items in chain order that each
// take their slot of the row's consecutive slots; a span that many rows share is split into
// parts of at most kDecodeGroupRows rows and kDecodeGroupQueries queries and read once per
// part, not once per row; rows reading one span to different lengths share its items.
TEST(DecodeWorkPlan, CoversEveryRowsPositionsOnceInChainOrder) {
  std::vector<float> storage(16);  // spans are told apart by their pointers alone
  auto span = [&](int i, int64_t len, int64_t capacity) {
    return gpu::ops::DecodeSpan{&storage[i], &storage[i] + 1, len, capacity};
  };
  std::vector<gpu::ops::DecodeSpan> spans;
  std::vector<int64_t> first = {0};
  for (int r = 0; r < 40; ++r) {  // a 1,000-position prefix, then one of three spans
    spans.push_back(span(0, 1000, 1000));
    spans.push_back(span(1 + r % 3, 1 + 37 * r % 300, 400));
    first.push_back(static_cast<int64_t>(spans.size()));
  }
  for (int r = 0; r < 6; ++r) {  // a run: an empty span, then one span to lengths 7 … 12
    spans.push_back(span(5, 0, 16));
    spans.push_back(span(6, 7 + r, 32));
    first.push_back(static_cast<int64_t>(spans.size()));
  }
  const int64_t rows = static_cast<int64_t>(first.size()) - 1, h = 8, kvh = 2;
  const gpu::ops::DecodePlan plan =
      gpu::ops::plan_attention_decode(spans.data(), first.data(), rows, h, kvh);

  // Per row: the (span, begin, end) its slots read, by slot.
  struct Read {
    const float* k = nullptr;
    int64_t begin = -1, end = -1;
  };
  std::vector<std::vector<Read>> reads(rows);
  for (int64_t r = 0; r < rows; ++r) reads[r].resize(plan.slots[r + 1] - plan.slots[r]);
  int64_t prefix_items = 0;
  for (const gpu::ops::DecodeWork& w : plan.work) {
    EXPECT_LE(w.rows, gpu::ops::kDecodeGroupRows);
    EXPECT_LE(w.rows * (h / kvh), std::max<int64_t>(h / kvh, gpu::ops::kDecodeGroupQueries));
    EXPECT_LE(w.end - w.begin, gpu::ops::kDecodeChunk);
    EXPECT_EQ(w.begin % gpu::ops::kDecodeChunk, 0);  // a fixed grid: alike beside any rows
    if (w.span.k == &storage[0]) ++prefix_items;
    for (int32_t i = w.rows_at; i < w.rows_at + w.rows; ++i) {
      const gpu::ops::DecodeWorkRow& wr = plan.work_rows[i];
      ASSERT_GE(wr.slot, plan.slots[wr.row]);
      ASSERT_LT(wr.slot, plan.slots[wr.row + 1]);
      Read& read = reads[wr.row][wr.slot - plan.slots[wr.row]];
      EXPECT_EQ(read.k, nullptr) << "slot taken twice";
      read = {w.span.k, w.begin, wr.end};
      EXPECT_LE(wr.end, w.end);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // the slots walk the chain's positions in order
    size_t slot = 0;
    for (int64_t s = first[r]; s < first[r + 1]; ++s)
      for (int64_t at = 0; at < spans[s].len;) {
        ASSERT_LT(slot, reads[r].size()) << "row " << r;
        const Read& read = reads[r][slot++];
        EXPECT_EQ(read.k, spans[s].k) << "row " << r << " slot " << slot - 1;
        EXPECT_EQ(read.begin, at) << "row " << r;
        ASSERT_GT(read.end, at) << "row " << r;
        at = read.end;
      }
    EXPECT_EQ(slot, reads[r].size()) << "row " << r;
  }
  // 40 rows × 4 query heads a KV head, in parts of at most 16 rows as even as they go (13, 13,
  // 14): 3 parts per chunk of the prefix.
  const int64_t chunks = (1000 + gpu::ops::kDecodeChunk - 1) / gpu::ops::kDecodeChunk;
  EXPECT_EQ(prefix_items, 3 * chunks);
  EXPECT_EQ(plan.queries, 14 * (h / kvh));
  int64_t run_items = 0;
  for (const gpu::ops::DecodeWork& w : plan.work) run_items += w.span.k == &storage[6];
  EXPECT_EQ(run_items, 1);  // the run's six rows read their span in one item

  // A GPU whose shared memory holds 8 queries a block: parts of 2 rows.
  const gpu::ops::DecodePlan small =
      gpu::ops::plan_attention_decode(spans.data(), first.data(), rows, h, kvh, 8);
  int64_t small_prefix_items = 0;
  for (const gpu::ops::DecodeWork& w : small.work) {
    EXPECT_LE(w.rows, 2);
    small_prefix_items += w.span.k == &storage[0];
  }
  EXPECT_EQ(small_prefix_items, 20 * chunks);
  EXPECT_EQ(small.queries, 8);
}

}  // namespace
}  // namespace foundry
