// gpu.ops_vs_cpu: every op of the backend table on the CUDA backend against the CPU backend (the
// specification) on the same inputs: dense ops, RoPE, packed and decode attention, KV write,
// log-softmax whole and chunked, the fused GRPO loss, fill_normal, sampling and the quant ops (weights
// in ggml blocks). Skipped without a GPU.
#include <cstring>
#include <vector>

#include "bodies/bf16.h"
#include "gpu_test.h"
#include "troupe/kernels/chunked_logprob.h"
#include "troupe/kernels/compute_dtype.h"

namespace troupe::gpu_test {
namespace {

using V = std::vector<float>;
using I = std::vector<int32_t>;

void dense_ops(const k::Backend& g, const k::Backend& c) {
  const int N = 37, C = 96, OC = 80;
  V x = randn(size_t(N) * C, 1), w = randn(size_t(OC) * C, 2, 0.1f), dout = randn(size_t(N) * OC, 3);
  {  // matmul forward / backward (dinp and dweight accumulate)
    V out(size_t(N) * OC), dinp = randn(x.size(), 4), dw = randn(w.size(), 5);
    Dev<float> gx(g, x), gw(g, w), gout(g, out.size()), gd(g, dout), gdinp(g, dinp), gdw(g, dw);
    c.matmul_forward(out.data(), x.data(), w.data(), N, C, OC);
    g.matmul_forward(gout.p(), gx.p(), gw.p(), N, C, OC);
    expect_near("matmul_forward", gout.host(g), out, 1e-4, 1e-4);
    c.matmul_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), N, C, OC);
    g.matmul_backward(gdinp.p(), gdw.p(), gd.p(), gx.p(), gw.p(), N, C, OC);
    expect_near("matmul_backward.dinp", gdinp.host(g), dinp, 1e-4, 1e-4);
    expect_near("matmul_backward.dweight", gdw.host(g), dw, 1e-3, 1e-4);
  }
  {  // bf16 GEMMs (policy.compute_dtype bf16): the CPU GEMMs of the operands rounded to bf16
    auto bf16 = [](V v) {
      for (float& f : v) {
        const uint32_t b = static_cast<uint32_t>(k::cuda::hd_bf16_bits(f)) << 16;
        std::memcpy(&f, &b, 4);
      }
      return v;
    };
    const V xr = bf16(x), wr = bf16(w), doutr = bf16(dout);
    V out(size_t(N) * OC), dinp(x.size()), dw(w.size());
    Dev<float> gx(g, x), gw(g, w), gout(g, out.size()), gd(g, dout), gdinp(g, x.size()), gdw(g, w.size());
    c.matmul_forward(out.data(), xr.data(), wr.data(), N, C, OC);
    c.matmul_backward(dinp.data(), dw.data(), doutr.data(), xr.data(), wr.data(), N, C, OC);
    {
      const k::ComputeDtypeScope scope(k::ComputeDtype::bf16);
      g.matmul_forward(gout.p(), gx.p(), gw.p(), N, C, OC);
      g.matmul_backward(gdinp.p(), gdw.p(), gd.p(), gx.p(), gw.p(), N, C, OC);
    }
    expect_near("matmul_forward bf16", gout.host(g), out, 1e-4, 1e-3);
    expect_near("matmul_backward.dinp bf16", gdinp.host(g), dinp, 1e-4, 1e-3);
    expect_near("matmul_backward.dweight bf16", gdw.host(g), dw, 1e-3, 1e-3);
  }
  {  // bias, sigmoid gate, add, swiglu, fill, zero
    V b = randn(OC, 6), y = dout, db = randn(OC, 7), gate = randn(N, 8);
    Dev<float> gy(g, y), gb(g, b), gdb(g, db), gd(g, dout);
    c.bias_forward(y.data(), b.data(), N, OC);
    g.bias_forward(gy.p(), gb.p(), N, OC);
    expect_near("bias_forward", gy.host(g), y, 0, 0);
    c.bias_backward(db.data(), dout.data(), N, OC);
    g.bias_backward(gdb.p(), gd.p(), N, OC);
    expect_near("bias_backward", gdb.host(g), db, 1e-5, 1e-5);
    V sg(x.size()), dgate(N), dx(x.size()), dxin = randn(x.size(), 9);
    Dev<float> ggate(g, gate), gx(g, x), gsg(g, sg.size()), gdgate(g, N), gdx(g, x.size()), gdxin(g, dxin);
    c.sigmoid_gate_forward(sg.data(), gate.data(), x.data(), N, C);
    g.sigmoid_gate_forward(gsg.p(), ggate.p(), gx.p(), N, C);
    expect_near("sigmoid_gate_forward", gsg.host(g), sg, 1e-6, 1e-5);
    c.sigmoid_gate_backward(dgate.data(), dx.data(), dxin.data(), gate.data(), x.data(), N, C);
    g.sigmoid_gate_backward(gdgate.p(), gdx.p(), gdxin.p(), ggate.p(), gx.p(), N, C);
    expect_near("sigmoid_gate_backward.dgate", gdgate.host(g), dgate, 1e-5, 1e-4);
    expect_near("sigmoid_gate_backward.dx", gdx.host(g), dx, 1e-6, 1e-5);
    V a = randn(x.size(), 10), sum(x.size()), sw(x.size()), dg(x.size()), du(x.size());
    Dev<float> ga(g, a), gsum(g, x.size()), gsw(g, x.size()), gdg(g, x.size()), gdu(g, x.size());
    c.add(sum.data(), a.data(), x.data(), x.size());
    g.add(gsum.p(), ga.p(), gx.p(), x.size());
    expect_near("add", gsum.host(g), sum, 0, 0);
    c.swiglu_forward(sw.data(), a.data(), x.data(), int(x.size()));
    g.swiglu_forward(gsw.p(), ga.p(), gx.p(), int(x.size()));
    expect_near("swiglu_forward", gsw.host(g), sw, 1e-6, 1e-5);
    c.swiglu_backward(dg.data(), du.data(), dxin.data(), a.data(), x.data(), int(x.size()));
    g.swiglu_backward(gdg.p(), gdu.p(), gdxin.p(), ga.p(), gx.p(), int(x.size()));
    expect_near("swiglu_backward.dgate", gdg.host(g), dg, 1e-6, 1e-5);
    expect_near("swiglu_backward.dup", gdu.host(g), du, 1e-6, 1e-5);
    g.fill(gsum.p(), x.size(), 3.5f);
    expect_near("fill", gsum.host(g), V(x.size(), 3.5f), 0, 0);
    g.zero(gsum.p(), x.size());
    expect_near("zero", gsum.host(g), V(x.size(), 0.0f), 0, 0);
  }
  {  // embedding, rmsnorm
    const int Vv = 11;
    V wte = randn(size_t(Vv) * C, 11), emb(x.size()), dwte = randn(wte.size(), 12);
    I tok = randint(N, Vv, 13);
    Dev<float> gwte(g, wte), gemb(g, emb.size()), gdwte(g, dwte), gd(g, x);
    Dev<int32_t> gtok(g, tok);
    c.embedding_forward(emb.data(), tok.data(), wte.data(), N, C);
    g.embedding_forward(gemb.p(), gtok.p(), gwte.p(), N, C);
    expect_near("embedding_forward", gemb.host(g), emb, 0, 0);
    c.embedding_backward(dwte.data(), x.data(), tok.data(), N, C);
    g.embedding_backward(gdwte.p(), gd.p(), gtok.p(), N, C);
    expect_near("embedding_backward", gdwte.host(g), dwte, 1e-5, 1e-5);
    V nw = randn(C, 14), out(x.size()), rstd(N), dinp = randn(x.size(), 15), dnw = randn(C, 16), dy = randn(x.size(), 17);
    Dev<float> gnw(g, nw), gout(g, out.size()), grstd(g, N), gdinp(g, dinp), gdnw(g, dnw), gdy(g, dy), gx(g, x);
    c.rmsnorm_forward(out.data(), rstd.data(), x.data(), nw.data(), N, C, 1e-6f);
    g.rmsnorm_forward(gout.p(), grstd.p(), gx.p(), gnw.p(), N, C, 1e-6f);
    expect_near("rmsnorm_forward", gout.host(g), out, 1e-5, 1e-5);
    expect_near("rmsnorm_forward.rstd", grstd.host(g), rstd, 1e-6, 1e-5);
    c.rmsnorm_backward(dinp.data(), dnw.data(), dy.data(), x.data(), nw.data(), rstd.data(), N, C);
    g.rmsnorm_backward(gdinp.p(), gdnw.p(), gdy.p(), gx.p(), gnw.p(), grstd.p(), N, C);
    expect_near("rmsnorm_backward.dinp", gdinp.host(g), dinp, 1e-5, 1e-4);
    expect_near("rmsnorm_backward.dweight", gdnw.host(g), dnw, 1e-4, 1e-4);
  }
}

