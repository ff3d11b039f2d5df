// Trajectory (de)serialization and the JSONL writer. Field names follow TRAJECTORY.md exactly;
// readers accept records written by this version and reject unknown schema versions.
#include "troupe/envs/trajectory.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace troupe::envs {

const char* termination_name(Termination t) {
  switch (t) {
    case Termination::done: return "done";
    case Termination::max_turns: return "max_turns";
    case Termination::truncated: return "truncated";
    case Termination::env_error: return "env_error";
    case Termination::timeout: return "timeout";
    case Termination::worker_crash: return "worker_crash";
    case Termination::aborted: return "aborted";
    case Termination::protocol_error: return "protocol_error";
    case Termination::invalid_reward: return "invalid_reward";
    case Termination::reward_timeout: return "reward_timeout";
    case Termination::reward_crash: return "reward_crash";
    case Termination::reward_error: return "reward_error";
    case Termination::reward_bad_return: return "reward_bad_return";
    case Termination::judge_http: return "judge_http";
    case Termination::judge_timeout: return "judge_timeout";
    case Termination::judge_parse: return "judge_parse";
  }
  return "done";
}

Result<Termination> parse_termination(const std::string& s) {
  for (auto t : {Termination::done, Termination::max_turns, Termination::truncated, Termination::env_error,
                 Termination::timeout, Termination::worker_crash, Termination::aborted, Termination::protocol_error,
                 Termination::invalid_reward, Termination::reward_timeout, Termination::reward_crash,
                 Termination::reward_error, Termination::reward_bad_return, Termination::judge_http,
                 Termination::judge_timeout, Termination::judge_parse}) {
    if (s == termination_name(t)) return t;
  }
  return invalid_input("unknown termination '" + s + "'");
}

json to_json(const Trajectory& t) {
  json turns = json::array();
  for (const auto& turn : t.turns) {
    json calls = json::array();
    for (const auto& c : turn.tool_calls) calls.push_back(to_json(c));
    turns.push_back({{"observation", turn.observation},
                     {"prompt_tokens", turn.prompt_tokens},
                     {"completion", turn.completion},
                     {"completion_tokens", turn.completion_tokens},
                     {"logprobs", turn.logprobs},
                     {"policy_version", turn.policy_version},
                     {"truncated", turn.truncated},
                     {"tool_calls", calls},
                     {"reward", turn.reward},
                     {"info", turn.info},
                     {"timings", {{"generate_s", turn.generate_s}, {"env_s", turn.env_s}}}});
    if (!turn.experts.empty()) turns.back()["experts"] = turn.experts;
  }
  json comps = json::object();
  for (const auto& [k, v] : t.reward_components) comps[k] = v;
  return {{"schema", kTrajectorySchema},
          {"episode_id", t.episode_id},
          {"env", {{"name", t.env_name}, {"version", t.env_version}}},
          {"seed", t.seed},
          {"split", split_name(t.split)},
          {"step", t.step},
          {"group", t.group},
          {"prompt", to_json(t.prompt)},
          {"turns", turns},
          {"reward", t.reward},
          {"reward_components", comps},
          {"termination", termination_name(t.termination)},
          {"error", t.error},
          {"timings", {{"reset_s", t.reset_s}, {"total_s", t.total_s}, {"start_unix_s", t.start_unix_s}}},
          {"extra", t.extra}};
}

namespace {

template <class T>
Status read_field(const json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    return invalid_input(where + ": field '" + key + "' has the wrong type");
  }
  return {};
}

}  // namespace

