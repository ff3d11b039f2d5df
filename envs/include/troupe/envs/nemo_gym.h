// NeMo Gym resource servers as troupe envs (`type: nemo_gym`): the task rows, the prompt the model
// sees, and the Responses-API-shaped output the server's /verify reads. The HTTP client that speaks
// the resource-server contract (session cookie, /seed_session, POST /<tool>, /verify,
// /aggregate_metrics) is src/client_nemo_gym.cpp; these pure parts are here so they can be tested
// without a server. See envs/README.md, section "NeMo Gym resource servers".
#pragma once

#include <string>
#include <vector>

#include "troupe/envs/env.h"

namespace troupe::envs::nemo_gym {

// The settings under `config:` of a nemo_gym env.
struct Settings {
  std::string data;            // JSONL of task rows (train; also eval when eval_data is empty)
  std::string eval_data;       // JSONL of held-out rows (optional)
  double eval_fraction = 0.2;  // without eval_data: share of `data` rows held out (by a hash of the row)
  int max_turns = 8;           // model turns per episode; the episode is verified after the last
  json server_config = json::object();  // the server's own config fields: a server troupe starts gets
                                        // them as JSON in $TROUPE_NEMO_GYM_SERVER_CONFIG
};
// Reads `config` (unknown keys are errors naming `where`); relative paths start at config.base_dir.
Result<Settings> read_settings(const json& config, const std::string& where);

// One task row: the JSON object the server gets in /seed_session and /verify.
struct Task {
  json row;
  std::string canonical;  // the row's compact JSON (the split hash reads it)
};

// The rows of one JSONL file; each must be an object whose responses_create_params.input is a
// string or a list of messages ({role, content}); a bad row is an error naming FILE:LINE.
Result<std::vector<Task>> load_tasks(const std::string& path);
// The train and eval rows the settings select (disjoint: with eval_data, train rows equal to an
// eval row are dropped; without, rows are split by in_eval_bucket(canonical, eval_fraction)).
struct Splits {
  std::vector<Task> train, eval;
};
Result<Splits> load_splits(const Settings& s, const std::string& where);

// The tools a row offers (responses_create_params.tools of type function), as ToolSpecs.
std::vector<ToolSpec> tools_of(const json& row);
// The prompt: the row's messages (system/developer, user, ...) as text, then the tools and how to
// call them (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, as envs/README.md documents);
// the same messages as chat messages, the tools paragraph appended to the last one.
Observation observation_of(const json& row);

// The output items of one episode, in the Responses API's shapes.
class Output {
 public:
  // Adds a model turn: its text outside <tool_call> blocks as an assistant message, and each call
  // as a function_call item. Returns the calls (malformed ones with ok=false); `call_ids` gets the
  // call_id of each.
  std::vector<ToolCall> add_turn(const std::string& turn, std::vector<std::string>& call_ids);
  // Adds the answer to one call (function_call_output).
  void add_tool_output(const std::string& call_id, const std::string& output);
  const json& items() const { return items_; }
  // The whole response object /verify expects (id, created_at, model, object, output, tools, ...).
  json response(const json& row) const;

 private:
  json items_ = json::array();
  int next_ = 0;
};

// The /verify request body: the row's fields with `response` added.
json verify_body(const json& row, const json& response);
// Reads a /verify answer: `reward` (a number, required) and `reward_components` (optional
// {name: number}); other numeric or boolean top-level fields the row did not carry go to info.
Result<VerifyResult> read_verify(const json& answer, const json& row, const std::string& where);

}  // namespace troupe::envs::nemo_gym
