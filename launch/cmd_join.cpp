// `troupe join RUN_DIR|ADDRESS --role generator|scorer|env [--config YAML] [--set k=v]...`: this
// process becomes a member of a running job (cluster.join): it hosts one generator or scorer (or,
// --role env, announces the running env server at --env-address for env --env's pool), asks the
// job's coordinator to admit it, and serves until the job ends (exit 0), SIGTERM/SIGINT (it leaves
// after the work it has is done: exit 0) or a refusal (exit 2) / no answer (exit 3).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include <unistd.h>

#include "troupe/actors/messages.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/scorer.h"
#include "troupe/launch/commands.h"
#include "troupe/launch/config.h"
#include "troupe/launch/member.h"

namespace troupe::launch {
namespace {

std::atomic<int> g_leave_signal{0};
void on_leave_signal(int sig) { g_leave_signal.store(sig); }

struct JoinOpts {
  std::string where, role = "generator", config, server_key, env, env_address;
  std::vector<std::string> sets;
  double join_timeout_s = 60, drain_timeout_s = 600;
};

// The member's role object as an actor factory, spawned under the role's name.
Result<runtime::ActorId> spawn_member(runtime::ActorSystem& sys, const actors::ExperimentConfig& cfg,
                                      const std::string& role) {
  const int threads = actors::role_threads(cfg.cluster, role, 0);
  runtime::SpawnOptions so;
  so.name = role;
  if (role == "generator") {
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::Generator> gen, actors::Generator::create(cfg));
    const int nice = cfg.cluster.generator_nice;
    // index: out of cluster.generators' range, so faults.generator_death_* never picks a member
    return sys.spawn([gen, threads, nice]() -> std::unique_ptr<runtime::Actor> {
      return std::make_unique<actors::GeneratorActor>(gen, threads, nice, 1 << 30, true);
    }, so);
  }
  TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::Scorer> sc,
                          actors::Scorer::create(actors::scorer_model_paths(cfg), cfg.policy,
                                                 cfg.distill.teacher_dtype));
  return sys.spawn([sc, threads]() -> std::unique_ptr<runtime::Actor> {
    return std::make_unique<actors::ScorerActor>(sc, threads);
  }, so);
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("?");
}

