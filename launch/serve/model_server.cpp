// open_model_server (model_server.h): loads the model (an adapter directory: on its base), checks the
// --adapter flags before the base loads and each adapter against it after, checks it has a tokenizer
// and that --max-context fits it, and builds the serving engine and the HTTP server over them.
#include "troupe/serve/model_server.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/serve/lora_adapters.h"

namespace troupe::serve {
namespace {

namespace io = troupe::policy::io;

std::string default_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing slash
  std::string name = p.filename().string();
  if (p.extension() == ".gguf") name = p.stem().string();
  return name.empty() ? "troupe" : name;
}

// --adapter NAME=DIR: names unique and not the base's, each DIR an adapter whose own files read
// (the checks against the base follow once it is loaded).
Status check_adapter_flags(const ModelServerOptions& o, const std::string& base_name) {
  if (o.adapters.empty()) return {};
  if (is_adapter_dir(o.path))
    return invalid_input("--adapter: MODEL " + o.path + " is itself an adapter directory; serve its base model with "
                         "--adapter NAME=" + o.path + " instead");
  std::set<std::string> seen;
  for (const auto& [name, dir] : o.adapters) {
    if (name.empty()) return invalid_input("--adapter =" + dir + ": the name is empty (expected NAME=DIR)");
    if (name == base_name)
      return invalid_input("--adapter " + name + "=" + dir + ": '" + name + "' is the base model's name (--model-name)");
    if (!seen.insert(name).second)
      return invalid_input("--adapter " + name + "=" + dir + ": the name '" + name + "' is given twice");
    if (!std::filesystem::is_directory(dir))
      return invalid_input("--adapter " + name + "=" + dir + ": " + dir +
                           " is not a directory (expected a PEFT adapter directory)");
    if (!is_adapter_dir(dir))
      return invalid_input("--adapter " + name + "=" + dir + ": " + dir + " is not a PEFT adapter directory (no " +
                           io::kAdapterConfigFile + ")");
    auto read = io::read_peft_adapter(dir);
    if (!read.ok()) return invalid_input("--adapter " + name + "=" + dir + ": " + read.error().message);
  }
  return {};
}

// Each --adapter checked against the loaded base (its base.json fingerprint, shapes, rank) and added
// as served adapter 1, 2, ... in the order given.
Status add_adapters(const ModelServerOptions& o, policy::Model& model) {
  for (const auto& [name, dir] : o.adapters) {
    auto added = [&]() -> Result<int> {
      TROUPE_ASSIGN_OR_RETURN(auto ref, adapter_base_ref(dir, o.path));
      TROUPE_ASSIGN_OR_RETURN(auto adapter, read_adapter_for(dir, ref, model));
      return add_served_adapter(model, adapter);
    }();
    if (!added.ok()) return invalid_input("--adapter " + name + "=" + dir + ": " + added.error().message);
  }
  return {};
}

}  // namespace

Result<ModelServer> open_model_server(const ModelServerOptions& o) {
  const std::string name = o.name.empty() ? default_name(o.path) : o.name;
  TROUPE_TRY(check_adapter_flags(o, name));
  std::optional<policy::BaseDtype> dtype;
  if (!o.base_dtype.empty()) {
    TROUPE_ASSIGN_OR_RETURN(dtype, parse_base_dtype(o.base_dtype));
  }
  TROUPE_ASSIGN_OR_RETURN(auto opened, load_for_sampling(o.path, o.base, dtype));
  io::LoadedModel& loaded = opened.loaded;
  if (!loaded.tokenizer)
    return invalid_input(opened.model_dir + ": troupe serve needs a tokenizer (tokenizer.json or troupe_tokenizer.json)");
  TROUPE_ASSIGN_OR_RETURN(auto tmpl, io::load_chat_template_dir(opened.model_dir));
  TROUPE_TRY(add_adapters(o, loaded.model));
  actors::ServeEngineOptions eo;
  eo.slots = o.max_batch;
  const int model_ctx = loaded.model.config().max_position_embeddings;
  eo.context = o.max_context > 0 ? o.max_context : std::min(model_ctx, 2048);
  if (o.max_context > model_ctx)
    return invalid_input("--max-context " + std::to_string(o.max_context) + " exceeds the model's " +
                         "max_position_embeddings " + std::to_string(model_ctx));
  eo.prefill_tokens = o.prefill_tokens;
  eo.threads = o.threads;
  const int32_t bos = loaded.bos_token_id, eos = loaded.eos_token_id;
  const policy::BaseDtype base_dtype = loaded.model.config().base_dtype;
  std::shared_ptr<const io::Tokenizer> tok(std::move(loaded.tokenizer));
  TROUPE_ASSIGN_OR_RETURN(auto engine,
                          actors::ServeEngine::create(std::make_unique<policy::Model>(std::move(loaded.model)), eo));
  OpenAiServerOptions so;
  so.model_name = name;
  for (const auto& a : o.adapters) so.adapters.push_back(a.first);
  so.http_threads = o.http_threads;
  so.api_keys = o.api_keys;
  so.max_tokens_cap = o.max_tokens_cap;
  so.max_prompt_tokens = o.max_prompt_tokens;
  so.max_body_bytes = o.max_body_bytes;
  so.max_queue = o.max_queue;
  so.request_timeout_s = o.request_timeout_s;
  so.strict_fields = true;
  ModelServer out;
  out.model_name = so.model_name;
  out.slots = eo.slots;
  out.context = eo.context;
  out.base_dtype = base_dtype;
  out.server = std::make_unique<OpenAiServer>(std::move(engine), tok, tmpl, bos, eos, so);
  return out;
}

}  // namespace troupe::serve
