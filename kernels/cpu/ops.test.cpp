// The op test registry: every dense op in ops.h is one case, runnable in three
// modes: grad (backward vs central finite differences, in double), compare (the fp32 instantiation
// vs the fp64 one, stated tolerances), perf (timed fp32 forward+backward; prints, never asserts).
// Each case's loss is L = sum(out * R) for fixed random R, so backward gets dout = R.
// Usage: kernels_ops_gradcheck_test [grad|compare|perf|all] [case-substring]; exits 1 on any mismatch.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "troupe/kernels/ops.h"

namespace k = troupe::kernels;

namespace {

using Vec = std::vector<double>;
using Inputs = std::vector<Vec>;
// Runs forward (+ backward when grads != null) in scalar type of `tag`; returns L.
using RunFn = std::function<double(bool use_float, const Inputs& x, Inputs* grads)>;

struct OpCase {
  std::string name;
  Inputs inputs;  // the differentiable inputs, in double
  RunFn run;
};

std::mt19937_64 rng(1234);
Vec randn(size_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
Vec back(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}
template <class T>
double weighted(const std::vector<T>& out, const Vec& R) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * R[i];
  return s;
}

// Makes a RunFn from a generic lambda f(auto zero, x, grads) where decltype(zero) is the scalar.
template <class F>
RunFn both(F f) {
  return [f](bool use_float, const Inputs& x, Inputs* g) {
    return use_float ? f(0.0f, x, g) : f(0.0, x, g);
  };
}

// Packed sequences of lengths {3, 1, 4}: per-token block bounds.
struct Packed {
  std::vector<int32_t> start, end;
  int N = 0;
};
Packed make_packed(const std::vector<int>& lens) {
  Packed p;
  int off = 0;
  for (int L : lens) {
    for (int i = 0; i < L; ++i) {
      p.start.push_back(off);
      p.end.push_back(off + L);
    }
    off += L;
  }
  p.N = off;
  return p;
}

std::vector<OpCase> registry() {
  std::vector<OpCase> cases;

  {  // matmul
    const int N = 5, C = 7, OC = 4;
    Vec R = randn(N * OC);
    cases.push_back({"matmul", {randn(N * C), randn(OC * C)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto in = cast<T>(x[0]), w = cast<T>(x[1]);
                       std::vector<T> out(N * OC);
                       k::matmul_forward(out.data(), in.data(), w.data(), N, C, OC);
                       if (g) {
                         auto dout = cast<T>(R);
                         std::vector<T> din(N * C, T(0)), dw(OC * C, T(0));
                         k::matmul_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, C, OC);
                         *g = {back(din), back(dw)};
                       }
                       return weighted(out, R);
                     })});
  }
  {  // linear-layer bias (columns summed over rows)
    const int N = 5, OC = 6;
    Vec R = randn(N * OC);
    cases.push_back({"bias", {randn(N * OC), randn(OC)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto out = cast<T>(x[0]), b = cast<T>(x[1]);
                       k::bias_forward(out.data(), b.data(), N, OC);
                       if (g) {
                         std::vector<T> db(OC, T(0));
                         k::bias_backward(db.data(), cast<T>(R).data(), N, OC);
                         *g = {R, back(db)};
                       }
                       return weighted(out, R);
                     })});
  }
  {  // per-row sigmoid gate
    const int N = 4, C = 5;
    Vec R = randn(N * C);
    cases.push_back({"sigmoid_gate", {randn(N, 2.0), randn(N * C)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto ga = cast<T>(x[0]), in = cast<T>(x[1]);
                       std::vector<T> out(N * C);
                       k::sigmoid_gate_forward(out.data(), ga.data(), in.data(), N, C);
                       if (g) {
                         std::vector<T> dg(N), dx(N * C);
                         k::sigmoid_gate_backward(dg.data(), dx.data(), cast<T>(R).data(), ga.data(), in.data(), N, C);
                         *g = {back(dg), back(dx)};
                       }
                       return weighted(out, R);
                     })});
  }
  {  // embedding (gradient w.r.t. the table; tokens repeat)
    const int N = 6, C = 5, V = 4;
    std::vector<int32_t> tok = {0, 2, 2, 3, 0, 1};
    Vec R = randn(N * C);
    cases.push_back({"embedding", {randn(V * C)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto w = cast<T>(x[0]);
                       std::vector<T> out(N * C);
                       k::embedding_forward(out.data(), tok.data(), w.data(), N, C);
                       if (g) {
                         auto dout = cast<T>(R);
                         std::vector<T> dw(V * C, T(0));
                         k::embedding_backward(dw.data(), dout.data(), tok.data(), N, C);
                         *g = {back(dw)};
                       }
                       return weighted(out, R);
                     })});
  }
  for (int C : {8, 37}) {  // rmsnorm (37: not a multiple of the 16-column blocks)
    const int N = 4;
    Vec R = randn(N * C);
    Vec w = randn(C, 0.5);
    for (auto& v : w) v += 1.0;
    cases.push_back({"rmsnorm.c" + std::to_string(C), {randn(N * C), w}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto in = cast<T>(x[0]), wt = cast<T>(x[1]);
                       std::vector<T> out(N * C), rstd(N);
                       k::rmsnorm_forward(out.data(), rstd.data(), in.data(), wt.data(), N, C, 1e-6f);
                       if (g) {
                         auto dout = cast<T>(R);
                         std::vector<T> din(N * C, T(0)), dw(C, T(0));
                         k::rmsnorm_backward(din.data(), dw.data(), dout.data(), in.data(), wt.data(), rstd.data(), N, C);
                         *g = {back(din), back(dw)};
                       }
                       return weighted(out, R);
                     })});
  }
  {  // rope
    const int N = 5, NH = 3, HD = 8;
    std::vector<int32_t> pos = {0, 1, 2, 0, 7};
    std::vector<float> cs(N * HD / 2), sn(N * HD / 2);
    k::rope_cos_sin(cs.data(), sn.data(), pos.data(), N, HD, 10000.0f);
    Vec R = randn(N * NH * HD);
    cases.push_back({"rope", {randn(N * NH * HD)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto in = cast<T>(x[0]);
                       std::vector<T> out(in.size());
                       k::rope_forward(out.data(), in.data(), cs.data(), sn.data(), N, NH, HD);
                       if (g) {
                         auto d = cast<T>(R);
                         k::rope_backward(d.data(), d.data(), cs.data(), sn.data(), N, NH, HD);  // in place
                         *g = {back(d)};
                       }
                       return weighted(out, R);
                     })});
  }
  for (bool fast : {true, false}) {
    for (auto [NH, NKV] : {std::pair{4, 2}, std::pair{2, 2}, std::pair{3, 1}, std::pair{2, 1}}) {  // GQA, MHA
      // The last case has a sequence longer than the fast path's 32-row causal block.
      const bool longseq = NH == 2 && NKV == 1;
      const int HD = longseq ? 2 : 4;
      const std::vector<int> lens = longseq ? std::vector<int>{37, 2} : std::vector<int>{3, 1, 4};
      Packed p = make_packed(lens);
      const int N = p.N;
      std::vector<int32_t> cu = {0};
      for (int L : lens) cu.push_back(cu.back() + L);
      const int S = static_cast<int>(lens.size()), maxlen = *std::max_element(lens.begin(), lens.end());
      Vec R = randn(N * NH * HD);
      std::string name = std::string(fast ? "attention" : "attention_ref") + ".h" + std::to_string(NH) + "kv" +
                         std::to_string(NKV);
      cases.push_back({name, {randn(N * NH * HD), randn(N * NKV * HD), randn(N * NKV * HD)},
                       both([=](auto z, const Inputs& x, Inputs* g) {
                         using T = decltype(z);
                         auto q = cast<T>(x[0]), kk = cast<T>(x[1]), v = cast<T>(x[2]);
                         std::vector<T> out(N * NH * HD), lse(N * NH);
                         std::vector<T> scratch(std::max<size_t>(k::attention_scratch_floats(maxlen, 2), N * NH));
                         if (fast)
                           k::attention_forward(out.data(), lse.data(), scratch.data(), scratch.size(), q.data(),
                                                kk.data(), v.data(), cu.data(), S, maxlen, N, NH, NKV, HD);
                         else
                           k::attention_forward_reference(out.data(), lse.data(), q.data(), kk.data(), v.data(),
                                                          p.start.data(), p.end.data(), N, NH, NKV, HD);
                         if (g) {
                           auto dout = cast<T>(R);
                           std::vector<T> dq(q.size()), dk(kk.size()), dv(v.size());
                           if (fast)
                             k::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), scratch.size(),
                                                   dout.data(), q.data(), kk.data(), v.data(), out.data(), lse.data(),
                                                   cu.data(), S, maxlen, N, NH, NKV, HD);
                           else
                             k::attention_backward_reference(dq.data(), dk.data(), dv.data(), scratch.data(),
                                                             dout.data(), q.data(), kk.data(), v.data(), out.data(),
                                                             lse.data(), p.start.data(), p.end.data(), N, NH, NKV, HD);
                           *g = {back(dq), back(dk), back(dv)};
                         }
                         return weighted(out, R);
                       })});
    }
  }
  {  // residual add: its backward is the identity on both inputs (the model accumulates it)
    const int N = 12;
    Vec R = randn(N);
    cases.push_back({"add", {randn(N), randn(N)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto a = cast<T>(x[0]), b = cast<T>(x[1]);
                       std::vector<T> out(N);
                       k::add_forward(out.data(), a.data(), b.data(), N);
                       if (g) *g = {R, R};
                       return weighted(out, R);
                     })});
  }
  {  // swiglu
    const int N = 12;
    Vec R = randn(N);
    cases.push_back({"swiglu", {randn(N, 2.0), randn(N)}, both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto ga = cast<T>(x[0]), up = cast<T>(x[1]);
                       std::vector<T> out(N);
                       k::swiglu_forward(out.data(), ga.data(), up.data(), N);
                       if (g) {
                         auto dout = cast<T>(R);
                         std::vector<T> dg(N), du(N);
                         k::swiglu_backward(dg.data(), du.data(), dout.data(), ga.data(), up.data(), N);
                         *g = {back(dg), back(du)};
                       }
                       return weighted(out, R);
                     })});
  }
  for (float temp : {1.0f, 0.7f}) {  // log-prob of targets + entropy, with temperature
    const int N = 4, V = 9;
    std::vector<int32_t> tgt = {3, -1, 0, 8};
    Vec R1 = randn(N), R2 = randn(N);
    cases.push_back({"logprob.t" + std::to_string(temp).substr(0, 3), {randn(N * V, 2.0)},
                     both([=](auto z, const Inputs& x, Inputs* g) {
                       using T = decltype(z);
                       auto lg = cast<T>(x[0]);
                       std::vector<T> lp(N), ent(N), lse(N);
                       k::logprob_forward(lp.data(), ent.data(), lse.data(), lg.data(), tgt.data(), temp, N, V);
                       if (g) {
                         auto d1 = cast<T>(R1), d2 = cast<T>(R2);
                         std::vector<T> dl(N * V);
                         k::logprob_backward(dl.data(), d1.data(), d2.data(), lg.data(), lse.data(), tgt.data(), temp,
                                             N, V);
                         *g = {back(dl)};
                       }
                       return weighted(lp, R1) + weighted(ent, R2);
                     })});
  }
  return cases;
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Central differences in double: |analytic - numeric| <= 1e-6 + 1e-5 * |numeric| per element.
bool check_grad(const OpCase& c) {
  Inputs g;
  c.run(false, c.inputs, &g);
  const double h = 1e-5;
  double worst = 0;
  bool ok = true;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    for (size_t j = 0; j < c.inputs[i].size(); ++j) {
      Inputs xp = c.inputs, xm = c.inputs;
      xp[i][j] += h;
      xm[i][j] -= h;
      const double num = (c.run(false, xp, nullptr) - c.run(false, xm, nullptr)) / (2 * h);
      const double err = std::fabs(num - g[i][j]);
      worst = std::max(worst, err);
      if (err > 1e-6 + 1e-5 * std::fabs(num)) {
        if (ok) std::printf("  %s input %zu[%zu]: analytic %.10g numeric %.10g\n", c.name.c_str(), i, j, g[i][j], num);
        ok = false;
      }
    }
  }
  std::printf("[%s] grad   %-20s max |analytic-numeric| = %.3g\n", ok ? " ok " : "FAIL", c.name.c_str(), worst);
  return ok;
}

