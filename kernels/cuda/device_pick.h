// Which GPU a process of the CUDA backend uses, from its environment, without CUDA in sight (the
// host tests call it). Invariant: two ranks of one node never get the same GPU unless the config
// says they may (policy.share_gpu); a node with more ranks than GPUs is an error naming both.
#pragma once

#include <cstdlib>
#include <string>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

// The environment the pick reads (getenv results; nullptr when unset).
struct DevicePickEnv {
  const char* troupe_cuda_device = nullptr;  // TROUPE_CUDA_DEVICE: an explicit device index
  const char* local_rank = nullptr;          // the launcher's node-local rank
  const char* local_rank_name = nullptr;     // which variable gave it
  const char* local_size = nullptr;          // ranks on this node, when the launcher says
};

// Reads TROUPE_CUDA_DEVICE and the first node-local rank variable set (Open MPI, MPICH, SLURM,
// torchrun's names) with its matching local-size variable.
inline DevicePickEnv device_pick_env() {
  DevicePickEnv e;
  e.troupe_cuda_device = std::getenv("TROUPE_CUDA_DEVICE");
  static constexpr const char* kNames[][2] = {{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                                              {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                                              {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
                                              {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}};
  for (const auto& n : kNames)
    if (const char* v = std::getenv(n[0]); v && *v) {
      e.local_rank = v;
      e.local_rank_name = n[0];
      e.local_size = std::getenv(n[1]);
      break;
    }
  return e;
}

// The device for this process among `count` visible ones: TROUPE_CUDA_DEVICE when set (checked to
// be in range), else the node-local rank, else 0. More ranks on the node than GPUs is an error
// unless share_gpu, which maps rank r to GPU r modulo count.
inline Result<int> pick_cuda_device(int count, const DevicePickEnv& env, bool share_gpu) {
  if (count <= 0) return invalid_input("no usable CUDA device (cudaGetDeviceCount found none); use cpu");
  if (env.troupe_cuda_device && *env.troupe_cuda_device) {
    const int d = std::atoi(env.troupe_cuda_device);
    if (d < 0 || d >= count)
      return invalid_input("TROUPE_CUDA_DEVICE=" + std::string(env.troupe_cuda_device) +
                           " is not a device of this process (it sees " + std::to_string(count) + ")");
    return d;
  }
  if (!env.local_rank || !*env.local_rank) return 0;
  const int rank = std::atoi(env.local_rank);
  const int size = env.local_size && *env.local_size ? std::atoi(env.local_size) : rank + 1;
  if ((rank >= count || size > count) && !share_gpu)
    return invalid_input(std::to_string(size > rank ? size : rank + 1) + " ranks on this node (" +
                         (env.local_rank_name ? env.local_rank_name : "local rank") + std::string("=") +
                         std::to_string(rank) + ") but " + std::to_string(count) +
                         " visible GPU(s): ranks would share a GPU; start at most one rank per GPU, or set "
                         "policy.share_gpu: true to let them share");
  return rank % count;
}

}  // namespace troupe::kernels::cuda
