// An SFT step's batch: sft.batch_size prompts drawn by env weight (seeds from run.seed, the step
// and the index), each env's reference_completion as the target, tokenized as the generators
// would see the prompt (template, BOS, cut to max_prompt_length from the left) plus EOS.
#include "coordinator_internal.h"
#include "troupe/actors/roles.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

Task<Result<TrainReq>> sft_batch(RunState& s, int64_t k, double* tokens) {
  const auto& tok = *s.tokenizer;
  const int B = s.cfg.sft.batch_size;
  auto episode_id = [k](int i) { return "sft-" + std::to_string(k) + "-" + std::to_string(i); };
  std::vector<Reply<EnvObs>> obs;
  std::vector<std::string> envn;
  std::vector<int64_t> draws;
  for (int i = 0; i < B; ++i) {
    uint64_t rs = mix_seed(s.cfg.run.seed, seed_stream::sft_prompt, static_cast<uint64_t>(k), static_cast<uint64_t>(i));
    envn.push_back(s.cfg.envs[pick_env(s.cfg, rs)].name);
    draws.push_back(s.next_draw(envn.back()));
    obs.push_back(request<EnvObs>(
        s.here, s.env_worker(i), EnvResetReq{envn.back(), episode_id(i), mix_seed(rs, seed_stream::env_reset), 0, draws.back()},
        kEnvTimeout));
  }
  TrainReq req;
  req.phase = learner::Phase::sft;
  req.step = k;
  *tokens = 0;
  std::string last_failure;
  for (int i = 0; i < B; ++i) {
    uint64_t rs = mix_seed(s.cfg.run.seed, seed_stream::sft_prompt, static_cast<uint64_t>(k), static_cast<uint64_t>(i));
    Result<EnvObs> first = co_await obs[i];
    const EnvResetReq rq{envn[i], episode_id(i), mix_seed(rs, seed_stream::env_reset), 0, draws[i]};
    ResetOutcome got = co_await reset_retrying(s, first, rq, static_cast<size_t>(i), true);
    (void)s.here->send(s.env_worker(got.worker), EnvReleaseReq{envn[i], got.episode_id});
    if (!got.obs.error.empty()) {  // no prompt on any try: this example is left out
      last_failure = got.obs.reason + ": " + got.obs.error;
      continue;
    }
    const EnvObs& o = got.obs;
    json meta = json::parse(o.metadata_json, nullptr, false);
    if (!meta.is_object() || !meta.contains("reference_completion") ||
        !meta["reference_completion"].is_string())
      co_return invalid_input("sft: env '" + envn[i] + "' gives no reference_completion to train on");
    TrainSample x;
    auto p = encode_prompt(s.cfg.rollout, tok, s.chat_template.get(), encodable(tok, o.text),
                           prompt_messages_of(s, o.messages_json));
    auto c = tok.encode(encodable(tok, meta["reference_completion"].get<std::string>()));
    if (!p.ok()) co_return p.error();
    if (!c.ok()) co_return c.error();
    x.prompt = std::move(p).value();
    if (x.prompt.size() > static_cast<size_t>(s.cfg.rollout.max_prompt_length))
      x.prompt.erase(x.prompt.begin(), x.prompt.end() - s.cfg.rollout.max_prompt_length);
    x.completion = *c;
    if (tok.eos_id() >= 0) x.completion.push_back(tok.eos_id());
    *tokens += static_cast<double>(x.completion.size());
    req.samples.push_back(std::move(x));
  }
  if (req.samples.empty())
    co_return make_error(ErrorCode::peer_failed, "sft step " + std::to_string(k) +
                                                     ": every prompt's reset failed after retries (last: " +
                                                     last_failure + ")");
  co_return req;
}

}  // namespace troupe::actors::coord
