#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/bf16.h"
#include "base/error.h"
#include "kernels/row_products.h"

namespace foundry {
namespace {

dnnl::memory::data_type to_dnnl(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// A cached primitive and the scratchpad bytes it needs. Primitives use user-managed
// scratchpads, so one primitive may run on several threads at once (each with its own
// scratchpad and stream): the experts' GEMMs run concurrently (model/experts.cpp).
struct Primitive {
  dnnl::matmul matmul;
  size_t scratchpad_bytes = 0;
};

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;  // guards the cache
  std::unordered_map<std::string, Primitive> cache;
};

Engine& engine() {
  static Engine e;
  return e;
}

// The calling thread's stream and scratchpad (grown as needed).
struct ThreadContext {
  dnnl::stream stream{engine().engine};
  std::vector<unsigned char> scratchpad;
};

ThreadContext& thread_context() {
  thread_local ThreadContext context;
  return context;
}

void append_key(std::string& key, const std::vector<int64_t>& v) {
  for (int64_t x : v) {
    key += std::to_string(x);
    key += ',';
  }
  key += '|';
}

void check_view(const char* what, const std::vector<int64_t>& dims,
                const std::vector<int64_t>& strides) {
  if (dims.size() < 2 || dims.size() != strides.size())
    fail(fmt::format("matmul: operand {} needs ≥ 2 dims with one stride each", what));
}

}  // namespace

namespace {

// Whether oneDNN runs `isa`'s kernels here (its ISA values are masks of the features they
// include, not a ranking: AVX2-VNNI's is numerically above AVX-512's).
bool onednn_uses(dnnl::cpu_isa isa) {
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (effective & static_cast<unsigned>(isa)) == static_cast<unsigned>(isa);
}

GemmRows rows_mode_from_environment() {
  const char* env = std::getenv("FOUNDRY_GEMM_ROWS");
  const std::string name = env ? env : "";
  for (GemmRows m : {GemmRows::runtime, GemmRows::exact_m, GemmRows::exact_k, GemmRows::exact,
                     GemmRows::exact_fixed})
    if (name == gemm_rows_name(m)) return m;
  if (!name.empty() && name != "auto")
    fail(fmt::format("FOUNDRY_GEMM_ROWS = '{}' is not a mode of the GEMMs' token dimension",
                     name),
         "use auto, runtime, exact-m, exact-k, exact or exact-fixed (or unset it: auto)");
  // oneDNN 2.6 runs runtime shapes through its GEMM driver; on AMX cores its exact (brgemm)
  // kernels are 1.2-1.5x faster, and padding K keeps the weight gradients' count small.
  return onednn_uses(dnnl::cpu_isa::avx512_core_amx) ? GemmRows::exact_fixed : GemmRows::runtime;
}

// oneDNN 2.6 runs bf16 products on AVX-512 cores and up (natively with AVX512_BF16 or AMX,
// emulated on plain AVX-512) and refuses them below; there its exact-M products also go
// through the GEMM driver, whose rows are not the same bits for every row count.
bool onednn_below_avx512() {
  static const bool below = !onednn_uses(dnnl::cpu_isa::avx512_core);
  return below;
}

std::atomic<int>& rows_mode_slot() {
  static std::atomic<int> mode{-1};
  return mode;
}

}  // namespace

GemmRows gemm_rows_mode() {
  std::atomic<int>& slot = rows_mode_slot();
  int mode = slot.load(std::memory_order_relaxed);
  if (mode < 0) {
    mode = static_cast<int>(rows_mode_from_environment());
    slot.store(mode, std::memory_order_relaxed);
  }
  return static_cast<GemmRows>(mode);
}

namespace {
std::atomic<int>& row_invariant_scopes() {
  static std::atomic<int> scopes{0};
  return scopes;
}

// Set on the thread running a task of run_products: its products' rows vary from call to call.
thread_local int varying_rows_tasks = 0;

struct VaryingRowsTask {
  VaryingRowsTask() { ++varying_rows_tasks; }
  ~VaryingRowsTask() { --varying_rows_tasks; }
};

// Inside a task, a product whose row count is made exact on purpose (the bulk of a split one).
class FixedRowsPart {
 public:
  FixedRowsPart() : saved_(varying_rows_tasks) { varying_rows_tasks = 0; }
  ~FixedRowsPart() { varying_rows_tasks = saved_; }

