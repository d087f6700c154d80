// RUN_DIR/events.jsonl: what happened to a run, one JSON object per line, appended by the
// training job (rank 0) and by its supervisor (`foundry launch`): starts, failures and their
// causes, restarts, numerical anomalies, rollbacks, skipped batches (docs/formats.md).
//
//   {"time": "2026-11-24T18:12:10.123Z", "unix": 1795543930.123, "source": "train",
//    "event": "anomaly", "step": 120, ...}
//
// Each line is written with one write(2) on a file opened with O_APPEND, so lines from the
// job and from the supervisor never interleave; a failed or short write is an Error.
#pragma once
#include <string>

#include "base/config_reader.h"

namespace foundry {

inline constexpr char kEventsFile[] = "events.jsonl";

// Appends {"time", "unix", "source", "event", ...fields} to RUN_DIR/events.jsonl (creating
// it; the directory must exist). `fields` must be a JSON object (or null).
// `unix_time` is when it happened (default: now; an event recorded before the run directory
// existed is written later with its own time).
void append_event(const std::string& run_dir, const std::string& source, const std::string& event,
                  const json& fields = json::object(), double unix_time = -1);

// The events of RUN_DIR/events.jsonl in order (none when the file does not exist); a torn
// last line is skipped.
std::vector<json> read_events(const std::string& run_dir);

// "2026-11-24T18:12:10.123Z" for a Unix time in seconds.
std::string utc_timestamp(double unix_seconds);
double unix_now();

}  // namespace foundry
