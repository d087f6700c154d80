// Causal grouped-query attention core (after the q/k/v projections and RoPE), tiled with an
// online softmax: memory grows linearly with the sequence, never with T×T.
//
//   q [B, T, H, D], k/v [B, T, KVH, D] (H a multiple of KVH; query head h uses kv head
//   h / (H/KVH)), out [B, T, H, D]; row t attends to positions 0..t.
//   lse [B, H, T] (writes) is saved for backward: the log-sum-exp of each row's scaled
//   scores q·k^T/sqrt(D) over the positions it sees.
//
// How: the queries go in blocks of rows; each block meets the key blocks at or before it one
// at a time. Per key block, S = Q·K^T and (forward) O += P·V run as batched oneDNN matmuls
// over [B, KVH] with the group's G query heads stacked as rows, so a kv head's keys are read
// once for all its query heads; between them, one pass per row keeps a running maximum and
// sum (the online softmax) and rescales O. Backward recomputes S tile by tile from the saved
// lse (P = exp(S·scale − lse)), with dS = P∘(dP − Δ)·scale, Δ = rowsum(dO∘O), and
// dQ += dS·K, dK += dS^T·Q, dV += P^T·dO. k and v are copied into tile-major key tiles
// ([B, KVH, tile, D] each), so that every product's batches are dense (oneDNN's brgemm
// kernels); dK and dV accumulate in that layout. Scratch is a few tiles plus the key tiles,
// reused across calls.
// bf16: matmul inputs (q, k, v, dO, P, dS) in bf16, accumulation and softmax in fp32.
#pragma once
#include <cstdint>
#include <functional>

#include "kernels/gemm.h"

namespace foundry::ops {

struct AttentionShape {
  int64_t b, t, h, kvh, d;
};

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s, DType dtype);
// dq, dk, dv (writes) from dout, with out and lse from the forward.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const AttentionShape& s, DType dtype);

// One chunk of a sequence's queries against all keys up to it (context parallelism: a rank
// holds some chunks of each sequence and the gathered keys and values of all of it).
// Query rows [q_begin, q_end) of q/out/dq/dout [B, q_rows, H, D] sit at key positions
// q_pos, q_pos + 1, …; keys k/v/dk/dv [B, k_rows, KVH, D] are in position order, and query
// row r sees keys 0 … r − q_begin + q_pos. lse [B, H, q_rows]: the chunk's rows.
struct AttentionChunk {
  int64_t b, h, kvh, d;
  int64_t q_rows, k_rows;
  int64_t q_begin, q_end, q_pos;
};
// out and lse rows of the chunk (writes). Only the keys the chunk's queries see are read.
// `between_blocks` (if set) runs after each block of query rows: a caller can let its
// communication progress there.
void attention_chunk_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionChunk& c, DType dtype,
                             const std::function<void()>& between_blocks = {});
// dq rows of the chunk (writes); dk, dv [B, k_rows, KVH, D] ACCUMULATE (the chunks of a
// sequence add up their key gradients).
void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const AttentionChunk& c, DType dtype,
                              const std::function<void()>& between_blocks = {});

// The rows (and keys) per tile the kernels use for this shape.
int64_t attention_tile_rows(const AttentionShape& s);

// Bytes of scratch the two kernels keep between calls for this shape (backward's, the larger):
// a few score tiles and query blocks, k and v in key tiles (the GEMM dtype) and their fp32
// gradients.
int64_t attention_scratch_bytes(const AttentionShape& s, DType dtype);

// Tests only: while alive, every tile has `rows` rows and keys (0 restores the automatic
// choice), so that small shapes exercise many tiles, ragged edges and masked tiles.
class ScopedAttentionTile {
 public:
  explicit ScopedAttentionTile(int64_t rows);
  ~ScopedAttentionTile();
  ScopedAttentionTile(const ScopedAttentionTile&) = delete;
  ScopedAttentionTile& operator=(const ScopedAttentionTile&) = delete;

