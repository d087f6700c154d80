// Content checksums (xxHash XXH3-64), printed as 16 hex digits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace foundry {

uint64_t hash64(const void* data, size_t bytes);
std::string hash64_hex(uint64_t h);

}  // namespace foundry
