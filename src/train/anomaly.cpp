#include "train/anomaly.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "comm/comm.h"
#include "train/events.h"
#include "train/run_dir.h"

namespace foundry {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

const char* action_name(AnomalyAction a) {
  switch (a) {
    case AnomalyAction::skip: return "skip";
    case AnomalyAction::rollback: return "rollback";
    case AnomalyAction::stop: return "stop";
  }
  return "?";
}

}  // namespace

const char* anomaly_kind_name(AnomalyKind kind) {
  switch (kind) {
    case AnomalyKind::none: return "none";
    case AnomalyKind::nan_loss: return "nan_loss";
    case AnomalyKind::nan_grad: return "nan_grad";
    case AnomalyKind::spike: return "spike";
  }
  return "?";
}

// ---- the detector ---------------------------------------------------------------------------

AnomalyDetector::AnomalyDetector(double spike_factor, int64_t window, int64_t warmup)
    : factor_(spike_factor),
      window_(static_cast<size_t>(std::max<int64_t>(window, 1))),
      warmup_(static_cast<size_t>(std::clamp<int64_t>(warmup, 1, window))) {}

AnomalyKind AnomalyDetector::check(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return AnomalyKind::nan_loss;
  if (!std::isfinite(grad_norm)) return AnomalyKind::nan_grad;
  const double limit = threshold();
  if (std::isfinite(limit) && loss > limit) return AnomalyKind::spike;
  return AnomalyKind::none;
}

void AnomalyDetector::accept(double loss) {
  losses_.push_back(loss);
  if (losses_.size() > window_) losses_.pop_front();
}

