// Step 3 of `troupe run`: the placement of roles on ranks. Rank layout under mpirun: learners first
// (rank 0 also hosts the coordinator), then generators, then env workers, then scorers; the world
// size must equal learners + generators + env_workers + scorers. One process hosts them all, in the same order.
#include <string>

#include "run/steps.h"

namespace troupe::launch::run {

const char* role_kind_name(RoleKind kind) {
  switch (kind) {
    case RoleKind::learner: return "learner";
    case RoleKind::generator: return "generator";
    case RoleKind::env: return "env";
    case RoleKind::scorer: return "scorer";
  }
  return "?";
}

Placement plan_placement(const actors::ClusterSection& cluster) {
  Placement placement;
  auto add = [&](RoleKind kind, int count) {
    for (int i = 0; i < count; ++i) placement.push_back({kind, i, role_kind_name(kind) + std::to_string(i)});
  };
  add(RoleKind::learner, cluster.learners);
  add(RoleKind::generator, cluster.generators);
  add(RoleKind::env, cluster.env_workers);
  add(RoleKind::scorer, cluster.scorers);
  return placement;
}

}  // namespace troupe::launch::run
