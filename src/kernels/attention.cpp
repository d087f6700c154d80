#include "kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/kernel_support.h"

namespace foundry::ops {
namespace {

// The self-attention of a whole sequence as a chunk: every row, at its own position.
AttentionChunk whole_sequence(const AttentionShape& s) {
  return {s.b, s.h, s.kvh, s.d, s.t, s.t, 0, s.t, 0};
}

// A chunk with its derived sizes.
struct Problem : AttentionChunk {
  int64_t g;  // query heads per kv head
  explicit Problem(const AttentionChunk& c) : AttentionChunk(c), g(c.h / c.kvh) {}
  // The key position of query row r.
  int64_t position(int64_t r) const { return r - q_begin + q_pos; }
};

void check_shape(const AttentionShape& s) {
  FOUNDRY_CHECK(s.b > 0 && s.t > 0 && s.h > 0 && s.kvh > 0 && s.d > 0);
  FOUNDRY_CHECK(s.h % s.kvh == 0);
}

Problem checked(const AttentionChunk& c) {
  FOUNDRY_CHECK(c.b > 0 && c.h > 0 && c.kvh > 0 && c.d > 0 && c.h % c.kvh == 0);
  FOUNDRY_CHECK(0 <= c.q_begin && c.q_begin < c.q_end && c.q_end <= c.q_rows);
  FOUNDRY_CHECK(c.q_pos >= 0 && c.q_pos + (c.q_end - c.q_begin) <= c.k_rows);
  return Problem(c);
}

size_t element_bytes(DType dt) { return dt == DType::bf16 ? sizeof(bf16) : sizeof(float); }

const void* at(const void* base, DType dt, int64_t elements) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(element_bytes(dt));
}

// Set by ScopedAttentionTile (tests); 0: the automatic choice.
int64_t g_tile_override = 0;

// Rows (and keys) per tile: the largest of 256, 128, 64 whose score tile over every head,
// B·H·tile² floats, fits in 4 MB, so a tile's softmax pass reads what its matmul just wrote
// from cache. Fewer, larger tiles amortize each matmul call (a few microseconds).
int64_t tile_size(const Problem& p) {
  const int64_t longest = std::max(p.q_end - p.q_begin, p.k_rows);
  if (g_tile_override > 0) return std::min(g_tile_override, longest);
  constexpr int64_t kTileBytes = 4 << 20;
  for (int64_t tile : {256, 128})
    if (p.b * p.h * tile * tile * static_cast<int64_t>(sizeof(float)) <= kTileBytes)
      return std::min(tile, longest);
  return std::min<int64_t>(64, longest);
}

// A matrix operand or output for a batch over [B, KVH].
MatView batch_view(const void* data, DType dt, const Problem& p, int64_t rows, int64_t cols,
                   std::array<int64_t, 4> strides) {
  return MatView{data, dt, {p.b, p.kvh, rows, cols}, {strides.begin(), strides.end()}};
}
OutView batch_out(float* data, const Problem& p, int64_t rows, int64_t cols,
                  std::array<int64_t, 4> strides) {
  return OutView{data, {p.b, p.kvh, rows, cols}, {strides.begin(), strides.end()}};
}

// The tensors of one (query block, key block) pair as matmul operands. A query block's rows
// are gathered head-major, [B, KVH, G·br, D] (the G query heads of a kv head stacked), and its
// score tiles are [B, KVH, G·br, bc]; keys and values are read from their key tiles
// (key_tiles: tile-major slots of [B, KVH, tile, D]).
struct TileViews {
  const Problem& p;
  int64_t tile;    // rows (and keys) per tile
  int64_t br, bc;  // query rows, keys of this tile

