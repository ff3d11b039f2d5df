// EnvPool (env_pool.h): episodes spread over running env servers by load, members that fail taken
// out and probed back in, and the process-wide registry that lets env workers share one pool.
// Invariant: every session names the member and member client it was reset on; a call on a session
// whose member left the pool (or was replaced) fails instead of reaching a server that lost it.
#include "troupe/envs/env_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <set>

#include "troupe/base/clock.h"
#include "troupe/envs/eval_metrics_mean.h"

namespace troupe::envs {

Result<std::unique_ptr<EnvClient>> make_single_env_client(const EnvSpec& spec);  // client.cpp

struct EnvPool::Member {
  std::string address;
  std::shared_ptr<EnvClient> client;  // null while out of the pool
  bool up = false, removed = false;
  int in_flight = 0, failures = 0;
  int64_t episodes = 0;
  std::string last_error;
  double next_probe = 0;
};

namespace {

bool valid_port(const std::string& p) {
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  const int v = std::stoi(p);
  return v >= 1 && v <= 65535;
}

// HOST:PORT with a host that is a name or an address (no wildcard, no path).
bool valid_host_port(const std::string& hp) {
  const auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string host = hp.substr(0, colon);
  if (host == "*" || host.find_first_of("/ ") != std::string::npos) return false;
  return valid_port(hp.substr(colon + 1));
}

// A call's failure that says the member is unwell (no answer, lost connection, a crash) rather
// than that the env refused the episode or answered malformed.
bool member_failure(const Error& e) {
  if (e.message.find(kProtocolErrorTag) != std::string::npos) return false;
  return e.code == ErrorCode::timeout || e.code == ErrorCode::io || e.code == ErrorCode::peer_failed;
}

}  // namespace

Status check_pool_address(const std::string& a, bool http) {
  if (http) {
    std::string rest = a.rfind("http://", 0) == 0 ? a.substr(7) : "";
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (valid_host_port(rest)) return {};
    return invalid_input("'" + a + "' is not a resource server's address (http://HOST:PORT)");
  }
  if (a.rfind("tcp://", 0) == 0 && valid_host_port(a.substr(6))) return {};
  if (a.rfind("ipc://", 0) == 0 && a.size() > 6) return {};
  return invalid_input("'" + a + "' is not an env server's address (tcp://HOST:PORT or ipc://PATH)");
}

EnvPool::EnvPool(EnvSpec spec) : spec_(std::move(spec)) {}

EnvPool::~EnvPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (prober_.joinable()) prober_.join();
}

void EnvPool::log(const std::string& line) const {
  std::fprintf(stderr, "troupe: env '%s': %s\n", spec_.name.c_str(), line.c_str());
}

Result<std::shared_ptr<EnvClient>> EnvPool::connect(const std::string& address, double startup_timeout_s,
                                                    const std::string& env_name) const {
  EnvSpec one = spec_;
  one.addresses.clear();
  one.faults = EnvFaults{};
  one.startup_timeout_s = startup_timeout_s;
  (one.type == EnvType::nemo_gym ? one.url : one.address) = address;
  TROUPE_ASSIGN_OR_RETURN(auto c, make_single_env_client(one));
  if (!env_name.empty() && c->info().name != env_name)
    return invalid_input(address + " serves env '" + c->info().name + "', the pool serves '" + env_name + "'");
  return std::shared_ptr<EnvClient>(std::move(c));
}

Result<std::shared_ptr<EnvPool>> EnvPool::open(const EnvSpec& spec) {
  if (spec.addresses.empty()) return invalid_input("env " + spec.name + ": a pool needs at least one address");
  std::shared_ptr<EnvPool> pool(new EnvPool(spec));
  std::vector<std::future<Result<std::shared_ptr<EnvClient>>>> tries;
  for (const auto& a : spec.addresses) TROUPE_TRY(check_pool_address(a, spec.type == EnvType::nemo_gym));
  for (const auto& a : spec.addresses)
    tries.push_back(std::async(std::launch::async, [&pool, &spec, a] { return pool->connect(a, spec.startup_timeout_s, ""); }));
  std::string errors;
  for (size_t i = 0; i < tries.size(); ++i) {
    auto m = std::make_shared<Member>();
    m->address = spec.addresses[i];
    auto c = tries[i].get();
    if (c.ok() && (pool->info_.name.empty() || (*c)->info().name == pool->info_.name)) {
      if (pool->info_.name.empty()) {
        pool->info_ = (*c)->info();
        pool->runs_episodes_ = (*c)->runs_episodes();
      }
      m->client = std::move(c).value();
      m->up = true;
    } else {
      m->last_error = c.ok() ? m->address + " serves env '" + (*c)->info().name + "', the pool serves '" +
                                   pool->info_.name + "'"
                             : c.error().message;
      m->failures = 1;
      m->next_probe = mono_seconds() + kProbeInterval;
      errors += (errors.empty() ? "" : "; ") + m->last_error;
    }
    pool->members_.push_back(std::move(m));
  }
  if (pool->info_.name.empty())
    return make_error(ErrorCode::peer_failed, "env " + spec.name + ": no server of the pool answered (" + errors + ")");
  for (const auto& m : pool->members_)
    if (!m->up) pool->log("pool member " + m->address + " is out of the pool from the start (" + m->last_error + ")");
  pool->prober_ = std::thread([p = pool.get()] { p->probe_loop(); });
  return pool;
}

