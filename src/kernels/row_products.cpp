#include "kernels/row_products.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/error.h"

namespace foundry::ops {
namespace {

// Partial sums of x·Wᵀ's dot products (k ≡ j mod kLanes), and the columns of a K × N tile.
constexpr int64_t kLanes = 8;
constexpr int64_t kColumns = 16;
// Rows of A and columns of C (rows of W) a dot tile holds: 12 accumulators, so that two
// FMA pipes of 4 cycles' latency stay busy, beside A's two rows and one of W's in registers
// (16 on AVX2), 8 loads for 12 multiply-adds. W's rows come from L1 for every pair of rows.
// Rows of A an axpy tile holds.
constexpr int kDotRows = 2;
constexpr int64_t kDotColumns = 6;
constexpr int kAxpyRows = 4;
// Below this many multiply-adds a product runs on the calling thread.
constexpr int64_t kParallelMinWork = int64_t{1} << 18;

// Eight lanes as one vector (GCC's vector extensions: AVX registers wherever the build
// targets them).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint32_t WideBits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t HalfBits __attribute__((vector_size(kLanes * sizeof(uint16_t))));

inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline Lanes load_lanes(const bf16* p) {
  HalfBits h;
  std::memcpy(&h, p, sizeof(h));
  return reinterpret_cast<Lanes>(__builtin_convertvector(h, WideBits) << 16);
}
inline float widen(float x) { return x; }
inline float widen(bf16 x) { return bf16_to_float(x); }

// acc + a·b, fused where the build targets FMA (every AVX2 CPU has it), written out so that
// every tile shape gets the same rounding whatever the compiler contracts.
inline Lanes multiply_add(Lanes a, Lanes b, Lanes acc) {
#if defined(__FMA__) && defined(__AVX__)
  static_assert(sizeof(Lanes) == sizeof(__m256));
  __m256 va, vb, vc;
  std::memcpy(&va, &a, sizeof(va));
  std::memcpy(&vb, &b, sizeof(vb));
  std::memcpy(&vc, &acc, sizeof(vc));
  vc = _mm256_fmadd_ps(va, vb, vc);
  std::memcpy(&acc, &vc, sizeof(vc));
  return acc;
#else
  const Lanes product = a * b;
  return acc + product;
#endif
}
inline float multiply_add(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  const float product = a * b;
  return acc + product;
#endif
}

// out[r][j] = Σ_k x[r][k] · w[j][k] for R rows and J weight rows: lane l sums k ≡ l (mod
// kLanes) in order, the lanes are added in order, then the last K mod kLanes products in
// order. An element's arithmetic is the same whatever R and J.
template <int R, int J, typename T>
void dot_tile(const float* const* x, const T* const* w, int64_t k_len, float (&out)[R][J]) {
  Lanes acc[R][J] = {};
  int64_t k = 0;
  for (; k + kLanes <= k_len; k += kLanes) {
    Lanes xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load_lanes(x[r] + k);
    for (int j = 0; j < J; ++j) {
      const Lanes wv = load_lanes(w[j] + k);
      for (int r = 0; r < R; ++r) acc[r][j] = multiply_add(xv[r], wv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      float s = acc[r][j][0];
      for (int64_t l = 1; l < kLanes; ++l) s += acc[r][j][l];
      for (int64_t t = k; t < k_len; ++t) s = multiply_add(x[r][t], widen(w[j][t]), s);
      out[r][j] = s;
    }
}

// out[r][0 … n) = Σ_k x[r][k] · b[k][0 … n) for R rows, n ≤ kColumns columns of a K × N
// matrix (row stride ldb): one running sum per element, in k order.
template <int R, typename T>
void axpy_tile(const float* const* x, const T* b, int64_t ldb, int64_t n, int64_t k_len,
               float (&out)[R][kColumns]) {
  constexpr int V = kColumns / kLanes;
  Lanes acc[R][V] = {};
  for (int64_t k = 0; k < k_len; ++k) {
    Lanes bv[V];
    if (n == kColumns) {
      for (int v = 0; v < V; ++v) bv[v] = load_lanes(b + k * ldb + v * kLanes);
    } else {
      float row[kColumns] = {};
      for (int64_t l = 0; l < n; ++l) row[l] = widen(b[k * ldb + l]);
      for (int v = 0; v < V; ++v) bv[v] = load_lanes(row + v * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const Lanes a = Lanes{} + x[r][k];
      for (int v = 0; v < V; ++v) acc[r][v] = multiply_add(a, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) std::memcpy(out[r] + v * kLanes, &acc[r][v], sizeof(Lanes));
}

// Calls tile(r0, R) for R = Rows, then the rows left (a compile-time R each time).
template <int Rows, typename F>
void over_row_tiles(int64_t m, F&& tile) {
  static_assert(Rows >= 1 && Rows <= 4);
  int64_t r0 = 0;
  for (; r0 + Rows <= m; r0 += Rows) tile(r0, std::integral_constant<int, Rows>{});
  switch (m - r0) {
    case 3: tile(r0, std::integral_constant<int, 3>{}); break;
    case 2: tile(r0, std::integral_constant<int, 2>{}); break;
    case 1: tile(r0, std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

struct Views {
  const float* a;  // M × K, row stride lda
  int64_t lda, m, k, n;
  float* c;        // M × N, row stride ldc
  int64_t ldc;
  bool accumulate;
  void store(int64_t row, int64_t col, float sum) const {
    float& dst = c[row * ldc + col];
    dst = accumulate ? dst + sum : sum;
  }
};

// x·Wᵀ with W stored N × K (row stride ldw): tiles of kDotColumns weight rows, each read
// once for all the rows of A.
template <typename T>
void dot_products(const Views& v, const T* w, int64_t ldw) {
  const int64_t tiles = (v.n + kDotColumns - 1) / kDotColumns;
  const bool parallel = v.m * v.n * v.k >= kParallelMinWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * kDotColumns;
    const auto columns = [&](auto fixed_j) {
      constexpr int J = decltype(fixed_j)::value;
      const T* ws[J];
      for (int j = 0; j < J; ++j) ws[j] = w + (n0 + j) * ldw;
      over_row_tiles<kDotRows>(v.m, [&](int64_t r0, auto fixed_r) {
        constexpr int R = decltype(fixed_r)::value;
        const float* xs[R];
        for (int r = 0; r < R; ++r) xs[r] = v.a + (r0 + r) * v.lda;
        float out[R][J];
        dot_tile<R, J>(xs, ws, v.k, out);
        for (int r = 0; r < R; ++r)
          for (int j = 0; j < J; ++j) v.store(r0 + r, n0 + j, out[r][j]);
      });
    };
    switch (std::min<int64_t>(kDotColumns, v.n - n0)) {
      case 6: columns(std::integral_constant<int, 6>{}); break;
      case 5: columns(std::integral_constant<int, 5>{}); break;
      case 4: columns(std::integral_constant<int, 4>{}); break;
      case 3: columns(std::integral_constant<int, 3>{}); break;
      case 2: columns(std::integral_constant<int, 2>{}); break;
      default: columns(std::integral_constant<int, 1>{}); break;
    }
  }
}

// A · B with B stored K × N (row stride ldb): tiles of kColumns columns.
template <typename T>
void axpy_products(const Views& v, const T* b, int64_t ldb) {
  const int64_t tiles = (v.n + kColumns - 1) / kColumns;
  const bool parallel = v.m * v.n * v.k >= kParallelMinWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * kColumns, n = std::min(kColumns, v.n - n0);
    over_row_tiles<kAxpyRows>(v.m, [&](int64_t r0, auto fixed_r) {
      constexpr int R = decltype(fixed_r)::value;
      const float* xs[R];
      for (int r = 0; r < R; ++r) xs[r] = v.a + (r0 + r) * v.lda;
      float out[R][kColumns];
      axpy_tile<R>(xs, b + n0, ldb, n, v.k, out);
      for (int r = 0; r < R; ++r)
        for (int64_t l = 0; l < n; ++l) v.store(r0 + r, n0 + l, out[r][l]);
    });
  }
}

bool w_layout(const MatView& b) { return b.strides[0] == 1; }  // B = Wᵀ, W stored N × K

// dst = the view's rows × cols elements as fp32, row-major (bf16 widened exactly).
void pack(const MatView& v, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t at = i * v.strides[0] + j * v.strides[1];
      dst[i * cols + j] = v.dtype == DType::bf16 ? bf16_to_float(static_cast<const bf16*>(v.data)[at])
                                                 : static_cast<const float*>(v.data)[at];
    }
}

// A's rows as fp32 with unit column stride (a bf16 A, or a strided one, packed into the
// thread's scratch).
const float* rows_of(const MatView& a, int64_t& lda) {
  lda = a.strides[0];
  if (a.dtype == DType::f32 && a.strides[1] == 1) return static_cast<const float*>(a.data);
  thread_local std::vector<float> packed;
  packed.resize(static_cast<size_t>(a.dims[0] * a.dims[1]));
  pack(a, a.dims[0], a.dims[1], packed.data());
  lda = a.dims[1];
  return packed.data();
}

template <typename T>
void products_into(const Views& v, const MatView& b) {
  const T* data = static_cast<const T*>(b.data);
  if (w_layout(b))
    dot_products(v, data, b.strides[1]);
  else
    axpy_products(v, data, b.strides[0]);
}

}  // namespace

bool row_product_handles(const MatView& a, const MatView& b, const OutView& c) {
  return a.dims.size() == 2 && b.dims.size() == 2 && c.dims.size() == 2 && a.dtype == b.dtype;
}

void row_product(const MatView& a, const MatView& b, const OutView& c, bool accumulate) {
  FOUNDRY_CHECK(row_product_handles(a, b, c));
  const int64_t m = a.dims[0], k = a.dims[1], n = b.dims[1];
  FOUNDRY_CHECK(b.dims[0] == k && c.dims[0] == m && c.dims[1] == n);
  int64_t lda = 0;
  const float* x = rows_of(a, lda);
  // B in neither layout: packed K × N. C with a column stride: computed row-major, then added.
  MatView right = b;
  thread_local std::vector<float> packed_b, dense_c;
  if (b.strides[0] != 1 && b.strides[1] != 1) {
    packed_b.resize(static_cast<size_t>(k * n));
    pack(b, k, n, packed_b.data());
    right = MatView::rows_major(packed_b.data(), DType::f32, k, n);
  }
  const bool dense = c.strides[1] == 1;
  if (!dense) dense_c.assign(static_cast<size_t>(m * n), 0.0f);
  const Views v{x, lda, m, k, n, dense ? c.data : dense_c.data(), dense ? c.strides[0] : n,
                dense && accumulate};
  if (right.dtype == DType::bf16) products_into<bf16>(v, right);
  else products_into<float>(v, right);
  if (dense) return;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float& dst = c.data[r * c.strides[0] + j * c.strides[1]];
      dst = accumulate ? dst + dense_c[r * n + j] : dense_c[r * n + j];
    }
}

}  // namespace foundry::ops