 private:
  int saved_;
};
}  // namespace

bool native_bf16_products() { return !onednn_below_avx512(); }

RowInvariantGemms::RowInvariantGemms() { row_invariant_scopes().fetch_add(1); }
RowInvariantGemms::~RowInvariantGemms() { row_invariant_scopes().fetch_sub(1); }

void set_gemm_rows_mode(GemmRows mode) {
  rows_mode_slot().store(static_cast<int>(mode), std::memory_order_relaxed);
}

const char* gemm_rows_name(GemmRows mode) {
  switch (mode) {
    case GemmRows::runtime: return "runtime";
    case GemmRows::exact_m: return "exact-m";
    case GemmRows::exact_k: return "exact-k";
    case GemmRows::exact: return "exact";
    case GemmRows::exact_fixed: return "exact-fixed";
  }
  return "?";
}

MatView MatView::rows_major(const void* data, DType dtype, int64_t rows, int64_t cols,
                            int64_t ld) {
  return MatView{data, dtype, {rows, cols}, {ld ? ld : cols, 1}};
}

MatView MatView::transposed(const void* data, DType dtype, int64_t rows, int64_t cols,
                            int64_t ld) {
  // Stored as cols × rows row-major with leading dimension ld (default rows).
  return MatView{data, dtype, {rows, cols}, {1, ld ? ld : rows}};
}

OutView OutView::rows_major(float* data, int64_t rows, int64_t cols, int64_t ld) {
  return OutView{data, {rows, cols}, {ld ? ld : cols, 1}};
}

namespace {

using dnnl::memory;

memory::desc describe(const std::vector<int64_t>& dims, DType dtype,
                      const std::vector<int64_t>& strides) {
  return memory::desc(memory::dims(dims.begin(), dims.end()), to_dnnl(dtype),
                      memory::dims(strides.begin(), strides.end()));
}

// The cached primitive for `key`, created on first use from the description `make` returns.
Primitive cached_primitive(const std::string& key, bool accumulate,
                           const std::function<dnnl::matmul::desc()>& make) {
  Engine& e = engine();
  std::lock_guard<std::mutex> lock(e.mutex);
  auto it = e.cache.find(key);
  if (it != e.cache.end()) return it->second;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(make(), attr, e.engine);
    const Primitive made{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
    return e.cache.emplace(key, made).first->second;
  } catch (const dnnl::error& err) {
    fail(fmt::format("oneDNN cannot create a matmul for shape key {}: {}", key, err.what()));
  }
}

// Runs `p` on the calling thread, with its stream and scratchpad.
void execute(const Primitive& p, const memory::desc& a_desc, const void* a,
             const memory::desc& b_desc, const void* b, const memory::desc& c_desc, float* c) {
  const dnnl::engine& engine_ = engine().engine;
  ThreadContext& tc = thread_context();
  if (tc.scratchpad.size() < p.scratchpad_bytes) tc.scratchpad.resize(p.scratchpad_bytes);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(a_desc, engine_, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, memory(b_desc, engine_, const_cast<void*>(b))},
      {DNNL_ARG_DST, memory(c_desc, engine_, c)}};
  if (p.scratchpad_bytes > 0) {
    const memory::desc bytes({static_cast<int64_t>(p.scratchpad_bytes)}, memory::data_type::u8,
                             memory::format_tag::a);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(bytes, engine_, tc.scratchpad.data()));
  }
  p.matmul.execute(tc.stream, args);
  tc.stream.wait();
}

}  // namespace

