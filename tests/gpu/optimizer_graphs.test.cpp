// gpu.optimizer_graphs: the device optimizer ops and recorded op sequences on the CUDA backend.
// AdamW (Backend::adamw_update) over 1e6 + 3 values for 4 steps, with and without clipping,
// against the CPU backend's (adamw.h's specification): parameters and both moments bit for bit,
// the norm (Backend::grad_norm_clip) within 1e-12 relative. Then a recorded graph (graph_begin /
// graph_end / graph_launch) of a few ops replays the eager bits, twice, over changed inputs. The
// copy queue: Backend::scale bit for bit the CPU's, then the scaled values brought down into
// pinned memory in pieces on the copy stream (copy_to_host_async), a fill of the source ordered
// after them (order_after_copy) that the copies must not see, and wait_copy.
#include <algorithm>
#include <vector>

#include "gpu_test.h"

namespace troupe::gpu_test {
namespace {

void optimizer_matches_cpu() {
  const k::Backend& g = cuda();
  const k::Backend& c = k::cpu_backend();
  const size_t n = 1000003;
  for (double max_norm : {0.0, 1.0}) {
    std::vector<float> p = randn(n, 1), m(n, 0.0f), v(n, 0.0f);
    Dev<float> gp(g, p), gm(g, m), gv(g, v), gs(g, 1);
    for (int t = 1; t <= 4; ++t) {
      const std::vector<float> grad = randn(n, 10 + unsigned(t), 0.01f);
      Dev<float> gg(g, grad);
      float cs = 0;
      const double cn = c.grad_norm_clip(grad.data(), n, max_norm, &cs);
      const double gn = g.grad_norm_clip(gg.p(), n, max_norm, gs.p());
      GPU_CHECK(std::fabs(gn - cn) <= 1e-12 * cn, "norm cuda " + std::to_string(gn) + " cpu " + std::to_string(cn));
      const k::AdamWStep st = k::adamw_step_scalars(0.9f, 0.999f, 1e-3, 0.1f, 1e-8f, t);
      c.adamw_update(p.data(), grad.data(), m.data(), v.data(), n, st, &cs);
      g.adamw_update(gp.p(), gg.p(), gm.p(), gv.p(), n, st, gs.p());
      const std::string tag = "max_norm " + std::to_string(max_norm) + " step " + std::to_string(t) + " ";
      expect_near(tag + "params", gp.host(g), p, 0, 0);
      expect_near(tag + "exp_avg", gm.host(g), m, 0, 0);
      expect_near(tag + "exp_avg_sq", gv.host(g), v, 0, 0);
    }
  }
}

void copy_queue_orders_copies() {
  const k::Backend& g = cuda();
  const size_t n = 1000003, piece = size_t{1} << 18;
  std::vector<float> x = randn(n, 40);
  Dev<float> d(g, x);
  const double s = 1.0 / 4099.0;
  g.scale(d.p(), n, s);  // queued before the copies: they hold its result
  k::cpu_backend().scale(x.data(), n, s);
  auto h = g.alloc_host(n * sizeof(float), "a pinned test buffer");
  GPU_CHECK(h.ok(), h.ok() ? "" : h.error().message);
  if (!h.ok()) return;
  k::CopyTicket last;
  for (size_t b = 0; b < n; b += piece)
    last = g.copy_to_host_async(h->floats() + b, d.p() + b, sizeof(float) * (std::min(n, b + piece) - b));
  g.order_after_copy(last);
  g.fill(d.p(), n, -7.0f);  // after the copies on the op stream: they must not see it
  g.wait_copy(last);
  expect_near("pinned copies of the scaled values", std::vector<float>(h->floats(), h->floats() + n), x, 0, 0);
  expect_near("the fill after them", d.host(g), std::vector<float>(n, -7.0f), 0, 0);
}

void graph_replays_eager_bits() {
  const k::Backend& g = cuda();
  GPU_CHECK(g.supports_graphs(), "cuda records graphs");
  const int N = 16, C = 64, O = 96;
  Dev<float> x(g, randn(size_t(N) * C, 3)), w(g, randn(size_t(O) * C, 4, 0.1f)), gain(g, randn(C, 5)),
      nx(g, size_t(N) * C), rs(g, N), y(g, size_t(N) * O), ye(g, size_t(N) * O);
  auto ops = [&](float* out) {
    g.rmsnorm_forward(nx.p(), rs.p(), x.p(), gain.p(), N, C, 1e-5f);
    g.matmul_forward(out, nx.p(), w.p(), N, C, O);
  };
  ops(ye.p());  // eagerly first: the workspaces grow outside the recording (a grow cannot be recorded)
  GPU_CHECK(g.graph_begin().ok(), "graph_begin");
  ops(y.p());
  const Status end = g.graph_end(7);
  GPU_CHECK(end.ok(), end.ok() ? "" : end.error().message);
  for (unsigned round = 0; round < 2; ++round) {
    const std::vector<float> in = randn(size_t(N) * C, 30 + round);
    g.copy_host_to_device(x.p(), in.data(), sizeof(float) * in.size());
    GPU_CHECK(g.graph_launch(7).ok(), "graph_launch");
    ops(ye.p());
    expect_near("graph round " + std::to_string(round), y.host(g), ye.host(g), 0, 0);
  }
  GPU_CHECK(!g.graph_launch(8).ok(), "an unknown graph is refused");
  g.graph_drop(7);
  GPU_CHECK(!g.graph_launch(7).ok(), "a dropped graph is refused");
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.optimizer_graphs", [] {
    optimizer_matches_cpu();
    copy_queue_orders_copies();
    graph_replays_eager_bits();
  });
}