Status EnvPool::add_member(const std::string& address) {
  TROUPE_TRY(check_pool_address(address, spec_.type == EnvType::nemo_gym));
  {
    std::lock_guard lock(mu_);
    for (const auto& m : members_)
      if (m->address == address) return invalid_input("env " + spec_.name + ": " + address + " is already in the pool");
  }
  auto c = connect(address, spec_.startup_timeout_s, info_.name);
  if (!c.ok()) return Error{c.error().code, "env " + spec_.name + ": " + address + " cannot join the pool: " + c.error().message};
  auto m = std::make_shared<Member>();
  m->address = address;
  m->client = std::move(c).value();
  m->up = true;
  {
    std::lock_guard lock(mu_);
    for (const auto& other : members_)
      if (other->address == address) return invalid_input("env " + spec_.name + ": " + address + " is already in the pool");
    members_.push_back(std::move(m));
  }
  changed_.notify_all();
  log("pool member " + address + " joined the pool");
  return {};
}

Status EnvPool::remove_member(const std::string& address) {
  std::lock_guard lock(mu_);
  for (auto it = members_.begin(); it != members_.end(); ++it) {
    if ((*it)->address != address) continue;
    (*it)->removed = true;
    (*it)->up = false;
    (*it)->client.reset();
    members_.erase(it);
    log("pool member " + address + " left the pool");
    return {};
  }
  return invalid_input("env " + spec_.name + ": " + address + " is not in the pool");
}

std::vector<PoolMember> EnvPool::members() const {
  std::lock_guard lock(mu_);
  std::vector<PoolMember> out;
  for (const auto& m : members_) out.push_back({m->address, m->up, m->in_flight, m->episodes, m->failures, m->last_error});
  return out;
}

// The member in the pool with the fewest episodes in flight (the first listed on a tie), waiting up
// to timeout_s for one to come back when none is in; null when none did. Counts the caller in.
std::shared_ptr<EnvPool::Member> EnvPool::pick(std::shared_ptr<EnvClient>& client) {
  std::unique_lock lock(mu_);
  const double deadline = mono_seconds() + spec_.timeout_s;
  for (;;) {
    std::shared_ptr<Member> best;
    for (const auto& m : members_)
      if (m->up && (!best || m->in_flight < best->in_flight)) best = m;
    if (best) {
      ++best->in_flight;
      client = best->client;
      return best;
    }
    if (stopping_ || mono_seconds() >= deadline) return nullptr;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

void EnvPool::take_out(Member& m, const std::shared_ptr<EnvClient>& client, const Error& why) {
  if (!member_failure(why)) return;
  {
    std::lock_guard lock(mu_);
    if (!m.up || m.client != client) return;  // already out (or replaced since this call began)
    m.up = false;
    m.client.reset();
    ++m.failures;
    m.last_error = why.message;
    m.next_probe = mono_seconds() + kProbeInterval;
  }
  log("pool member " + m.address + " is out of the pool (" + why.message +
      "); its episodes are retried on the others; probed every " + std::to_string(static_cast<int>(kProbeInterval)) + " s");
}

namespace {
Error no_member(const EnvSpec& spec, const std::vector<PoolMember>& ms) {
  std::string why;
  for (const auto& m : ms) why += (why.empty() ? "" : "; ") + m.address + ": " + (m.last_error.empty() ? "out" : m.last_error);
  return make_error(ErrorCode::peer_failed, "env " + spec.name + ": no server of its pool answered within timeout_s " +
                                                std::to_string(spec.timeout_s) + " s (" + why + ")");
}
}  // namespace

Result<Observation> EnvPool::reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) {
  release(episode_id);  // a reset starts the episode anew
  std::shared_ptr<EnvClient> c;
  auto m = pick(c);
  if (!m) return no_member(spec_, members());
  auto r = c->reset(episode_id, seed, options);
  if (!r.ok()) {
    {
      std::lock_guard lock(mu_);
      --m->in_flight;
    }
    take_out(*m, c, r.error());
    return r;
  }
  std::lock_guard lock(mu_);
  ++m->episodes;
  sessions_[episode_id] = Session{m, c};
  return r;
}

template <class T, class F>
Result<T> EnvPool::on_session(const std::string& episode_id, const char* op, F call) {
  Session s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(episode_id);
    if (it == sessions_.end())
      return invalid_input("env " + spec_.name + ": " + op + " of episode '" + episode_id + "', which was not reset");
    s = it->second;
    if (!s.member->up || s.member->client != s.client)
      return make_error(ErrorCode::peer_failed, "env " + spec_.name + ": episode '" + episode_id + "' was on pool member " +
                                                    s.member->address + ", which left the pool (" +
                                                    (s.member->removed ? "removed" : s.member->last_error) + ")");
  }
  Result<T> r = call(*s.client);
  if (!r.ok()) take_out(*s.member, s.client, r.error());
  return r;
}

