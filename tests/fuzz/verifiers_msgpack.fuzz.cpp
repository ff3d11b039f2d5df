// Fuzz target: the verifiers env server's MessagePack frames (envs/src/msgpack_json.cpp), as the
// verifiers client decodes each delta and reply. A decoded value must encode back to MessagePack
// that decodes to the same value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "msgpack_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = troupe::envs::msgpack_to_json(data, size);
  if (!decoded.ok()) return 0;
  const std::string again = troupe::envs::json_to_msgpack(*decoded);
  auto round = troupe::envs::msgpack_to_json(again.data(), again.size());
  if (!round.ok() || *round != *decoded) std::abort();  // the encoder and decoder disagree
  return 0;
}
