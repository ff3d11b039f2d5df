// Env specs (client.h): one `envs:` entry of the YAML, as JSON, read into an EnvSpec and written
// back. Invariant: a spec that parses is complete for its type (a builtin names a registered env,
// a plugin has its .so, a remote a command or address, ...); every error names the entry and key.
#include <set>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"
#include "troupe/envs/env_pool.h"

namespace troupe::envs {

namespace {

// Typed reads of an entry's optional keys (absent or null leaves the default).
class SpecFields {
 public:
  SpecFields(const json& j, const std::string& where) : j_(j), where_(where) {}

  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  Status str(const char* k, std::string& out) const {
    if (!has(k)) return {};
    if (!j_[k].is_string()) return invalid_input(where_ + ": '" + k + "' must be a string");
    out = j_[k].get<std::string>();
    return {};
  }
  Status num(const char* k, double& out, double lo) const {
    if (!has(k)) return {};
    if (!j_[k].is_number()) return invalid_input(where_ + ": '" + k + "' must be a number");
    out = j_[k].get<double>();
    if (out < lo) return invalid_input(where_ + ": '" + k + "' must be >= " + std::to_string(lo));
    return {};
  }
  Status count(const char* k, int& out) const {
    double v = out;
    TROUPE_TRY(num(k, v, 0));
    if (v > 2147483647.0) return invalid_input(where_ + ": '" + k + "' must be <= 2147483647");
    out = static_cast<int>(v);
    return {};
  }
  Status any_num(const char* k, double& out) const {  // no lower bound
    if (!has(k)) return {};
    if (!j_[k].is_number()) return invalid_input(where_ + ": '" + k + "' must be a number");
    out = j_[k].get<double>();
    return {};
  }

