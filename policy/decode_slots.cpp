// Continuous-batching KV-cache sampling: sequences in fixed slots of one KV cache join and leave
// between steps (decode_slots.h). It runs the model's own layer forward (model_impl.h): a packed
// prefill of new prompts, then decode steps whose rows are every running sequence. This is troupe's
// one decode loop: Model::generate (generate.cpp) drives it too, so one sequence alone computes
// exactly what generate computes for it.
#include "troupe/policy/decode_slots.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "decode_graph.h"
#include "model_impl.h"
#include "sampling_checks.h"
#include "troupe/kernels/batch_invariant.h"

namespace troupe::policy {

namespace k = troupe::kernels;

namespace {
enum class SlotPhase { free, waiting, running };
}

struct DecodeSlots::State {
  Model::Impl* m = nullptr;
  int slots = 0, context = 0;
  DecodeOptions opt;
  KvCtx kv;
  k::Buffer kcache, vcache, arena, last, hl, rl, logits, scratch;
  k::Buffer masked;     // a constrained row's logits (constrained_draw)
  k::Buffer ints;       // each pass's tokens, slots, positions and visible keys on the device
  k::Buffer learner;    // learner_logprobs: log-probs, entropy, lse (slots each), then the op's scratch
  PackedMeta pm, dm;    // prefill and decode metadata (their device buffers reused)
  struct Seq {
    SlotPhase phase = SlotPhase::free;
    std::vector<int32_t> prompt;
    SlotSampling sp;
    uint64_t rng = 0;
    int sampled = 0;      // tokens sampled so far
    int32_t next = -1;    // the token to feed at the next decode step
    uint64_t order = 0;   // admission order (prefill is first come, first served)
    std::vector<int32_t> experts;  // record_experts: the routing behind the next token sampled
  };
  std::vector<Seq> seq;
  uint64_t admitted = 0;
  // Per-step host arrays, sized once for the largest step.
  std::vector<int32_t> slot, pos, kv_len, tok, rows, route, adapter;
  std::vector<float> host_logits, host_masked;
  // Decode steps as recorded graphs (decode_graph.h): the plan, and this State's block of graph ids
  // on the backend (shared by every DecodeSlots on it).
  DecodeGraphPlan graphs{false};
  uint64_t graph_ids = 0;
  ~State() {
    for (uint64_t id : graphs.ids()) m->be->graph_drop(graph_ids | id);
  }
  // A pass's inputs on the device (stage_pass), for compute_pass.
  struct Pass {
    Acts ia;
    const int32_t* d_tok = nullptr;
  };

