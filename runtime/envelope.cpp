// Envelope header codec and the process-wide message type registry.
// The header is written field by field (little-endian) so its layout never depends on padding.
#include "troupe/runtime/envelope.h"

#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <typeindex>
#include <unordered_map>

namespace troupe::runtime {

std::string to_string(ActorId id) {
  if (id.local & 0x80000000u) return "alias:" + std::to_string(id.local & 0x7fffffffu) + "@node" + std::to_string(id.node);
  return std::to_string(id.local) + "@node" + std::to_string(id.node);
}

namespace {
struct TypeEntry {
  std::type_index type;
  std::string name;
};
struct Registry {
  std::shared_mutex mu;  // read on every received frame, written once per type
  std::unordered_map<std::uint32_t, TypeEntry> types;
};
Registry& registry() {
  static Registry r;
  return r;
}

template <class T>
void put(char*& p, T v) {
  std::memcpy(p, &v, sizeof(T));
  p += sizeof(T);
}
template <class T>
T get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}
}  // namespace

Status register_message_type(std::uint32_t type_id, const std::type_info& type, const char* name) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  auto it = r.types.find(type_id);
  if (it == r.types.end()) {
    r.types.emplace(type_id, TypeEntry{std::type_index(type), name});
    return {};
  }
  if (it->second.type == std::type_index(type)) return {};
  return make_error(ErrorCode::internal, "message type id " + std::to_string(type_id) + " is claimed by both " +
                                             it->second.name + " and " + name + "; give one a new type_id");
}

bool is_registered_type(std::uint32_t type_id) {
  if (type_id >= kSystemTypeBase && type_id <= kSystemTypeBase + 4) return true;
  Registry& r = registry();
  std::shared_lock lock(r.mu);
  return r.types.count(type_id) != 0;
}

std::string registered_type_name(std::uint32_t type_id) {
  Registry& r = registry();
  std::shared_lock lock(r.mu);
  auto it = r.types.find(type_id);
  if (it == r.types.end()) return "unknown type id " + std::to_string(type_id);
  return it->second.name + " (id " + std::to_string(type_id) + ")";
}

void write_header(char* out, const EnvelopeHeader& h) {
  char* p = out;
  put(p, h.magic);
  put(p, h.version);
  put(p, h.flags);
  put(p, h.type_id);
  put(p, h.sender.packed());
  put(p, h.recipient.packed());
  put(p, h.correlation);
  put(p, h.payload_size);
}

namespace {
// exact: the frame is this one envelope; otherwise its payload need only fit in frame_size.
Result<EnvelopeHeader> decode_header_in(const char* frame, std::size_t frame_size, bool exact) {
  if (frame_size < kHeaderSize)
    return invalid_input("truncated frame: " + std::to_string(frame_size) + " bytes, the header alone needs " +
                         std::to_string(kHeaderSize));
  const char* p = frame;
  EnvelopeHeader h;
  h.magic = get<std::uint32_t>(p);
  if (h.magic != kEnvelopeMagic) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", h.magic);
    return invalid_input(std::string("bad magic ") + buf + " (not a troupe frame)");
  }
  h.version = get<std::uint16_t>(p);
  if (h.version != kEnvelopeVersion)
    return invalid_input("unsupported envelope version " + std::to_string(h.version) + " (this build speaks " +
                         std::to_string(kEnvelopeVersion) + ")");
  h.flags = get<std::uint16_t>(p);
  if (h.flags & ~std::uint16_t(kFlagRequest | kFlagReply | kFlagSegmented))
    return invalid_input("unknown envelope flags " + std::to_string(h.flags));
  if ((h.flags & kFlagRequest) && (h.flags & kFlagReply)) return invalid_input("envelope is both a request and a reply");
  h.type_id = get<std::uint32_t>(p);
  h.sender = ActorId::unpack(get<std::uint64_t>(p));
  h.recipient = ActorId::unpack(get<std::uint64_t>(p));
  h.correlation = get<std::uint64_t>(p);
  h.payload_size = get<std::uint32_t>(p);
  const std::size_t room = frame_size - kHeaderSize;
  if (exact ? std::size_t(h.payload_size) != room : std::size_t(h.payload_size) > room)
    return invalid_input("payload length mismatch: header says " + std::to_string(h.payload_size) + " bytes, frame has " +
                         std::to_string(room) + (h.payload_size > room ? " (truncated)" : ""));
  return h;
}
}  // namespace

Result<EnvelopeHeader> decode_header(const char* frame, std::size_t frame_size, bool check_type) {
  auto h = decode_header_in(frame, frame_size, /*exact=*/true);
  if (h.ok() && check_type && !is_registered_type(h->type_id))
    return invalid_input("unknown message type id " + std::to_string(h->type_id) + " from " + to_string(h->sender));
  return h;
}

Result<EnvelopeHeader> decode_batched_header(const char* data, std::size_t available) {
  return decode_header_in(data, available, /*exact=*/false);
}

}  // namespace troupe::runtime
