// gpu::ops against foundry::ops (the CPU reference) on fresh random inputs. Outputs that a
// kernel writes are poisoned (NaN) first; outputs it accumulates into start from random
// values. Skips where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/rng.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "kernels/attention.h"
#include "kernels/ops.h"

namespace foundry {
namespace {

using gpu::testing::expect_close;
using gpu::testing::rms;
using gpu::testing::poisoned;
using gpu::testing::randn;
using gpu::testing::to_device;
using gpu::testing::to_host;

TEST(GpuOps, RmsNormForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto [n, c] : {std::pair<int64_t, int64_t>{37, 300}, {64, 2048}, {1, 7}, {70, 4096}}) {
    const auto x = randn(n * c, 1), w = randn(c, 2), dy = randn(n * c, 3);
    const auto dx0 = randn(n * c, 4), dw0 = randn(c, 5);
    std::vector<float> out(n * c), rstd(n), dx = dx0, dw = dw0;
    ops::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5f);
    ops::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);

    auto gx = to_device(x), gw = to_device(w), gdy = to_device(dy), gdx = to_device(dx0),
         gdw = to_device(dw0);
    auto gout = poisoned(n * c * 4), grstd = poisoned(n * 4);
    auto scratch = poisoned(gpu::ops::rmsnorm_backward_scratch(n, c) * 4);
    gpu::ops::rmsnorm_forward(gout.as<float>(), grstd.as<float>(), gx.as<float>(), gw.as<float>(),
                              n, c, 1e-5f);
    gpu::ops::rmsnorm_backward(gdx.as<float>(), gdw.as<float>(), gdy.as<float>(), gx.as<float>(),
                               gw.as<float>(), grstd.as<float>(), n, c, scratch.as<float>());
    expect_close(to_host<float>(gout, n * c), out, 1e-5, 1e-3, "out");
    expect_close(to_host<float>(grstd, n), rstd, 1e-5, 0, "rstd");
    expect_close(to_host<float>(gdx, n * c), dx, 1e-4, 1e-2, "dx");
    expect_close(to_host<float>(gdw, c), dw, 1e-4, 1e-1, "dweight");

    // With a residual folded in: dx written (the poisoned old contents must not matter).
    const auto residual = randn(n * c, 6), scale = randn(c, 7);
    std::vector<float> rdx(n * c), rdw = dw0;
    ops::rmsnorm_backward_residual(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(),
                                   rstd.data(), residual.data(), scale.data(), n, c);
    auto gres = to_device(residual), gscale = to_device(scale), grdw = to_device(dw0);
    auto grdx = poisoned(n * c * 4);
    gpu::ops::rmsnorm_backward_residual(grdx.as<float>(), grdw.as<float>(), gdy.as<float>(),
                                        gx.as<float>(), gw.as<float>(), grstd.as<float>(),
                                        gres.as<float>(), gscale.as<float>(), n, c,
                                        scratch.as<float>());
    expect_close(to_host<float>(grdx, n * c), rdx, 1e-4, 1e-2, "dx with a residual");
    expect_close(to_host<float>(grdw, c), rdw, 1e-4, 1e-1, "dweight with a residual");
  }
}

TEST(GpuOps, RopeRotatesLikeTheCpuBothWays) {
  SKIP_WITHOUT_GPU();
  const int64_t b = 2, t = 19, h = 3, d = 64;
  for (int64_t rotary : {64, 48, 0})
    for (bool inverse : {false, true}) {
      const auto x0 = randn(b * t * h * d, 7);
      std::vector<float> x = x0;
      ops::rope_apply(x.data(), b, t, h, d, rotary, 1000, 10000.0, inverse);
      auto gx = to_device(x0);
      gpu::ops::rope_apply(gx.as<float>(), b, t, h, d, rotary, 1000, 10000.0, inverse);
      expect_close(to_host<float>(gx, b * t * h * d), x, 1e-5, 1e-3, "rope");
    }
}

