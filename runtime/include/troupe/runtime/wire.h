// Cereal archives for troupe's wire format: the bytes are those of cereal's binary archive
// (little-endian host layout, u64 size tags), written straight into a caller's buffer and read
// from a bounded span. Invariant: reading never runs past the span and never allocates more
// elements than the remaining bytes could hold, so a hostile frame costs at most its own size.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace troupe::runtime {

// Thrown inside the decoder only; decode_* functions turn it into an Error value.
struct WireError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Out-of-line runs: a remote send may leave every binary run (a string's or an arithmetic
// vector's bytes) of at least kWireSegmentMin bytes out of the payload and hand the run's own
// memory to the transport as a part of its own (no copy into the frame); the reader then takes
// each run of that size from the next part, in order. Both sides apply the same rule, so
// nothing marks where a run was left out.
inline constexpr std::size_t kWireSegmentMin = 64 * 1024;
struct WireSegment {
  const char* data = nullptr;
  std::size_t size = 0;
};

// Received memory that decoded fields may point into instead of copying (bytes.h).
class SharedBuffer;
// A run at least this long that a receiver decodes into a Bytes field is shared with the received
// message, not copied: a frame that long travels in a ZeroMQ message of its own (batches take
// frames up to 16 KiB), so a kept Bytes never pins other envelopes' memory.
inline constexpr std::size_t kWireShareMin = 16 * 1024;

// Writes into out[0, capacity) when out != nullptr, otherwise only counts bytes (size pass);
// or appends to a growable std::string from `offset` (one pass, buffer reused across calls).
class WireOutputArchive : public cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit WireOutputArchive(char* out = nullptr, std::size_t capacity = 0)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(out), capacity_(capacity) {}
  WireOutputArchive(std::string& grow, std::size_t offset)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(nullptr), capacity_(0),
        grow_(&grow), base_(offset) {}
  // Out-of-line runs (see kWireSegmentMin): a counting pass that lists them in `segments`, or a
  // write pass into out[0, capacity) that leaves them out (segments == nullptr).
  struct Segmented {};
  WireOutputArchive(Segmented, std::vector<WireSegment>* segments, char* out = nullptr, std::size_t capacity = 0)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(out), capacity_(capacity),
        segments_(segments), segmented_(true) {}
  // Writes into out[0, room) while it fits and keeps counting past it: one pass that either
  // leaves the whole payload there (fits()) or tells its size.
  struct Bounded {};
  WireOutputArchive(Bounded, char* out, std::size_t room)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(out), capacity_(room),
        bounded_(true) {}
  bool fits() const { return pos_ <= capacity_; }
  void saveBinary(const void* data, std::size_t size) {
    if (size == 0) return;  // an empty vector's data() may be null, which memcpy must not get
    if (bounded_) {
      if (pos_ + size <= capacity_) std::memcpy(out_ + pos_, data, size);
      pos_ += size;
      return;
    }
    if (segmented_ && size >= kWireSegmentMin) {
      if (segments_) segments_->push_back({static_cast<const char*>(data), size});
      return;
    }
    if (grow_) {
      std::size_t end = base_ + pos_ + size;
      if (end > grow_->size()) grow_->resize(std::max(end, 2 * grow_->size()));
      std::memcpy(grow_->data() + base_ + pos_, data, size);
    } else if (out_) {
      if (pos_ + size > capacity_) throw WireError("wire buffer overflow (size pass disagrees with write pass)");
      std::memcpy(out_ + pos_, data, size);
    }
    pos_ += size;
  }
  std::size_t size() const { return pos_; }

 private:
  char* out_;
  std::size_t capacity_;
  std::string* grow_ = nullptr;
  std::size_t base_ = 0;
  std::size_t pos_ = 0;
  std::vector<WireSegment>* segments_ = nullptr;
  bool segmented_ = false;
  bool bounded_ = false;
};

