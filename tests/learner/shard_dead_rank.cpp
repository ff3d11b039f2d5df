// learner.shard_dead_rank: a learner rank dies in the middle of a ZeRO-3 step (SIGKILL when its
// model asks for decoder layer 1); the survivor, left waiting in the all-gather of layer 1 or 2,
// must be ended by the runtime's watchdog with a line naming the dead rank, its role and that
// collective. With the argument `device`: a ZeRO-2 step on a device model (cpu_fenced) whose rank 1
// dies in its device collective's reduce-scatter, the survivor waiting in the staged reduce-scatter
// over MPI. With `device_zero3`: the ZeRO-3 step on a device model's sparse arena (cpu_fenced),
// rank 1 dying at decoder layer 1 as in the first case, the survivor waiting in that layer's
// all-gather by the device collective. Run by shard_dead_rank.sh under mpirun -np 2 (rank 0 exits 3).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>

#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "troupe/runtime/cluster.h"
#include "test_support.h"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// Rank 1's hook after the first step: forwards to the trainer's, and dies at decoder layer 1.
class DieAtLayer final : public policy::ParamHook {
 public:
  explicit DieAtLayer(policy::ParamHook* inner) : inner_(inner) {}
  Status need(int group) override {
    if (group == 1) ::raise(SIGKILL);
    return inner_->need(group);
  }
  Status done(int group, bool backward) override { return inner_->done(group, backward); }

 private:
  policy::ParamHook* inner_;
};

// Rank 1's device collective in `device` mode: the host-staged one, dying in its second
// reduce-scatter (the second step's).
class DieInReduceScatter final : public kernels::DeviceCollective {
 public:
  explicit DieInReduceScatter(std::unique_ptr<kernels::DeviceCollective> inner) : inner_(std::move(inner)) {}
  void all_reduce_sum(float* buf, size_t n) override { inner_->all_reduce_sum(buf, n); }
  void broadcast(float* buf, size_t n, int root) override { inner_->broadcast(buf, n, root); }
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {
    if (++calls_ == 2) ::raise(SIGKILL);
    inner_->reduce_scatter_sum(buf, bounds);
  }
  void all_gather(float* buf, std::span<const size_t> bounds) override { inner_->all_gather(buf, bounds); }

 private:
  std::unique_ptr<kernels::DeviceCollective> inner_;
  int calls_ = 0;
};

std::vector<learner::Sample> batch(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, 31);
  std::normal_distribution<float> nd(0, 1);
  std::vector<learner::Sample> out(8);
  for (auto& s : out) {
    for (int i = 0; i < 5; ++i) s.prompt.push_back(tok(rng));
    for (int i = 0; i < 5; ++i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool device = mode == "device", zero3_device = mode == "device_zero3";
  runtime::ClusterConfig cfg;
  cfg.roles = {"learner0", "learner1"};
  cfg.system.threads = 1;
  cfg.system.heartbeat = runtime::HeartbeatConfig{.interval = 100ms, .timeout = 1000ms};
  cfg.peer_failure_grace = 2s;
  auto boot = runtime::Cluster::bootstrap(cfg);
  if (!boot.ok()) {
    std::fprintf(stderr, "bootstrap: %s\n", boot.error().message.c_str());
    return 1;
  }
  runtime::Cluster& cl = **boot;
  std::fprintf(stderr, "PROBE rank %d: up\n", cl.rank());
  auto comm = learner::make_mpi_communicator();
  if (!comm.ok()) return 1;
  policy::ModelConfig mc = learner::test::tiny_model(3);
  if (device || zero3_device) mc.device = kernels::DeviceKind::cpu_fenced;
  auto model = policy::Model::create(mc, 3);
  if (!model.ok()) return 1;
  learner::ModelAdapter adapter(*model);
  learner::LearnerConfig lc;
  lc.max_completion_length = 5;
  lc.shard = device ? learner::ShardStage::gradients : learner::ShardStage::parameters;
  std::unique_ptr<kernels::DeviceCollective> dying;
  if (device && cl.rank() == 1)
    dying = std::make_unique<DieInReduceScatter>(learner::staged_device_collective(model->backend(), **comm));
  learner::Trainer trainer(adapter, lc, **comm, dying.get());
  if (auto r = trainer.train_step(batch(1)); !r.ok()) {
    std::fprintf(stderr, "first step: %s\n", r.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "PROBE rank %d: first step done\n", cl.rank());
  DieAtLayer killer(adapter.param_hook());
  if (cl.rank() == 1 && !device) adapter.set_param_hook(&killer);  // (the device ZeRO-3's hook too)
  std::printf("PROBE rank %d: second step\n", cl.rank());
  std::fflush(stdout);
  auto r = trainer.train_step(batch(2));  // rank 1 dies in it; rank 0 waits in a collective
  // (only if the library reported the dead peer before the watchdog ended this process)
  std::fprintf(stderr, "PROBE rank %d: the step returned: %s\n", cl.rank(), r.ok() ? "ok" : r.error().message.c_str());
  cl.wait_for(30s);
  std::fprintf(stderr, "PROBE rank %d: %s\n", cl.rank(), cl.info().message.c_str());
  return 3;
}
