// The fault-injecting EnvClient decorator (faults.h): one deterministic draw per call decides
// whether and how the call fails; everything else is forwarded to the wrapped client unchanged.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "troupe/envs/client.h"
#include "troupe/envs/faults.h"

namespace troupe::envs {

namespace {

uint64_t fnv1a(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return (h ^ 0xff) * 0x100000001b3ULL;  // a separator, so ("ab","c") and ("a","bc") differ
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

enum class Kind { none, exception, crash, hang, slow, malformed, dropped };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::exception: return "exception";
    case Kind::crash: return "crash";
    case Kind::hang: return "hang";
    case Kind::slow: return "slow";
    case Kind::malformed: return "malformed";
    case Kind::dropped: return "drop";
    case Kind::none: break;
  }
  return "none";
}

class FaultInjectingClient final : public EnvClient {
 public:
  FaultInjectingClient(std::unique_ptr<EnvClient> inner, EnvFaults f) : inner_(std::move(inner)), f_(std::move(f)) {}

  const EnvInfo& info() const override { return inner_->info(); }
  int restarts() const override { return inner_->restarts(); }
  bool gave_up() const override { return inner_->gave_up(); }
  bool concurrent() const override { return inner_->concurrent(); }
  int worker_pid() const override { return inner_->worker_pid(); }
  bool corrupt_next_reply() override { return inner_->corrupt_next_reply(); }
  bool drop_next_request() override { return inner_->drop_next_request(); }
  void release(const std::string& episode_id) override { inner_->release(episode_id); }

  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override {
    const int st = step_of_episode(episode_id);
    if (st >= 0) current_step_ = st;
    Kind k = draw(FaultOp::reset, episode_id + "/" + std::to_string(seed), st);
    if (k == Kind::exception) return injected_error("reset", episode_id);
    apply(k, "reset", episode_id);
    return inner_->reset(episode_id, seed, options);
  }
  Result<StepResult> step(const std::string& episode_id, const std::string& action) override {
    const int st = step_of_episode(episode_id);
    if (st >= 0) current_step_ = st;
    Kind k = draw(FaultOp::step, episode_id + "/" + action, st);
    if (k == Kind::exception) return injected_error("step", episode_id);
    apply(k, "step", episode_id);
    return inner_->step(episode_id, action);
  }
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    Kind k = draw(FaultOp::verify, metadata.dump() + "/" + completion, current_step_.load());
    if (k == Kind::exception) return injected_error("verify", "");
    apply(k, "verify", "");
    return inner_->verify(metadata, completion);
  }

 private:
  Kind draw(FaultOp op, const std::string& key, int step) {
    if (f_.op != FaultOp::any && f_.op != op) return Kind::none;
    if (!f_.steps.empty()) {
      bool listed = false;
      for (int s : f_.steps) listed = listed || s == step;
      if (!listed) return Kind::none;
    }
    uint64_t h = fnv1a(fnv1a(fnv1a(0xcbf29ce484222325ULL, f_.salt), std::string(enum_name(op))), key);
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = seen_[h]++;
    }
    const double u = static_cast<double>(splitmix(splitmix(h ^ f_.seed) + seen) >> 11) * 0x1.0p-53;
    double edge = f_.exception;
    if (u < edge) return Kind::exception;
    if (u < (edge += f_.crash)) return Kind::crash;
    if (u < (edge += f_.hang)) return Kind::hang;
    if (u < (edge += f_.slow)) return Kind::slow;
    if (u < (edge += f_.malformed)) return Kind::malformed;
    if (u < (edge += f_.dropped)) return Kind::dropped;
    return Kind::none;
  }

  void log(Kind k, const char* op, const std::string& episode) const {
    std::fprintf(stderr, "troupe: fault injected: env '%s' %s in %s%s%s (step %d)\n", inner_->info().name.c_str(),
                 kind_name(k), op, episode.empty() ? "" : " of episode ", episode.c_str(), current_step_.load());
  }

  Error injected_error(const char* op, const std::string& episode) const {
    log(Kind::exception, op, episode);
    return make_error(ErrorCode::internal, std::string("injected fault: the env threw in ") + op);
  }

  // crash / hang / slow / malformed / dropped act on the worker or the wire, then the call goes ahead.
  void apply(Kind k, const char* op, const std::string& episode) {
    if (k == Kind::none) return;
    log(k, op, episode);
    const int pid = inner_->worker_pid();
    if (k == Kind::crash && pid > 0) ::kill(pid, SIGKILL);
    if (k == Kind::hang && pid > 0) ::kill(pid, SIGSTOP);
    if (k == Kind::slow) std::this_thread::sleep_for(std::chrono::duration<double>(f_.slow_s));
    if (k == Kind::malformed) (void)inner_->corrupt_next_reply();
    if (k == Kind::dropped) (void)inner_->drop_next_request();
  }

  std::unique_ptr<EnvClient> inner_;
  EnvFaults f_;
  std::atomic<int> current_step_{-1};
  std::mutex mu_;
  std::map<uint64_t, uint64_t> seen_;
};

}  // namespace

int step_of_episode(const std::string& episode_id) {
  if (episode_id.rfind("grpo-", 0) != 0) return -1;
  int step = 0;
  size_t i = 5;
  if (i >= episode_id.size() || episode_id[i] < '0' || episode_id[i] > '9') return -1;
  for (; i < episode_id.size() && episode_id[i] >= '0' && episode_id[i] <= '9'; ++i) step = step * 10 + (episode_id[i] - '0');
  return step;
}

std::unique_ptr<EnvClient> with_injected_faults(std::unique_ptr<EnvClient> inner, EnvFaults faults) {
  if (!faults.any()) return inner;
  return std::make_unique<FaultInjectingClient>(std::move(inner), std::move(faults));
}

}  // namespace troupe::envs
