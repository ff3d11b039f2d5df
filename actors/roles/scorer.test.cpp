// actors.scorer: the frozen-model scorer. Versioning (the hash of the model's files), log-probs
// and top-k against the model's own forward, batch invariance (a sequence's numbers alone = in a
// batch), models of each family and dtype (quantized .gguf, bf16), generation, the reward-model seam refused by
// name, bad requests, the coordinator's teacher requests (the check at start, a silent or stopped
// scorer retried on the next one, counted, the error past the retries), and the actor:
// continuous batching of concurrent requests, a failed or silent scorer retried on the next one
// (counted) under a deadline, and the error naming every scorer tried.
#include "troupe/actors/scorer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <future>
#include <thread>
#include <unistd.h>

#include "coordinator/coordinator_internal.h"
#include "tiny_config.test.h"
#include "troupe/actors/roles.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

// A tiny dense (llama) model directory with the built-in char tokenizer (seeded).
std::string save_tiny_model(const fs::path& dir, int seed, int positions = 0) {
  ExperimentConfig c = test_support::tiny_config();
  c.run.seed = seed;
  if (positions > 0) c.policy.model.max_position_embeddings = positions;
  c.policy.model.family = policy::ModelFamily::llama;  // dense
  c.policy.model.num_experts = 0;
  auto b = make_policy(c);
  EXPECT_TRUE(b.ok()) << b.error().message;
  const auto& tok = *b->tokenizer;
  auto st = policy::io::save_model(dir.string(), *b->model, &tok, policy::io::ExpertLayout::per_expert, tok.bos_id(),
                                   tok.eos_id(), tok.pad_id());
  EXPECT_TRUE(st.ok()) << st.error().message;
  return dir.string();
}

class ScorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("troupe-scorer-test-" + std::to_string(::getpid()));
    fs::create_directories(root_);
    path_ = save_tiny_model(root_ / "teacher", 5);
  }
  void TearDown() override { fs::remove_all(root_); }
  ScoreReq logprobs_req(std::vector<std::vector<int32_t>> seqs, int topk = 0) const {
    ScoreReq r;
    r.kind = static_cast<int32_t>(ScoreKind::logprobs);
    r.model = path_;
    r.topk = topk;
    for (auto& q : seqs) {
      r.starts.push_back(2);
      r.sequences.push_back(std::move(q));
    }
    return r;
  }
  fs::path root_;
  std::string path_;
};

TEST_F(ScorerTest, VersionIsTheHashOfTheModelFiles) {
  auto a = model_files_hash(path_);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->rfind("xxh3:", 0), 0u);
  fs::copy(path_, root_ / "copy", fs::copy_options::recursive);
  EXPECT_EQ(*model_files_hash((root_ / "copy").string()), *a);  // the same files, elsewhere
  std::ofstream(root_ / "copy" / "config.json", std::ios::app) << " ";
  EXPECT_NE(*model_files_hash((root_ / "copy").string()), *a);  // one byte more
  EXPECT_FALSE(model_files_hash((root_ / "nowhere").string()).ok());
  auto s = Scorer::create({path_}, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto rep = (*s)->run(logprobs_req({{1, 10, 11, 12}}));
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_EQ(rep->model_hash, *a);
  EXPECT_EQ(rep->tokenizer_hash.rfind("xxh3:", 0), 0u);
}