// fp32 vs fp64 on the same inputs: |f32 - f64| <= 1e-4 * max|f64| per tensor (loss and each grad).
bool check_compare(const OpCase& c) {
  Inputs gd, gf;
  const double Ld = c.run(false, c.inputs, &gd), Lf = c.run(true, c.inputs, &gf);
  bool ok = std::fabs(Ld - Lf) <= 1e-4 * std::max(1.0, std::fabs(Ld));
  double worst = std::fabs(Ld - Lf);
  for (size_t i = 0; i < gd.size(); ++i) {
    const double tol = 1e-4 * std::max(1.0, max_abs(gd[i]));
    for (size_t j = 0; j < gd[i].size(); ++j) {
      const double err = std::fabs(gd[i][j] - gf[i][j]);
      worst = std::max(worst, err);
      if (err > tol || std::isnan(gf[i][j])) ok = false;
    }
  }
  std::printf("[%s] compare %-20s max |f32-f64| = %.3g\n", ok ? " ok " : "FAIL", c.name.c_str(), worst);
  return ok;
}

// The fast attention (BLAS tiles) against the reference (online softmax) in fp32 on a larger
// packed batch, forward and backward: |fast - ref| <= 1e-5 * max(1, max|ref|) per tensor.
bool check_attention_fast_vs_reference() {
  const std::vector<int> lens = {1, 17, 64, 5, 33};
  Packed p = make_packed(lens);
  std::vector<int32_t> cu = {0};
  for (int L : lens) cu.push_back(cu.back() + L);
  const int N = p.N, NH = 4, NKV = 2, HD = 16, S = static_cast<int>(lens.size()), maxlen = 64;
  auto f = [](const Vec& v) { return cast<float>(v); };
  auto q = f(randn(N * NH * HD)), kk = f(randn(N * NKV * HD)), v = f(randn(N * NKV * HD)), dout = f(randn(N * NH * HD));
  std::vector<float> o1(q.size()), o2(q.size()), l1(N * NH), l2(N * NH), scratch(k::attention_scratch_floats(maxlen, 4));
  std::vector<float> dq1(q.size()), dq2(q.size()), dk1(kk.size()), dk2(kk.size()), dv1(v.size()), dv2(v.size()), rs(N * NH);
  k::attention_forward(o1.data(), l1.data(), scratch.data(), scratch.size(), q.data(), kk.data(), v.data(), cu.data(), S,
                       maxlen, N, NH, NKV, HD);
  k::attention_forward_reference(o2.data(), l2.data(), q.data(), kk.data(), v.data(), p.start.data(), p.end.data(), N, NH,
                                 NKV, HD);
  k::attention_backward(dq1.data(), dk1.data(), dv1.data(), scratch.data(), scratch.size(), dout.data(), q.data(),
                        kk.data(), v.data(), o1.data(), l1.data(), cu.data(), S, maxlen, N, NH, NKV, HD);
  k::attention_backward_reference(dq2.data(), dk2.data(), dv2.data(), rs.data(), dout.data(), q.data(), kk.data(),
                                  v.data(), o2.data(), l2.data(), p.start.data(), p.end.data(), N, NH, NKV, HD);
  bool ok = true;
  double worst = 0;
  auto cmp = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double m = 1;
    for (float x : b) m = std::max(m, double(std::fabs(x)));
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::fabs(double(a[i]) - b[i]);
      worst = std::max(worst, d / m);
      if (!(d <= 1e-5 * m)) ok = false;
    }
  };
  cmp(o1, o2);
  cmp(l1, l2);
  cmp(dq1, dq2);
  cmp(dk1, dk2);
  cmp(dv1, dv2);
  std::printf("[%s] compare attention fast vs reference (fp32, lens 1..64) max rel |d| = %.3g\n", ok ? " ok " : "FAIL",
              worst);
  return ok;
}

