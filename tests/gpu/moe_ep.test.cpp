// gpu.moe_ep: the CUDA backend's expert-parallel MoE layer (Backend::moe_ep_*, kernels/cuda/moe_ep.cu,
// bodies/moe_ep_layer.h). One GPU: a group of one rank (join_expert_exchange with nranks 1, the
// NCCL exchange's self transfers) against the same backend's moe_forward/backward, forward and
// backward, every gradient; the serve passes of a rank with no tokens; a host exchange and routing
// replay are refused. Two ranks: NCCL does not allow two ranks of one communicator on one GPU, so
// they need two GPUs: two threads, each driving the layer on its own GPU through the launchers with
// a queue of its own, against the CPU layer on each rank's tokens (an owned expert's gradient: the
// two ranks' unsplit gradients added). With one GPU the two-rank part is not run; without NCCL only
// the refusal runs; no GPU: skipped.
#include <cublas_v2.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "check.h"
#include "gpu_test.h"
#include "launchers.h"
#include "nccl_comm.h"
#include "nccl_moe_exchange.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::gpu_test {
namespace {

namespace cu = troupe::kernels::cuda;

// The layer's tensors on the host, in MoeWeights' layout.
struct Tensors {
  std::vector<float> router, gate, up, down, sgate, sup, sdown;
  Tensors(const k::MoeConfig& c, unsigned seed, float scale) {
    const size_t E = c.E, H = c.H, C = c.C, S = c.H_shared;
    auto make = [&](size_t n, unsigned s) { return scale == 0 ? std::vector<float>(n) : randn(n, seed + s, scale); };
    router = make(E * C, 1), gate = make(E * H * C, 2), up = make(E * H * C, 3), down = make(E * C * H, 4);
    sgate = make(S * C, 5), sup = make(S * C, 6), sdown = make(C * S, 7);
  }
  std::vector<std::vector<float>*> all() { return {&router, &gate, &up, &down, &sgate, &sup, &sdown}; }
  std::vector<const std::vector<float>*> all() const {
    return {&router, &gate, &up, &down, &sgate, &sup, &sdown};
  }
};
k::MoeWeights weights_of(const std::vector<const float*>& p, bool shared) {
  return {p[0], p[1], p[2], p[3], shared ? p[4] : nullptr, shared ? p[5] : nullptr, shared ? p[6] : nullptr, {}};
}
k::MoeGrads grads_of(const std::vector<float*>& p) { return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], {}}; }

// A group of one rank on the backend's GPU against the backend's unsplit layer.
void one_rank(const k::Backend& g) {
  k::MoeConfig cfg;
  cfg.C = 64, cfg.H = 32, cfg.E = 8, cfg.K = 2, cfg.H_shared = 16;
  const int N = 200;
  Tensors w(cfg, 20, 0.1f), zero(cfg, 0, 0.0f);
  const auto x = randn(size_t(N) * cfg.C, 30), dout = randn(size_t(N) * cfg.C, 31);
  std::vector<Dev<float>> dw, ga, gb;  // weights; the unsplit layer's gradients; the EP layer's
  for (auto* t : w.all()) dw.emplace_back(g, *t);
  for (auto* t : zero.all()) ga.emplace_back(g, *t), gb.emplace_back(g, *t);
  std::vector<const float*> wp;
  std::vector<float*> pa, pb;
  for (size_t i = 0; i < dw.size(); ++i) wp.push_back(dw[i].p()), pa.push_back(ga[i].p()), pb.push_back(gb[i].p());
  const k::MoeWeights gw = weights_of(wp, true);
  Dev<float> gx(g, x), gdo(g, dout), out_a(g, x.size()), out_b(g, x.size()), dx_a(g, x.size()), dx_b(g, x.size());
  Dev<float> saved(g, g.moe_saved_floats(cfg, N)), scratch(g, g.moe_scratch_floats(cfg, N));
  k::MoeStats sa, sb;
  g.moe_forward(out_a.p(), saved.p(), &sa, gx.p(), gw, cfg, N, scratch.p(), nullptr);
  g.moe_backward(dx_a.p(), grads_of(pa), gdo.p(), 0.01f, gx.p(), saved.p(), gw, cfg, N, scratch.p());

  auto joined = g.join_expert_exchange(g.collective_id(), 1, 0);
  GPU_CHECK(joined.ok(), joined.ok() ? "" : joined.error().message);
  if (!joined.ok()) return;
  GPU_CHECK(*joined && (*joined)->device_buffers(), "join_expert_exchange: an exchange of device buffers");
  k::MoeEpState st;
  const k::MoeExpertGroup grp{joined->get(), &st, 0};
  Status s = g.moe_ep_forward(out_b.p(), saved.p(), &sb, gx.p(), gw, cfg, N, scratch.p(), nullptr, grp);
  GPU_CHECK(s.ok(), s.ok() ? "" : s.error().message);
  s = g.moe_ep_backward(dx_b.p(), grads_of(pb), gdo.p(), 0.01f, gx.p(), saved.p(), gw, cfg, N, scratch.p(), grp);
  GPU_CHECK(s.ok(), s.ok() ? "" : s.error().message);
  // The same GEMMs on the same rows, but a batch of other composition may take another cuBLAS
  // algorithm: a tolerance rather than the bits.
  expect_near("moe_ep_forward (1 rank) vs moe_forward", out_b.host(g), out_a.host(g), 1e-5, 1e-4);
  GPU_CHECK(sa.aux_loss == sb.aux_loss && sa.max_expert_load == sb.max_expert_load, "stats");
  expect_near("moe_ep_backward.dinp", dx_b.host(g), dx_a.host(g), 1e-5, 1e-4);
  const char* names[] = {"w_router", "w_gate", "w_up", "w_down", "ws_gate", "ws_up", "ws_down"};
  for (size_t i = 0; i < ga.size(); ++i)
    expect_near(std::string("moe_ep_backward.") + names[i], gb[i].host(g), ga[i].host(g), 1e-5, 1e-4);
  // The serve passes of a rank with no tokens: nothing to send or receive, the gradients untouched.
  k::MoeEpState idle;
  const k::MoeExpertGroup idle_grp{joined->get(), &idle, 0};
  const std::vector<float> before = gb[1].host(g);
  s = g.moe_ep_serve_forward(gw, cfg, idle_grp);
  if (s.ok()) s = g.moe_ep_serve_backward(grads_of(pb), gw, cfg, idle_grp);
  GPU_CHECK(s.ok(), s.ok() ? "" : s.error().message);
  expect_near("serve passes leave the gradients", gb[1].host(g), before, 0, 0);
  // Routing replay is refused.
  std::vector<int32_t> route(size_t(N) * cfg.K, 0);
  s = g.moe_ep_forward(out_b.p(), saved.p(), &sb, gx.p(), gw, cfg, N, scratch.p(), route.data(), grp);
  GPU_CHECK(!s.ok() && s.error().message.find("routing replay") != std::string::npos, "route refused");
}

