// gpu.train_step: one training step of a tiny one-layer transformer (embedding, RMSNorm, GQA
// attention with RoPE over packed sequences, SwiGLU MLP, tied LM head with the chunked
// log-softmax, fused GRPO loss, the whole backward) written once against the Backend table and
// run on the CPU and the CUDA backends: loss, metrics and every parameter gradient must agree.
// Then both take an SGD step and the second step's loss must agree too.
#include <map>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "troupe/kernels/chunked_logprob.h"

namespace troupe::gpu_test {
namespace {

constexpr int Vv = 96, C = 32, NH = 4, NKV = 2, HD = 8, H = 64, S = 3, N = 30, CHUNK = 40;

struct Step {
  k::GrpoLossSums sums;
  std::map<std::string, std::vector<float>> grads;
};

Step train_step(const k::Backend& be, const std::map<std::string, std::vector<float>>& host_params) {
  using D = Dev<float>;
  std::map<std::string, D> p, gr;
  for (const auto& [name, v] : host_params) {
    p.emplace(name, D(be, v));
    gr.emplace(name, D(be, v.size()));
  }
  auto P = [&](const char* n) { return p.at(n).p(); };
  auto G = [&](const char* n) { return gr.at(n).p(); };
  const std::vector<int32_t> cu = {0, 9, 21, 30};
  std::vector<int32_t> pos(N), sid(N), s0(N), s1(N);
  const int L = be.packed_seq_layout(pos.data(), sid.data(), s0.data(), s1.data(), cu.data(), S);
  const std::vector<int32_t> tokens = randint(N, Vv, 7);
  std::vector<int32_t> targets(N);
  for (int t = 0; t < N; ++t) targets[size_t(t)] = (t + 1 < N && sid[size_t(t + 1)] == sid[size_t(t)]) ? tokens[size_t(t + 1)] : -1;
  Dev<int32_t> dtok(be, tokens), dtg(be, targets), dpos(be, pos), dcu(be, cu);
  const size_t NC = size_t(N) * C, NQ = size_t(N) * NH * HD, NK = size_t(N) * NKV * HD, NHh = size_t(N) * H;
  D emb(be, NC), n1(be, NC), r1s(be, N), q(be, NQ), kk(be, NK), v(be, NK), cs(be, size_t(N) * HD / 2),
      sn(be, size_t(N) * HD / 2), qr(be, NQ), kr(be, NK), att(be, NQ), lse(be, size_t(N) * NH), o(be, NC), r1(be, NC),
      n2(be, NC), r2s(be, N), g(be, NHh), u(be, NHh), hh(be, NHh), f(be, NC), r2(be, NC), n3(be, NC), r3s(be, N),
      logp(be, N), ent(be, N), llse(be, N), scr(be, k::chunked_logprob_scratch_floats(N, Vv, CHUNK)),
      ascr(be, be.attention_scratch_floats(L));
  be.embedding_forward(emb.p(), dtok.p(), P("wte"), N, C);
  be.rmsnorm_forward(n1.p(), r1s.p(), emb.p(), P("n1"), N, C, 1e-5f);
  be.matmul_forward(q.p(), n1.p(), P("wq"), N, C, NH * HD);
  be.matmul_forward(kk.p(), n1.p(), P("wk"), N, C, NKV * HD);
  be.matmul_forward(v.p(), n1.p(), P("wv"), N, C, NKV * HD);
  be.rope_cos_sin(cs.p(), sn.p(), dpos.p(), N, HD, 10000.0f);
  be.rope_forward(qr.p(), q.p(), cs.p(), sn.p(), N, NH, HD);
  be.rope_forward(kr.p(), kk.p(), cs.p(), sn.p(), N, NKV, HD);
  be.attention_forward(att.p(), lse.p(), ascr.p(), ascr.n, qr.p(), kr.p(), v.p(), dcu.p(), S, L, N, NH, NKV, HD);
  be.matmul_forward(o.p(), att.p(), P("wo"), N, NH * HD, C);
  be.add(r1.p(), emb.p(), o.p(), NC);
  be.rmsnorm_forward(n2.p(), r2s.p(), r1.p(), P("n2"), N, C, 1e-5f);
  be.matmul_forward(g.p(), n2.p(), P("wg"), N, C, H);
  be.matmul_forward(u.p(), n2.p(), P("wu"), N, C, H);
  be.swiglu_forward(hh.p(), g.p(), u.p(), int(NHh));
  be.matmul_forward(f.p(), hh.p(), P("wd"), N, H, C);
  be.add(r2.p(), r1.p(), f.p(), NC);
  be.rmsnorm_forward(n3.p(), r3s.p(), r2.p(), P("nf"), N, C, 1e-5f);
  be.chunked_logprob_forward(logp.p(), ent.p(), llse.p(), n3.p(), P("wte"), dtg.p(), 1.0f, N, C, Vv, CHUNK, scr.p());
  std::vector<float> mask(N), adv = {1.0f, -0.5f, 0.25f}, old = randn(N, 8, 0.1f);
  for (int t = 0; t < N; ++t) mask[size_t(t)] = targets[size_t(t)] >= 0 ? 1.0f : 0.0f;
  const std::vector<float> lp_host = logp.host(be);
  for (int t = 0; t < N; ++t) old[size_t(t)] += lp_host[size_t(t)];
  D dmask(be, mask), dadv(be, adv), dold(be, old), dl(be, N), de(be, N);
  const k::GrpoLossBatch b{N, S, dcu.p(), dmask.p(), dadv.p(), logp.p(), dold.p(), nullptr, nullptr, ent.p()};
  k::GrpoLossParams lp;
  lp.entropy_coef = 0.01f;
  Step st;
  st.sums = be.grpo_loss(dl.p(), de.p(), b, lp, {double(N), false});
  // backward
  D dn3(be, NC), dr2(be, NC), dhh(be, NHh), dg(be, NHh), du(be, NHh), dn2(be, NC), dr1(be, NC), datt(be, NQ),
      dqr(be, NQ), dkr(be, NK), dv(be, NK), dq(be, NQ), dk(be, NK), dn1(be, NC), demb(be, NC);
  be.chunked_logprob_backward(dn3.p(), G("wte"), dl.p(), de.p(), n3.p(), P("wte"), llse.p(), ent.p(), dtg.p(), 1.0f, N, C,
                              Vv, CHUNK, scr.p());
  be.rmsnorm_backward(dr2.p(), G("nf"), dn3.p(), r2.p(), P("nf"), r3s.p(), N, C);
  be.matmul_backward(dhh.p(), G("wd"), dr2.p(), hh.p(), P("wd"), N, H, C);
  be.swiglu_backward(dg.p(), du.p(), dhh.p(), g.p(), u.p(), int(NHh));
  be.matmul_backward(dn2.p(), G("wg"), dg.p(), n2.p(), P("wg"), N, C, H);
  be.matmul_backward(dn2.p(), G("wu"), du.p(), n2.p(), P("wu"), N, C, H);
  be.copy_device_to_device(dr1.p(), dr2.p(), sizeof(float) * NC);
  be.rmsnorm_backward(dr1.p(), G("n2"), dn2.p(), r1.p(), P("n2"), r2s.p(), N, C);
  be.matmul_backward(datt.p(), G("wo"), dr1.p(), att.p(), P("wo"), N, NH * HD, C);
  be.attention_backward(dqr.p(), dkr.p(), dv.p(), ascr.p(), ascr.n, datt.p(), qr.p(), kr.p(), v.p(), att.p(), lse.p(),
                        dcu.p(), S, L, N, NH, NKV, HD);
  be.rope_backward(dq.p(), dqr.p(), cs.p(), sn.p(), N, NH, HD);
  be.rope_backward(dk.p(), dkr.p(), cs.p(), sn.p(), N, NKV, HD);
  be.matmul_backward(dn1.p(), G("wq"), dq.p(), n1.p(), P("wq"), N, C, NH * HD);
  be.matmul_backward(dn1.p(), G("wk"), dk.p(), n1.p(), P("wk"), N, C, NKV * HD);
  be.matmul_backward(dn1.p(), G("wv"), dv.p(), n1.p(), P("wv"), N, C, NKV * HD);
  be.copy_device_to_device(demb.p(), dr1.p(), sizeof(float) * NC);
  be.rmsnorm_backward(demb.p(), G("n1"), dn1.p(), emb.p(), P("n1"), r1s.p(), N, C);
  be.embedding_backward(G("wte"), demb.p(), dtok.p(), N, C);
  be.synchronize();
  for (auto& [name, d] : gr) st.grads[name] = d.host(be);
  return st;
}

std::map<std::string, std::vector<float>> init_params() {
  std::map<std::string, std::vector<float>> p;
  unsigned seed = 20;
  auto mat = [&](const char* n, size_t rows, size_t cols) { p[n] = randn(rows * cols, seed++, 0.2f); };
  mat("wte", Vv, C);
  mat("wq", NH * HD, C), mat("wk", NKV * HD, C), mat("wv", NKV * HD, C), mat("wo", C, NH * HD);
  mat("wg", H, C), mat("wu", H, C), mat("wd", C, H);
  for (const char* n : {"n1", "n2", "nf"}) p[n] = std::vector<float>(C, 1.0f);
  return p;
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.train_step", [] {
    const k::Backend& g = cuda();
    const k::Backend& c = k::cpu_backend();
    auto params = init_params();
    for (int step = 0; step < 2; ++step) {
      const Step a = train_step(c, params), b = train_step(g, params);
      const std::string tag = "step " + std::to_string(step) + " ";
      expect_near(tag + "loss", std::vector<double>{b.sums.loss, b.sums.entropy_sum, b.sums.tokens},
                  std::vector<double>{a.sums.loss, a.sums.entropy_sum, a.sums.tokens}, 1e-5, 1e-4);
      for (const auto& [name, ga] : a.grads) expect_near(tag + "grad " + name, b.grads.at(name), ga, 1e-5, 1e-3);
      std::printf("%sloss cpu %.9f cuda %.9f\n", tag.c_str(), a.sums.loss, b.sums.loss);
      for (auto& [name, v] : params)  // the same SGD step on both (from the CPU gradients)
        for (size_t i = 0; i < v.size(); ++i) v[i] -= 0.5f * a.grads.at(name)[i];
    }
  });
}
