// One allocation carved into typed arrays: the activations of a batch shape. A layout
// function names every array it needs with take<T>(n); Arena::build runs it twice, first to
// measure (take returns null), then to hand out 64-byte-aligned pointers into one zeroed
// block. The block is a PageSlab: pages never written take no memory.
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/page_slab.h"

namespace foundry {

class Arena {
 public:
  template <typename T>
  T* take(int64_t n) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }

  // Calls layout(*this) to measure, allocates the block, and calls it again to assign.
  template <typename F>
  void build(F&& layout) {
    base_ = nullptr;
    offset_ = 0;
    layout(*this);
    block_ = PageSlab<std::byte>(offset_ + kAlign);
    base_ = block_.data();
    offset_ = 0;
    layout(*this);
  }

  size_t bytes() const { return offset_; }

 private:
  static constexpr size_t kAlign = 64;
  PageSlab<std::byte> block_;
  std::byte* base_ = nullptr;
  size_t offset_ = 0;
};

}  // namespace foundry