  int64_t rows() const { return p.g * br; }
  MatView block(const void* data, DType dt) const {  // Q, dO: [G·br, D]
    return batch_view(data, dt, p, rows(), p.d, {p.h * br * p.d, p.g * br * p.d, p.d, 1});
  }
  OutView block_out(float* data) const {
    return batch_out(data, p, rows(), p.d, {p.h * br * p.d, p.g * br * p.d, p.d, 1});
  }
  MatView scores(const void* data, DType dt) const {  // P, dS: [G·br, bc]
    return batch_view(data, dt, p, rows(), bc, {p.h * br * bc, p.g * br * bc, bc, 1});
  }
  MatView scores_t(const void* data, DType dt) const {  // P^T, dS^T: [bc, G·br]
    return batch_view(data, dt, p, bc, rows(), {p.h * br * bc, p.g * br * bc, 1, bc});
  }
  OutView scores_out(float* data) const {
    return batch_out(data, p, rows(), bc, {p.h * br * bc, p.g * br * bc, bc, 1});
  }
  // Keys [c0, c0 + bc) of k or v in their tile's slot (key_tiles): [bc, D], and transposed
  // [D, bc].
  MatView keys(const void* data, DType dt, int64_t c0) const {
    return batch_view(at(data, dt, slot_offset(c0)), dt, p, bc, p.d,
                      {p.kvh * tile * p.d, tile * p.d, p.d, 1});
  }
  MatView keys_t(const void* data, DType dt, int64_t c0) const {
    return batch_view(at(data, dt, slot_offset(c0)), dt, p, p.d, bc,
                      {p.kvh * tile * p.d, tile * p.d, 1, p.d});
  }
  OutView keys_out(float* data, int64_t c0) const {
    return batch_out(data + slot_offset(c0), p, bc, p.d, {p.kvh * tile * p.d, tile * p.d, p.d, 1});
  }
  int64_t slot_offset(int64_t c0) const { return c0 / tile * p.b * p.kvh * tile * p.d; }
  // How many of the tile's keys query row r (of the block starting at r0) sees.
  int64_t visible(int64_t r0, int64_t r, int64_t c0) const {
    return std::clamp<int64_t>(p.position(r0 + r) + 1 - c0, 0, bc);
  }
  // Whether any key of the tile lies after the block's first query (the tile needs masking).
  bool masked(int64_t r0, int64_t c0) const { return c0 + bc - 1 > p.position(r0); }
};

// Scratch that survives across calls (the kernels run on one thread at a time).
struct Scratch {
  detail::ScratchBuffer<bf16> k, v, block, block2, p, ds;
  detail::ScratchBuffer<float> k_f32, v_f32, dk, dv, block_f32, block2_f32, acc, s, dp, row_a,
      row_b;

  // A [count] buffer in the GEMM dtype: bf16 from `half`, fp32 from `full`.
  static void* of(DType dt, detail::ScratchBuffer<bf16>& half,
                  detail::ScratchBuffer<float>& full, int64_t count) {
    return dt == DType::bf16 ? static_cast<void*>(half.get(count))
                             : static_cast<void*>(full.get(count));
  }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Keys and values as the tiles' products read them: tile-major slots of [B, KVH, tile, D]
// each, in the GEMM dtype. Each tile's operand is then a dense batch of matrices, which
// oneDNN runs on its brgemm kernels (AMX where there is one); the keys' own layout
// [B, k_rows, KVH, D] gives strided batches, which go to its slower GEMM driver. Only the
// rows the chunk's queries can see are copied (later ones are never read, and may not be
// filled yet).
int64_t key_tiles_elements(const Problem& p, int64_t tile) {
  const int64_t seen = p.position(p.q_end - 1) + 1;
  return (seen + tile - 1) / tile * p.b * p.kvh * tile * p.d;
}

// f(row, slot) for every seen key row (b, r, h): `row` its offset in [B, k_rows, KVH, D],
// `slot` its offset in the key tiles.
template <typename F>
void for_each_key_row(const Problem& p, int64_t tile, F f) {
  const int64_t seen = p.position(p.q_end - 1) + 1;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.b; ++b)
    for (int64_t r = 0; r < seen; ++r)
      for (int64_t h = 0; h < p.kvh; ++h)
        f(((b * p.k_rows + r) * p.kvh + h) * p.d,
          (((r / tile * p.b + b) * p.kvh + h) * tile + r % tile) * p.d);
}

void* key_tiles(const float* x, const Problem& p, DType dt, int64_t tile,
                detail::ScratchBuffer<bf16>& half, detail::ScratchBuffer<float>& full) {
  void* out = Scratch::of(dt, half, full, key_tiles_elements(p, tile));
  for_each_key_row(p, tile, [&](int64_t row, int64_t slot) {
    if (dt == DType::bf16)
      detail::to_bf16_serial(x + row, static_cast<bf16*>(out) + slot, p.d);
    else
      std::copy_n(x + row, p.d, static_cast<float*>(out) + slot);
  });
  return out;
}

// Key-tile gradients (f32, key_tiles' layout) into dk [B, k_rows, KVH, D] for the rows the
// chunk's queries see: added, or written when `accumulate` is false.
void store_key_tiles(float* dk, const float* tiles, const Problem& p, int64_t tile,
                     bool accumulate) {
  for_each_key_row(p, tile, [&](int64_t row, int64_t slot) {
    float* to = dk + row;
    const float* from = tiles + slot;
    if (!accumulate) return static_cast<void>(std::copy_n(from, p.d, to));
#pragma omp simd
    for (int64_t x = 0; x < p.d; ++x) to[x] += from[x];
  });
}

// k and v of a call as matmul operands, and the tile size they are laid out for.
struct KvOperands {
  int64_t tile;
  const void* k;
  const void* v;
  KvOperands(const float* k_in, const float* v_in, const Problem& p, DType dt)
      : tile(tile_size(p)),
        k(key_tiles(k_in, p, dt, tile, scratch().k, scratch().k_f32)),
        v(key_tiles(v_in, p, dt, tile, scratch().v, scratch().v_f32)) {}
};

// Rows [r0, r0 + br) of src [B, q_rows, H, D] into dst [B, H, br, D] (= [B, KVH, G·br, D]) in
// the GEMM dtype.
void gather_block(void* dst, DType dt, const float* src, const Problem& p, int64_t r0,
                  int64_t br) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < p.b * p.h * br; ++row) {
    const int64_t r = row % br, bh = row / br, b = bh / p.h, h = bh % p.h;
    const float* from = src + ((b * p.q_rows + r0 + r) * p.h + h) * p.d;
    if (dt == DType::bf16)
      detail::to_bf16_serial(from, static_cast<bf16*>(dst) + row * p.d, p.d);
    else
      std::copy(from, from + p.d, static_cast<float*>(dst) + row * p.d);
  }
}

