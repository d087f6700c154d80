// Errors: one exception type carrying what went wrong and a hint for the user.
// cli/ catches it, prints "error: <what>" and "hint: <hint>", and exits non-zero.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace foundry {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string hint = {})
      : std::runtime_error(std::move(what)), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// Throws Error(what, hint). Use for bad user input and failed system calls.
[[noreturn]] inline void fail(std::string what, std::string hint = {}) {
  throw Error(std::move(what), std::move(hint));
}

}  // namespace foundry

// Internal invariant: a failure here is a bug in Foundry, not bad input.
#define FOUNDRY_CHECK(cond)                                                            \
  do {                                                                                 \
    if (!(cond))                                                                       \
      ::foundry::fail(fmt::format("internal check failed: {} ({}:{})", #cond, __FILE__, \
                                  __LINE__),                                           \
                      "this is a bug in foundry; please report it");                   \
  } while (0)