TEST_F(ScorerTest, LogprobsAreBatchInvariantAndMatchTheModel) {
  auto s = Scorer::create({path_}, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  const std::vector<int32_t> q = {1, 20, 21, 22, 23, 2};
  auto alone = (*s)->run(logprobs_req({q}));
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  ASSERT_EQ(alone->logprobs.size(), 1u);
  ASSERT_EQ(alone->logprobs[0].size(), q.size() - 2);  // positions 2..5
  // the same sequence among others, in one request and across requests of one batch
  auto other = logprobs_req({{1, 30, 31}, q, {1, 40, 41, 42, 43, 44, 45, 46}});
  auto third = logprobs_req({{1, 50, 51, 52}});
  auto batch = (*s)->run_batch({&other, &third});
  ASSERT_TRUE(batch[0].ok() && batch[1].ok());
  EXPECT_EQ(batch[0]->logprobs[1], alone->logprobs[0]);  // bit for bit
  // the model's own scoring (batch-invariant too) of the whole sequence
  ExperimentConfig c;
  policy::ExecutionOptions exec;
  exec.batch_invariant = true;
  auto m = policy::io::load_model(path_, exec);
  ASSERT_TRUE(m.ok());
  auto ref = policy::io::score_tokens(m->model, q);
  ASSERT_TRUE(ref.ok());
  for (size_t t = 0; t < alone->logprobs[0].size(); ++t) EXPECT_NEAR(alone->logprobs[0][t], (*ref)[t + 1], 1e-5);
  // top-k: the most likely first, the target's log-prob as without top-k
  auto topk = (*s)->run(logprobs_req({q}, 3));
  ASSERT_TRUE(topk.ok()) << topk.error().message;
  ASSERT_EQ(topk->topk_ids[0].size(), 3 * (q.size() - 2));
  for (size_t t = 0; t < q.size() - 2; ++t) {
    EXPECT_NEAR(topk->logprobs[0][t], alone->logprobs[0][t], 1e-5);
    EXPECT_GE(topk->topk_logprobs[0][3 * t], topk->topk_logprobs[0][3 * t + 1]);
    EXPECT_GE(topk->topk_logprobs[0][3 * t + 1], topk->topk_logprobs[0][3 * t + 2]);
    EXPECT_GE(topk->topk_logprobs[0][3 * t] + 1e-6, topk->logprobs[0][t]);
  }
}

// Log-prob requests run each sequence in a forward of its own with the default (blocked) kernels:
// a long sequence (several GEMM row blocks) gives the same bits alone, among long and short others
// of the same and other requests (top-k ones too), at another OpenMP thread count, and as the model's
// own default-kernel forward of that sequence alone; a generation in between (the batch-invariant
// decode steps) changes nothing, and neither do log-probs in between for the generation.
TEST_F(ScorerTest, LogprobsOfASequenceDependOnItAloneWithTheDefaultKernels) {
  path_ = save_tiny_model(root_ / "long", 5, 1024);
  auto s = Scorer::create({path_}, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto seq = [](int n, int salt) {
    std::vector<int32_t> q = {1};
    for (int i = 1; i < n; ++i) q.push_back(3 + (i * 37 + salt * 11) % 90);
    return q;
  };
  const std::vector<int32_t> q = seq(200, 0);
  auto alone = (*s)->run(logprobs_req({q}));
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  auto mixed = logprobs_req({seq(130, 1), seq(9, 2), q, seq(257, 3)});
  auto other = logprobs_req({seq(70, 4)});
  auto topk = logprobs_req({seq(90, 5), q}, 4);
  auto batch = (*s)->run_batch({&other, &mixed, &topk});
  ASSERT_TRUE(batch[0].ok() && batch[1].ok() && batch[2].ok());
  EXPECT_EQ(batch[1]->logprobs[2], alone->logprobs[0]);
  // the model's own forward of q alone, default kernels (not batch-invariant)
  policy::ExecutionOptions exec;
  exec.activation_checkpointing = true;
  auto m = policy::io::load_model(path_, exec);
  ASSERT_TRUE(m.ok()) << m.error().message;
  policy::PackedBatch b;
  b.tokens.assign(q.begin(), q.end() - 1);
  b.targets.assign(q.begin() + 1, q.end());
  b.cu_seqlens = {0, static_cast<int32_t>(b.tokens.size())};
  std::vector<float> lp(b.tokens.size());
  ASSERT_TRUE(m->model.forward_train(b, 1.0f, lp.data(), nullptr).ok());
  EXPECT_EQ(std::vector<float>(lp.begin() + 1, lp.end()), alone->logprobs[0]);  // starts at 2
  // another thread count
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads == 1 ? 2 : 1);
  auto fewer = (*s)->run(logprobs_req({q}));
  omp_set_num_threads(threads);
  ASSERT_TRUE(fewer.ok()) << fewer.error().message;
  EXPECT_EQ(fewer->logprobs[0], alone->logprobs[0]);
  // a generation (batch-invariant decode on the model's engine) before and after: log-probs then
  // run on the engine's thread between decode steps, and the generation is as before
  ScoreReq g;
  g.kind = static_cast<int32_t>(ScoreKind::generate);
  g.model = path_;
  g.prompts = {"12+34="};
  g.max_new_tokens = 30;
  auto g1 = (*s)->run(g);
  ASSERT_TRUE(g1.ok()) << g1.error().message;
  auto again = (*s)->run_batch({&mixed, &g});
  ASSERT_TRUE(again[0].ok() && again[1].ok());
  EXPECT_EQ(again[0]->logprobs, batch[1]->logprobs);
  EXPECT_EQ(again[1]->texts, g1->texts);
}

TEST_F(ScorerTest, GeneratesAndRefusesWhatItCannotServe) {
  auto s = Scorer::create({path_}, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  ScoreReq g;
  g.kind = static_cast<int32_t>(ScoreKind::generate);
  g.model = path_;
  g.prompts = {"1+2=", "3+4="};
  g.max_new_tokens = 5;
  auto a = (*s)->run(g);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_EQ(a->texts.size(), 2u);
  auto b = (*s)->run(g);  // greedy: the same again
  EXPECT_EQ(a->texts, b->texts);
  // the reward-model seam: no score head yet, said by name
  ScoreReq rm = logprobs_req({{1, 2, 3}});
  rm.kind = static_cast<int32_t>(ScoreKind::sequence_score);
  auto r = (*s)->run(rm);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sequence_score"), std::string::npos) << r.error().message;
  // unknown model, bad token, bad start: each alone fails, the others in its batch do not
  ScoreReq unknown = logprobs_req({{1, 2, 3}});
  unknown.model = "/no/such/model";
  ScoreReq bad_token = logprobs_req({{1, 2, 100000}});
  ScoreReq bad_start = logprobs_req({{1, 2}});
  bad_start.starts = {5};
  ScoreReq good = logprobs_req({{1, 2, 3}});
  auto out = (*s)->run_batch({&unknown, &bad_token, &good, &bad_start});
  ASSERT_FALSE(out[0].ok());
  EXPECT_NE(out[0].error().message.find("this scorer serves: " + path_), std::string::npos) << out[0].error().message;
  ASSERT_FALSE(out[1].ok());
  EXPECT_NE(out[1].error().message.find("outside the vocabulary"), std::string::npos) << out[1].error().message;
  EXPECT_TRUE(out[2].ok());
  ASSERT_FALSE(out[3].ok());
  EXPECT_NE(out[3].error().message.find("cannot start scoring at 5"), std::string::npos) << out[3].error().message;
  EXPECT_FALSE(Scorer::create({(root_ / "nowhere").string()}, {}).ok());
}

// Any family and dtype policy.path loads, a quantized base included: .gguf teachers whose weights are
// Q8_0/Q4_0/Q4_1 blocks (a llama and a qwen3), a bf16 safetensors llama, a Mixtral (MoE) and a qwen2
// are served as the model's own default-kernel forward gives them, bit for bit, alone or batched with
// the other models' requests; each is versioned by the hash of its files, and generates.
TEST_F(ScorerTest, ServesModelsOfEachFamilyAndDtype) {
  const std::string dir = TROUPE_TEST_FIXTURES_DIR;
  const std::vector<std::string> paths = {dir + "/gguf/tiny_llama.gguf", dir + "/gguf/tiny_qwen3.gguf",
                                          dir + "/hf_fixture/llama_bf16", dir + "/hf_fixture/mixtral",
                                          dir + "/hf_fixture/qwen2"};
  auto s = Scorer::create(paths, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  const std::vector<int32_t> q = {1, 20, 21, 22, 23, 24, 25};
  std::vector<ScoreReq> reqs;
  for (const auto& path : paths) {
    path_ = path;
    reqs.push_back(logprobs_req({{1, 30, 31, 32}, q}));
  }
  std::vector<const ScoreReq*> all;
  for (const auto& r : reqs) all.push_back(&r);
  auto batch = (*s)->run_batch(all);
  for (size_t i = 0; i < paths.size(); ++i) {
    ASSERT_TRUE(batch[i].ok()) << paths[i] << ": " << batch[i].error().message;
    EXPECT_EQ(batch[i]->model_hash, *model_files_hash(paths[i]));
    path_ = paths[i];
    auto alone = (*s)->run(logprobs_req({q}));
    ASSERT_TRUE(alone.ok()) << alone.error().message;
    EXPECT_EQ(batch[i]->logprobs[1], alone->logprobs[0]) << paths[i];
    policy::ExecutionOptions exec;
    exec.activation_checkpointing = true;
    auto m = policy::io::load_model(paths[i], exec);
    ASSERT_TRUE(m.ok()) << m.error().message;
    policy::PackedBatch b;
    b.tokens.assign(q.begin(), q.end() - 1);
    b.targets.assign(q.begin() + 1, q.end());
    b.cu_seqlens = {0, static_cast<int32_t>(b.tokens.size())};
    std::vector<float> lp(b.tokens.size());
    ASSERT_TRUE(m->model.forward_train(b, 1.0f, lp.data(), nullptr).ok());
    EXPECT_EQ(std::vector<float>(lp.begin() + 1, lp.end()), alone->logprobs[0]) << paths[i];
    ScoreReq g;
    g.kind = static_cast<int32_t>(ScoreKind::generate);
    g.model = paths[i];
    g.prompts = {"hi"};
    g.max_new_tokens = 4;
    auto text = (*s)->run(g);
    ASSERT_TRUE(text.ok()) << paths[i] << ": " << text.error().message;
    EXPECT_EQ(text->texts.size(), 1u);
  }
}

// Continuous batching per decode step: a generate request submitted while another generates joins
// the running batch at the engine's next step (both share steps: peak batch 2 while the first still
// runs), and each text equals that of the request run alone and of the batch-invariant model's own
// generate() (seed, stream = the prompt's index).
TEST_F(ScorerTest, GenerateRequestsJoinARunningGenerationPerDecodeStep) {
  path_ = save_tiny_model(root_ / "long", 5, 1024);  // room for a long first generation
  auto s = Scorer::create({path_}, {});
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto gen_req = [&](std::vector<std::string> prompts, float temperature, uint64_t seed, int n) {
    ScoreReq g;
    g.kind = static_cast<int32_t>(ScoreKind::generate);
    g.model = path_;
    g.prompts = std::move(prompts);
    g.max_new_tokens = n;
    g.temperature = temperature;
    g.seed = seed;
    return g;
  };
  const ScoreReq a = gen_req({"12+34=", "5*6="}, 0.0f, 7, 600), b = gen_req({"9-3="}, 0.0f, 0, 40);
  // alone first (this makes the model's engine)
  auto alone_a = (*s)->run(a), alone_b = (*s)->run(b);
  ASSERT_TRUE(alone_a.ok() && alone_b.ok()) << (alone_a.ok() ? alone_b.error().message : alone_a.error().message);
  ServeEngine* engine = (*s)->find(path_)->engine.get();
  ASSERT_NE(engine, nullptr);
  const int peak_alone = engine->peak_batch();
  // A runs; between two of its decode steps (a task on the engine's thread, once A has stepped) B is
  // submitted, and joins at the next step
  std::promise<Result<ScoreRep>> pa, pb;
  const uint64_t steps0 = engine->steps();
  auto sa = (*s)->submit_generate(a, [&](Result<ScoreRep> r) { pa.set_value(std::move(r)); });
  ASSERT_EQ(sa.size(), 2u);
  std::atomic<bool> joined = false, a_running = true;
  uint64_t steps_at_b = 0;
  // a task between every two decode steps until A has stepped; it then submits B
  std::thread checker([&] {
    while (!joined && a_running) {
      Status st = engine->run_with_model([&](policy::Model&) -> Status {
        a_running = sa[0]->finish() == ServeFinish::running && sa[1]->finish() == ServeFinish::running;
        if (!a_running || engine->steps() <= steps0) return {};  // A has not stepped yet: look again
        steps_at_b = engine->steps();
        (*s)->submit_generate(b, [&](Result<ScoreRep> r) { pb.set_value(std::move(r)); });
        joined = true;
        return {};
      });
      EXPECT_TRUE(st.ok()) << st.error().message;
    }
  });
  checker.join();
  ASSERT_TRUE(joined) << "the first request ended before the second came";
  auto ra = pa.get_future().get(), rb = pb.get_future().get();
  ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message : ra.error().message);
  EXPECT_EQ(peak_alone, 2);
  EXPECT_EQ(engine->peak_batch(), 3) << "the second request never shared a decode step with the first";
  EXPECT_GT(engine->steps(), steps_at_b);
  // the same texts as alone, bit for bit
  EXPECT_EQ(ra->texts, alone_a->texts);
  EXPECT_EQ(rb->texts, alone_b->texts);
  // the batch-invariant model's own generate(), one request at a time
  policy::ExecutionOptions exec;
  exec.batch_invariant = true;
  auto m = policy::io::load_model(path_, exec);
  ASSERT_TRUE(m.ok()) << m.error().message;
  for (const ScoreReq* r : {&a, &b}) {
    policy::SamplingParams sp;
    sp.temperature = r->temperature;
    sp.seed = r->seed;
    sp.max_new_tokens = r->max_new_tokens;
    sp.stop_tokens = {m->tokenizer->eos_id()};
    std::vector<std::vector<int32_t>> prompts;
    for (size_t p = 0; p < r->prompts.size(); ++p) {
      auto ids = m->tokenizer->encode(r->prompts[p]);
      ASSERT_TRUE(ids.ok());
      prompts.push_back({m->tokenizer->bos_id()});
      prompts.back().insert(prompts.back().end(), ids->begin(), ids->end());
      sp.streams.push_back(static_cast<int32_t>(p));
    }
    auto g = m->model.generate(prompts, sp);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const auto& texts = r == &a ? ra->texts : rb->texts;
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto toks = (*g)[p].tokens;
      if (!toks.empty() && toks.back() == m->tokenizer->eos_id()) toks.pop_back();
      EXPECT_EQ(*m->tokenizer->decode(toks, true), texts[p]) << "prompt " << p;
    }
  }
  // log-probs of the same model now run on the engine's thread, between decode steps
  auto lp = (*s)->run(logprobs_req({{1, 20, 21, 22}}));
  ASSERT_TRUE(lp.ok()) << lp.error().message;
  EXPECT_EQ(lp->logprobs[0].size(), 2u);
}

// distill.teacher_dtype: bf16: the log-prob forwards run bf16 GEMMs (AVX512-BF16), within the stated
// tolerance of the fp32 teacher's, the same bits every run, on any thread count and whatever shares
// the batch; top-k too; generations (decode steps, batch-invariant) stay fp32 and unchanged.
TEST_F(ScorerTest, Bf16LogprobsAreDeterministicAndCloseToFp32) {
  if (!kernels::cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  path_ = save_tiny_model(root_ / "bf16", 5, 1024);
  auto f = Scorer::create({path_}, {});
  auto b = Scorer::create({path_}, {}, learner::TeacherDtype::bf16);
  ASSERT_TRUE(f.ok() && b.ok());
  EXPECT_FALSE((*f)->bf16_logprobs(path_));
  EXPECT_TRUE((*b)->bf16_logprobs(path_));
  std::vector<int32_t> q = {1};
  for (int i = 1; i < 200; ++i) q.push_back(3 + (i * 37) % 90);
  auto fp32 = (*f)->run(logprobs_req({q}, 4));
  auto bf16 = (*b)->run(logprobs_req({q}, 4));
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  double worst = 0, sum = 0;
  for (size_t t = 0; t < q.size() - 2; ++t) {
    const double d = std::fabs(double(fp32->logprobs[0][t]) - double(bf16->logprobs[0][t]));
    worst = std::max(worst, d);
    sum += d;
  }
  EXPECT_GT(worst, 0) << "the bf16 GEMMs did not run";
  EXPECT_LT(worst, 0.1);  // the tolerance (docs: distill.teacher_dtype)
  EXPECT_LT(sum / double(q.size() - 2), 0.02);
  auto again = (*b)->run(logprobs_req({q}, 4));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->logprobs, bf16->logprobs);
  EXPECT_EQ(again->topk_ids, bf16->topk_ids);
  EXPECT_EQ(again->topk_logprobs, bf16->topk_logprobs);
  // without top-k (the training head's path): alone, batched with others and on another thread count
  auto alone = (*b)->run(logprobs_req({q}));
  ASSERT_TRUE(alone.ok());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads == 1 ? 2 : 1);
  auto mixed = logprobs_req({{1, 5, 6, 7, 8}, q});
  auto other = logprobs_req({{1, 9, 9}});
  auto batch = (*b)->run_batch({&other, &mixed});
  omp_set_num_threads(threads);
  ASSERT_TRUE(batch[1].ok());
  EXPECT_EQ(batch[1]->logprobs[1], alone->logprobs[0]);
  // generations are fp32 decode steps either way
  ScoreReq g;
  g.kind = static_cast<int32_t>(ScoreKind::generate);
  g.model = path_;
  g.prompts = {"ab"};
  g.max_new_tokens = 6;
  auto gf = (*f)->run(g);
  auto gb = (*b)->run(g);
  ASSERT_TRUE(gf.ok() && gb.ok());
  EXPECT_EQ(gf->texts, gb->texts);
}

