// YAML `policy.lora.targets` kinds <-> PEFT module names, per family (peft_adapter.h). Invariant: a
// kind maps to the module names PEFT's target_modules uses for it in that family, and back.
#include <algorithm>
#include <set>

#include "troupe/base/enum_names.h"
#include "troupe/policy/io/peft_adapter.h"

namespace troupe::policy::io {

namespace {

bool has_dense_mlp(ModelFamily f) { return f != ModelFamily::mixtral; }

std::vector<std::string> names_of_kind(ModelFamily f, const std::string& kind) {
  if (kind == "q") return {"q_proj"};
  if (kind == "k") return {"k_proj"};
  if (kind == "v") return {"v_proj"};
  if (kind == "o") return {"o_proj"};
  if (kind == "gate") return has_dense_mlp(f) ? std::vector<std::string>{"gate_proj"} : std::vector<std::string>{};
  if (kind == "up") return has_dense_mlp(f) ? std::vector<std::string>{"up_proj"} : std::vector<std::string>{};
  if (kind == "down") return has_dense_mlp(f) ? std::vector<std::string>{"down_proj"} : std::vector<std::string>{};
  if (kind == "experts") {
    if (f == ModelFamily::mixtral) return {"w1", "w2", "w3"};
    if (is_moe_family(f)) return {"down_proj", "gate_proj", "up_proj"};
    return {};
  }
  return {};
}

const std::vector<std::string>& all_kinds() {
  static const std::vector<std::string> k = {"q", "k", "v", "o", "gate", "up", "down", "experts"};
  return k;
}

}  // namespace

Result<std::vector<std::string>> peft_target_modules(ModelFamily family, const std::vector<std::string>& kinds) {
  std::set<std::string> out;
  for (const std::string& kind : kinds) {
    if (kind == "all_linear") {
      for (const auto& k : all_kinds())
        for (auto& n : names_of_kind(family, k)) out.insert(n);
      continue;
    }
    if (std::find(all_kinds().begin(), all_kinds().end(), kind) == all_kinds().end())
      return invalid_input("LoRA target '" + kind + "' is unknown (choices: q, k, v, o, gate, up, down, experts, all_linear)");
    auto names = names_of_kind(family, kind);
    if (names.empty())
      return invalid_input(std::string("LoRA target '") + kind + "' has no module in family " +
                           std::string(enum_name(family)) + (kind == "experts" ? " (it has no experts)" : " (its FFN layers are experts: use 'experts')"));
    out.insert(names.begin(), names.end());
  }
  return std::vector<std::string>(out.begin(), out.end());
}

std::string lora_kind_of_module(ModelFamily family, std::string_view module) {
  const size_t dot = module.rfind('.');
  const std::string_view leaf = dot == std::string_view::npos ? module : module.substr(dot + 1);
  const std::string_view parent = dot == std::string_view::npos ? std::string_view{} : module.substr(0, dot);
  const bool in_attn = parent.size() >= 9 && parent.substr(parent.size() - 9) == "self_attn";
  if (in_attn) {
    if (leaf == "q_proj") return "q";
    if (leaf == "k_proj") return "k";
    if (leaf == "v_proj") return "v";
    if (leaf == "o_proj") return "o";
    return "";
  }
  const bool in_experts = parent.find(".experts.") != std::string_view::npos;
  if (in_experts) {
    if (family == ModelFamily::mixtral) return (leaf == "w1" || leaf == "w2" || leaf == "w3") ? "experts" : "";
    if (is_moe_family(family) && (leaf == "gate_proj" || leaf == "up_proj" || leaf == "down_proj")) return "experts";
    return "";
  }
  const bool in_mlp = parent.size() >= 4 && parent.substr(parent.size() - 4) == ".mlp";
  if (in_mlp && has_dense_mlp(family)) {
    if (leaf == "gate_proj") return "gate";
    if (leaf == "up_proj") return "up";
    if (leaf == "down_proj") return "down";
  }
  return "";
}

}  // namespace troupe::policy::io