 private:
  const json& j_;
  const std::string& where_;
};

Status check_keys(const json& j, const std::string& where) {
  static const std::set<std::string> known = {"name", "type", "env", "weight", "config", "path", "command", "address", "addresses",
                                              "isolate", "timeout_s", "startup_timeout_s", "max_restarts", "max_message_bytes", "worker",
                                              "max_retries", "max_failure_frac", "reward_min", "reward_max", "url",
                                              "environment", "cwd", "log_dir"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) return invalid_input(where + ": unknown key '" + it.key() + "'");
  }
  return {};
}

// name, the strings, the limits and the reward bounds.
Status read_scalars(const SpecFields& f, EnvSpec& s, const std::string& where) {
  TROUPE_TRY(f.str("name", s.name));
  if (s.name.empty()) return invalid_input(where + ": env needs a 'name'");
  TROUPE_TRY(f.str("env", s.env));
  TROUPE_TRY(f.str("path", s.path));
  TROUPE_TRY(f.str("address", s.address));
  TROUPE_TRY(f.str("worker", s.worker));
  TROUPE_TRY(f.str("url", s.url));
  TROUPE_TRY(f.str("cwd", s.cwd));
  TROUPE_TRY(f.str("log_dir", s.log_dir));
  TROUPE_TRY(f.num("weight", s.weight, 0));
  TROUPE_TRY(f.num("timeout_s", s.timeout_s, 0.001));
  TROUPE_TRY(f.num("startup_timeout_s", s.startup_timeout_s, 0.001));
  TROUPE_TRY(f.count("max_restarts", s.max_restarts));
  TROUPE_TRY(f.count("max_message_bytes", s.max_message_bytes));
  if (s.max_message_bytes < 1024) return invalid_input(where + ": 'max_message_bytes' must be >= 1024");
  TROUPE_TRY(f.count("max_retries", s.max_retries));
  TROUPE_TRY(f.num("max_failure_frac", s.max_failure_frac, 0));
  if (s.max_failure_frac > 1) return invalid_input(where + ": 'max_failure_frac' must be <= 1");
  TROUPE_TRY(f.any_num("reward_min", s.reward_min));
  TROUPE_TRY(f.any_num("reward_max", s.reward_max));
  if (!(s.reward_min <= s.reward_max))
    return invalid_input(where + ": 'reward_min' must not be above 'reward_max'");
  return {};
}

// `command`: a list of words, or one string split on spaces ("python my_env.py --flag").
Status read_command(const json& c, std::vector<std::string>& out, const std::string& where) {
  if (c.is_string()) {
    std::string word;
    for (char ch : c.get<std::string>() + " ") {
      if (ch == ' ') {
        if (!word.empty()) out.push_back(word);
        word.clear();
      } else {
        word += ch;
      }
    }
  } else if (c.is_array()) {
    for (const auto& w : c) {
      if (!w.is_string()) return invalid_input(where + ": 'command' must be a list of strings");
      out.push_back(w.get<std::string>());
    }
  } else {
    return invalid_input(where + ": 'command' must be a list of strings or a string");
  }
  if (out.empty()) return invalid_input(where + ": 'command' is empty");
  return {};
}

// `addresses`: a non-empty list of distinct strings (their form is checked once the type is known).
Status read_addresses(const json& a, std::vector<std::string>& out, const std::string& where) {
  if (!a.is_array()) return invalid_input(where + ": 'addresses' must be a list of server addresses");
  if (a.empty()) return invalid_input(where + ": 'addresses' is empty (list the running servers of the pool)");
  std::set<std::string> seen;
  for (const auto& x : a) {
    if (!x.is_string()) return invalid_input(where + ": 'addresses' must be a list of strings");
    if (!seen.insert(x.get<std::string>()).second)
      return invalid_input(where + ": 'addresses' lists " + x.get<std::string>() + " twice");
    out.push_back(x.get<std::string>());
  }
  return {};
}

// A pool (addresses) is for an env of running servers: remote, nemo_gym, verifiers, each address of its form.
Status check_pool(const EnvSpec& s, const std::string& where) {
  if (s.addresses.empty()) return {};
  if (!s.address.empty() || !s.url.empty() || !s.command.empty())
    return invalid_input(where + ": 'addresses' (a pool of running servers) goes without 'address', 'url' and 'command'");
  if (s.type != EnvType::remote && s.type != EnvType::nemo_gym && s.type != EnvType::verifiers)
    return invalid_input(where + ": 'addresses' is only for type remote, nemo_gym or verifiers");
  for (const auto& a : s.addresses)
    if (auto st = check_pool_address(a, s.type == EnvType::nemo_gym); !st.ok())
      return invalid_input(where + ": addresses: " + st.error().message);
  return {};
}

// `environment`: NAME: value, each value a string, number or bool (written as YAML shows it).
Status read_environment(const json& e, std::map<std::string, std::string>& out, const std::string& where) {
  if (!e.is_object()) return invalid_input(where + ": 'environment' must be a mapping NAME: value");
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key().empty() || it.key().find('=') != std::string::npos)
      return invalid_input(where + ": environment: '" + it.key() + "' is not a variable name");
    const json& v = it.value();
    if (v.is_string()) out[it.key()] = v.get<std::string>();
    else if (v.is_number() || v.is_boolean()) out[it.key()] = v.dump();
    else return invalid_input(where + ": environment." + it.key() + " must be a string, number or bool");
  }
  return {};
}

Status check_builtin(EnvSpec& s, const std::string& where) {
  if (s.env.empty()) s.env = s.name;
  if (EnvRegistry::global().contains(s.env)) return {};
  std::string known_envs;
  for (const auto& n : EnvRegistry::global().names()) known_envs += (known_envs.empty() ? "" : ", ") + n;
  return invalid_input(where + ": unknown built-in env '" + s.env + "' (known: " + known_envs + ")");
}

