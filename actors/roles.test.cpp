// actors.roles: the roles without an actor system — prompt formatting, the generator's truncation
// and prompt-cut records, weight sync from learner to generator with its version (held back in async
// mode, switched mid-decode with in-flight updates), the env worker's
// batched verify on the arithmetic env, stop strings, the YAML -> learner settings mapping, per-role compute
// threads, the generator actor on a low-priority thread, and rollout.serve: the generator's serving
// engine following the weights and served turns becoming training samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "tiny_config.test.h"
#include "troupe/actors/roles.h"
#include "coordinator_internal.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

ExperimentConfig tiny() {
  ExperimentConfig c = test_support::tiny_config();
  return c;
}

}  // namespace

TEST(Roles, FormatPrompt) {
  RolloutSection r;
  r.system_prompt = "Add. ";
  EXPECT_EQ(format_prompt(r, "1+2="), "Add. 1+2=");
  r.template_name = PromptTemplate::chat;
  EXPECT_EQ(format_prompt(r, "1+2="), "<|system|>\nAdd. \n<|user|>\n1+2=\n<|assistant|>\n");
}

// rollout.template chat with a model chat template: the template's rendering, no BOS added (the
// template places its own tokens); without one, the built-in tags after BOS.
TEST(Roles, EncodePromptWithAChatTemplate) {
  auto tok = make_builtin_tokenizer("byte");
  ASSERT_TRUE(tok.ok());
  auto chat = policy::io::ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}");
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  RolloutSection r;
  r.system_prompt = "Add.";
  r.template_name = PromptTemplate::chat;
  auto ids = encode_prompt(r, **tok, &*chat, "1+2=");
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  auto want = (*tok)->encode("<bos>[system]Add.[user]1+2=[assistant]");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(*ids, *want);  // "<bos>" is the special token's id, written once by the template
  EXPECT_EQ(std::count(ids->begin(), ids->end(), (*tok)->bos_id()), 1);
  auto builtin = encode_prompt(r, **tok, nullptr, "1+2=");
  ASSERT_TRUE(builtin.ok());
  auto body = (*tok)->encode(format_prompt(r, "1+2="));
  std::vector<int32_t> with_bos = {(*tok)->bos_id()};
  with_bos.insert(with_bos.end(), body->begin(), body->end());
  EXPECT_EQ(*builtin, with_bos);
  auto bad = policy::io::ChatTemplate::parse("{{ raise_exception('no') }}");
  ASSERT_TRUE(bad.ok());
  auto err = encode_prompt(r, **tok, &*bad, "x");
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message.find("no"), std::string::npos);
}

TEST(Roles, GeneratorRecordsTruncationAndPromptCut) {
  auto cfg = tiny();
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok()) << g.error().message;
  GenerateReq req;
  req.prompts = {"1+2=", "123456789+123456789="};
  req.sampling.temperature = 1.0f;
  req.sampling.max_new_tokens = 4;
  req.sampling.seed = 7;
  auto rep = (*g)->generate(req);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  ASSERT_EQ(rep->samples.size(), 2u);
  EXPECT_FALSE(rep->samples[0].prompt_cut);
  EXPECT_TRUE(rep->samples[1].prompt_cut);
  EXPECT_EQ(rep->samples[1].prompt_tokens.size(), 8u);  // cut from the left to max_prompt_length
  for (const auto& s : rep->samples) {
    EXPECT_LE(s.tokens.size(), 4u);
    EXPECT_EQ(s.tokens.size(), s.logprobs.size());
    if (s.tokens.size() == 4 && s.tokens.back() != (*g)->tokenizer().eos_id()) {
      EXPECT_TRUE(s.truncated);
    }
  }
  // the same seed gives the same samples
  auto again = (*g)->generate(req);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->samples[0].tokens, rep->samples[0].tokens);
}