// The lse entry of block row `row` ([B, H, br] order).
int64_t lse_index(const Problem& p, int64_t r0, int64_t br, int64_t row) {
  return (row / br) * p.q_rows + r0 + row % br;
}

// ---- forward ----------------------------------------------------------------------------

// One key tile's softmax step for every row of the block: scores s [rows, bc] become
// probabilities exp(s·scale − m) (0 where masked) in place and, for bf16, in p_out; the
// running maximum m and sum l advance, and o [rows, D] is rescaled to the new maximum.
void online_softmax_tile(float* s, bf16* p_out, float* m, float* l, float* o,
                         const TileViews& tv, int64_t r0, int64_t c0, bool first, float scale) {
  const int64_t bc = tv.bc, d = tv.p.d, br = tv.br;
  const bool masked = tv.masked(r0, c0);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < tv.p.b * tv.p.h * br; ++row) {
    float* sr = s + row * bc;
    const int64_t n = masked ? tv.visible(r0, row % br, c0) : bc;
    const float m_old = first ? -std::numeric_limits<float>::infinity() : m[row];
    const float m_new = std::max(m_old, detail::max_of(sr, n) * scale);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      sr[j] = detail::exp_fast(sr[j] * scale - m_new);
      sum += sr[j];
    }
    std::fill(sr + n, sr + bc, 0.0f);
    if (first) {
      l[row] = sum;
    } else {
      const float alpha = detail::exp_fast(m_old - m_new);
      l[row] = l[row] * alpha + sum;
      if (alpha != 1.0f) {
        float* orow = o + row * d;
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) orow[x] *= alpha;
      }
    }
    m[row] = m_new;
    if (p_out) detail::to_bf16_serial(sr, p_out + row * bc, bc);
  }
}

// out rows [r0, r0 + br) = o / l, and lse = m + log l.
void finish_block(float* out, float* lse, const float* o, const float* m, const float* l,
                  const Problem& p, int64_t r0, int64_t br) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < p.b * p.h * br; ++row) {
    const int64_t r = row % br, bh = row / br, b = bh / p.h, h = bh % p.h;
    float* dst = out + ((b * p.q_rows + r0 + r) * p.h + h) * p.d;
    const float inv = 1.0f / l[row];
#pragma omp simd
    for (int64_t x = 0; x < p.d; ++x) dst[x] = o[row * p.d + x] * inv;
    lse[lse_index(p, r0, br, row)] = m[row] + std::log(l[row]);
  }
}

void forward_problem(float* out, float* lse, const float* q, const KvOperands& kv,
                     const Problem& p, DType dt, const std::function<void()>& between_blocks) {
  Scratch& sc = scratch();
  const int64_t tile = kv.tile;
  const void *kg = kv.k, *vg = kv.v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const int64_t block_rows = p.b * p.h * tile;
  void* qb = Scratch::of(dt, sc.block, sc.block_f32, block_rows * p.d);
  float* o = sc.acc.get(block_rows * p.d);
  float* s = sc.s.get(block_rows * tile);
  bf16* pb = dt == DType::bf16 ? sc.p.get(block_rows * tile) : nullptr;
  float* m = sc.row_a.get(block_rows);
  float* l = sc.row_b.get(block_rows);

  for (int64_t r0 = p.q_begin; r0 < p.q_end; r0 += tile) {
    const int64_t br = std::min(tile, p.q_end - r0);
    gather_block(qb, dt, q, p, r0, br);
    const int64_t keys = p.position(r0 + br - 1) + 1;
    for (int64_t c0 = 0; c0 < keys; c0 += tile) {
      const TileViews tv{p, tile, br, std::min(tile, keys - c0)};
      matmul(tv.block(qb, dt), tv.keys_t(kg, dt, c0), tv.scores_out(s));
      online_softmax_tile(s, pb, m, l, o, tv, r0, c0, c0 == 0, scale);
      matmul(tv.scores(pb ? static_cast<const void*>(pb) : s, dt), tv.keys(vg, dt, c0),
             tv.block_out(o), /*accumulate=*/c0 > 0);
    }
    finish_block(out, lse, o, m, l, p, r0, br);
    if (between_blocks) between_blocks();
  }
}

