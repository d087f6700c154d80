// gpu::ops' decode kernels (cuda/decode.h) against the CPU's on fresh random inputs: attention
// over chains of spans of uneven lengths (shared prefixes, grouped query heads), cache stores,
// RoPE at each row's position, and the CCA decode states with several rows of one sequence in
// one step. Outputs are poisoned (NaN) first. Skips where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/decode.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "kernels/attention.h"
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
Chains make_chains(std::vector<Span>& spans, const std::vector<std::vector<int>>& rows) {
  Chains c;
  for (const std::vector<int>& chain : rows) {
    int64_t len = 0;
    for (int s : chain) {
      Span& sp = spans[s];
      c.cpu.push_back({sp.k.data(), sp.v.data(), sp.len, sp.capacity});
      c.gpu.push_back({sp.gk.as<float>(), sp.gv.as<float>(), sp.len, sp.capacity});
      len += sp.len;
    }
    c.first.push_back(static_cast<int64_t>(c.cpu.size()));
    c.longest = std::max(c.longest, len);
  }
  return c;
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
// random (not zero) states; two steps, so that the second starts from the first's states.
TEST(GpuDecode, CcaConvAndValueShiftMatchTheCpuWithRowsSharingAState) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4;
  uint64_t seed = 200;
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{2, 2}, {3, 3}, {1, 2}}) {
    const ops::CcaDims dims{4, 2, 5, t0, t1};
    const int64_t ch = dims.channels(), half = dims.value_half(),
                  floats = ops::decode_state_floats(dims);
    const auto w0 = randn(ch * t0, seed++), b0 = randn(ch, seed++),
               w1 = randn(ch * dims.d * t1, seed++), b1 = randn(ch, seed++);
    std::vector<float> states = randn(2 * floats, seed++);
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

}  // namespace
}  // namespace foundry
