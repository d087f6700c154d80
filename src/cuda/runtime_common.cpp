// The parts of runtime.h that do not call CUDA (both builds).
#include <fmt/format.h>

#include "cuda/runtime.h"

namespace foundry::gpu {

double GpuInfo::spec_memory_bytes_per_s() const {
  return 2.0 * memory_clock_hz * memory_bus_bits / 8.0;
}

std::string GpuInfo::arch() const { return fmt::format("sm_{}{}", major, minor); }

}  // namespace foundry::gpu