void rope_and_attention(const k::Backend& g, const k::Backend& c) {
  const I cu = {0, 17, 17, 18, 60, 100};
  const int S = 5, N = 100, NH = 4, NKV = 2, HD = 16, L = 42;
  std::vector<int32_t> pos(N), sid(N), s0(N), s1(N);
  const int maxlen = c.packed_seq_layout(pos.data(), sid.data(), s0.data(), s1.data(), cu.data(), S);
  GPU_CHECK(maxlen == L, "packed_seq_layout max_seqlen");
  Dev<int32_t> gpos(g, pos), gcu(g, cu);
  V cs(size_t(N) * HD / 2), sn(cs.size());
  Dev<float> gcs(g, cs.size()), gsn(g, sn.size());
  c.rope_cos_sin(cs.data(), sn.data(), pos.data(), N, HD, 10000.0f);
  g.rope_cos_sin(gcs.p(), gsn.p(), gpos.p(), N, HD, 10000.0f);
  expect_near("rope_cos_sin.cos", gcs.host(g), cs, 1e-5, 1e-5);
  expect_near("rope_cos_sin.sin", gsn.host(g), sn, 1e-5, 1e-5);
  V invf = randn(HD / 2, 20, 0.1f), cs2(cs.size()), sn2(cs.size());
  Dev<float> ginvf(g, invf), gcs2(g, cs.size()), gsn2(g, cs.size());
  c.rope_cos_sin_inv_freq(cs2.data(), sn2.data(), pos.data(), invf.data(), N, HD);
  g.rope_cos_sin_inv_freq(gcs2.p(), gsn2.p(), gpos.p(), ginvf.p(), N, HD);
  expect_near("rope_cos_sin_inv_freq", gcs2.host(g), cs2, 1e-5, 1e-5);
  const size_t nq = size_t(N) * NH * HD, nk = size_t(N) * NKV * HD;
  V q = randn(nq, 21), kk = randn(nk, 22), v = randn(nk, 23), dout = randn(nq, 24);
  V qr(nq), qb(nq);
  Dev<float> gq(g, q), gqr(g, nq), gqb(g, nq);
  c.rope_forward(qr.data(), q.data(), cs.data(), sn.data(), N, NH, HD);
  g.rope_forward(gqr.p(), gq.p(), gcs.p(), gsn.p(), N, NH, HD);
  expect_near("rope_forward", gqr.host(g), qr, 1e-5, 1e-5);
  c.rope_backward(qb.data(), q.data(), cs.data(), sn.data(), N, NH, HD);
  g.rope_backward(gqb.p(), gq.p(), gcs.p(), gsn.p(), N, NH, HD);
  expect_near("rope_backward", gqb.host(g), qb, 1e-5, 1e-5);

  V scratch(c.attention_scratch_floats(L)), out(nq), lse(size_t(N) * NH), dq(nq), dk(nk), dv(nk);
  Dev<float> gk(g, kk), gv(g, v), gd(g, dout), gout(g, nq), glse(g, lse.size()), gdq(g, nq), gdk(g, nk), gdv(g, nk),
      gscr(g, g.attention_scratch_floats(L));
  c.attention_forward(out.data(), lse.data(), scratch.data(), scratch.size(), q.data(), kk.data(), v.data(), cu.data(),
                      S, L, N, NH, NKV, HD);
  g.attention_forward(gout.p(), glse.p(), gscr.p(), gscr.n, gq.p(), gk.p(), gv.p(), gcu.p(), S, L, N, NH, NKV, HD);
  expect_near("attention_forward", gout.host(g), out, 1e-5, 1e-4);
  expect_near("attention_forward.lse", glse.host(g), lse, 1e-5, 1e-5);
  c.attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), scratch.size(), dout.data(), q.data(), kk.data(),
                       v.data(), out.data(), lse.data(), cu.data(), S, L, N, NH, NKV, HD);
  g.attention_backward(gdq.p(), gdk.p(), gdv.p(), gscr.p(), gscr.n, gd.p(), gq.p(), gk.p(), gv.p(), gout.p(), glse.p(),
                       gcu.p(), S, L, N, NH, NKV, HD);
  expect_near("attention_backward.dq", gdq.host(g), dq, 1e-4, 1e-3);
  expect_near("attention_backward.dk", gdk.host(g), dk, 1e-4, 1e-3);
  expect_near("attention_backward.dv", gdv.host(g), dv, 1e-4, 1e-3);

  const int slots = 3, cache_len = 40, KD = NKV * HD, T = 5, B = 3;
  V kc = randn(size_t(slots) * cache_len * KD, 25), vc = randn(kc.size(), 26), kn = randn(size_t(T) * KD, 27),
    vn = randn(size_t(T) * KD, 28);
  I slot = {2, 0, 1, 1, 0}, p = {39, 0, 7, 8, 1};
  Dev<float> gkc(g, kc), gvc(g, vc), gkn(g, kn), gvn(g, vn);
  Dev<int32_t> gslot(g, slot), gp(g, p);
  c.kv_cache_write(kc.data(), vc.data(), kn.data(), vn.data(), slot.data(), p.data(), T, cache_len, KD);
  g.kv_cache_write(gkc.p(), gvc.p(), gkn.p(), gvn.p(), gslot.p(), gp.p(), T, cache_len, KD);
  expect_near("kv_cache_write.k", gkc.host(g), kc, 0, 0);
  expect_near("kv_cache_write.v", gvc.host(g), vc, 0, 0);
  V dq1 = randn(size_t(B) * NH * HD, 29), dout1(dq1.size());
  I kvl = {40, 0, 9}, bs = {1, 2, 0};
  Dev<float> gdq1(g, dq1), gdout1(g, dq1.size());
  Dev<int32_t> gkvl(g, kvl), gbs(g, bs);
  c.attention_decode_forward(dout1.data(), dq1.data(), kc.data(), vc.data(), kvl.data(), bs.data(), B, cache_len, NH,
                             NKV, HD);
  g.attention_decode_forward(gdout1.p(), gdq1.p(), gkc.p(), gvc.p(), gkvl.p(), gbs.p(), B, cache_len, NH, NKV, HD);
  expect_near("attention_decode_forward", gdout1.host(g), dout1, 1e-5, 1e-4);
}

