// A zero-initialized array whose memory is taken from the OS page by page, as it is first
// written, and can be handed back: the parameter and gradient slabs, the optimizer state. Untouched
// or released pages read as zero and take no physical memory, so a rank that never writes the parts
// of a slab it does not need (another rank's experts) does not pay for them, while every offset
// stays where the slab layout puts it.
//
// A slab knows its holes: the ranges this process does not store (set_holes). It is the one
// place that knows them: for_each_stored walks the rest, and write_all lets a writer fill the
// whole slab (a checkpoint load) and hands the holes' pages back after it.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/slab_range.h"

namespace foundry {

template <typename T>
class PageSlab {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  PageSlab() = default;
  explicit PageSlab(size_t n) : size_(n) {
    if (n == 0) return;
    data_ = static_cast<T*>(map_zeroed(bytes()));
  }
  ~PageSlab() { unmap(); }
  PageSlab(PageSlab&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        holes_(std::move(o.holes_)) {}
  PageSlab& operator=(PageSlab&& o) noexcept {
    if (this != &o) {
      unmap();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      holes_ = std::move(o.holes_);
    }
    return *this;
  }
  PageSlab(const PageSlab&) = delete;
  PageSlab& operator=(const PageSlab&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  operator std::span<T>() { return {data_, size_}; }
  operator std::span<const T>() const { return {data_, size_}; }

  // Bytes of the slab backed by memory now (mincore; pages never written, or released, are
  // not), rounded to whole pages.
  size_t resident_bytes() const {
    if (!data_) return 0;
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t pages = (bytes() + page - 1) / page;
    std::vector<unsigned char> in_core(pages);
    if (mincore(data_, bytes(), in_core.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : in_core) n += c & 1;
    return n * page;
  }

  // ---- holes ------------------------------------------------------------------------------
  using Ranges = SlabRanges;
  // Stops storing `holes` (sorted, disjoint element ranges [begin, end) inside the slab;
  // the caller validates them): their whole pages go back to the OS and read as zero.
  void set_holes(Ranges holes) {
    holes_ = std::move(holes);
    release_holes();
  }
  const Ranges& holes() const { return holes_; }
  // fn(begin, end) for each stored part of the slab, in order.
  template <typename F>
  void for_each_stored(F fn) const {
    int64_t at = 0;
    const int64_t n = static_cast<int64_t>(size_);
    for (const auto& [b, e] : holes_) {
      if (b > at) fn(at, b);
      at = e;
    }
    if (at < n) fn(at, n);
  }
  // False when [begin, end) lies entirely inside one hole.
  bool stores_any(int64_t begin, int64_t end) const {
    for (const auto& [b, e] : holes_)
      if (b <= begin && end <= e) return false;
    return true;
  }
  // Runs fn(data()) for a writer that fills the whole slab, holes included, and hands the
  // holes' pages back after it, even when it throws.
  template <typename F>
  decltype(auto) write_all(F&& fn) {
    struct Rerelease {
      PageSlab* slab;
      ~Rerelease() { slab->release_holes(); }
    } after{this};
    return fn(data_);
  }

  // Returns the whole pages inside elements [begin, end) to the OS: they read as zero and
  // take no memory until written again. Elements on the pages the range only partly covers
  // keep their values (they share the page with elements outside it).
  void release(size_t begin, size_t end) { advise(begin, end, MADV_DONTNEED); }

  // Slabs of at least this many bytes are backed by transparent huge pages where the kernel
  // offers them (a fault maps 2 MiB instead of 4 KiB: first touch of the gigabytes of a
  // training process costs a fraction of the time), and start on a huge-page boundary.
  static constexpr size_t kHugePage = size_t{2} << 20;

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  // Zeroed, unbacked memory for `n` bytes; from kHugePage on, aligned to it and advised to
  // use huge pages (the slack mapped for the alignment is unmapped again).
  static void* map_zeroed(size_t n) {
    const bool huge = n >= kHugePage;
    const size_t mapped = huge ? n + kHugePage : n;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (!huge) return p;
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (start > base) munmap(p, start - base);
    if (const size_t tail = base + mapped - (start + n); tail > 0)
      munmap(reinterpret_cast<void*>(start + n), tail);
    madvise(reinterpret_cast<void*>(start), n, MADV_HUGEPAGE);  // a hint: ignored where off
    return reinterpret_cast<void*>(start);
  }
  void unmap() {
    if (data_) munmap(data_, bytes());
    data_ = nullptr;
  }
  // madvise on the whole pages inside elements [begin, end).
  void advise(size_t begin, size_t end, int advice) {
    if (!data_ || end <= begin) return;
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    uintptr_t lo = reinterpret_cast<uintptr_t>(data_ + begin);
    uintptr_t hi = reinterpret_cast<uintptr_t>(data_ + end);
    lo = (lo + page - 1) / page * page;
    hi = hi / page * page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, advice);
  }
  // A hole takes no memory: no huge page may cover it (a write beside it would back the
  // whole 2 MiB), and its pages go back to the OS.
  void release_holes() {
    for (const auto& [b, e] : holes_) {
      advise(static_cast<size_t>(b), static_cast<size_t>(e), MADV_NOHUGEPAGE);
      release(static_cast<size_t>(b), static_cast<size_t>(e));
    }
  }
  T* data_ = nullptr;
  size_t size_ = 0;
  Ranges holes_;
};

}  // namespace foundry