// ---- backward ---------------------------------------------------------------------------

// delta [B, H, br] = rowsum(dO ∘ O) over rows [r0, r0 + br), and lse rows in the same order.
void block_row_stats(float* delta, float* lse_rows, const float* dout, const float* out,
                     const float* lse, const Problem& p, int64_t r0, int64_t br) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < p.b * p.h * br; ++row) {
    const int64_t r = row % br, bh = row / br, b = bh / p.h, h = bh % p.h;
    const int64_t off = ((b * p.q_rows + r0 + r) * p.h + h) * p.d;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t x = 0; x < p.d; ++x) dot += dout[off + x] * out[off + x];
    delta[row] = dot;
    lse_rows[row] = lse[lse_index(p, r0, br, row)];
  }
}

// P = exp(S·scale − lse) (0 where masked) in place of s, dS = P∘(dP − delta)·scale in place of
// dp; for bf16 also into p_out and ds_out.
void softmax_backward_tile(float* s, float* dp, bf16* p_out, bf16* ds_out, const float* lse,
                           const float* delta, const TileViews& tv, int64_t r0, int64_t c0,
                           float scale) {
  const int64_t bc = tv.bc, br = tv.br;
  const bool masked = tv.masked(r0, c0);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < tv.p.b * tv.p.h * br; ++row) {
    float* sr = s + row * bc;
    float* dr = dp + row * bc;
    const int64_t n = masked ? tv.visible(r0, row % br, c0) : bc;
    const float lr = lse[row], dl = delta[row];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      sr[j] = detail::exp_fast(sr[j] * scale - lr);
      dr[j] = sr[j] * (dr[j] - dl) * scale;
    }
    std::fill(sr + n, sr + bc, 0.0f);
    std::fill(dr + n, dr + bc, 0.0f);
    if (p_out) {
      detail::to_bf16_serial(sr, p_out + row * bc, bc);
      detail::to_bf16_serial(dr, ds_out + row * bc, bc);
    }
  }
}

// dq rows [r0, r0 + br) from the block's accumulator [B, H, br, D].
void scatter_block(float* dq, const float* acc, const Problem& p, int64_t r0, int64_t br) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < p.b * p.h * br; ++row) {
    const int64_t r = row % br, bh = row / br, b = bh / p.h, h = bh % p.h;
    std::copy(acc + row * p.d, acc + (row + 1) * p.d,
              dq + ((b * p.q_rows + r0 + r) * p.h + h) * p.d);
  }
}

// dq rows of the problem (writes); dk, dv [B, k_rows, KVH, D] accumulate, or are written
// (rows the problem's queries see) when accumulate_dkv is false.
void backward_problem(float* dq, float* dk, float* dv, bool accumulate_dkv, const float* dout,
                      const float* out, const float* lse, const float* q, const KvOperands& kv,
                      const Problem& p, DType dt, const std::function<void()>& between_blocks) {
  Scratch& sc = scratch();
  const int64_t tile = kv.tile;
  const void *kg = kv.k, *vg = kv.v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const int64_t block_rows = p.b * p.h * tile;
  void* qb = Scratch::of(dt, sc.block, sc.block_f32, block_rows * p.d);
  void* dob = Scratch::of(dt, sc.block2, sc.block2_f32, block_rows * p.d);
  float* dqb = sc.acc.get(block_rows * p.d);
  float* s = sc.s.get(block_rows * tile);
  float* dp = sc.dp.get(block_rows * tile);
  bf16* pb = dt == DType::bf16 ? sc.p.get(block_rows * tile) : nullptr;
  bf16* dsb = dt == DType::bf16 ? sc.ds.get(block_rows * tile) : nullptr;
  const void* pg = pb ? static_cast<const void*>(pb) : s;
  const void* dsg = dsb ? static_cast<const void*>(dsb) : dp;
  float* delta = sc.row_a.get(block_rows);
  float* lse_rows = sc.row_b.get(block_rows);
  const int64_t tiles_count = key_tiles_elements(p, tile);
  float* dk_tiles = sc.dk.get(tiles_count);
  float* dv_tiles = sc.dv.get(tiles_count);
  std::fill(dk_tiles, dk_tiles + tiles_count, 0.0f);
  std::fill(dv_tiles, dv_tiles + tiles_count, 0.0f);

  for (int64_t r0 = p.q_begin; r0 < p.q_end; r0 += tile) {
    const int64_t br = std::min(tile, p.q_end - r0);
    gather_block(qb, dt, q, p, r0, br);
    gather_block(dob, dt, dout, p, r0, br);
    block_row_stats(delta, lse_rows, dout, out, lse, p, r0, br);
    const int64_t keys = p.position(r0 + br - 1) + 1;
    for (int64_t c0 = 0; c0 < keys; c0 += tile) {
      const TileViews tv{p, tile, br, std::min(tile, keys - c0)};
      matmul(tv.block(qb, dt), tv.keys_t(kg, dt, c0), tv.scores_out(s));
      matmul(tv.block(dob, dt), tv.keys_t(vg, dt, c0), tv.scores_out(dp));
      softmax_backward_tile(s, dp, pb, dsb, lse_rows, delta, tv, r0, c0, scale);
      matmul(tv.scores_t(pg, dt), tv.block(dob, dt), tv.keys_out(dv_tiles, c0),
             /*accumulate=*/true);
      matmul(tv.scores_t(dsg, dt), tv.block(qb, dt), tv.keys_out(dk_tiles, c0),
             /*accumulate=*/true);
      matmul(tv.scores(dsg, dt), tv.keys(kg, dt, c0), tv.block_out(dqb), /*accumulate=*/c0 > 0);
    }
    scatter_block(dq, dqb, p, r0, br);
    if (between_blocks) between_blocks();
  }
  store_key_tiles(dk, dk_tiles, p, tile, accumulate_dkv);
  store_key_tiles(dv, dv_tiles, p, tile, accumulate_dkv);
}

}  // namespace

