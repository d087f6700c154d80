// Where a command computes: the CPU, or one CUDA GPU. `--device` and `train.device` spell it
// "cpu", "cuda" (GPU 0) or "cuda:N".
#pragma once
#include <string>

namespace foundry {

struct DeviceSpec {
  bool cuda = false;
  int index = 0;             // the GPU, when cuda
  bool index_given = false;  // "cuda:N"; plain "cuda" lets each rank take its own GPU
  std::string name() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }
};

// Throws foundry::Error naming `where` (a flag or key) for anything else.
DeviceSpec parse_device(const std::string& where, const std::string& text);

}  // namespace foundry