class WireInputArchive : public cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision> {
 public:
  WireInputArchive(const char* data, std::size_t size)
      : cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision>(this), data_(data), size_(size) {}
  // A payload whose out-of-line runs (see kWireSegmentMin) are `segments`, in order.
  WireInputArchive(const char* data, std::size_t size, const WireSegment* segments, std::size_t n_segments)
      : cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision>(this), data_(data), size_(size),
        segments_(segments), n_segments_(n_segments), segmented_(true) {
    for (std::size_t i = 0; i < n_segments; ++i) segment_bytes_left_ += segments[i].size;
  }
  void loadBinary(void* out, std::size_t size) {
    if (size != 0) std::memcpy(out, take(size), size);  // an empty vector's data() may be null
  }
  // The memory that decoded Bytes may share (the received message); none: every run is copied.
  void set_owner(SharedBuffer* owner) { owner_ = owner; }
  // Reads the next run of `size` bytes without copying it when it is long enough to share
  // (kWireShareMin) and an owner is set: returns where it lies and sets `owner`; else reads
  // nothing and returns nullptr (the caller copies it with loadBinary). A lying size is an error.
  const char* share(std::size_t size, SharedBuffer*& owner) {
    if (!owner_ || size < kWireShareMin) return nullptr;
    const char* at = take(size);
    owner = owner_;
    return at;
  }
  // Bytes left to read, out-of-line parts included (what a container's claimed size is checked against).
  std::size_t remaining() const { return size_ - pos_ + segment_bytes_left_; }
  std::size_t remaining_inline() const { return size_ - pos_; }
  std::size_t segments_left() const { return n_segments_ - next_segment_; }
  std::size_t consumed() const { return pos_; }

 private:
  // Where the next run of `size` bytes lies (an out-of-line part, or inline), consumed.
  const char* take(std::size_t size) {
    if (segmented_ && size >= kWireSegmentMin) {
      if (next_segment_ == n_segments_)
        throw WireError("payload reads a " + std::to_string(size) + "-byte run out of line but its " +
                        std::to_string(n_segments_) + " out-of-line part(s) are used up");
      const WireSegment& s = segments_[next_segment_];
      if (s.size != size)
        throw WireError("out-of-line part " + std::to_string(next_segment_) + " has " + std::to_string(s.size) +
                        " bytes, the payload reads " + std::to_string(size));
      ++next_segment_;
      segment_bytes_left_ -= size;
      return s.data;
    }
    if (size > size_ - pos_)
      throw WireError("truncated payload: needed " + std::to_string(size) + " bytes at offset " + std::to_string(pos_) +
                      ", have " + std::to_string(size_ - pos_));
    const char* at = data_ + pos_;
    pos_ += size;
    return at;
  }
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const WireSegment* segments_ = nullptr;
  std::size_t n_segments_ = 0;
  std::size_t next_segment_ = 0;
  std::size_t segment_bytes_left_ = 0;
  bool segmented_ = false;
  SharedBuffer* owner_ = nullptr;
};

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(WireOutputArchive& ar, const T& t) {
  ar.saveBinary(std::addressof(t), sizeof(t));
}
template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar, T& t) {
  ar.loadBinary(std::addressof(t), sizeof(t));
}
template <class Archive, class T>
inline CEREAL_ARCHIVE_RESTRICT(WireInputArchive, WireOutputArchive)
    CEREAL_SERIALIZE_FUNCTION_NAME(Archive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(WireOutputArchive& ar, const cereal::SizeTag<T>& t) {
  ar(t.size);
}
// A container claims `size` elements; each takes at least one byte, so more than the bytes left
// is a lie (truncated or hostile frame): refuse before the container allocates.
template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  if (static_cast<std::uint64_t>(t.size) > ar.remaining())
    throw WireError("container claims " + std::to_string(static_cast<std::uint64_t>(t.size)) + " elements but only " +
                    std::to_string(ar.remaining()) + " bytes remain");
}
template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(WireOutputArchive& ar, const cereal::BinaryData<T>& bd) {
  ar.saveBinary(bd.data, static_cast<std::size_t>(bd.size));
}
template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar, cereal::BinaryData<T>& bd) {
  ar.loadBinary(bd.data, static_cast<std::size_t>(bd.size));
}

}  // namespace troupe::runtime

CEREAL_REGISTER_ARCHIVE(troupe::runtime::WireOutputArchive)
CEREAL_REGISTER_ARCHIVE(troupe::runtime::WireInputArchive)
CEREAL_SETUP_ARCHIVE_TRAITS(troupe::runtime::WireInputArchive, troupe::runtime::WireOutputArchive)
