// Which compute devices this process can use. cuda_device_count is 0 on any CUDA failure (callers
// that only ask "is there a GPU?"); cuda_probe tells "no device" from a CUDA that cannot start.
#pragma once

#include <string>

namespace troupe::kernels {

// Number of usable CUDA devices; 0 when CUDA is not built, not installed or fails.
int cuda_device_count();

// How many times this process has asked the CUDA runtime for its devices (cuda_device_count, the
// CUDA backend's start): what the tests read to show a path (troupe validate) never touches a GPU.
int cuda_runtime_queries();

// What starting CUDA found: the devices, or why none. "No device" (cudaErrorNoDevice, or a CUDA
// error on a machine with no /dev/nvidia* device nodes) is not an error; any other start-up
// failure (a driver older than the toolkit, a broken install) is, named in `error`.
struct CudaProbe {
  int devices = 0;
  std::string error;  // empty unless a GPU should be there but CUDA could not start
};
CudaProbe cuda_probe();
// The rule above as a function of its inputs (the host tests call it): status 0 ok, 1
// cudaErrorNoDevice, 2 another error named by `error`; device_nodes: /dev/nvidia* exist.
CudaProbe classify_cuda_probe(int status, int count, const std::string& error, bool device_nodes);
// Whether this machine has NVIDIA device nodes (/dev/nvidia0, /dev/nvidia1, ...).
bool nvidia_device_nodes_exist();

// policy.share_gpu: may ranks of one node share a GPU (rank r on GPU r modulo the count)? Off, a
// node with more ranks than GPUs is an error. Read once, when the CUDA backend first starts.
void set_cuda_share_gpu(bool share);
bool cuda_share_gpu();

}  // namespace troupe::kernels