// The SDK's reasoning-gym env as a remote process: config.python (default: troupe's Python) runs
// envs/python/troupe_env/reasoning_gym_env.py; the rest of config goes to it.
Status make_reasoning_gym(EnvSpec& s, const std::string& where) {
  if (!s.command.empty() || !s.address.empty())
    return invalid_input(where + ": a reasoning_gym env takes no 'command' or 'address' (troupe starts it)");
  std::string python = troupe::python_executable();
  if (auto it = s.config.find("python"); it != s.config.end()) {
    if (!it->is_string() || it->get<std::string>().empty())
      return invalid_input(where + ": config 'python' must be the path of a Python interpreter");
    python = it->get<std::string>();
    s.config.erase(it);
  }
  if (!s.config.contains("task") || !s.config["task"].is_string())
    return invalid_input(where + ": a reasoning_gym env needs config 'task' (a reasoning-gym dataset name, e.g. basic_arithmetic)");
  s.command = {python, std::string(TROUPE_SOURCE_DIR) + "/envs/python/troupe_env/reasoning_gym_env.py"};
  return {};
}

// `type` (default: plugin with a path, nemo_gym with a url, remote with a command or address, else builtin) and what
// each type needs.
Status read_type(std::string type, EnvSpec& s, const std::string& where) {
  if (type.empty())
    type = !s.path.empty()                                                           ? "plugin"
           : !s.url.empty() || (!s.addresses.empty() && s.addresses[0].rfind("http://", 0) == 0) ? "nemo_gym"
           : (!s.command.empty() || !s.address.empty() || !s.addresses.empty())             ? "remote"
                                                                                             : "builtin";
  if (type == "builtin") {
    s.type = EnvType::builtin;
    return check_builtin(s, where);
  }
  if (type == "plugin") {
    s.type = EnvType::plugin;
    s.isolate = true;
    if (s.path.empty()) return invalid_input(where + ": a plugin env needs 'path' (the .so)");
  } else if (type == "remote") {
    s.type = EnvType::remote;
    if (s.command.empty() && s.address.empty() && s.addresses.empty())
      return invalid_input(where + ": a remote env needs 'command' (troupe starts it) or 'address' (already running)");
  } else if (type == "reasoning_gym") {
    s.type = EnvType::remote;
    return make_reasoning_gym(s, where);
  } else if (type == "judge") {  // the dataset env scored by its judge only (unless config names a verifier)
    s.type = EnvType::builtin;
    if (!s.env.empty() && s.env != "dataset")
      return invalid_input(where + ": a judge env is the built-in dataset env ('env' must be dataset or absent, got '" + s.env + "')");
    s.env = "dataset";
    if (!s.config.is_object() || !s.config.contains("judge"))
      return invalid_input(where + ": a judge env needs config.judge (url, model, rubric, ...)");
    if (!s.config.contains("verifier")) s.config["verifier"] = "none";
  } else if (type == "reward_model") {  // the dataset env's prompts, each response scored by a reward model
    s.type = EnvType::builtin;
    if (!s.env.empty() && s.env != "dataset")
      return invalid_input(where + ": a reward_model env is the built-in dataset env ('env' must be dataset or absent, got '" + s.env + "')");
    s.env = "dataset";
    TROUPE_ASSIGN_OR_RETURN(s.reward_model, take_reward_model_config(s.config, s.path, where));
  } else if (type == "nemo_gym") {
    s.type = EnvType::nemo_gym;
    if (s.command.empty() == s.url.empty() && s.addresses.empty())
      return invalid_input(where + ": a nemo_gym env needs exactly one of 'url' (a running resource server) or "
                                   "'command' (troupe starts it; {port} is the port it picks)");
  } else if (type == "verifiers") {
    s.type = EnvType::verifiers;
    if (s.address.empty() && s.addresses.empty())
      return invalid_input(where + ": a verifiers env needs 'address' (its env server, e.g. tcp://127.0.0.1:5000)");
  } else {
    return invalid_input(where + ": 'type' must be builtin, plugin or remote (or nemo_gym, reasoning_gym, verifiers, judge, reward_model; got '" + type + "')");
  }
  return {};
}

}  // namespace

