// Incremental decoding on the GPU: the contracts of the CPU's decode kernels
// (kernels/attention.h: decode caches and spans; kernels/cca.h: decode states), in fp32 on
// device pointers, each queued on the default stream (RoPE at each row's position is
// ops.h's rope_apply_rows). The descriptor arrays (spans, first, store_at, states) are device
// copies of the host's (CudaBackend uploads them).
// Deterministic: every sum has a fixed order (not the CPU's, so results agree with the CPU
// to rounding, not bit for bit).
//
// Layouts (kernels/attention.h): a span holds `capacity` positions of one sequence; per KV
// head g, k at k + g·H + (p / 16)·16·d + i·16 + p % 16 and v at v + g·H + p·d + i for position
// p and dimension i, where H = ⌈capacity / 16⌉·16·d (the head's floats).
#pragma once
#include <cstdint>
#include <vector>

namespace foundry::gpu::ops {

// foundry::ops::DecodeSpan's fields, the same layout (CudaBackend copies those arrays as is).
struct DecodeSpan {
  float* k;
  float* v;
  int64_t len;       // positions attended to
  int64_t capacity;  // positions it has room for
};

// y [n] += x [n].
void add(float* y, const float* x, int64_t n);

// Row r's k and v [rows, kvh·d] at index store_at[r] of spans[r] (the host checked the index).
void decode_kv_store(const DecodeSpan* spans, const int64_t* store_at, const float* k,
                     const float* v, int64_t rows, int64_t kvh, int64_t d);

// Row r's query q [rows, h, d] against the positions of spans[first[r]] … spans[first[r+1] − 1]
// in order (query head j reads KV head j / (h / kvh)), scaled by 1/√d: out [rows, h, d]
// (writes) = softmax(scores)·v. scores [rows·h·max_len] scratch; every row has 1 … max_len
// positions.
void attention_decode_rows(float* out, float* scores, int64_t max_len, const float* q,
                           const DecodeSpan* spans, const int64_t* first, int64_t rows, int64_t h,
                           int64_t kvh, int64_t d);

// ---- attention over shared spans (flash decoding) ----
//
// attention_decode_rows' result with each span that rows share read once per group of them
// (per KV head), not once per row and query head. The host plans work items (span, a chunk
// of its positions, the rows reading it); a block per (item, KV head) walks the chunk in tiles
// of 32 positions, loads each tile's keys and values into shared memory once for all of its
// queries (its rows × the h/kvh query heads of the KV head) and keeps an online softmax for
// each: a partial result (m the largest score, l = Σ e^{s−m}, o = Σ e^{s−m}·v) per (row,
// query head, chunk). A second kernel merges a row's partials in chain order (the levels of
// its chain, each level's chunks in position order): m = max mᵢ, l = Σ lᵢ·e^{mᵢ−m},
// o = Σ oᵢ·e^{mᵢ−m}, out = o / l. Every sum's order is fixed by the spans' lengths and which
// rows share them, never by timing.

// Positions per tile of a block's walk, positions a work item reads at most, and the rows and
// queries of a work item at most.
constexpr int64_t kDecodeTile = 32, kDecodeChunk = 256;
constexpr int64_t kDecodeGroupRows = 16, kDecodeGroupQueries = 64;

// Rows `rows_at` … `rows_at + rows − 1` of the plan's work_rows against positions [begin, end)
// of `span` (begin a multiple of 32; each row up to its own end). span.len is the longest of
// its rows' lengths.
struct DecodeWork {
  DecodeSpan span;
  int32_t begin, end;
  int32_t rows_at, rows;
};
// A row of a work item: its index, the slot its partial result takes (row r's slots are
// consecutive, in chain order) and where its positions in the span end (≤ the item's end).
struct DecodeWorkRow {
  int32_t row, slot, end;
};

// The work of one call. Rows whose chains hold the same storage (k, v, capacity) at the same
// depth form a group there, whatever their lengths in it (a run of one sequence's new tokens
// reads one span to successive lengths); spans of length 0 are skipped. A group's span is cut
// into chunks of kDecodeChunk positions from its start (a fixed grid, so a row's partial
// results depend on its own lengths alone, never on the rows beside it), and a chunk's rows
// (those that reach into it) into parts of at most kDecodeGroupRows rows and `max_queries`
// queries (a row alone where h/kvh is more), as even as possible: a work item each.
struct DecodePlan {
  std::vector<DecodeWork> work;
  std::vector<DecodeWorkRow> work_rows;
  std::vector<int32_t> slots;  // [rows + 1]: row r's slots are slots[r] … slots[r + 1] − 1
  int64_t queries = 0;         // the most queries of one item: its rows × h/kvh
};

// The plan for attention_decode_rows' arguments as host arrays (spans [first[rows]], first
// [rows + 1]; the spans' pointers are compared, never dereferenced).
DecodePlan plan_attention_decode(const DecodeSpan* spans, const int64_t* first, int64_t rows,
                                 int64_t h, int64_t kvh,
                                 int64_t max_queries = kDecodeGroupQueries);
// Floats of the partial results of a plan: slots × h × (d + 2).
int64_t attention_decode_partials(const DecodePlan& plan, int64_t h, int64_t d);
// The most queries (≤ kDecodeGroupQueries) whose block, at d dimensions, fits the current
// GPU's shared memory (about (64 + 2·queries)·d floats); 0 when not even one does.
int64_t attention_decode_query_cap(int64_t d);
// attention_decode_rows' out [rows, h, d] (writes) from a plan's arrays copied to the device
// (`works` items; `queries` the plan's), through `partials` (attention_decode_partials floats
// of scratch).
void attention_decode_grouped(float* out, float* partials, const float* q, const DecodeWork* work,
                              int64_t works, const DecodeWorkRow* work_rows, const int32_t* slots,
                              int64_t rows, int64_t h, int64_t kvh, int64_t d, int64_t queries);

// foundry::ops::cca_conv_decode: states[r] is row r's state block (kernels/cca.h,
// decode_state_floats: c_hist [t0−1, C], y_hist [t1−1, C] less b0, v_prev [half]); rows that share
// a block are successive tokens of one sequence, in row order. qk [rows, C] (writes), C = (hq +
// hk)·d channels in groups of d; window: rows·C·t1 floats of scratch.
void cca_conv_decode(float* qk, float* window, float* const* states, int64_t rows, int64_t hq,
                     int64_t hk, int64_t d, int64_t t0, int64_t t1, const float* c_new,
                     const float* w0, const float* b0, const float* w1, const float* b1);
// foundry::ops::cca_value_shift_decode: v [rows, 2·half], the swap with each state's v_prev.
void cca_value_shift_decode(float* v, float* const* states, int64_t rows, int64_t hq, int64_t hk,
                            int64_t d, int64_t t0, int64_t t1);

}  // namespace foundry::gpu::ops