TEST(GpuOps, SwigluForwardAndBackwardMatchTheCpuInFp32AndBf16) {
  SKIP_WITHOUT_GPU();
  // f = 517 takes the kernels' scalar path, f = 256 their float4 path.
  const int64_t n = 33;
  for (int64_t f : {517, 256}) {
    const auto hv = randn(n * 2 * f, 11, 3.0), dy = randn(n * f, 12);
    std::vector<float> out(n * f), dh(n * 2 * f);
    ops::swiglu_forward(out.data(), hv.data(), n, f);
    ops::swiglu_backward(dh.data(), dy.data(), hv.data(), n, f);
    std::vector<bf16> out16(n * f), dh16(n * 2 * f);
    ops::swiglu_forward_bf16(out16.data(), hv.data(), n, f);
    ops::swiglu_backward_bf16(dh16.data(), dy.data(), hv.data(), n, f);

    auto gh = to_device(hv), gdy = to_device(dy);
    auto gout = poisoned(n * f * 4), gdh = poisoned(n * 2 * f * 4);
    auto gout16 = poisoned(n * f * 2), gdh16 = poisoned(n * 2 * f * 2);
    gpu::ops::swiglu_forward(gout.as<float>(), gh.as<float>(), n, f);
    gpu::ops::swiglu_backward(gdh.as<float>(), gdy.as<float>(), gh.as<float>(), n, f);
    gpu::ops::swiglu_forward_bf16(gout16.as<uint16_t>(), gh.as<float>(), n, f);
    gpu::ops::swiglu_backward_bf16(gdh16.as<uint16_t>(), gdy.as<float>(), gh.as<float>(), n, f);
    expect_close(to_host<float>(gout, n * f), out, 1e-5, 1e-4, "out");
    // The CPU's exponential is a polynomial within a few fp32 ulps, the GPU's another: where the
    // sigmoid is far in its tail, dh is small and their relative difference large.
    expect_close(to_host<float>(gdh, n * 2 * f), dh, 1e-5, rms(dh), "dh");
    // bf16: the same rounding of values that differ by an ulp of fp32 at most: equal, or one
    // bf16 step apart where the fp32 value sat on a rounding boundary.
    auto widen = [](const std::vector<bf16>& v) {
      std::vector<float> f32(v.size());
      for (size_t i = 0; i < v.size(); ++i) f32[i] = bf16_to_float(v[i]);
      return f32;
    };
    expect_close(widen(to_host<bf16>(gout16, n * f)), widen(out16), 8e-3, 1e-4, "out bf16");
    expect_close(widen(to_host<bf16>(gdh16, n * 2 * f)), widen(dh16), 8e-3, 1e-4, "dh bf16");
  }
}

TEST(GpuOps, RouterChoosesTheSameExpertsWithTheSameWeights) {
  SKIP_WITHOUT_GPU();
  for (auto [e, k, renormalize] : {std::tuple<int64_t, int64_t, bool>{8, 2, true},
                                   {16, 1, false}, {64, 8, true}, {3, 3, false}}) {
    const int64_t n = 301;
    const auto logits = randn(n * e, 13 + e, 2.0);
    std::vector<float> probs(n * e), w(n * k);
    std::vector<int32_t> idx(n * k);
    ops::router_forward(probs.data(), idx.data(), w.data(), logits.data(), n, e, k, renormalize);
    auto gl = to_device(logits);
    auto gp = poisoned(n * e * 4), gi = poisoned(n * k * 4), gw = poisoned(n * k * 4);
    gpu::ops::router_forward(gp.as<float>(), gi.as<int32_t>(), gw.as<float>(), gl.as<float>(), n,
                             e, k, renormalize);
    expect_close(to_host<float>(gp, n * e), probs, 1e-5, 1e-6, "probs");
    EXPECT_EQ(to_host<int32_t>(gi, n * k), idx);
    expect_close(to_host<float>(gw, n * k), w, 1e-5, 1e-6, "topk_w");
  }
}

