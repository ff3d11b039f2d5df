// Continuous-batching KV-cache sampling: sequences in fixed slots of one KV cache join and leave
// between steps (decode_slots.h). It runs the model's own layer forward (model_impl.h) the way
// Model::generate does -- a packed prefill of new prompts, then decode steps whose rows are every
// running sequence -- so one sequence alone computes exactly what generate computes for it.
#include "troupe/policy/decode_slots.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "model_impl.h"
#include "troupe/kernels/batch_invariant.h"

namespace troupe::policy {

namespace k = troupe::kernels;

namespace {
enum class SlotPhase { free, waiting, running };
}

struct DecodeSlots::State {
  Model::Impl* m = nullptr;
  int slots = 0, context = 0, prefill_tokens = 0;
  KvCtx kv;
  k::Buffer kcache, vcache, arena, last, hl, rl, logits, scratch;
  k::Buffer ints;     // each pass's tokens, slots, positions and visible keys on the device
  PackedMeta pm, dm;  // prefill and decode metadata (their device buffers reused)
  struct Seq {
    SlotPhase phase = SlotPhase::free;
    std::vector<int32_t> prompt;
    SlotSampling sp;
    uint64_t rng = 0;
    int sampled = 0;      // tokens sampled so far
    int32_t next = -1;    // the token to feed at the next decode step
    uint64_t order = 0;   // admission order (prefill is first come, first served)
  };
  std::vector<Seq> seq;
  uint64_t admitted = 0;
  // Per-step host arrays, sized once for the largest step.
  std::vector<int32_t> slot, pos, kv_len, tok, rows;
  std::vector<float> host_logits;
};

DecodeSlots::DecodeSlots(std::unique_ptr<State> s) : s_(std::move(s)) {}
DecodeSlots::~DecodeSlots() = default;

Result<std::unique_ptr<DecodeSlots>> DecodeSlots::create(Model& model, int slots, int context, int prefill_tokens) {
  Model::Impl& m = *model.impl_;
  if (slots < 1) return invalid_input("decode slots: slots must be >= 1, got " + std::to_string(slots));
  if (context < 2) return invalid_input("decode slots: context must be >= 2 tokens, got " + std::to_string(context));
  if (prefill_tokens < 1)
    return invalid_input("decode slots: prefill_tokens must be >= 1, got " + std::to_string(prefill_tokens));
  auto s = std::make_unique<State>();
  s->m = &m;
  s->slots = slots;
  s->context = context;
  s->prefill_tokens = prefill_tokens;
  const int KD = m.NKV * m.HD;
  s->kv.cache_len = context;
  s->kv.layer_stride = static_cast<size_t>(slots) * context * KD;
  const k::Backend* be = m.be;
  auto floats = [&](size_t n) { return be->alloc(n * sizeof(float)); };
  TROUPE_ASSIGN_OR_RETURN(s->kcache, floats(s->kv.layer_stride * m.L));
  TROUPE_ASSIGN_OR_RETURN(s->vcache, floats(s->kv.layer_stride * m.L));
  s->kv.k_cache = s->kcache.floats();
  s->kv.v_cache = s->vcache.floats();
  TROUPE_ASSIGN_OR_RETURN(s->last, floats(static_cast<size_t>(slots) * m.C));
  TROUPE_ASSIGN_OR_RETURN(s->hl, floats(static_cast<size_t>(slots) * m.C));
  TROUPE_ASSIGN_OR_RETURN(s->rl, floats(slots));
  // The head's logits: (slots, V) when the vocabulary fits one policy.logprob_chunk; else one
  // (1, V) row for a slot that asks for top_logprobs (sampling itself runs over chunks).
  const bool chunked = m.cfg.logprob_chunk > 0 && m.V > m.cfg.logprob_chunk;
  TROUPE_ASSIGN_OR_RETURN(s->logits, floats(static_cast<size_t>(chunked ? 1 : slots) * m.V));
  TROUPE_ASSIGN_OR_RETURN(s->scratch, be->alloc(be->sample_scratch_bytes(m.V)));
  s->seq.resize(slots);
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
  const auto& q = s_->seq[slot];
  return std::max(0, s_->context - static_cast<int>(q.prompt.size()) - q.sampled);
}

Result<int> DecodeSlots::add(const std::vector<int32_t>& prompt, const SlotSampling& sp) {
  State& s = *s_;
  if (!(sp.temperature >= 0.0f) || !std::isfinite(sp.temperature))
    return invalid_input("sampling: temperature must be >= 0, got " + std::to_string(sp.temperature));
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f))
    return invalid_input("sampling: top_p must be in (0, 1], got " + std::to_string(sp.top_p));
  if (sp.top_k < 0) return invalid_input("sampling: top_k must be >= 0, got " + std::to_string(sp.top_k));
  if (sp.top_logprobs < 0 || sp.top_logprobs > s.m->V)
    return invalid_input("sampling: top_logprobs must be in [0, " + std::to_string(s.m->V) + "], got " +
                         std::to_string(sp.top_logprobs));
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
  uint64_t s0 = sp.seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(sp.stream + 1));  // as Model::generate
  q.rng = k::splitmix64(s0);
  q.sampled = 0;
  q.next = -1;
  q.order = s.admitted++;
  return slot;
}