void logprob_and_loss(const k::Backend& g, const k::Backend& c) {
  const int N = 19, Cc = 32, Vv = 1000;
  V h = randn(size_t(N) * Cc, 30), W = randn(size_t(Vv) * Cc, 31, 0.3f), dlogp = randn(N, 32), dent = randn(N, 33);
  I tg = randint(N, Vv, 34);
  tg[3] = -1;
  Dev<float> gh(g, h), gW(g, W), gdl(g, dlogp), gde(g, dent);
  Dev<int32_t> gtg(g, tg);
  {
    V logits(size_t(N) * Vv), lp(N), ent(N), lse(N), dz(logits.size());
    c.matmul_forward(logits.data(), h.data(), W.data(), N, Cc, Vv);
    Dev<float> glog(g, logits), glp(g, N), gent(g, N), glse(g, N), gdz(g, logits.size());
    c.logprob_forward(lp.data(), ent.data(), lse.data(), logits.data(), tg.data(), 0.8f, N, Vv);
    g.logprob_forward(glp.p(), gent.p(), glse.p(), glog.p(), gtg.p(), 0.8f, N, Vv);
    expect_near("logprob_forward.logp", glp.host(g), lp, 1e-4, 1e-5);
    expect_near("logprob_forward.entropy", gent.host(g), ent, 1e-4, 1e-5);
    c.logprob_backward(dz.data(), dlogp.data(), dent.data(), logits.data(), lse.data(), tg.data(), 0.8f, N, Vv);
    g.logprob_backward(gdz.p(), gdl.p(), gde.p(), glog.p(), glse.p(), gtg.p(), 0.8f, N, Vv);
    expect_near("logprob_backward", gdz.host(g), dz, 1e-6, 1e-4);
  }
  for (int chunk : {0, 256}) {
    const size_t sf = k::chunked_logprob_scratch_floats(N, Vv, chunk);
    V lp(N), ent(N), lse(N), scr(sf), dh = randn(h.size(), 35), dW = randn(W.size(), 36);
    Dev<float> glp(g, N), gent(g, N), glse(g, N), gscr(g, sf), gdh(g, dh), gdW(g, dW);
    c.chunked_logprob_forward(lp.data(), ent.data(), lse.data(), h.data(), W.data(), tg.data(), 0.8f, N, Cc, Vv, chunk,
                              scr.data());
    g.chunked_logprob_forward(glp.p(), gent.p(), glse.p(), gh.p(), gW.p(), gtg.p(), 0.8f, N, Cc, Vv, chunk, gscr.p());
    expect_near("chunked_logprob_forward.logp", glp.host(g), lp, 1e-4, 1e-5);
    expect_near("chunked_logprob_forward.lse", glse.host(g), lse, 1e-4, 1e-5);
    c.chunked_logprob_backward(dh.data(), dW.data(), dlogp.data(), dent.data(), h.data(), W.data(), lse.data(),
                               ent.data(), tg.data(), 0.8f, N, Cc, Vv, chunk, scr.data());
    g.chunked_logprob_backward(gdh.p(), gdW.p(), gdl.p(), gde.p(), gh.p(), gW.p(), glse.p(), gent.p(), gtg.p(), 0.8f, N,
                               Cc, Vv, chunk, gscr.p());
    expect_near("chunked_logprob_backward.dh", gdh.host(g), dh, 1e-4, 1e-4);
    expect_near("chunked_logprob_backward.dW", gdW.host(g), dW, 1e-4, 1e-4);
  }
  {  // fused GRPO loss
    const I cu = {0, 5, 5, 12, 19};
    V mask(N, 1.0f), adv = {1.0f, 0.0f, -1.5f, 0.4f}, logp = randn(N, 37, 0.3f), old = randn(N, 38, 0.3f),
                     ref = randn(N, 39, 0.3f), ent = randn(N, 40);
    mask[6] = 0.0f;
    Dev<int32_t> gcu(g, cu);
    Dev<float> gm(g, mask), ga(g, adv), glp(g, logp), gold(g, old), gref(g, ref), gent(g, ent), gdl2(g, N),
        gde2(g, N);
    k::GrpoLossBatch cb{N, 4, cu.data(), mask.data(), adv.data(), logp.data(), old.data(), ref.data(), nullptr,
                        ent.data()};
    k::GrpoLossBatch gb{N, 4, gcu.p(), gm.p(), ga.p(), glp.p(), gold.p(), gref.p(), nullptr, gent.p()};
    k::GrpoLossParams p;
    p.kl_coef = 0.05f;
    p.entropy_coef = 0.01f;
    k::GrpoLossAggregation agg{3.0, true};
    V dl(N), de(N);
    const k::GrpoLossSums cs = c.grpo_loss(dl.data(), de.data(), cb, p, agg);
    const k::GrpoLossSums gs = g.grpo_loss(gdl2.p(), gde2.p(), gb, p, agg);
    expect_near("grpo_loss.dlogp", gdl2.host(g), dl, 1e-6, 1e-5);
    expect_near("grpo_loss.dentropy", gde2.host(g), de, 0, 0);
    expect_near("grpo_loss.sums", std::vector<double>{gs.loss, gs.pg_loss, gs.kl_sum, gs.tokens, gs.ratio_sum},
                std::vector<double>{cs.loss, cs.pg_loss, cs.kl_sum, cs.tokens, cs.ratio_sum}, 1e-9, 1e-9);
  }
}

