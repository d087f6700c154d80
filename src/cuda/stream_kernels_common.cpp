// The parts of stream_kernels.h that run on the host (both builds).
#include "cuda/stream_kernels.h"

namespace foundry::gpu {

const char* stream_op_name(StreamOp op) {
  switch (op) {
    case StreamOp::copy: return "copy";
    case StreamOp::scale: return "scale";
    case StreamOp::add: return "add";
    case StreamOp::triad: return "triad";
    case StreamOp::read: return "read";
    case StreamOp::write: return "write";
  }
  return "?";
}

int64_t stream_op_bytes(StreamOp op, int64_t n) {
  switch (op) {
    case StreamOp::copy:
    case StreamOp::scale: return 16 * n;
    case StreamOp::add:
    case StreamOp::triad: return 24 * n;
    case StreamOp::read:
    case StreamOp::write: return 8 * n;
  }
  return 0;
}

}  // namespace foundry::gpu
