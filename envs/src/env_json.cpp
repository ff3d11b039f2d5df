// JSON forms of the Env API types: one place, shared by the protocol, the C ABI and trajectories,
// so every path round-trips the same fields. Parsers reject wrong types with the field's name.
#include "troupe/envs/env.h"

namespace troupe::envs {

const char* split_name(Split s) { return s == Split::eval ? "eval" : "train"; }

Result<Split> parse_split(const std::string& s) {
  if (s == "train") return Split::train;
  if (s == "eval" || s == "test" || s == "validation") return Split::eval;
  return invalid_input("unknown split '" + s + "' (expected train or eval)");
}

json to_json(const Message& m) { return {{"role", m.role}, {"content", m.content}}; }
json to_json(const ToolSpec& t) {
  return {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}};
}
json to_json(const ToolCall& c) {
  return {{"name", c.name}, {"arguments", c.arguments}, {"result", c.result}, {"ok", c.ok}};
}
json to_json(const Observation& o) {
  json msgs = json::array();
  for (const auto& m : o.messages) msgs.push_back(to_json(m));
  return {{"text", o.text}, {"messages", msgs}, {"metadata", o.metadata}};
}
static json components_json(const std::map<std::string, double>& c) {
  json j = json::object();
  for (const auto& [k, v] : c) j[k] = v;
  return j;
}
json to_json(const VerifyResult& v) {
  return {{"reward", v.reward}, {"components", components_json(v.components)}, {"info", v.info}};
}
json to_json(const StepResult& s) {
  return {{"observation", to_json(s.observation)}, {"reward", s.reward},
          {"components", components_json(s.components)}, {"done", s.done}, {"info", s.info}};
}
json to_json(const EnvInfo& e) {
  json tools = json::array();
  for (const auto& t : e.tools) tools.push_back(to_json(t));
  return {{"name", e.name}, {"version", e.version}, {"multi_turn", e.multi_turn}, {"max_turns", e.max_turns},
          {"tools", tools}};
}
json to_json(const ResetOptions& r) {
  json j = r.extra.is_object() ? r.extra : json::object();
  j["split"] = split_name(r.split);
  return j;
}

namespace {

Error field_error(const std::string& where, const std::string& field, const std::string& want) {
  return invalid_input(where + ": field '" + field + "' must be " + want);
}

// Optional typed fields: absent is fine, wrong type is an error.
Status get_string(const json& j, const char* key, std::string& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) return field_error(where, key, "a string");
  out = it->get<std::string>();
  return {};
}
Status get_number(const json& j, const char* key, double& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_boolean()) { out = it->get<bool>() ? 1.0 : 0.0; return {}; }
  if (!it->is_number()) return field_error(where, key, "a number");
  out = it->get<double>();
  return {};
}
Status get_bool(const json& j, const char* key, bool& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_boolean()) return field_error(where, key, "true or false");
  out = it->get<bool>();
  return {};
}
Status get_object(const json& j, const char* key, json& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_object()) return field_error(where, key, "an object");
  out = *it;
  return {};
}
Status get_components(const json& j, std::map<std::string, double>& out, const std::string& where) {
  auto it = j.find("components");
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_object()) return field_error(where, "components", "an object of numbers");
  for (auto c = it->begin(); c != it->end(); ++c) {
    if (!c->is_number()) return field_error(where, "components." + c.key(), "a number");
    out[c.key()] = c->get<double>();
  }
  return {};
}

}  // namespace

