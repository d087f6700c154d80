// Content checksums (xxHash XXH3-64), printed as 16 hex digits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace foundry {

uint64_t hash64(const void* data, size_t bytes);
std::string hash64_hex(uint64_t h);

// hash64 of bytes that arrive in pieces (a file as it is written): digest() is hash64 of
// everything passed to update() so far, in order.
class StreamingHash64 {
 public:
  StreamingHash64();
  ~StreamingHash64();
  StreamingHash64(StreamingHash64&&) noexcept;
  StreamingHash64& operator=(StreamingHash64&&) noexcept;

  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace foundry
