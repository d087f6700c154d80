// Memory-bandwidth kernels on the GPU, by STREAM's conventions (bench/membw_bench.h) on
// doubles, plus a pure read (a sum, so that the loads are not dead) and a pure write. The
// pointers are device memory; each call queues one kernel on the default stream.
#pragma once
#include <cstdint>

namespace foundry::gpu {

enum class StreamOp { copy, scale, add, triad, read, write };
inline constexpr StreamOp kStreamOps[] = {StreamOp::copy, StreamOp::scale, StreamOp::add,
                                          StreamOp::triad, StreamOp::read, StreamOp::write};
const char* stream_op_name(StreamOp op);
// Bytes one run moves over arrays of n doubles: copy, scale 16·n; add, triad 24·n; read,
// write 8·n.
int64_t stream_op_bytes(StreamOp op, int64_t n);

// copy c=a, scale b=s·c, add c=a+b, triad a=b+s·c, read partial[block] = Σ a over the
// block's share, write a=s. `partial` (read only) holds stream_read_partials() doubles.
void run_stream_op(StreamOp op, double* a, double* b, double* c, int64_t n, double scalar,
                   double* partial);
int64_t stream_read_partials();

// x[i] = value for i < n.
void fill_doubles(double* x, int64_t n, double value);

}  // namespace foundry::gpu
