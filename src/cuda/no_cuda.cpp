// The CUDA backend's entry points in a build without it: each fails with an Error that says
// how to build one (no_gpu.h). built_with_cuda() and visible_gpus() answer instead.
#ifndef FOUNDRY_HAS_CUDA
#include "cuda/adamw.h"
#include "cuda/cca.h"
#include "cuda/decode.h"
#include "cuda/lt_matmul.h"
#include "cuda/muon.h"
#include "cuda/no_gpu.h"
#include "cuda/ops.h"
#include "cuda/random_fill.h"
#include "cuda/reductions.h"
#include "cuda/runtime.h"
#include "cuda/stream_kernels.h"
#include "cuda/zaya.h"

namespace foundry::gpu {

namespace {
const char kWhat[] = "the CUDA backend";
}

bool built_with_cuda() { return false; }

int visible_gpus(std::string* why) {
  if (why) *why = "this foundry was built without the CUDA backend";
  return 0;
}

void check_gpu_visible(int, const std::string& what) { fail_no_cuda_build(what); }
GpuInfo open_gpu(int, const std::string& what) { fail_no_cuda_build(what); }

DeviceBuffer::DeviceBuffer(int64_t) { fail_no_cuda_build(kWhat); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
void DeviceBuffer::upload(const void*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void DeviceBuffer::download(void*, int64_t, int64_t) const { fail_no_cuda_build(kWhat); }
void DeviceBuffer::fill_bytes(int) { fail_no_cuda_build(kWhat); }

void* device_allocate(int64_t) { fail_no_cuda_build(kWhat); }
void device_release(void*) {}
void* device_allocate_slab(int64_t, const ByteRanges&, bool) { fail_no_cuda_build(kWhat); }
int64_t device_release_slab_ranges(void*, const ByteRanges&, bool) { fail_no_cuda_build(kWhat); }
int64_t device_slab_memory_bytes(const void*) { fail_no_cuda_build(kWhat); }
bool device_slab_zeros_read_only(const void*) { fail_no_cuda_build(kWhat); }
void copy_on_device(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
void copy_blocks_on_device(void*, int64_t, const void*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void copy_to_host(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
void* host_allocate_pinned(int64_t) { fail_no_cuda_build(kWhat); }
void copy_to_device_queued(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
void host_release_pinned(void*) {}
void copy_to_host_async(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
void wait_copies_to_host() {}
HostCopyQueue::HostCopyQueue() { fail_no_cuda_build(kWhat); }
HostCopyQueue::~HostCopyQueue() = default;
int64_t HostCopyQueue::queue(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
bool HostCopyQueue::landed(int64_t) { fail_no_cuda_build(kWhat); }
void HostCopyQueue::wait(int64_t) { fail_no_cuda_build(kWhat); }
void HostCopyQueue::restart() {}
void copy_to_device(void*, const void*, int64_t) { fail_no_cuda_build(kWhat); }
void zero_bytes(void*, int64_t) { fail_no_cuda_build(kWhat); }
EventClock::~EventClock() = default;
int64_t EventClock::mark() { fail_no_cuda_build(kWhat); }
double EventClock::seconds(int64_t, int64_t) { fail_no_cuda_build(kWhat); }

int64_t memory_in_use() { fail_no_cuda_build(kWhat); }
int64_t memory_free() { fail_no_cuda_build(kWhat); }
std::array<int64_t, 2> current_gpu_uuid() { fail_no_cuda_build(kWhat); }
void synchronize() { fail_no_cuda_build(kWhat); }

GpuTimer::GpuTimer() { fail_no_cuda_build(kWhat); }
GpuTimer::~GpuTimer() = default;
void GpuTimer::start() { fail_no_cuda_build(kWhat); }
double GpuTimer::seconds() { fail_no_cuda_build(kWhat); }

void run_stream_op(StreamOp, double*, double*, double*, int64_t, double, double*) {
  fail_no_cuda_build(kWhat);
}
int64_t stream_read_partials() { return 0; }
void fill_doubles(double*, int64_t, double) { fail_no_cuda_build(kWhat); }
void fill_eighths(void*, int64_t, bool, uint64_t) { fail_no_cuda_build(kWhat); }

namespace detail {
void lt_matmul(const void*, bool, const void*, bool, float*, int64_t, int64_t, int64_t, bool,
               bool, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
}  // namespace detail

void muon_momentum(float*, float*, const float*, int64_t, float, bool, float) {
  fail_no_cuda_build(kWhat);
}
void muon_apply(float*, const float*, int64_t, float, float, uint16_t*) {
  fail_no_cuda_build(kWhat);
}

void adamw_update(float*, const float*, float*, float*, uint16_t*, const AdamWRange*, int64_t,
                  const AdamWCoefficients&, float) {
  fail_no_cuda_build(kWhat);
}

namespace ops {
void rmsnorm_forward(float*, float*, const float*, const float*, int64_t, int64_t, float) {
  fail_no_cuda_build(kWhat);
}
void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*,
                      int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
void rmsnorm_backward_residual(float*, float*, const float*, const float*, const float*,
                               const float*, const float*, const float*, int64_t, int64_t,
                               float*) {
  fail_no_cuda_build(kWhat);
}
int64_t rmsnorm_backward_scratch(int64_t, int64_t) { return 0; }
void rope_apply(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool) {
  fail_no_cuda_build(kWhat);
}
void rope_apply_rows(float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, double) {
  fail_no_cuda_build(kWhat);
}
void swiglu_forward(float*, const float*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void swiglu_backward(float*, const float*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void swiglu_forward_bf16(uint16_t*, const float*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void swiglu_backward_bf16(uint16_t*, const float*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void router_forward(float*, int32_t*, float*, const float*, int64_t, int64_t, int64_t, bool) {
  fail_no_cuda_build(kWhat);
}
void moe_gather(float*, const float*, const int32_t*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void moe_combine(float*, const float*, const float*, const int32_t*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void moe_combine_backward(float*, float*, const float*, const float*, const float*,
                          const int32_t*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void moe_gather_backward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cross_entropy(float*, float*, double*, const float*, const int32_t*, int64_t, int64_t,
                   int64_t, float) {
  fail_no_cuda_build(kWhat);
}
void cross_entropy_bf16(uint16_t*, int64_t, float*, double*, const float*, const int32_t*,
                        int64_t, int64_t, int64_t, float) {
  fail_no_cuda_build(kWhat);
}
void fill(float*, int64_t, float) { fail_no_cuda_build(kWhat); }
void fill(int32_t*, int64_t, int32_t) { fail_no_cuda_build(kWhat); }
void convert_to_bf16(uint16_t*, const float*, int64_t) { fail_no_cuda_build(kWhat); }
void fractions_of_counts(double*, const int64_t*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void scale_shift_forward(float*, const float*, const float*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void attention_forward(float*, float*, const float*, const float*, const float*,
                       const AttentionDims&) {
  fail_no_cuda_build(kWhat);
}
void attention_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, const float*, const AttentionDims&, float*) {
  fail_no_cuda_build(kWhat);
}
bool attention_on_tensor_cores(const AttentionDims&, const void*, const void*, const void*,
                               const void*) {
  return false;
}
void attention_forward_bf16(float*, float*, const float*, const float*, const float*,
                            const AttentionDims&) {
  fail_no_cuda_build(kWhat);
}
void attention_backward_bf16(float*, float*, float*, const float*, const float*, const float*,
                             const float*, const float*, const float*, const AttentionDims&,
                             float*) {
  fail_no_cuda_build(kWhat);
}
void attention_delta(float*, const float*, const float*, const AttentionDims&) {
  fail_no_cuda_build(kWhat);
}
int64_t attention_backward_scratch(const AttentionDims& s) { return s.b * s.h * s.t; }
void embedding_forward(float*, const int32_t*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void embedding_backward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                        Workspace&) {
  fail_no_cuda_build(kWhat);
}
void router_backward(float*, const float*, const float*, const int32_t*, const float*, int64_t,
                     int64_t, int64_t, bool, float, const double*) {
  fail_no_cuda_build(kWhat);
}
void expert_fractions(double*, const int64_t*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void router_aux_loss(double*, const float*, const double*, int64_t, int64_t, double*) {
  fail_no_cuda_build(kWhat);
}
int64_t router_aux_scratch(int64_t, int64_t) { return 0; }
void moe_dispatch_plan(int64_t*, int32_t*, int32_t*, const int32_t*, int64_t, int64_t, int64_t,
                       Workspace&) {
  fail_no_cuda_build(kWhat);
}
void cca_means_forward(float*, const float*, int64_t, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_means_backward(float*, const float*, int64_t, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_depthwise_conv_forward(float*, const float*, const float*, const float*, int64_t,
                                int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_depthwise_conv_backward(float*, float*, float*, const float*, const float*, const float*,
                                 int64_t, int64_t, int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
int64_t cca_depthwise_conv_scratch(int64_t, int64_t, int64_t, int64_t) { return 0; }
void cca_grouped_conv_forward(float*, const float*, const float*, const float*, const float*,
                              int64_t, int64_t, int64_t, int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
int64_t cca_grouped_conv_forward_scratch(int64_t, int64_t, int64_t, int64_t, int64_t) { return 0; }
void cca_grouped_conv_backward(float*, float*, float*, float*, const float*, const float*,
                               const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                               int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
int64_t cca_grouped_conv_scratch(int64_t, int64_t, int64_t, int64_t, int64_t) { return 0; }
void cca_value_shift_inplace_forward(float*, float*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_value_shift_inplace_backward(float*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_qk_norm_forward(float*, float*, float*, const float*, const float*, int64_t, int64_t,
                         int64_t, int64_t, float) {
  fail_no_cuda_build(kWhat);
}
void cca_qk_norm_backward(float*, float*, const float*, const float*, const float*, const float*,
                          const float*, int64_t, int64_t, int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
int64_t cca_qk_norm_scratch(int64_t, int64_t) { return 0; }
void sum_of_squares(double*, const float*, const AdamWRange*, int64_t, Workspace&) {
  fail_no_cuda_build(kWhat);
}
void clip_factor(float*, const double*, double) { fail_no_cuda_build(kWhat); }
void scale_ranges(float*, const AdamWRange*, int64_t, const float*) { fail_no_cuda_build(kWhat); }
void newton_schulz(const float*, float*, int64_t, int64_t, int, bool, Workspace&) {
  fail_no_cuda_build(kWhat);
}
void bias_add_forward(float*, const float*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void bias_add_backward(float*, const float*, int64_t, int64_t, float*) { fail_no_cuda_build(kWhat); }
int64_t column_sum_scratch(int64_t, int64_t) { return 0; }
void gelu_forward(float*, const float*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void gelu_backward(float*, const float*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void eda_forward(float*, const float*, const float*, int64_t, int64_t) { fail_no_cuda_build(kWhat); }
void eda_backward(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                  float*) {
  fail_no_cuda_build(kWhat);
}
void zaya_gating_forward(float*, int32_t*, float*, const float*, const float*, bool, int64_t,
                         int64_t, int64_t, bool, bool) {
  fail_no_cuda_build(kWhat);
}
void zaya_gating_backward(float*, const float*, const float*, const int32_t*, int64_t, int64_t,
                          int64_t, bool, bool) {
  fail_no_cuda_build(kWhat);
}
void zaya_class_counts(int64_t*, const int32_t*, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void zaya_boundary_counts(int64_t*, const float*, const float*, const float*, bool,
                          const int32_t*, int64_t, int64_t, int64_t, double) {
  fail_no_cuda_build(kWhat);
}
void residual_scale_forward(float*, const float*, const float*, const float*, const float*,
                            const float*, const float*, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void residual_scale_backward(float*, float*, float*, float*, float*, float*, const float*,
                             const float*, const float*, const float*, const float*, const float*,
                             const float*, int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
void residual_scale_backward_params(void*, bool, float*, float*, float*, float*, const float*,
                                    const float*, const float*, const float*, const float*,
                                    const float*, const float*, int64_t, int64_t, float*) {
  fail_no_cuda_build(kWhat);
}
void add(float*, const float*, int64_t) { fail_no_cuda_build(kWhat); }
void decode_kv_store(const DecodeSpan*, const int64_t*, const float*, const float*, int64_t,
                     int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void attention_decode_rows(float*, float*, int64_t, const float*, const DecodeSpan*,
                           const int64_t*, int64_t, int64_t, int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
int64_t attention_decode_query_cap(int64_t) { fail_no_cuda_build(kWhat); }
void attention_decode_grouped(float*, float*, const float*, const DecodeWork*, int64_t,
                              const DecodeWorkRow*, const int32_t*, int64_t, int64_t, int64_t,
                              int64_t, int64_t) {
  fail_no_cuda_build(kWhat);
}
void cca_conv_decode(float*, float*, float* const*, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t, const float*, const float*, const float*, const float*,
                     const float*) {
  fail_no_cuda_build(kWhat);
}
void cca_value_shift_decode(float*, float* const*, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t) {
  fail_no_cuda_build(kWhat);
}
}  // namespace ops

}  // namespace foundry::gpu
#endif  // FOUNDRY_HAS_CUDA
