// Step 6 of `troupe run`: the actors of the roles this process hosts (its own rank's role under
// MPI, every role in one process) and the address of every role, hosted here or not: under MPI a
// role's name on its rank's node, in one process the id its spawn returned.
#include "run/steps.h"
#include "troupe/actors/scorer.h"

namespace troupe::launch::run {

namespace {

// The factory of one hosted role's actor; the role's object joins `hosted`.
Result<runtime::ActorFactory> make_role(const actors::ExperimentConfig& cfg, const PlacedRole& role, bool single,
                                        std::unique_ptr<learner::Communicator>& comm,
                                        const std::vector<envs::EnvSpec>& specs, int rank_threads,
                                        HostedRoles& hosted) {
  const int n = actors::role_threads(cfg.cluster, role_kind_name(role.kind), rank_threads);
  switch (role.kind) {
    case RoleKind::learner: {
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::LearnerRole> sp, actors::LearnerRole::create(cfg, std::move(comm)));
      hosted.learners.push_back(sp);
      return runtime::ActorFactory([sp, n]() -> std::unique_ptr<runtime::Actor> {
        return std::make_unique<actors::LearnerActor>(sp, n);
      });
    }
    case RoleKind::generator: {
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::Generator> sp, actors::Generator::create(cfg));
      hosted.gens.push_back(sp);
      hosted.gen_indices.push_back(role.index);
      const int nice = cfg.cluster.generator_nice;
      const int index = role.index;
      const bool own_process = !single;
      return runtime::ActorFactory([sp, n, nice, index, own_process]() -> std::unique_ptr<runtime::Actor> {
        return std::make_unique<actors::GeneratorActor>(sp, n, nice, index, own_process);
      });
    }
    case RoleKind::scorer: {
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::Scorer> sp,
                              actors::Scorer::create(actors::scorer_model_paths(cfg), cfg.policy,
                                                     cfg.distill.teacher_dtype));
      hosted.scorers.push_back(sp);
      return runtime::ActorFactory([sp, n]() -> std::unique_ptr<runtime::Actor> {
        return std::make_unique<actors::ScorerActor>(sp, n);
      });
    }
    case RoleKind::env: break;
  }
  TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::EnvWorker> sp, actors::EnvWorker::create(specs, role.name));
  hosted.envs.push_back(sp);
  return runtime::ActorFactory([sp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::EnvActor>(sp); });
}

}  // namespace

Result<HostedRoles> spawn_roles(const actors::ExperimentConfig& cfg, const Placement& placement,
                                runtime::Cluster& cluster, std::unique_ptr<learner::Communicator> comm,
                                const std::vector<envs::EnvSpec>& specs, int rank_threads) {
  auto& sys = cluster.system();
  const bool single = !cluster.under_mpi();
  HostedRoles hosted;
  hosted.peers.system = &sys;
  // scorers first: the env workers' judges reach them (in one process by the ids their spawns return)
  for (int pass = 0; pass < 2; ++pass)
    for (size_t r = 0; r < placement.size(); ++r) {
      const PlacedRole& role = placement[r];
      if ((role.kind == RoleKind::scorer) != (pass == 0)) continue;
      runtime::ActorId addr = runtime::ActorSystem::named(static_cast<uint32_t>(single ? 0 : r), role.name);
      if (single || static_cast<int>(r) == cluster.rank()) {
        if (role.kind == RoleKind::env) actors::set_scorer_peers(sys, hosted.peers.scorers, cfg);
        TROUPE_ASSIGN_OR_RETURN(runtime::ActorFactory factory,
                                make_role(cfg, role, single, comm, specs, rank_threads, hosted));
        runtime::SpawnOptions so;
        so.name = role.name;
        TROUPE_ASSIGN_OR_RETURN(runtime::ActorId id, sys.spawn(factory, so));
        if (single) addr = id;
      }
      switch (role.kind) {
        case RoleKind::learner: hosted.peers.learners.push_back(addr); break;
        case RoleKind::generator: hosted.peers.generators.push_back(addr); break;
        case RoleKind::env: hosted.peers.env_workers.push_back(addr); break;
        case RoleKind::scorer: hosted.peers.scorers.push_back(addr); break;
      }
    }
  return hosted;
}

}  // namespace troupe::launch::run
