// Which compute devices this process can use. Any CUDA failure (no driver, error 35 on a
// machine without a GPU) means "no GPU": callers fall back to the CPU ops.
#pragma once

namespace troupe::kernels {

// Number of usable CUDA devices; 0 when CUDA is not built, not installed or fails.
int cuda_device_count();

}  // namespace troupe::kernels