// An exchange that moves host memory (the learners' MPI one): the device layer refuses it.
void host_exchange_refused(const k::Backend& g) {
  class HostExchange final : public k::MoeExchange {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    Status alltoall_ints(const int32_t*, int32_t*, int) override { return {}; }
    Status alltoallv(const float*, const size_t*, float*, const size_t*) override { return {}; }
  } host;
  k::MoeConfig cfg;
  cfg.C = 8, cfg.H = 4, cfg.E = 2, cfg.K = 1;
  Tensors w(cfg, 40, 0.1f);
  std::vector<Dev<float>> dw;
  std::vector<const float*> wp;
  for (auto* t : w.all()) dw.emplace_back(g, *t), wp.push_back(dw.back().p());
  k::MoeEpState st;
  const Status s = g.moe_ep_serve_forward(weights_of(wp, false), cfg, {&host, &st, 0});
  GPU_CHECK(!s.ok() && s.error().message.find("join_expert_exchange") != std::string::npos,
            s.ok() ? "accepted" : s.error().message);
}

// ---- two ranks on two GPUs ---------------------------------------------------------------------

// cudaMalloc'd copies of host vectors on the current device.
struct Raw {
  std::vector<float*> held;
  ~Raw() {
    for (float* p : held) TROUPE_CUDA_REPORT(cudaFree(p));
  }
  float* put(const std::vector<float>& v) {
    float* p = nullptr;
    TROUPE_CUDA_CHECK(cudaMalloc(&p, sizeof(float) * (v.size() + 1)));
    TROUPE_CUDA_CHECK(cudaMemcpy(p, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice));
    held.push_back(p);
    return p;
  }
  static std::vector<float> get(const float* p, size_t n) {
    std::vector<float> v(n);
    TROUPE_CUDA_CHECK(cudaMemcpy(v.data(), p, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct RankOut {
  std::vector<float> out, dinp;
  std::vector<std::vector<float>> grads;  // router, gate, up, down, shared gate, up, down
};

// Rank r of 2 on GPU r: the layer through the launchers on a queue of its own.
void run_rank(const std::vector<uint8_t>& id, int r, const k::MoeConfig& cfg, int N, const Tensors& w,
              const std::vector<float>& x, const std::vector<float>& dout, RankOut& res) {
  TROUPE_CUDA_CHECK(cudaSetDevice(r));
  cu::Queue q;
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking));
  TROUPE_CUBLAS_CHECK(cublasCreate(&q.blas));
  TROUPE_CUBLAS_CHECK(cublasSetStream(q.blas, q.stream));
  TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_PEDANTIC_MATH));
  {
    cu::NcclComm comm(id, 2, r);
    cu::NcclMoeExchange xc(comm, q.stream);
    Raw raw;
    Tensors zero(cfg, 0, 0.0f);
    std::vector<const float*> wp;
    std::vector<float*> gp;
    for (const auto* t : w.all()) wp.push_back(raw.put(*t));
    for (auto* t : zero.all()) gp.push_back(raw.put(*t));
    const std::vector<float> none(x.size());
    float* gx = raw.put(x);
    float* gdo = raw.put(dout);
    float* out = raw.put(none);
    float* dx = raw.put(none);
    float* saved = raw.put(std::vector<float>(cu::moe_device_saved_floats(cfg, N)));
    float* scratch = raw.put(std::vector<float>(cu::moe_device_scratch_floats(cfg, N)));
    k::MoeEpState st;
    const k::MoeExpertGroup grp{&xc, &st, 0};
    const k::MoeWeights gw = weights_of(wp, cfg.H_shared > 0);
    k::MoeStats stats;
    Status s = cu::launch_moe_ep_forward(q, out, saved, &stats, gx, gw, cfg, N, scratch, nullptr, grp);
    if (s.ok()) s = cu::launch_moe_ep_backward(q, dx, grads_of(gp), gdo, 0.01f, gx, saved, gw, cfg, N, scratch, grp);
    GPU_CHECK(s.ok(), s.ok() ? "" : s.error().message);
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
    res.out = Raw::get(out, x.size()), res.dinp = Raw::get(dx, x.size());
    for (size_t i = 0; i < gp.size(); ++i) res.grads.push_back(Raw::get(gp[i], zero.all()[i]->size()));
  }
  TROUPE_CUBLAS_CHECK(cublasDestroy(q.blas));
  TROUPE_CUDA_REPORT(cudaStreamDestroy(q.stream));
}

