// policy.golden: the model end to end against PyTorch. Runs tests/golden/make_golden.py (Debian
// torch) into a temp dir, loads each fixture's weights into a troupe Model by Hugging Face name,
// and compares logits, log-probs, entropies, the loss, EVERY gradient and the losses of several
// AdamW steps (test-local AdamW, same formula as torch.optim.AdamW); once on the plain path and once
// with every training-optimization switch flipped (checkpointing + offload, masked MoE loop, per-layer metadata).
// Exits 1 on any mismatch.
// Tolerances (fp32 vs fp32, different summation order): per tensor
//   max |ours - ref| <= atol + rtol * max|ref|  with logits/logp/entropy atol 1e-5 rtol 1e-4,
//   gradients atol 1e-5 rtol 1e-3, losses |d| <= 1e-4 * max(1, |ref|) (AdamW steps: 1e-3).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "troupe/base/build_config.h"
#include "troupe/policy/model.h"

using nlohmann::json;
using namespace troupe::policy;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("[%s] %s\n", ok ? " ok " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// Compares a tensor; prints the worst element either way.
void compare(const std::string& name, const float* ours, const std::vector<double>& ref, double atol, double rtol) {
  double max_ref = 0, worst = 0;
  size_t at = 0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  bool nan = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ours[i])) nan = true;
    const double d = std::fabs(ours[i] - ref[i]);
    if (d > worst) worst = d, at = i;
  }
  const double tol = atol + rtol * max_ref;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-55s max|d| %.3g at %zu (ours %.6g ref %.6g) tol %.3g", name.c_str(), worst, at,
                ref.empty() ? 0.0 : ours[at], ref.empty() ? 0.0 : ref[at], tol);
  check(!nan && worst <= tol, buf);
}

ModelConfig config_from(const json& j) {
  ModelConfig c;
  c.family = *troupe::enum_from_name<troupe::policy::ModelFamily>(j["family"].get<std::string>());
  c.vocab_size = j["vocab_size"];
  c.hidden_size = j["hidden_size"];
  c.num_hidden_layers = j["num_hidden_layers"];
  c.num_attention_heads = j["num_attention_heads"];
  c.num_key_value_heads = j["num_key_value_heads"];
  c.head_dim = j["head_dim"];
  c.intermediate_size = j["intermediate_size"];
  c.num_experts = j["num_experts"];
  c.num_experts_per_tok = j["num_experts_per_tok"];
  c.moe_intermediate_size = j["moe_intermediate_size"];
  c.norm_topk_prob = j["norm_topk_prob"];
  c.shared_expert_intermediate_size = j["shared_expert_intermediate_size"];
  c.mlp_only_layers = j["mlp_only_layers"].get<std::vector<int>>();
  c.rope_theta = j["rope_theta"];
  c.rms_norm_eps = j["rms_norm_eps"];
  c.tie_word_embeddings = j["tie_word_embeddings"];
  c.router_aux_loss_coef = j["router_aux_loss_coef"];
  return c;
}

// loss = sum dlogp*logp + dentropy*entropy + aux, with grads accumulated into a zeroed arena.
double loss_and_grads(Model& m, const PackedBatch& b, float temp, const std::vector<float>& dlogp,
                      const std::vector<float>& dent, std::vector<float>* logp, std::vector<float>* ent) {
  const size_t T = b.tokens.size();
  logp->assign(T, 0);
  ent->assign(T, 0);
  m.zero_grads();
  auto st = m.forward_train(b, temp, logp->data(), ent->data());
  if (!st.ok()) {
    check(false, "forward_train: " + st.error().message);
    return NAN;
  }
  double L = m.last_aux_loss();
  for (size_t t = 0; t < T; ++t) L += static_cast<double>(dlogp[t]) * (*logp)[t] + static_cast<double>(dent[t]) * (*ent)[t];
  auto bs = m.backward_train(dlogp.data(), dent.data());
  if (!bs.ok()) check(false, "backward_train: " + bs.error().message);
  return L;
}