Result<StepResult> EnvPool::step(const std::string& episode_id, const std::string& action) {
  return on_session<StepResult>(episode_id, "step", [&](EnvClient& c) { return c.step(episode_id, action); });
}

Result<RunResult> EnvPool::run(const std::string& episode_id, const RunRequest& request) {
  return on_session<RunResult>(episode_id, "run", [&](EnvClient& c) { return c.run(episode_id, request); });
}

Result<VerifyResult> EnvPool::verify(const json& metadata, const std::string& completion) {
  std::shared_ptr<EnvClient> c;
  auto m = pick(c);
  if (!m) return no_member(spec_, members());
  auto r = c->verify(metadata, completion);
  {
    std::lock_guard lock(mu_);
    --m->in_flight;
  }
  if (!r.ok()) take_out(*m, c, r.error());
  return r;
}

void EnvPool::release(const std::string& episode_id) {
  Session s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(episode_id);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    --s.member->in_flight;
    if (!s.member->up || s.member->client != s.client) return;  // its server lost it already
  }
  s.client->release(episode_id);
}

Result<json> EnvPool::aggregate_eval() {
  std::vector<std::shared_ptr<EnvClient>> clients;
  {
    std::lock_guard lock(mu_);
    for (const auto& m : members_)
      if (m->up) clients.push_back(m->client);
  }
  EvalMetricsMean mean;
  for (const auto& c : clients) {
    TROUPE_ASSIGN_OR_RETURN(json m, c->aggregate_eval());
    mean.add(m);
  }
  json out = json::object();
  mean.write(out);
  return out;
}

// Every kProbeInterval, each member out of the pool is asked hello (a new client) within
// kProbeDeadline (or timeout_s, if shorter); one that answers is back in.
void EnvPool::probe_loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, std::chrono::milliseconds(200));
    std::vector<std::shared_ptr<Member>> due;
    const double now = mono_seconds();
    for (const auto& m : members_)
      if (!m->up && !m->removed && m->next_probe <= now) due.push_back(m);
    for (const auto& m : due) {
      if (stopping_) break;
      lock.unlock();
      auto c = connect(m->address, std::min({spec_.startup_timeout_s, spec_.timeout_s, kProbeDeadline}), info_.name);
      lock.lock();
      if (!c.ok() || m->removed) {
        m->next_probe = mono_seconds() + kProbeInterval;
        continue;
      }
      m->client = std::move(c).value();
      m->up = true;
      changed_.notify_all();
      lock.unlock();
      log("pool member " + m->address + " answers again: back in the pool");
      lock.lock();
    }
  }
}

namespace {

// The pools of this process by their entry (to_json of the spec), alive while a client holds one.
struct Registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<EnvPool>> pools;
  std::map<std::string, std::string> names;  // key -> env name
};
Registry& registry() {
  static auto* r = new Registry();  // never destroyed: pools may outlive static teardown
  return *r;
}

// The EnvClient an env worker holds: the shared pool behind it.
class SharedPoolClient final : public EnvClient {
 public:
  explicit SharedPoolClient(std::shared_ptr<EnvPool> pool) : pool_(std::move(pool)) {}
  const EnvInfo& info() const override { return pool_->info(); }
  Result<Observation> reset(const std::string& id, uint64_t seed, const ResetOptions& o) override { return pool_->reset(id, seed, o); }
  Result<StepResult> step(const std::string& id, const std::string& a) override { return pool_->step(id, a); }
  Result<VerifyResult> verify(const json& m, const std::string& c) override { return pool_->verify(m, c); }
  bool runs_episodes() const override { return pool_->runs_episodes(); }
  Result<RunResult> run(const std::string& id, const RunRequest& r) override { return pool_->run(id, r); }
  void release(const std::string& id) override { pool_->release(id); }
  bool concurrent() const override { return true; }
  Result<json> aggregate_eval() override { return pool_->aggregate_eval(); }

 private:
  std::shared_ptr<EnvPool> pool_;
};

}  // namespace

Result<std::unique_ptr<EnvClient>> make_pool_client(const EnvSpec& spec) {
  const std::string key = to_json(spec).dump();
  auto& r = registry();
  std::lock_guard lock(r.mu);  // one pool per entry, also when env workers start at once
  std::shared_ptr<EnvPool> pool = r.pools[key].lock();
  if (!pool) {
    TROUPE_ASSIGN_OR_RETURN(pool, EnvPool::open(spec));
    r.pools[key] = pool;
    r.names[key] = spec.name;
  }
  return std::unique_ptr<EnvClient>(new SharedPoolClient(std::move(pool)));
}

std::vector<std::shared_ptr<EnvPool>> find_env_pools(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::shared_ptr<EnvPool>> out;
  for (const auto& [key, weak] : r.pools)
    if (r.names[key] == name)
      if (auto p = weak.lock()) out.push_back(std::move(p));
  return out;
}

}  // namespace troupe::envs