  int room(int i) const {
    const Seq& q = seq[i];
    return std::max(0, context - static_cast<int>(q.prompt.size()) - q.sampled);
  }
  void plan_rows(std::vector<int>& pre, std::vector<int>& dec) const;
  void size_step_arrays(size_t n);
  Result<const float*> run_layers(const int32_t* tokens, int T, int max_seqlen, const PackedMeta& meta, bool decode);
  Result<Pass> stage_pass(const int32_t* tokens, int T, int max_seqlen, bool decode);
  const float* compute_pass(const Pass& p, int T, const PackedMeta& meta);
  Result<const float*> graph_pass(const Pass& p, int T, const PackedMeta& meta);
  bool graph_eligible() const;
  void keep_routing(int slot, size_t row);
  Status prefill(const std::vector<int>& pre);
  Status decode(const std::vector<int>& dec, int row);
  Status draw_tokens(const std::vector<int>& order, std::vector<SlotToken>& out);
  Status constrained_draw(int row, const k::SampleParams& sp, uint64_t* rng, SlotToken& t);
  Status learner_logprobs(std::vector<SlotToken>& out);
  void top_logprobs(SlotToken& t, int row);
};

DecodeSlots::DecodeSlots(std::unique_ptr<State> s) : s_(std::move(s)) {}
DecodeSlots::~DecodeSlots() = default;

Result<std::unique_ptr<DecodeSlots>> DecodeSlots::create(Model& model, int slots, int context, int prefill_tokens) {
  DecodeOptions o;
  o.prefill_tokens = prefill_tokens;
  return create(model, slots, context, o);
}

Result<std::unique_ptr<DecodeSlots>> DecodeSlots::create(Model& model, int slots, int context,
                                                         const DecodeOptions& options) {
  Model::Impl& m = *model.impl_;
  TROUPE_TRY(m.quant_ready());
  if (slots < 1) return invalid_input("decode slots: slots must be >= 1, got " + std::to_string(slots));
  if (context < 2) return invalid_input("decode slots: context must be >= 2 tokens, got " + std::to_string(context));
  if (options.prefill_tokens < 1)
    return invalid_input("decode slots: prefill_tokens must be >= 1, got " + std::to_string(options.prefill_tokens));
  auto s = std::make_unique<State>();
  s->m = &m;
  s->slots = slots;
  s->context = context;
  s->opt = options;
  const int KD = m.NKV * m.HD;
  s->kv.cache_len = context;
  s->kv.layer_stride = static_cast<size_t>(slots) * context * KD;
  const k::Backend* be = m.be;
  auto floats = [&](size_t n, std::string_view what = {}) { return be->alloc(n * sizeof(float), what); };
  TROUPE_ASSIGN_OR_RETURN(s->kcache, floats(s->kv.layer_stride * m.L, "the K cache"));
  TROUPE_ASSIGN_OR_RETURN(s->vcache, floats(s->kv.layer_stride * m.L, "the V cache"));
  s->kv.k_cache = s->kcache.floats();
  s->kv.v_cache = s->vcache.floats();
  // Each row's last hidden state, its final norm (and rstd).
  TROUPE_ASSIGN_OR_RETURN(s->last, floats(static_cast<size_t>(slots) * m.C));
  TROUPE_ASSIGN_OR_RETURN(s->hl, floats(static_cast<size_t>(slots) * m.C));
  TROUPE_ASSIGN_OR_RETURN(s->rl, floats(slots));
  if (options.learner_logprobs && m.cfg.batch_invariant) {
    const size_t n = k::chunked_logprob_scratch_floats(slots, m.V, m.cfg.logprob_chunk) + 3 * static_cast<size_t>(slots);
    TROUPE_ASSIGN_OR_RETURN(s->learner, floats(n));
  }
  s->seq.resize(slots);
  static std::atomic<uint64_t> next_ids{1};
  s->graph_ids = next_ids.fetch_add(1) << 32;
  s->graphs = DecodeGraphPlan(m.cfg.decode_graphs && be->supports_graphs());
  return std::unique_ptr<DecodeSlots>(new DecodeSlots(std::move(s)));
}

int DecodeSlots::slots() const { return s_->slots; }
int DecodeSlots::context() const { return s_->context; }
int DecodeSlots::occupied() const {
  int n = 0;
  for (const auto& q : s_->seq) n += q.phase != SlotPhase::free;
  return n;
}
int DecodeSlots::free_slots() const { return s_->slots - occupied(); }

int DecodeSlots::room(int slot) const {
  if (slot < 0 || slot >= s_->slots || s_->seq[slot].phase == SlotPhase::free) return 0;
  return s_->room(slot);
}

Result<int> DecodeSlots::add(const std::vector<int32_t>& prompt, const SlotSampling& sp) {
  State& s = *s_;
  TROUPE_TRY(check_sampling(sp.temperature, sp.top_k, sp.top_p));
  if (sp.top_logprobs < 0 || sp.top_logprobs > s.m->V)
    return invalid_input("sampling: top_logprobs must be in [0, " + std::to_string(s.m->V) + "], got " +
                         std::to_string(sp.top_logprobs));
  if (sp.adapter < 0 || sp.adapter > static_cast<int>(s.m->served.size()))
    return invalid_input("sampling: adapter " + std::to_string(sp.adapter) + " is not one of the model's " +
                         std::to_string(s.m->served.size()) + " served adapters (0 = the base)");
  if (prompt.empty()) return invalid_input("the prompt is empty");
  if (static_cast<int>(prompt.size()) >= s.context)
    return invalid_input("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                         std::to_string(s.context) + " (prompt and at least one new token)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= s.m->V)
      return invalid_input("prompt token " + std::to_string(i) + " = " + std::to_string(prompt[i]) +
                           " is outside the vocabulary [0, " + std::to_string(s.m->V) + ")");
  int slot = -1;
  for (int i = 0; i < s.slots && slot < 0; ++i)
    if (s.seq[i].phase == SlotPhase::free) slot = i;
  if (slot < 0) return make_error(ErrorCode::internal, "decode slots: all " + std::to_string(s.slots) + " slots are in use");
  State::Seq& q = s.seq[slot];
  q.phase = SlotPhase::waiting;
  q.prompt = prompt;
  q.sp = sp;
  // The stream's RNG: seed ^ (0xD1B54A32D192ED03 * (stream + 1)) in 64-bit arithmetic.
  uint64_t s0 = sp.seed ^ (0xD1B54A32D192ED03ull * (static_cast<uint64_t>(sp.stream) + 1));
  q.rng = k::splitmix64(s0);
  q.sampled = 0;
  q.next = -1;
  q.order = s.admitted++;
  q.experts.clear();
  return slot;
}

void DecodeSlots::remove(int slot) {
  if (slot < 0 || slot >= s_->slots) return;
  s_->seq[slot] = State::Seq{};
}

// Rows of this step: the prompts prefilled now (admission order, within the token budget), then the
// running sequences with room left (slot order).
void DecodeSlots::State::plan_rows(std::vector<int>& pre, std::vector<int>& dec) const {
  std::vector<int> waiting;
  for (int i = 0; i < slots; ++i) {
    if (seq[i].phase == SlotPhase::waiting) waiting.push_back(i);
    else if (seq[i].phase == SlotPhase::running && room(i) > 0) dec.push_back(i);
  }
  std::sort(waiting.begin(), waiting.end(), [&](int a, int b) { return seq[a].order < seq[b].order; });
  int budget = 0;
  for (int i : waiting) {
    const int n = static_cast<int>(seq[i].prompt.size());
    if (!pre.empty() && budget + n > opt.prefill_tokens) break;
    pre.push_back(i);
    budget += n;
  }
  if (m->served.empty()) return;
  // Served adapters: the rows of one adapter next to each other, so each projection adds each
  // adapter's delta once over its run of rows.
  auto by_adapter = [&](int a, int b) { return seq[a].sp.adapter < seq[b].sp.adapter; };
  std::stable_sort(pre.begin(), pre.end(), by_adapter);
  std::stable_sort(dec.begin(), dec.end(), by_adapter);
}

void DecodeSlots::State::size_step_arrays(size_t n) {
  slot.resize(std::max(slot.size(), n));
  pos.resize(std::max(pos.size(), n));
  kv_len.resize(std::max(kv_len.size(), n));
}

// Embedding and every layer over T rows (slot/pos/kv_len set for them); the last layer's output.
Result<const float*> DecodeSlots::State::run_layers(const int32_t* tokens, int T, int max_seqlen,
                                                    const PackedMeta& meta, bool decode) {
  TROUPE_ASSIGN_OR_RETURN(Pass p, stage_pass(tokens, T, max_seqlen, decode));
  return compute_pass(p, T, meta);
}

// A pass's inputs: the activation arena carved, the tokens, slots, positions and visible keys on
// the device (every copy from the host of the pass happens here, before any op of the pass).
Result<DecodeSlots::State::Pass> DecodeSlots::State::stage_pass(const int32_t* tokens, int T, int max_seqlen,
                                                                bool decode) {
  const k::Backend* be = m->be;
  Pass p;
  TROUPE_ASSIGN_OR_RETURN(p.ia, m->carve(arena, std::max(T, opt.arena_rows), std::max(max_seqlen, opt.arena_seqlen),
                                         2, 1, false));
  const size_t n = static_cast<size_t>(T);
  TROUPE_TRY(be->grow(ints, sizeof(int32_t) * 4 * n));  // all four first: growing moves the buffer
  TROUPE_ASSIGN_OR_RETURN(p.d_tok, m->stage_ints(ints, tokens, n, 0));
  TROUPE_ASSIGN_OR_RETURN(kv.slot, m->stage_ints(ints, slot.data(), n, n));
  TROUPE_ASSIGN_OR_RETURN(kv.pos, m->stage_ints(ints, pos.data(), n, 2 * n));
  TROUPE_ASSIGN_OR_RETURN(kv.kv_len, m->stage_ints(ints, kv_len.data(), n, 3 * n));
  kv.decode = decode;
  return p;
}

// The pass's ops: embedding and every layer.
const float* DecodeSlots::State::compute_pass(const Pass& p, int T, const PackedMeta& meta) {
  const k::Backend* be = m->be;
  const Acts& ia = p.ia;
  const size_t n = static_cast<size_t>(T);
  // Row r's routing is that of the token sampled from its output.
  const size_t RW = static_cast<size_t>(m->routing_width);
  const bool record = opt.record_experts && RW > 0;
  if (record) route.resize(std::max(route.size(), n * RW));
  m->routing_out = record ? route.data() : nullptr;
  if (!m->served.empty()) {  // each row's served adapter (plan_rows grouped them)
    adapter.resize(std::max(adapter.size(), n));
    for (size_t t = 0; t < n; ++t) adapter[t] = seq[slot[t]].sp.adapter;
    m->row_adapter = adapter.data();
  }
  be->embedding_forward(ia.resid[0], p.d_tok, m->P() + m->wte, T, m->C);
  for (int l = 0; l < m->L; ++l)
    m->layer_forward(l, ia.resid[l % 2], ia.resid[(l + 1) % 2], ia.ws[0], ia, meta, T, &kv);
  m->routing_out = nullptr;
  m->row_adapter = nullptr;
  return ia.resid[m->L % 2];
}

// A decode pass may be a graph where its ops depend on nothing the host decides per step: no MoE
// layer (routing goes to the host, expert segments are sized there) and no served adapters (rows
// are grouped by adapter on the host).
bool DecodeSlots::State::graph_eligible() const {
  return graphs.enabled() && m->routing_width == 0 && m->served.empty() && !m->cfg.num_experts;
}

// The decode pass through the plan: eager until its key settles, then recorded once and replayed.
// The weights' pending upload goes first (P()/LP() outside any recording); a failed recording runs
// the pass eagerly and turns graphs off (said once on stderr).
Result<const float*> DecodeSlots::State::graph_pass(const Pass& p, int T, const PackedMeta& meta) {
  const k::Backend* be = m->be;
  (void)m->P();
  if (m->lora) (void)m->LP();
  DecodeGraphKey key{T, kv.cache_len, m->params_writes,
                     {arena.data(), ints.data(), kcache.data(), vcache.data(), meta.dev.data(), m->params.data(),
                      m->lparams.data()}};
  for (const auto& q : m->qbase) key.buffers.push_back(q.w.data);
  const DecodeGraphPlan::Step step = graphs.next(key);
  for (uint64_t id : step.drop) be->graph_drop(graph_ids | id);
  if (step.action == DecodeGraphAction::replay) {
    if (be->graph_launch(graph_ids | step.id).ok()) return p.ia.resid[m->L % 2];
    graphs.replay_refused(step.id);
    be->graph_drop(graph_ids | step.id);
    return compute_pass(p, T, meta);
  }
  if (step.action == DecodeGraphAction::eager) return compute_pass(p, T, meta);
  std::string why;
  if (Status st = be->graph_begin(); !st.ok()) {
    why = st.error().message;
  } else {
    const float* out = nullptr;
    try {
      out = compute_pass(p, T, meta);
    } catch (const std::exception& e) {  // an op that cannot be recorded (the backend throws)
      why = e.what();
    }
    Status end = be->graph_end(graph_ids | step.id);
    if (why.empty() && end.ok() && be->graph_launch(graph_ids | step.id).ok()) return out;
    if (why.empty()) why = end.ok() ? "the first launch of the recorded graph failed" : end.error().message;
  }
  for (uint64_t id : graphs.record_failed(step.id, why)) be->graph_drop(graph_ids | id);
  be->graph_drop(graph_ids | step.id);
  std::fprintf(stderr, "troupe: decode steps run without CUDA graphs from now on: %s\n", why.c_str());
  m->routing_out = nullptr;
  m->row_adapter = nullptr;
  return compute_pass(p, T, meta);
}

// The routing recorded for the pass's row `row` becomes that of the slot's next token.
void DecodeSlots::State::keep_routing(int i, size_t row) {
  const size_t RW = static_cast<size_t>(m->routing_width);
  if (!opt.record_experts || RW == 0) return;
  const auto from = route.begin() + static_cast<std::ptrdiff_t>(row * RW);
  seq[i].experts.assign(from, from + static_cast<std::ptrdiff_t>(RW));
}

// Packed prefill of the new prompts; each one's last position goes to rows 0.. of `last`.
Status DecodeSlots::State::prefill(const std::vector<int>& pre) {
  const k::Backend* be = m->be;
  PackedBatch batch;
  batch.cu_seqlens.push_back(0);
  int max_prompt = 0;
  for (int i : pre) {
    const auto& p = seq[i].prompt;
    batch.tokens.insert(batch.tokens.end(), p.begin(), p.end());
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
    max_prompt = std::max(max_prompt, static_cast<int>(p.size()));
  }
  const int Tp = static_cast<int>(batch.tokens.size());
  TROUPE_TRY(build_packed_meta(&pm, batch, m->HD, m->cfg.rope_theta, m->d_inv_freq(), *be));
  size_step_arrays(Tp);
  for (int t = 0; t < Tp; ++t) slot[t] = pre[pm.seq_ids[t]], pos[t] = pm.positions[t];
  TROUPE_ASSIGN_OR_RETURN(const float* xL, run_layers(batch.tokens.data(), Tp, max_prompt, pm, false));
  const size_t C = static_cast<size_t>(m->C);
  for (size_t j = 0; j < pre.size(); ++j) {
    const size_t at = static_cast<size_t>(batch.cu_seqlens[j + 1] - 1);
    be->copy_device_to_device(last.floats() + j * C, xL + at * C, sizeof(float) * C);
    keep_routing(pre[j], at);
  }
  return {};
}

// One decode step of the running sequences, each fed its last sampled token; rows row.. of `last`.
Status DecodeSlots::State::decode(const std::vector<int>& dec, int row) {
  const k::Backend* be = m->be;
  const int B = static_cast<int>(dec.size());
  size_step_arrays(B);
  tok.resize(B);
  for (int i = 0; i < B; ++i) {
    const auto& q = seq[dec[i]];
    slot[i] = dec[i];
    pos[i] = static_cast<int32_t>(q.prompt.size()) + q.sampled - 1;
    kv_len[i] = pos[i] + 1;
    tok[i] = q.next;
  }
  TROUPE_TRY(build_decode_meta(&dm, pos.data(), B, m->HD, m->cfg.rope_theta, m->d_inv_freq(), *be));
  TROUPE_ASSIGN_OR_RETURN(const Pass p, stage_pass(tok.data(), B, 1, true));
  TROUPE_ASSIGN_OR_RETURN(const float* x, graph_eligible() ? graph_pass(p, B, dm) : compute_pass(p, B, dm));
  const size_t C = static_cast<size_t>(m->C);
  be->copy_device_to_device(last.floats() + static_cast<size_t>(row) * C, x, sizeof(float) * B * C);
  for (int i = 0; i < B; ++i) keep_routing(dec[i], static_cast<size_t>(i));
  return {};
}

// One token per row (order[r] is row r's slot) from the LM head over the final-norm rows `hl`:
// kernels::chunked_sample draws them all at once (over vocabulary chunks once V exceeds
// policy.logprob_chunk, else matmul + sample_token per row), except that with a whole-vocabulary
// head and a row wanting top_logprobs the (rows, V) logits are kept and each row is sampled from them.
Status DecodeSlots::State::draw_tokens(const std::vector<int>& order, std::vector<SlotToken>& out) {
  const k::Backend* be = m->be;
  const float* W = m->P() + m->wlm;
  const int n_rows = static_cast<int>(order.size()), C = m->C, V = m->V, chunk = m->cfg.logprob_chunk;
  const bool chunked = chunk > 0 && V > chunk;
  bool any_top = false;
  int max_k = 0;
  std::vector<k::SampleParams> sp(n_rows);
  std::vector<uint64_t> rng(n_rows);
  bool any_constrained = false;
  for (int r = 0; r < n_rows; ++r) {
    const auto& q = seq[order[r]];
    sp[r] = k::SampleParams{q.sp.temperature, q.sp.top_k, q.sp.top_p};
    rng[r] = q.rng;
    max_k = std::max(max_k, q.sp.top_k);
    any_top = any_top || q.sp.top_logprobs > 0;
    any_constrained = any_constrained || q.sp.constraint != nullptr;
  }
  const std::vector<uint64_t> rng_before = any_constrained ? rng : std::vector<uint64_t>();
  out.resize(n_rows);
  // A quantized base samples from its head's blocks (the same values as the fp32 head, fewer bytes).
  const k::QuantWeights* WQ = m->head_q.w.data ? &m->head_q.w : nullptr;
  if (chunked && any_top) TROUPE_TRY(be->grow(logits, sizeof(float) * V));  // top_logprobs' one row
  if ((!chunked && any_top) || WQ) {
    TROUPE_TRY(be->grow(logits, sizeof(float) * static_cast<size_t>(n_rows) * V));
    TROUPE_TRY(be->grow(scratch, be->sample_scratch_bytes(V)));
    if (WQ)
      be->quant_matmul_forward(logits.floats(), hl.floats(), *WQ, n_rows);
    else
      be->matmul_forward(logits.floats(), hl.floats(), W, n_rows, C, V);
    for (int r = 0; r < n_rows; ++r)
      out[r].token = be->sample_token(&out[r].logprob, logits.floats() + static_cast<size_t>(r) * V, V, sp[r], &rng[r],
                                      scratch.data());
  } else {
    TROUPE_TRY(be->grow(scratch, be->chunked_sample_scratch_bytes(n_rows, V, chunk, max_k)));
    std::vector<int32_t> tokens(n_rows);
    std::vector<float> lps(n_rows);
    be->chunked_sample(tokens.data(), lps.data(), hl.floats(), W, n_rows, C, V, chunk, sp.data(), rng.data(), max_k,
                       scratch.data());
    for (int r = 0; r < n_rows; ++r) out[r].token = tokens[r], out[r].logprob = lps[r];
  }
  for (int r = 0; r < n_rows; ++r) out[r].slot = order[r];
  for (int r = 0; any_constrained && r < n_rows; ++r)
    if (seq[order[r]].sp.constraint) {
      rng[r] = rng_before[r];
      TROUPE_TRY(constrained_draw(r, sp[r], &rng[r], out[r]));
    }
  for (int r = 0; r < n_rows; ++r) seq[order[r]].rng = rng[r];
  return {};
}

// A constrained row is drawn again, from the RNG state it had before this step's draw, from its
// own logits row with the tokens its constraint disallows at -inf (the logits buffer is left as
// top_logprobs expects it).
Status DecodeSlots::State::constrained_draw(int row, const k::SampleParams& sp, uint64_t* rng, SlotToken& t) {
  const k::Backend* be = m->be;
  const int C = m->C, V = m->V;
  TROUPE_TRY(be->grow(masked, sizeof(float) * V));
  TROUPE_TRY(be->grow(scratch, be->sample_scratch_bytes(V)));
  be->matmul_forward(masked.floats(), hl.floats() + static_cast<size_t>(row) * C, m->P() + m->wlm, 1, C, V);
  host_masked.resize(V);
  be->copy_device_to_host(host_masked.data(), masked.floats(), sizeof(float) * V);
  TokenConstraint& c = *seq[t.slot].sp.constraint;
  c.mask(host_masked.data(), V);
  be->copy_host_to_device(masked.floats(), host_masked.data(), sizeof(float) * V);
  t.token = be->sample_token(&t.logprob, masked.floats(), V, sp, rng, scratch.data());
  c.accept(t.token);
  return {};
}

// learner_logprobs under batch_invariant: each row's log-prob is the learner's chunked log-softmax
// of its token at its sampling temperature (1 when greedy), one call per run of equal temperatures.
Status DecodeSlots::State::learner_logprobs(std::vector<SlotToken>& out) {
  if (!opt.learner_logprobs || !m->cfg.batch_invariant) return {};
  const k::Backend* be = m->be;
  const int n_rows = static_cast<int>(out.size());
  const size_t cap = static_cast<size_t>(slots);
  float* lp = learner.floats();
  float* ent = lp + cap;
  tok.resize(std::max<size_t>(tok.size(), n_rows));
  for (int r = 0; r < n_rows; ++r) tok[r] = out[r].token;
  TROUPE_ASSIGN_OR_RETURN(const int32_t* d_tok, m->stage_ints(ints, tok.data(), n_rows, 0));
  std::vector<float> host(n_rows);
  for (int r0 = 0, r1 = 0; r0 < n_rows; r0 = r1) {
    const float temp = seq[out[r0].slot].sp.temperature;
    while (r1 < n_rows && seq[out[r1].slot].sp.temperature == temp) ++r1;
    const size_t o = static_cast<size_t>(r0);
    be->chunked_logprob_forward(lp + o, ent + o, ent + cap + o, hl.floats() + o * m->C, m->P() + m->wlm, d_tok + o,
                                temp > 0 ? temp : 1.0f, r1 - r0, m->C, m->V, m->cfg.logprob_chunk, ent + 2 * cap);
  }
  be->copy_device_to_host(host.data(), lp, sizeof(float) * n_rows);
  for (int r = 0; r < n_rows; ++r) out[r].logprob = host[r];
  return {};
}

// The row's top_logprobs most likely tokens: log softmax at the sampling temperature (1 when
// greedy), on the host, from its logits row (computed here for a chunked head).
void DecodeSlots::State::top_logprobs(SlotToken& t, int row) {
  const auto& q = seq[t.slot];
  if (q.sp.top_logprobs <= 0) return;
  const k::Backend* be = m->be;
  const int C = m->C, V = m->V;
  const bool chunked = m->cfg.logprob_chunk > 0 && V > m->cfg.logprob_chunk;
  const float* lrow = logits.floats() + (chunked ? 0 : static_cast<size_t>(row) * V);
  if (chunked)
    be->matmul_forward(logits.floats(), hl.floats() + static_cast<size_t>(row) * C, m->P() + m->wlm, 1, C, V);
  const float* h = lrow;
  if (!be->host_visible()) {
    host_logits.resize(V);
    be->copy_device_to_host(host_logits.data(), lrow, sizeof(float) * V);
    h = host_logits.data();
  }
  const float inv_t = q.sp.temperature > 0 ? 1.0f / q.sp.temperature : 1.0f;
  double mx = -INFINITY;
  for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(h[v]) * inv_t);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(h[v]) * inv_t - mx);
  const double lse = mx + std::log(sum);
  rows.resize(V);
  for (int v = 0; v < V; ++v) rows[v] = v;
  const int kk = std::min(q.sp.top_logprobs, V);
  std::partial_sort(rows.begin(), rows.begin() + kk, rows.end(),
                    [&](int32_t a, int32_t b) { return h[a] != h[b] ? h[a] > h[b] : a < b; });
  for (int j = 0; j < kk; ++j)
    t.top.emplace_back(rows[j], static_cast<float>(static_cast<double>(h[rows[j]]) * inv_t - lse));
}