Result<EnvSpec> parse_env_spec(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": an env must be a mapping with at least 'name'");
  TROUPE_TRY(check_keys(j, where));
  const SpecFields f(j, where);
  EnvSpec s;
  TROUPE_TRY(read_scalars(f, s, where));
  if (f.has("config")) {
    if (!j["config"].is_object()) return invalid_input(where + ": 'config' must be a mapping");
    s.config = j["config"];
  }
  if (f.has("command")) TROUPE_TRY(read_command(j["command"], s.command, where));
  if (f.has("addresses")) TROUPE_TRY(read_addresses(j["addresses"], s.addresses, where));
  std::string type;
  TROUPE_TRY(f.str("type", type));
  TROUPE_TRY(read_type(type, s, where));
  TROUPE_TRY(check_pool(s, where));
  if (s.type != EnvType::nemo_gym && !s.url.empty())
    return invalid_input(where + ": 'url' is only for type: nemo_gym");
  if (f.has("environment")) TROUPE_TRY(read_environment(j["environment"], s.environment, where));
  if (s.command.empty() && s.type != EnvType::verifiers && (!s.environment.empty() || !s.cwd.empty()))
    return invalid_input(where + ": 'environment' and 'cwd' are for a 'command' troupe starts (or a verifiers "
                                 "taskset loader); this env has neither");
  if (f.has("isolate")) {
    if (!j["isolate"].is_boolean()) return invalid_input(where + ": 'isolate' must be true or false");
    s.isolate = j["isolate"].get<bool>();
  }
  return s;
}

Result<std::vector<EnvSpec>> parse_env_specs(const json& list, const std::string& where) {
  if (!list.is_array() || list.empty()) return invalid_input(where + ": 'envs' must be a non-empty list");
  std::vector<EnvSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto s, parse_env_spec(list[i], where + "[" + std::to_string(i) + "]"));
    if (!names.insert(s.name).second) return invalid_input(where + "[" + std::to_string(i) + "]: duplicate env name '" + s.name + "'");
    out.push_back(std::move(s));
  }
  return out;
}

json to_json(const EnvSpec& s) {
  std::string type = s.type == EnvType::builtin     ? "builtin"
                     : s.type == EnvType::plugin    ? "plugin"
                     : s.type == EnvType::remote    ? "remote"
                     : s.type == EnvType::nemo_gym  ? "nemo_gym"
                                                    : "verifiers";
  json config = s.config;
  if (s.reward_model) {
    type = "reward_model";
    put_reward_model_config(config, *s.reward_model);
  }
  json j = {{"name", s.name}, {"type", type}, {"weight", s.weight}, {"config", config}, {"isolate", s.isolate},
            {"timeout_s", s.timeout_s}, {"startup_timeout_s", s.startup_timeout_s}, {"max_restarts", s.max_restarts}, {"max_message_bytes", s.max_message_bytes},
            {"max_retries", s.max_retries}, {"max_failure_frac", s.max_failure_frac},
            {"reward_min", s.reward_min}, {"reward_max", s.reward_max}};
  if (!s.env.empty()) j["env"] = s.env;
  if (!s.path.empty()) j["path"] = s.path;
  if (!s.command.empty()) j["command"] = s.command;
  if (!s.address.empty()) j["address"] = s.address;
  if (!s.addresses.empty()) j["addresses"] = s.addresses;
  if (!s.worker.empty()) j["worker"] = s.worker;
  if (!s.url.empty()) j["url"] = s.url;
  if (!s.environment.empty()) j["environment"] = s.environment;
  if (!s.cwd.empty()) j["cwd"] = s.cwd;
  if (!s.log_dir.empty()) j["log_dir"] = s.log_dir;
  return j;
}

}  // namespace troupe::envs
