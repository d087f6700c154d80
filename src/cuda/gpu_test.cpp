// The CUDA backend against the CPU. Where no GPU is visible (every CI machine) the GPU cases
// skip and the error a user gets is checked instead; `ctest -L gpu` on a GPU machine runs them
// all (scripts/gpu_check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/rng.h"
#include "base/test_expect_error.h"
#include "cuda/blas.h"
#include "cuda/random_fill.h"
#include "cuda/runtime.h"
#include "cuda/stream_kernels.h"
#include "cuda/test_support.h"
#include "kernels/cpu_backend.h"
#include "kernels/gemm.h"

namespace foundry {
namespace {

bool have_gpu() { return gpu::visible_gpus() > 0; }


TEST(GpuRuntime, AskingForAGpuWhereThereIsNoneIsAClearError) {
  if (have_gpu()) {
    const int count = gpu::visible_gpus();
    expect_error([&] { gpu::open_gpu(count, "--device cuda"); }, "does not exist");
    return;
  }
  std::string why;
  EXPECT_EQ(gpu::visible_gpus(&why), 0);
  EXPECT_FALSE(why.empty());
  try {
    gpu::open_gpu(0, "--device cuda");
    ADD_FAILURE() << "open_gpu succeeded without a GPU";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device cuda"), std::string::npos) << what;
    EXPECT_NE(what.find(gpu::built_with_cuda() ? "no CUDA GPU is visible"
                                               : "built without the CUDA backend"),
              std::string::npos)
        << what;
    EXPECT_NE(e.hint().find("--device cpu"), std::string::npos) << e.hint();
  }
}

TEST(GpuRuntime, DescribesTheGpu) {
  SKIP_WITHOUT_GPU();
  const gpu::GpuInfo g = gpu::open_gpu(0, "test");
  EXPECT_FALSE(g.name.empty());
  EXPECT_GT(g.sm_count, 0);
  EXPECT_GT(g.sm_clock_hz, 0.3e9);
  EXPECT_LT(g.sm_clock_hz, 4e9);
  EXPECT_GT(g.memory_bytes, int64_t{1} << 30);
  EXPECT_GT(g.l2_bytes, 0);
  EXPECT_GT(g.spec_memory_bytes_per_s(), 100e9);
}

TEST(GpuRuntime, BuffersRoundTripAndPoison) {
  SKIP_WITHOUT_GPU();
  std::vector<float> host(1000), back(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  gpu::DeviceBuffer buffer(4000);
  buffer.fill_bytes(0xFF);
  buffer.upload(host.data(), 2000, 1000);  // elements 250..749
  buffer.download(back.data(), 4000);
  for (size_t i = 0; i < back.size(); ++i) {
    if (i >= 250 && i < 750) EXPECT_EQ(back[i], host[i - 250]) << i;
    else EXPECT_TRUE(std::isnan(back[i])) << i;
  }
  expect_error([&] { buffer.upload(host.data(), 4000, 4); }, "internal check failed");
}

// One strided copy (cudaMemcpy2D) against the CPU's copy per block: the same bytes, the gaps
// untouched.
TEST(GpuRuntime, BlocksGoFromOneStrideToAnotherAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kF = sizeof(float), blocks = 37, block = 300, from_stride = 1000,
                    to_stride = 450;
  std::vector<float> from(blocks * from_stride), want(blocks * to_stride, -1.0f);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<float>(i) * 0.25f;
  cpu_backend().copy_blocks(want.data(), to_stride * kF, from.data() + 7, from_stride * kF,
                            block * kF, blocks);
  gpu::DeviceBuffer source = gpu::testing::to_device(from);
  gpu::DeviceBuffer target = gpu::testing::to_device(std::vector<float>(want.size(), -1.0f));
  gpu::copy_blocks_on_device(target.as<float>(), to_stride * kF, source.as<float>() + 7,
                             from_stride * kF, block * kF, blocks);
  EXPECT_EQ(gpu::testing::to_host<float>(target, static_cast<int64_t>(want.size())), want);
}

// Slabs with holes (CUDA virtual memory, cuda/slab.cu): made zeroed, the chunks inside the
// holes take no device memory (the GPU's free memory says so) and read as zeros, the rest
// round-trips; chunks handed back later free their memory, read as scratch that every such
// place shares, and the bytes around them keep their values; freeing returns it all.
// Suite GpuMemory: it reads the GPU's free memory, so ctest runs it alone (cuda_gpu_memory,
// RUN_SERIAL), and the sanitizer, whose own allocations move that figure, leaves it out.
TEST(GpuMemory, SlabHolesTakeNoMemoryAndReadAsTheirKind) {
  SKIP_WITHOUT_GPU();
  const int64_t mib = int64_t{1} << 20, n = 64 * mib, floats = n / 4;
  // (cudaMemGetInfo counts in pages, and the first kernels load modules: 4 MiB of slack)
  const int64_t slack = 4 * mib;
  gpu::zero_bytes(gpu::DeviceBuffer(4).data(), 4);  // the memset's module loaded before
  const int64_t free_before = gpu::memory_free();
  // Bytes [8, 40) MiB zeros from the start: 32 MiB, whole chunks of the granularity.
  void* slab = gpu::device_allocate_slab(n, {{8 * mib, 40 * mib}}, true);
  std::printf(
      "[ info     ] this GPU maps the zeros holes %s\n",
      gpu::device_slab_zeros_read_only(slab) ? "read-only" : "read-write (refused read-only)");
  const int64_t memory = gpu::device_slab_memory_bytes(slab);
  EXPECT_LE(memory, n - 32 * mib + 2 * mib);  // the alias chunk (2 MiB on current GPUs)
  EXPECT_GE(free_before - gpu::memory_free(), memory - slack);
  EXPECT_LE(free_before - gpu::memory_free(), memory + slack);
  std::vector<float> back(static_cast<size_t>(floats), -1.0f);
  gpu::copy_to_host(back.data(), slab, n);
  EXPECT_EQ(std::count(back.begin(), back.end(), 0.0f), floats);
  std::vector<float> values(static_cast<size_t>(floats));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) + 1;
  auto* f = static_cast<float*>(slab);
  gpu::copy_to_device(f, values.data(), 8 * mib);  // bytes [0, 8) MiB and [40, 64) MiB
  gpu::copy_to_device(f + 10 * mib, values.data() + 10 * mib, 24 * mib);
  // [48, 56) MiB handed back as scratch: freed, the rest kept; scratch starts as zeros too.
  const int64_t free_kept = gpu::memory_free();
  EXPECT_EQ(gpu::device_release_slab_ranges(slab, {{48 * mib, 56 * mib}}, false), 8 * mib);
  EXPECT_GE(gpu::memory_free() - free_kept, 8 * mib - 2 * mib - slack);  // less the alias
  gpu::copy_to_host(back.data(), slab, n);
  for (int64_t i = 0; i < floats; ++i) {
    const int64_t byte = 4 * i;
    const bool zeros = byte >= 8 * mib && byte < 40 * mib;
    const bool scratch = byte >= 48 * mib && byte < 56 * mib;
    ASSERT_EQ(back[i], zeros || scratch ? 0.0f : values[i]) << "byte " << byte;
  }
  const float seven = 7.0f;
  gpu::copy_to_device(f + 12 * mib, &seven, 4);  // byte 48 MiB: the scratch chunk's first
  float other = 0;
  gpu::copy_to_host(&other, f + 13 * mib, 4);  // byte 52 MiB: the same chunk's first
  EXPECT_EQ(other, 7.0f);
  gpu::device_release(slab);
  EXPECT_GE(gpu::memory_free(), free_before - slack);
}

// ---- GEMM against foundry::gemm on the CPU ----

struct GemmCase {
  int64_t m, n, k;
  bool trans_a, trans_b;
};

// Fresh random operands; the GPU's C is poisoned (NaN) first, or holds C0 when accumulating.
// `offset`: the operands start that many elements into their buffers (a slab's sub-slice).
void expect_gpu_gemm_matches_cpu(const GemmCase& s, DType dtype, bool accumulate, uint64_t seed,
                                 int64_t offset = 0) {
  Rng rng(seed);
  std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
      c0(static_cast<size_t>(s.m * s.n));
  for (float& x : a) x = static_cast<float>(rng.normal());
  for (float& x : b) x = static_cast<float>(rng.normal());
  for (float& x : c0) x = static_cast<float>(rng.normal());
  const int64_t elem = dtype == DType::bf16 ? 2 : 4;
  std::vector<char> a_in(a.size() * elem), b_in(b.size() * elem);
  if (dtype == DType::bf16) {
    convert_to_bf16(a.data(), reinterpret_cast<bf16*>(a_in.data()), static_cast<int64_t>(a.size()));
    convert_to_bf16(b.data(), reinterpret_cast<bf16*>(b_in.data()), static_cast<int64_t>(b.size()));
  } else {
    std::memcpy(a_in.data(), a.data(), a_in.size());
    std::memcpy(b_in.data(), b.data(), b_in.size());
  }
  std::vector<float> cpu = c0;
  gemm(a_in.data(), s.trans_a, b_in.data(), s.trans_b, cpu.data(), s.m, s.n, s.k, dtype,
       accumulate);

  const int64_t a_at = offset * elem, b_at = offset * elem, c_at = offset * 4;
  gpu::DeviceBuffer da(a_at + static_cast<int64_t>(a_in.size())),
      db(b_at + static_cast<int64_t>(b_in.size())), dc(c_at + s.m * s.n * 4);
  da.upload(a_in.data(), static_cast<int64_t>(a_in.size()), a_at);
  db.upload(b_in.data(), static_cast<int64_t>(b_in.size()), b_at);
  dc.fill_bytes(0xFF);
  if (accumulate) dc.upload(c0.data(), s.m * s.n * 4, c_at);
  gpu::gemm(da.as<char>() + a_at, s.trans_a, db.as<char>() + b_at, s.trans_b,
            reinterpret_cast<float*>(dc.as<char>() + c_at), s.m, s.n, s.k, dtype, accumulate);
  std::vector<float> out(cpu.size());
  dc.download(out.data(), s.m * s.n * 4, c_at);

  // Both accumulate the same inputs in fp32, in different orders: bound by k ulps of the
  // magnitude Σ|a||b| (computed from the inputs as the GPU saw them).
  auto in_a = [&](int64_t i, int64_t q) {
    const size_t at = static_cast<size_t>(s.trans_a ? q * s.m + i : i * s.k + q);
    return dtype == DType::bf16 ? bf16_to_float(reinterpret_cast<const bf16*>(a_in.data())[at])
                                : a[at];
  };
  auto in_b = [&](int64_t q, int64_t j) {
    const size_t at = static_cast<size_t>(s.trans_b ? j * s.k + q : q * s.n + j);
    return dtype == DType::bf16 ? bf16_to_float(reinterpret_cast<const bf16*>(b_in.data())[at])
                                : b[at];
  };
  int bad = 0;
  for (int64_t i = 0; i < s.m && bad < 5; ++i)
    for (int64_t j = 0; j < s.n && bad < 5; ++j) {
      double magnitude = accumulate ? std::abs(c0[static_cast<size_t>(i * s.n + j)]) : 0.0;
      for (int64_t q = 0; q < s.k; ++q) magnitude += std::abs(in_a(i, q) * in_b(q, j));
      const float got = out[static_cast<size_t>(i * s.n + j)];
      const float want = cpu[static_cast<size_t>(i * s.n + j)];
      if (!(std::abs(got - want) <= 2e-7 * (s.k + 2) * magnitude + 1e-30)) {
        ADD_FAILURE() << dtype_name(dtype) << " " << s.m << "x" << s.n << "x" << s.k
                      << " ta=" << s.trans_a << " tb=" << s.trans_b << " acc=" << accumulate
                      << ": C[" << i << "," << j << "] = " << got << ", CPU " << want;
        ++bad;
      }
    }
}

TEST(GpuGemm, MatchesTheCpuGemmOverShapesLayoutsAndDtypes) {
  SKIP_WITHOUT_GPU();
  const GemmCase shapes[] = {{1, 1, 1, false, false},   {17, 33, 65, false, false},
                             {128, 256, 64, false, true}, {300, 7, 513, true, false},
                             {64, 96, 1000, true, true},  {1, 2048, 512, false, true},
                             {513, 129, 8, false, false}};
  uint64_t seed = 1;
  for (const GemmCase& s : shapes)
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool accumulate : {false, true})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            expect_gpu_gemm_matches_cpu({s.m, s.n, s.k, ta, tb}, dtype, accumulate, seed++);
}

// The experts' products: the row count changes call to call, within one representative shape
// (blas.cu runs its algorithm where cuBLASLt accepts it) and across them, as the rows (M) of
// the forward products and as the inner dimension (K) of the weight gradients.
TEST(GpuGemm, RowCountsThatShareAnAlgorithmMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (int64_t rows : {65, 100, 127, 128, 129, 200, 257, 300, 511, 700, 1000, 8193, 9000})
    for (DType dtype : {DType::f32, DType::bf16}) {
      expect_gpu_gemm_matches_cpu({rows, 96, 64, false, true}, dtype, false, seed++);
      expect_gpu_gemm_matches_cpu({64, 48, rows, true, false}, dtype, rows % 2 == 1, seed++);
    }
}

TEST(GpuGemm, TakesOperandsAtAnyElementOffset) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int64_t offset : {1, 3, 8})
    for (DType dtype : {DType::f32, DType::bf16})
      expect_gpu_gemm_matches_cpu({64, 128, 96, false, true}, dtype, offset % 2 == 1, seed++,
                                  offset);
}