void DecodeSlots::remove(int slot) {
  if (slot < 0 || slot >= s_->slots) return;
  s_->seq[slot] = State::Seq{};
}

Result<std::vector<SlotToken>> DecodeSlots::step() {
  State& s = *s_;
  Model::Impl& m = *s.m;
  const OpScopes scopes(m.cfg);  // batch invariance: a slot's rows never depend on the others
  const k::Backend* be = m.be;
  const float* P = m.P();
  const int C = m.C, V = m.V, HD = m.HD;
  std::vector<SlotToken> out;
  // Rows of this step: the prompts prefilled now (admission order, within the token budget), then
  // the running sequences with room left.
  std::vector<int> pre, dec;
  {
    std::vector<int> waiting;
    for (int i = 0; i < s.slots; ++i) {
      const auto& q = s.seq[i];
      if (q.phase == SlotPhase::waiting) waiting.push_back(i);
      else if (q.phase == SlotPhase::running && room(i) > 0) dec.push_back(i);
    }
    std::sort(waiting.begin(), waiting.end(), [&](int a, int b) { return s.seq[a].order < s.seq[b].order; });
    int budget = 0;
    for (int i : waiting) {
      const int n = static_cast<int>(s.seq[i].prompt.size());
      if (!pre.empty() && budget + n > s.prefill_tokens) break;
      pre.push_back(i);
      budget += n;
    }
  }
  const int n_rows = static_cast<int>(pre.size() + dec.size());
  if (n_rows == 0) return out;
  auto run_layers = [&](const int32_t* tokens, int T, int max_seqlen, const PackedMeta& meta, bool decode)
      -> Result<const float*> {
    TROUPE_ASSIGN_OR_RETURN(Acts ia, m.carve(s.arena, T, max_seqlen, 2, 1, false));
    const size_t n = static_cast<size_t>(T);
    TROUPE_TRY(be->grow(s.ints, sizeof(int32_t) * 4 * n));  // all four first: growing moves the buffer
    TROUPE_ASSIGN_OR_RETURN(const int32_t* d_tok, m.stage_ints(s.ints, tokens, n, 0));
    TROUPE_ASSIGN_OR_RETURN(s.kv.slot, m.stage_ints(s.ints, s.slot.data(), n, n));
    TROUPE_ASSIGN_OR_RETURN(s.kv.pos, m.stage_ints(s.ints, s.pos.data(), n, 2 * n));
    TROUPE_ASSIGN_OR_RETURN(s.kv.kv_len, m.stage_ints(s.ints, s.kv_len.data(), n, 3 * n));
    s.kv.decode = decode;
    be->embedding_forward(ia.resid[0], d_tok, P + m.wte, T, C);
    for (int l = 0; l < m.L; ++l)
      m.layer_forward(l, ia.resid[l % 2], ia.resid[(l + 1) % 2], ia.ws[0], ia, meta, T, &s.kv);
    return ia.resid[m.L % 2];
  };
  int row = 0;
  if (!pre.empty()) {  // packed prefill of the new prompts; keep each one's last position
    PackedBatch batch;
    batch.cu_seqlens.push_back(0);
    int max_prompt = 0;
    for (int i : pre) {
      const auto& p = s.seq[i].prompt;
      batch.tokens.insert(batch.tokens.end(), p.begin(), p.end());
      batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
      max_prompt = std::max(max_prompt, static_cast<int>(p.size()));
    }
    const int Tp = static_cast<int>(batch.tokens.size());
    PackedMeta& pm = s.pm;
    TROUPE_TRY(build_packed_meta(&pm, batch, HD, m.cfg.rope_theta, m.d_inv_freq(), *be));
    s.slot.resize(std::max<size_t>(s.slot.size(), Tp));
    s.pos.resize(std::max<size_t>(s.pos.size(), Tp));
    s.kv_len.resize(std::max<size_t>(s.kv_len.size(), Tp));
    for (int t = 0; t < Tp; ++t) s.slot[t] = pre[pm.seq_ids[t]], s.pos[t] = pm.positions[t];
    TROUPE_ASSIGN_OR_RETURN(const float* xL, run_layers(batch.tokens.data(), Tp, max_prompt, pm, false));
    for (size_t j = 0; j < pre.size(); ++j, ++row)
      be->copy_device_to_device(s.last.floats() + static_cast<size_t>(row) * C,
                                xL + static_cast<size_t>(batch.cu_seqlens[j + 1] - 1) * C, sizeof(float) * C);
  }
  if (!dec.empty()) {  // one decode step of the running sequences, each fed its last sampled token
    const int B = static_cast<int>(dec.size());
    s.slot.resize(std::max<size_t>(s.slot.size(), B));
    s.pos.resize(std::max<size_t>(s.pos.size(), B));
    s.kv_len.resize(std::max<size_t>(s.kv_len.size(), B));
    s.tok.resize(B);
    for (int i = 0; i < B; ++i) {
      const auto& q = s.seq[dec[i]];
      s.slot[i] = dec[i];
      s.pos[i] = static_cast<int32_t>(q.prompt.size()) + q.sampled - 1;
      s.kv_len[i] = s.pos[i] + 1;
      s.tok[i] = q.next;
    }
    TROUPE_TRY(build_decode_meta(&s.dm, s.pos.data(), B, HD, m.cfg.rope_theta, m.d_inv_freq(), *be));
    TROUPE_ASSIGN_OR_RETURN(const float* x, run_layers(s.tok.data(), B, 1, s.dm, true));
    be->copy_device_to_device(s.last.floats() + static_cast<size_t>(row) * C, x, sizeof(float) * B * C);
  }
  // The LM head over every row, then one token per row.
  be->rmsnorm_forward(s.hl.floats(), s.rl.floats(), s.last.floats(), P + m.wnorm, n_rows, C, m.cfg.rms_norm_eps);
  std::vector<int> order = pre;
  order.insert(order.end(), dec.begin(), dec.end());
  // Over vocabulary chunks (kernels::chunked_sample) once V exceeds one: every row's token at once,
  // then one (1, V) logits row only for the slots that want their top log-probs.
  const int chunk = m.cfg.logprob_chunk;
  const bool chunked = chunk > 0 && V > chunk;
  std::vector<int32_t> ctok;
  std::vector<float> clp;
  if (chunked) {
    std::vector<k::SampleParams> csp(n_rows);
    std::vector<uint64_t> crng(n_rows);
    int max_k = 0;
    for (int r = 0; r < n_rows; ++r) {
      const auto& q = s.seq[order[r]];
      csp[r] = k::SampleParams{q.sp.temperature, q.sp.top_k, q.sp.top_p};
      crng[r] = q.rng;
      max_k = std::max(max_k, q.sp.top_k);
    }
    TROUPE_TRY(be->grow(s.scratch, be->chunked_sample_scratch_bytes(n_rows, V, chunk, max_k)));
    ctok.resize(n_rows);
    clp.resize(n_rows);
    be->chunked_sample(ctok.data(), clp.data(), s.hl.floats(), P + m.wlm, n_rows, C, V, chunk, csp.data(),
                       crng.data(), max_k, s.scratch.data());
    for (int r = 0; r < n_rows; ++r) s.seq[order[r]].rng = crng[r];
  } else {
    be->matmul_forward(s.logits.floats(), s.hl.floats(), P + m.wlm, n_rows, C, V);
  }
  const bool host = be->host_visible();
  out.reserve(order.size());
  for (int r = 0; r < n_rows; ++r) {
    auto& q = s.seq[order[r]];
    const float* lrow = s.logits.floats() + (chunked ? 0 : static_cast<size_t>(r) * V);
    SlotToken t;
    t.slot = order[r];
    if (chunked) {
      t.token = ctok[r];
      t.logprob = clp[r];
      if (q.sp.top_logprobs > 0)
        be->matmul_forward(s.logits.floats(), s.hl.floats() + static_cast<size_t>(r) * C, P + m.wlm, 1, C, V);
    } else {
      const k::SampleParams spk{q.sp.temperature, q.sp.top_k, q.sp.top_p};
      t.token = be->sample_token(&t.logprob, lrow, V, spk, &q.rng, s.scratch.data());
    }
    if (q.sp.top_logprobs > 0) {  // log softmax at the sampling temperature (1 when greedy), on the host
      const float* h = lrow;
      if (!host) {
        s.host_logits.resize(V);
        be->copy_device_to_host(s.host_logits.data(), lrow, sizeof(float) * V);
        h = s.host_logits.data();
      }
      const float inv_t = q.sp.temperature > 0 ? 1.0f / q.sp.temperature : 1.0f;
      double mx = -INFINITY;
      for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(h[v]) * inv_t);
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(h[v]) * inv_t - mx);
      const double lse = mx + std::log(sum);
      s.rows.resize(V);
      for (int v = 0; v < V; ++v) s.rows[v] = v;
      const int kk = std::min(q.sp.top_logprobs, V);
      std::partial_sort(s.rows.begin(), s.rows.begin() + kk, s.rows.end(), [&](int32_t a, int32_t b) {
        return h[a] != h[b] ? h[a] > h[b] : a < b;
      });
      for (int j = 0; j < kk; ++j)
        t.top.emplace_back(s.rows[j], static_cast<float>(static_cast<double>(h[s.rows[j]]) * inv_t - lse));
    }
    q.phase = SlotPhase::running;
    q.next = t.token;
    ++q.sampled;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace troupe::policy