int64_t attention_tile_rows(const AttentionShape& s) {
  check_shape(s);
  return tile_size(Problem(whole_sequence(s)));
}

int64_t attention_scratch_bytes(const AttentionShape& s, DType dtype) {
  check_shape(s);
  const Problem p = Problem(whole_sequence(s));
  const int64_t tile = tile_size(p), f32 = sizeof(float);
  const int64_t in = static_cast<int64_t>(element_bytes(dtype));
  const int64_t block_rows = s.b * s.h * tile;
  const int64_t half = dtype == DType::bf16 ? static_cast<int64_t>(sizeof(bf16)) : 0;
  // k and v in key tiles, and the backward's key-tile gradients.
  const int64_t tiled = key_tiles_elements(p, tile);
  const int64_t kv_copies = 2 * in * tiled + 2 * f32 * tiled;
  return kv_copies + block_rows * s.d * (2 * in + f32) + block_rows * tile * 2 * (f32 + half) +
         2 * block_rows * f32;
}

void attention_chunk_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionChunk& c, DType dtype,
                             const std::function<void()>& between_blocks) {
  const Problem p = checked(c);
  const KvOperands kv(k, v, p, dtype);
  forward_problem(out, lse, q, kv, p, dtype, between_blocks);
}

void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const AttentionChunk& c, DType dtype,
                              const std::function<void()>& between_blocks) {
  const Problem p = checked(c);
  const KvOperands kv(k, v, p, dtype);
  backward_problem(dq, dk, dv, /*accumulate_dkv=*/true, dout, out, lse, q, kv, p, dtype,
                   between_blocks);
}

ScopedAttentionTile::ScopedAttentionTile(int64_t rows) : previous_(g_tile_override) {
  g_tile_override = rows;
}
ScopedAttentionTile::~ScopedAttentionTile() { g_tile_override = previous_; }

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s, DType dtype) {
  check_shape(s);
  attention_chunk_forward(out, lse, q, k, v, whole_sequence(s), dtype);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const AttentionShape& s, DType dtype) {
  check_shape(s);
  const Problem p(whole_sequence(s));  // its queries see every key row: dk, dv are written
  const KvOperands kv(k, v, p, dtype);
  backward_problem(dq, dk, dv, /*accumulate_dkv=*/false, dout, out, lse, q, kv, p, dtype, {});
}

