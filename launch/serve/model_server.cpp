// open_model_server (model_server.h): loads the model, checks it has a tokenizer and that
// --max-context fits it, and builds the serving engine and the HTTP server over them.
#include "troupe/serve/model_server.h"

#include <algorithm>
#include <filesystem>

#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_io.h"

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

}  // namespace

Result<ModelServer> open_model_server(const ModelServerOptions& o) {
  TROUPE_ASSIGN_OR_RETURN(auto loaded, io::load_model(o.path));
  if (!loaded.tokenizer)
    return invalid_input(o.path + ": troupe serve needs a tokenizer (tokenizer.json or troupe_tokenizer.json)");
  TROUPE_ASSIGN_OR_RETURN(auto tmpl, io::load_chat_template_dir(o.path));
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
  std::shared_ptr<const io::Tokenizer> tok(std::move(loaded.tokenizer));
  TROUPE_ASSIGN_OR_RETURN(auto engine,
                          actors::ServeEngine::create(std::make_unique<policy::Model>(std::move(loaded.model)), eo));
  OpenAiServerOptions so;
  so.model_name = o.name.empty() ? default_name(o.path) : o.name;
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
  out.server = std::make_unique<OpenAiServer>(std::move(engine), tok, tmpl, bos, eos, so);
  return out;
}

}  // namespace troupe::serve
