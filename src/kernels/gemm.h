// Matrix multiplication through oneDNN, with primitives created once per shape and cached.
//
// A matrix operand is a view: its logical dims (batch dims..., rows, cols) and element
// strides for each dim. Transposition is a swap of the last two strides; batch dims of
// size 1 broadcast (as oneDNN matmul allows, for B only). A and B share a dtype (fp32 or
// bf16); C is always fp32 and accumulation is fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "base/bf16.h"

namespace foundry {

enum class DType { f32, bf16 };
// "fp32" | "bf16", as configs and reports spell them.
inline const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }
// The dtype a config, flag or profile names: "bf16" or "bfloat16"; "fp32", "f32", "float32"
// or "float". Empty for any other name (the caller's error names the key or flag).
inline std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp32" || name == "f32" || name == "float32" || name == "float") return DType::f32;
  return std::nullopt;
}

struct MatView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> dims;     // [..., rows, cols]
  std::vector<int64_t> strides;  // elements, one per dim

  // A plain row-major rows × cols matrix (leading dimension ld, default cols).
  static MatView rows_major(const void* data, DType dtype, int64_t rows, int64_t cols,
                            int64_t ld = 0);
  // The transpose of a row-major (cols × rows) matrix, seen as rows × cols.
  static MatView transposed(const void* data, DType dtype, int64_t rows, int64_t cols,
                            int64_t ld = 0);
};

struct OutView {
  float* data = nullptr;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  static OutView rows_major(float* data, int64_t rows, int64_t cols, int64_t ld = 0);
};

// C = A · B, or C += A · B when `accumulate`. Shapes: A [..., M, K], B [..., K, N], C [..., M, N].
void matmul(const MatView& a, const MatView& b, const OutView& c, bool accumulate = false);

// Convenience for the common 2-D case with row-major storage:
//   C(M,N) (+)= op(A) op(B), op = transpose when the flag is set.
// `a` is stored M×K (or K×M when trans_a); `b` is stored K×N (or N×K when trans_b).
void gemm(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t k, DType dtype, bool accumulate = false);

// Runs task(i) for every i < costs.size(): independent groups of GEMM calls (one expert's
// products each), costs[i] ∝ the work of task i. When two or more threads are available and
// the tasks split evenly among them (largest first, each to the least-loaded thread, the
// busiest thread at most 1.15× an even share), the tasks run concurrently, each GEMM on its
// calling thread alone: products of a few hundred rows run faster so than each split across
// the threads (perf_kernels BM_ExpertGemms). Otherwise they run one after another, each GEMM
// on every thread. A GEMM gives the same bits either way (gemm_test checks). The tasks'
// products count as products whose rows vary from call to call (GemmRows::exact_fixed).
void run_products(const std::vector<int64_t>& costs, const std::function<void(int64_t)>& task);

// task(i) for every i < n side by side on the threads, whatever the tasks' costs (dynamically,
// one at a time), each GEMM on its calling thread; the first exception a task throws is
// rethrown. For tasks whose own work, not only their products, needs every thread (the CCA's
// blocks of rows, kernels/cca_gemm.cpp); run_products runs its concurrent tasks so.
void run_side_by_side(int64_t n, const std::function<void(int64_t)>& task);

// How the token dimension of 2-D products reaches oneDNN: as a runtime dimension (one
// primitive serves every row count), or exactly: exact-m for the products whose rows are M
// (forward, input gradients: one primitive per count, created on first use, 0.6 ms here),
// exact-k for the weight gradients' K (rounded up to a multiple of 64 with zero rows, in
// scratch, so that a few primitives serve every count), exact for both. exact-fixed is
// exact-k, plus exact M for every product whose row count is the same call after call: all
// but the experts' (the tasks of run_products, whose rows change every step; of those, the
// gate|up projection's forward runs its rows' largest multiple of 64 exactly and the rest at
// runtime M, gemm.cpp). oneDNN 2.6 runs runtime shapes through its GEMM driver; on AMX cores
// exact shapes go to its brgemm kernels, 1.2-1.5x faster for the weight gradients and the
// layers' fixed-row products (docs/PERFORMANCE.md); elsewhere the driver is as fast or
// faster. Results are the same bits
// for a given mode and machine, not across modes. FOUNDRY_GEMM_ROWS=auto|runtime|exact-m|
// exact-k|exact|exact-fixed chooses; auto (the default) is exact-fixed on AMX cores and
// runtime elsewhere.
enum class GemmRows { runtime, exact_m, exact_k, exact, exact_fixed };
GemmRows gemm_rows_mode();
// Sets the mode for the rest of the process (tests and benchmarks compare the modes).
void set_gemm_rows_mode(GemmRows mode);
const char* gemm_rows_name(GemmRows mode);

// While one is alive (anywhere in the process), the token dimension of 2-D products is exact
// whatever the mode (exact-m, or exact under exact-k): each row of a product is then the same
// bits for any row count, as a runtime M is not (oneDNN's GEMM driver rounds one row
// differently from several). Decoding holds one, so that a sequence decodes to the same bits
// alone and beside others.
class RowInvariantGemms {
 public:
  RowInvariantGemms();
  ~RowInvariantGemms();
  RowInvariantGemms(const RowInvariantGemms&) = delete;
  RowInvariantGemms& operator=(const RowInvariantGemms&) = delete;
};

// Whether this CPU runs bf16 products as such (oneDNN 2.6 needs AVX-512). Below it, matmul
// widens bf16 operands to fp32 and runs fp32 products (the same inputs and fp32
// accumulation, at about the fp32 rate), and RowInvariantGemms' products run through
// kernels/row_products.h.
bool native_bf16_products();

// Number of cached oneDNN primitives (for tests and diagnostics).
size_t matmul_cache_size();

}  // namespace foundry