TEST(GpuOps, MoeGatherAndCombineMatchTheCpuWithEmptyAndFullExperts) {
  SKIP_WITHOUT_GPU();
  // c = 130 takes the kernels' scalar path, c = 128 their float4 path.
  const int64_t n = 45, k = 2, e = 6;
  for (int64_t c : {130, 128}) {
    // Expert 5 gets no token; expert 0 is every token's first choice.
    Rng rng(21);
    std::vector<int32_t> topk(n * k);
    for (int64_t i = 0; i < n; ++i) {
      topk[i * k] = 0;
      topk[i * k + 1] = 1 + static_cast<int32_t>(rng.below(4));
    }
    std::vector<int64_t> offsets(e + 1);
    std::vector<int32_t> slot_token(n * k), assignment_slot(n * k);
    ops::moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), topk.data(),
                           n, e, k);
    const auto x = randn(n * c, 22), ys = randn(n * k * c, 23), w = randn(n * k, 24),
               out0 = randn(n * c, 25), dout = randn(n * c, 26), dxs = randn(n * k * c, 27),
               dx0 = randn(n * c, 28);
    std::vector<float> xs(n * k * c), out = out0, dys(n * k * c), dw(n * k), dx = dx0;
    ops::moe_gather(xs.data(), x.data(), slot_token.data(), n * k, c);
    ops::moe_combine(out.data(), ys.data(), w.data(), assignment_slot.data(), n, k, c);
    ops::moe_combine_backward(dys.data(), dw.data(), dout.data(), ys.data(), w.data(),
                              assignment_slot.data(), n, k, c);
    ops::moe_gather_backward(dx.data(), dxs.data(), assignment_slot.data(), n, k, c);

    auto gx = to_device(x), gys = to_device(ys), gw = to_device(w), gout = to_device(out0),
         gdout = to_device(dout), gdxs = to_device(dxs), gdx = to_device(dx0),
         gslot_token = to_device(slot_token), gassign = to_device(assignment_slot);
    auto gxs = poisoned(n * k * c * 4), gdys = poisoned(n * k * c * 4), gdw = poisoned(n * k * 4);
    gpu::ops::moe_gather(gxs.as<float>(), gx.as<float>(), gslot_token.as<int32_t>(), n * k, c);
    gpu::ops::moe_combine(gout.as<float>(), gys.as<float>(), gw.as<float>(), gassign.as<int32_t>(),
                          n, k, c);
    gpu::ops::moe_combine_backward(gdys.as<float>(), gdw.as<float>(), gdout.as<float>(),
                                   gys.as<float>(), gw.as<float>(), gassign.as<int32_t>(), n, k, c);
    gpu::ops::moe_gather_backward(gdx.as<float>(), gdxs.as<float>(), gassign.as<int32_t>(), n, k,
                                  c);
    EXPECT_EQ(to_host<float>(gxs, n * k * c), xs);  // a copy: exact
    expect_close(to_host<float>(gout, n * c), out, 1e-5, 1e-4, "combine");
    expect_close(to_host<float>(gdys, n * k * c), dys, 1e-6, 1e-6, "dys");
    expect_close(to_host<float>(gdw, n * k), dw, 1e-4, 1e-2, "dtopk_w");
    expect_close(to_host<float>(gdx, n * c), dx, 1e-5, 1e-4, "dx");
  }
}

TEST(GpuOps, CrossEntropyMatchesTheCpuInPlaceAndNot) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 33, v = 1000, vp = 1024;
  auto logits = randn(n * vp, 31, 3.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = v; j < vp; ++j) logits[i * vp + j] = 1e3f;  // padding must not count
  Rng rng(32);
  std::vector<int32_t> targets(n);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.below(v));
  const float scale = 1.0f / static_cast<float>(n);
  std::vector<float> dlogits(n * vp), losses(n);
  const double mean = ops::cross_entropy(dlogits.data(), losses.data(), logits.data(),
                                         targets.data(), n, v, vp, scale);
  for (bool in_place : {false, true}) {
    auto gl = to_device(logits), gt = to_device(targets);
    auto gd = poisoned(n * vp * 4), gloss = poisoned(n * 4), gmean = poisoned(8);
    float* d = in_place ? gl.as<float>() : gd.as<float>();
    gpu::ops::cross_entropy(d, gloss.as<float>(), gmean.as<double>(), gl.as<float>(),
                            gt.as<int32_t>(), n, v, vp, scale);
    expect_close(to_host<float>(gloss, n), losses, 1e-5, 1e-5, "losses");
    EXPECT_NEAR(to_host<double>(gmean, 1)[0], mean, 1e-5 * mean);
    expect_close(to_host<float>(in_place ? gl : gd, n * vp), dlogits, 1e-4, 1e-7, "dlogits");
  }
  // Without dlogits: the losses alone.
  auto gl = to_device(logits), gt = to_device(targets);
  auto gloss = poisoned(n * 4), gmean = poisoned(8);
  gpu::ops::cross_entropy(nullptr, gloss.as<float>(), gmean.as<double>(), gl.as<float>(),
                          gt.as<int32_t>(), n, v, vp, scale);
  expect_close(to_host<float>(gloss, n), losses, 1e-5, 1e-5, "losses (no dlogits)");
  EXPECT_EQ(to_host<float>(gl, n * vp), logits);  // untouched
}

TEST(GpuOps, EmbeddingForwardAndBackwardAreTheCpuBits) {
  SKIP_WITHOUT_GPU();
  // c = 96 takes the forward's float4 path, c = 37 its scalar path.
  const int64_t n = 500, v = 70;
  for (int64_t c : {96, 37}) {
    Rng rng(50);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(v / 2)) * 2;  // odd ids unused
    tokens[7] = v - 1;
    const auto wte = randn(v * c, 51), dout = randn(n * c, 52), dwte0 = randn(v * c, 53);
    std::vector<float> out(n * c), dwte = dwte0;
    ops::embedding_forward(out.data(), tokens.data(), wte.data(), n, c);
    ops::embedding_backward(dwte.data(), dout.data(), tokens.data(), n, c, v);
    auto gt = to_device(tokens), gw = to_device(wte), gdout = to_device(dout),
         gdw = to_device(dwte0);
    auto gout = poisoned(n * c * 4);
    gpu::Workspace workspace;
    gpu::ops::embedding_forward(gout.as<float>(), gt.as<int32_t>(), gw.as<float>(), n, c);
    gpu::ops::embedding_backward(gdw.as<float>(), gdout.as<float>(), gt.as<int32_t>(), n, c, v,
                                 workspace);
    EXPECT_EQ(to_host<float>(gout, n * c), out);
    EXPECT_EQ(to_host<float>(gdw, v * c), dwte);  // the same additions in the same order
  }
}

