// `troupe serve`'s server (launch/serve/model_server.cpp): a model directory, troupe checkpoint or
// .gguf, with its tokenizer and chat template, behind an OpenAiServer whose one ServeEngine batches
// every request in flight. Errors are values naming the path or the option at fault.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/execution_options.h"
#include "troupe/serve/openai_server.h"

namespace troupe::serve {

struct ModelServerOptions {
  std::string path;  // model directory, checkpoint or .gguf file
  std::string name;  // the model id requests name ("": the directory's or file's name)
  // path may be an adapter directory (LoRA checkpoint or PEFT adapter): applied on its base, `base`
  // when given, else its base.json's path.
  std::string base;
  // --base-dtype: how the (base) model holds its linear weights (policy.base_dtype's names; "": an
  // adapter directory's base.json base_dtype, else fp32); load_for_sampling.
  std::string base_dtype;
  // --adapter NAME=DIR: adapters served beside the base (path must be a model, not an adapter); a
  // request's `model` NAME samples with DIR's adapter.
  std::vector<std::pair<std::string, std::string>> adapters;
  int max_batch = 16, max_context = 0, prefill_tokens = 4096, threads = 0, http_threads = 0;
  // The HTTP limits (OpenAiServerOptions; docs/serving.md has each flag and its default).
  std::vector<std::string> api_keys;  // empty: no authentication
  int max_tokens_cap = 4096;
  int max_prompt_tokens = 0;          // 0: the context
  size_t max_body_bytes = 8u << 20;
  int max_queue = 64;
  double request_timeout_s = 600;
};

struct ModelServer {
  std::unique_ptr<OpenAiServer> server;  // not bound yet
  std::string model_name;
  int slots = 0;
  int context = 0;  // tokens per sequence
  policy::BaseDtype base_dtype = policy::BaseDtype::fp32;  // how the loaded (base) model holds its linear weights
};

Result<ModelServer> open_model_server(const ModelServerOptions& o);

}  // namespace troupe::serve