// After the JoinRep: serve until the job is gone or a signal says leave (then drain).
int serve_until_done(runtime::ActorSystem& sys, const JoinOpts& o, const std::string& name) {
  std::signal(SIGTERM, on_leave_signal);
  std::signal(SIGINT, on_leave_signal);
  const runtime::ActorId coordinator = runtime::ActorSystem::named(0, "coordinator");
  for (;;) {
    if (sys.node_is_down(0)) {
      std::fprintf(stderr, "troupe join: %s: the job at %s ended (or went silent); done\n", name.c_str(), o.where.c_str());
      return 0;
    }
    if (int sig = g_leave_signal.load()) {
      std::fprintf(stderr, "troupe join: %s: signal %d: leaving once the work sent to it is done\n", name.c_str(), sig);
      auto left = sys.ask<actors::LeaveRep>(coordinator, actors::LeaveReq{sys.node_id()},
                                            std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000)));
      Result<actors::LeaveRep> r = left.get();
      if (!r.ok()) {
        std::fprintf(stderr, "troupe join: %s: leaving: %s\n", name.c_str(), r.error().message.c_str());
        return 1;
      }
      std::fprintf(stderr, "troupe join: %s: left the job after step %lld\n", name.c_str(), static_cast<long long>(r->step));
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The JoinReq's role-specific part: an env server's env and address, or the member's model.
Status describe_member(const JoinOpts& o, const actors::ExperimentConfig& cfg, actors::JoinReq& req) {
  req.role = o.role;
  if (o.role == "env") {
    if (o.env.empty() || o.env_address.empty())
      return invalid_input("--role env needs --env NAME (the job's envs[].name) and --env-address ADDRESS (the "
                           "running server's, e.g. tcp://HOST:PORT from `troupe env serve ... --bind`)");
    req.env = o.env;
    req.env_address = o.env_address;
    req.capacity = 0;
    return {};
  }
  if (!o.env.empty() || !o.env_address.empty())
    return invalid_input("--env and --env-address go with --role env only");
  TROUPE_ASSIGN_OR_RETURN(auto identity, member_model_identity(cfg));
  req.capacity = actors::role_threads(cfg.cluster, o.role, static_cast<int>(std::thread::hardware_concurrency()));
  req.model_hash = identity.hash;
  req.model_name = identity.name;
  return {};
}

int run_join(const JoinOpts& o) {
  if (o.role != "generator" && o.role != "scorer" && o.role != "env")
    return report_error(invalid_input("--role " + o.role + ": a member joins as generator, scorer or env"));
  auto job = resolve_job_address(o.where);
  if (!job.ok()) return report_error(job.error());
  const std::string config = !o.config.empty() ? o.config : job->config_file;
  if (config.empty())
    return report_error(invalid_input(o.where + ": a tcp address needs --config YAML (the job's experiment config)"));
  auto loaded = load_config(config, o.sets);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
    return 2;
  }
  const actors::ExperimentConfig& cfg = loaded->config;
  actors::JoinReq req;
  if (Status st = describe_member(o, cfg, req); !st.ok()) return report_error(st.error());
  const std::string yaml_dir = std::filesystem::path(config).parent_path().string();
  auto sys = connect_to_job(cfg, yaml_dir.empty() ? "." : yaml_dir, *job, "joined-" + o.role, o.server_key,
                            [&](runtime::ActorSystem& node) -> Status {
                              if (o.role == "env") return {};  // (the server runs on its own)
                              TROUPE_ASSIGN_OR_RETURN(runtime::ActorId id, spawn_member(node, cfg, o.role));
                              (void)id;
                              return {};
                            });
  if (!sys.ok()) return report_error(sys.error());
  req.node = (*sys)->node_id();
  req.endpoint = (*sys)->endpoint();
  req.curve_public_key = (*sys)->curve_public_key();
  req.host = host_name();
  auto asked = (*sys)->ask<actors::JoinRep>(runtime::ActorSystem::named(0, "coordinator"), req,
                                            std::chrono::milliseconds(static_cast<int64_t>(o.join_timeout_s * 1000)));
  Result<actors::JoinRep> rep = asked.get();
  // no answer: the request timed out, or rank 0 was silent for cluster.peer_timeout_s first
  if (!rep.ok() && (rep.error().code == ErrorCode::timeout || rep.error().code == ErrorCode::peer_failed))
    return report_error(make_error(ErrorCode::peer_failed,
                                   "no answer from the job at " + job->endpoint + " (" + rep.error().message +
                                       "): it is not running there, or (cluster.curve) this member's public key is "
                                       "not in the job's authorized keys file (the job logs the refusal with this "
                                       "host's address)"));
  if (!rep.ok()) return report_error(make_error(rep.error().code, "the job at " + job->endpoint +
                                                                      " refused this " + o.role + ": " + rep.error().message));
  const std::string what = o.role == "env" ? "env '" + o.env + "' served at " + o.env_address
                                           : "model " + req.model_name + " (" + req.model_hash + ")";
  std::fprintf(stderr, "troupe join: joined the job at %s as %s at step %lld (policy version %lld); %s\n",
               job->endpoint.c_str(), rep->name.c_str(), static_cast<long long>(rep->step),
               static_cast<long long>(rep->version), what.c_str());
  const int code = serve_until_done(**sys, o, rep->name);
  (*sys)->shutdown();
  return code;
}

}  // namespace

Command add_join_command(CLI::App& root) {
  auto o = std::make_shared<JoinOpts>();
  auto* app = root.add_subcommand("join", "Join a running job (cluster.join) as a generator, scorer or env server, from any host");
  app->add_option("address", o->where, "The job: its run directory (join.json) or rank 0's tcp://HOST:PORT")->required();
  app->add_option("--role", o->role, "generator, scorer or env (a running env server joining an env's pool)")
      ->check(CLI::IsMember({"generator", "scorer", "env"}));
  app->add_option("--env", o->env, "--role env: the job's env (an envs[].name with addresses:) the server joins");
  app->add_option("--env-address", o->env_address,
                  "--role env: the running server's address (tcp://HOST:PORT, ipc://PATH; nemo_gym: http://HOST:PORT)");
  app->add_option("--config", o->config, "The job's experiment YAML (default: RUN_DIR/config.resolved.yaml)");
  app->add_option("--set", o->sets, "Override a key of the config for this member: --set cluster.generator_threads=2");
  app->add_option("--server-key", o->server_key, "cluster.curve: the job's public key file (default: join.json's key)");
  app->add_option("--join-timeout-s", o->join_timeout_s, "Give up when the job does not answer within this")
      ->check(CLI::Range(0.1, 86400.0));
  app->add_option("--drain-timeout-s", o->drain_timeout_s, "On SIGTERM: wait at most this long for the work it has")
      ->check(CLI::Range(0.1, 86400.0));
  return {app, [o]() { return run_join(*o); }};
}

}  // namespace troupe::launch