TEST(GpuOps, DispatchPlanRouterBackwardAndAuxLossMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto [e, k, renormalize] : {std::tuple<int64_t, int64_t, bool>{8, 2, true}, {16, 1, false},
                                   {6, 3, true}}) {
    const int64_t n = 257;
    auto logits = randn(n * e, 60 + e, 2.0);
    const auto dw = randn(n * k, 61);
    if (e == 6)  // expert 5 is chosen by no token: its rows are empty
      for (int64_t i = 0; i < n; ++i) logits[i * e + 5] = -1e4f;
    std::vector<float> probs(n * e), w(n * k), dlogits(n * e);
    std::vector<int32_t> idx(n * k);
    ops::router_forward(probs.data(), idx.data(), w.data(), logits.data(), n, e, k, renormalize);
    std::vector<int64_t> offsets(e + 1);
    std::vector<int32_t> slot_token(n * k), assignment_slot(n * k);
    ops::moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), idx.data(),
                           n, e, k);
    std::vector<double> fractions(e);
    for (int64_t x = 0; x < e; ++x)
      fractions[x] = static_cast<double>(offsets[x + 1] - offsets[x]) / static_cast<double>(n * k);
    ops::router_backward(dlogits.data(), dw.data(), probs.data(), idx.data(), w.data(), n, e, k,
                         renormalize, 0.01f, fractions.data());
    const float aux = ops::router_aux_loss(probs.data(), idx.data(), n, e, k, fractions.data());

    gpu::Workspace workspace;
    auto gidx = to_device(idx), gp = to_device(probs), gw = to_device(w), gdw = to_device(dw);
    auto goff = poisoned((e + 1) * 8), gslot = poisoned(n * k * 4), gassign = poisoned(n * k * 4),
         gfrac = poisoned(e * 8), gdl = poisoned(n * e * 4), gaux = poisoned(8),
         scratch = poisoned(gpu::ops::router_aux_scratch(n, e) * 8);
    gpu::ops::moe_dispatch_plan(goff.as<int64_t>(), gslot.as<int32_t>(), gassign.as<int32_t>(),
                                gidx.as<int32_t>(), n, e, k, workspace);
    gpu::ops::expert_fractions(gfrac.as<double>(), goff.as<int64_t>(), e, n * k);
    gpu::ops::router_backward(gdl.as<float>(), gdw.as<float>(), gp.as<float>(), gidx.as<int32_t>(),
                              gw.as<float>(), n, e, k, renormalize, 0.01f, gfrac.as<double>());
    gpu::ops::router_aux_loss(gaux.as<double>(), gp.as<float>(), gfrac.as<double>(), n, e,
                              scratch.as<double>());
    EXPECT_EQ(to_host<int64_t>(goff, e + 1), offsets);
    EXPECT_EQ(to_host<int32_t>(gslot, n * k), slot_token);
    EXPECT_EQ(to_host<int32_t>(gassign, n * k), assignment_slot);
    EXPECT_EQ(to_host<double>(gfrac, e), fractions);
    // An unchosen expert's gradient is p·(aux − Σ p·dp), where Σ p·dp cancels the chosen
    // experts' O(1) terms: its rounding is that of those terms, so the scale is dlogits' size.
    expect_close(to_host<float>(gdl, n * e), dlogits, 1e-5, rms(dlogits), "dlogits");
    EXPECT_NEAR(to_host<double>(gaux, 1)[0], aux, 1e-6 * aux);
  }
}

