// sparse_driver.h: the CUDA driver's virtual memory management for SparseMemory.
#include "sparse_driver.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

namespace troupe::kernels::cuda {

namespace {

using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using AddressFree = CUresult (*)(CUdeviceptr, size_t);
using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using Release = CUresult (*)(CUmemGenericAllocationHandle);
using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
using Unmap = CUresult (*)(CUdeviceptr, size_t);
using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);

template <class F>
F entry(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

}  // namespace

SparseMemory::Driver sparse_driver(int device) {
  SparseMemory::Driver d;
  const auto reserve = entry<Reserve>("cuMemAddressReserve");
  const auto address_free = entry<AddressFree>("cuMemAddressFree");
  const auto create = entry<Create>("cuMemCreate");
  const auto release = entry<Release>("cuMemRelease");
  const auto map = entry<Map>("cuMemMap");
  const auto unmap = entry<Unmap>("cuMemUnmap");
  const auto set_access = entry<SetAccess>("cuMemSetAccess");
  const auto granularity = entry<Granularity>("cuMemGetAllocationGranularity");
  if (!reserve || !address_free || !create || !release || !map || !unmap || !set_access || !granularity) return d;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t g = 0;
  if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || g == 0) return d;
  d.granularity = g;
  d.reserve = [reserve, g](size_t bytes) -> uintptr_t {
    CUdeviceptr at = 0;
    return reserve(&at, bytes, g, 0, 0) == CUDA_SUCCESS ? static_cast<uintptr_t>(at) : 0;
  };
  d.free_range = [address_free](uintptr_t at, size_t bytes) { (void)address_free(static_cast<CUdeviceptr>(at), bytes); };
  d.create = [create, prop, g]() -> uint64_t {
    CUmemGenericAllocationHandle h = 0;
    return create(&h, g, &prop, 0) == CUDA_SUCCESS ? static_cast<uint64_t>(h) : 0;
  };
  d.release = [release](uint64_t h) { (void)release(static_cast<CUmemGenericAllocationHandle>(h)); };
  d.map = [map, set_access, unmap, g, device](uintptr_t at, uint64_t h) -> std::string {
    if (CUresult r = map(static_cast<CUdeviceptr>(at), g, 0, static_cast<CUmemGenericAllocationHandle>(h), 0);
        r != CUDA_SUCCESS)
      return "cuMemMap failed (CUresult " + std::to_string(static_cast<int>(r)) + ")";
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = set_access(static_cast<CUdeviceptr>(at), g, &access, 1); r != CUDA_SUCCESS) {
      (void)unmap(static_cast<CUdeviceptr>(at), g);
      return "cuMemSetAccess failed (CUresult " + std::to_string(static_cast<int>(r)) + ")";
    }
    return {};
  };
  d.unmap = [unmap, g](uintptr_t at) { (void)unmap(static_cast<CUdeviceptr>(at), g); };
  return d;
}

}  // namespace troupe::kernels::cuda