namespace {

// Output dims a head's weighted sum keeps in registers at a time (4 AVX-512 vectors).
constexpr int64_t kDecodeRow = 64;

// Rows that read the same span at the same place in their chains (a shared prefix at one
// depth of the prefix tree), for one decode call: the span and, per row, the position its
// first key takes in that row's run.
struct SpanGroup {
  DecodeSpan span;
  std::vector<int64_t> rows, base;
};

// The groups of chain level `level` (each row's level-th span, where it has one): rows whose
// span there is the same storage and length read it together.
std::vector<SpanGroup> span_groups(const DecodeSpan* spans, const int64_t* first, int64_t rows,
                                   int64_t level) {
  std::vector<SpanGroup> groups;
  for (int64_t r = 0; r < rows; ++r) {
    if (first[r] + level >= first[r + 1]) continue;
    int64_t base = 0;
    for (int64_t s = first[r]; s < first[r] + level; ++s) base += spans[s].len;
    const DecodeSpan& span = spans[first[r] + level];
    auto same = std::find_if(groups.begin(), groups.end(), [&](const SpanGroup& g) {
      return g.span.k == span.k && g.span.len == span.len;
    });
    if (same == groups.end()) same = groups.insert(groups.end(), SpanGroup{span, {}, {}});
    same->rows.push_back(r);
    same->base.push_back(base);
  }
  return groups;
}

// Rows a group's task takes at most: a group of many rows (a prefix shared by a whole batch)
// is split so that every thread has work; each part still reads the span once for its rows.
constexpr size_t kGroupRows = 8;

std::vector<SpanGroup> split_groups(std::vector<SpanGroup> groups) {
  std::vector<SpanGroup> out;
  for (SpanGroup& g : groups) {
    if (g.rows.size() <= kGroupRows) {
      out.push_back(std::move(g));
      continue;
    }
    for (size_t at = 0; at < g.rows.size(); at += kGroupRows) {
      const size_t end = std::min(g.rows.size(), at + kGroupRows);
      out.push_back({g.span, {g.rows.begin() + at, g.rows.begin() + end},
                     {g.base.begin() + at, g.base.begin() + end}});
    }
  }
  return out;
}

// Where (row, head) pair p of a group (for KV head g: row p / group, query head g·group +
// p % group) keeps its query and output row, [r·h + head]·d, and its scores at the span's first
// position.
struct PairRows {
  int64_t query, scores;
};
PairRows pair_rows(const SpanGroup& grp, int64_t p, const int64_t* lens, int64_t g, int64_t h,
                   int64_t group, int64_t d, int64_t max_len) {
  const int64_t m = p / group, head = g * group + p % group, r = grp.rows[m];
  return {(r * h + head) * d, r * h * max_len + head * lens[r] + grp.base[m]};
}

// T (row, head) pairs' scores against one key block: acc[a][x] = Σ_i qs[a][i] · block[i, x],
// summed over i in order; the T sums are independent, so their multiply-adds overlap.
template <int T>
void score_tile(float (&acc)[T][kDecodeBlock], const float* const* qs, const float* block,
                int64_t d) {
  for (int a = 0; a < T; ++a)
    for (int64_t x = 0; x < kDecodeBlock; ++x) acc[a][x] = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    const float* row = block + i * kDecodeBlock;
#pragma GCC unroll 8
    for (int a = 0; a < T; ++a) {
      const float qi = qs[a][i];
#pragma omp simd
      for (int64_t x = 0; x < kDecodeBlock; ++x) acc[a][x] += qi * row[x];
    }
  }
}

// (Row, head) pairs a key block serves at once.
constexpr int64_t kScoreTile = 6;

// scores[r, j, base + t] = scale · Σ_i q[r, j, i] · k[t, i] for the group's rows r, the query
// heads j of KV head g, the span's positions t: each key block read once for all of them,
// each score summed over i in order.
void span_scores(float* scores, int64_t max_len, const float* q, const SpanGroup& grp,
                 const int64_t* lens, int64_t g, int64_t h, int64_t group, int64_t d,
                 float scale) {
  constexpr int64_t W = kDecodeBlock;
  const float* kb = grp.span.k + g * grp.span.head_floats(d);
  const int64_t pairs = static_cast<int64_t>(grp.rows.size()) * group;
  for (int64_t t0 = 0; t0 < grp.span.len; t0 += W) {
    const float* block = kb + (t0 / W) * d * W;
    const int64_t n = std::min(W, grp.span.len - t0);
    for (int64_t p0 = 0; p0 < pairs; p0 += kScoreTile) {
      const int64_t tn = std::min(kScoreTile, pairs - p0);
      const float* qs[kScoreTile];
      float* out[kScoreTile];
      for (int64_t a = 0; a < tn; ++a) {
        const PairRows at = pair_rows(grp, p0 + a, lens, g, h, group, d, max_len);
        qs[a] = q + at.query;
        out[a] = scores + at.scores + t0;
      }
      const auto tile = [&](auto fixed) {
        constexpr int T = decltype(fixed)::value;
        float acc[T][W];
        score_tile<T>(acc, qs, block, d);
        for (int a = 0; a < T; ++a)
          for (int64_t x = 0; x < n; ++x) out[a][x] = acc[a][x] * scale;
      };
      switch (tn) {
        case 1: tile(std::integral_constant<int, 1>{}); break;
        case 2: tile(std::integral_constant<int, 2>{}); break;
        case 3: tile(std::integral_constant<int, 3>{}); break;
        case 4: tile(std::integral_constant<int, 4>{}); break;
        case 5: tile(std::integral_constant<int, 5>{}); break;
        default: tile(std::integral_constant<int, 6>{}); break;
      }
    }
  }
}

// Positions of a span whose value rows stay in L1 while each row of a group sums over them
// (32 × 64 dims × 4 B = 8 KB at d = 64).
constexpr int64_t kValueBlock = 32;