void two_ranks() {
  k::MoeConfig cfg;
  cfg.C = 64, cfg.H = 32, cfg.E = 8, cfg.K = 2, cfg.H_shared = 16;
  const int tokens[2] = {150, 37};
  const Tensors w(cfg, 50, 0.1f);
  const std::vector<uint8_t> id = cu::NcclComm::unique_id();
  std::vector<float> xs[2], douts[2];
  RankOut got[2];
  for (int r = 0; r < 2; ++r)
    xs[r] = randn(size_t(tokens[r]) * cfg.C, 60 + r), douts[r] = randn(size_t(tokens[r]) * cfg.C, 70 + r);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        run_rank(id, r, cfg, tokens[r], w, xs[r], douts[r], got[r]);
      } catch (const std::exception& e) {
        std::printf("FAIL two ranks, rank %d: %s\n", r, e.what());
        ++failures();
      }
    });
  for (auto& t : ts) t.join();
  // The CPU layer on each rank's tokens; the experts' gradients of both added.
  std::vector<std::vector<float>> summed;
  RankOut want[2];
  for (int r = 0; r < 2; ++r) {
    const int N = tokens[r];
    Tensors g(cfg, 0, 0.0f);
    std::vector<float> saved(k::moe_saved_floats(cfg, N)), scratch(k::moe_scratch_floats(cfg, N));
    want[r].out.resize(xs[r].size()), want[r].dinp.resize(xs[r].size());
    std::vector<const float*> wp;
    std::vector<float*> gp;
    for (const auto* t : w.all()) wp.push_back(t->data());
    for (auto* t : g.all()) gp.push_back(t->data());
    const k::MoeWeights cw = weights_of(wp, true);
    k::moe_forward(want[r].out.data(), saved.data(), nullptr, xs[r].data(), cw, cfg, N, scratch.data());
    k::moe_backward(want[r].dinp.data(), grads_of(gp), douts[r].data(), 0.01f, xs[r].data(), saved.data(), cw, cfg, N,
                    scratch.data());
    for (auto* t : g.all()) want[r].grads.push_back(*t);
  }
  const size_t block = size_t(cfg.E / 2) * cfg.H * cfg.C;
  for (int r = 0; r < 2; ++r) {
    if (got[r].grads.size() != 7) continue;  // the rank failed (reported above)
    const std::string on = " on rank " + std::to_string(r);
    expect_near("two ranks: out" + on, got[r].out, want[r].out, 1e-4, 1e-3);
    expect_near("two ranks: dinp" + on, got[r].dinp, want[r].dinp, 1e-4, 1e-3);
    for (size_t i : {size_t(0), size_t(4), size_t(5), size_t(6)})
      expect_near("two ranks: router / shared gradient " + std::to_string(i) + on, got[r].grads[i], want[r].grads[i],
                  1e-3, 1e-3);
    for (size_t i = 1; i <= 3; ++i) {  // the owned block: both ranks' gradients; elsewhere none
      std::vector<float> sum(want[0].grads[i].size(), 0.0f);
      for (size_t j = size_t(r) * block; j < size_t(r + 1) * block; ++j)
        sum[j] = want[0].grads[i][j] + want[1].grads[i][j];
      expect_near("two ranks: expert gradient " + std::to_string(i) + on, got[r].grads[i], sum, 1e-3, 1e-3);
    }
  }
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.moe_ep", [] {
    const k::Backend& g = cuda();
    host_exchange_refused(g);
    if (!cu::NcclComm::available()) {
      std::printf("gpu.moe_ep: this build has no NCCL: only the refusal of a host exchange ran\n");
      return;
    }
    one_rank(g);
    int devices = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices < 2) {
      std::printf("gpu.moe_ep: one GPU: the two-rank layer (one GPU per rank, NCCL) is not run\n");
      return;
    }
    two_ranks();
  });
}