// rollout.stop: a one-token stop string stops inside the sampler, a longer one cuts the completion
// after decoding at the shortest token prefix that contains it. Either way the sample ends with it,
// is not truncated, keeps a log-prob per token, and equals the unstopped sample up to there.
TEST(Roles, GeneratorStopsAtStopStrings) {
  auto cfg = tiny();
  cfg.rollout.max_response_length = 16;
  GenerateReq req;
  req.prompts = {"1+2=", "3+4=", "5+6=", "7+8=", "9+1=", "2+2="};
  req.sampling.temperature = 1.0f;
  req.sampling.max_new_tokens = 16;
  req.sampling.seed = 11;
  auto plain_g = Generator::create(cfg);
  ASSERT_TRUE(plain_g.ok()) << plain_g.error().message;
  auto plain = (*plain_g)->generate(req);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  // stop strings taken from the first sample's text: a two-character one (several tokens with the
  // char tokenizer) and a one-character one that appears in some sample
  std::string t0;  // a long enough text (a sample with an id past the tokenizer's vocabulary has none)
  for (const auto& smp : plain->samples)
    if (smp.text.size() > t0.size()) t0 = smp.text;
  ASSERT_GE(t0.size(), 6u) << "the random policy should not stop this early";
  const std::string two = t0.substr(3, 2), one = t0.substr(5, 1);
  for (const auto& stops : {std::vector<std::string>{two}, std::vector<std::string>{one}}) {
    auto c = cfg;
    c.rollout.stop = stops;
    auto g = Generator::create(c);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto rep = (*g)->generate(req);
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    int cut = 0;
    for (size_t i = 0; i < rep->samples.size(); ++i) {
      const auto& s = rep->samples[i];
      const auto& p = plain->samples[i];
      const std::string& ss = stops[0];
      ASSERT_EQ(s.tokens.size(), s.logprobs.size());
      ASSERT_LE(s.tokens.size(), p.tokens.size());
      EXPECT_TRUE(std::equal(s.tokens.begin(), s.tokens.end(), p.tokens.begin())) << "sample " << i;
      const size_t at = p.text.find(ss);
      if (at == std::string::npos) {
        EXPECT_EQ(s.tokens, p.tokens) << "sample " << i << " never reaches " << ss;
        continue;
      }
      ++cut;
      EXPECT_EQ(s.text, p.text.substr(0, at + ss.size())) << "sample " << i << " stop " << ss;
      EXPECT_FALSE(s.truncated) << "a stopped sample is not truncated";
    }
    EXPECT_GE(cut, 1) << "stop " << stops[0];
  }
}

TEST(Roles, WeightSyncCarriesTheVersion) {
  auto cfg = tiny();
  cfg.optimizer.lr = 0.01f;
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok()) << l.error().message;
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok());
  TrainReq req = test_support::tiny_sft_batch();
  auto rep = (*l)->train(req);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_EQ(rep->policy_version, 1);
  auto w = (*l)->weights();
  EXPECT_EQ(w.version, 1);
  ASSERT_TRUE((*g)->set_weights(w).ok());
  EXPECT_EQ((*g)->version(), 1);
  Weights bad;
  bad.params = {1.0f};
  EXPECT_FALSE((*g)->set_weights(bad).ok());  // wrong size is an error, not a crash
}

// Async mode: weights broadcast to a generator are held back until a request names their version,
// so a step's samples come from exactly the version it asked for, whenever the weights arrived.
TEST(Roles, GeneratorSamplesWithTheVersionItIsAskedFor) {
  auto cfg = tiny();
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok());
  Weights v1, v2;
  GenerateReq probe;
  probe.prompts = {"1+2="};
  probe.sampling.temperature = 0.0f;
  probe.sampling.max_new_tokens = 4;
  auto base = (*g)->generate(probe);
  ASSERT_TRUE(base.ok());
  // two newer versions (perturbed copies of the weights), held back
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok());
  v1 = (*l)->weights();
  v1.version = 1;
  for (auto& p : v1.params) p *= 1.5f;
  v2 = v1;
  v2.version = 2;
  for (auto& p : v2.params) p = -p;
  ASSERT_TRUE((*g)->hold_weights(v1).ok());
  ASSERT_TRUE((*g)->hold_weights(v2).ok());
  EXPECT_EQ((*g)->weights_ack().value, 2);  // acknowledged as received (decoded and checked) at once
  EXPECT_EQ((*g)->version(), 0);            // but it samples with version 0 until asked
  probe.policy_version = 0;  // what it holds now: the held ones wait
  auto at0 = (*g)->generate(probe);
  ASSERT_TRUE(at0.ok()) << at0.error().message;
  EXPECT_EQ(at0->policy_version, 0);
  EXPECT_EQ(at0->samples[0].logprobs, base->samples[0].logprobs);
  probe.policy_version = 1;
  auto at1 = (*g)->generate(probe);
  ASSERT_TRUE(at1.ok()) << at1.error().message;
  EXPECT_EQ(at1->policy_version, 1);
  EXPECT_EQ((*g)->version(), 1);
  GenerateReq take;  // no prompts: only take the weights
  take.policy_version = 2;
  auto took = (*g)->generate(take);
  ASSERT_TRUE(took.ok());
  EXPECT_TRUE(took->samples.empty());
  EXPECT_EQ((*g)->version(), 2);
  probe.policy_version = 1;  // gone: never samples with weights it cannot name
  auto old = (*g)->generate(probe);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.error().message.find("asked to sample with policy version 1 but it holds version 2"), std::string::npos)
      << old.error().message;
  probe.policy_version = 7;  // never received
  EXPECT_FALSE((*g)->generate(probe).ok());
  probe.policy_version = -1;  // the newest it has
  EXPECT_TRUE((*g)->generate(probe).ok());
}

