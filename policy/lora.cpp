// LoRA on the policy model: the configuration check, the adapter arena (PEFT's names and layout,
// seeded init), the linear layer with its adapter (forward, and backward with a frozen base), and
// the public accessors of the two arenas. Invariant: once enable_lora ran, only the adapter arena
// has gradients; the base arena is read-only to every op.
#include <cmath>

#include "model_impl.h"
#include "troupe/base/seed_streams.h"
#include "troupe/kernels/random.h"

namespace troupe::policy {

namespace k = troupe::kernels;

float LoraConfig::scale() const {
  if (rank <= 0) return 0.0f;
  return use_rslora ? alpha / std::sqrt(static_cast<float>(rank)) : alpha / static_cast<float>(rank);
}

bool LoraConfig::targets_kind(LoraTarget t) const {
  for (LoraTarget x : targets)
    if (x == t || x == LoraTarget::all_linear) return true;
  return false;
}

namespace {

// One linear layer a target kind may adapt in layer l: its Hugging Face module name and sizes.
struct LoraModule {
  LoraTarget kind;
  std::string name;
  int in = 0, out = 0;
};

bool has_kernel_shared_expert(const ModelArchitecture& a) {
  return a.shared_expert_intermediate_size > 0 && !a.shared_expert_gated();
}

// The modules of layer l that LoRA can adapt, in PEFT's order q, k, v, o, gate, up, down.
std::vector<LoraModule> layer_modules(const ModelArchitecture& a, int l) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const int C = a.hidden_size, QD = a.num_attention_heads * a.head_dim, KD = a.num_key_value_heads * a.head_dim;
  std::vector<LoraModule> m = {{LoraTarget::q, p + "self_attn.q_proj", C, QD},
                               {LoraTarget::k, p + "self_attn.k_proj", C, KD},
                               {LoraTarget::v, p + "self_attn.v_proj", C, KD},
                               {LoraTarget::o, p + "self_attn.o_proj", QD, C}};
  std::string mlp;
  int H = 0;
  if (!a.is_moe_layer(l)) {
    mlp = p + "mlp.";
    H = a.intermediate_size;
  } else if (a.shared_expert_gated()) {
    mlp = p + "mlp.shared_expert.";
    H = a.shared_expert_intermediate_size;
  }
  if (H > 0) {
    m.push_back({LoraTarget::gate, mlp + "gate_proj", C, H});
    m.push_back({LoraTarget::up, mlp + "up_proj", C, H});
    m.push_back({LoraTarget::down, mlp + "down_proj", H, C});
  }
  // Routed experts, expert by expert (gate, up, down), named as Hugging Face's modules (PEFT's
  // mlp.experts.N.gate_proj; Mixtral's block_sparse_moe.experts.N.w1 / w3 / w2): the adapters of
  // one expert are contiguous and every expert's the same size (the MoE kernel's stride).
  if (a.is_moe_layer(l)) {
    const bool mix = a.family == ModelFamily::mixtral;
    const std::string ex = p + (mix ? "block_sparse_moe.experts." : "mlp.experts.");
    const int EH = a.moe_intermediate_size;
    for (int e = 0; e < a.num_experts; ++e) {
      const std::string x = ex + std::to_string(e) + ".";
      m.push_back({LoraTarget::experts, x + (mix ? "w1" : "gate_proj"), C, EH});
      m.push_back({LoraTarget::experts, x + (mix ? "w3" : "up_proj"), C, EH});
      m.push_back({LoraTarget::experts, x + (mix ? "w2" : "down_proj"), EH, C});
    }
  }
  return m;
}

std::string targets_string(const LoraConfig& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.targets.size(); ++i) s += (i ? ", " : "") + enum_string(c.targets[i]);
  return s + "]";
}

}  // namespace

