// EnvClient: how the env actor talks to an environment, whatever it is (built-in, .so plug-in,
// remote process). Episodes are sessions keyed by an episode id, so one client runs many episodes
// at once. Remote and isolated clients enforce a timeout on every call, detect a dead worker
// (signal, exit), restart it, and fail only the episodes that were on it.
//
// YAML (launch converts to JSON and calls parse_env_specs):
//   envs:
//     - {name: arithmetic, type: builtin, weight: 1.0, config: {digits: 1}}
//     - {name: rev, type: plugin, path: build/lib/libreverse_env.so, timeout_s: 5}
//     - {name: rg, type: remote, command: [python, envs/python/examples/reasoning_gym_env.py]}
//     - {name: mine, type: remote, address: tcp://127.0.0.1:5555}
//     - {name: ng, type: nemo_gym, url: http://127.0.0.1:8000, config: {data: rows.jsonl}}
//     - {name: vf, type: verifiers, address: tcp://127.0.0.1:5000, config: {tasks: [...]}}
//     - {name: pooled, type: remote, addresses: [tcp://10.0.0.1:5555, tcp://10.0.0.2:5555]}
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/envs/env.h"
#include "troupe/envs/faults.h"
#include "troupe/envs/registry.h"
#include "troupe/envs/reward_model_spec.h"
#include "troupe/envs/trajectory.h"

namespace troupe::envs {

enum class EnvType { builtin, plugin, remote, nemo_gym, verifiers };

struct EnvSpec {
  std::string name;                   // instance name: metrics key reward_mean/<name>
  EnvType type = EnvType::builtin;
  std::string env;                    // built-in name (default: name)
  double weight = 1.0;                // share of prompts drawn from this env
  json config = json::object();       // passed to the env's factory / plug-in create / remote hello
  std::string path;                   // plugin: the .so
  std::vector<std::string> command;   // remote: troupe starts this ({bind} -> address; also $TROUPE_ENV_BIND)
  std::string address;                // remote: connect here (without command: an already running server); verifiers: its env server
  std::vector<std::string> addresses; // remote/nemo_gym/verifiers: a pool of running servers (env_pool.h) instead of address/url
  bool isolate = false;               // builtin/plugin: run in a troupe-env-worker process (plugin default: true)
  double timeout_s = 30;              // every reset/step/verify call
  double startup_timeout_s = 60;      // a started worker must answer hello within this
  int max_restarts = 100;             // worker restarts before the client gives up (peer_failed)
  int max_message_bytes = 64 << 20;   // ZMQ_MAXMSGSIZE of the env protocol sockets (a larger message drops the connection)
  std::string worker;                 // troupe-env-worker binary (default: $TROUPE_ENV_WORKER, build dir, next to exe)
  int max_retries = 2;                // a failed episode is retried this often (on the next env worker)
  double max_failure_frac = 0.5;      // more episodes of one step failing (after retries) stops the run
  double reward_min = -1e6, reward_max = 1e6;  // a reward outside (or not finite) fails the episode
  EnvFaults faults;                   // injected faults (the YAML faults: section; off by default)
  std::string url;                    // nemo_gym: a running resource server (http://HOST:PORT); else `command`
  std::map<std::string, std::string> environment;  // `command`: variables set in its environment
  std::string cwd;                    // `command`: its working directory ("" = troupe's)
  std::string log_dir;                // where the logs of the processes troupe starts go (a run's logs/; "" = a
                                      // temporary file removed when the process stops)
  // type: reward_model (a builtin dataset env whose responses a sequence-classification model scores):
  // its path, score_template and center; nullopt for every other env.
  std::optional<RewardModelSpec> reward_model;
};

// Checks types, required keys and unknown keys; errors start with `where` (e.g. "config.yaml: envs[1]").
Result<EnvSpec> parse_env_spec(const json& j, const std::string& where);
Result<std::vector<EnvSpec>> parse_env_specs(const json& list, const std::string& where);
json to_json(const EnvSpec& spec);

// An episode the env runs itself (a verifiers environment): it calls the model through an
// OpenAI-compatible endpoint for every turn and answers with the reward.
struct RunRequest {
  json metadata = json::object();  // what reset() gave the episode (the task data)
  std::string base_url;            // the model endpoint (.../v1)
  std::string model;               // the model name the env sends (names the episode to troupe's endpoint)
  json sampling = json::object();  // temperature, top_p, max_tokens, ...
};
struct RunResult {
  double reward = 0;
  std::map<std::string, double> components;
  json info = json::object();
};

class EnvClient {
 public:
  virtual ~EnvClient() = default;
  virtual const EnvInfo& info() const = 0;
  // Starts (or restarts) episode `episode_id`.
  virtual Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) = 0;
  virtual Result<StepResult> step(const std::string& episode_id, const std::string& action) = 0;
  // Stateless single-call scoring.
  virtual Result<VerifyResult> verify(const json& metadata, const std::string& completion) = 0;
  // Envs that drive the model themselves (runs_episodes()): one whole episode.
  virtual bool runs_episodes() const { return false; }
  virtual Result<RunResult> run(const std::string& episode_id, const RunRequest& request) {
    (void)request;
    return invalid_input("env '" + info().name + "' does not run episodes itself (episode '" + episode_id + "')");
  }
  // Ends an episode and frees its resources. Never fails; unknown ids are ignored. Call it for
  // every episode, also failed ones (EpisodeGuard does).
  virtual void release(const std::string& episode_id) = 0;
  // Worker restarts so far (0 for in-process clients).
  virtual int restarts() const { return 0; }
  // True once the client gave up (more than max_restarts restarts): every later call fails.
  virtual bool gave_up() const { return false; }
  // True when calls may run concurrently from several threads, each with its own deadline (a
  // server at `address:` that troupe did not start).
  virtual bool concurrent() const { return false; }
  // The worker process id, or -1 (in-process, or a server troupe did not start).
  virtual int worker_pid() const { return -1; }
  // Fault injection (faults.h): the next reply read from the wire is replaced by bytes that are not
  // JSON. False where there is no wire (in-process clients).
  virtual bool corrupt_next_reply() { return false; }
  // Fault injection: the next request is not sent (lost on the wire), so the call runs into its
  // deadline. False where there is no wire.
  virtual bool drop_next_request() { return false; }
  // Metrics over the eval-split episodes scored since the last call, as {name: number} (nemo_gym:
  // the server's /aggregate_metrics, with "episodes"); an empty object for envs without any.
  virtual Result<json> aggregate_eval() { return json::object(); }
};

