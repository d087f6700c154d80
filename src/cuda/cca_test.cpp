// gpu::ops' CCA kernels against the CPU's (kernels/cca.h) on fresh random inputs: ZAYA1's
// shape (8 query heads, 2 KV heads) at a small head dim, an uneven one (3 KV heads, taps 3 and
// 1), and an odd head dim (5: no row of 4-float accesses, the kernels' one-float path), over
// several sequences so that no convolution reads across a sequence boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/rng.h"
#include "cuda/cca.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "kernels/cca.h"

namespace foundry {
namespace {

using gpu::testing::expect_close;
using gpu::testing::rms;
using gpu::testing::randn;
using gpu::testing::to_device;

gpu::DeviceBuffer poisoned(int64_t floats) { return gpu::testing::poisoned(floats * 4); }
std::vector<float> to_host(const gpu::DeviceBuffer& b, int64_t n) {
  return gpu::testing::to_host<float>(b, n);
}

struct Shape {
  int64_t b, t, hq, hk, d, t0, t1;
};
constexpr Shape kShapes[] = {{3, 17, 8, 2, 16, 2, 2}, {2, 9, 6, 3, 8, 3, 1}, {2, 7, 2, 1, 5, 3, 2}};

TEST(GpuCca, MeansAndQkNormMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t, ch = (s.hq + s.hk) * s.d, heads = s.hq + s.hk;
    const auto c = randn(n * ch, seed++), qk0 = randn(n * ch, seed++), dqk = randn(n * ch, seed++),
               dc0 = randn(n * ch, seed++), temp = randn(s.hk, seed++),
               dq = randn(n * s.hq * s.d, seed++), dk = randn(n * s.hk * s.d, seed++),
               dtemp0 = randn(s.hk, seed++);
    std::vector<float> qk = qk0, dc = dc0, q(n * s.hq * s.d), k(n * s.hk * s.d), rnorm(n * heads),
                       dqk2 = dc0, dtemp = dtemp0;
    ops::cca_means_forward(qk.data(), c.data(), n, s.hq, s.hk, s.d);
    ops::cca_means_backward(dc.data(), dqk.data(), n, s.hq, s.hk, s.d);
    ops::cca_qk_norm_forward(q.data(), k.data(), rnorm.data(), qk.data(), temp.data(), n, s.hq,
                             s.hk, s.d, 1e-6f);
    ops::cca_qk_norm_backward(dqk2.data(), dtemp.data(), dq.data(), dk.data(), qk.data(),
                              rnorm.data(), temp.data(), n, s.hq, s.hk, s.d);

    auto gc = to_device(c), gqk = to_device(qk0), gdqk = to_device(dqk), gdc = to_device(dc0),
         gtemp = to_device(temp), gdq = to_device(dq), gdk = to_device(dk), gdqk2 = to_device(dc0),
         gdtemp = to_device(dtemp0);
    auto gq = poisoned(n * s.hq * s.d), gk = poisoned(n * s.hk * s.d), gr = poisoned(n * heads),
         scratch = poisoned(gpu::ops::cca_qk_norm_scratch(n, s.hk));
    gpu::ops::cca_means_forward(gqk.as<float>(), gc.as<float>(), n, s.hq, s.hk, s.d);
    gpu::ops::cca_means_backward(gdc.as<float>(), gdqk.as<float>(), n, s.hq, s.hk, s.d);
    gpu::ops::cca_qk_norm_forward(gq.as<float>(), gk.as<float>(), gr.as<float>(), gqk.as<float>(),
                                  gtemp.as<float>(), n, s.hq, s.hk, s.d, 1e-6f);
    gpu::ops::cca_qk_norm_backward(gdqk2.as<float>(), gdtemp.as<float>(), gdq.as<float>(),
                                   gdk.as<float>(), gqk.as<float>(), gr.as<float>(),
                                   gtemp.as<float>(), n, s.hq, s.hk, s.d, scratch.as<float>());
    expect_close(to_host(gqk, n * ch), qk, 1e-6, 1e-6, "means qk");
    expect_close(to_host(gdc, n * ch), dc, 1e-6, 1e-6, "means dc");
    expect_close(to_host(gq, n * s.hq * s.d), q, 1e-5, 1e-5, "q");
    expect_close(to_host(gk, n * s.hk * s.d), k, 1e-5, 1e-5, "k");
    expect_close(to_host(gr, n * heads), rnorm, 1e-5, 0, "rnorm");
    expect_close(to_host(gdqk2, n * ch), dqk2, 1e-4, 1e-3, "dqk");
    expect_close(to_host(gdtemp, s.hk), dtemp, 1e-4, 1.0, "dtemp");
  }
}

TEST(GpuCca, ConvolutionsMatchTheCpuForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t, groups = s.hq + s.hk, ch = groups * s.d;
    const auto c = randn(n * ch, seed++), w0 = randn(ch * s.t0, seed++), b0 = randn(ch, seed++),
               w1 = randn(ch * s.d * s.t1, seed++), b1 = randn(ch, seed++),
               dy_out = randn(n * ch, seed++), dz = randn(n * ch, seed++),
               dc0 = randn(n * ch, seed++), dw00 = randn(ch * s.t0, seed++),
               db00 = randn(ch, seed++), dyin0 = randn(n * ch, seed++),
               dw10 = randn(ch * s.d * s.t1, seed++), db10 = randn(ch, seed++),
               dbefore0 = randn(ch, seed++);
    std::vector<float> y(n * ch), z(n * ch), dc = dc0, dw0 = dw00, db0 = db00, dyin = dyin0,
                                             dw1 = dw10, db1 = db10, dbefore = dbefore0;
    ops::cca_depthwise_conv_forward(y.data(), c.data(), w0.data(), b0.data(), s.b, s.t, ch, s.t0);
    // The grouped convolution reads b0 before each sequence, as the model runs it.
    ops::cca_grouped_conv_forward(z.data(), y.data(), w1.data(), b1.data(), b0.data(), s.b, s.t,
                                  groups, s.d, s.t1);
    ops::cca_depthwise_conv_backward(dc.data(), dw0.data(), db0.data(), dy_out.data(), c.data(),
                                     w0.data(), s.b, s.t, ch, s.t0);
    ops::cca_grouped_conv_backward(dyin.data(), dw1.data(), db1.data(), dbefore.data(), dz.data(),
                                   y.data(), w1.data(), b0.data(), s.b, s.t, groups, s.d, s.t1);

    auto gc = to_device(c), gw0 = to_device(w0), gb0 = to_device(b0), gw1 = to_device(w1),
         gb1 = to_device(b1), gdyo = to_device(dy_out), gdz = to_device(dz), gdc = to_device(dc0),
         gdw0 = to_device(dw00), gdb0 = to_device(db00), gdyin = to_device(dyin0),
         gdw1 = to_device(dw10), gdb1 = to_device(db10), gdbefore = to_device(dbefore0);
    auto gy = poisoned(n * ch), gz = poisoned(n * ch),
         s0 = poisoned(gpu::ops::cca_depthwise_conv_scratch(s.b, s.t, ch, s.t0)),
         s1 = poisoned(gpu::ops::cca_grouped_conv_scratch(s.b, s.t, groups, s.d, s.t1));
    gpu::ops::cca_depthwise_conv_forward(gy.as<float>(), gc.as<float>(), gw0.as<float>(),
                                         gb0.as<float>(), s.b, s.t, ch, s.t0);
    auto sf = poisoned(gpu::ops::cca_grouped_conv_forward_scratch(s.b, s.t, groups, s.d, s.t1));
    gpu::ops::cca_grouped_conv_forward(gz.as<float>(), gy.as<float>(), gw1.as<float>(),
                                       gb1.as<float>(), gb0.as<float>(), s.b, s.t, groups, s.d,
                                       s.t1, sf.as<float>());
    gpu::ops::cca_depthwise_conv_backward(gdc.as<float>(), gdw0.as<float>(), gdb0.as<float>(),
                                          gdyo.as<float>(), gc.as<float>(), gw0.as<float>(), s.b,
                                          s.t, ch, s.t0, s0.as<float>());
    gpu::ops::cca_grouped_conv_backward(gdyin.as<float>(), gdw1.as<float>(), gdb1.as<float>(),
                                        gdbefore.as<float>(), gdz.as<float>(), gy.as<float>(),
                                        gw1.as<float>(), gb0.as<float>(), s.b, s.t, groups, s.d,
                                        s.t1, s1.as<float>());
    expect_close(to_host(gy, n * ch), y, 1e-5, 1e-4, "depthwise y");
    expect_close(to_host(gz, n * ch), z, 1e-4, 1e-2, "grouped z");
    {  // without a bias (the fused QK-norm kernel adds it)
      auto gz0 = poisoned(n * ch);
      gpu::ops::cca_grouped_conv_forward(gz0.as<float>(), gy.as<float>(), gw1.as<float>(), nullptr,
                                         gb0.as<float>(), s.b, s.t, groups, s.d, s.t1,
                                         sf.as<float>());
      std::vector<float> z0 = z;
      for (int64_t i = 0; i < n * ch; ++i) z0[i] -= b1[i % ch];
      expect_close(to_host(gz0, n * ch), z0, 1e-4, 1e-2, "grouped z without bias");
    }
    // dc is the accumulated dc0 plus signed products of unit-sized terms: errors scale with them.
    expect_close(to_host(gdc, n * ch), dc, 1e-5, rms(dc), "depthwise dc");
    expect_close(to_host(gdw0, ch * s.t0), dw0, 1e-4, 1e-2, "dw0");
    expect_close(to_host(gdb0, ch), db0, 1e-4, 1e-2, "db0");
    expect_close(to_host(gdyin, n * ch), dyin, 1e-4, 1e-2, "grouped dy");
    expect_close(to_host(gdw1, ch * s.d * s.t1), dw1, 1e-4, 1e-2, "dw1");
    expect_close(to_host(gdb1, ch), db1, 1e-4, 1e-2, "db1");
    expect_close(to_host(gdbefore, ch), dbefore, 1e-4, 1e-2, "dbefore (b0 through the padding)");
  }
}

TEST(GpuCca, ValueShiftMovesTheSecondHalfOnePositionWithinEachSequence) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 3, t = 11, half = 24;
  const auto v0 = randn(b * t * 2 * half, 7), dv0 = randn(b * t * 2 * half, 8);
  std::vector<float> v = v0, dv = dv0, last(b * half);
  ops::cca_value_shift_inplace_forward(v.data(), last.data(), b, t, half);
  ops::cca_value_shift_inplace_backward(dv.data(), b, t, half);
  auto gv = to_device(v0), gdv = to_device(dv0), glast = poisoned(b * half);
  gpu::ops::cca_value_shift_inplace_forward(gv.as<float>(), glast.as<float>(), b, t, half);
  gpu::ops::cca_value_shift_inplace_backward(gdv.as<float>(), b, t, half);
  EXPECT_EQ(to_host(gv, b * t * 2 * half), v);  // moves: exact
  EXPECT_EQ(to_host(glast, b * half), last);
  EXPECT_EQ(to_host(gdv, b * t * 2 * half), dv);
}

}  // namespace
}  // namespace foundry
