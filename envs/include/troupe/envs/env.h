// The Env API: what every troupe environment implements (built-in C++ class, .so plug-in via the
// C ABI, or a remote process via the JSON protocol). One Env object runs one episode at a time;
// verify() is stateless (scores a completion from the prompt's metadata) and may be called any time.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::envs {

using json = nlohmann::json;

// One chat message (OpenAI-style roles: system, user, assistant, tool).
struct Message {
  std::string role;
  std::string content;
};

// A tool an env exposes to the model. `parameters` is a JSON-schema-like object
// ({"type":"object","properties":{...},"required":[...]}).
struct ToolSpec {
  std::string name;
  std::string description;
  json parameters = json::object();
};

// A tool call parsed from model output (see tools.h for the syntax) and its result.
struct ToolCall {
  std::string name;
  json arguments = json::object();
  std::string result;  // filled by the env after it runs the call
  bool ok = true;      // false: the call was malformed or the tool failed (result says why)
};

// What the model sees at the start of an episode or after a turn.
struct Observation {
  std::string text;                  // the prompt (or feedback) as plain text
  std::vector<Message> messages;     // the same as chat messages; may be empty for text-only envs
  json metadata = json::object();    // ground truth etc.: "answer", "reference_completion", ...
};

// Which half of the env's instance space an episode comes from. Every env keeps the two disjoint.
enum class Split { train, eval };
const char* split_name(Split s);
Result<Split> parse_split(const std::string& s);

struct ResetOptions {
  Split split = Split::train;
  json extra = json::object();  // env-specific options, passed through unchanged
};

// Reward and its parts (e.g. {"correct": 1, "format": 0.1}); `reward` is the aggregate used for training.
struct VerifyResult {
  double reward = 0;
  std::map<std::string, double> components;
  json info = json::object();
};

struct StepResult {
  Observation observation;  // feedback for the next turn (empty text when done)
  double reward = 0;
  std::map<std::string, double> components;
  bool done = false;
  json info = json::object();  // "tool_calls": [...] when the turn called tools, "termination": ...
};

struct EnvInfo {
  std::string name;
  std::string version = "1";
  bool multi_turn = false;
  int max_turns = 1;
  std::vector<ToolSpec> tools;
};

// The interface. Calls return errors as values; an env must not throw across this boundary
// (the in-process wrappers catch and convert anyway). Lifecycle:
//   setup() once per actor (load data, start sandboxes) ... teardown() once at the end;
//   per episode: reset() acquires what the episode needs, step()* until done, release() always
//   (also after a failed or abandoned episode) frees it.
class Env {
 public:
  virtual ~Env() = default;
  virtual EnvInfo info() const = 0;
  virtual Status setup() { return {}; }
  virtual void teardown() {}
  virtual Result<Observation> reset(uint64_t seed, const ResetOptions& options) = 0;
  virtual Result<StepResult> step(const std::string& action) = 0;
  virtual Result<VerifyResult> verify(const json& metadata, const std::string& completion) = 0;
  virtual void release() {}
};

// ---- JSON forms (shared by the remote protocol, the C ABI and trajectories; see PROTOCOL.md) ----
json to_json(const Message& m);
json to_json(const ToolSpec& t);
json to_json(const ToolCall& c);
json to_json(const Observation& o);
json to_json(const VerifyResult& v);
json to_json(const StepResult& s);
json to_json(const EnvInfo& e);
json to_json(const ResetOptions& r);
// Parsers name the offending field in their error (`where` prefixes it, e.g. "plugin foo.so: reset").
Result<Observation> observation_from_json(const json& j, const std::string& where);
Result<VerifyResult> verify_result_from_json(const json& j, const std::string& where);
Result<StepResult> step_result_from_json(const json& j, const std::string& where);
Result<EnvInfo> env_info_from_json(const json& j, const std::string& where);
Result<ResetOptions> reset_options_from_json(const json& j, const std::string& where);
Result<ToolSpec> tool_spec_from_json(const json& j, const std::string& where);
Result<ToolCall> tool_call_from_json(const json& j, const std::string& where);

// A stable 64-bit FNV-1a hash. Built-ins put an instance in the eval split iff
// fnv1a(canonical instance text) % 1000 < eval_permille, so the splits never overlap.
uint64_t fnv1a(const std::string& s);
bool in_eval_bucket(const std::string& canonical, int eval_permille);

}  // namespace troupe::envs