// Causal GQA attention, forward and backward, against the CPU kernel in fp32: ragged tiles
// (T not a multiple of the tile), one position, several query heads per KV head, D = 32 to
// 256.
TEST(GpuOps, AttentionForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const ops::AttentionShape shapes[] = {
      {2, 67, 4, 2, 64}, {1, 1, 2, 2, 32}, {1, 130, 8, 1, 128}, {2, 40, 2, 2, 256}, {1, 300, 4, 4, 128}};
  uint64_t seed = 40;
  for (const ops::AttentionShape& s : shapes) {
    const int64_t qn = s.b * s.t * s.h * s.d, kn = s.b * s.t * s.kvh * s.d;
    const auto q = randn(qn, seed++), k = randn(kn, seed++), v = randn(kn, seed++),
               dout = randn(qn, seed++);
    std::vector<float> out(qn), lse(s.b * s.h * s.t), dq(qn), dk(kn), dv(kn);
    ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s, DType::f32);
    ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                            q.data(), k.data(), v.data(), s, DType::f32);

    const gpu::ops::AttentionDims g{s.b, s.t, s.h, s.kvh, s.d};
    auto gq = to_device(q), gk = to_device(k), gv = to_device(v), gdout = to_device(dout);
    auto gout = poisoned(qn * 4), glse = poisoned(s.b * s.h * s.t * 4), gdq = poisoned(qn * 4),
         gdk = poisoned(kn * 4), gdv = poisoned(kn * 4),
         scratch = poisoned(gpu::ops::attention_backward_scratch(g) * 4);
    gpu::ops::attention_forward(gout.as<float>(), glse.as<float>(), gq.as<float>(), gk.as<float>(),
                                gv.as<float>(), g);
    gpu::ops::attention_backward(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                 gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                 gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                 scratch.as<float>());
    SCOPED_TRACE(testing::Message() << "B " << s.b << " T " << s.t << " H " << s.h << " KVH "
                                    << s.kvh << " D " << s.d);
    // The CPU's products (oneDNN) round differently with its thread count: outputs near zero
    // differ by fp32 rounding of their O(0.1) terms, so the scale is out's typical size.
    expect_close(to_host<float>(gout, qn), out, 1e-4, 1e-2, "out");
    expect_close(to_host<float>(glse, s.b * s.h * s.t), lse, 1e-5, 1e-2, "lse");
    expect_close(to_host<float>(gdq, qn), dq, 1e-3, 1e-2, "dq");
    expect_close(to_host<float>(gdk, kn), dk, 1e-3, 1e-2, "dk");
    expect_close(to_host<float>(gdv, kn), dv, 1e-3, 1e-2, "dv");
  }
}

// The tensor-core kernels against the CPU's bf16 attention (the same roundings: q, k, v, dO,
// P and dS to bf16, fp32 accumulation), and against the fp32 kernel by looser bounds: ragged
// tiles, one position, GQA, every head size they take. Shapes they do not take (D = 48 or
// 256, a misaligned tensor) go to the fp32 kernels.
TEST(GpuOps, AttentionOnTensorCoresTracksTheCpusBf16Attention) {
  SKIP_WITHOUT_GPU();
  const ops::AttentionShape shapes[] = {{2, 67, 4, 2, 64},  {1, 1, 2, 2, 32},
                                        {1, 130, 8, 1, 128}, {1, 300, 4, 4, 128},
                                        {2, 129, 6, 2, 32},  {1, 64, 2, 1, 128}};
  uint64_t seed = 140;
  for (const ops::AttentionShape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "B " << s.b << " T " << s.t << " H " << s.h << " KVH "
                                    << s.kvh << " D " << s.d);
    const int64_t qn = s.b * s.t * s.h * s.d, kn = s.b * s.t * s.kvh * s.d;
    const auto q = randn(qn, seed++), k = randn(kn, seed++), v = randn(kn, seed++),
               dout = randn(qn, seed++);
    std::vector<float> out(qn), lse(s.b * s.h * s.t), dq(qn), dk(kn), dv(kn);
    ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s, DType::bf16);
    ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                            q.data(), k.data(), v.data(), s, DType::bf16);

    const gpu::ops::AttentionDims g{s.b, s.t, s.h, s.kvh, s.d};
    auto gq = to_device(q), gk = to_device(k), gv = to_device(v), gdout = to_device(dout);
    auto gout = poisoned(qn * 4), glse = poisoned(s.b * s.h * s.t * 4), gdq = poisoned(qn * 4),
         gdk = poisoned(kn * 4), gdv = poisoned(kn * 4),
         scratch = poisoned(gpu::ops::attention_backward_scratch(g) * 4);
    ASSERT_TRUE(gpu::ops::attention_on_tensor_cores(g, gq.data(), gk.data(), gv.data(),
                                                    gout.data()));
    gpu::ops::attention_forward_bf16(gout.as<float>(), glse.as<float>(), gq.as<float>(),
                                     gk.as<float>(), gv.as<float>(), g);
    gpu::ops::attention_backward_bf16(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                      gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                      gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                      scratch.as<float>());
    const auto g_out = to_host<float>(gout, qn), g_lse = to_host<float>(glse, s.b * s.h * s.t),
               g_dq = to_host<float>(gdq, qn), g_dk = to_host<float>(gdk, kn),
               g_dv = to_host<float>(gdv, kn);
    // bf16 has 8 bits of mantissa: one rounding of P or dS differently placed moves an output
    // by a few 0.4% steps of the terms it sums, so the scale is each output's typical size.
    expect_close(g_out, out, 2e-2, rms(out), "out");
    expect_close(g_lse, lse, 1e-3, 1e-1, "lse");
    expect_close(g_dq, dq, 3e-2, rms(dq), "dq");
    expect_close(g_dk, dk, 3e-2, rms(dk), "dk");
    expect_close(g_dv, dv, 3e-2, rms(dv), "dv");

    // And bf16 against exact arithmetic: the mean error stays at bf16's scale.
    std::vector<float> out32(qn), lse32(s.b * s.h * s.t), dq32(qn), dk32(kn), dv32(kn);
    ops::attention_forward(out32.data(), lse32.data(), q.data(), k.data(), v.data(), s, DType::f32);
    ops::attention_backward(dq32.data(), dk32.data(), dv32.data(), dout.data(), out32.data(),
                            lse32.data(), q.data(), k.data(), v.data(), s, DType::f32);
    const auto l1 = [](const std::vector<float>& v) {
      double s = 0;
      for (float x : v) s += std::abs(x);
      return s;
    };
    const auto mean_error = [&](const std::vector<float>& a, const std::vector<float>& b,
                                double norm_floor = 0) {
      double err = 0;
      for (size_t i = 0; i < a.size(); ++i) err += std::abs(a[i] - b[i]);
      return err / std::max({l1(b), norm_floor, 1e-30});
    };
    EXPECT_LT(mean_error(g_out, out32), 1e-2);
    // Where a query sees one key, softmax has no gradient: exact dQ and dK vanish, and bf16
    // leaves rounding noise of dP − D. Measure them against the larger of their size and dV's.
    EXPECT_LT(mean_error(g_dq, dq32, l1(dv32) * s.h / s.kvh), 2e-2);
    EXPECT_LT(mean_error(g_dk, dk32, l1(dv32)), 2e-2);
    EXPECT_LT(mean_error(g_dv, dv32), 2e-2);
  }
  const auto takes = [](const gpu::ops::AttentionDims& g, const void* p) {
    return gpu::ops::attention_on_tensor_cores(g, p, p, p, p);
  };
  gpu::DeviceBuffer any(4096);
  EXPECT_TRUE(takes({1, 8, 2, 1, 64}, any.data()));
  EXPECT_FALSE(takes({1, 8, 2, 1, 48}, any.data()));
  EXPECT_FALSE(takes({1, 8, 2, 1, 256}, any.data()));
  EXPECT_FALSE(takes({1, 8, 2, 1, 64}, any.as<float>() + 1));
}

