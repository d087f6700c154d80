// ops.h's operations that sort: the embedding's backward and the MoE dispatch plan (CUB's
// stable radix sort), and the router's backward and auxiliary loss.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace foundry::gpu::ops {

namespace {

constexpr int kThreads = kBlockThreads;
constexpr int64_t kAuxRowsPerChunk = 256;  // as the CPU's router_aux_loss

int bits_for(int64_t values) {  // radix bits that hold 0 .. values−1
  int bits = 1;
  while ((int64_t{1} << bits) < values) ++bits;
  return bits;
}

__global__ void iota_kernel(int32_t* x, int64_t n) { FOUNDRY_FOR_EACH(i, n) x[i] = static_cast<int32_t>(i); }

// Sorts (key, index) pairs by key, stably: keys_out, index_out. The scratch comes from the
// workspace after the four arrays.
void sort_by_key(const int32_t* keys, int64_t n, int64_t key_values, Workspace& workspace,
                 int32_t** keys_out, int32_t** index_out) {
  size_t temp_bytes = 0;
  FOUNDRY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, keys, static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), n, 0, bits_for(key_values)));
  const int64_t array = (n * 4 + 255) / 256 * 256;
  char* base = static_cast<char*>(workspace.get(3 * array + static_cast<int64_t>(temp_bytes)));
  int32_t* index_in = reinterpret_cast<int32_t*>(base);
  *keys_out = reinterpret_cast<int32_t*>(base + array);
  *index_out = reinterpret_cast<int32_t*>(base + 2 * array);
  iota_kernel<<<blocks_for(n), kThreads>>>(index_in, n);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
  FOUNDRY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * array, temp_bytes, keys, *keys_out,
                                                     index_in, *index_out, n, 0,
                                                     bits_for(key_values)));
}

// Block s starts a run when sorted key s differs from key s−1; it sums the run's rows of dout
// (positions ascending: the sort is stable) onto the token's row of dwte.
__global__ void embedding_runs_kernel(float* dwte, const float* dout, const int32_t* keys,
                                      const int32_t* positions, int64_t n, int64_t c) {
  const int64_t s = blockIdx.x;
  if (s > 0 && keys[s] == keys[s - 1]) return;
  const int64_t token = keys[s];
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float acc = dwte[token * c + j];
    for (int64_t r = s; r < n && keys[r] == token; ++r) acc += dout[positions[r] * c + j];
    dwte[token * c + j] = acc;
  }
}

__global__ void plan_slots_kernel(int32_t* slot_token, int32_t* assignment_slot,
                                  const int32_t* sorted_assignment, int64_t rows, int64_t k) {
  FOUNDRY_FOR_EACH(s, rows) {
    const int32_t a = sorted_assignment[s];
    slot_token[s] = static_cast<int32_t>(a / k);
    assignment_slot[a] = static_cast<int32_t>(s);
  }
}

