// gpu.reload_double_buffer: the double-buffered activation reload (pinned host buffers, a copy
// stream, two device buffers, events) hands the backward exactly the bytes the synchronous reload
// does: a mock backward that folds each reloaded layer into an accumulator on the compute stream
// gives bit-identical results both ways, and both equal the expected sum. Prints both times.
#include <chrono>
#include <cstring>
#include <vector>

#include "activation_reload.h"
#include "gpu_test.h"

namespace troupe::gpu_test {
namespace {

std::vector<float> run(const k::Backend& g, bool double_buffer, const std::vector<std::vector<float>>& acts,
                       double* secs) {
  const int L = static_cast<int>(acts.size());
  const size_t n = acts[0].size();
  const auto& q = k::cuda::backend_queue(g);
  Dev<float> acc(g, n), work(g, n);
  std::vector<Dev<float>> layer_out;
  for (const auto& a : acts) layer_out.emplace_back(g, a);
  g.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  {
    k::cuda::ActivationReload r(q, L, n, double_buffer);
    for (int l = 0; l < L; ++l) r.offload(l, layer_out[size_t(l)].p());
    for (int l = L - 1; l >= 0; --l) {
      const float* x = r.acquire(l);
      // mock backward of layer l: some compute reading x, then acc += x
      for (int rep = 0; rep < 4; ++rep) g.swiglu_forward(work.p(), x, x, static_cast<int>(n));
      g.add(acc.p(), acc.p(), x, n);
      g.add(acc.p(), acc.p(), work.p(), n);
      r.release(l);
    }
    g.synchronize();
  }
  *secs = seconds_since(t0);
  return acc.host(g);
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.reload_double_buffer", [] {
    const k::Backend& g = cuda();
    const int L = 12;
    const size_t n = size_t(1) << 22;  // 16 MiB per layer
    std::vector<std::vector<float>> acts;
    for (int l = 0; l < L; ++l) acts.push_back(randn(n, 100 + unsigned(l)));
    double t_sync = 0, t_db = 0;
    const auto sync = run(g, false, acts, &t_sync);
    const auto db = run(g, true, acts, &t_db);
    GPU_CHECK(std::memcmp(sync.data(), db.data(), sizeof(float) * n) == 0,
              "double-buffered reload == synchronous reload, bit for bit");
    std::printf("{\"suite\":\"kernels\",\"case\":\"cuda_reload_double_buffer\",\"metric\":\"reload_loop_time\",\"unit\":\"s\",\"ours\":%.6f,"
                "\"baseline_name\":\"synchronous reload\",\"baseline\":%.6f,\"ratio\":%.3f,\"layers\":%d,\"bytes\":%zu}\n",
                t_db, t_sync, t_sync / t_db, L, n * sizeof(float));
  });
}