void random_ops(const k::Backend& g, const k::Backend& c) {
  const size_t n = 1001;
  uint64_t r1 = 99, r2 = 99;
  V x(n);
  Dev<float> gx(g, n);
  c.fill_normal(x.data(), n, 0.02, &r1);
  g.fill_normal(gx.p(), n, 0.02, &r2);
  expect_near("fill_normal", gx.host(g), x, 1e-7, 1e-5);
  GPU_CHECK(r1 == r2, "fill_normal leaves the same RNG state");
  const int Vv = 5000;
  V logits = randn(Vv, 41, 3.0f);
  Dev<float> glog(g, logits);
  std::vector<unsigned char> cscr(c.sample_scratch_bytes(Vv));
  Dev<unsigned char> gscr(g, g.sample_scratch_bytes(Vv));
  const k::SampleParams cases[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 40, 1.0f}, {1.0f, 0, 0.9f}, {1.0f, 20, 0.5f}};
  for (const auto& sp : cases)
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      uint64_t a = seed, b = seed;
      float lpa = 0, lpb = 0;
      const int32_t ta = c.sample_token(&lpa, logits.data(), Vv, sp, &a, cscr.data());
      const int32_t tb = g.sample_token(&lpb, glog.p(), Vv, sp, &b, gscr.p());
      GPU_CHECK(ta == tb, "sample_token: cpu " + std::to_string(ta) + ", cuda " + std::to_string(tb) +
                              " (temperature " + std::to_string(sp.temperature) + ")");
      GPU_CHECK(std::fabs(lpa - lpb) <= 1e-4f, "sample_token log-prob");
      GPU_CHECK(a == b, "sample_token RNG state");
    }
  // chunked_sample (the LM head then one token per row, a block of rows per GEMM on cuda): rows with
  // their own params and RNG streams, against the CPU op; 300 rows of V 5000 fit one block.
  {
    const int N = 300, C = 64;
    V h = randn(size_t(N) * C, 42, 1.0f), W = randn(size_t(Vv) * C, 43, 0.3f);
    Dev<float> gh(g, h), gW(g, W);
    std::vector<k::SampleParams> sp(N);
    std::vector<uint64_t> ra(N), rb(N);
    for (int i = 0; i < N; ++i) sp[size_t(i)] = cases[i % 5], ra[size_t(i)] = rb[size_t(i)] = 1000 + uint64_t(i);
    std::vector<int32_t> ta(N), tb(N);
    std::vector<float> la(N), lb(N);
    std::vector<unsigned char> cs(c.chunked_sample_scratch_bytes(N, Vv, 1024, 40));
    Dev<unsigned char> gs(g, g.chunked_sample_scratch_bytes(N, Vv, 1024, 40));
    c.chunked_sample(ta.data(), la.data(), h.data(), W.data(), N, C, Vv, 1024, sp.data(), ra.data(), 40, cs.data());
    g.chunked_sample(tb.data(), lb.data(), gh.p(), gW.p(), N, C, Vv, 1024, sp.data(), rb.data(), 40, gs.p());
    int differ = 0;
    for (int i = 0; i < N; ++i) differ += ta[size_t(i)] != tb[size_t(i)] ? 1 : 0;
    // (GEMM rounding may move a draw that lands on a boundary: allow a few of 300)
    GPU_CHECK(differ <= 3, "chunked_sample: " + std::to_string(differ) + " of 300 rows drew another token");
    GPU_CHECK(ra == rb, "chunked_sample RNG states");
    for (int i = 0; i < N; ++i)
      if (ta[size_t(i)] == tb[size_t(i)])
        GPU_CHECK(std::fabs(la[size_t(i)] - lb[size_t(i)]) <= 1e-3f, "chunked_sample log-prob of row " + std::to_string(i));
  }
}