// offsets[e] = the first sorted row of expert e (a binary search), offsets[E] = rows.
__global__ void plan_offsets_kernel(int64_t* offsets, const int32_t* sorted_expert, int64_t rows,
                                    int64_t e) {
  FOUNDRY_FOR_EACH(x, e + 1) {
    int64_t lo = 0, hi = rows;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted_expert[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    offsets[x] = lo;
  }
}

__global__ void fractions_kernel(double* fractions, const int64_t* offsets, int64_t e,
                                 int64_t assignments) {
  FOUNDRY_FOR_EACH(x, e)
  fractions[x] = static_cast<double>(offsets[x + 1] - offsets[x]) / static_cast<double>(assignments);
}

__global__ void router_backward_kernel(float* dlogits, const float* dtopk_w, const float* probs,
                                       const int32_t* topk_idx, const float* topk_w, int64_t n,
                                       int64_t e, int64_t k, bool renormalize, float aux_coef,
                                       const double* fractions) {
  FOUNDRY_FOR_EACH(i, n) {
    const float* p = probs + i * e;
    const int32_t* idx = topk_idx + i * k;
    const float* w = topk_w + i * k;
    const float* dw = dtopk_w + i * k;
    float* dz = dlogits + i * e;
    // dz first holds dprobs: the aux loss's share, then the chosen experts'.
    for (int64_t j = 0; j < e; ++j)
      dz[j] = aux_coef != 0.0f ? static_cast<float>(static_cast<double>(aux_coef) *
                                                    static_cast<double>(e) * fractions[j] /
                                                    static_cast<double>(n))
                               : 0.0f;
    if (renormalize) {
      float selected_sum = 0, dw_dot_w = 0;
      for (int64_t slot = 0; slot < k; ++slot) {
        selected_sum += p[idx[slot]];
        dw_dot_w += dw[slot] * w[slot];
      }
      for (int64_t slot = 0; slot < k; ++slot) dz[idx[slot]] += (dw[slot] - dw_dot_w) / selected_sum;
    } else {
      for (int64_t slot = 0; slot < k; ++slot) dz[idx[slot]] += dw[slot];
    }
    float dot = 0;
    for (int64_t j = 0; j < e; ++j) dot += dz[j] * p[j];
    for (int64_t j = 0; j < e; ++j) dz[j] = p[j] * (dz[j] - dot);
  }
}

// partials [chunks, E]: each chunk's column sums in double.
__global__ void aux_partials_kernel(double* partials, const float* probs, int64_t n, int64_t e) {
  const int64_t chunks = (n + kAuxRowsPerChunk - 1) / kAuxRowsPerChunk;
  FOUNDRY_FOR_EACH(index, chunks * e) {
    const int64_t chunk = index / e, x = index % e;
    const int64_t end = min(n, (chunk + 1) * kAuxRowsPerChunk);
    double sum = 0;
    for (int64_t i = chunk * kAuxRowsPerChunk; i < end; ++i) sum += probs[i * e + x];
    partials[index] = sum;
  }
}

__global__ void aux_total_kernel(double* aux, const double* partials, const double* fractions,
                                 int64_t n, int64_t e) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int64_t chunks = (n + kAuxRowsPerChunk - 1) / kAuxRowsPerChunk;
  double total = 0;
  for (int64_t x = 0; x < e; ++x) {
    double prob_sum = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) prob_sum += partials[chunk * e + x];
    total += fractions[x] * prob_sum / static_cast<double>(n);
  }
  *aux = static_cast<double>(e) * total;
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t n, int64_t c) {
  // The same row gather as the MoE's (out [n, :] = wte [tokens[n], :]): by rows, in float4s
  // where c allows, with no division per element.
  if (n * c == 0) return;
  moe_gather(out, wte, tokens, n, c);
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t n,
                        int64_t c, int64_t v, Workspace& workspace) {
  if (n == 0) return;
  int32_t *keys = nullptr, *positions = nullptr;
  sort_by_key(tokens, n, v, workspace, &keys, &positions);
  embedding_runs_kernel<<<static_cast<unsigned>(n), kThreads>>>(dwte, dout, keys, positions, n, c);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void moe_dispatch_plan(int64_t* expert_offsets, int32_t* slot_token, int32_t* assignment_slot,
                       const int32_t* topk_idx, int64_t n, int64_t e, int64_t k,
                       Workspace& workspace) {
  const int64_t rows = n * k;
  if (rows > 0) {
    int32_t *experts = nullptr, *assignments = nullptr;
    sort_by_key(topk_idx, rows, e, workspace, &experts, &assignments);
    plan_slots_kernel<<<blocks_for(rows), kThreads>>>(slot_token, assignment_slot, assignments,
                                                      rows, k);
    FOUNDRY_CUDA_CHECK(cudaGetLastError());
    plan_offsets_kernel<<<blocks_for(e + 1), kThreads>>>(expert_offsets, experts, rows, e);
  } else {
    FOUNDRY_CUDA_CHECK(cudaMemset(expert_offsets, 0, static_cast<size_t>(e + 1) * 8));
  }
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void expert_fractions(double* fractions, const int64_t* expert_offsets, int64_t e,
                      int64_t assignments) {
  fractions_kernel<<<blocks_for(e), kThreads>>>(fractions, expert_offsets, e, assignments);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                     const int32_t* topk_idx, const float* topk_w, int64_t n, int64_t e,
                     int64_t k, bool renormalize, float aux_coef, const double* fractions) {
  router_backward_kernel<<<blocks_for(n), kThreads>>>(dlogits, dtopk_w, probs, topk_idx, topk_w,
                                                      n, e, k, renormalize, aux_coef, fractions);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

int64_t router_aux_scratch(int64_t n, int64_t e) {
  return (n + kAuxRowsPerChunk - 1) / kAuxRowsPerChunk * e;
}

void router_aux_loss(double* aux, const float* probs, const double* fractions, int64_t n,
                     int64_t e, double* scratch) {
  aux_partials_kernel<<<blocks_for(router_aux_scratch(n, e)), kThreads>>>(scratch, probs, n, e);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
  aux_total_kernel<<<1, 32>>>(aux, scratch, fractions, n, e);
  FOUNDRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace foundry::gpu::ops
