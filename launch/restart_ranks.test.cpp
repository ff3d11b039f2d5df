// run.restart_remaining_ranks: the dead ranks read from mpirun's and srun's reports, the cluster
// section without their roles, {np}.
#include <gtest/gtest.h>

#include "restart_ranks.h"

namespace troupe::launch {
namespace {

TEST(RestartRanks, LostRanksFromTheLauncher) {
  // Open MPI, a rank killed by a signal
  EXPECT_EQ(lost_ranks_in("-----\nmpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"),
            std::vector<int>{1});
  // Open MPI, a rank's wrapper script passing on the signal's code (128 + 9); a plain failure is no loss
  const std::string wrapped = "The first process to do so was:\n\n  Process name: [[2939,1],3]\n  Exit code:    137\n";
  EXPECT_EQ(lost_ranks_in(wrapped), std::vector<int>{3});
  EXPECT_TRUE(lost_ranks_in("  Process name: [[2939,1],3]\n  Exit code:    3\n").empty());
  // srun
  EXPECT_EQ(lost_ranks_in("srun: error: node2: task 2: Killed\nsrun: error: node1: task 0: Killed\n"),
            (std::vector<int>{0, 2}));
  EXPECT_TRUE(lost_ranks_in("troupe: grpo step 3\n").empty());
}

TEST(RestartRanks, ClusterWithoutLostRoles) {
  actors::ClusterSection c;
  c.learners = 2;
  c.generators = 2;
  c.env_workers = 1;
  EXPECT_EQ(world_size(c), 5);
  // ranks: learner0 learner1 generator0 generator1 env0
  RemainingRanks r = without_ranks(c, {1, 3});
  EXPECT_EQ(r.cluster.learners, 1);
  EXPECT_EQ(r.cluster.generators, 1);
  EXPECT_EQ(r.left_out, (std::vector<std::string>{"learner1", "generator1"}));
  EXPECT_EQ(world_size(r.cluster), 3);
  // the only env worker is started again; a rank past the world is named, not guessed
  r = without_ranks(c, {4, 9});
  EXPECT_EQ(r.cluster.env_workers, 1);
  EXPECT_EQ(r.kept, (std::vector<std::string>{"env0", "rank 9"}));
  EXPECT_TRUE(r.left_out.empty());
}

TEST(RestartRanks, NpPlaceholder) {
  EXPECT_EQ(with_np("mpirun -np {np} --oversubscribe", 3), "mpirun -np 3 --oversubscribe");
  EXPECT_EQ(with_np("srun -n {np} x{np}", 12), "srun -n 12 x12");
  EXPECT_EQ(with_np("mpirun -np 4", 3), "mpirun -np 4");
}

}  // namespace
}  // namespace troupe::launch
