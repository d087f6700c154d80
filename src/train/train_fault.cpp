#include "train/train_fault.h"

#include <csignal>
#include <cstdlib>
#include <limits>

#include "base/error.h"

namespace foundry {

namespace {

const std::pair<const char*, TrainFaultKind> kKinds[] = {{"nan_grad", TrainFaultKind::nan_grad},
                                                         {"nan_loss", TrainFaultKind::nan_loss},
                                                         {"loss_spike", TrainFaultKind::loss_spike},
                                                         {"sigterm", TrainFaultKind::sigterm}};

}  // namespace

TrainFaults TrainFaults::parse(const std::string& spec) {
  TrainFaults faults;
  if (spec.empty()) return faults;
  for (size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = spec.find(',', begin);
    const std::string entry = spec.substr(begin, end == std::string::npos ? end : end - begin);
    const size_t at = entry.find('@');
    bool ok = at != std::string::npos;
    Fault f{};
    if (ok) {
      ok = false;
      for (const auto& [name, kind] : kKinds)
        if (entry.compare(0, at, name) == 0 && at == std::string(name).size()) {
          f.kind = kind;
          ok = true;
        }
      const std::string number = entry.substr(at + 1);
      char* end = nullptr;
      f.batch = std::strtoll(number.c_str(), &end, 10);
      // Batch 0 is the start (sigterm only): before the first step.
      ok = ok && !number.empty() && *end == '\0' &&
           (f.batch >= 1 || (f.batch == 0 && f.kind == TrainFaultKind::sigterm));
    }
    if (!ok)
      fail(fmt::format("FOUNDRY_TRAIN_FAULT = '{}': '{}' is not <kind>@<batch>", spec, entry),
           "kinds: nan_grad, nan_loss, loss_spike, sigterm; batch: a batch number from 1 (0 for "
           "sigterm: while the run starts), e.g. nan_grad@5,loss_spike@9; or unset it");
    faults.faults_.push_back(f);
  }
  return faults;
}

TrainFaults TrainFaults::from_environment(int rank, int ranks) {
  const char* env = std::getenv("FOUNDRY_TRAIN_FAULT");
  TrainFaults faults = parse(env ? env : "");
  faults.injecting_rank_ = rank == ranks - 1;
  return faults;
}

bool TrainFaults::has(TrainFaultKind kind, int64_t batch) const {
  if (!injecting_rank_) return false;
  for (const Fault& f : faults_)
    if (f.kind == kind && f.batch == batch) return true;
  return false;
}

void TrainFaults::poison_losses(int64_t batch, ForwardResult& losses) const {
  if (has(TrainFaultKind::nan_loss, batch))
    losses.loss = losses.ce_loss = std::numeric_limits<double>::quiet_NaN();
  if (has(TrainFaultKind::loss_spike, batch)) {
    losses.loss *= 1000;
    losses.ce_loss *= 1000;
  }
}

void TrainFaults::while_starting() const {
  if (has(TrainFaultKind::sigterm, 0)) ::raise(SIGTERM);
}

void TrainFaults::poison_gradients(int64_t batch, Model& model) const {
  if (has(TrainFaultKind::sigterm, batch)) ::raise(SIGTERM);
  if (!has(TrainFaultKind::nan_grad, batch)) return;
  // Through the backend: on a GPU the gradients are in device memory.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  model.backend().from_host(model.grad("model.embed_tokens.weight"), &nan, sizeof(nan));
}

}  // namespace foundry