// An actor that takes ScoreReq and never answers (a hung scorer).
class MuteScorer : public runtime::Actor {
 public:
  MuteScorer() {
    handle<ScoreReq>([](runtime::Context&, const ScoreReq&) -> Status { return {}; });
  }
};

TEST_F(ScorerTest, ActorBatchesConcurrentRequestsAndClientRetriesElsewhere) {
  auto made = Scorer::create({path_}, {});
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::shared_ptr<Scorer> scorer = std::move(made).value();
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys = runtime::ActorSystem::create(sc);
  ASSERT_TRUE(sys.ok()) << sys.error().message;
  auto good = (*sys)->spawn([scorer]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ScorerActor>(scorer, 1); });
  auto mute = (*sys)->spawn([]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<MuteScorer>(); });
  auto gone = (*sys)->spawn([scorer]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ScorerActor>(scorer, 1); });
  ASSERT_TRUE(good.ok() && mute.ok() && gone.ok());
  // continuous batching: requests sent together are answered, several in one batch, each as alone
  std::vector<int32_t> q(40, 7);
  q[0] = 1;
  auto alone = scorer->run(logprobs_req({q}));
  ASSERT_TRUE(alone.ok());
  std::vector<std::future<Result<ScoreRep>>> futs;
  for (int i = 0; i < 12; ++i) futs.push_back((*sys)->ask<ScoreRep>(*good, logprobs_req({q}), std::chrono::seconds(30)));
  int most = 0;
  for (auto& f : futs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->logprobs[0], alone->logprobs[0]);
    most = std::max(most, r->batch_requests);
  }
  EXPECT_GT(most, 1) << "no two requests shared a batch";
  // a silent scorer: its try runs into the deadline, the next scorer answers; counted, also in
  // this thread's CountScorerCalls (how an env worker's verify sees its judge's and reward model's)
  ScorerClient client(**sys, {*mute, *good}, 0.3, 2);
  ScorerStats counted, outer;
  Result<ScoreRep> r = make_error(ErrorCode::internal, "not run");
  {
    CountScorerCalls count_outer(outer);
    CountScorerCalls count(counted);  // the innermost scope counts
    r = client.call(logprobs_req({q}), 0);
  }
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->logprobs[0], alone->logprobs[0]);
  auto st = client.stats();
  EXPECT_EQ(st.requests, 1);
  EXPECT_EQ(st.failures, 1);
  EXPECT_EQ(st.retries, 1);
  EXPECT_EQ(st.batch_requests, r->batch_requests);  // scorer/batch_requests: the answered replies' batch sizes
  EXPECT_GE(st.batch_requests, 1);
  EXPECT_EQ(st.batch_requests_max, r->batch_requests);
  // the answered try's seconds (the silent one's 0.3 s deadline is not in it): mean = max for one request
  EXPECT_GT(st.latency_s, 0);
  EXPECT_LT(st.latency_s, 30);
  EXPECT_EQ(st.latency_max_s, st.latency_s);
  EXPECT_EQ(counted.requests, 1);
  EXPECT_EQ(counted.failures, 1);
  EXPECT_EQ(counted.retries, 1);
  EXPECT_EQ(counted.latency_max_s, st.latency_max_s);
  EXPECT_EQ(counted.batch_requests_max, st.batch_requests_max);
  EXPECT_EQ(outer.requests + outer.failures, 0);
  (void)client.call(logprobs_req({q}), 1);  // no scope on this thread any more: counted by the client alone
  EXPECT_EQ(counted.requests, 1);
  EXPECT_EQ(client.stats().requests, 2);
  EXPECT_GE(client.stats().latency_max_s, client.stats().latency_s / 2);  // max >= mean
  // a stopped scorer fails at once; the retry goes to the next one
  (*sys)->stop_actor(*gone);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ScorerClient client2(**sys, {*gone, *good}, 5.0, 1);
  auto r2 = client2.call(logprobs_req({q}), 0);
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_EQ(client2.stats().failures, 1);
  // out of retries: the error names every scorer tried and why
  ScorerClient client3(**sys, {*mute, *gone}, 0.2, 1);
  auto r3 = client3.call(logprobs_req({q}), 0);
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().code, ErrorCode::peer_failed);
  EXPECT_NE(r3.error().message.find("scorer 0:"), std::string::npos) << r3.error().message;
  EXPECT_NE(r3.error().message.find("scorer 1:"), std::string::npos) << r3.error().message;
  EXPECT_EQ(client3.stats().failures, 2);
  (*sys)->shutdown();
}

