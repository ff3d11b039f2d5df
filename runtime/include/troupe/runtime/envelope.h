// The envelope every troupe message travels in, and the typed-message registry.
// Frame = 40-byte header (magic, version, flags, type id, sender, recipient, correlation id,
// payload length) + the cereal payload. Invariant: decode_* never crashes or over-allocates on
// any input; it returns an Error naming what is wrong (bad magic, version, truncation, type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/runtime/wire.h"

namespace troupe::runtime {

// ActorId: node (process) in the high 32 bits, actor within the node in the low 32 bits.
// Local id 0 is the node itself (system messages, asks from outside any actor).
// Local ids with the top bit set are name aliases (see ActorSystem::named).
struct ActorId {
  std::uint32_t node = 0;
  std::uint32_t local = 0;
  std::uint64_t packed() const { return (std::uint64_t{node} << 32) | local; }
  static ActorId unpack(std::uint64_t v) { return {static_cast<std::uint32_t>(v >> 32), static_cast<std::uint32_t>(v)}; }
  bool valid() const { return local != 0; }
  friend bool operator==(const ActorId&, const ActorId&) = default;
  friend auto operator<=>(const ActorId&, const ActorId&) = default;
};
std::string to_string(ActorId id);

inline constexpr std::uint32_t kEnvelopeMagic = 0x45505254;  // "TRPE" little-endian
inline constexpr std::uint16_t kEnvelopeVersion = 1;
inline constexpr std::size_t kHeaderSize = 40;

enum EnvelopeFlags : std::uint16_t {
  kFlagRequest = 1,    // sender waits for a reply carrying the same correlation id
  kFlagReply = 2,      // answers the request with this correlation id
  kFlagSegmented = 4,  // the payload's long runs travel out of line, as further parts (wire.h)
};

struct EnvelopeHeader {
  std::uint32_t magic = kEnvelopeMagic;
  std::uint16_t version = kEnvelopeVersion;
  std::uint16_t flags = 0;
  std::uint32_t type_id = 0;
  ActorId sender;
  ActorId recipient;
  std::uint64_t correlation = 0;
  std::uint32_t payload_size = 0;
};

// Type ids at or above this are the runtime's own (heartbeats, error replies, down notices).
inline constexpr std::uint32_t kSystemTypeBase = 0xFFFF0000u;

// A message type is any struct with `static constexpr std::uint32_t type_id` (unique, stable,
// below kSystemTypeBase) and a cereal `serialize(Archive&)`; an optional
// `static constexpr const char* type_name` improves error messages.
template <class M>
concept Message = requires {
  { M::type_id } -> std::convertible_to<std::uint32_t>;
};

template <Message M>
constexpr const char* message_name() {
  if constexpr (requires { M::type_name; }) return M::type_name;
  else return typeid(M).name();
}

// Process-wide registry type id -> type; a second type claiming a taken id is an error.
Status register_message_type(std::uint32_t type_id, const std::type_info& type, const char* name);
bool is_registered_type(std::uint32_t type_id);
std::string registered_type_name(std::uint32_t type_id);

template <Message M>
const Status& register_message() {  // called on every send: a reference, no copy
  static const Status registered = register_message_type(M::type_id, typeid(M), message_name<M>());  // once per type
  return registered;
}

// --- header codec ---
void write_header(char* out, const EnvelopeHeader& h);
// Validates magic, version, payload length against frame_size, and (when check_type) that the
// type id is registered or a system type.
Result<EnvelopeHeader> decode_header(const char* frame, std::size_t frame_size, bool check_type = true);
// The header of the first envelope of a batch (envelopes back to back in one transport message):
// the same checks, except that its payload need only fit in `available` bytes; the next envelope
// starts kHeaderSize + payload_size bytes in. The type id is not checked.
Result<EnvelopeHeader> decode_batched_header(const char* data, std::size_t available);

// --- payload codec ---
template <class M>
std::size_t payload_size_of(const M& m) {
  WireOutputArchive counter;
  counter(m);
  return counter.size();
}
// Writes the payload of m into out (which has room for payload_size_of(m) bytes).
template <class M>
void write_payload(char* out, std::size_t capacity, const M& m) {
  WireOutputArchive ar(out, capacity);
  ar(m);
}
// `owner`: the received memory the payload lies in; Bytes fields share their long runs with it
// instead of copying them (bytes.h). Null: everything is copied.
template <class M>
Status decode_payload(const char* data, std::size_t size, M& out, SharedBuffer* owner = nullptr) {
  try {
    WireInputArchive ar(data, size);
    ar.set_owner(owner);
    ar(out);
    if (ar.remaining() != 0)
      return invalid_input("message " + std::string(message_name<M>()) + ": " + std::to_string(ar.remaining()) +
                           " trailing bytes after the payload");
  } catch (const std::exception& e) {
    return invalid_input("message " + std::string(message_name<M>()) + ": " + e.what());
  }
  return {};
}
// A payload sent with kFlagSegmented: its long runs are `segments`, in order, every one read.
template <class M>
Status decode_payload(const char* data, std::size_t size, const WireSegment* segments, std::size_t n_segments, M& out,
                      SharedBuffer* owner = nullptr) {
  try {
    WireInputArchive ar(data, size, segments, n_segments);
    ar.set_owner(owner);
    ar(out);
    if (ar.remaining_inline() != 0)
      return invalid_input("message " + std::string(message_name<M>()) + ": " + std::to_string(ar.remaining_inline()) +
                           " trailing bytes after the payload");
    if (ar.segments_left() != 0)
      return invalid_input("message " + std::string(message_name<M>()) + ": " + std::to_string(ar.segments_left()) +
                           " out-of-line part(s) left unread");
  } catch (const std::exception& e) {
    return invalid_input("message " + std::string(message_name<M>()) + ": " + e.what());
  }
  return {};
}

// --- out-of-line runs (wire.h) ---
// The payload size of m with its long runs left out, which are listed (pointing into m) in `segments`.
template <class M>
std::size_t segmented_payload_size_of(const M& m, std::vector<WireSegment>& segments) {
  WireOutputArchive counter(WireOutputArchive::Segmented{}, &segments);
  counter(m);
  return counter.size();
}
// Writes the frame of m with its long runs left out (payload_size from segmented_payload_size_of);
// h gets M's type id, the payload size and kFlagSegmented.
template <class M>
void write_segmented_frame(char* out, std::size_t payload_size, const M& m, EnvelopeHeader h) {
  h.type_id = M::type_id;
  h.payload_size = static_cast<std::uint32_t>(payload_size);
  h.flags |= kFlagSegmented;
  write_header(out, h);
  WireOutputArchive ar(WireOutputArchive::Segmented{}, nullptr, out + kHeaderSize, payload_size);
  ar(m);
}

// Writes the whole frame of m into out (room for kHeaderSize + payload_size bytes, payload_size
// = payload_size_of(m)); h gets M's type id and the payload size.
template <Message M>
void write_frame(char* out, std::size_t payload_size, const M& m, EnvelopeHeader h) {
  h.type_id = M::type_id;
  h.payload_size = static_cast<std::uint32_t>(payload_size);
  write_header(out, h);
  write_payload(out + kHeaderSize, payload_size, m);
}
// One pass: writes the frame of m into out[0, room) if it fits there; returns its size either way
// (larger than room: out holds nothing usable).
template <Message M>
std::size_t write_frame_bounded(char* out, std::size_t room, const M& m, EnvelopeHeader h) {
  if (room < kHeaderSize) return kHeaderSize + payload_size_of(m);
  WireOutputArchive ar(WireOutputArchive::Bounded{}, out + kHeaderSize, room - kHeaderSize);
  ar(m);
  if (!ar.fits()) return kHeaderSize + ar.size();
  h.type_id = M::type_id;
  h.payload_size = static_cast<std::uint32_t>(ar.size());
  write_header(out, h);
  return kHeaderSize + ar.size();
}
// Whole frame (header + payload) into a std::string: used by tests, the codec bench and tools.
template <Message M>
std::string encode_frame(const M& m, EnvelopeHeader h) {
  std::size_t n = payload_size_of(m);
  std::string frame(kHeaderSize + n, '\0');
  write_frame(frame.data(), n, m, h);
  return frame;
}
// One-pass encode into a reusable buffer (grown as needed, never shrunk); returns the frame size
// (buf may be larger). The hot path for codecs that keep a buffer per connection or thread.
template <Message M>
std::size_t encode_frame_into(std::string& buf, const M& m, EnvelopeHeader h) {
  if (buf.size() < kHeaderSize) buf.resize(kHeaderSize);
  std::size_t n;
  {
    WireOutputArchive ar(buf, kHeaderSize);
    ar(m);
    n = ar.size();
  }
  h.type_id = M::type_id;
  h.payload_size = static_cast<std::uint32_t>(n);
  write_header(buf.data(), h);
  return kHeaderSize + n;
}
// Decodes a whole frame expecting type M; any other type id is an error.
template <Message M>
Result<EnvelopeHeader> decode_frame(const char* frame, std::size_t size, M& out) {
  auto h = decode_header(frame, size, /*check_type=*/false);  // the id is checked against M below
  if (!h.ok()) return h.error();
  if (h->type_id != M::type_id)
    return invalid_input("expected message type " + std::string(message_name<M>()) + " (id " + std::to_string(M::type_id) +
                         "), got " + registered_type_name(h->type_id));
  TROUPE_TRY(decode_payload(frame + kHeaderSize, h->payload_size, out));
  return h;
}

// The runtime's own messages.
struct ErrorReply {  // a request failed on the far side (no handler, handler error, actor gone)
  static constexpr std::uint32_t type_id = kSystemTypeBase + 1;
  static constexpr const char* type_name = "ErrorReply";
  std::int32_t code = 0;
  std::string message;
  template <class A>
  void serialize(A& ar) { ar(code, message); }
};
struct Heartbeat {
  static constexpr std::uint32_t type_id = kSystemTypeBase + 2;
  static constexpr const char* type_name = "Heartbeat";
  std::uint64_t seq = 0;
  template <class A>
  void serialize(A& ar) { ar(seq); }
};

}  // namespace troupe::runtime