// In-flight updates: a generation moves to newer versions before decode steps every, 2*every, ...,
// once the coordinator says which version each named step ended with (it waits until then); each
// sample records where each version's tokens start. The tokens before the first switch are those
// of a generation with the first version alone.
TEST(Roles, GeneratorMovesToNewerVersionsMidDecode) {
  auto cfg = tiny();
  cfg.rollout.async = true;
  cfg.rollout.in_flight_updates = true;
  cfg.rollout.max_staleness = 2;
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->in_flight());
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok());
  Weights v0 = (*l)->weights(), v1 = v0, v2 = v0;
  v1.version = 1;
  for (auto& p : v1.params) p *= 1.5f;
  v2.version = 2;
  for (auto& p : v2.params) p = -p;
  for (const Weights* w : {&v0, &v1, &v2}) ASSERT_TRUE((*g)->receive_weights(*w).ok());
  EXPECT_EQ((*g)->weights_ack().value, 2);  // decoded and checked at once (on the staging copy)
  GenerateReq req;
  req.prompts.assign(8, "1+2=");
  req.sampling.max_new_tokens = 6;
  req.sampling.seed = 5;
  req.policy_version = 0;
  auto plain = (*g)->generate(req);  // version 0 alone
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  req.in_flight_steps = {10, 11};  // before decode step 2: the version after GRPO step 10, step 4: after 11
  req.in_flight_every = 2;
  Result<GenerateRep> moved = Error{};
  std::thread t([&] { moved = (*g)->generate(req); });
  (*g)->step_done(StepVersion{10, 1, false});
  (*g)->step_done(StepVersion{11, 2, false});
  t.join();
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_EQ(moved->policy_version, 0);
  int switched = 0;
  for (size_t i = 0; i < moved->samples.size(); ++i) {
    const auto& x = moved->samples[i];
    const auto& y = plain->samples[i];
    std::vector<uint32_t> starts = {0};
    std::vector<int64_t> versions = {0};
    if (x.tokens.size() > 2) starts.push_back(2), versions.push_back(1);
    if (x.tokens.size() > 4) starts.push_back(4), versions.push_back(2);
    EXPECT_EQ(x.version_starts, starts) << i;
    EXPECT_EQ(x.versions, versions) << i;
    switched += versions.size() > 1;
    const size_t n = std::min<size_t>({2, x.tokens.size(), y.tokens.size()});
    for (size_t j = 0; j < n; ++j) {  // sampled by version 0 in both
      EXPECT_EQ(x.tokens[j], y.tokens[j]);
      EXPECT_EQ(x.logprobs[j], y.logprobs[j]);
    }
  }
  EXPECT_GT(switched, 0);
  // the next request starts with its own version again (kept: versions from the last request's on)
  req.in_flight_steps = {12};
  req.policy_version = 1;
  Result<GenerateRep> released = Error{};
  std::thread t2([&] { released = (*g)->generate(req); });
  (*g)->step_done(StepVersion{0, 0, true});  // no step 12 will come: it goes on with version 1
  t2.join();
  ASSERT_TRUE(released.ok()) << released.error().message;
  for (const auto& x : released->samples) EXPECT_EQ(x.versions, std::vector<int64_t>{1});
  req.in_flight_steps.clear();
  req.policy_version = 0;  // dropped once a request started with version 1
  auto gone = (*g)->generate(req);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("asked to sample with policy version 0 but it holds versions 1, 2"),
            std::string::npos)
      << gone.error().message;
}

