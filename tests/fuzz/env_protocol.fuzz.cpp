// Fuzz target: the remote env protocol's JSON (envs/PROTOCOL.md, envs/src/env_json.cpp, server.cpp,
// env_spec.cpp). The input is one message's text: read as a reply the way the client reads one
// (observation, step and verify results, hello), answered as a request by EnvRequestHandler over
// the built-in arithmetic env, and read as an env spec. The server must always answer {"ok": ...}.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "fuzz_input.h"
#include "troupe/envs/client.h"
#include "troupe/envs/remote.h"

namespace {

using namespace troupe::envs;

std::unique_ptr<EnvRequestHandler> make_handler() {
  auto spec = parse_env_spec({{"name", "arithmetic"}}, "fuzz");
  if (!spec.ok()) std::abort();
  auto local = make_env_client(*spec);
  if (!local.ok()) std::abort();
  return std::make_unique<EnvRequestHandler>(std::move(local).value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<EnvRequestHandler> server = make_handler();
  const json j = json::parse(troupe::fuzz::as_text(data, size), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  const json& result = j.is_object() && j.contains("result") ? j["result"] : j;
  (void)observation_from_json(result, "fuzz");
  (void)step_result_from_json(result, "fuzz");
  (void)verify_result_from_json(result, "fuzz");
  (void)env_info_from_json(result, "fuzz");
  (void)parse_env_spec(j, "fuzz");
  if (j.is_array()) (void)parse_env_specs(j, "fuzz");
  const json reply = server->handle(j);
  if (!reply.is_object() || !reply.contains("ok")) std::abort();  // every request gets an answer
  if (server->shutdown_requested()) server = make_handler();
  return 0;
}
