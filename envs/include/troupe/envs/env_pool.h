// EnvPool: one env served by several running servers (an `envs:` entry's `addresses:`). Each
// episode goes to the member with the fewest episodes in flight; a member whose call crashed, hung
// past timeout_s or lost its connection leaves the pool (that call fails, so its episode is retried
// elsewhere by the caller) until a probe finds it answering again. Invariant: an episode lives on
// one member from its reset to its release, and no new call goes to a member out of the pool.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/envs/client.h"

namespace troupe::envs {

// One member as EnvPool::members() reports it (a copy).
struct PoolMember {
  std::string address;
  bool up = false;           // in the pool: new episodes may go to it
  int in_flight = 0;         // its episodes (reset .. release) and verify calls now
  int64_t episodes = 0;      // resets it has taken
  int failures = 0;          // times it left the pool
  std::string last_error;    // why it last left ("" = never)
};

class EnvPool final : public EnvClient {
 public:
  // Connects to every address of spec.addresses at once, each within startup_timeout_s; at least
  // one must answer (the others start out of the pool and are probed). Members are clients of
  // spec's type (remote, nemo_gym, verifiers) built as for a single `address`/`url`.
  static Result<std::shared_ptr<EnvPool>> open(const EnvSpec& spec);
  ~EnvPool() override;
  EnvPool(const EnvPool&) = delete;
  EnvPool& operator=(const EnvPool&) = delete;

  // Adds a running server (e.g. one that joined the job): it must answer within startup_timeout_s
  // and serve the pool's env (same name). An address already in the pool is an error.
  Status add_member(const std::string& address);
  // Takes a member out for good: no new episode goes to it; its episodes in flight fail at their
  // next call (peer_failed, so they are retried elsewhere). An unknown address is an error.
  Status remove_member(const std::string& address);
  std::vector<PoolMember> members() const;
  // Seconds between probes of a member out of the pool, and the deadline of each probe's hello.
  static constexpr double kProbeInterval = 1.0;
  static constexpr double kProbeDeadline = 5.0;

  const EnvInfo& info() const override { return info_; }
  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override;
  Result<StepResult> step(const std::string& episode_id, const std::string& action) override;
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override;
  bool runs_episodes() const override { return runs_episodes_; }
  Result<RunResult> run(const std::string& episode_id, const RunRequest& request) override;
  void release(const std::string& episode_id) override;
  bool concurrent() const override { return true; }
  // The members' eval metrics merged: each name the mean of theirs weighted by their "episodes".
  Result<json> aggregate_eval() override;

  struct Member;  // env_pool.cpp

 private:
  explicit EnvPool(EnvSpec spec);
  // A client of the server at `address` (a copy of the pool's spec with that one address); with
  // env_name, a server that serves another env is refused.
  Result<std::shared_ptr<EnvClient>> connect(const std::string& address, double startup_timeout_s,
                                             const std::string& env_name) const;
  std::shared_ptr<Member> pick(std::shared_ptr<EnvClient>& client);
  template <class T, class F>
  Result<T> on_session(const std::string& episode_id, const char* op, F call);
  void take_out(Member& m, const std::shared_ptr<EnvClient>& client, const Error& why);
  void probe_loop();
  void log(const std::string& line) const;

  EnvSpec spec_;  // the pool's entry; members are copies with one address
  EnvInfo info_;
  bool runs_episodes_ = false;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a member came back or left; the pool stops
  std::vector<std::shared_ptr<Member>> members_;
  struct Session {
    std::shared_ptr<Member> member;
    std::shared_ptr<EnvClient> client;  // the member's client at reset: a later one lost the episode
  };
  std::map<std::string, Session> sessions_;
  bool stopping_ = false;
  std::thread prober_;
};

// The pool of an entry with `addresses:` as the EnvClient the env workers use. Env workers of one
// process share one pool per entry (same spec): one view of the members' load and health.
Result<std::unique_ptr<EnvClient>> make_pool_client(const EnvSpec& spec);
// The live pools of env `name` in this process (a server that joins is added with add_member).
std::vector<std::shared_ptr<EnvPool>> find_env_pools(const std::string& name);
// An address a pool member may have: tcp://HOST:PORT or ipc://PATH, or for http (nemo_gym)
// http://HOST:PORT. The error names the address and the form expected.
Status check_pool_address(const std::string& address, bool http);

}  // namespace troupe::envs
