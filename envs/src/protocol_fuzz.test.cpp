// envs.protocol_fuzz: the remote env protocol's parsers get 200,000 mutated, truncated and random
// messages — replies (observation, step and verify results, hello) read the way the client reads
// them, and requests answered by the server half (EnvRequestHandler over a real built-in env).
// Every one must give a value or an error, never a crash or an escaping exception; the server
// always answers with an object carrying "ok".
#include <gtest/gtest.h>

#include <random>

#include "troupe/envs/client.h"
#include "troupe/envs/remote.h"

using namespace troupe::envs;

namespace {

const char* const kSeeds[] = {
    R"({"ok": true, "id": 1, "result": {"text": "2+3=", "metadata": {"answer": 5}, "messages": [{"role": "user", "content": "hi"}]}})",
    R"({"ok": true, "id": 2, "result": {"observation": "7", "reward": 0.5, "done": false, "info": {"k": [1, 2]}}})",
    R"({"ok": true, "id": 3, "result": {"reward": 1.0, "correct": true, "components": {"format": 1, "answer": 0}}})",
    R"({"ok": true, "id": 4, "result": {"protocol": "troupe.env/1", "env": {"name": "x", "version": "1", "multi_turn": true, "tools": [{"name": "calc", "description": "d", "parameters": {"type": "object"}}]}}})",
    R"({"ok": false, "id": 5, "error": {"code": "invalid_input", "message": "bad"}})",
    R"({"op": "reset", "id": 6, "session": "grpo-1-0", "seed": 17, "options": {"split": "eval"}})",
    R"({"op": "step", "id": 7, "session": "grpo-1-0", "action": "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+2\"}}</tool_call>"})",
    R"({"op": "verify", "id": 8, "completion": "5", "metadata": {"answer": 5, "a": 2, "b": 3}})",
    R"({"op": "release", "id": 9, "session": "grpo-1-0"})",
    R"({"op": "hello", "id": 10})",
};

json random_value(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth > 2 ? 5 : 7)) {
    case 0: return nullptr;
    case 1: return (rng() & 1) != 0;
    case 2: return static_cast<int64_t>(rng());
    case 3: return std::ldexp(static_cast<double>(rng() % 1000) - 500, static_cast<int>(rng() % 2000) - 1000);
    case 4: {
      std::string s(rng() % 12, 'a');
      for (auto& c : s) c = static_cast<char>(rng());
      return s;
    }
    case 5: {
      json a = json::array();
      for (size_t i = 0, n = rng() % 4; i < n; ++i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      const char* keys[] = {"text", "reward", "done", "answer", "op", "session", "seed", "id", "result", "error"};
      for (size_t i = 0, n = rng() % 4; i < n; ++i) o[keys[rng() % 10]] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Replaces one value somewhere in `j` (an object or array) by a random one, or deletes a key.
void mutate_structure(json& j, std::mt19937_64& rng) {
  json* at = &j;
  for (int d = 0; d < 4 && (at->is_object() || at->is_array()) && !at->empty(); ++d) {
    auto it = at->begin();
    std::advance(it, static_cast<long>(rng() % at->size()));
    if (rng() % 3 == 0 || !(it->is_object() || it->is_array())) {
      if (at->is_object() && rng() % 4 == 0) at->erase(it);
      else *it = random_value(rng, d);
      return;
    }
    at = &*it;
  }
  *at = random_value(rng, 0);
}

}  // namespace

TEST(ProtocolFuzz, MutatedMessagesNeverCrash) {
  auto spec = parse_env_spec({{"name", "arithmetic"}}, "t");
  ASSERT_TRUE(spec.ok());
  auto local = make_env_client(*spec);
  ASSERT_TRUE(local.ok());
  EnvRequestHandler server(std::move(local).value());
  std::mt19937_64 rng(20261204);
  int parsed = 0, replies_ok = 0, replies_rejected = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string text = kSeeds[rng() % std::size(kSeeds)];
    const int mode = static_cast<int>(rng() % 4);
    if (mode == 0) {  // flip bytes
      for (int k = 0, n = 1 + static_cast<int>(rng() % 6); k < n; ++k) text[rng() % text.size()] = static_cast<char>(rng());
    } else if (mode == 1) {  // truncate
      text.resize(rng() % text.size());
    } else if (mode == 2) {  // a structural mutation of valid JSON: wrong types, missing keys, odd numbers
      json j = json::parse(text);
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) mutate_structure(j, rng);
      text = j.dump(-1, ' ', false, json::error_handler_t::replace);
    } else {  // random bytes
      text.assign(rng() % 64, '\0');
      for (auto& c : text) c = static_cast<char>(rng());
    }
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) continue;
    ++parsed;
    const json& result = j.is_object() && j.contains("result") ? j["result"] : j;
    for (auto ok : {observation_from_json(result, "fuzz").ok(), step_result_from_json(result, "fuzz").ok(),
                    verify_result_from_json(result, "fuzz").ok(), env_info_from_json(result, "fuzz").ok()})
      ok ? ++replies_ok : ++replies_rejected;
    json reply;
    ASSERT_NO_THROW(reply = server.handle(j)) << text;
    ASSERT_TRUE(reply.is_object() && reply.contains("ok")) << text;
    if (server.shutdown_requested()) server = EnvRequestHandler(make_env_client(*spec).value());
  }
  EXPECT_GT(parsed, 50000);
  EXPECT_GT(replies_rejected, 10000);
  EXPECT_GT(replies_ok, 1000);
}