Status validate_lora(const LoraConfig& c, const ModelArchitecture& a) {
  auto bad = [](const std::string& key, const std::string& why) { return invalid_input("policy.lora." + key + ": " + why); };
  if (c.rank < 0) return bad("rank", "must be >= 0 (0 = off), got " + std::to_string(c.rank));
  if (!(c.alpha >= 0) || !std::isfinite(c.alpha)) return bad("alpha", "must be finite and >= 0, got " + std::to_string(c.alpha));
  if (!(c.dropout >= 0 && c.dropout < 1)) return bad("dropout", "must be in [0, 1), got " + std::to_string(c.dropout));
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) return bad("lr", "must be finite and >= 0 (0 = optimizer.lr), got " + std::to_string(c.lr));
  if (!c.enabled()) return {};
  if (c.targets.empty()) return bad("targets", "names no module kind (q, k, v, o, gate, up, down, experts, all_linear)");
  bool moe = false;
  for (int l = 0; l < a.num_hidden_layers; ++l) moe = moe || a.is_moe_layer(l);
  const std::string fam = enum_string(a.family);
  for (LoraTarget t : c.targets) {
    if (t == LoraTarget::experts && !moe)
      return bad("targets", "experts matches no module: this " + fam + " model has no routed experts");
    if ((t == LoraTarget::experts || t == LoraTarget::all_linear) && moe && c.dropout > 0)
      return bad("dropout", std::to_string(c.dropout) + ": dropout on the routed experts' adapters (targets " +
                                targets_string(c) + ") is not implemented; use 0 or leave out experts / all_linear");
    const bool mlp_kind = t == LoraTarget::gate || t == LoraTarget::up || t == LoraTarget::down;
    if (mlp_kind && moe && has_kernel_shared_expert(a))
      return bad("targets", enum_string(t) + ": LoRA on the MoE kernel's (ungated) shared expert is not implemented");
    bool found = false;
    for (int l = 0; l < a.num_hidden_layers && !found; ++l)
      for (const auto& m : layer_modules(a, l)) found = found || m.kind == t || t == LoraTarget::all_linear;
    if (!found)
      return bad("targets", enum_string(t) + " matches no module of this " + fam + " model (" + targets_string(c) + ")");
  }
  for (int l = 0; l < a.num_hidden_layers; ++l)
    for (const auto& m : layer_modules(a, l))
      if (c.targets_kind(m.kind) && c.rank > std::min(m.in, m.out))
        return bad("rank", std::to_string(c.rank) + " exceeds min(in, out) = " + std::to_string(std::min(m.in, m.out)) +
                               " of " + m.name + " (in " + std::to_string(m.in) + ", out " + std::to_string(m.out) + ")");
  return {};
}

void Model::Impl::build_lora_table() {
  lora_table.clear();
  size_t off = 0;
  const int r = cfg.lora.rank;
  for (int l = 0; l < L; ++l) {
    LayerW& w = layers[l];
    for (const auto& m : layer_modules(cfg, l)) {
      if (!cfg.lora.targets_kind(m.kind)) continue;
      LoraSlot s;
      s.on = true;
      s.a = off;
      lora_table.push_back({"base_model.model." + m.name + ".lora_A.weight", {r, m.in}, off});
      off += static_cast<size_t>(r) * m.in;
      s.b = off;
      lora_table.push_back({"base_model.model." + m.name + ".lora_B.weight", {m.out, r}, off});
      off += static_cast<size_t>(m.out) * r;
      if (m.kind == LoraTarget::experts) {
        if (!w.lx.on) w.lx = s;  // expert 0's gate: the others follow at a fixed stride
        continue;
      }
      LoraSlot* slots[] = {&w.lq, &w.lk, &w.lv, &w.lo, &w.lg, &w.lu, &w.ld};
      *slots[static_cast<int>(m.kind)] = s;
    }
  }
  n_lora = off;
}

Status Model::Impl::enable_lora(const LoraConfig& lc, uint64_t seed) {
  if (lora) return invalid_input("enable_lora: the model's LoRA adapters are already on");
  if (!lc.enabled()) return validate_lora(lc, cfg);
  TROUPE_TRY(validate_lora(lc, cfg));
  if (any_moe && lc.targets_kind(LoraTarget::experts) && be->name() == "cuda")
    return invalid_input("policy.lora.targets: adapters on the routed experts run on the cpu backends only "
                         "(policy.device: cuda has no MoE kernel with adapters yet)");
  cfg.lora = lc;
  lora_r = lc.rank;
  lora_scale = lc.scale();
  build_lora_table();
  TROUPE_ASSIGN_OR_RETURN(lparams, be->alloc(n_lora * sizeof(float), "the LoRA adapters"));
  TROUPE_ASSIGN_OR_RETURN(lgrads, be->alloc(n_lora * sizeof(float), "the LoRA adapters' gradients"));
  // A as PEFT draws it, B = 0 (the buffer is zero-filled): the model is unchanged until a step.
  std::vector<float> init(n_lora, 0.0f);
  uint64_t s = mix_seed(seed, seed_stream::lora_init);
  for (const auto& t : lora_table) {
    if (!t.name.ends_with(".lora_A.weight")) continue;
    float* a = init.data() + t.offset;
    if (lc.init == LoraInit::gaussian) {
      k::fill_normal(a, t.numel(), 1.0 / lc.rank, &s);
    } else {  // kaiming_uniform(a = sqrt(5)): bound = sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in)
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
      for (size_t i = 0; i < t.numel(); ++i) a[i] = static_cast<float>((2.0 * k::uniform01(s) - 1.0) * bound);
    }
  }
  be->copy_host_to_device(lparams.data(), init.data(), sizeof(float) * n_lora);
  weights_written(lparams);
  if (mirrored) {
    TROUPE_TRY(host_lparams.allocate(*be, n_lora, "the host mirror of the LoRA adapters (" + std::to_string(n_lora) + " floats)"));
    std::copy(init.begin(), init.end(), host_lparams.begin());
    host_lgrads.assign(n_lora, 0.0f);
  }
  // The base is frozen: its gradient arena goes; the MoE kernel's router/expert gradients of one
  // layer land in a sink.
  size_t sink = 0;
  for (int l = 0; l < L; ++l) {
    if (!layers[l].moe) continue;
    const size_t E = moe_cfg.E, H = moe_cfg.H, HS = moe_cfg.H_shared;
    sink = std::max(sink, E * C + 3 * E * H * C + 3 * HS * C);
  }
  if (sink > 0) {
    TROUPE_ASSIGN_OR_RETURN(moe_sink, be->alloc(sink * sizeof(float)));
  }
  grads = k::Buffer();
  host_grads.clear();
  host_grads.shrink_to_fit();
  grads_host_newer = grads_device_newer = false;
  lora = true;
  ++params_writes;
  return {};
}

