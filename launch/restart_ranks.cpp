// run.restart_remaining_ranks (restart_ranks.h): the lost ranks from the launcher's words, the
// cluster section without them, {np}.
#include "restart_ranks.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include "run/steps.h"

namespace troupe::launch {

std::vector<int> lost_ranks_in(const std::string& text) {
  static const std::regex signalled(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal \d+)");
  static const std::regex named(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  static const std::regex code(R"(Exit code:\s+(\d+))");
  static const std::regex srun_task(R"(srun: error: \S+: tasks? (\d+): Killed)");
  std::vector<int> out;
  std::istringstream in(text);
  int named_rank = -1;  // Open MPI: the rank of the latest "Process name:", for the "Exit code:" after it
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, signalled) || std::regex_search(line, m, srun_task)) {
      out.push_back(std::stoi(m[1]));
    } else if (std::regex_search(line, m, named)) {
      named_rank = std::stoi(m[1]);
    } else if (named_rank >= 0 && std::regex_search(line, m, code)) {
      if (std::stoi(m[1]) > 128) out.push_back(named_rank);
      named_rank = -1;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

RemainingRanks without_ranks(const actors::ClusterSection& cluster, const std::vector<int>& ranks) {
  RemainingRanks r;
  r.cluster = cluster;
  const run::Placement placement = run::plan_placement(cluster);
  for (int rank : ranks) {
    if (rank < 0 || static_cast<size_t>(rank) >= placement.size()) {
      r.kept.push_back("rank " + std::to_string(rank));
      continue;
    }
    const run::PlacedRole& role = placement[static_cast<size_t>(rank)];
    int* count = role.kind == run::RoleKind::learner     ? &r.cluster.learners
                 : role.kind == run::RoleKind::generator ? &r.cluster.generators
                 : role.kind == run::RoleKind::env       ? &r.cluster.env_workers
                                                         : &r.cluster.scorers;
    if (*count <= 1) {
      r.kept.push_back(role.name);
      continue;
    }
    --*count;
    r.left_out.push_back(role.name);
  }
  return r;
}

int world_size(const actors::ClusterSection& cluster) {
  return static_cast<int>(run::plan_placement(cluster).size());
}

std::string with_np(std::string launcher, int np) {
  const std::string key = "{np}", value = std::to_string(np);
  for (size_t at = launcher.find(key); at != std::string::npos; at = launcher.find(key, at + value.size()))
    launcher.replace(at, key.size(), value);
  return launcher;
}

}  // namespace troupe::launch
