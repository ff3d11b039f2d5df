// Bytes: an immutable run of bytes for message fields that carry bulk data (blobs, encoded
// tensors). On the wire it is exactly a std::string (cereal's size tag, then the bytes), so a
// field may change between the two without changing any frame. What it adds is the receive side:
// a long run decoded from a received message is not copied out of it — the Bytes points into the
// ZeroMQ message and keeps it alive (a SharedBuffer reference) for as long as it, or any copy of
// it, lives. Invariant: data() stays valid and unchanged for the lifetime of the Bytes, whatever
// the socket receives meanwhile.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cereal/cereal.hpp>

#include "troupe/runtime/wire.h"

namespace troupe::runtime {

// Memory that outlives its first user through an intrusive count (a received ZeroMQ message,
// shared by the envelopes it carries and by the Bytes that point into it). Created with count 1;
// the last release() destroys it.
class SharedBuffer {
 public:
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  std::uint32_t use_count() const noexcept { return refs_.load(std::memory_order_relaxed); }

 protected:
  SharedBuffer() = default;
  virtual ~SharedBuffer() = default;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

 private:
  std::atomic<std::uint32_t> refs_{1};
};

class Bytes {
 public:
  Bytes() : own_() {}
  Bytes(std::string s) : own_(std::move(s)) {}  // NOLINT(google-explicit-constructor): takes s, no copy
  Bytes(const char* s) : own_(s) {}             // NOLINT(google-explicit-constructor): copies a C string
  Bytes(const char* data, std::size_t size) : own_(data, size) {}  // copies
  // A view of [data, data + size) inside `owner`'s memory; takes a reference to owner.
  static Bytes shared(SharedBuffer* owner, const char* data, std::size_t size) {
    Bytes b;
    owner->retain();
    b.own_.~basic_string();
    b.view_ = {data, size};
    b.owner_ = owner;
    return b;
  }

  Bytes(const Bytes& o) { construct_from(o); }
  Bytes(Bytes&& o) noexcept { construct_from(std::move(o)); }
  Bytes& operator=(const Bytes& o) {
    if (this != &o) *this = Bytes(o);
    return *this;
  }
  Bytes& operator=(Bytes&& o) noexcept {
    if (this != &o) {
      destroy();
      construct_from(std::move(o));
    }
    return *this;
  }
  ~Bytes() { destroy(); }

  const char* data() const { return owner_ ? view_.data : own_.data(); }
  std::size_t size() const { return owner_ ? view_.size : own_.size(); }
  bool empty() const { return size() == 0; }
  std::string_view view() const { return {data(), size()}; }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor)
  const char* begin() const { return data(); }
  const char* end() const { return data() + size(); }
  std::string str() const { return std::string(view()); }  // a copy
  // Bytes [at, at + n) of these (clamped to their end): a view into the same memory when these
  // are a view (no copy), else a copy.
  Bytes slice(std::size_t at, std::size_t n) const {
    at = at < size() ? at : size();
    n = n < size() - at ? n : size() - at;
    return owner_ ? shared(owner_, view_.data + at, n) : Bytes(own_.data() + at, n);
  }
  // True when the bytes are a view into a received message (nothing was copied).
  bool is_shared() const { return owner_ != nullptr; }
  // Equal bytes (against another Bytes, a std::string or a literal alike).
  friend bool operator==(const Bytes& a, std::string_view b) { return a.view() == b; }

  // The same bytes on the wire as a std::string (cereal binary archives and troupe's).
  template <class A>
  void save(A& ar) const {
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(size())));
    ar(cereal::binary_data(data(), size()));
  }
  template <class A>
  void load(A& ar) {
    cereal::size_type n = 0;
    ar(cereal::make_size_tag(n));
    if constexpr (std::is_same_v<A, WireInputArchive>) {
      // A long run of a received message is shared, not copied (WireInputArchive::share).
      if (SharedBuffer* owner = nullptr; const char* at = ar.share(static_cast<std::size_t>(n), owner)) {
        *this = shared(owner, at, static_cast<std::size_t>(n));
        return;
      }
    }
    if (owner_) *this = Bytes();
    own_.resize(static_cast<std::size_t>(n));
    ar(cereal::binary_data(own_.data(), own_.size()));
  }

 private:
  struct View {
    const char* data;
    std::size_t size;
  };
  // Leaves o empty (owning nothing) when it was a view; a moved-from string otherwise.
  void construct_from(Bytes&& o) noexcept {
    if (o.owner_) {
      view_ = o.view_;
      owner_ = std::exchange(o.owner_, nullptr);
      ::new (&o.own_) std::string();
    } else {
      ::new (&own_) std::string(std::move(o.own_));
      owner_ = nullptr;
    }
  }
  void construct_from(const Bytes& o) {
    if (o.owner_) {
      view_ = o.view_;
      owner_ = o.owner_;
      owner_->retain();
    } else {
      ::new (&own_) std::string(o.own_);
      owner_ = nullptr;
    }
  }
  void destroy() noexcept {
    if (owner_)
      owner_->release();
    else
      own_.~basic_string();
  }

  union {
    std::string own_;  // the bytes, unless owner_ is set
    View view_;        // owner_ set: the bytes are [view_.data, view_.data + view_.size) of its memory
  };
  SharedBuffer* owner_ = nullptr;  // a reference held while this is a view
};

}  // namespace troupe::runtime