k::MoeGrads Model::Impl::moe_sink_grads(int /*l*/) const {
  const size_t E = moe_cfg.E, H = moe_cfg.H, HS = moe_cfg.H_shared;
  k::MoeGrads g;
  float* s = moe_sink.floats();
  g.w_router = s;
  g.w_gate = s + E * C;
  g.w_up = g.w_gate + E * H * C;
  g.w_down = g.w_up + E * H * C;
  if (HS > 0) {
    g.ws_gate = g.w_down + E * C * H;
    g.ws_up = g.ws_gate + HS * C;
    g.ws_down = g.ws_up + HS * C;
  }
  return g;
}

// Each adapter draws its own mask (PEFT: one lora_dropout module per adapted layer): the armed
// seed mixed with the adapter's offset in the arena.
const float* Model::Impl::lora_input(const float* in, const LoraSlot& s, const Acts& acts, size_t n) const {
  if (!dropout_applies(s, acts)) return in;
  be->lora_dropout(acts.lora_x, in, n, cfg.lora.dropout, mix_seed(dropout_seed, s.a));
  return acts.lora_x;
}

// Expert e's adapters are at lx.a + e * stride: A (r, C), B (H, r) of gate and of up, A (r, H),
// B (C, r) of down.
k::MoeLoraWeights Model::Impl::moe_lora(int l, const float* base) const {
  const LoraSlot& s = layers[l].lx;
  k::MoeLoraWeights w;
  if (!s.on) return w;
  const size_t r = static_cast<size_t>(lora_r), C_ = static_cast<size_t>(C), H = static_cast<size_t>(moe_cfg.H);
  w.a_gate = base + s.a;
  w.b_gate = w.a_gate + r * C_;
  w.a_up = w.b_gate + H * r;
  w.b_up = w.a_up + r * C_;
  w.a_down = w.b_up + H * r;
  w.b_down = w.a_down + r * H;
  w.stride = r * (3 * C_ + 3 * H);
  w.r = lora_r;
  w.scale = lora_scale;
  return w;
}
k::MoeLoraGrads Model::Impl::moe_lora_grads(int l, float* base) const {
  const k::MoeLoraWeights w = moe_lora(l, base);
  auto m = [&](const float* p) { return const_cast<float*>(p); };  // the same offsets, in the writable arena
  return {m(w.a_gate), m(w.b_gate), m(w.a_up), m(w.b_up), m(w.a_down), m(w.b_down)};
}

void Model::Impl::linear_forward(float* out, const float* in, size_t w, const LoraSlot& s, const Acts& acts, int T,
                                 int IN, int OUT) const {
  if (is_quant(w) && s.on && !row_adapter && !dropout_applies(s, acts))  // base and adapter in one backend call
    return linear_forward_group({{out, w, &s, OUT}}, in, acts, T, IN);
  if (is_quant(w))
    be->quant_matmul_forward(out, in, qw(w), T);
  else
    be->matmul_forward(out, in, P() + w, T, IN, OUT);
  if (s.on) {
    const float* x = lora_input(in, s, acts, static_cast<size_t>(T) * IN);
    be->lora_forward(out, x, LP() + s.a, LP() + s.b, acts.lora_scratch, T, IN, OUT, lora_r, lora_scale);
  }
  if (row_adapter) served_lora_forward(out, in, w, acts, T, IN, OUT);
}

