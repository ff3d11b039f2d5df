// Which compute devices this process can use. Any CUDA failure (no driver, error 35 on a
// machine without a GPU) means "no GPU": callers fall back to the CPU ops.
#pragma once

namespace troupe::kernels {

// Number of usable CUDA devices; 0 when CUDA is not built, not installed or fails.
int cuda_device_count();

// How many times this process has asked the CUDA runtime for its devices (cuda_device_count, the
// CUDA backend's start): what the tests read to show a path (troupe validate) never touches a GPU.
int cuda_runtime_queries();

}  // namespace troupe::kernels