// KV-cache decode attention against the packed forward: the last token of each sequence, attending
// its cache slot (slots permuted, so the slot map is exercised), equals the packed output row.
bool check_decode_vs_packed() {
  const std::vector<int> lens = {3, 1, 7, 4};
  Packed p = make_packed(lens);
  const int N = p.N, NH = 4, NKV = 2, HD = 8, B = static_cast<int>(lens.size()), cache_len = 8;
  auto f = [](const Vec& v) { return cast<float>(v); };
  auto q = f(randn(N * NH * HD)), kk = f(randn(N * NKV * HD)), v = f(randn(N * NKV * HD));
  std::vector<float> out(q.size()), lse(N * NH);
  k::attention_forward_reference(out.data(), lse.data(), q.data(), kk.data(), v.data(), p.start.data(), p.end.data(), N,
                                 NH, NKV, HD);
  const std::vector<int32_t> slot = {2, 0, 3, 1};
  std::vector<float> kc(static_cast<size_t>(B) * cache_len * NKV * HD), vc(kc.size()), qd(B * NH * HD), od(qd.size());
  std::vector<int32_t> kv_len(B);
  int off = 0;
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < lens[b]; ++j)
      for (int x = 0; x < NKV * HD; ++x) {
        kc[(static_cast<size_t>(slot[b]) * cache_len + j) * NKV * HD + x] = kk[(off + j) * NKV * HD + x];
        vc[(static_cast<size_t>(slot[b]) * cache_len + j) * NKV * HD + x] = v[(off + j) * NKV * HD + x];
      }
    std::copy_n(q.begin() + (off + lens[b] - 1) * NH * HD, NH * HD, qd.begin() + b * NH * HD);
    kv_len[b] = lens[b];
    off += lens[b];
  }
  k::attention_decode_forward(od.data(), qd.data(), kc.data(), vc.data(), kv_len.data(), slot.data(), B, cache_len, NH,
                              NKV, HD);
  double worst = 0;
  off = 0;
  for (int b = 0; b < B; ++b) {
    for (int x = 0; x < NH * HD; ++x)
      worst = std::max(worst, double(std::fabs(od[b * NH * HD + x] - out[(off + lens[b] - 1) * NH * HD + x])));
    off += lens[b];
  }
  const bool ok = worst <= 1e-6;
  std::printf("[%s] compare attention decode (KV cache, slot map) vs packed max |d| = %.3g\n", ok ? " ok " : "FAIL",
              worst);
  return ok;
}