// Frozen weights in ggml blocks: y = x W^T and dx += dy W, every format, a decode step and a batch.
void quant_ops(const k::Backend& g, const k::Backend& c) {
  for (k::QuantFormat f : {k::QuantFormat::q8_0, k::QuantFormat::q4_0, k::QuantFormat::q4_1, k::QuantFormat::q4_k,
                           k::QuantFormat::bf16})
    for (int T : {1, 37}) {
      const int N = 96, K = 512;
      const auto m = k::quantize_rows(f, randn(size_t(N) * K, 21, 0.05f).data(), N, K).value();
      V x = randn(size_t(T) * K, 22), dy = randn(size_t(T) * N, 23), dx = randn(size_t(T) * K, 24), y(size_t(T) * N);
      Dev<uint8_t> gw(g, m.bytes);
      Dev<float> gx(g, x), gy(g, y.size()), gdy(g, dy), gdx(g, dx);
      k::QuantWeights W = m.view();
      c.quant_matmul_forward(y.data(), x.data(), W, T);
      c.quant_matmul_backward_input(dx.data(), dy.data(), W, T);
      W.data = gw.p();
      g.quant_matmul_forward(gy.p(), gx.p(), W, T);
      g.quant_matmul_backward_input(gdx.p(), gdy.p(), W, T);
      const std::string what = "quant_matmul " + troupe::enum_string(f) + " T=" + std::to_string(T);
      expect_near(what + " forward", gy.host(g), y, 1e-4, 1e-4);
      expect_near(what + " backward_input", gdx.host(g), dx, 1e-4, 1e-4);
    }
}

}  // namespace
}  // namespace troupe::gpu_test

int main() {
  using namespace troupe::gpu_test;
  return run_gpu_test("gpu.ops_vs_cpu", [] {
    const k::Backend& g = cuda();
    const k::Backend& c = k::cpu_backend();
    dense_ops(g, c);
    rope_and_attention(g, c);
    logprob_and_loss(g, c);
    random_ops(g, c);
    quant_ops(g, c);
  });
}