TEST(Roles, LearnerTrainsOnAStreamedBatchAsOnTheWhole) {
  // GRPO parts (TrainReq.more) accumulate and make one update, equal to the whole batch's up to
  // rounding; the version moves once, at the last part; a part of another step is refused.
  auto cfg = tiny();
  cfg.optimizer.lr = 0.01f;
  std::vector<TrainSample> batch;
  for (int i = 0; i < 6; ++i) {
    TrainSample s;
    s.prompt = {1, 10 + i, 11};
    s.completion = {12 + i, 13, 2};
    s.old_logprobs = {-3.0f, -2.5f, -2.0f};
    s.advantage = (i % 2 == 0 ? 1.0f : -1.0f) * (0.5f + 0.1f * i);
    batch.push_back(s);
  }
  auto whole = LearnerRole::create(cfg, nullptr);
  auto parts = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(whole.ok() && parts.ok());
  TrainReq req;
  req.step = 0;
  req.samples = batch;
  auto ref = (*whole)->train(req);
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  for (auto [a, b, more] : {std::tuple{0, 2, true}, std::tuple{2, 5, true}, std::tuple{5, 6, false}}) {
    TrainReq part;
    part.step = 0;
    part.more = more;
    part.samples.assign(batch.begin() + a, batch.begin() + b);
    auto rep = (*parts)->train(part);
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    EXPECT_EQ(rep->policy_version, more ? 0 : 1);
    if (!more) {
      auto m = nlohmann::json::parse(rep->metrics_json), r = nlohmann::json::parse(ref->metrics_json);
      EXPECT_NEAR(m["loss"].get<double>(), r["loss"].get<double>(), 1e-6);
      EXPECT_EQ(m["train_tokens"], r["train_tokens"]);
    }
  }
  auto w1 = (*whole)->weights(), w2 = (*parts)->weights();
  ASSERT_EQ(w1.params.size(), w2.params.size());
  double worst = 0, moved = 0;
  auto init = LearnerRole::create(cfg, nullptr);
  auto w0 = (*init)->weights();
  for (size_t i = 0; i < w1.params.size(); ++i) {
    worst = std::max(worst, double(std::abs(w1.params[i] - w2.params[i])));
    moved = std::max(moved, double(std::abs(w1.params[i] - w0.params[i])));
  }
  EXPECT_GT(moved, 1e-3);
  // AdamW's first step is about lr * sign(g): rounding in near-zero gradient coordinates shows up
  // magnified; a wrong normaliser or a lost part would move parameters by ~lr (1e-2)
  EXPECT_LT(worst, 2e-5);
  TrainReq p0;
  p0.step = 1;
  p0.more = true;
  p0.samples.assign(batch.begin(), batch.begin() + 2);
  ASSERT_TRUE((*parts)->train(p0).ok());
  TrainReq other = p0;
  other.step = 2;
  auto bad = (*parts)->train(other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("a part of GRPO step 2 arrived while step 1 is being accumulated"),
            std::string::npos)
      << bad.error().message;
}

TEST(Roles, EnvWorkerVerifiesAGroup) {
  auto cfg = tiny();
  auto specs = env_specs(cfg, ".");
  ASSERT_TRUE(specs.ok()) << specs.error().message;
  auto w = EnvWorker::create(*specs);
  ASSERT_TRUE(w.ok()) << w.error().message;
  auto obs = (*w)->reset({"arithmetic", "e1", 3, 0});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  auto meta = nlohmann::json::parse(obs->metadata_json);
  std::string answer = meta["answer"].get<std::string>();
  EnvVerifyReq v{"arithmetic", obs->metadata_json, {answer, answer + "9", ""}};
  auto rep = (*w)->verify(v);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  ASSERT_EQ(rep->rewards.size(), 3u);
  EXPECT_EQ(rep->rewards[0], 1.0);
  EXPECT_EQ(rep->correct[0], 1.0);
  EXPECT_EQ(rep->rewards[1], 0.0);
  auto missing = (*w)->reset({"nope", "e2", 1, 0});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nope"), std::string::npos);
}