// The GEMMs are cut into fixed row blocks (gemm_blocked): a matmul large enough to be spread over
// the threads gives the same bits on 1 and on 2 threads, forward and backward.
bool check_matmul_thread_invariance() {
  const int N = 1000, C = 96, OC = 80;  // > 1e6 multiply-adds, N and OC not multiples of the block
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto vec = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& f : v) f = nd(rng);
    return v;
  };
  const auto x = vec(static_cast<size_t>(N) * C), w = vec(static_cast<size_t>(OC) * C),
             dout = vec(static_cast<size_t>(N) * OC);
  const int before = omp_get_max_threads();
  std::vector<std::vector<float>> outs, dxs, dws;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::vector<float> out(static_cast<size_t>(N) * OC), dx(x.size(), 0.5f), dw(w.size(), 0.25f);
    k::matmul_forward(out.data(), x.data(), w.data(), N, C, OC);
    k::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, C, OC);
    outs.push_back(out);
    dxs.push_back(dx);
    dws.push_back(dw);
  }
  omp_set_num_threads(before);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const bool ok = same(outs[0], outs[1]) && same(dxs[0], dxs[1]) && same(dws[0], dws[1]);
  std::printf("[%s] matmul forward/backward bit-identical on 1 and 2 threads\n", ok ? " ok " : "FAIL");
  return ok;
}