TEST(GpuGemm, TheSameProductGivesTheSameBitsEveryRun) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 777, n = 1024, k = 4096;
  Rng rng(5);
  std::vector<bf16> a(m * k), b(k * n);
  for (bf16& x : a) x = float_to_bf16(static_cast<float>(rng.normal()));
  for (bf16& x : b) x = float_to_bf16(static_cast<float>(rng.normal()));
  gpu::DeviceBuffer da(m * k * 2), db(k * n * 2), dc(m * n * 4);
  da.upload(a.data(), m * k * 2);
  db.upload(b.data(), k * n * 2);
  std::vector<float> first(m * n), again(m * n);
  gpu::gemm(da.data(), false, db.data(), true, dc.as<float>(), m, n, k, DType::bf16);
  dc.download(first.data(), m * n * 4);
  for (int round = 0; round < 3; ++round) {
    dc.fill_bytes(0);
    gpu::gemm(da.data(), false, db.data(), true, dc.as<float>(), m, n, k, DType::bf16);
    dc.download(again.data(), m * n * 4);
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << round;
  }
}

TEST(GpuRandomFill, TheStreamCoversItsSeventeenValuesAndDependsOnTheSeed) {
  int counts[17] = {};
  int same = 0;
  const int n = 17000;
  for (int i = 0; i < n; ++i) {
    const float v = gpu::eighth_at(7, i);
    ASSERT_EQ(v * 8, std::round(v * 8));
    ASSERT_LE(std::abs(v), 1.0f);
    ++counts[static_cast<int>(v * 8) + 8];
    same += v == gpu::eighth_at(8, i);
  }
  for (int c : counts) EXPECT_NEAR(c, n / 17, n / 17 / 4);
  EXPECT_LT(same, n / 17 * 2);  // another seed is another stream
}

