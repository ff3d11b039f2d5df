// NeMo Gym task rows, the prompt built from a row, and the Responses-API output of an episode
// (see troupe/envs/nemo_gym.h). No HTTP here.
#include <filesystem>
#include <fstream>
#include <set>

#include "src/config_util.h"
#include "troupe/envs/client.h"
#include "troupe/envs/nemo_gym.h"
#include "troupe/envs/tools.h"

namespace troupe::envs::nemo_gym {

namespace fs = std::filesystem;

Result<Settings> read_settings(const json& config, const std::string& where) {
  detail::ConfigReader r(config, where);
  TROUPE_TRY(r.check_object());
  Settings s;
  TROUPE_ASSIGN_OR_RETURN(s.data, r.string("data", ""));
  TROUPE_ASSIGN_OR_RETURN(s.eval_data, r.string("eval_data", ""));
  TROUPE_ASSIGN_OR_RETURN(s.eval_fraction, r.number("eval_fraction", 0.2, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(int64_t turns, r.integer("max_turns", 8, 1, 1024));
  TROUPE_ASSIGN_OR_RETURN(std::string base, r.string("base_dir", ""));
  if (const json* sc = r.raw("server_config")) {
    if (!sc->is_object()) return invalid_input(where + ": 'server_config' must be a mapping (the server's config fields)");
    s.server_config = *sc;
  }
  TROUPE_TRY(r.finish());
  s.max_turns = static_cast<int>(turns);
  if (s.data.empty()) return invalid_input(where + ": 'data' (a JSONL file of NeMo Gym task rows) is required");
  auto place = [&](std::string& p) {
    if (!p.empty() && !base.empty() && fs::path(p).is_relative()) p = (fs::path(base) / p).lexically_normal().string();
  };
  place(s.data);
  place(s.eval_data);
  return s;
}

namespace {

Status check_messages(const json& input, const std::string& where) {
  if (input.is_string()) return {};
  if (!input.is_array() || input.empty())
    return invalid_input(where + ": responses_create_params.input must be a string or a non-empty list of messages");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& m = input[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
      return invalid_input(where + ": responses_create_params.input[" + std::to_string(i) +
                           "] must be a message with 'role' and 'content'");
  }
  return {};
}

// A message's content as text: a string, or the text of its parts ({type: input_text, text}).
std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array())
    for (const auto& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
  return out;
}

}  // namespace

Result<std::vector<Task>> load_tasks(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_input("cannot read NeMo Gym task rows from '" + path + "'");
  std::vector<Task> out;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(no);
    json row = json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object()) return invalid_input(where + ": not a JSON object");
    auto it = row.find("responses_create_params");
    if (it == row.end() || !it->is_object() || !it->contains("input"))
      return invalid_input(where + ": a NeMo Gym row needs responses_create_params.input");
    TROUPE_TRY(check_messages((*it)["input"], where));
    if (it->contains("tools") && !(*it)["tools"].is_array())
      return invalid_input(where + ": responses_create_params.tools must be a list");
    out.push_back({row, row.dump()});
  }
  if (out.empty()) return invalid_input("'" + path + "' has no task rows");
  return out;
}

Result<Splits> load_splits(const Settings& s, const std::string& where) {
  auto named = [&](Result<std::vector<Task>> r) -> Result<std::vector<Task>> {
    if (!r.ok()) return invalid_input(where + ": " + r.error().message);
    return r;
  };
  TROUPE_ASSIGN_OR_RETURN(auto rows, named(load_tasks(s.data)));
  Splits out;
  if (!s.eval_data.empty()) {
    TROUPE_ASSIGN_OR_RETURN(out.eval, named(load_tasks(s.eval_data)));
    std::set<std::string> held;
    for (const auto& t : out.eval) held.insert(t.canonical);
    for (auto& t : rows)
      if (!held.count(t.canonical)) out.train.push_back(std::move(t));
  } else {
    const int permille = static_cast<int>(s.eval_fraction * 1000 + 0.5);
    for (auto& t : rows) (in_eval_bucket(t.canonical, permille) ? out.eval : out.train).push_back(std::move(t));
  }
  if (out.train.empty()) return invalid_input(where + ": no train rows are left after holding out the eval split");
  return out;
}

std::vector<ToolSpec> tools_of(const json& row) {
  std::vector<ToolSpec> out;
  const json& params = row["responses_create_params"];
  if (!params.contains("tools") || !params["tools"].is_array()) return out;
  for (const auto& t : params["tools"]) {
    if (!t.is_object() || t.value("type", std::string("function")) != "function" || !t.contains("name") ||
        !t["name"].is_string())
      continue;
    ToolSpec s;
    s.name = t["name"].get<std::string>();
    if (t.contains("description") && t["description"].is_string()) s.description = t["description"].get<std::string>();
    if (t.contains("parameters") && t["parameters"].is_object()) s.parameters = t["parameters"];
    out.push_back(std::move(s));
  }
  return out;
}