// Builds the client the spec asks for: in-process (builtin, plugin with isolate: false),
// an isolated worker process (builtin/plugin with isolate: true), remote (command / address), a
// NeMo Gym resource server over HTTP (nemo_gym: url / command), or a pool of running servers
// (addresses: env_pool.h).
Result<std::unique_ptr<EnvClient>> make_env_client(const EnvSpec& spec);
// A client of a verifiers (v1) environment server (client_verifiers.cpp): ZeroMQ DEALER + msgpack,
// `health` at start-up, `run` per episode (the task data, the episode's model endpoint and the
// sampling args), `cancel` for a run past timeout_s. Its tasks come from the spec's config.
Result<std::unique_ptr<EnvClient>> make_verifiers_client(const EnvSpec& spec);
// In-process client over any factory (tests, the server side of the protocol).
std::unique_ptr<EnvClient> make_local_client(EnvFactory factory, json config, EnvInfo info);
Result<std::unique_ptr<EnvClient>> make_local_client(EnvFactory factory, json config);

// Markers in error messages that say what kind of failure it was (termination_for reads them).
inline constexpr const char* kProtocolErrorTag = "protocol error: ";
inline constexpr const char* kInvalidRewardTag = "invalid reward: ";

// How an error from an EnvClient ends the episode: a malformed reply -> protocol_error, a bad
// reward -> invalid_reward, a reward hook's "reward_timeout: " (reward_crash, reward_error,
// reward_bad_return) or a judge's "judge_http: " (judge_timeout, judge_parse) -> that reason,
// timeout -> timeout, peer_failed -> worker_crash, else env_error.
Termination termination_for(const Error& error);
// The reward check every env call's reward passes: finite and within [spec.reward_min, spec.reward_max].
// The error names the env and `what` (e.g. "verify of episode 'x'").
Status check_reward(const EnvSpec& spec, double reward, const std::string& what);

// Releases an episode when it goes out of scope, whatever happened to it.
class EpisodeGuard {
 public:
  EpisodeGuard(EnvClient& client, std::string episode_id) : client_(&client), id_(std::move(episode_id)) {}
  ~EpisodeGuard() {
    if (client_) client_->release(id_);
  }
  EpisodeGuard(const EpisodeGuard&) = delete;
  EpisodeGuard& operator=(const EpisodeGuard&) = delete;

 private:
  EnvClient* client_;
  std::string id_;
};

// The path of the troupe-env-worker binary (spec.worker, $TROUPE_ENV_WORKER, the build dir, or
// next to the running executable), or an error saying where it looked.
Result<std::string> find_env_worker(const std::string& configured);

}  // namespace troupe::envs
