// What `troupe join` and `troupe status` share: where a running job is (a run directory's
// join.json, or a tcp address), the identity of a model config (its hash: members with another
// model are refused by name), and a node of this process connected to the job's rank 0 with the
// config's CURVE keys. Invariant: a member's model hash depends only on what it samples with
// (policy.model, policy.tokenizer, policy.lora and the files of policy.path), never on paths,
// threads or hosts.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/result.h"
#include "troupe/runtime/system.h"

namespace troupe::launch {

struct ModelIdentity {
  std::string hash;  // xxh3, 16 hex digits
  std::string name;  // policy.path, or "policy.model (FAMILY, L layers, hidden C, vocab V)"
};
Result<ModelIdentity> member_model_identity(const actors::ExperimentConfig& cfg);

// A running job: rank 0's endpoint and CURVE public key ("" without CURVE), and its config file
// when known (a run directory's config.resolved.yaml).
struct JobAddress {
  std::string endpoint, public_key, config_file;
};
// RUN_DIR (its join.json, written by a run with cluster.join) or tcp://HOST:PORT; an error names
// the file or the value.
Result<JobAddress> resolve_job_address(const std::string& where);
// RUN_DIR/join.json for the members to come.
Status write_join_file(const std::string& run_dir, const std::string& endpoint, const std::string& public_key);

// This process's node (a fresh node id, `role`), bound on cluster.bind_host, with cluster.curve's
// keys (relative to yaml_dir) when on, connected to the job's rank 0 as node 0. Under CURVE the
// job's public key is server_key_file's when given, else the address's, else the config's own
// cluster.curve_public_key (members sharing the job's YAML share its key pair). `before` runs on
// the bound node before it connects (spawning its actors: the job's heartbeats count from then).
Result<std::unique_ptr<runtime::ActorSystem>> connect_to_job(
    const actors::ExperimentConfig& cfg, const std::string& yaml_dir, const JobAddress& job, const std::string& role,
    const std::string& server_key_file, const std::function<Status(runtime::ActorSystem&)>& before = {});

}  // namespace troupe::launch