double AnomalyDetector::baseline() const {
  if (factor_ <= 0 || losses_.size() < warmup_) return kNaN;
  std::vector<double>& v = scratch_;
  v.assign(losses_.begin(), losses_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

double AnomalyDetector::threshold() const { return factor_ * baseline(); }

json AnomalyDetector::state() const {
  return {{"losses", json(std::vector<double>(losses_.begin(), losses_.end()))}};
}

void AnomalyDetector::restore(const json& state) {
  losses_.clear();
  if (!state.is_object() || !state.contains("losses")) return;
  for (const json& l : state.at("losses")) accept(l.get<double>());
}

// ---- one anomaly ----------------------------------------------------------------------------

json Anomaly::to_json() const {
  return {{"step", step},
          {"batch", batch},
          {"kind", anomaly_kind_name(kind)},
          {"loss", finite_or_null(loss)},
          {"grad_norm", finite_or_null(grad_norm)},
          {"spike_threshold", finite_or_null(threshold)}};
}

std::string Anomaly::describe() const {
  std::string what;
  switch (kind) {
    case AnomalyKind::nan_loss: what = fmt::format("loss {}", loss); break;
    case AnomalyKind::nan_grad:
      what = fmt::format("gradient norm {} (loss {:.4f})", grad_norm, loss);
      break;
    case AnomalyKind::spike:
      what = fmt::format("loss {:.4f} above the spike threshold {:.4f}", loss, threshold);
      break;
    case AnomalyKind::none: what = "no anomaly"; break;
  }
  return fmt::format("step {} (batch {}): {} ({})", step, batch, what, anomaly_kind_name(kind));
}

// ---- the monitor ----------------------------------------------------------------------------

AnomalyMonitor::AnomalyMonitor(const TrainConfig& tc, const Communicator* world, bool root,
                               TrainBatches& batches)
    : tc_(tc),
      world_(world),
      root_(root),
      batches_(batches),
      faults_(TrainFaults::from_environment(world ? world->rank() : 0, world ? world->size() : 1)),
      detector_(tc.spike_factor, tc.spike_window, tc.spike_warmup) {
  for (int64_t b : tc.skip_batches) batches_.skip(b);
}

bool AnomalyMonitor::veto(int64_t step, int64_t batch, const ForwardResult& losses,
                          double grad_norm) {
  const AnomalyKind mine = std::isfinite(losses.loss) ? detector_.check(losses.ce_loss, grad_norm)
                                                      : AnomalyKind::nan_loss;
  // The values are the same on every rank; agreeing on the verdict makes sure of the decision.
  int64_t agreed = static_cast<int64_t>(mine);
  if (world_) world_->allreduce(&agreed, &agreed, 1, ReduceOp::max);
  if (agreed == 0) {
    detector_.accept(losses.ce_loss);
    streak_.clear();
    return false;
  }
  last_ = {step, batch, static_cast<AnomalyKind>(agreed),
           std::isfinite(losses.loss) ? losses.ce_loss : losses.loss, grad_norm,
           detector_.threshold()};
  return true;
}

AnomalyAction AnomalyMonitor::handle() {
  const Anomaly& a = last_;
  streak_.push_back(a);
  AnomalyAction action = tc_.anomaly_policy == AnomalyPolicy::rollback ? AnomalyAction::rollback
                         : tc_.anomaly_policy == AnomalyPolicy::stop   ? AnomalyAction::stop
                                                                       : AnomalyAction::skip;
  const int64_t total = static_cast<int64_t>(record_.size()) + 1;
  if (static_cast<int64_t>(streak_.size()) >= tc_.max_consecutive_anomalies)
    stop_reason_ = fmt::format("{} anomalies in a row (train.max_consecutive_anomalies = {})",
                               streak_.size(), tc_.max_consecutive_anomalies);
  else if (tc_.max_anomalies > 0 && total >= tc_.max_anomalies)
    stop_reason_ = fmt::format("{} anomalies in this run (train.max_anomalies = {})", total,
                               tc_.max_anomalies);
  else if (action == AnomalyAction::stop)
    stop_reason_ = "an anomaly (train.anomaly_policy = stop)";
  if (!stop_reason_.empty()) action = AnomalyAction::stop;
  // The batch is dropped for good unless the run stops on it (then the report names it).
  if (action != AnomalyAction::stop) {
    batches_.skip(a.batch);
    append_record(a, action_name(action));
  }
  if (root_) {
    const std::string what =
        action == AnomalyAction::stop ? std::string("stopping")
        : action == AnomalyAction::skip
            ? fmt::format("skipping batch {}, step {} runs on the next batch", a.batch, a.step)
            : fmt::format("dropping batch {} and rolling back", a.batch);
    std::fprintf(stderr, "anomaly at %s: %s\n", a.describe().c_str(), what.c_str());
    json fields = a.to_json();
    fields["action"] = action_name(action);
    append_event(tc_.run_dir, "train", "anomaly", fields);
    if (action == AnomalyAction::skip)
      append_event(tc_.run_dir, "train", "skip", {{"step", a.step}, {"batch", a.batch}});
  }
  return action;
}

void AnomalyMonitor::rolled_back(int64_t to_step) {
  if (!root_) return;
  const Anomaly& a = last_;
  if (to_step < 0) {
    std::fprintf(stderr, "no checkpoint to roll back to yet: batch %lld skipped, step %lld runs "
                         "on the next batch\n",
                 static_cast<long long>(a.batch), static_cast<long long>(a.step));
    append_event(
        tc_.run_dir, "train", "skip",
        {{"step", a.step}, {"batch", a.batch}, {"reason", "no checkpoint to roll back to"}});
    return;
  }
  std::fprintf(stderr, "rolled back to the checkpoint of step %lld; replaying without batch %lld\n",
               static_cast<long long>(to_step), static_cast<long long>(a.batch));
  append_event(tc_.run_dir, "train", "rollback",
               {{"step", a.step}, {"batch", a.batch}, {"to_step", to_step}});
}

// The anomalies of the current streak, and the batches dropped before it.
std::string AnomalyMonitor::budget_report() const {
  std::vector<std::string> lines;
  for (const Anomaly& a : streak_) lines.push_back(a.describe());
  std::vector<int64_t> earlier;
  for (const json& e : record_)
    if (std::none_of(streak_.begin(), streak_.end(),
                     [&](const Anomaly& a) { return a.batch == e.at("batch").get<int64_t>(); }))
      earlier.push_back(e.at("batch").get<int64_t>());
  if (!earlier.empty())
    lines.push_back(
        fmt::format("batches dropped earlier in the run: {}", fmt::join(earlier, ", ")));
  return fmt::format("{}", fmt::join(lines, "; "));
}

void AnomalyMonitor::stop() {
  const Anomaly& a = last_;
  const std::string report = budget_report();
  if (root_)
    append_event(tc_.run_dir, "train", "stop",
                 {{"step", a.step},
                  {"batch", a.batch},
                  {"reason", stop_reason_},
                  {"anomalies", report},
                  {"fatal", true}});  // `foundry launch` does not retry it
  std::vector<int64_t> batches;
  for (const Anomaly& s : streak_) batches.push_back(s.batch);
  const std::string hint = fmt::format(
      "{}; to go on without these batches run again with --auto-resume --set "
      "'train.skip_batches=[{}]' (from the latest checkpoint, or from the start when there is "
      "none; dropped batches are listed in {}/{} and events.jsonl){}",
      a.kind == AnomalyKind::spike
          ? "a loss spike: lower train.lr, raise train.warmup_steps or lower train.grad_clip, "
            "or raise train.spike_factor if the batches are fine"
          : "a non-finite loss or gradient: lower train.lr, raise train.warmup_steps, or train "
            "with precision fp32 to investigate",
      fmt::join(batches, ","), tc_.run_dir, kSkippedBatchesFile,
      stop_reason_.find("train.anomaly_policy") != std::string::npos
          ? "; or set train.anomaly_policy=skip"
          : "; or raise train.max_consecutive_anomalies / train.max_anomalies");
  fail(fmt::format("numerical anomalies stopped the run at step {} after {}: {}", a.step,
                   stop_reason_, report),
       hint);
}

// ---- the record of dropped batches -----------------------------------------------------------

void AnomalyMonitor::append_record(const Anomaly& a, const char* action) {
  json entry = a.to_json();
  entry["action"] = action;
  record_.push_back(entry);
  if (root_)
    write_file_atomic(
        tc_.run_dir + "/" + kSkippedBatchesFile,
        json({{"format", "foundry-skipped-batches"}, {"batches", record_}}).dump(1) + "\n");
}

void AnomalyMonitor::load_record() {
  const std::string path = tc_.run_dir + "/" + kSkippedBatchesFile;
  if (!path_exists(path)) return;
  const json file = load_json_file(path);
  if (!is_skipped_batches_record(file))
    fail(fmt::format("{} is not a record of skipped batches", path),
         "restore it from events.jsonl (its \"anomaly\" events) or remove it to forget them");
  record_ = file.at("batches");
  for (const json& e : record_) batches_.skip(e.at("batch").get<int64_t>());
}

// A new run forgets an earlier run's record, naming it (RunDir refused the start if the file
// was not a record Foundry wrote).
void AnomalyMonitor::clear_record() {
  const std::string path = tc_.run_dir + "/" + kSkippedBatchesFile;
  if (!root_ || !path_exists(path)) return;
  remove_all(path);
  std::fprintf(stderr, "removed %s: the skipped batches of an earlier run in %s\n", path.c_str(),
               tc_.run_dir.c_str());
}

// ---- checkpoints ----------------------------------------------------------------------------

void AnomalyMonitor::save_state(json& trainer_state) const {
  trainer_state["batch"] = batches_.batch();
  trainer_state["skipped_batches"] = std::vector<int64_t>(batches_.skipped().begin(),
                                                         batches_.skipped().end());
  trainer_state["loss_window"] = detector_.state();
}

void AnomalyMonitor::restore_state(const json& trainer_state) {
  // Before batch numbers were saved, batch and step were the same (nothing was skipped).
  const int64_t batch = trainer_state.value("batch", trainer_state.at("step").get<int64_t>());
  batches_.restart_after(batch);
  std::set<int64_t> dropped;
  if (auto it = trainer_state.find("skipped_batches"); it != trainer_state.end())
    for (const json& b : *it) dropped.insert(b.get<int64_t>());
  for (int64_t b : dropped) batches_.skip(b);
  // train.skip_batches naming a batch the checkpoint's run already trained on: too late.
  std::vector<int64_t> trained;
  for (int64_t b : tc_.skip_batches)
    if (b <= batch && !dropped.count(b)) {
      batches_.unskip(b);
      trained.push_back(b);
    }
  if (root_ && !trained.empty())
    fmt::print(stderr,
               "warning: train.skip_batches names batch(es) {} that the run trained on before "
               "this checkpoint (its last batch is {}): they stay trained and are not recorded "
               "as skipped; to drop them, resume from a checkpoint before them\n",
               fmt::join(trained, ", "), batch);
  detector_.restore(trainer_state.value("loss_window", json()));
}

}  // namespace foundry