TEST(GpuRandomFill, TheDeviceStreamIsTheHostStream) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 70001;
  gpu::DeviceBuffer f32(n * 4), h16(n * 2);
  gpu::fill_eighths(f32.data(), n, false, 42);
  gpu::fill_eighths(h16.data(), n, true, 42);
  std::vector<float> got(n);
  std::vector<bf16> got16(n);
  f32.download(got.data(), n * 4);
  h16.download(got16.data(), n * 2);
  int distinct[17] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float want = gpu::eighth_at(42, static_cast<uint64_t>(i));
    ASSERT_EQ(got[i], want) << i;
    ASSERT_EQ(bf16_to_float(got16[i]), want) << i;
    ++distinct[static_cast<int>(want * 8) + 8];
  }
  for (int v = 0; v < 17; ++v) EXPECT_GT(distinct[v], n / 17 / 2) << "value " << (v - 8) / 8.0;
}

// ---- memory kernels ----

TEST(GpuStream, EachKernelComputesItsFormula) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 100003;  // not a multiple of any block size
  Rng rng(9);
  std::vector<double> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) a[i] = rng.normal(), b[i] = rng.normal(), c[i] = rng.normal();
  gpu::DeviceBuffer da(n * 8), db(n * 8), dc(n * 8), partial(gpu::stream_read_partials() * 8);
  const double s = 3.0;
  for (gpu::StreamOp op : gpu::kStreamOps) {
    da.upload(a.data(), n * 8);
    db.upload(b.data(), n * 8);
    dc.upload(c.data(), n * 8);
    gpu::run_stream_op(op, da.as<double>(), db.as<double>(), dc.as<double>(), n, s,
                       partial.as<double>());
    std::vector<double> ga(n), gb(n), gc(n);
    da.download(ga.data(), n * 8);
    db.download(gb.data(), n * 8);
    dc.download(gc.data(), n * 8);
    const char* name = gpu::stream_op_name(op);
    for (int64_t i = 0; i < n; ++i) {
      switch (op) {
        case gpu::StreamOp::copy: ASSERT_EQ(gc[i], a[i]) << name << i; break;
        case gpu::StreamOp::scale: ASSERT_EQ(gb[i], s * c[i]) << name << i; break;
        case gpu::StreamOp::add: ASSERT_EQ(gc[i], a[i] + b[i]) << name << i; break;
        case gpu::StreamOp::triad: ASSERT_EQ(ga[i], b[i] + s * c[i]) << name << i; break;
        case gpu::StreamOp::write: ASSERT_EQ(ga[i], s) << name << i; break;
        case gpu::StreamOp::read: break;
      }
    }
    if (op == gpu::StreamOp::read) {
      std::vector<double> partials(gpu::stream_read_partials());
      partial.download(partials.data(), static_cast<int64_t>(partials.size()) * 8);
      double sum = 0, want = 0, magnitude = 0;
      for (double p : partials) sum += p;
      for (double x : a) want += x, magnitude += std::abs(x);
      EXPECT_NEAR(sum, want, 1e-12 * magnitude);
    }
  }
}

}  // namespace
}  // namespace foundry