// Context parallelism's chunks: a rank's two chunks of each sequence (early and late, ragged
// against the tiles) against the gathered keys, forward and backward, fp32 and bf16 (tensor
// cores for D = 64, the fp32 kernels for D = 48), against the CPU's chunk kernels. dk and dv
// start from random values: the chunks add to them, and keys no query of the rank sees keep
// theirs.
TEST(GpuOps, AttentionChunksMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t b, h, kvh, d, tc, ranks, rank;
    DType dtype;
  };
  const Case cases[] = {{2, 4, 2, 64, 37, 2, 0, DType::f32},
                        {2, 4, 2, 64, 37, 2, 1, DType::bf16},
                        {1, 6, 2, 48, 21, 3, 1, DType::bf16},
                        {1, 2, 1, 64, 70, 2, 1, DType::f32},
                        {1, 2, 2, 64, 70, 4, 2, DType::bf16}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "D " << c.d << " Tc " << c.tc << " rank " << c.rank << " of "
                                    << c.ranks << " " << dtype_name(c.dtype));
    const int64_t q_rows = 2 * c.tc, k_rows = 2 * c.ranks * c.tc;
    const int64_t qn = c.b * q_rows * c.h * c.d, kn = c.b * k_rows * c.kvh * c.d;
    const int64_t ln = c.b * c.h * q_rows;
    const auto q = randn(qn, seed++), k = randn(kn, seed++), v = randn(kn, seed++),
               dout = randn(qn, seed++), dk0 = randn(kn, seed++), dv0 = randn(kn, seed++);
    const int64_t chunks[2] = {c.rank, 2 * c.ranks - 1 - c.rank};
    // The rank's slot: its query rows, at the chunk's key positions.
    const auto cpu_chunk = [&](int slot) {
      ops::AttentionChunk x{c.b, c.h, c.kvh, c.d, q_rows, k_rows, 0, 0, 0};
      x.q_begin = slot * c.tc, x.q_end = (slot + 1) * c.tc, x.q_pos = chunks[slot] * c.tc;
      return x;
    };
    const auto gpu_chunk = [&](int slot) {
      const ops::AttentionChunk x = cpu_chunk(slot);
      gpu::ops::AttentionDims g{c.b, k_rows, c.h, c.kvh, c.d};
      g.q_rows = q_rows, g.q_begin = x.q_begin, g.q_end = x.q_end, g.q_pos = x.q_pos;
      return g;
    };
    // Keys from the chunk's end on may not have arrived (context parallelism): NaN here, and
    // neither kernel may read them.
    const auto keys_up_to = [&](const std::vector<float>& x, int slot) {
      std::vector<float> y = x;
      const int64_t end = (chunks[slot] + 1) * c.tc, row = c.kvh * c.d;
      for (int64_t b = 0; b < c.b; ++b)
        std::fill(y.begin() + (b * k_rows + end) * row, y.begin() + (b + 1) * k_rows * row,
                  std::nanf(""));
      return y;
    };
    // Whether rows [r0, r1) of each [q_rows, width] block of x are all NaN (untouched).
    const auto untouched = [&](const std::vector<float>& x, int64_t blocks, int64_t width,
                               int64_t r0, int64_t r1) {
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t i = (b * q_rows + r0) * width; i < (b * q_rows + r1) * width; ++i)
          if (!std::isnan(x[i])) return false;
      return true;
    };
    std::vector<float> out(qn), lse(ln), dq(qn), dk = dk0, dv = dv0;
    auto gq = to_device(q), gdout = to_device(dout), gdk = to_device(dk0), gdv = to_device(dv0);
    auto gout = poisoned(qn * 4), glse = poisoned(ln * 4), gdq = poisoned(qn * 4);
    for (int slot : {0, 1}) {
      const auto k_seen = keys_up_to(k, slot), v_seen = keys_up_to(v, slot);
      ops::attention_chunk_forward(out.data(), lse.data(), q.data(), k_seen.data(), v_seen.data(),
                                   cpu_chunk(slot), c.dtype);
      const gpu::ops::AttentionDims g = gpu_chunk(slot);
      auto gk = to_device(k_seen), gv = to_device(v_seen);
      const bool tensor_cores =
          c.dtype == DType::bf16 &&
          gpu::ops::attention_on_tensor_cores(g, gq.data(), gk.data(), gv.data(), gout.data());
      EXPECT_EQ(tensor_cores, c.dtype == DType::bf16 && c.d != 48);
      if (tensor_cores)
        gpu::ops::attention_forward_bf16(gout.as<float>(), glse.as<float>(), gq.as<float>(),
                                         gk.as<float>(), gv.as<float>(), g);
      else
        gpu::ops::attention_forward(gout.as<float>(), glse.as<float>(), gq.as<float>(),
                                    gk.as<float>(), gv.as<float>(), g);
      if (slot == 0) {  // slot 1's rows are not written
        EXPECT_TRUE(untouched(to_host<float>(gout, qn), c.b, c.h * c.d, c.tc, q_rows)) << "out";
        EXPECT_TRUE(untouched(to_host<float>(glse, ln), c.b * c.h, 1, c.tc, q_rows)) << "lse";
      }
    }
    for (int slot : {1, 0}) {
      const auto k_seen = keys_up_to(k, slot), v_seen = keys_up_to(v, slot);
      ops::attention_chunk_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                    lse.data(), q.data(), k_seen.data(), v_seen.data(),
                                    cpu_chunk(slot), c.dtype);
      const gpu::ops::AttentionDims g = gpu_chunk(slot);
      auto gk = to_device(k_seen), gv = to_device(v_seen);
      auto scratch = poisoned(gpu::ops::attention_backward_scratch(g) * 4);
      if (c.dtype == DType::bf16 && c.d != 48)
        gpu::ops::attention_backward_bf16(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                          gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                          gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                          scratch.as<float>());
      else
        gpu::ops::attention_backward(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                     gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                     gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                     scratch.as<float>());
      if (slot == 1) {  // slot 0's rows are not written
        EXPECT_TRUE(untouched(to_host<float>(gdq, qn), c.b, c.h * c.d, 0, c.tc)) << "dq";
      }
    }
    // Keys past both chunks: dk and dv as they were, bit for bit.
    {
      const int64_t end = (std::max(chunks[0], chunks[1]) + 1) * c.tc, row = c.kvh * c.d;
      const auto gdk_h = to_host<float>(gdk, kn), gdv_h = to_host<float>(gdv, kn);
      for (int64_t b = 0; b < c.b; ++b)
        for (int64_t i = (b * k_rows + end) * row; i < (b + 1) * k_rows * row; ++i)
          ASSERT_TRUE(std::memcmp(&gdk_h[i], &dk0[i], 4) == 0 &&
                      std::memcmp(&gdv_h[i], &dv0[i], 4) == 0)
              << "dk/dv changed past the chunks' keys, element " << i;
    }
    // As the whole-sequence tests' bounds: fp32's rounding, or bf16's steps.
    const bool bf = c.dtype == DType::bf16;
    expect_close(to_host<float>(gout, qn), out, bf ? 2e-2 : 1e-4, bf ? rms(out) : 1e-2, "out");
    expect_close(to_host<float>(glse, ln), lse, bf ? 1e-3 : 1e-5, bf ? 1e-1 : 1e-2, "lse");
    expect_close(to_host<float>(gdq, qn), dq, bf ? 3e-2 : 1e-3, bf ? rms(dq) : 1e-2, "dq");
    // What the chunks added to dk and dv (keys no query saw: nothing).
    const auto added = [](std::vector<float> now, const std::vector<float>& before) {
      for (size_t i = 0; i < now.size(); ++i) now[i] -= before[i];
      return now;
    };
    const auto cpu_dk = added(dk, dk0), cpu_dv = added(dv, dv0);
    expect_close(added(to_host<float>(gdk, kn), dk0), cpu_dk, bf ? 3e-2 : 1e-3,
                 bf ? rms(cpu_dk) : 1e-2, "dk");
    expect_close(added(to_host<float>(gdv, kn), dv0), cpu_dv, bf ? 3e-2 : 1e-3,
                 bf ? rms(cpu_dv) : 1e-2, "dv");
  }
}

