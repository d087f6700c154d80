// The CPU's Backend (kernels/backend.h): host memory, oneDNN products and the OpenMP kernels.
// Stateless: one instance serves every model in the process.
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace foundry {

Backend& cpu_backend();
// Another instance (a run that owns its backend, whatever the device).
std::unique_ptr<Backend> make_cpu_backend();
// A CPU backend that says its memory is not the host's, so that a model on it takes every
// path it takes on a GPU (slabs and activations allocated through the backend, inputs and
// results copied in and out) with the CPU's arithmetic: tests check those paths on machines
// without a GPU against the plain CPU model, bit for bit.
std::unique_ptr<Backend> make_cpu_backend_posing_as_device();

}  // namespace foundry
