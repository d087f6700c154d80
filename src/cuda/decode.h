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

// foundry::ops::cca_conv_decode: states[r] is row r's state block (kernels/cca.h,
// decode_state_floats: c_hist [t0−1, C], y_hist [t1−1, C], v_prev [half]); rows that share a
// block are successive tokens of one sequence, in row order. qk [rows, C] (writes), C =
// (hq + hk)·d channels in groups of d; window: rows·C·t1 floats of scratch.
void cca_conv_decode(float* qk, float* window, float* const* states, int64_t rows, int64_t hq,
                     int64_t hk, int64_t d, int64_t t0, int64_t t1, const float* c_new,
                     const float* w0, const float* b0, const float* w1, const float* b1);
// foundry::ops::cca_value_shift_decode: v [rows, 2·half], the swap with each state's v_prev.
void cca_value_shift_decode(float* v, float* const* states, int64_t rows, int64_t hq, int64_t hk,
                            int64_t d, int64_t t0, int64_t t1);

}  // namespace foundry::gpu::ops