TEST(GpuOps, AttentionOnTensorCoresGivesTheSameBitsEveryRun) {
  SKIP_WITHOUT_GPU();
  const gpu::ops::AttentionDims g{2, 200, 4, 2, 128};
  const int64_t qn = g.b * g.t * g.h * g.d, kn = g.b * g.t * g.kvh * g.d;
  auto gq = to_device(randn(qn, 5)), gk = to_device(randn(kn, 6)), gv = to_device(randn(kn, 7)),
       gdout = to_device(randn(qn, 8));
  auto gout = poisoned(qn * 4), glse = poisoned(g.b * g.h * g.t * 4), gdq = poisoned(qn * 4),
       gdk = poisoned(kn * 4), gdv = poisoned(kn * 4),
       scratch = poisoned(gpu::ops::attention_backward_scratch(g) * 4);
  std::vector<float> first;
  for (int round = 0; round < 3; ++round) {
    gpu::ops::attention_forward_bf16(gout.as<float>(), glse.as<float>(), gq.as<float>(),
                                     gk.as<float>(), gv.as<float>(), g);
    gpu::ops::attention_backward_bf16(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                      gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                      gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                      scratch.as<float>());
    std::vector<float> all = to_host<float>(gout, qn);
    for (const auto* buffer : {&gdq, &gdk, &gdv}) {
      const std::vector<float> part = to_host<float>(*buffer, buffer == &gdq ? qn : kn);
      all.insert(all.end(), part.begin(), part.end());
    }
    if (round == 0) first = all;
    else EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * 4), 0) << round;
  }
}