// T (row, head) pairs' outputs o[a][i0 … i0 + kDecodeRow) += Σ_t ps[a][t] · v[t, i0 + i] over
// a block of tn positions in order, in registers; each value row read once for the T pairs.
template <int T>
void value_tile(float* const* o, const float* const* ps, const float* block, int64_t tn,
                int64_t d, int64_t i0) {
  float acc[T][kDecodeRow];
  for (int a = 0; a < T; ++a) std::copy(o[a] + i0, o[a] + i0 + kDecodeRow, acc[a]);
  for (int64_t t = 0; t < tn; ++t) {
    const float* vi = block + t * d + i0;
#pragma GCC unroll 4
    for (int a = 0; a < T; ++a) {
      const float p = ps[a][t];
#pragma omp simd
      for (int64_t i = 0; i < kDecodeRow; ++i) acc[a][i] += p * vi[i];
    }
  }
  for (int a = 0; a < T; ++a) std::copy(acc[a], acc[a] + kDecodeRow, o[a] + i0);
}

// (Row, head) pairs a block of value rows serves at once.
constexpr int64_t kValueTile = 3;

// out[r, j, :] += Σ_t p[r, j, base + t] · v[t, :] over the span's positions in order, for the
// group's rows and query heads of KV head g: a block of value rows at a time, read from memory
// once for all of them; each output chunk sums a block's positions in registers.
void span_values(float* out, const float* scores, int64_t max_len, const SpanGroup& grp,
                 const int64_t* lens, int64_t g, int64_t h, int64_t group, int64_t d) {
  const float* vb = grp.span.v + g * grp.span.head_floats(d);
  const int64_t pairs = static_cast<int64_t>(grp.rows.size()) * group;
  for (int64_t t0 = 0; t0 < grp.span.len; t0 += kValueBlock) {
    const int64_t tn = std::min(kValueBlock, grp.span.len - t0);
    const float* block = vb + t0 * d;
    for (int64_t p0 = 0; p0 < pairs; p0 += kValueTile) {
      const int64_t pn = std::min(kValueTile, pairs - p0);
      const float* ps[kValueTile];
      float* o[kValueTile];
      for (int64_t a = 0; a < pn; ++a) {
        const PairRows at = pair_rows(grp, p0 + a, lens, g, h, group, d, max_len);
        ps[a] = scores + at.scores + t0;
        o[a] = out + at.query;
      }
      int64_t i0 = 0;
      for (; i0 + kDecodeRow <= d; i0 += kDecodeRow) {
        if (pn == 3) value_tile<3>(o, ps, block, tn, d, i0);
        else if (pn == 2) value_tile<2>(o, ps, block, tn, d, i0);
        else value_tile<1>(o, ps, block, tn, d, i0);
      }
      for (int64_t a = 0; a < pn && i0 < d; ++a)  // d not a multiple of kDecodeRow
        for (int64_t t = 0; t < tn; ++t)
          for (int64_t i = i0; i < d; ++i) o[a][i] += ps[a][t] * block[t * d + i];
    }
  }
}

// Softmax of each (row, head)'s scores in place; returns 1 / Σ p per (row, head). The
// normalization is applied to the weighted sums, once per output.
std::vector<float> softmax_rows(float* scores, int64_t max_len, const int64_t* lens,
                                int64_t rows, int64_t h, bool parallel) {
  std::vector<float> inv(rows * h);
#pragma omp parallel for schedule(static) if (parallel && rows * h > 1)
  for (int64_t rj = 0; rj < rows * h; ++rj) {
    const int64_t r = rj / h, j = rj % h, len = lens[r];
    float* sj = scores + r * h * max_len + j * len;
    const float max_score = detail::max_of(sj, len);
    // Lane k sums positions t ≡ k (mod 16) in order; the lanes are added in order in double.
    constexpr int64_t L = 16;
    float lanes[L] = {};
    int64_t t0 = 0;
    for (; t0 + L <= len; t0 += L) {
#pragma omp simd
      for (int64_t k = 0; k < L; ++k) {
        const float e = detail::exp_fast(sj[t0 + k] - max_score);
        sj[t0 + k] = e;
        lanes[k] += e;
      }
    }
    for (int64_t k = 0; t0 + k < len; ++k) {
      sj[t0 + k] = detail::exp_fast(sj[t0 + k] - max_score);
      lanes[k] += sj[t0 + k];
    }
    double sum = 0;
    for (float lane : lanes) sum += lane;
    inv[rj] = static_cast<float>(1.0 / sum);
  }
  return inv;
}

}  // namespace

DecodeSpan decode_span(const DecodeKv& c, int64_t b, int64_t len) {
  return {c.k + b * c.kvh * c.head_floats(), c.v + b * c.kvh * c.head_floats(), len, c.max_len};
}

void check_decode_store(const DecodeSpan& s, int64_t at) {
  if (at < 0 || at >= s.capacity)
    fail(fmt::format("decode position {} is outside the cache of {} positions", at, s.capacity),
         "make the decode state longer (its max_len) or stop at its end");
}

