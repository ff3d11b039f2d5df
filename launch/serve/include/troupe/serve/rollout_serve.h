// rollout.serve: during a run, each generator this process hosts also serves its current policy
// over the OpenAI-compatible routes of `troupe serve` (openai_server.h), generator i on PORT + i
// (port 0: a free one each). Requests for an episode (model "episodes/EPISODE_ID", routes under
// /episodes/EPISODE_ID/v1/..., or an X-Troupe-Episode header) are recorded into the generator's ServedTurnLog for that episode; the
// coordinator fetches them (ServedTurnsReq) and trains on them. Serving stops when this object goes.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/roles.h"
#include "troupe/base/result.h"
#include "troupe/serve/openai_server.h"

namespace troupe::serve {

// The model id the endpoint lists (/v1/models); requests may name any model.
inline constexpr const char* kRolloutServeModel = "policy";

class RolloutServers {
 public:
  // gens[i] is generator `indices[i]` of the run. Binds every endpoint before returning (errors
  // name rollout.serve and the address), sets each generator's serve_url and logs it on stderr.
  static Result<std::unique_ptr<RolloutServers>> start(const actors::ExperimentConfig& cfg,
                                                       const std::vector<std::shared_ptr<actors::Generator>>& gens,
                                                       const std::vector<int>& indices);
  ~RolloutServers();

 private:
  RolloutServers() = default;
  std::vector<std::unique_ptr<OpenAiServer>> servers_;
  std::vector<std::thread> threads_;
};

}  // namespace troupe::serve