// The learner's sections are the experiment's as they are; only the per-phase values are derived.
TEST(Roles, LearnerConfigOfAPhase) {
  ExperimentConfig c;
  c.loss.agg_mode = learner::LossAggMode::seq_mean_token_sum_norm;
  c.loss.kl_type = learner::KlEstimator::k1;
  c.loss.clip_high = 0.28f;
  c.grpo.scale_rewards = learner::StdMode::none;
  c.grpo.num_iterations = 2;
  c.grpo.max_steps = 5;
  c.sft.lr = 0.01f;
  c.sft.max_steps = 3;
  c.optimizer.lr = 0.001f;
  c.optimizer.schedule = learner::LrSchedule::cosine;
  c.rollout.max_response_length = 12;
  c.rollout.max_turns = 2;
  c.rollout.temperature = 0.7f;
  c.rollout.importance_weight_cap = 3;
  auto g = learner_config(c, learner::Phase::grpo);
  EXPECT_EQ(g.loss.agg_mode, learner::LossAggMode::seq_mean_token_sum_norm);
  EXPECT_EQ(g.loss.kl_type, learner::KlEstimator::k1);
  EXPECT_EQ(g.loss.clip_high, 0.28f);
  EXPECT_EQ(g.loss.agg_norm_length, 0);  // the trainer uses max_completion_length
  EXPECT_EQ(g.max_completion_length, 24);
  EXPECT_EQ(g.advantage.scale_rewards, learner::StdMode::none);
  EXPECT_FLOAT_EQ(g.optimizer.lr, 0.001f);
  EXPECT_EQ(g.optimizer.total_steps, 10);
  EXPECT_EQ(g.batch.num_iterations, 2);
  EXPECT_FLOAT_EQ(g.batch.temperature, 0.7f);
  EXPECT_FLOAT_EQ(g.importance_weight_cap, 3.0f);
  auto s = learner_config(c, learner::Phase::sft);
  EXPECT_FLOAT_EQ(s.optimizer.lr, 0.01f);
  EXPECT_EQ(s.optimizer.total_steps, 3);
  EXPECT_EQ(s.batch.num_iterations, 1);
  EXPECT_FLOAT_EQ(s.batch.temperature, 1.0f);
}

// Compute threads per role: the role's own key, else cluster.threads, else the rank's default.
TEST(Roles, RoleThreads) {
  ClusterSection c;
  EXPECT_EQ(role_threads(c, "generator", 2), 2);
  c.threads = 3;
  EXPECT_EQ(role_threads(c, "learner0", 2), 3);
  c.generator_threads = 1;
  EXPECT_EQ(role_threads(c, "generator1", 2), 1);
  EXPECT_EQ(role_threads(c, "learner", 2), 3);
  c.learner_threads = 4;
  EXPECT_EQ(role_threads(c, "learner", 2), 4);
  EXPECT_EQ(role_threads(c, "env_worker", 2), 3);
}

// nice 19: the actor samples on its own thread at that priority and answers exactly what the
// generator answers when called directly.
TEST(Roles, GeneratorActorOnALowPriorityThread) {
  auto cfg = tiny();
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::shared_ptr<Generator> gen = std::move(g).value();
  GenerateReq req;
  req.prompts = {"1+2=", "3+4="};
  req.sampling.temperature = 1.0f;
  req.sampling.max_new_tokens = 4;
  req.sampling.seed = 9;
  auto direct = gen->generate(req);
  ASSERT_TRUE(direct.ok());
  runtime::SystemConfig sc;
  sc.threads = 1;
  auto sys = runtime::ActorSystem::create(sc);
  ASSERT_TRUE(sys.ok()) << sys.error().message;
  auto id = (*sys)->spawn(
      [gen]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<GeneratorActor>(gen, 1, 19); });
  ASSERT_TRUE(id.ok());
  auto rep = (*sys)->ask<GenerateRep>(*id, req, std::chrono::seconds(30)).get();
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  ASSERT_EQ(rep->samples.size(), direct->samples.size());
  for (size_t i = 0; i < rep->samples.size(); ++i) {
    EXPECT_EQ(rep->samples[i].tokens, direct->samples[i].tokens);
    EXPECT_EQ(rep->samples[i].logprobs, direct->samples[i].logprobs);
  }
  // some thread of this process now runs at nice 19 (field 19 of /proc/self/task/*/stat)
  bool found = false;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    for (int f = 3; f <= 19 && (rest >> field); ++f)
      if (f == 19 && field == "19") found = true;
  }
  EXPECT_TRUE(found) << "no thread at nice 19";
  (*sys)->shutdown();
}