Result<std::vector<SlotToken>> DecodeSlots::step() {
  State& s = *s_;
  Model::Impl& m = *s.m;
  const OpScopes scopes(m.cfg);  // batch invariance: a slot's rows never depend on the others
  std::vector<int> pre, dec;
  s.plan_rows(pre, dec);
  std::vector<SlotToken> out;
  if (pre.empty() && dec.empty()) return out;
  if (!pre.empty()) TROUPE_TRY(s.prefill(pre));
  if (!dec.empty()) TROUPE_TRY(s.decode(dec, static_cast<int>(pre.size())));
  // The LM head over every row, then one token per row.
  std::vector<int> order = pre;
  order.insert(order.end(), dec.begin(), dec.end());
  const int n_rows = static_cast<int>(order.size());
  m.be->rmsnorm_forward(s.hl.floats(), s.rl.floats(), s.last.floats(), m.P() + m.wnorm, n_rows, m.C,
                        m.cfg.rms_norm_eps);
  TROUPE_TRY(s.draw_tokens(order, out));
  TROUPE_TRY(s.learner_logprobs(out));
  for (int r = 0; r < n_rows; ++r) {
    SlotToken& t = out[r];
    auto& q = s.seq[t.slot];
    s.top_logprobs(t, r);
    if (s.opt.record_experts) t.experts = q.experts;
    q.phase = SlotPhase::running;
    q.next = t.token;
    ++q.sampled;
  }
  return out;
}

}  // namespace troupe::policy
