// One allocation carved into typed arrays: the activations of a batch shape. A layout
// function names every array it needs with take<T>(n); Arena::build runs it twice, first to
// measure (take returns null), then to hand out 64-byte-aligned pointers into one zeroed
// block. The block is a PageSlab (pages never written take no memory), or memory a
// BlockSource hands out (a GPU's: the arrays are then device pointers).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "base/page_slab.h"

namespace foundry {

// Where an arena's block comes from when it is not host pages: `allocate(bytes)` returns a
// zeroed block of at least that many bytes, 64-byte aligned; `release` takes it back.
struct BlockSource {
  std::function<void*(size_t)> allocate;
  std::function<void(void*)> release;
};

class Arena {
 public:
  Arena() = default;
  ~Arena() { release(); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  template <typename T>
  T* take(int64_t n) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }

  // Calls layout(*this) to measure, allocates the block (from `source` when given, which
  // must outlive the arena), and calls it again to assign.
  template <typename F>
  void build(F&& layout, const BlockSource* source = nullptr) {
    release();
    base_ = nullptr;
    offset_ = 0;
    layout(*this);
    if (source) {
      base_ = static_cast<std::byte*>(source->allocate(offset_ + kAlign));
      source_ = source;
    } else {
      block_ = PageSlab<std::byte>(offset_ + kAlign);
      base_ = block_.data();
    }
    offset_ = 0;
    layout(*this);
  }

  // The bytes build(layout) would allocate, without allocating (take returns null).
  template <typename F>
  size_t measure(F&& layout) {
    release();
    offset_ = 0;
    layout(*this);
    return offset_ + kAlign;
  }

  size_t bytes() const { return offset_; }

 private:
  void release() {
    if (source_ && base_) source_->release(base_);
    source_ = nullptr;
    base_ = nullptr;
  }

  static constexpr size_t kAlign = 64;
  PageSlab<std::byte> block_;
  const BlockSource* source_ = nullptr;
  std::byte* base_ = nullptr;
  size_t offset_ = 0;
};

}  // namespace foundry