TEST(GpuOps, AttentionGivesTheSameBitsEveryRun) {
  SKIP_WITHOUT_GPU();
  const gpu::ops::AttentionDims g{2, 200, 4, 2, 64};
  const int64_t qn = g.b * g.t * g.h * g.d, kn = g.b * g.t * g.kvh * g.d;
  auto gq = to_device(randn(qn, 1)), gk = to_device(randn(kn, 2)), gv = to_device(randn(kn, 3)),
       gdout = to_device(randn(qn, 4));
  auto gout = poisoned(qn * 4), glse = poisoned(g.b * g.h * g.t * 4), gdq = poisoned(qn * 4),
       gdk = poisoned(kn * 4), gdv = poisoned(kn * 4),
       scratch = poisoned(gpu::ops::attention_backward_scratch(g) * 4);
  std::vector<float> first;
  for (int round = 0; round < 3; ++round) {
    gpu::ops::attention_forward(gout.as<float>(), glse.as<float>(), gq.as<float>(), gk.as<float>(),
                                gv.as<float>(), g);
    gpu::ops::attention_backward(gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                                 gdout.as<float>(), gout.as<float>(), glse.as<float>(),
                                 gq.as<float>(), gk.as<float>(), gv.as<float>(), g,
                                 scratch.as<float>());
    std::vector<float> all = to_host<float>(gout, qn);
    for (const auto* buffer : {&gdq, &gdk, &gdv}) {
      const std::vector<float> part = to_host<float>(*buffer, buffer == &gdq ? qn : kn);
      all.insert(all.end(), part.begin(), part.end());
    }
    if (round == 0) first = all;
    else EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * 4), 0) << round;
  }
}

}  // namespace
}  // namespace foundry
