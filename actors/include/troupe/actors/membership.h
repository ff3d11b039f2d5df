// Members that join a running job (`troupe join`): what the coordinator needs to admit them (the
// job's model hash, whether it admits anyone) and the identity a joiner announces. Invariant: a
// member is admitted only with the job's model hash, and only at a weight sync, so its first
// rollout is sampled with the weights every other generator holds.
#pragma once

#include <string>

namespace troupe::actors {

struct MembershipOptions {
  bool accept = false;      // cluster.join: JoinReq is admitted (else refused naming the key)
  std::string model_hash;   // the job's (launch's member_model_hash of its config)
  std::string model_name;   // what a refusal calls the job's model (policy.path or policy.model's shape)
  std::string run_dir;      // members.json is written here after each change ("" = nowhere)
};

}  // namespace troupe::actors
