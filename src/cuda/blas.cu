// detail::lt_matmul with cuBLASLt. Row-major C = op(A)·op(B) is column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, and a row-major matrix read as column-major is its transpose: so
// cuBLASLt's A is our B and its B our A, each transposed when ours is, with M and N swapped.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/gemm_shape.h"
#include "cuda/lt_matmul.h"

namespace foundry::gpu::detail {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Exact shapes whose descriptors are kept; past this many (the experts' row counts change every
// step) they are all released and rebuilt as they recur.
constexpr size_t kMaxPlans = 4096;

// One shape's descriptors (released with the plan, also when describing it fails halfway) and
// its algorithm. Movable, not copyable.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(Plan&& other) noexcept { *this = std::move(other); }
  Plan& operator=(Plan&& other) noexcept {
    std::swap(op, other.op);
    std::swap(a, other.a);
    std::swap(b, other.b);
    std::swap(c, other.c);
    algo = other.algo;
    return *this;
  }
  ~Plan() {
    for (cublasLtMatrixLayout_t layout : {c, b, a})
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// device, m, n, k, ta, tb, bf16, the operands' alignments (A, B, C in bytes), and A's and C's
// row strides as stored.
using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, bool, bool, uint32_t, uint32_t,
                       uint32_t, int64_t, int64_t>;

// The largest power of two up to 256 that divides the address: cuBLASLt's heuristic assumes
// 256-byte alignment unless told, and an algorithm chosen so refuses a sub-slice of a slab.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct Context {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<int, void*> workspaces;
  std::map<Key, Plan> plans;                                  // exact shapes
  // see representative(); nullopt where the heuristic had nothing for the representative
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> representative_algos;
};

Context& context() {
  static Context* c = new Context;  // never destroyed: no teardown order against the runtime
  return *c;
}

// The key of the shape whose heuristic choice this one runs with (gemm_shape.h).
Key representative(const Key& key) {
  const auto [device, m, n, k, trans_a, trans_b, bf16_inputs, align_a, align_b, align_c, lda,
              ldc] = key;
  const GemmShape r = gpu::representative(GemmShape{m, n, k, trans_a, trans_b, lda, ldc});
  return Key{device, r.m, r.n, r.k, r.trans_a, r.trans_b, bf16_inputs, align_a, align_b, align_c,
             r.lda, r.ldc};
}

// The operation and layout descriptors of a shape (no algorithm yet).
Plan describe(const Key& key) {
  const auto [device, m, n, k, trans_a, trans_b, bf16_inputs, align_a, align_b, align_c, lda,
              ldc] = key;
  (void)device, (void)align_a, (void)align_b, (void)align_c;
  Plan p;
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t lt_ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
  const cublasOperation_t lt_tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &lt_ta,
                                                      sizeof lt_ta));
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &lt_tb,
                                                      sizeof lt_tb));
  const cudaDataType_t in = bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
  // Stored shapes, column-major: our B is n × k (k × n when transposed), our A k × m (m × k).
  if (lt_ta == CUBLAS_OP_N)
    FOUNDRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, n, k, n));
  else
    FOUNDRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, k, n, k));
  if (lt_tb == CUBLAS_OP_N)
    FOUNDRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, k, m, lda));
  else
    FOUNDRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, m, k, lda));
  FOUNDRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, ldc));
  return p;
}

// cuBLASLt's first choice for a described shape within the workspace and the operands'
// alignments; false where it has none.
bool heuristic(cublasLtHandle_t handle, const Plan& p, const Key& key, cublasLtMatmulAlgo_t* algo) {
  const uint32_t align_a = std::get<7>(key), align_b = std::get<8>(key),
                 align_c = std::get<9>(key);
  cublasLtMatmulPreference_t preference = nullptr;
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = kWorkspaceBytes;
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  // cuBLASLt's A is our B, its B our A.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
  for (const auto& [attribute, value] : alignments)
    FOUNDRY_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c,
                                                               preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) FOUNDRY_CUBLAS_CHECK(status);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  *algo = result.algo;
  return true;
}

// The representative's algorithm where cuBLASLt accepts it for this exact shape, else the
// exact shape's own heuristic choice.
Plan make_plan(cublasLtHandle_t handle, const Key& key, Context& ctx) {
  const Key rep = representative(key);
  auto it = ctx.representative_algos.find(rep);
  if (it == ctx.representative_algos.end()) {
    cublasLtMatmulAlgo_t algo{};
    const bool found = heuristic(handle, describe(rep), rep, &algo);
    it = ctx.representative_algos
             .emplace(rep, found ? std::optional<cublasLtMatmulAlgo_t>(algo) : std::nullopt)
             .first;
  }
  Plan p = describe(key);
  cublasLtMatmulHeuristicResult_t check{};
  if (it->second &&
      cublasLtMatmulAlgoCheck(handle, p.op, p.a, p.b, p.c, p.c, &*it->second, &check) ==
          CUBLAS_STATUS_SUCCESS &&
      check.workspaceSize <= kWorkspaceBytes) {
    p.algo = *it->second;
    return p;
  }
  if (!heuristic(handle, p, key, &p.algo))
    FOUNDRY_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);  // no algorithm for this shape
  return p;
}

}  // namespace

void lt_matmul(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m,
               int64_t n, int64_t k, bool bf16_inputs, bool accumulate, int64_t lda,
               int64_t ldc) {
  int device = 0;
  FOUNDRY_CUDA_CHECK(cudaGetDevice(&device));
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  cublasLtHandle_t& handle = ctx.handles[device];
  if (!handle) {
    FOUNDRY_CUBLAS_CHECK(cublasLtCreate(&handle));
    FOUNDRY_CUDA_CHECK(cudaMalloc(&ctx.workspaces[device], kWorkspaceBytes));
  }
  const Key key{device,       m,           n,           k,   trans_a, trans_b, bf16_inputs,
                alignment(a), alignment(b), alignment(c), lda, ldc};
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) {
    if (ctx.plans.size() >= kMaxPlans) ctx.plans.clear();
    it = ctx.plans.emplace(key, make_plan(handle, key, ctx)).first;
  }
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  FOUNDRY_CUBLAS_CHECK(cublasLtMatmul(handle, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c,
                                      &p.algo, ctx.workspaces[device], kWorkspaceBytes,
                                      /*stream=*/nullptr));
}

}  // namespace foundry::gpu::detail
