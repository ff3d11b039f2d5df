// `troupe status RUN_DIR|ADDRESS [--json]`: the members of a running job (learners, generators with
// the policy version each holds, their load and failures, env workers, scorers, and the members
// that joined or left), from RUN_DIR/members.json (written by a run with cluster.join) or asked of
// the job's coordinator at tcp://HOST:PORT (with --config's CURVE keys). Exit 2 naming the file or
// address when there is nothing to read.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "troupe/actors/messages.h"
#include "troupe/launch/commands.h"
#include "troupe/launch/config.h"
#include "troupe/launch/member.h"

namespace troupe::launch {
namespace {

using json = nlohmann::json;

struct StatusOpts {
  std::string where, config, server_key;
  std::vector<std::string> sets;
  bool as_json = false;
  double timeout_s = 10;
};

Result<json> read_members_file(const std::string& dir) {
  const std::string file = dir + "/members.json";
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": not found: the run has no cluster.join, or has not started yet");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("members"))
    return invalid_input(file + ": not a members file (a JSON object with \"members\")");
  return j;
}

Result<json> ask_job(const StatusOpts& o) {
  TROUPE_ASSIGN_OR_RETURN(JobAddress job, resolve_job_address(o.where));
  if (o.config.empty()) return invalid_input(o.where + ": a tcp address needs --config YAML (for cluster.curve's keys)");
  auto loaded = load_config(o.config, o.sets);
  if (!loaded.ok()) return loaded.error();
  const std::string dir = std::filesystem::path(o.config).parent_path().string();
  TROUPE_ASSIGN_OR_RETURN(auto sys, connect_to_job(loaded->config, dir.empty() ? "." : dir, job, "status", o.server_key));
  actors::MembersReq req{sys->endpoint(), sys->curve_public_key()};
  auto asked = sys->ask<actors::MembersRep>(runtime::ActorSystem::named(0, "coordinator"), req,
                                            std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  Result<actors::MembersRep> rep = asked.get();
  sys->shutdown();
  if (!rep.ok()) return make_error(rep.error().code, "the job at " + o.where + ": " + rep.error().message);
  json j = json::parse(rep->json, nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::internal, "the job at " + o.where + " sent a status that is not JSON");
  return j;
}

std::string text_of(const json& row, const char* key) {
  if (!row.contains(key)) return "-";
  const json& v = row[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void print_table(const json& j) {
  std::printf("step %s, policy version %s\n", text_of(j, "step").c_str(), text_of(j, "version").c_str());
  std::printf("%-12s %-9s %-10s %-8s %-7s %-9s %-8s %-10s %-8s %s\n", "member", "role", "node", "state", "version",
              "requests", "samples", "step_load", "failures", "host");
  for (const json& r : j["members"])
    std::printf("%-12s %-9s %-10s %-8s %-7s %-9s %-8s %-10s %-8s %s\n", text_of(r, "name").c_str(),
                text_of(r, "role").c_str(), text_of(r, "node").c_str(), text_of(r, "state").c_str(),
                text_of(r, "version").c_str(), text_of(r, "requests").c_str(), text_of(r, "samples").c_str(),
                text_of(r, "last_step_samples").c_str(), text_of(r, "failures").c_str(), text_of(r, "host").c_str());
}

}  // namespace

Command add_status_command(CLI::App& root) {
  auto o = std::make_shared<StatusOpts>();
  auto* app = root.add_subcommand("status", "List the members of a running job: versions, load, failures");
  app->add_option("where", o->where, "The run directory (members.json), or the job's tcp://HOST:PORT")->required();
  app->add_option("--config", o->config, "With a tcp address: the job's experiment YAML (its CURVE keys)");
  app->add_option("--set", o->sets, "Override a key of --config");
  app->add_option("--server-key", o->server_key, "cluster.curve: the job's public key file");
  app->add_flag("--json", o->as_json, "Print the JSON as the job wrote it");
  return {app, [o]() {
            Result<json> j = o->where.rfind("tcp://", 0) == 0 ? ask_job(*o) : read_members_file(o->where);
            if (!j.ok()) return report_error(j.error());
            if (o->as_json)
              std::printf("%s\n", j->dump(1).c_str());
            else
              print_table(*j);
            return 0;
          }};
}

}  // namespace troupe::launch