void Model::Impl::linear_forward_group(std::initializer_list<Projection> group, const float* in, const Acts& acts,
                                       int T, int IN) const {
  bool together = !row_adapter && group.size() <= 3;
  for (const Projection& p : group) together = together && is_quant(p.w) && !dropout_applies(*p.s, acts);
  if (!together) {
    for (const Projection& p : group) linear_forward(p.out, in, p.w, *p.s, acts, T, IN, p.OUT);
    return;
  }
  k::QuantProjection q[3];
  int n = 0;
  for (const Projection& p : group) {
    k::QuantProjection& d = q[n++];
    d.y = p.out;
    d.W = qw(p.w);
    if (!p.s->on) continue;
    d.A = LP() + p.s->a;
    d.B = LP() + p.s->b;
    d.scratch = acts.lora_scratch;  // the low-rank paths run one after another
    d.r = lora_r;
    d.scale = lora_scale;
  }
  be->quant_projections_forward(q, n, in, T);
}

// Under dropout the low-rank path saw x = in * mask / (1 - p): dA, dB from x (the mask drawn
// again), and its input gradient (du A) * mask / (1 - p) added to din.
void Model::Impl::linear_backward(float* din, size_t w, const LoraSlot& s, const float* dout, const float* in,
                                  const Acts& acts, int T, int IN, int OUT) const {
  if (is_quant(w))  // a quantized base is frozen (check_trainable_base): its input gradient only
    be->quant_matmul_backward_input(din, dout, qw(w), T);
  else if (lora)
    be->matmul_backward_input(din, dout, P() + w, T, IN, OUT);
  else
    be->matmul_backward(din, G() + w, dout, in, P() + w, T, IN, OUT);
  if (!s.on) return;
  const size_t n = static_cast<size_t>(T) * IN;
  if (!dropout_applies(s, acts) || !acts.lora_dx) {
    be->lora_backward(din, LG() + s.a, LG() + s.b, dout, in, LP() + s.a, LP() + s.b, acts.lora_scratch, T, IN, OUT,
                      lora_r, lora_scale);
    return;
  }
  const float* x = lora_input(in, s, acts, n);
  float* dx = din ? acts.lora_dx : nullptr;
  if (dx) be->zero(dx, n);
  be->lora_backward(dx, LG() + s.a, LG() + s.b, dout, x, LP() + s.a, LP() + s.b, acts.lora_scratch, T, IN, OUT,
                    lora_r, lora_scale);
  if (!dx) return;
  be->lora_dropout(dx, dx, n, cfg.lora.dropout, mix_seed(dropout_seed, s.a));
  be->add(din, din, dx, n);
}

// ---- the public accessors of the two arenas -------------------------------------------------------

Status Model::enable_lora(const LoraConfig& lora, uint64_t seed) { return impl_->enable_lora(lora, seed); }
bool Model::lora_enabled() const { return impl_->lora; }
void Model::set_lora_dropout(bool on, uint64_t seed) {
  impl_->dropout_armed = on && impl_->lora && impl_->cfg.lora.dropout > 0;
  impl_->dropout_seed = seed;
}
const std::vector<TensorSpec>& Model::base_tensors() const { return impl_->table; }
const TensorSpec* Model::find_base_tensor(std::string_view name) const {
  for (const auto& t : impl_->table)
    if (t.name == name) return &t;
  return nullptr;
}
std::span<const float> Model::base_params() const {
  Impl& m = *impl_;
  if (!m.mirrored) return {m.P(), m.n_params};
  m.pull(m.params, m.host_params, &m.params_device_newer);
  return m.host_params;
}
Status Model::set_base_params(std::span<const float> flat) {
  Impl& m = *impl_;
  if (flat.size() != m.n_params)
    return invalid_input("set_base_params: got " + std::to_string(flat.size()) + " floats, the base model has " +
                         std::to_string(m.n_params));
  ++m.params_writes;
  m.host_params.settle();  // no copy into the mirror is still reading the arena written below
  m.be->copy_host_to_device(m.params.floats(), flat.data(), flat.size_bytes());
  m.weights_written(m.params);
  if (m.mirrored) {
    if (flat.data() != m.host_params.data()) std::copy(flat.begin(), flat.end(), m.host_params.begin());
    m.params_host_newer = m.params_device_newer = false;
  }
  return m.sync_head_quant();  // a quantized base's sampling head follows its weights
}

}  // namespace troupe::policy
