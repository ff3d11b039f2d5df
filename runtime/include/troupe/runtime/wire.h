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

namespace troupe::runtime {

// Thrown inside the decoder only; decode_* functions turn it into an Error value.
struct WireError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes into out[0, capacity) when out != nullptr, otherwise only counts bytes (size pass);
// or appends to a growable std::string from `offset` (one pass, buffer reused across calls).
class WireOutputArchive : public cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit WireOutputArchive(char* out = nullptr, std::size_t capacity = 0)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(out), capacity_(capacity) {}
  WireOutputArchive(std::string& grow, std::size_t offset)
      : cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision>(this), out_(nullptr), capacity_(0),
        grow_(&grow), base_(offset) {}
  void saveBinary(const void* data, std::size_t size) {
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
};

class WireInputArchive : public cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision> {
 public:
  WireInputArchive(const char* data, std::size_t size)
      : cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision>(this), data_(data), size_(size) {}
  void loadBinary(void* out, std::size_t size) {
    if (size > size_ - pos_)
      throw WireError("truncated payload: needed " + std::to_string(size) + " bytes at offset " + std::to_string(pos_) +
                      ", have " + std::to_string(size_ - pos_));
    std::memcpy(out, data_ + pos_, size);
    pos_ += size;
  }
  std::size_t remaining() const { return size_ - pos_; }
  std::size_t consumed() const { return pos_; }

 private:
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
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