namespace {

// Weight gradients in the exact-k modes: K (the expert's rows) rounded up to a multiple of
// kReductionQuantum, so that the products of every step share a few primitives. The rows
// of A (stored K × M) and B (K × N) are copied into the calling thread's scratch with zero
// rows after them; zero rows add nothing to the sums.
constexpr int64_t kReductionQuantum = 64;

struct PaddedOperands {
  std::vector<unsigned char> a, b;
};

PaddedOperands& padded_operands() {
  thread_local PaddedOperands p;
  return p;
}

// Copies `rows` rows of `cols` elements (leading dimension ld) into `out`, then zero rows up
// to `padded_rows`.
void copy_padded(std::vector<unsigned char>& out, const void* src, int64_t rows,
                 int64_t padded_rows, int64_t cols, int64_t ld, size_t elem) {
  out.resize(static_cast<size_t>(padded_rows * cols) * elem);
  const auto* from = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(out.data() + i * cols * elem, from + i * ld * elem, cols * elem);
  std::memset(out.data() + rows * cols * elem, 0, (padded_rows - rows) * cols * elem);
}

}  // namespace

namespace {

// Under exact-fixed, a task's product x·Wᵀ whose outputs are at least twice its inputs (by
// shape: the experts' gate|up projection where ffn_dim ≥ d_model, as in every shipped config)
// runs in two parts: its largest multiple of kRowQuantum rows through an exact-M primitive
// (AMX brgemm kernels), the other rows through the runtime-M one. One primitive per multiple
// serves every step (at most an expert's most rows / 64), and the up-projection's forward is
// about a fifth faster (docs/PERFORMANCE.md, 2026-11-28, "Expert and attention products on
// AMX"). The experts' other products were not faster so at both bench models' shapes, and
// stay whole.
constexpr int64_t kRowQuantum = 64;

bool runs_in_row_parts(GemmRows mode, const MatView& a, const MatView& b) {
  const bool b_transposed = b.strides[0] == 1 && b.strides[1] != 1;
  return mode == GemmRows::exact_fixed && varying_rows_tasks > 0 && b_transposed &&
         b.dims[1] >= 2 * b.dims[0] && a.dims[0] >= kRowQuantum;
}

void matmul_in_row_parts(const MatView& a, const MatView& b, const OutView& c, bool accumulate) {
  const int64_t m = a.dims[0], k = a.dims[1], n = c.dims[1];
  const int64_t bulk = m / kRowQuantum * kRowQuantum;
  {
    const FixedRowsPart exact;
    matmul(MatView{a.data, a.dtype, {bulk, k}, a.strides}, b,
           OutView{c.data, {bulk, n}, c.strides}, accumulate);
  }
  if (bulk == m) return;
  const size_t elem = a.dtype == DType::bf16 ? 2 : 4;
  const auto* rest = static_cast<const unsigned char*>(a.data) + bulk * a.strides[0] * elem;
  matmul(MatView{rest, a.dtype, {m - bulk, k}, a.strides}, b,
         OutView{c.data + bulk * c.strides[0], {m - bulk, n}, c.strides}, accumulate);
}

}  // namespace

namespace {

// Floats kept after a widened operand, beyond its last element: at least a row's stride or
// 4 KiB. (A 2-rank bf16 run faulted once reading at the heap's end inside oneDNN while a copy
// had no room after it; whether oneDNN reads past an operand or the cause was the signal in
// train/signals.cpp is not established. The room costs nothing measurable.)
constexpr int64_t kWidenedSlack = 1024;
// Scratch above this many floats is released after the product (a thread keeps less).
constexpr size_t kWidenedKeep = size_t{16} << 20;

// A bf16 operand as fp32 with the same strides: every element of the memory it spans,
// widened (exactly) into the calling thread's scratch `to`.
MatView widened(const MatView& v, std::vector<float>& to) {
  int64_t span = 1, slack = kWidenedSlack;
  for (size_t i = 0; i < v.dims.size(); ++i) {
    span += (v.dims[i] - 1) * v.strides[i];
    slack = std::max(slack, v.strides[i]);
  }
  to.resize(static_cast<size_t>(span + slack));
  convert_from_bf16(static_cast<const bf16*>(v.data), to.data(), span);
  return MatView{to.data(), DType::f32, v.dims, v.strides};
}

struct WidenedOperands {
  std::vector<float> a, b;
};

}  // namespace