// Multi-turn token in, token out: each turn's prompt is the previous context + the tokens sampled in
// that turn (EOS of a continued turn dropped) + the tokenized feedback; the training sample equals
// the last context + the last turn's tokens, its masked positions are exactly the sampled tokens with
// their log-probs, even where decoding and re-encoding the text would not give the sampled ids back.
TEST(Roles, MultiTurnTrainingTokensAreTheSampledOnes) {
  auto tok = make_builtin_tokenizer("byte");
  ASSERT_TRUE(tok.ok());
  const auto& t = **tok;
  const int32_t pad = t.pad_id(), eos = t.eos_id();
  coord::Episode e;
  GenSample s0;
  s0.prompt_tokens = *t.encode("<bos>guess:");
  s0.tokens = {*t.encode("5")->begin(), pad, eos};  // <pad> vanishes from the decoded text
  s0.logprobs = {-0.5f, -1.5f, -0.25f};
  s0.text = *t.decode(s0.tokens, true);
  EnvObs fb;
  fb.text = "higher";
  ASSERT_TRUE(coord::add_turn(e, s0, Result<EnvObs>(fb), 0, 3, t).ok());
  std::vector<int32_t> ctx = s0.prompt_tokens;
  ctx.insert(ctx.end(), {s0.tokens[0], pad});
  auto f = t.encode("\nhigher\n");
  ctx.insert(ctx.end(), f->begin(), f->end());
  EXPECT_EQ(e.context, ctx);
  EXPECT_NE(*t.encode(s0.text), std::vector<int32_t>(s0.tokens.begin(), s0.tokens.end() - 1));  // re-tokenizing loses <pad>
  GenSample s1;
  s1.prompt_tokens = e.context;
  s1.tokens = {*t.encode("7")->begin(), eos};
  s1.logprobs = {-0.125f, -0.0625f};
  s1.text = "7";
  EnvObs done;
  done.done = true;
  done.reward = 1;
  ASSERT_TRUE(coord::add_turn(e, s1, Result<EnvObs>(done), 1, 3, t).ok());
  EXPECT_TRUE(e.exact);
  std::vector<int32_t> whole = e.merged.prompt_tokens;
  whole.insert(whole.end(), e.merged.tokens.begin(), e.merged.tokens.end());
  std::vector<int32_t> want = s1.prompt_tokens;
  want.insert(want.end(), s1.tokens.begin(), s1.tokens.end());
  EXPECT_EQ(whole, want);
  std::vector<int32_t> sampled;
  std::vector<float> lps;
  for (size_t k = 0; k < e.merged.tokens.size(); ++k)
    if (e.merged.mask[k] == 1.0f) sampled.push_back(e.merged.tokens[k]), lps.push_back(e.merged.logprobs[k]);
  EXPECT_EQ(sampled, (std::vector<int32_t>{s0.tokens[0], pad, s1.tokens[0], eos}));
  EXPECT_EQ(lps, (std::vector<float>{-0.5f, -1.5f, -0.125f, -0.0625f}));
  EXPECT_EQ(e.merged.tokens.size() - sampled.size(), f->size());  // the feedback, mask 0
  // turn entries: turn 1 starts after turn 0's sampled tokens and the feedback
  EXPECT_EQ(e.merged.turn_starts, (std::vector<uint32_t>{0, static_cast<uint32_t>(2 + f->size())}));
  EXPECT_EQ(e.merged.turn_texts, (std::vector<std::string>{s0.text, "7"}));
  // A context cut by max_prompt_length: the turn is not trained on.
  coord::Episode c = e;
  c.done = false;
  GenSample cut = s1;
  cut.prompt_tokens.erase(cut.prompt_tokens.begin());
  ASSERT_TRUE(coord::add_turn(c, cut, Result<EnvObs>(done), 2, 3, t).ok());
  EXPECT_FALSE(c.exact);
  EXPECT_EQ(c.merged.tokens.size(), e.merged.tokens.size());
}

