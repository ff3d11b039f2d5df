// Fuzz target: the runtime's message framing and decoding (runtime/envelope.cpp, wire.h) with the
// real message types of the roles (actors/messages.h). The input is what a receive thread gets: a
// batch of envelopes back to back. Each is framed with decode_batched_header and decode_header, and
// its cereal payload decoded as the type its id names (Bytes fields shared with the input, and a
// segmented payload's out-of-line part taken from the bytes after the envelope).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "troupe/actors/messages.h"
#include "troupe/runtime/envelope.h"
#include "troupe/runtime/system.h"

namespace {

using namespace troupe::runtime;
using troupe::actors::MessageList;

class Held final : public SharedBuffer {};

// Decodes the payload as M when the id is M's; true when some type of the list matched.
template <class M>
bool decode_as(const EnvelopeHeader& h, const char* body, const char* rest, size_t rest_size, SharedBuffer* owner) {
  if (h.type_id != M::type_id) return false;
  M out;
  if ((h.flags & kFlagSegmented) != 0) {
    const WireSegment seg{rest, rest_size};
    (void)decode_payload(body, h.payload_size, &seg, 1, out, owner);
  } else {
    (void)decode_payload(body, h.payload_size, out, owner);
  }
  return true;
}

template <class... M>
void decode_any(MessageList<M...>, const EnvelopeHeader& h, const char* body, const char* rest, size_t rest_size,
                SharedBuffer* owner) {
  (void)(decode_as<M>(h, body, rest, rest_size, owner) || ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool registered = troupe::actors::register_messages().ok();
  if (!registered) std::abort();
  const char* bytes = reinterpret_cast<const char*>(data);
  (void)decode_header(bytes, size, /*check_type=*/true);  // the input as one frame
  auto* owner = new Held;
  size_t at = 0;
  while (at < size) {
    auto h = decode_batched_header(bytes + at, size - at);
    if (!h.ok()) break;
    if (at + kHeaderSize + h->payload_size > size) std::abort();  // the header promised bytes it does not have
    const char* body = bytes + at + kHeaderSize;
    const size_t next = at + kHeaderSize + h->payload_size;
    decode_any(troupe::actors::RoleMessages{}, *h, body, bytes + next, size - next, owner);
    decode_any(MessageList<ErrorReply, Heartbeat, NodeDown, ActorDown>{}, *h, body, bytes + next, size - next, owner);
    at = next;
  }
  if (owner->use_count() != 1) std::abort();  // a decoded value kept a reference to the input
  owner->release();
  return 0;
}