 private:
  int64_t previous_;
};

// One layer's decode cache: B sequences × KVH heads, up to max_len positions of D dims.
// Values are rows, v [B, KVH, max_len, D], so that a head's weighted sum streams them. Keys
// are transposed in blocks of kDecodeBlock positions, k [B, KVH, ⌈max_len / 16⌉, D, 16]: a
// block's scores are one vector of FMAs per dimension over 4 KiB read in order.
constexpr int64_t kDecodeBlock = 16;
struct DecodeKv {
  float* k = nullptr;
  float* v = nullptr;
  int64_t batch = 1, kvh = 1, d = 1, max_len = 1;
  int64_t blocks() const { return (max_len + kDecodeBlock - 1) / kDecodeBlock; }
  // Floats of one sequence's KV head, in k and in v alike: whole blocks of positions.
  int64_t head_floats() const { return blocks() * kDecodeBlock * d; }
  // Floats of k (and of v) for these dimensions: max_len rounded up to whole blocks.
  static int64_t floats(int64_t batch, int64_t kvh, int64_t d, int64_t max_len) {
    return batch * kvh * d * ((max_len + kDecodeBlock - 1) / kDecodeBlock * kDecodeBlock);
  }
};

// A run of one sequence's cached positions in one layer, laid out as a DecodeKv of batch 1
// with room for `capacity` positions: k [KVH, ⌈capacity / 16⌉, D, 16], v [KVH, ⌈capacity /
// 16⌉·16, D]. A sequence's cache may be several spans one after another (a prefix shared with
// other sequences, then its own positions): attention reads them in order as one run.
struct DecodeSpan {
  float* k = nullptr;
  float* v = nullptr;
  int64_t len = 0;       // positions it holds (the ones attended to)
  int64_t capacity = 0;  // positions it has room for
  int64_t head_floats(int64_t d) const {
    return (capacity + kDecodeBlock - 1) / kDecodeBlock * kDecodeBlock * d;
  }
};
// Sequence b's positions 0 … len−1 of a batched cache, as a span.
DecodeSpan decode_span(const DecodeKv& cache, int64_t b, int64_t len);
// Fails (Error) unless index `at` is inside the span: where a decode step stores its position.
void check_decode_store(const DecodeSpan& span, int64_t at);
// Stores one position's key and value rows, k and v [KVH·D], at index `at` of the span.
void decode_span_store(const DecodeSpan& span, int64_t at, const float* k, const float* v,
                       int64_t kvh, int64_t d);

// Stores each sequence's new key and value rows, k and v [B, KVH·D], at position pos.
void decode_kv_store(const DecodeKv& cache, int64_t pos, const float* k, const float* v);

// One new query row per head of each of B sequences against positions 0 … len−1 of their
// caches (incremental decoding, the sequences in step): q [B, H, D], out [B, H, D] (writes),
// scores [B·H·len] scratch. Each (sequence, head) is computed in the same order whatever B
// and the thread count; the query heads that share a KV head read its rows once.
void attention_decode(float* out, float* scores, const float* q, const DecodeKv& cache,
                      int64_t len, int64_t h);
// Rows at their own positions: row r's query q [rows, H, D] against the positions of its spans
// spans[first[r]] … spans[first[r+1] − 1], in order; out [rows, H, D] (writes), scores
// [rows·H·max_len] scratch (max_len ≥ each row's positions). A row's result depends on its
// query and its positions alone, not on how they are cut into spans nor on the other rows:
// every score is the same sum in the same order, and the softmax and weighted sum run over
// the positions in order. Rows whose chains hold the same span at the same depth (a shared
// prefix) read its keys and values once for all of them.
void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                           const DecodeSpan* spans, const int64_t* first, int64_t rows,
                           int64_t h, int64_t kvh, int64_t d);
// Plain double-precision reference (for tests): same layout, no saved statistics.
void attention_reference(double* out, const double* q, const double* k, const double* v,
                         const AttentionShape& s);

}  // namespace foundry::ops
