#include "base/hash.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace foundry {

uint64_t hash64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }
std::string hash64_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace foundry