void run_fixture(const std::string& path, const std::string& tag, bool switches) {
  std::ifstream f(path);
  if (!f) {
    check(false, "cannot open fixture " + path);
    return;
  }
  json j = json::parse(f);
  ModelConfig cfg = config_from(j["config"]);
  if (switches) {  // the same numbers through the optimized paths: per-layer metadata, recompute, offload
    cfg.cache_packed_metadata = false;
    cfg.activation_checkpointing = true;
    cfg.offload_activations = true;
    cfg.moe_grouped = false;
  }
  auto created = Model::create(cfg, 0);
  if (!created.ok()) {
    check(false, tag + ": create: " + created.error().message);
    return;
  }
  Model m = std::move(created.value());
  // Weights by name; every tensor of our table must be in the fixture with the same shape.
  size_t loaded = 0;
  for (const auto& t : m.tensors()) {
    if (!j["weights"].contains(t.name)) {
      check(false, tag + ": fixture lacks " + t.name);
      continue;
    }
    auto shape = j["shapes"][t.name].get<std::vector<int64_t>>();
    if (shape != t.shape) {
      check(false, tag + ": shape mismatch for " + t.name);
      continue;
    }
    auto w = j["weights"][t.name].get<std::vector<double>>();
    for (size_t i = 0; i < w.size(); ++i) m.params()[t.offset + i] = static_cast<float>(w[i]);
    ++loaded;
  }
  check(loaded == j["weights"].size(), tag + ": all " + std::to_string(j["weights"].size()) + " fixture tensors loaded (" +
                                           std::to_string(loaded) + ")");
  PackedBatch b;
  b.tokens = j["tokens"].get<std::vector<int32_t>>();
  b.targets = j["targets"].get<std::vector<int32_t>>();
  b.cu_seqlens = j["cu_seqlens"].get<std::vector<int32_t>>();
  const float temp = j["temperature"].get<float>();
  auto dl = j["dlogp"].get<std::vector<float>>(), de = j["dentropy"].get<std::vector<float>>();
  const size_t T = b.tokens.size();
  const int V = cfg.vocab_size;

  std::vector<float> logits(T * V);
  auto st = m.forward_logits(b, logits.data());
  check(st.ok(), tag + ": forward_logits");
  compare(tag + ": logits", logits.data(), j["logits"].get<std::vector<double>>(), 1e-5, 1e-4);

  std::vector<float> logp, ent;
  const double L = loss_and_grads(m, b, temp, dl, de, &logp, &ent);
  compare(tag + ": logp", logp.data(), j["logp"].get<std::vector<double>>(), 1e-5, 1e-4);
  compare(tag + ": entropy", ent.data(), j["entropy"].get<std::vector<double>>(), 1e-5, 1e-4);
  const double ref_aux = j["aux_loss"], ref_loss = j["loss"];
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: aux loss ours %.7g ref %.7g", tag.c_str(), m.last_aux_loss(), ref_aux);
  check(std::fabs(m.last_aux_loss() - ref_aux) <= 1e-6 + 1e-4 * std::fabs(ref_aux), buf);
  std::snprintf(buf, sizeof buf, "%s: loss ours %.7g ref %.7g", tag.c_str(), L, ref_loss);
  check(std::fabs(L - ref_loss) <= 1e-4 * std::max(1.0, std::fabs(ref_loss)), buf);
  for (const auto& t : m.tensors())
    if (j["grads"].contains(t.name))
      compare(tag + ": grad " + t.name, m.grads().data() + t.offset, j["grads"][t.name].get<std::vector<double>>(), 1e-5,
              1e-3);

  // AdamW steps on the flat arenas (tied weights are one tensor, as in torch).
  const auto& A = j["adamw"];
  const double lr = A["lr"], b1 = A["beta1"], b2 = A["beta2"], eps = A["eps"], wd = A["weight_decay"];
  auto ref_losses = A["losses"].get<std::vector<double>>();
  const size_t P = m.params().size();
  std::vector<double> mom(P, 0), var(P, 0);
  for (size_t step = 0; step < ref_losses.size(); ++step) {
    const double Ls = loss_and_grads(m, b, temp, dl, de, &logp, &ent);
    std::snprintf(buf, sizeof buf, "%s: loss before AdamW step %zu ours %.7g ref %.7g", tag.c_str(), step, Ls,
                  ref_losses[step]);
    check(std::fabs(Ls - ref_losses[step]) <= 1e-3 * std::max(1.0, std::fabs(ref_losses[step])), buf);
    if (step + 1 == ref_losses.size()) break;
    const double bc1 = 1 - std::pow(b1, step + 1), bc2 = 1 - std::pow(b2, step + 1);
    auto p = m.params();
    auto g = m.grads();
    for (size_t i = 0; i < P; ++i) {
      double x = p[i] * (1 - lr * wd);
      mom[i] = b1 * mom[i] + (1 - b1) * g[i];
      var[i] = b2 * var[i] + (1 - b2) * static_cast<double>(g[i]) * g[i];
      x -= (lr / bc1) * mom[i] / (std::sqrt(var[i]) / std::sqrt(bc2) + eps);
      p[i] = static_cast<float>(x);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Fixture directory: argv[1] if given (pre-made fixtures), else regenerate with the script.
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else {
    dir = (std::filesystem::temp_directory_path() / ("troupe_golden_" + std::to_string(::getpid()))).string();
    const std::string cmd = "OPENBLAS_NUM_THREADS=1 '" + troupe::python_executable() + "' '" TROUPE_SOURCE_DIR
                            "/tests/golden/make_golden.py' '" + dir + "'";
    std::printf("running: %s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) {
      std::printf("FAIL: the PyTorch reference script did not run (is torch installed for %s?)\n",
                  troupe::python_executable().c_str());
      return 1;
    }
  }
  for (bool switches : {false, true})
    for (const char* tag : {"qwen3_moe", "mixtral"})
      run_fixture(dir + "/golden_" + tag + ".json", std::string(tag) + (switches ? "+ckpt+offload+masked+nocache" : ""),
                  switches);
  if (argc <= 1) std::filesystem::remove_all(dir);
  std::printf("%s (%d failures)\n", failures == 0 ? "golden: all checks passed" : "GOLDEN MISMATCH", failures);
  return failures == 0 ? 0 : 1;
}