// rollout.serve: the generator's serving engine samples with the generator's weights, follows every
// weight sync, and tags each request with the version that sampled it.
TEST(Roles, RolloutServeEngineFollowsTheWeights) {
  auto cfg = tiny();
  cfg.optimizer.lr = 0.01f;
  cfg.rollout.serve = "127.0.0.1:0";
  cfg.rollout.serve_slots = 4;
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_TRUE((*g)->serve_engine());
  auto greedy = [&](const std::vector<int32_t>& prompt, int64_t* version) {
    ServeRequest q;
    q.prompt = prompt;
    q.sampling.temperature = 0;
    q.max_tokens = 4;
    auto s = (*g)->serve_engine()->submit(q);
    std::vector<int32_t> out;
    policy::SlotToken t;
    while (s->next(&t)) out.push_back(t.token);
    *version = s->policy_version();
    return out;
  };
  auto generated = [&](const std::vector<int32_t>& prompt) {
    GenerateReq r;
    r.prompt_tokens = {prompt};
    r.sampling = {0.0f, 0, 1.0f, 4, 0, {}};
    auto rep = (*g)->generate(r);
    EXPECT_TRUE(rep.ok());
    return rep.ok() ? rep->samples[0].tokens : std::vector<int32_t>{};
  };
  const std::vector<int32_t> prompt = {1, 10, 11, 12};
  int64_t v = -1;
  auto before = greedy(prompt, &v);
  EXPECT_EQ(v, 0);
  auto gen_before = generated(prompt);
  EXPECT_EQ(std::vector<int32_t>(gen_before.begin(), gen_before.begin() + std::min(gen_before.size(), before.size())),
            std::vector<int32_t>(before.begin(), before.begin() + std::min(gen_before.size(), before.size())));
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok()) << l.error().message;
  TrainReq req = test_support::tiny_sft_batch();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*l)->train(req).ok());
  ASSERT_TRUE((*g)->set_weights((*l)->weights()).ok());
  EXPECT_EQ((*g)->serve_engine()->version(), 3);
  auto after = greedy(prompt, &v);
  EXPECT_EQ(v, 3);
  auto gen_after = generated(prompt);  // both copies have the new weights
  EXPECT_EQ(std::vector<int32_t>(gen_after.begin(), gen_after.begin() + std::min(gen_after.size(), after.size())),
            std::vector<int32_t>(after.begin(), after.begin() + std::min(gen_after.size(), after.size())));
  // what the endpoint serves for an episode is kept until the coordinator takes it
  ServedTurnLog& log = (*g)->served_turns();
  log.record("e1", ServedTurn{prompt, after, {}, 3, "length", ""});
  EXPECT_EQ(log.episodes(), 1u);
  EXPECT_EQ(log.take("e1").size(), 1u);
  EXPECT_TRUE(log.take("e1").empty());
}

// An episode's served turns become training samples token for token: a turn whose prompt extends
// the context continues the sample (the env's tokens between masked out), any other starts one.
TEST(Roles, ServedTurnsBecomeTrainingSamples) {
  ServedTurn a{{1, 5, 6}, {7, 8, 2}, {-0.5f, -0.25f, -0.125f}, 4, "stop", "x"};
  ServedTurn b{{1, 5, 6, 7, 8, 2, 9, 9}, {10, 2}, {-1.0f, -2.0f}, 4, "stop", "y"};  // extends a
  ServedTurn c{{1, 5, 6, 3}, {11}, {-3.0f}, 3, "length", "z"};                       // does not
  int64_t version = -1;
  auto xs = coord::samples_of_turns({a, b, c}, &version);
  EXPECT_EQ(version, 3);
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_EQ(xs[0].prompt_tokens, a.prompt_tokens);
  EXPECT_EQ(xs[0].tokens, (std::vector<int32_t>{7, 8, 2, 9, 9, 10, 2}));
  EXPECT_EQ(xs[0].logprobs, (std::vector<float>{-0.5f, -0.25f, -0.125f, 0.0f, 0.0f, -1.0f, -2.0f}));
  EXPECT_EQ(xs[0].mask, (std::vector<float>{1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(xs[0].turn_starts, (std::vector<uint32_t>{0, 5}));
  EXPECT_FALSE(xs[0].truncated);
  EXPECT_EQ(xs[1].prompt_tokens, c.prompt_tokens);
  EXPECT_EQ(xs[1].tokens, c.tokens);
  EXPECT_TRUE(xs[1].mask.empty());
  EXPECT_TRUE(xs[1].truncated);
}