namespace {

// Checks the shapes of C = A·B; false when the product is empty (nothing to do).
bool check_product(const MatView& a, const MatView& b, const OutView& c) {
  check_view("A", a.dims, a.strides);
  check_view("B", b.dims, b.strides);
  check_view("C", c.dims, c.strides);
  FOUNDRY_CHECK(a.dtype == b.dtype);
  FOUNDRY_CHECK(a.dims.size() == b.dims.size() && a.dims.size() == c.dims.size());
  const size_t r = a.dims.size();
  FOUNDRY_CHECK(a.dims[r - 1] == b.dims[r - 2]);
  FOUNDRY_CHECK(c.dims[r - 2] == a.dims[r - 2] && c.dims[r - 1] == b.dims[r - 1]);
  for (size_t i = 0; i < r; ++i)
    if (a.dims[i] == 0 || b.dims[i] == 0) return false;
  return a.dims[r - 1] != 0;
}

// Where oneDNN has no AVX-512 (onednn_below_avx512()): decoding's products, row-invariant by
// construction where oneDNN's are not; bf16 products as fp32 ones of the widened operands (the
// same inputs and fp32 accumulation). False when the product is left to oneDNN as it is.
bool matmul_below_avx512(const MatView& a, const MatView& b, const OutView& c, bool accumulate) {
  if (row_invariant_scopes().load(std::memory_order_relaxed) > 0 &&
      ops::row_product_handles(a, b, c)) {
    ops::row_product(a, b, c, accumulate);
    return true;
  }
  if (a.dtype != DType::bf16) return false;
  thread_local WidenedOperands w;
  matmul(widened(a, w.a), widened(b, w.b), c, accumulate);
  for (std::vector<float>* buffer : {&w.a, &w.b})
    if (buffer->capacity() > kWidenedKeep) std::vector<float>().swap(*buffer);
  return true;
}

// The dims a product is described to oneDNN with: its operands', or with a runtime one.
struct ProductDims {
  std::vector<int64_t> a, b, c;
};

// The token dimension of 2-D products varies from call to call (rows per expert), so it is
// made a runtime dimension of `dims` whenever no stride depends on it (gemm_rows_mode()
// permitting): one primitive then serves every row count, instead of one JIT compile per
// count. That is M when A and C are row-major, or K when A is transposed and B row-major.
// False when the product ran another way instead (in row parts, or with K padded).
bool runtime_dims_2d(const MatView& a, const MatView& b, const OutView& c, bool accumulate,
                     ProductDims& dims) {
  const GemmRows mode = gemm_rows_mode();
  // exact-fixed outside run_products: one primitive per shape serves every call as it is.
  const bool fixed_rows = mode == GemmRows::exact_fixed && varying_rows_tasks == 0;
  const bool exact_m = mode == GemmRows::exact_m || mode == GemmRows::exact || fixed_rows ||
                       row_invariant_scopes().load(std::memory_order_relaxed) > 0;
  const bool exact_k =
      mode == GemmRows::exact_k || mode == GemmRows::exact || mode == GemmRows::exact_fixed;
  if (a.strides[1] == 1 && c.strides[1] == 1) {
    if (!exact_m && runs_in_row_parts(mode, a, b)) {
      matmul_in_row_parts(a, b, c, accumulate);
      return false;
    }
    if (!exact_m) dims.a[0] = dims.c[0] = DNNL_RUNTIME_DIM_VAL;
  } else if (a.strides[0] == 1 && b.strides[1] == 1) {
    const int64_t k = a.dims[1],
                  padded = (k + kReductionQuantum - 1) / kReductionQuantum * kReductionQuantum;
    if (!exact_k) {
      dims.a[1] = dims.b[0] = DNNL_RUNTIME_DIM_VAL;
    } else if (padded != k && !fixed_rows) {
      const size_t elem = a.dtype == DType::bf16 ? 2 : 4;
      const int64_t m = a.dims[0], n = b.dims[1];
      PaddedOperands& pad = padded_operands();
      copy_padded(pad.a, a.data, k, padded, m, a.strides[1], elem);
      copy_padded(pad.b, b.data, k, padded, n, b.strides[0], elem);
      matmul(MatView::transposed(pad.a.data(), a.dtype, m, padded, m),
             MatView::rows_major(pad.b.data(), b.dtype, padded, n, n), c, accumulate);
      return false;
    }
  }
  return true;
}

// The product through oneDNN's matmul primitive for `dims`, created once per key.
void run_onednn(const MatView& a, const MatView& b, const OutView& c, bool accumulate,
                const ProductDims& dims) {
  std::string key;
  key.reserve(128);
  key += a.dtype == DType::bf16 ? 'h' : 'f';
  key += accumulate ? 'a' : 'w';
  append_key(key, dims.a);
  append_key(key, a.strides);
  append_key(key, dims.b);
  append_key(key, b.strides);
  append_key(key, dims.c);
  append_key(key, c.strides);
  const Primitive p = cached_primitive(key, accumulate, [&] {
    return dnnl::matmul::desc(describe(dims.a, a.dtype, a.strides),
                              describe(dims.b, b.dtype, b.strides),
                              describe(dims.c, DType::f32, c.strides));
  });
  execute(p, describe(a.dims, a.dtype, a.strides), a.data, describe(b.dims, b.dtype, b.strides),
          b.data, describe(c.dims, DType::f32, c.strides), c.data);
}

}  // namespace

