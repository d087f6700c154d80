// Human-readable numbers for logs and reports: bytes in binary units, counts with metric
// suffixes, FLOPs. A value is written in the largest unit that keeps it at least 1.
#pragma once
#include <string>

namespace foundry {

enum class ByteUnit { B, KiB, MiB, GiB, TiB };

// Whether a fixed number of decimals keeps its trailing zeros ("1.50 MiB") or drops them
// ("1.5 MiB", "32 KiB").
enum class Zeros { keep, trim };

// Bytes in B, KiB, MiB, GiB or TiB with `decimals` digits after the point; below 1 KiB a whole
// number: "512 B", "1.50 MiB"; with Zeros::trim "1.5 MiB", "32 KiB".
std::string format_bytes(double bytes, int decimals = 2, Zeros zeros = Zeros::keep);

// Bytes in a fixed unit: format_bytes(2.5 * 1024 * 1024, ByteUnit::MiB, 1) == "2.5 MiB".
std::string format_bytes(double bytes, ByteUnit unit, int decimals);

// A count with a metric suffix (k, M, B, T) and `digits` significant digits; below 1,000 a
// whole number: "950", "40.50 k", "12.35 M", "8.303 B".
std::string format_count(double count, int digits = 4);

// `count` in the unit and with the decimals format_count gives `reference`, so that figures
// set beside it line up: format_count_like(7.54e8, 8.303e9) == "0.754 B".
std::string format_count_like(double count, double reference, int digits = 4);

// FLOPs in MFLOP, GFLOP, TFLOP or PFLOP with three decimals; below 1 MFLOP a whole number:
// "950 FLOP", "69.234 MFLOP", "1.500 PFLOP".
std::string format_flops(double flops);

}  // namespace foundry
