// `troupe generate` and `troupe score`: sample from / score with a model directory (docs/architecture.md).
// Both load any model directory (ours or transformers-made) through policy::io::load_model; a bad
// directory is exit 2 with a message naming the file. score's LAST stdout line is its JSON result.
// generate --messages renders a conversation with the directory's chat template (policy/io/chat_template.h).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "troupe/launch/commands.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/serve/lora_adapters.h"

namespace troupe::launch {
namespace {

namespace io = troupe::policy::io;

Result<std::vector<int32_t>> parse_token_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return invalid_input("--tokens: empty entry in \"" + s + "\" (expected e.g. 1,2,3)");
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      return invalid_input("--tokens: \"" + item + "\" is not a token id (expected non-negative integers, e.g. 1,2,3)");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

// --base-dtype's value, or none when the flag is not given (the adapter's base.json, else fp32).
Result<std::optional<policy::BaseDtype>> base_dtype_flag(const std::string& name) {
  if (name.empty()) return std::optional<policy::BaseDtype>{};
  TROUPE_ASSIGN_OR_RETURN(auto d, serve::parse_base_dtype(name));
  return std::optional<policy::BaseDtype>{d};
}

// DIR (an adapter directory: on its base) with its base's linear weights as --base-dtype says.
Result<serve::LoadedForSampling> open_for_sampling(const std::string& dir, const std::string& base,
                                                   const std::string& base_dtype) {
  TROUPE_ASSIGN_OR_RETURN(auto d, base_dtype_flag(base_dtype));
  return serve::load_for_sampling(dir, base, d);
}

int run_score(const std::string& dir, const std::string& base, const std::string& base_dtype,
              const std::string& tokens_arg, const std::string& text, bool have_tokens, bool have_text) {
  if (have_tokens == have_text) return report_error(invalid_input("troupe score: give exactly one of --tokens or --text"));
  auto opened = open_for_sampling(dir, base, base_dtype);
  if (!opened.ok()) return report_error(opened.error());
  io::LoadedModel* loaded = &opened->loaded;
  std::vector<int32_t> tokens;
  if (have_tokens) {
    auto t = parse_token_list(tokens_arg);
    if (!t.ok()) return report_error(t.error());
    tokens = std::move(t).value();
  } else {
    if (!loaded->tokenizer)
      return report_error(invalid_input(dir + ": --text needs a tokenizer (tokenizer.json or troupe_tokenizer.json); use --tokens"));
    auto t = loaded->tokenizer->encode(text);
    if (!t.ok()) return report_error(invalid_input("--text: " + t.error().message));
    tokens = std::move(t).value();
  }
  auto lp = io::score_tokens(loaded->model, tokens);
  if (!lp.ok()) return report_error(lp.error());
  nlohmann::ordered_json j = {{"tokens", tokens}, {"logprobs", *lp}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

struct GenerateOpts {
  std::string dir, base, base_dtype, prompt, messages;
  int max_tokens = 64;
  double temperature = 1.0;
  uint64_t seed = 0;
  int top_k = 0;
  double top_p = 1.0;
  bool json = false;
};

// --messages FILE: a JSON list of {role, content, ...}, or {"messages": [...], "tools": [...], other
// template variables such as "enable_thinking"}, rendered with the generation prompt.
Result<std::string> render_messages_file(const std::string& dir, const std::string& file, const io::LoadedModel& m) {
  nlohmann::ordered_json j;
  std::ifstream in(file);
  if (!in) return invalid_input("--messages " + file + ": cannot open");
  try {
    j = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_input("--messages " + file + ": not valid JSON: " + e.what());
  }
  nlohmann::ordered_json messages = j;
  io::ChatRenderOptions opts = io::chat_options_for(m.tokenizer.get(), m.bos_token_id, m.eos_token_id);
  if (j.is_object()) {
    if (!j.contains("messages")) return invalid_input("--messages " + file + ": an object needs a \"messages\" list");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "messages") messages = it.value();
      else if (it.key() == "tools") opts.tools = it.value();
      else opts.extra[it.key()] = it.value();
    }
  }
  if (!messages.is_array() || messages.empty())
    return invalid_input("--messages " + file + ": expected a non-empty JSON list of {\"role\", \"content\"}");
  for (const auto& msg : messages)
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      return invalid_input("--messages " + file + ": every message needs a \"role\" string");
  TROUPE_ASSIGN_OR_RETURN(auto tmpl, io::load_chat_template_dir(dir));
  if (!tmpl)
    return invalid_input(dir + ": --messages needs a chat template (tokenizer_config.json \"chat_template\" or chat_template.jinja)");
  opts.add_generation_prompt = true;
  auto text = io::render_chat(*tmpl, messages, opts);
  if (!text.ok()) return invalid_input("--messages " + file + ": " + text.error().message);
  return text;
}

int run_generate(const GenerateOpts& o) {
  if (o.prompt.empty() == o.messages.empty())
    return report_error(invalid_input("troupe generate: give exactly one of --prompt or --messages"));
  auto opened = open_for_sampling(o.dir, o.base, o.base_dtype);  // an adapter directory: applied on its base
  if (!opened.ok()) return report_error(opened.error());
  io::LoadedModel* loaded = &opened->loaded;
  if (!loaded->tokenizer)
    return report_error(invalid_input(opened->model_dir + ": troupe generate needs a tokenizer (tokenizer.json or troupe_tokenizer.json)"));
  std::string prompt_text = o.prompt;
  if (!o.messages.empty()) {  // the template places BOS/EOS itself; encode adds none
    auto r = render_messages_file(opened->model_dir, o.messages, *loaded);
    if (!r.ok()) return report_error(r.error());
    prompt_text = std::move(r).value();
  }
  auto ids = loaded->tokenizer->encode(prompt_text);
  if (!ids.ok()) return report_error(invalid_input((o.messages.empty() ? "--prompt: " : "--messages: ") + ids.error().message));
  std::vector<int32_t> prompt = std::move(ids).value();
  if (prompt.empty()) {
    if (loaded->bos_token_id < 0) return report_error(invalid_input("--prompt is empty and the model has no bos_token_id"));
    prompt.push_back(loaded->bos_token_id);
  }
  policy::SamplingParams sp;
  sp.temperature = static_cast<float>(o.temperature);
  sp.top_k = o.top_k;
  sp.top_p = static_cast<float>(o.top_p);
  sp.max_new_tokens = o.max_tokens;
  sp.seed = o.seed;
  if (loaded->eos_token_id >= 0) sp.stop_tokens.push_back(loaded->eos_token_id);
  auto gen = loaded->model.generate({prompt}, sp);
  if (!gen.ok()) return report_error(gen.error());
  const policy::Generation& g = (*gen)[0];
  auto text = loaded->tokenizer->decode(g.tokens, /*skip_special=*/true);
  if (!text.ok()) return report_error(text.error());
  if (o.json) {
    nlohmann::ordered_json j = {{"prompt_tokens", prompt}, {"tokens", g.tokens}, {"logprobs", g.logprobs},
                        {"text", *text}, {"stopped", g.stopped},
                        {"base_dtype", enum_string(loaded->model.config().base_dtype)}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text->c_str());
  }
  return 0;
}

}  // namespace

void add_base_dtype_option(CLI::App* app, std::string& value) {
  app->add_option("--base-dtype", value,
                  "How the (base) model holds its linear weights, as policy.base_dtype: fp32, bf16, q8_0, q4_k "
                  "(quantized at load) or gguf (a .gguf's own blocks); default: an adapter directory's base.json "
                  "base_dtype, else fp32");
}

Command add_generate_command(CLI::App& root) {
  auto o = std::make_shared<GenerateOpts>();
  auto* app = root.add_subcommand("generate", "Sample a completion from a model directory");
  app->add_option("dir", o->dir,
                  "Model directory (config.json + model.safetensors + tokenizer), or a LoRA checkpoint / PEFT adapter "
                  "directory sampled on its base (base.json's path, or --base)")
      ->required();
  app->add_option("--base", o->base, "The base model of an adapter directory DIR, instead of its base.json's path");
  add_base_dtype_option(app, o->base_dtype);
  auto* p = app->add_option("--prompt", o->prompt, "Prompt text");
  app->add_option("--messages", o->messages,
                  "JSON file: a list of {role, content} (or {messages, tools, ...}) rendered with the model's chat template and the generation prompt")
      ->excludes(p);
  app->add_option("--max-tokens", o->max_tokens, "Most new tokens")->check(CLI::Range(1, 1 << 20));
  app->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  app->add_option("--seed", o->seed, "RNG seed");
  app->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = off)")->check(CLI::Range(0, 1 << 24));
  app->add_option("--top-p", o->top_p, "Nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  app->add_flag("--json", o->json,
                "Print {prompt_tokens, tokens, logprobs, text, stopped, base_dtype} instead of the text");
  return {app, [o]() { return run_generate(*o); }};
}

Command add_score_command(CLI::App& root) {
  struct Opts {
    std::string dir, base, base_dtype, tokens, text;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("score", "Log-prob of each token given those before it, as JSON");
  app->add_option("dir", o->dir, "Model directory, or a LoRA checkpoint / PEFT adapter directory on its base")->required();
  app->add_option("--base", o->base, "The base model of an adapter directory DIR, instead of its base.json's path");
  add_base_dtype_option(app, o->base_dtype);
  auto* t = app->add_option("--tokens", o->tokens, "Comma-separated token ids, e.g. 1,2,3");
  auto* x = app->add_option("--text", o->text, "Text to tokenize (no BOS added) and score");
  t->excludes(x);
  return {app, [o, t, x]() { return run_score(o->dir, o->base, o->base_dtype, o->tokens, o->text, t->count() > 0, x->count() > 0); }};
}

}  // namespace troupe::launch
