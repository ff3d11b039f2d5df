// A generator's side of the weight-sync codec: a full or delta Weights message applied to the
// values it holds, every tensor checked against its checksum. Anything but `applied` leaves the
// values exactly as they were (a delta is undone: XOR is its own inverse).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_format.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

struct WeightsApplied {
  WeightsStatus status = WeightsStatus::applied;
  std::string detail;  // why, when not applied
};
// The receiver's side: applies a full or delta message to `values` (a delta: `values` holds the
// message's base version; the caller checks that it is the one it holds) and checks every
// tensor's checksum. Anything but `applied` leaves `values` as they were.
WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype);

// A delta applied while its payload still arrives (weight_sync.relay_fanout: a relay's parts):
// each tensor's chunks are applied to `values` and hashed as soon as all their bytes are in, as
// apply_weights does them, by a thread of its own (the feeder goes on meanwhile), and the
// checksums checked once the whole payload is there. The outcome and the bits are apply_weights'
// on the whole message; anything but `applied` from finish(), or abort(), leaves `values` as they
// were. Neither `values` nor the fed bytes may move or change until finish() or abort().
class StreamedDelta {
 public:
  // `head`: the message without its payload. started() is false when it cannot be streamed (not a
  // delta, a refusal, a corrupt layout, a tensor table that does not tile the arena): then apply
  // the whole message with apply_weights.
  StreamedDelta(const Weights& head, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                WeightDtype dtype);
  ~StreamedDelta();
  bool started() const { return state_ != nullptr; }
  // The payload's first `size` bytes, a prefix that grows call by call in one buffer that does
  // not move: every tensor whose chunks lie within it is applied (by the thread, soon).
  void feed(const char* payload, std::size_t size);
  // The whole message (`head` with its payload): the rest applied, every checksum checked.
  WeightsApplied finish(const Weights& w);
  // What was applied undone, bit for bit; `payload`: the bytes fed so far (or more of the same payload).
  void abort(const char* payload);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace troupe::actors