// Runs the coordinator's teacher scoring (check_teacher with `check`, then score_teacher) on an
// actor of its own, as the Coordinator runs its steps, and hands back its status. It shares the
// run state, the samples and the promise: its coroutine may still be ending when the test reads them.
class TeacherProbe : public runtime::Actor {
 public:
  TeacherProbe(std::shared_ptr<coord::RunState> s, std::shared_ptr<coord::Prepared> p, bool check,
               std::shared_ptr<std::promise<Status>> done)
      : s_(std::move(s)), p_(std::move(p)), check_(check), done_(std::move(done)) {}
  void on_start(runtime::Context& ctx) override {
    runtime::ActorContext::Scope scope(s_->here, ctx);
    task_ = run();
    task_.start();
  }

 private:
  runtime::Task<Status> run() {
    Status st;
    if (check_) st = co_await coord::check_teacher(*s_);  // (no co_await inside ?: with GCC 12)
    if (st.ok()) st = co_await coord::score_teacher(*s_, *p_);
    done_->set_value(st);
    co_return Status{};
  }
  std::shared_ptr<coord::RunState> s_;
  std::shared_ptr<coord::Prepared> p_;
  bool check_;
  std::shared_ptr<std::promise<Status>> done_;
  runtime::Task<Status> task_;
};

