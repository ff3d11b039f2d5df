// Env fault injection (off by default): a decorator around an EnvClient that makes chosen calls
// fail the way a broken environment does, so the recovery paths run on demand. The launcher fills
// EnvFaults from the YAML `faults:` section; the reliability tests and `troupe bench reliability`
// use it. Each call draws from a hash of (seed, salt, op, episode or payload, how often this
// decorator saw that key), so which calls fail depends only on the config, never on timing.
//
//   exception  the call fails as the env's own error (termination env_error)
//   crash      the worker process is SIGKILLed just before the call (worker_crash; it is restarted)
//   hang       the worker is SIGSTOPped just before the call: the call runs into timeout_s, the
//              worker is killed and replaced (timeout)
//   slow       the call starts slow_s late and then succeeds
//   malformed  the reply is replaced by bytes that are not JSON before it is parsed (protocol_error)
//   dropped    the request is lost on the wire: the call runs into timeout_s (timeout; a worker
//              troupe started is killed and replaced)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/base/enum_names.h"

namespace troupe::envs {

// The env calls faults hit (YAML faults.env_op).
enum class FaultOp { any, reset, step, verify };

class EnvClient;

struct EnvFaults {
  uint64_t seed = 0;
  std::string salt;            // tells env workers apart (the role name)
  FaultOp op = FaultOp::any;
  double exception = 0, crash = 0, hang = 0, slow = 0, malformed = 0, dropped = 0;  // probability per call
  double slow_s = 1.0;
  std::vector<int> steps;      // only in these GRPO steps (empty: every step)
  bool any() const { return exception > 0 || crash > 0 || hang > 0 || slow > 0 || malformed > 0 || dropped > 0; }
  // Which kinds need a worker process troupe started (crash, hang) or a wire (malformed, dropped).
  bool needs_process() const { return crash > 0 || hang > 0; }
  bool needs_wire() const { return malformed > 0 || dropped > 0; }
};

// The step of a GRPO episode id ("grpo-STEP-..."), or -1.
int step_of_episode(const std::string& episode_id);

// Wraps `inner`; with !faults.any() returns it unchanged. Each injected fault is logged to stderr
// as one line starting "troupe: fault injected:".
std::unique_ptr<EnvClient> with_injected_faults(std::unique_ptr<EnvClient> inner, EnvFaults faults);

}  // namespace troupe::envs

namespace troupe {
template <>
struct EnumNames<envs::FaultOp> {
  using O = envs::FaultOp;
  static constexpr std::pair<std::string_view, O> table[] = {
      {"any", O::any}, {"reset", O::reset}, {"step", O::step}, {"verify", O::verify}};
};
}  // namespace troupe