void perf(const OpCase& c) {
  Inputs g;
  const int reps = 200;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) c.run(true, c.inputs, &g);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("[perf] %-20s %.2f us per forward+backward (tiny shapes, incl. copies)\n", c.name.c_str(),
              std::chrono::duration<double, std::micro>(t1 - t0).count() / reps);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  const std::string filter = argc > 2 ? argv[2] : "";
  bool ok = true;
  int ran = 0;
  for (const auto& c : registry()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    ++ran;
    if (mode == "grad" || mode == "all") ok = check_grad(c) && ok;
    if (mode == "compare" || mode == "all") ok = check_compare(c) && ok;
    if (mode == "perf") perf(c);
  }
  if ((mode == "compare" || mode == "all") && (filter.empty() || std::string("attention").find(filter) == 0))
    ok = check_attention_fast_vs_reference() && check_decode_vs_packed() && ok;
  if ((mode == "compare" || mode == "all") && (filter.empty() || std::string("matmul").find(filter) == 0))
    ok = check_matmul_thread_invariance() && ok;
  if (ran == 0) {
    std::printf("no op case matches '%s'\n", filter.c_str());
    return 1;
  }
  std::printf("%s\n", ok ? "all op checks passed" : "OP CHECKS FAILED");
  return ok ? 0 : 1;
}
