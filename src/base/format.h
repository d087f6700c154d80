// Human-readable numbers for logs and reports.
#pragma once
#include <string>

namespace foundry {

// A count with a metric suffix: "950", "40.5k", "1.20M", "8.30B".
std::string format_count(double count);

}  // namespace foundry
