// Members of a running job (`troupe join`, `troupe status`): the job's address (join.json), the
// hash of a config's model, and a node of this process connected to the job's rank 0. Invariant:
// the model hash is a function of what a generator samples with only (member.h).
#include "troupe/launch/member.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "troupe/actors/scorer.h"
#include "troupe/launch/config.h"
#include "troupe/launch/run_dir_files.h"
#include "troupe/runtime/bind_host.h"
#include "troupe/runtime/curve.h"

namespace troupe::launch {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string in_dir(const std::string& dir, const std::string& p) {
  return p.empty() || fs::path(p).is_absolute() ? p : (fs::path(dir) / p).string();
}

}  // namespace

Result<ModelIdentity> member_model_identity(const actors::ExperimentConfig& cfg) {
  YAML::Node policy;
  try {
    policy = YAML::Load(resolved_yaml(cfg))["policy"];
  } catch (const YAML::Exception& e) {
    return make_error(ErrorCode::internal, std::string("model identity: the resolved config does not parse: ") + e.what());
  }
  const YAML::Node& p = policy;
  std::string text;
  for (const char* key : {"model", "tokenizer", "lora", "init_std"}) {
    YAML::Emitter out;
    if (p.IsMap() && p[key].IsDefined()) out << p[key];
    text += std::string(key) + "=" + out.c_str() + "\n";
  }
  ModelIdentity id;
  const auto& m = cfg.policy.model;
  if (!cfg.policy.path.empty()) {
    TROUPE_ASSIGN_OR_RETURN(std::string files, actors::model_files_hash(cfg.policy.path));
    text += "files=" + files + "\n";
    id.name = "policy.path " + cfg.policy.path;
  } else {
    std::string family = "?";
    if (p.IsMap() && p["model"].IsMap() && p["model"]["family"].IsScalar()) family = p["model"]["family"].as<std::string>();
    id.name = "policy.model (" + family + ", " + std::to_string(m.num_hidden_layers) + " layers, hidden " +
              std::to_string(m.hidden_size) + ", vocab " + std::to_string(m.vocab_size) + ")";
  }
  id.hash = hex16(XXH3_64bits(text.data(), text.size()));
  return id;
}

Result<JobAddress> resolve_job_address(const std::string& where) {
  JobAddress a;
  if (where.rfind("tcp://", 0) == 0) {
    a.endpoint = where;
    return a;
  }
  if (!fs::is_directory(where))
    return invalid_input(where + ": neither a run directory nor a tcp://HOST:PORT address");
  const std::string file = where + "/join.json";
  std::ifstream in(file);
  if (!in)
    return invalid_input(file + ": not found: the run in " + where +
                         " does not admit members (cluster.join: true), or it has not started yet");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("address") || !j["address"].is_string())
    return invalid_input(file + ": not a join file (a JSON object with \"address\")");
  a.endpoint = j["address"].get<std::string>();
  a.public_key = j.value("public_key", std::string());
  a.config_file = where + "/config.resolved.yaml";
  return a;
}

Status write_join_file(const std::string& run_dir, const std::string& endpoint, const std::string& public_key) {
  json j{{"address", endpoint}, {"public_key", public_key}};
  return write_file_atomic(run_dir + "/join.json", j.dump(1) + "\n");
}

Result<std::unique_ptr<runtime::ActorSystem>> connect_to_job(
    const actors::ExperimentConfig& cfg, const std::string& yaml_dir, const JobAddress& job, const std::string& role,
    const std::string& server_key_file, const std::function<Status(runtime::ActorSystem&)>& before) {
  const auto& c = cfg.cluster;
  runtime::SystemConfig sc;
  std::random_device rd;
  sc.node_id = (1u << 20) + (static_cast<std::uint32_t>(rd()) % (1u << 30));  // a fresh id: the job refuses one in use
  sc.role = role;
  sc.threads = 3;
  sc.heartbeat.interval = std::chrono::milliseconds(static_cast<int64_t>(c.heartbeat_s * 1000));
  sc.heartbeat.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.peer_timeout_s * 1000));
  sc.allow_nonlocal_bind = c.bind_host != "127.0.0.1" && c.bind_host != "localhost";
  auto host = runtime::resolve_bind_host(c.bind_host);
  if (!host.ok()) return invalid_input("cluster.bind_host: " + host.error().message);
  sc.bind = "tcp://" + *host + ":*";
  std::string server_key;
  if (c.curve) {
    sc.curve = runtime::CurveConfig{true, in_dir(yaml_dir, c.curve_public_key), in_dir(yaml_dir, c.curve_secret_key),
                                    in_dir(yaml_dir, c.curve_authorized_keys)};
    std::string file = server_key_file;
    if (file.empty() && job.public_key.empty()) file = sc.curve.public_key_file;
    if (!file.empty()) {
      TROUPE_ASSIGN_OR_RETURN(auto keys, runtime::load_authorized_keys(file));
      if (keys.empty()) return invalid_input(file + ": no CURVE public key in the file (the job's key)");
      server_key = keys.front();
    } else {
      server_key = job.public_key;
    }
  }
  TROUPE_ASSIGN_OR_RETURN(auto sys, runtime::ActorSystem::create(sc));
  if (before) TROUPE_TRY(before(*sys));
  TROUPE_TRY(sys->connect({runtime::PeerInfo{0, job.endpoint, "coordinator", server_key}}));
  return sys;
}

}  // namespace troupe::launch