Result<Trajectory> trajectory_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return invalid_input(where + ": a trajectory must be a JSON object");
  std::string schema;
  TROUPE_TRY(read_field(j, "schema", schema, where));
  if (schema != kTrajectorySchema)
    return invalid_input(where + ": schema '" + schema + "' is not " + kTrajectorySchema);
  Trajectory t;
  TROUPE_TRY(read_field(j, "episode_id", t.episode_id, where));
  if (auto e = j.find("env"); e != j.end() && e->is_object()) {
    TROUPE_TRY(read_field(*e, "name", t.env_name, where + ": env"));
    TROUPE_TRY(read_field(*e, "version", t.env_version, where + ": env"));
  }
  TROUPE_TRY(read_field(j, "seed", t.seed, where));
  std::string split = "train", term = "done";
  TROUPE_TRY(read_field(j, "split", split, where));
  TROUPE_ASSIGN_OR_RETURN(t.split, parse_split(split));
  TROUPE_TRY(read_field(j, "step", t.step, where));
  TROUPE_TRY(read_field(j, "group", t.group, where));
  if (auto p = j.find("prompt"); p != j.end()) {
    TROUPE_ASSIGN_OR_RETURN(t.prompt, observation_from_json(*p, where + ": prompt"));
  }
  if (auto ts = j.find("turns"); ts != j.end() && ts->is_array()) {
    for (const auto& tj : *ts) {
      TurnRecord turn;
      const std::string w = where + ": turns[" + std::to_string(t.turns.size()) + "]";
      TROUPE_TRY(read_field(tj, "observation", turn.observation, w));
      TROUPE_TRY(read_field(tj, "prompt_tokens", turn.prompt_tokens, w));
      TROUPE_TRY(read_field(tj, "completion", turn.completion, w));
      TROUPE_TRY(read_field(tj, "completion_tokens", turn.completion_tokens, w));
      TROUPE_TRY(read_field(tj, "logprobs", turn.logprobs, w));
      TROUPE_TRY(read_field(tj, "experts", turn.experts, w));
      TROUPE_TRY(read_field(tj, "policy_version", turn.policy_version, w));
      TROUPE_TRY(read_field(tj, "truncated", turn.truncated, w));
      TROUPE_TRY(read_field(tj, "reward", turn.reward, w));
      TROUPE_TRY(read_field(tj, "info", turn.info, w));
      if (auto c = tj.find("tool_calls"); c != tj.end() && c->is_array()) {
        for (const auto& cj : *c) {
          TROUPE_ASSIGN_OR_RETURN(auto call, tool_call_from_json(cj, w + ": tool_calls[]"));
          turn.tool_calls.push_back(std::move(call));
        }
      }
      if (auto tm = tj.find("timings"); tm != tj.end() && tm->is_object()) {
        TROUPE_TRY(read_field(*tm, "generate_s", turn.generate_s, w));
        TROUPE_TRY(read_field(*tm, "env_s", turn.env_s, w));
      }
      t.turns.push_back(std::move(turn));
    }
  }
  TROUPE_TRY(read_field(j, "reward", t.reward, where));
  TROUPE_TRY(read_field(j, "reward_components", t.reward_components, where));
  TROUPE_TRY(read_field(j, "termination", term, where));
  TROUPE_ASSIGN_OR_RETURN(t.termination, parse_termination(term));
  TROUPE_TRY(read_field(j, "error", t.error, where));
  if (auto tm = j.find("timings"); tm != j.end() && tm->is_object()) {
    TROUPE_TRY(read_field(*tm, "reset_s", t.reset_s, where));
    TROUPE_TRY(read_field(*tm, "total_s", t.total_s, where));
    TROUPE_TRY(read_field(*tm, "start_unix_s", t.start_unix_s, where));
  }
  TROUPE_TRY(read_field(j, "extra", t.extra, where));
  return t;
}

Result<std::unique_ptr<TrajectoryWriter>> TrajectoryWriter::open(const std::string& path) {
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return make_error(ErrorCode::io, "cannot create directory " + parent.string() + ": " + ec.message());
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return make_error(ErrorCode::io, "cannot open " + path + " for appending: " + std::strerror(errno));
  return std::unique_ptr<TrajectoryWriter>(new TrajectoryWriter(f, path));
}

TrajectoryWriter::~TrajectoryWriter() {
  if (f_) std::fclose(f_);
}

Status TrajectoryWriter::write(const Trajectory& t) {
  // Invalid UTF-8 in model output must not make the writer throw: replace it.
  std::string line = to_json(t).dump(-1, ' ', false, json::error_handler_t::replace);
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return make_error(ErrorCode::io, "cannot write to " + path_ + ": " + std::strerror(errno));
  return {};
}

Result<std::vector<Trajectory>> read_trajectories(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_input("cannot open " + path);
  std::vector<Trajectory> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_input(where + ": not valid JSON");
    TROUPE_ASSIGN_OR_RETURN(auto t, trajectory_from_json(j, where));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace troupe::envs