void decode_span_store(const DecodeSpan& s, int64_t at, const float* k, const float* v,
                       int64_t kvh, int64_t d) {
  check_decode_store(s, at);
  const int64_t W = kDecodeBlock, head = s.head_floats(d);
  for (int64_t g = 0; g < kvh; ++g) {
    const float* kr = k + g * d;
    float* kb = s.k + g * head + (at / W) * d * W + at % W;
    for (int64_t i = 0; i < d; ++i) kb[i * W] = kr[i];
    std::copy(v + g * d, v + (g + 1) * d, s.v + g * head + at * d);
  }
}

void decode_kv_store(const DecodeKv& c, int64_t pos, const float* k, const float* v) {
  for (int64_t b = 0; b < c.batch; ++b)
    decode_span_store(decode_span(c, b, pos + 1), pos, k + b * c.kvh * c.d, v + b * c.kvh * c.d,
                      c.kvh, c.d);
}

void attention_decode(float* out, float* scores, const float* q, const DecodeKv& c,
                      int64_t len, int64_t h) {
  std::vector<DecodeSpan> spans(c.batch);
  std::vector<int64_t> first(c.batch + 1, 0);
  for (int64_t b = 0; b < c.batch; ++b) spans[b] = decode_span(c, b, len), first[b + 1] = b + 1;
  attention_decode_rows(out, scores, len, q, spans.data(), first.data(), c.batch, h, c.kvh, c.d);
}

void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                           const DecodeSpan* spans, const int64_t* first, int64_t rows,
                           int64_t h, int64_t kvh, int64_t d) {
  const int64_t group = h / kvh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<int64_t> lens(rows, 0);
  int64_t positions = 0, levels = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = first[r]; s < first[r + 1]; ++s) lens[r] += spans[s].len;
    FOUNDRY_CHECK(lens[r] >= 1 && lens[r] <= max_len);
    positions += lens[r];
    levels = std::max(levels, first[r + 1] - first[r]);
  }
  const bool parallel = h * positions * d >= detail::kParallelMinElements;
  // Level by level (each row's spans in order), the rows sharing a span together.
  std::vector<std::vector<SpanGroup>> groups(levels);
  std::vector<const SpanGroup*> all;  // every level's groups: the scores' tasks
  for (int64_t level = 0; level < levels; ++level) {
    groups[level] = split_groups(span_groups(spans, first, rows, level));
    for (const SpanGroup& g : groups[level]) all.push_back(&g);
  }
  // Scores: each (group, KV head) writes its own part of the rows' scores.
  const int64_t score_tasks = static_cast<int64_t>(all.size()) * kvh;
#pragma omp parallel for schedule(dynamic) if (parallel && score_tasks > 1)
  for (int64_t task = 0; task < score_tasks; ++task)
    span_scores(scores, max_len, q, *all[task / kvh], lens.data(), task % kvh, h, group, d,
                scale);
  const std::vector<float> inv = softmax_rows(scores, max_len, lens.data(), rows, h, parallel);
  std::fill(out, out + rows * h * d, 0.0f);
  // Weighted sums: a row's levels in order, so one level's groups at a time.
  for (const std::vector<SpanGroup>& level : groups) {
    const int64_t tasks = static_cast<int64_t>(level.size()) * kvh;
#pragma omp parallel for schedule(dynamic) if (parallel && tasks > 1)
    for (int64_t task = 0; task < tasks; ++task)
      span_values(out, scores, max_len, level[task / kvh], lens.data(), task % kvh, h, group, d);
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t rj = 0; rj < rows * h; ++rj)
    for (int64_t i = 0; i < d; ++i) out[rj * d + i] *= inv[rj];
}

void attention_reference(double* out, const double* q, const double* k, const double* v,
                         const AttentionShape& s) {
  check_shape(s);
  const int64_t g = s.h / s.kvh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> weights(s.t);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h)
      for (int64_t i = 0; i < s.t; ++i) {
        const double* qi = q + ((b * s.t + i) * s.h + h) * s.d;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const double* kj = k + ((b * s.t + j) * s.kvh + h / g) * s.d;
          double dot = 0;
          for (int64_t x = 0; x < s.d; ++x) dot += qi[x] * kj[x];
          weights[j] = dot * scale;
          max_score = std::max(max_score, weights[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          weights[j] = std::exp(weights[j] - max_score);
          sum += weights[j];
        }
        double* oi = out + ((b * s.t + i) * s.h + h) * s.d;
        for (int64_t x = 0; x < s.d; ++x) oi[x] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double* vj = v + ((b * s.t + j) * s.kvh + h / g) * s.d;
          for (int64_t x = 0; x < s.d; ++x) oi[x] += weights[j] / sum * vj[x];
        }
      }
}

}  // namespace foundry::ops