// distill: the coordinator's teacher requests (teacher_scores.cpp) follow the reliability rules. The
// check at start asks every scorer (a silent one, or one serving other files under the teacher's
// path, fails it, named); each chunk of 16 samples goes to
// its scorer under distill.timeout_s, a silent scorer's chunk is retried on the next one and
// counted (scorer/failures, scorer/retries), the teacher's numbers those of the scorer that
// answered; past distill.max_retries the step fails naming every scorer tried and why.
TEST_F(ScorerTest, TeacherRequestsAreCheckedRetriedAndCounted) {
  auto made = Scorer::create({path_}, {});
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::shared_ptr<Scorer> scorer = std::move(made).value();
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys = runtime::ActorSystem::create(sc);
  ASSERT_TRUE(sys.ok()) << sys.error().message;
  auto good = (*sys)->spawn([scorer]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ScorerActor>(scorer, 1); });
  auto mute = (*sys)->spawn([]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<MuteScorer>(); });
  auto gone = (*sys)->spawn([scorer]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ScorerActor>(scorer, 1); });
  ASSERT_TRUE(good.ok() && mute.ok() && gone.ok());
  (*sys)->stop_actor(*gone);
  auto run = [&](std::vector<runtime::ActorId> scorers, bool check, const std::shared_ptr<coord::Prepared>& p) {
    auto s = std::make_shared<coord::RunState>();
    s->cfg = test_support::tiny_config();
    s->cfg.distill.teacher = path_;
    s->cfg.distill.timeout_s = 1.5;  // a silent try costs this; an answer comes well within it
    s->cfg.distill.max_retries = 1;
    s->peers.scorers = std::move(scorers);
    auto student = make_policy(s->cfg);  // the student's tokenizer: the teacher's
    EXPECT_TRUE(student.ok()) << student.error().message;
    s->tokenizer = std::move(student->tokenizer);
    auto done = std::make_shared<std::promise<Status>>();
    auto result = done->get_future();
    auto probe = (*sys)->spawn([s, p, check, done]() -> std::unique_ptr<runtime::Actor> {
      return std::make_unique<TeacherProbe>(s, p, check, done);
    });
    EXPECT_TRUE(probe.ok());
    return result.get();
  };
  auto p = std::make_shared<coord::Prepared>();
  for (int i = 0; i < 20; ++i) {  // two chunks: samples 0-15 first to scorer 0, 16-19 to scorer 1
    TrainSample t;
    t.prompt = {1, 10 + i % 7, 11};
    t.completion = {20 + i % 5, 21, 2};
    p->samples.push_back(t);
  }
  // the check at start: every scorer serves the teacher with the student's tokenizer
  auto none = std::make_shared<coord::Prepared>();
  EXPECT_TRUE(run({*good}, true, none).ok());
  Status silent = run({*good, *mute}, true, none);
  ASSERT_FALSE(silent.ok());
  EXPECT_NE(silent.error().message.find("distill.teacher: scorer 1 cannot serve " + path_), std::string::npos)
      << silent.error().message;
  // a scorer that loaded other files under the same path (another version of the teacher) is named
  std::ofstream(fs::path(path_) / "config.json", std::ios::app) << " ";
  auto other = Scorer::create({path_}, {});
  ASSERT_TRUE(other.ok()) << other.error().message;
  std::shared_ptr<Scorer> changed = std::move(other).value();
  auto newer = (*sys)->spawn([changed]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ScorerActor>(changed, 1); });
  ASSERT_TRUE(newer.ok());
  Status versions = run({*good, *newer}, true, none);
  ASSERT_FALSE(versions.ok());
  EXPECT_NE(versions.error().message.find("distill.teacher: scorer 1 serves " + path_ + " as xxh3:"), std::string::npos)
      << versions.error().message;
  EXPECT_NE(versions.error().message.find(", scorer 0 as xxh3:"), std::string::npos) << versions.error().message;
  // chunk 0 first to the silent scorer 0: its deadline passes, scorer 1 answers it; chunk 1 to scorer 1
  ASSERT_TRUE(run({*mute, *good}, false, p).ok());
  EXPECT_EQ(p->scorer.requests, 2);
  EXPECT_EQ(p->scorer.failures, 1);
  EXPECT_EQ(p->scorer.retries, 1);
  EXPECT_GT(p->scorer.latency_max_s, 0);
  for (const auto& t : p->samples) {
    ScoreReq alone = logprobs_req({});
    alone.sequences = {t.prompt};
    alone.sequences[0].insert(alone.sequences[0].end(), t.completion.begin(), t.completion.end());
    alone.starts = {static_cast<int32_t>(t.prompt.size())};
    auto want = scorer->run(alone);
    ASSERT_TRUE(want.ok()) << want.error().message;
    EXPECT_EQ(t.teacher_logprobs, want->logprobs[0]);
  }
  // a silent then a stopped scorer: past max_retries the step fails naming both, each failure counted
  auto q = std::make_shared<coord::Prepared>();
  q->samples = {p->samples[0]};
  Status failed = run({*mute, *gone}, false, q);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::peer_failed);
  EXPECT_NE(failed.error().message.find("failed after 2 tries (scorer 0: "), std::string::npos) << failed.error().message;
  EXPECT_NE(failed.error().message.find("; scorer 1: "), std::string::npos) << failed.error().message;
  EXPECT_EQ(q->scorer.failures, 2);
  EXPECT_EQ(q->scorer.retries, 1);
  EXPECT_EQ(q->scorer.requests, 0);
  (*sys)->shutdown();
}

}  // namespace
}  // namespace troupe::actors
