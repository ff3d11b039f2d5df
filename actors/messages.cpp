// Registers every message type of messages.h with the runtime at start-up, so a type id claimed
// twice is an error before any role runs (the runtime refuses the second claim), not a message
// that later fails to decode.
#include "troupe/actors/messages.h"

#include "troupe/runtime/system.h"

namespace troupe::actors {

namespace {
template <class... M>
Status register_each(MessageList<M...>) {
  Status first;
  ((first.ok() ? (void)(first = runtime::register_message<M>()) : (void)0), ...);
  return first;
}
}  // namespace

Status register_messages() {
  TROUPE_TRY(register_each(MessageList<runtime::ErrorReply, runtime::Heartbeat, runtime::NodeDown, runtime::ActorDown>{}));
  return register_each(RoleMessages{});
}

}  // namespace troupe::actors