void matmul(const MatView& a, const MatView& b, const OutView& c, bool accumulate) {
  if (!check_product(a, b, c)) return;  // empty product: nothing to do
  if (onednn_below_avx512() && matmul_below_avx512(a, b, c, accumulate)) return;
  ProductDims dims{a.dims, b.dims, c.dims};
  if (a.dims.size() == 2 && !runtime_dims_2d(a, b, c, accumulate, dims)) return;
  run_onednn(a, b, c, accumulate, dims);
}

void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t k, DType dtype, bool accumulate) {
  MatView av = trans_a ? MatView::transposed(a, dtype, m, k) : MatView::rows_major(a, dtype, m, k);
  MatView bv = trans_b ? MatView::transposed(b, dtype, k, n) : MatView::rows_major(b, dtype, k, n);
  matmul(av, bv, OutView::rows_major(c, m, n), accumulate);
}

namespace {

// Whether `costs` split among `threads` largest first, each to the least-loaded thread, keep
// the busiest thread within kMaxImbalance of an even share.
constexpr double kMaxImbalance = 1.15;

bool splits_evenly(const std::vector<int64_t>& costs, int threads) {
  std::vector<int64_t> sorted = costs;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<int64_t> load(threads, 0);
  int64_t total = 0;
  for (int64_t c : sorted) {
    *std::min_element(load.begin(), load.end()) += c;
    total += c;
  }
  const int64_t busiest = *std::max_element(load.begin(), load.end());
  return total > 0 && static_cast<double>(busiest) * threads <= kMaxImbalance * total;
}

}  // namespace

void run_side_by_side(int64_t n, const std::function<void(int64_t)>& task) {
  // An exception may not leave a parallel region: the first one is kept and rethrown.
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      task(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void run_products(const std::vector<int64_t>& costs, const std::function<void(int64_t)>& task) {
  const int64_t n = static_cast<int64_t>(costs.size());
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads < 2 || !splits_evenly(costs, threads)) {
    const VaryingRowsTask varying;
    for (int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return costs[x] > costs[y]; });
  run_side_by_side(n, [&](int64_t j) {
    const VaryingRowsTask varying;
    task(order[j]);
  });
}

size_t matmul_cache_size() {
  Engine& e = engine();
  std::lock_guard<std::mutex> lock(e.mutex);
  return e.cache.size();
}

}  // namespace foundry
