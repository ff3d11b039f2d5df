// gpu.sparse_buffer: the CUDA backend's sparse buffers (backend.h alloc_sparse; kernels/cuda/
// sparse_memory.h over the driver's virtual memory management), what learner.shard parameters
// maps each layer into on a GPU: a granule-sized buffer of several granules, parts mapped, written
// by ops and copies and read back; a part unmapped and mapped again (the pool's granule reused,
// nothing new held); the mapped ranges and bytes; an all-gather-like device-to-device copy across
// two mapped parts; freed with parts still mapped.
#include <cstring>
#include <vector>

#include "gpu_test.h"

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.sparse_buffer", [] {
    const k::Backend& be = cuda();
    const size_t g = be.sparse_granularity();
    GPU_CHECK(g > 0 && g % sizeof(float) == 0, "the driver gives a granule (virtual memory management)");
    if (g == 0) return;
    const size_t gf = g / sizeof(float);
    const size_t before = be.sparse_mapped_bytes();
    auto made = be.alloc_sparse(4 * g + 64, "a test arena");
    GPU_CHECK(made.ok(), made.ok() ? "" : made.error().message);
    if (!made.ok()) return;
    k::Buffer buf = std::move(*made);
    GPU_CHECK(be.mapped_ranges(buf).empty(), "nothing mapped at first");
    GPU_CHECK(be.map_sparse(buf, 0, g).ok() && be.map_sparse(buf, 2 * g, 2 * g + 64).ok(), "map two parts");
    const auto r = be.mapped_ranges(buf);
    GPU_CHECK(r.size() == 2 && r[0] == std::make_pair(size_t{0}, g) && r[1] == std::make_pair(2 * g, 4 * g + 64),
              "the mapped ranges");
    GPU_CHECK(be.sparse_mapped_bytes() == before + 3 * g, "three granules mapped");
    std::vector<float> host = randn(gf, 7);
    be.copy_host_to_device(buf.floats(), host.data(), g);
    be.fill(buf.floats() + 2 * gf, 2 * gf + 16, 2.5f);
    be.copy_device_to_device(buf.floats() + 3 * gf, buf.floats(), g);  // across the parts
    std::vector<float> back(gf);
    be.copy_device_to_host(back.data(), buf.floats() + 3 * gf, g);
    GPU_CHECK(std::memcmp(back.data(), host.data(), g) == 0, "a copy between mapped parts");
    be.copy_device_to_host(back.data(), buf.floats() + 2 * gf, g);
    GPU_CHECK(back[0] == 2.5f && back[gf - 1] == 2.5f, "an op's writes");
    GPU_CHECK(be.unmap_sparse(buf, 0, g).ok(), "unmap");
    GPU_CHECK(be.sparse_mapped_bytes() == before + 2 * g, "two granules mapped");
    GPU_CHECK(be.map_sparse(buf, g, g).ok(), "map again (the pool's granule)");
    be.fill(buf.floats() + gf, gf, 1.0f);
    be.copy_device_to_host(back.data(), buf.floats() + gf, g);
    GPU_CHECK(back[0] == 1.0f && back[gf - 1] == 1.0f, "the remapped granule is writable");
    GPU_CHECK(!be.map_sparse(buf, 1, g).ok(), "a range that is not whole granules is refused");
    be.synchronize();
    buf = k::Buffer();  // freed with three granules mapped
    GPU_CHECK(be.sparse_mapped_bytes() == before, "freed: nothing of it mapped");
  });
}
