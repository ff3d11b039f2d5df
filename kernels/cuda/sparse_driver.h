// The driver calls behind the CUDA backend's sparse buffers (sparse_memory.h): reserve, create,
// map with read-write access for one device, unmap, release, resolved through the runtime's driver
// entry points (no link against libcuda). A driver without virtual memory management gives
// granularity 0 (no sparse buffers).
#pragma once

#include "sparse_memory.h"

namespace troupe::kernels::cuda {

SparseMemory::Driver sparse_driver(int device);

}  // namespace troupe::kernels::cuda
