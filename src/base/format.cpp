#include "base/format.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

namespace foundry {
namespace {

struct Unit {
  double size;
  const char* name;
};

constexpr Unit kByteUnits[] = {
    {1, "B"}, {0x1p10, "KiB"}, {0x1p20, "MiB"}, {0x1p30, "GiB"}, {0x1p40, "TiB"}};
constexpr Unit kCountUnits[] = {{1, ""}, {1e3, "k"}, {1e6, "M"}, {1e9, "B"}, {1e12, "T"}};
constexpr Unit kFlopUnits[] = {
    {1, "FLOP"}, {1e6, "MFLOP"}, {1e9, "GFLOP"}, {1e12, "TFLOP"}, {1e15, "PFLOP"}};

// The largest of `units` (ascending, the first of size 1) that `value` reaches; the first if
// it reaches none.
const Unit& unit_for(double value, std::span<const Unit> units) {
  size_t i = 0;
  while (i + 1 < units.size() && value >= units[i + 1].size) ++i;
  return units[i];
}

// `value` in `unit`, whole in a unit of size 1.
std::string number_in(double value, const Unit& unit, int decimals) {
  return fmt::format("{:.{}f}", value / unit.size, unit.size == 1 ? 0 : decimals);
}

// "1.50" -> "1.5", "32.0" -> "32"
std::string trim_zeros(std::string number) {
  if (number.find('.') == std::string::npos) return number;
  number.erase(number.find_last_not_of('0') + 1);
  if (number.back() == '.') number.pop_back();
  return number;
}

// Digits after the point that give `value` (at least 1) `digits` significant digits.
int decimals_for(double value, int digits) {
  int whole = 1;
  for (; value >= 10; value /= 10) ++whole;
  return std::max(0, digits - whole);
}

}  // namespace

std::string format_bytes(double bytes, int decimals, Zeros zeros) {
  const Unit& unit = unit_for(bytes, kByteUnits);
  const std::string number = number_in(bytes, unit, decimals);
  return (zeros == Zeros::trim ? trim_zeros(number) : number) + " " + unit.name;
}

std::string format_bytes(double bytes, ByteUnit unit, int decimals) {
  const Unit& u = kByteUnits[static_cast<int>(unit)];
  return fmt::format("{:.{}f} {}", bytes / u.size, decimals, u.name);
}

std::string format_count(double count, int digits) {
  return format_count_like(count, count, digits);
}

std::string format_count_like(double count, double reference, int digits) {
  const Unit& unit = unit_for(reference, kCountUnits);
  if (unit.size == 1) return fmt::format("{:.0f}", count);
  return number_in(count, unit, decimals_for(reference / unit.size, digits)) + " " + unit.name;
}

std::string format_flops(double flops) {
  const Unit& unit = unit_for(flops, kFlopUnits);
  return number_in(flops, unit, 3) + " " + unit.name;
}

}  // namespace foundry
