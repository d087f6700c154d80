// For tests: expects `fn` to throw foundry::Error whose message contains `needle`.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace foundry {

template <typename F>
void expect_error(F fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace foundry
