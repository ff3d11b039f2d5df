// Example env plug-in (C ABI, troupe/env_plugin.h): "reverse" asks the model to reverse a word and
// scores exact match. It links nothing of troupe's: only the C header and a JSON library.
// Build: c++ -shared -fPIC -I envs/include reverse_plugin.cpp -o libreverse_env.so
#include <troupe/env_plugin.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace {

using nlohmann::json;

struct ReverseEnv {
  int min_len = 3, max_len = 6;
  std::string word;  // current episode's word
};

char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

int fail(char** out, const std::string& msg) {
  *out = dup(msg);
  return 1;
}

json score(const std::string& word, const char* completion) {
  std::string want(word.rbegin(), word.rend());
  std::string got = completion;
  while (!got.empty() && std::isspace(static_cast<unsigned char>(got.back()))) got.pop_back();
  while (!got.empty() && std::isspace(static_cast<unsigned char>(got.front()))) got.erase(got.begin());
  double r = got == want ? 1.0 : 0.0;
  return {{"reward", r}, {"components", {{"correct", r}}}};
}

int p_create(const char* config_json, troupe_env** out_env, char** out_error) {
  json cfg = json::parse(config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return fail(out_error, "config must be a JSON object");
  auto* env = new ReverseEnv();
  env->min_len = cfg.value("min_len", 3);
  env->max_len = cfg.value("max_len", 6);
  if (env->min_len < 1 || env->max_len < env->min_len) {
    delete env;
    return fail(out_error, "need 1 <= min_len <= max_len");
  }
  *out_env = reinterpret_cast<troupe_env*>(env);
  return 0;
}

void p_destroy(troupe_env* env) { delete reinterpret_cast<ReverseEnv*>(env); }

int p_info(troupe_env*, char** out) {
  *out = dup(json{{"name", "reverse"}, {"version", "1.0"}, {"multi_turn", false}, {"max_turns", 1}}.dump());
  return 0;
}

int p_reset(troupe_env* handle, uint64_t seed, const char* options_json, char** out) {
  auto* env = reinterpret_cast<ReverseEnv*>(handle);
  json opts = json::parse(options_json, nullptr, false);
  bool eval = opts.is_object() && opts.value("split", "train") == "eval";
  // Train and eval words come from different letter halves: the splits never overlap.
  std::mt19937_64 rng(seed * 2 + (eval ? 1 : 0));
  int len = env->min_len + static_cast<int>(rng() % static_cast<uint64_t>(env->max_len - env->min_len + 1));
  env->word.clear();
  for (int i = 0; i < len; ++i) env->word += static_cast<char>((eval ? 'n' : 'a') + rng() % 13);
  std::string reversed(env->word.rbegin(), env->word.rend());
  json obs = {{"text", "Reverse the word: " + env->word + "\n"},
              {"metadata", {{"word", env->word}, {"answer", reversed}, {"reference_completion", reversed}}}};
  *out = dup(obs.dump());
  return 0;
}

int p_step(troupe_env* handle, const char* action, char** out) {
  auto* env = reinterpret_cast<ReverseEnv*>(handle);
  if (env->word.empty()) return fail(out, "step before reset");
  json r = score(env->word, action);
  r["done"] = true;
  *out = dup(r.dump());
  return 0;
}

int p_verify(troupe_env*, const char* metadata_json, const char* completion, char** out) {
  json meta = json::parse(metadata_json, nullptr, false);
  if (!meta.is_object() || !meta.contains("word") || !meta["word"].is_string()) return fail(out, "metadata needs 'word'");
  *out = dup(score(meta["word"].get<std::string>(), completion).dump());
  return 0;
}

void p_release(troupe_env* handle) { reinterpret_cast<ReverseEnv*>(handle)->word.clear(); }

void p_free(char* s) { std::free(s); }

const troupe_env_plugin kTable = {
    TROUPE_ENV_PLUGIN_ABI_VERSION, sizeof(troupe_env_plugin), "reverse", "1.0",
    p_create, p_destroy, p_info, p_reset, p_step, p_verify, p_release, p_free,
};

}  // namespace

extern "C" TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin* troupe_env_plugin_init(uint32_t host_abi_version) {
  return host_abi_version == TROUPE_ENV_PLUGIN_ABI_VERSION ? &kTable : nullptr;
}
