#include "base/hash.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "base/error.h"

namespace foundry {

uint64_t hash64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }
std::string hash64_hex(uint64_t h) { return fmt::format("{:016x}", h); }

struct StreamingHash64::State {
  XXH3_state_t* xxh = XXH3_createState();
  State() { FOUNDRY_CHECK(xxh && XXH3_64bits_reset(xxh) == XXH_OK); }
  ~State() { XXH3_freeState(xxh); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

StreamingHash64::StreamingHash64() : state_(std::make_unique<State>()) {}
StreamingHash64::~StreamingHash64() = default;
StreamingHash64::StreamingHash64(StreamingHash64&&) noexcept = default;
StreamingHash64& StreamingHash64::operator=(StreamingHash64&&) noexcept = default;

void StreamingHash64::update(const void* data, size_t bytes) {
  XXH3_64bits_update(state_->xxh, data, bytes);
}

uint64_t StreamingHash64::digest() const { return XXH3_64bits_digest(state_->xxh); }

}  // namespace foundry