Observation observation_of(const json& row) {
  Observation o;
  const json& input = row["responses_create_params"]["input"];
  std::string text;
  if (input.is_string()) {
    text = input.get<std::string>();
    o.messages.push_back({"user", text});
  } else {
    for (const auto& m : input) {
      std::string role = m["role"].get<std::string>(), content = content_text(m["content"]);
      o.messages.push_back({role, content});
      if (!text.empty()) text += "\n\n";
      text += role == "user" ? content : "(" + role + ") " + content;
    }
  }
  auto tools = tools_of(row);
  if (!tools.empty()) {
    std::string how = "\n\nTools: call one by writing <tool_call>{\"name\": \"NAME\", \"arguments\": {...}}</tool_call>; "
                      "its answer comes back in <tool_result>. A reply without a tool call ends the task.";
    for (const auto& t : tools) {
      how += "\n- " + t.name;
      if (!t.description.empty()) how += ": " + t.description;
      how += " Parameters: " + t.parameters.dump();
    }
    text += how;
    o.messages.back().content += how;  // the messages are the prompt under rollout.template chat
  }
  o.text = text;
  return o;
}

std::vector<ToolCall> Output::add_turn(const std::string& turn, std::vector<std::string>& call_ids) {
  // the text outside the tool-call blocks is the turn's message
  std::string said;
  size_t at = 0;
  for (size_t open; (open = turn.find("<tool_call>", at)) != std::string::npos;) {
    said += turn.substr(at, open - at);
    size_t close = turn.find("</tool_call>", open);
    at = close == std::string::npos ? turn.size() : close + 12;
  }
  if (at < turn.size()) said += turn.substr(at);
  said = trim(said);
  const std::string n = std::to_string(next_++);
  if (!said.empty())
    items_.push_back({{"id", "msg_" + n},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"status", "completed"},
                      {"content", json::array({{{"type", "output_text"}, {"text", said}, {"annotations", json::array()}}})}});
  auto calls = parse_tool_calls(turn);
  call_ids.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    std::string id = "call_" + n + "_" + std::to_string(i);
    call_ids.push_back(id);
    if (!calls[i].ok) continue;  // a malformed call is shown to the model, not sent anywhere
    items_.push_back({{"id", "fc_" + n + "_" + std::to_string(i)},
                      {"type", "function_call"},
                      {"call_id", id},
                      {"name", calls[i].name},
                      {"arguments", calls[i].arguments.dump()},
                      {"status", "completed"}});
  }
  return calls;
}

void Output::add_tool_output(const std::string& call_id, const std::string& output) {
  items_.push_back({{"type", "function_call_output"}, {"call_id", call_id}, {"output", output}});
}

json Output::response(const json& row) const {
  const json& params = row["responses_create_params"];
  return {{"id", "resp_troupe"},
          {"object", "response"},
          {"created_at", 0},
          {"model", "troupe-policy"},
          {"status", "completed"},
          {"output", items_},
          {"parallel_tool_calls", params.value("parallel_tool_calls", true)},
          {"tool_choice", params.contains("tool_choice") ? params["tool_choice"] : json("auto")},
          {"tools", params.contains("tools") ? params["tools"] : json::array()}};
}

json verify_body(const json& row, const json& response) {
  json body = row;
  body["response"] = response;
  return body;
}

Result<VerifyResult> read_verify(const json& answer, const json& row, const std::string& where) {
  const std::string bad = where + ": " + kProtocolErrorTag;
  if (!answer.is_object()) return make_error(ErrorCode::internal, bad + "/verify did not answer a JSON object");
  if (!answer.contains("reward") || !answer["reward"].is_number())
    return make_error(ErrorCode::internal, bad + "/verify answered no numeric 'reward'");
  VerifyResult v;
  v.reward = answer["reward"].get<double>();
  if (answer.contains("reward_components") && !answer["reward_components"].is_null()) {
    const json& c = answer["reward_components"];
    if (!c.is_object()) return make_error(ErrorCode::internal, bad + "/verify 'reward_components' is not a mapping");
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (!it->is_number())
        return make_error(ErrorCode::internal, bad + "/verify reward_components." + it.key() + " is not a number");
      v.components[it.key()] = it->get<double>();
    }
  }
  json fields = json::object();
  for (auto it = answer.begin(); it != answer.end(); ++it) {
    if (it.key() == "reward" || it.key() == "reward_components" || it.key() == "response" || row.contains(it.key()))
      continue;
    if (it->is_number() || it->is_boolean()) fields[it.key()] = *it;
  }
  if (!fields.empty()) v.info["fields"] = fields;
  return v;
}

}  // namespace troupe::envs::nemo_gym