Result<Observation> observation_from_json(const json& j, const std::string& where) {
  Observation o;
  if (j.is_string()) {  // shorthand: a bare prompt string
    o.text = j.get<std::string>();
    return o;
  }
  if (!j.is_object()) return invalid_input(where + ": observation must be an object or a string");
  TROUPE_TRY(get_string(j, "text", o.text, where));
  TROUPE_TRY(get_object(j, "metadata", o.metadata, where));
  if (auto it = j.find("messages"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error(where, "messages", "an array of {role, content}");
    for (const auto& m : *it) {
      if (!m.is_object() || !m.contains("content") || !m["content"].is_string())
        return field_error(where, "messages[]", "an object with string 'role' and 'content'");
      Message msg;
      TROUPE_TRY(get_string(m, "role", msg.role, where + ": messages[]"));
      msg.content = m["content"].get<std::string>();
      o.messages.push_back(std::move(msg));
    }
  }
  if (o.text.empty() && !o.messages.empty()) {
    for (const auto& m : o.messages) o.text += m.content + (&m == &o.messages.back() ? "" : "\n");
  }
  return o;
}

Result<VerifyResult> verify_result_from_json(const json& j, const std::string& where) {
  VerifyResult v;
  if (j.is_number()) {  // shorthand: a bare reward
    v.reward = j.get<double>();
    return v;
  }
  if (!j.is_object()) return invalid_input(where + ": verify result must be an object or a number");
  if (!j.contains("reward")) return invalid_input(where + ": verify result has no 'reward'");
  TROUPE_TRY(get_number(j, "reward", v.reward, where));
  TROUPE_TRY(get_components(j, v.components, where));
  TROUPE_TRY(get_object(j, "info", v.info, where));
  return v;
}

Result<StepResult> step_result_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": step result must be an object");
  StepResult s;
  if (auto it = j.find("observation"); it != j.end() && !it->is_null()) {
    TROUPE_ASSIGN_OR_RETURN(s.observation, observation_from_json(*it, where + ": observation"));
  }
  TROUPE_TRY(get_number(j, "reward", s.reward, where));
  TROUPE_TRY(get_components(j, s.components, where));
  TROUPE_TRY(get_bool(j, "done", s.done, where));
  TROUPE_TRY(get_object(j, "info", s.info, where));
  return s;
}

Result<ToolSpec> tool_spec_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": tool must be an object");
  ToolSpec t;
  TROUPE_TRY(get_string(j, "name", t.name, where));
  if (t.name.empty()) return invalid_input(where + ": tool has no 'name'");
  TROUPE_TRY(get_string(j, "description", t.description, where));
  TROUPE_TRY(get_object(j, "parameters", t.parameters, where));
  return t;
}

Result<ToolCall> tool_call_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": tool call must be an object");
  ToolCall c;
  TROUPE_TRY(get_string(j, "name", c.name, where));
  TROUPE_TRY(get_object(j, "arguments", c.arguments, where));
  TROUPE_TRY(get_string(j, "result", c.result, where));
  TROUPE_TRY(get_bool(j, "ok", c.ok, where));
  return c;
}

Result<EnvInfo> env_info_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": env info must be an object");
  EnvInfo e;
  TROUPE_TRY(get_string(j, "name", e.name, where));
  if (auto it = j.find("version"); it != j.end() && it->is_number()) {
    e.version = it->dump();
  } else {
    TROUPE_TRY(get_string(j, "version", e.version, where));
  }
  TROUPE_TRY(get_bool(j, "multi_turn", e.multi_turn, where));
  double max_turns = e.max_turns;
  TROUPE_TRY(get_number(j, "max_turns", max_turns, where));
  e.max_turns = static_cast<int>(max_turns);
  if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error(where, "tools", "an array");
    for (const auto& t : *it) {
      TROUPE_ASSIGN_OR_RETURN(auto spec, tool_spec_from_json(t, where + ": tools[]"));
      e.tools.push_back(std::move(spec));
    }
  }
  return e;
}

Result<ResetOptions> reset_options_from_json(const json& j, const std::string& where) {
  ResetOptions r;
  if (j.is_null()) return r;
  if (!j.is_object()) return invalid_input(where + ": options must be an object");
  r.extra = j;
  if (auto it = j.find("split"); it != j.end()) {
    if (!it->is_string()) return field_error(where, "split", "\"train\" or \"eval\"");
    TROUPE_ASSIGN_OR_RETURN(r.split, parse_split(it->get<std::string>()));
    r.extra.erase("split");
  }
  return r;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool in_eval_bucket(const std::string& canonical, int eval_permille) {
  // Mix once more so short, similar strings spread over the buckets.
  uint64_t h = fnv1a(canonical);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<int>(h % 1000) < eval_permille;
}

}  // namespace troupe::envs
