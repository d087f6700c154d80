#include "base/device.h"

#include <charconv>

#include "base/error.h"

namespace foundry {

DeviceSpec parse_device(const std::string& where, const std::string& text) {
  if (text == "cpu") return {};
  if (text == "cuda") return {true, 0, false};
  if (text.rfind("cuda:", 0) == 0) {
    const std::string digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && index >= 0)
      return {true, index, true};
  }
  fail(fmt::format("{} '{}': not a device", where, text),
       "use cpu, cuda (the first GPU) or cuda:N (GPU N as the CUDA runtime numbers them)");
}

}  // namespace foundry
