// gpu::ops' ZAYA1 router and residual-scaling kernels against the CPU's
// (kernels/zaya_router.h) on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "base/bf16.h"
#include "base/rng.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "cuda/zaya.h"
#include "kernels/zaya_router.h"

namespace foundry {
namespace {

using gpu::testing::expect_close;
using gpu::testing::rms;
using gpu::testing::poisoned;
using gpu::testing::randn;
using gpu::testing::to_device;
using gpu::testing::to_host;

void check_bias_gelu_and_eda(int64_t n, int64_t m) {
  SCOPED_TRACE(::testing::Message() << n << "x" << m);
  const auto y0 = randn(n * m, 1), bias = randn(m, 2), dbias0 = randn(m, 3), a = randn(n * m, 4, 2),
             dout = randn(n * m, 5), r0 = randn(n * m, 6), r_prev = randn(n * m, 7),
             gamma = randn(m, 8), dr = randn(n * m, 9), dr_prev0 = randn(n * m, 10),
             dgamma0 = randn(m, 11);
  std::vector<float> y = y0, dbias = dbias0, g(n * m), da(n * m), r = r0, dr_prev = dr_prev0,
                     dgamma = dgamma0;
  ops::bias_add_forward(y.data(), bias.data(), n, m);
  ops::bias_add_backward(dbias.data(), dout.data(), n, m);
  ops::gelu_forward(g.data(), a.data(), n, m);
  ops::gelu_backward(da.data(), dout.data(), a.data(), n, m);
  ops::eda_forward(r.data(), r_prev.data(), gamma.data(), n, m);
  ops::eda_backward(dr_prev.data(), dgamma.data(), dr.data(), r_prev.data(), gamma.data(), n, m);

  auto gy = to_device(y0), gb = to_device(bias), gdb = to_device(dbias0), ga = to_device(a),
       gdout = to_device(dout), gr = to_device(r0), grp = to_device(r_prev),
       ggamma = to_device(gamma), gdr = to_device(dr), gdrp = to_device(dr_prev0),
       gdg = to_device(dgamma0);
  auto gg = poisoned(n * m * 4), gda = poisoned(n * m * 4),
       scratch = poisoned(gpu::ops::column_sum_scratch(n, m) * 4);
  gpu::ops::bias_add_forward(gy.as<float>(), gb.as<float>(), n, m);
  gpu::ops::bias_add_backward(gdb.as<float>(), gdout.as<float>(), n, m, scratch.as<float>());
  gpu::ops::gelu_forward(gg.as<float>(), ga.as<float>(), n, m);
  gpu::ops::gelu_backward(gda.as<float>(), gdout.as<float>(), ga.as<float>(), n, m);
  gpu::ops::eda_forward(gr.as<float>(), grp.as<float>(), ggamma.as<float>(), n, m);
  gpu::ops::eda_backward(gdrp.as<float>(), gdg.as<float>(), gdr.as<float>(), grp.as<float>(),
                         ggamma.as<float>(), n, m, scratch.as<float>());
  expect_close(to_host<float>(gy, n * m), y, 1e-6, 1e-6, "bias_add");
  expect_close(to_host<float>(gdb, m), dbias, 1e-5, 1e-1, "dbias");
  // Each side's fp32 GELU is within 4e-7·(1+|x|) of exact (the CPU's test sweeps its erf and
  // exp; the GPU's are the CUDA library's): together within 8e-7·(1+|x|), times |dout| below.
  const auto g_gpu = to_host<float>(gg, n * m), da_gpu = to_host<float>(gda, n * m);
  for (int64_t i = 0; i < n * m; ++i) {
    const double bound = 8e-7 * (1 + std::abs(a[i]));
    ASSERT_LE(std::abs(g_gpu[i] - g[i]), bound) << "gelu[" << i << "] at x " << a[i];
    ASSERT_LE(std::abs(da_gpu[i] - da[i]), bound * std::abs(dout[i])) << "dgelu[" << i << "]";
  }
  expect_close(to_host<float>(gr, n * m), r, 1e-6, 1e-6, "eda");
  expect_close(to_host<float>(gdrp, n * m), dr_prev, 1e-6, 1e-6, "dr_prev");
  expect_close(to_host<float>(gdg, m), dgamma, 1e-5, 1e-1, "dgamma");
}

TEST(GpuZaya, BiasGeluAndEdaMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  check_bias_gelu_and_eda(77, 130);  // rows of 130: a float a thread
  check_bias_gelu_and_eda(40, 256);  // the router's 256: 4 floats a thread, 4 rows a block
}

TEST(GpuZaya, GatingChoosesAndCountsLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto [e, k, skip, passes, on_logits] :
       {std::tuple<int64_t, int64_t, bool, bool, bool>{8, 1, true, false, false},
        {8, 2, true, true, true}, {16, 4, false, false, true}, {4, 5, true, false, false}}) {
    const int64_t n = 203, classes = e + (skip ? 1 : 0);
    const auto logits = randn(n * classes, 20 + e + k, 1.5), bias = randn(classes, 21, 0.05),
               dgate = randn(n * k, 22);
    std::vector<float> probs(n * classes), gate(n * k), dlogits(n * classes);
    std::vector<int32_t> choice(n * k);
    std::vector<int64_t> counts(classes), near(classes);
    const ops::BiasOn bias_on = on_logits ? ops::BiasOn::logits : ops::BiasOn::probs;
    ops::zaya_gating_forward(probs.data(), choice.data(), gate.data(), logits.data(), bias.data(),
                             bias_on, n, e, k, skip, passes);
    ops::zaya_gating_backward(dlogits.data(), dgate.data(), probs.data(), choice.data(), n, e, k,
                              skip, passes);
    ops::zaya_class_counts(counts.data(), choice.data(), n, k, classes);
    ops::zaya_boundary_counts(near.data(), probs.data(), logits.data(), bias.data(), bias_on,
                              choice.data(), n, classes, k, 0.05);

    auto gl = to_device(logits), gbias = to_device(bias), gdg = to_device(dgate);
    auto gp = poisoned(n * classes * 4), gc = poisoned(n * k * 4), gw = poisoned(n * k * 4),
         gdl = poisoned(n * classes * 4), gcounts = poisoned(classes * 8),
         gnear = poisoned(classes * 8);
    gpu::ops::zaya_gating_forward(gp.as<float>(), gc.as<int32_t>(), gw.as<float>(), gl.as<float>(),
                                  gbias.as<float>(), on_logits, n, e, k, skip, passes);
    gpu::ops::zaya_gating_backward(gdl.as<float>(), gdg.as<float>(), gp.as<float>(),
                                   gc.as<int32_t>(), n, e, k, skip, passes);
    gpu::ops::zaya_class_counts(gcounts.as<int64_t>(), gc.as<int32_t>(), n, k, classes);
    gpu::ops::zaya_boundary_counts(gnear.as<int64_t>(), gp.as<float>(), gl.as<float>(),
                                   gbias.as<float>(), on_logits, gc.as<int32_t>(), n, classes, k,
                                   0.05);
    expect_close(to_host<float>(gp, n * classes), probs, 1e-5, 1e-6, "probs");
    EXPECT_EQ(to_host<int32_t>(gc, n * k), choice);
    expect_close(to_host<float>(gw, n * k), gate, 1e-5, 1e-6, "gate");
    // From each side's own probabilities (within 1e-5 above), through a softmax's cancelling
    // sum: the scale is dlogits' typical size.
    expect_close(to_host<float>(gdl, n * classes), dlogits, 3e-5, rms(dlogits), "dlogits");
    EXPECT_EQ(to_host<int64_t>(gcounts, classes), counts);
    EXPECT_EQ(to_host<int64_t>(gnear, classes), near);
  }
}

void check_residual_scaling(int64_t n, int64_t c) {
  SCOPED_TRACE(::testing::Message() << n << "x" << c);
  const auto res = randn(n * c, 30), h = randn(n * c, 31), ar = randn(c, 32), br = randn(c, 33),
             ah = randn(c, 34), bh = randn(c, 35), dout = randn(n * c, 36), dar0 = randn(c, 37),
             dbr0 = randn(c, 38), dah0 = randn(c, 39), dbh0 = randn(c, 40);
  std::vector<float> out(n * c), dres(n * c), dh(n * c), dar = dar0, dbr = dbr0, dah = dah0,
                                                          dbh = dbh0;
  ops::residual_scale_forward(out.data(), res.data(), h.data(), ar.data(), br.data(), ah.data(),
                              bh.data(), n, c);
  ops::residual_scale_backward(dres.data(), dh.data(), dar.data(), dbr.data(), dah.data(),
                               dbh.data(), dout.data(), res.data(), h.data(), ar.data(), br.data(),
                               ah.data(), bh.data(), n, c);
  auto gres = to_device(res), gh = to_device(h), gar = to_device(ar), gbr = to_device(br),
       gah = to_device(ah), gbh = to_device(bh), gdout = to_device(dout), gdar = to_device(dar0),
       gdbr = to_device(dbr0), gdah = to_device(dah0), gdbh = to_device(dbh0);
  auto gout = poisoned(n * c * 4), gdres = poisoned(n * c * 4), gdh = poisoned(n * c * 4),
       scratch = poisoned(gpu::ops::column_sum_scratch(n, 3 * c) * 4);
  gpu::ops::residual_scale_forward(gout.as<float>(), gres.as<float>(), gh.as<float>(),
                                   gar.as<float>(), gbr.as<float>(), gah.as<float>(),
                                   gbh.as<float>(), n, c);
  gpu::ops::residual_scale_backward(gdres.as<float>(), gdh.as<float>(), gdar.as<float>(),
                                    gdbr.as<float>(), gdah.as<float>(), gdbh.as<float>(),
                                    gdout.as<float>(), gres.as<float>(), gh.as<float>(),
                                    gar.as<float>(), gbr.as<float>(), gah.as<float>(),
                                    gbh.as<float>(), n, c, scratch.as<float>());
  expect_close(to_host<float>(gout, n * c), out, 1e-5, 1e-4, "out");
  expect_close(to_host<float>(gdres, n * c), dres, 1e-6, 1e-6, "dres");
  expect_close(to_host<float>(gdh, n * c), dh, 1e-6, 1e-6, "dh");
  expect_close(to_host<float>(gdar, c), dar, 1e-5, 1e-1, "dalpha_res");
  expect_close(to_host<float>(gdbr, c), dbr, 1e-5, 1e-1, "dbeta_res");
  expect_close(to_host<float>(gdah, c), dah, 1e-5, 1e-1, "dalpha_h");
  expect_close(to_host<float>(gdbh, c), dbh, 1e-5, 1e-1, "dbeta_h");

  // Without dres, dh as float and as bf16 (the CPU's rounding of the same products).
  for (bool bf16_dh : {false, true}) {
    std::vector<float> pdh(n * c), par = dar0, pbr = dbr0, pah = dah0, pbh = dbh0;
    ops::residual_scale_backward_params(pdh.data(), par.data(), pbr.data(), pah.data(),
                                        pbh.data(), dout.data(), res.data(), h.data(), ar.data(),
                                        br.data(), ah.data(), bh.data(), n, c);
    auto qar = to_device(dar0), qbr = to_device(dbr0), qah = to_device(dah0),
         qbh = to_device(dbh0);
    auto qdh = poisoned(n * c * 4);
    gpu::ops::residual_scale_backward_params(
        qdh.data(), bf16_dh, qar.as<float>(), qbr.as<float>(), qah.as<float>(), qbh.as<float>(),
        gdout.as<float>(), gres.as<float>(), gh.as<float>(), gar.as<float>(), gbr.as<float>(),
        gah.as<float>(), gbh.as<float>(), n, c, scratch.as<float>());
    if (bf16_dh) {
      const auto got = to_host<uint16_t>(qdh, n * c);
      for (int64_t i = 0; i < n * c; ++i)
        EXPECT_NEAR(bf16_to_float(got[i]), pdh[i], 1e-6 + 4e-3 * std::abs(pdh[i])) << i;
    } else {
      expect_close(to_host<float>(qdh, n * c), pdh, 1e-6, 1e-6, "dh alone");
    }
    expect_close(to_host<float>(qar, c), par, 1e-5, 1e-1, "dalpha_res (params)");
    expect_close(to_host<float>(qbr, c), pbr, 1e-5, 1e-1, "dbeta_res (params)");
    expect_close(to_host<float>(qah, c), pah, 1e-5, 1e-1, "dalpha_h (params)");
    expect_close(to_host<float>(qbh, c), pbh, 1e-5, 1e-1, "dbeta_h (params)");
  }
}

TEST(GpuZaya, ResidualScalingMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  check_residual_scaling(90, 70);   // a float a thread
  check_residual_scaling(33, 1032);  // 4 floats a thread, a row across two blocks
}

// (x + beta)·alpha: one addition and one product, so the CPU's bits; c = 7 and 130 are no
// multiple of the 256 threads that cover a row.
TEST(GpuZaya, ScaleShiftIsTheCpusBits) {
  SKIP_WITHOUT_GPU();
  for (auto [n, c] : {std::pair<int64_t, int64_t>{37, 130}, {5, 7}, {300, 512}}) {
    const auto x = randn(n * c, 41), alpha = randn(c, 42), beta = randn(c, 43);
    std::vector<float> out(n * c);
    ops::scale_shift_forward(out.data(), x.data(), alpha.data(), beta.data(), n, c);
    auto gx = to_device(x), galpha = to_device(alpha), gbeta = to_device(beta);
    auto gout = poisoned(n * c * 4);
    gpu::ops::scale_shift_forward(gout.as<float>(), gx.as<float>(), galpha.as<float>(),
                                  gbeta.as<float>(), n, c);
    EXPECT_EQ(to_host<float>(gout, n * c), out) << n << "x" << c;
  }
}

}  // namespace
}  // namespace foundry
