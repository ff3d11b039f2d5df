// rollout.serve (rollout_serve.h): one OpenAiServer per hosted generator over the generator's own
// serving engine and ServedTurnLog, each serving on a thread of its own until the run ends.
#include "troupe/serve/rollout_serve.h"

#include <chrono>
#include <cstdio>

namespace troupe::serve {

Result<std::unique_ptr<RolloutServers>> RolloutServers::start(
    const actors::ExperimentConfig& cfg, const std::vector<std::shared_ptr<actors::Generator>>& gens,
    const std::vector<int>& indices) {
  std::unique_ptr<RolloutServers> out(new RolloutServers());
  if (cfg.rollout.serve.empty()) return out;
  TROUPE_ASSIGN_OR_RETURN(auto where, parse_bind(cfg.rollout.serve, "rollout.serve:"));
  for (size_t i = 0; i < gens.size(); ++i) {
    auto& g = *gens[i];
    if (!g.serve_engine()) return make_error(ErrorCode::internal, "rollout.serve: the generator has no serving engine");
    const auto& tok = g.serve_tokenizer();
    OpenAiServerOptions so;
    so.model_name = kRolloutServeModel;
    so.record = &g.served_turns();
    so.any_model = true;
    so.builtin_chat_tags = true;  // a model without a chat template: the built-in tags, as rollout.template chat
    auto server = std::make_unique<OpenAiServer>(g.serve_engine(), tok, g.serve_chat_template(), tok->bos_id(),
                                                 tok->eos_id(), so);
    const int port = where.second == 0 ? 0 : where.second + indices[i];
    auto bound = server->bind(where.first, port);
    if (!bound.ok()) return invalid_input("rollout.serve: generator" + std::to_string(indices[i]) + ": " + bound.error().message);
    const std::string url = "http://" + where.first + ":" + std::to_string(*bound);
    g.set_serve_url(url);
    std::fprintf(stderr, "troupe: generator%d: rollout.serve listening on %s (requests for an episode: model "
                 "episodes/ID or base URL %s/episodes/ID/v1)\n",
                 indices[i], url.c_str(), url.c_str());
    OpenAiServer* s = server.get();
    out->servers_.push_back(std::move(server));
    out->threads_.emplace_back([s] {
      if (auto st = s->serve(); !st.ok()) std::fprintf(stderr, "troupe: rollout.serve: %s\n", st.error().message.c_str());
    });
  }
  return out;
}

RolloutServers::~RolloutServers() {
  for (auto& s : servers_) {  // a server whose thread has not started listening yet would miss stop()
    for (int i = 0; i < 500 && !s->serving(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s->stop();
  }
  for (auto& t : threads_) t.join();
}

}  // namespace troupe::serve
