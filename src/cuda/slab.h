// The slabs of slab.cu, for device_release (runtime.cu): a block from device_allocate_slab is
// freed here, anything else with cudaFree.
#pragma once

namespace foundry::gpu {

// Frees `block` and returns true when it is a slab from device_allocate_slab; else false.
bool free_device_slab(void* block);

}  // namespace foundry::gpu
