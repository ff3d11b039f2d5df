// kernels.cuda_moe_ep_bodies: the CUDA expert-parallel MoE layer's launch sequence
// (bodies/moe_ep_layer.h) run on the host by HostExec, its P = 2 and 4 ranks threads of this
// process meeting in an in-process exchange (ThreadExchange), against
//   - the unsplit CUDA layer (moe_layer.h with HostExec) on each rank's own tokens, bit for bit:
//     output, stats, d input, router and shared-expert gradients; an owned expert's gradient equals
//     the unsplit backward run rank after rank into one gradient buffer (its blocks in source
//     order), and no other expert's gradient is touched;
//   - the CPU specification (kernels::moe_ep_forward/backward) over the same exchange, within
//     1e-5 + 1e-4 |ref| (what kernels.cuda_bodies_on_host allows the unsplit body against the CPU
//     layer: the CPU's d weight is an 8-way dot product and its combine vectorized, the bodies'
//     the lanes' tree and a scalar chain).
// Cases: top-1/2/3, a shared expert, renormalized or not, ranks with no tokens (the serve passes,
// and moe_ep_forward with N = 0), a rank with one token (experts that get no rows from it),
// weights divided per rank (weights_first_expert = the rank's block). And what the layer refuses.
// No finite-difference check here: the body tests have none for moe_layer either (the CPU layer's
// is kernels.moe_gradcheck). LoRA stays off: the CUDA layer has no adapters (refused, tested).
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bodies/host_exec.h"
#include "bodies/moe_ep_layer.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::kernels::cuda {
namespace {

namespace k = troupe::kernels;

// ---- an exchange among threads of this process ------------------------------------------------------

// The ranks of one group meet at every call: each posts its send buffer and counts, waits for all,
// copies what its peers sent it, and waits again before anyone's buffer may change. Counts that
// disagree between a pair are an error naming both ranks (after the second meeting, so the group
// stays in step).
class ThreadGroup {
 public:
  explicit ThreadGroup(int P) : P_(P), bar_(P), posts_(static_cast<size_t>(P)) {}
  int size() const { return P_; }
  Status exchange(int me, const void* send, const size_t* send_n, void* recv, const size_t* recv_n, size_t elem) {
    posts_[static_cast<size_t>(me)] = {static_cast<const char*>(send), std::vector<size_t>(send_n, send_n + P_)};
    bar_.arrive_and_wait();
    std::string bad;
    size_t at = 0;
    for (int p = 0; p < P_; ++p) {
      const Post& from = posts_[static_cast<size_t>(p)];
      size_t off = 0;
      for (int q = 0; q < me; ++q) off += from.counts[static_cast<size_t>(q)];
      const size_t n = from.counts[static_cast<size_t>(me)];
      if (n != recv_n[p]) {
        bad = "rank " + std::to_string(p) + " sends rank " + std::to_string(me) + " " + std::to_string(n) +
              " elements, it expects " + std::to_string(recv_n[p]);
      } else if (n) {
        std::memcpy(static_cast<char*>(recv) + at * elem, from.data + off * elem, n * elem);
      }
      at += recv_n[p];
    }
    bar_.arrive_and_wait();
    if (!bad.empty()) return make_error(ErrorCode::internal, "thread exchange: " + bad);
    return {};
  }

 private:
  struct Post {
    const char* data = nullptr;
    std::vector<size_t> counts;
  };
  int P_;
  std::barrier<> bar_;
  std::vector<Post> posts_;
};

class ThreadExchange final : public MoeExchange {
 public:
  ThreadExchange(ThreadGroup& g, int rank, bool claims_device = false)
      : g_(g), rank_(rank), claims_device_(claims_device) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  Status alltoall_ints(const int32_t* send, int32_t* recv, int n) override {
    const std::vector<size_t> each(static_cast<size_t>(size()), static_cast<size_t>(n));
    return g_.exchange(rank_, send, each.data(), recv, each.data(), sizeof(int32_t));
  }
  Status alltoallv(const float* send, const size_t* send_n, float* recv, const size_t* recv_n) override {
    return g_.exchange(rank_, send, send_n, recv, recv_n, sizeof(float));
  }
  bool device_buffers() const override { return claims_device_; }

 private:
  ThreadGroup& g_;
  int rank_;
  bool claims_device_;
};

// fn(rank) on P threads; returns once all are done.
void on_ranks(int P, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < P; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

// ---- the layer's tensors ------------------------------------------------------------------------------

std::vector<float> randn(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// One flat vector per tensor in MoeWeights' layout; `experts` of them in the routed tensors.
struct Tensors {
  std::vector<float> router, gate, up, down, sgate, sup, sdown;
  Tensors(const MoeConfig& c, int experts, unsigned seed, float scale) {
    const size_t E = static_cast<size_t>(experts), H = c.H, C = c.C, S = c.H_shared;
    auto make = [&](size_t n, unsigned s) { return scale == 0.0f ? std::vector<float>(n) : randn(n, seed + s, scale); };
    router = make(static_cast<size_t>(c.E) * C, 1), gate = make(E * H * C, 2), up = make(E * H * C, 3);
    down = make(E * C * H, 4), sgate = make(S * C, 5), sup = make(S * C, 6), sdown = make(C * S, 7);
  }
  // The weights with the routed experts starting at expert `first` of these tensors.
  MoeWeights weights(int first, const MoeConfig& c) const {
    const size_t o = static_cast<size_t>(first) * c.H * c.C;
    MoeWeights w;
    w.w_router = router.data(), w.w_gate = gate.data() + o, w.w_up = up.data() + o, w.w_down = down.data() + o;
    if (c.H_shared) w.ws_gate = sgate.data(), w.ws_up = sup.data(), w.ws_down = sdown.data();
    return w;
  }
  MoeGrads grads() {
    MoeGrads g;
    g.w_router = router.data(), g.w_gate = gate.data(), g.w_up = up.data(), g.w_down = down.data();
    g.ws_gate = sgate.data(), g.ws_up = sup.data(), g.ws_down = sdown.data();
    return g;
  }
};

// What one rank's pass gave.
struct RankResult {
  std::vector<float> out, dinp;
  Tensors grads;
  MoeStats stats;
  std::string error;
};

struct EpCase {
  const char* name;
  MoeConfig cfg;
  std::vector<int> tokens;  // per rank; 0: no tokens
  bool serve = true;        // a rank with no tokens runs the serve passes (else moe_ep_* with N = 0)
  bool divided = false;     // each rank's weights and gradients hold only its block of experts
};

std::vector<float> tokens_of(const EpCase& ec, int r, unsigned salt) {
  return randn(static_cast<size_t>(ec.tokens[static_cast<size_t>(r)]) * ec.cfg.C, 100 + salt + 10 * r, 1.0f);
}

// Whether the two hold the same bits.
void expect_same(const std::string& what, const float* got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(got + i, want.data() + i, sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", the unsplit layer " << want[i];
      return;
    }
}
void expect_near(const std::string& what, const float* got, const std::vector<float>& want) {
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= 1e-5 + 1e-4 * std::fabs(double(want[i])))) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", the CPU specification " << want[i];
    }
}

// ---- the runs -------------------------------------------------------------------------------------

using EpPass = std::function<Status(RankResult&, MoeExchange&, MoeEpState&, int rank)>;

// Every rank's pass over one group of threads.
std::vector<RankResult> run_group(const EpCase& ec, const EpPass& pass) {
  const int P = static_cast<int>(ec.tokens.size());
  const int experts = ec.divided ? ec.cfg.E / P : ec.cfg.E;
  std::vector<RankResult> res;
  for (int r = 0; r < P; ++r) res.push_back({{}, {}, Tensors(ec.cfg, experts, 0, 0.0f), {}, {}});
  ThreadGroup group(P);
  on_ranks(P, [&](int r) {
    ThreadExchange xc(group, r);
    MoeEpState st;
    const Status s = pass(res[static_cast<size_t>(r)], xc, st, r);
    if (!s.ok()) res[static_cast<size_t>(r)].error = s.error().message;
  });
  return res;
}

// The CUDA layer's EP passes with HostExec; buffers sized as the backend sizes them (the unsplit
// layer's saved and scratch).
std::vector<RankResult> run_ep_bodies(const EpCase& ec, const Tensors& w, float daux) {
  const MoeConfig& c = ec.cfg;
  return run_group(ec, [&](RankResult& out, MoeExchange& xc, MoeEpState& st, int r) -> Status {
    HostExec ex;
    const int N = ec.tokens[static_cast<size_t>(r)], first = ec.divided ? r * (c.E / xc.size()) : 0;
    const MoeExpertGroup grp{&xc, &st, first};
    const MoeWeights wv = w.weights(first, c);
    if (N == 0 && ec.serve) {
      TROUPE_TRY(moe_layer_ep_serve_forward(ex, wv, c, grp));
      return moe_layer_ep_serve_backward(ex, out.grads.grads(), wv, c, grp);
    }
    const auto x = tokens_of(ec, r, 0), dout = tokens_of(ec, r, 50);
    std::vector<float> saved(moe_saved_layout(c, N).total);
    std::vector<float> scratch(moe_scratch_layout(c, N, ex.plan_tmp_bytes(N * c.K, c.E)).total);
    out.out.assign(x.size(), 0.0f), out.dinp.assign(x.size(), 0.0f);
    TROUPE_TRY(moe_layer_ep_forward(ex, out.out.data(), saved.data(), &out.stats, x.data(), wv, c, N, scratch.data(),
                                    nullptr, grp));
    return moe_layer_ep_backward(ex, out.dinp.data(), out.grads.grads(), dout.data(), daux, x.data(), saved.data(), wv,
                                 c, N, scratch.data(), grp);
  });
}

// The CPU specification over the same kind of group.
std::vector<RankResult> run_cpu_spec(const EpCase& ec, const Tensors& w, float daux) {
  const MoeConfig& c = ec.cfg;
  return run_group(ec, [&](RankResult& out, MoeExchange& xc, MoeEpState& st, int r) -> Status {
    const int N = ec.tokens[static_cast<size_t>(r)], first = ec.divided ? r * (c.E / xc.size()) : 0;
    const MoeExpertGroup grp{&xc, &st, first};
    const MoeWeights wv = w.weights(first, c);
    if (N == 0 && ec.serve) {
      TROUPE_TRY(k::moe_ep_serve_forward(wv, c, grp));
      return k::moe_ep_serve_backward(out.grads.grads(), wv, c, grp);
    }
    const auto x = tokens_of(ec, r, 0), dout = tokens_of(ec, r, 50);
    std::vector<float> saved(k::moe_saved_floats(c, N)), scratch(k::moe_scratch_floats(c, N));
    out.out.assign(x.size(), 0.0f), out.dinp.assign(x.size(), 0.0f);
    TROUPE_TRY(k::moe_ep_forward(out.out.data(), saved.data(), &out.stats, x.data(), wv, c, N, scratch.data(), nullptr,
                                 grp));
    return k::moe_ep_backward(out.dinp.data(), out.grads.grads(), dout.data(), daux, x.data(), saved.data(), wv, c, N,
                              scratch.data(), grp);
  });
}

// The unsplit CUDA layer (HostExec) on each rank's tokens, one rank after the other; the routed
// experts' gradients of every rank go into one buffer (`experts`), in rank order.
std::vector<RankResult> run_unsplit(const EpCase& ec, const Tensors& w, float daux, Tensors& experts) {
  const MoeConfig& c = ec.cfg;
  std::vector<RankResult> res;
  for (size_t r = 0; r < ec.tokens.size(); ++r) {
    HostExec ex;
    const int N = ec.tokens[r];
    RankResult o{{}, {}, Tensors(c, c.E, 0, 0.0f), {}, {}};
    const auto x = tokens_of(ec, static_cast<int>(r), 0), dout = tokens_of(ec, static_cast<int>(r), 50);
    std::vector<float> saved(moe_saved_layout(c, N).total);
    std::vector<float> scratch(moe_scratch_layout(c, N, ex.plan_tmp_bytes(N * c.K, c.E)).total);
    o.out.assign(x.size(), 0.0f), o.dinp.assign(x.size(), 0.0f);
    MoeGrads g = o.grads.grads();
    g.w_gate = experts.gate.data(), g.w_up = experts.up.data(), g.w_down = experts.down.data();
    moe_layer_forward(ex, o.out.data(), saved.data(), &o.stats, x.data(), w.weights(0, c), c, N, scratch.data());
    moe_layer_backward(ex, o.dinp.data(), g, dout.data(), daux, x.data(), saved.data(), w.weights(0, c), c, N,
                       scratch.data());
    res.push_back(std::move(o));
  }
  return res;
}

// The rank's routed-expert gradient as it should be: `want`'s block of the rank's experts, and
// zeros elsewhere where the gradients hold every expert.
std::vector<float> owned_block(const std::vector<float>& want, const EpCase& ec, int r) {
  const int P = static_cast<int>(ec.tokens.size()), per = ec.cfg.E / P;
  const size_t HC = static_cast<size_t>(ec.cfg.H) * ec.cfg.C, at = static_cast<size_t>(r) * per * HC;
  std::vector<float> v(ec.divided ? per * HC : want.size(), 0.0f);
  std::copy_n(want.begin() + static_cast<long>(at), per * HC, v.begin() + static_cast<long>(ec.divided ? 0 : at));
  return v;
}

void check_case(const EpCase& ec) {
  SCOPED_TRACE(ec.name);
  const MoeConfig& c = ec.cfg;
  const int P = static_cast<int>(ec.tokens.size());
  const float daux = 0.3f;
  const Tensors w(c, c.E, 7, 0.3f);
  Tensors experts(c, c.E, 0, 0.0f);
  const std::vector<RankResult> ep = run_ep_bodies(ec, w, daux), spec = run_cpu_spec(ec, w, daux),
                                unsplit = run_unsplit(ec, w, daux, experts);
  for (int r = 0; r < P; ++r) {
    const std::string on = std::string(" on rank ") + std::to_string(r);
    const RankResult &got = ep[static_cast<size_t>(r)], &cpu = spec[static_cast<size_t>(r)],
                     &one = unsplit[static_cast<size_t>(r)];
    ASSERT_EQ(got.error, "") << on;
    ASSERT_EQ(cpu.error, "") << on;
    const bool own_tokens = ec.tokens[static_cast<size_t>(r)] > 0 || !ec.serve;
    if (own_tokens) {
      expect_same("out" + on, got.out.data(), one.out);
      expect_same("dinp" + on, got.dinp.data(), one.dinp);
      EXPECT_EQ(got.stats.aux_loss, one.stats.aux_loss) << on;
      EXPECT_EQ(got.stats.max_expert_load, one.stats.max_expert_load) << on;
      EXPECT_EQ(got.stats.empty_experts, one.stats.empty_experts) << on;
      expect_near("out vs cpu" + on, got.out.data(), cpu.out);
      expect_near("dinp vs cpu" + on, got.dinp.data(), cpu.dinp);
      EXPECT_NEAR(got.stats.aux_loss, cpu.stats.aux_loss, 1e-5) << on;
      EXPECT_EQ(got.stats.max_expert_load, cpu.stats.max_expert_load) << on;
    }
    const Tensors& g = got.grads;
    for (auto [mine, want, spec_t, name] :
         {std::tuple{&g.router, &one.grads.router, &cpu.grads.router, "d router"},
          std::tuple{&g.sgate, &one.grads.sgate, &cpu.grads.sgate, "d shared gate"},
          std::tuple{&g.sup, &one.grads.sup, &cpu.grads.sup, "d shared up"},
          std::tuple{&g.sdown, &one.grads.sdown, &cpu.grads.sdown, "d shared down"}}) {
      expect_same(name + on, mine->data(), *want);
      expect_near(std::string(name) + " vs cpu" + on, mine->data(), *spec_t);
    }
    for (auto [mine, want, spec_t, name] :
         {std::tuple{&g.gate, &experts.gate, &cpu.grads.gate, "d experts gate"},
          std::tuple{&g.up, &experts.up, &cpu.grads.up, "d experts up"},
          std::tuple{&g.down, &experts.down, &cpu.grads.down, "d experts down"}}) {
      ASSERT_EQ(mine->size(), owned_block(*want, ec, r).size());
      expect_same(name + on, mine->data(), owned_block(*want, ec, r));
      expect_near(std::string(name) + " vs cpu" + on, mine->data(), *spec_t);
    }
  }
}

MoeConfig config(int C, int H, int E, int K, bool renormalize, int H_shared) {
  MoeConfig c;
  c.C = C, c.H = H, c.E = E, c.K = K, c.renormalize = renormalize, c.H_shared = H_shared;
  return c;
}

TEST(CudaMoeEpBodies, TwoRanksEqualTheUnsplitLayerAndTheCpuSpecification) {
  check_case({"top-2 of 4", config(8, 6, 4, 2, true, 0), {9, 6}});
  check_case({"top-1 of 4, one token on rank 1", config(8, 5, 4, 1, true, 0), {11, 1}});
  check_case({"top-2 of 8, shared expert, not renormalized", config(12, 5, 8, 2, false, 3), {13, 4}});
  check_case({"rank 1 serves only", config(8, 6, 4, 2, true, 2), {7, 0}});
  check_case({"rank 0 with N = 0 through moe_ep_forward", config(8, 6, 4, 2, true, 0), {0, 5}, false});
  check_case({"divided weights", config(8, 6, 4, 2, true, 2), {6, 9}, true, true});
}

TEST(CudaMoeEpBodies, FourRanksEqualTheUnsplitLayerAndTheCpuSpecification) {
  check_case({"top-2 of 8, uneven", config(8, 6, 8, 2, true, 0), {9, 1, 5, 12}});
  check_case({"top-3 of 8, shared expert, a serving rank", config(10, 4, 8, 3, false, 3), {6, 0, 8, 3}});
  check_case({"top-1 of 4, divided, a serving rank", config(8, 5, 4, 1, true, 0), {5, 7, 0, 4}, true, true});
  check_case({"top-2 of 4, two ranks without tokens", config(8, 6, 4, 2, true, 2), {0, 8, 0, 3}, false, true});
}

// An expert that gets no rows from some source is what the cases above are about: check that the
// one-token case really leaves such blocks (rank 1 routes its one token to a single expert).
TEST(CudaMoeEpBodies, TheCasesHaveEmptyBlocks) {
  const EpCase ec{"top-1 of 4, one token on rank 1", config(8, 5, 4, 1, true, 0), {11, 1}};
  const Tensors w(ec.cfg, ec.cfg.E, 7, 0.3f);
  std::vector<std::vector<int32_t>> recv(2);
  run_group(ec, [&](RankResult&, MoeExchange& xc, MoeEpState& st, int r) -> Status {
    HostExec ex;
    const int N = ec.tokens[static_cast<size_t>(r)];
    const auto x = tokens_of(ec, r, 0);
    std::vector<float> out(x.size()), saved(moe_saved_layout(ec.cfg, N).total);
    std::vector<float> scratch(moe_scratch_layout(ec.cfg, N, ex.plan_tmp_bytes(N, ec.cfg.E)).total);
    const Status s = moe_layer_ep_forward(ex, out.data(), saved.data(), nullptr, x.data(), w.weights(0, ec.cfg), ec.cfg,
                                          N, scratch.data(), nullptr, {&xc, &st, 0});
    recv[static_cast<size_t>(r)] = st.recv_rows;
    return s;
  });
  int empty = 0;
  for (const auto& rr : recv)
    for (int32_t n : rr) empty += n == 0 ? 1 : 0;
  EXPECT_GE(empty, 3) << "rank 1's single token reaches one expert: three (source 1, expert) blocks are empty";
}

// ---- what the layer refuses ----------------------------------------------------------------------

// One rank's forward on a group of `P` threads with the given tweaks; the first rank's error.
std::string refusal(int P, int E, const std::function<void(MoeWeights&, MoeExpertGroup&, const int32_t*&)>& tweak,
                    bool claims_device = false) {
  MoeConfig c = config(8, 4, E, 1, true, 0);
  const Tensors w(c, E, 3, 0.3f);
  ThreadGroup group(P);
  std::vector<std::string> errors(static_cast<size_t>(P));
  on_ranks(P, [&](int r) {
    HostExec ex;
    ThreadExchange xc(group, r, claims_device);
    MoeEpState st;
    MoeExpertGroup grp{&xc, &st, 0};
    MoeWeights wv = w.weights(0, c);
    const int32_t* route = nullptr;
    tweak(wv, grp, route);
    const int N = 2;
    std::vector<float> x(16, 0.5f), out(16), saved(moe_saved_layout(c, N).total);
    std::vector<float> scratch(moe_scratch_layout(c, N, ex.plan_tmp_bytes(N, E)).total);
    const Status s = moe_layer_ep_forward(ex, out.data(), saved.data(), nullptr, x.data(), wv, c, N, scratch.data(),
                                          route, grp);
    errors[static_cast<size_t>(r)] = s.ok() ? "accepted" : s.error().message;
  });
  return errors[0];
}

// An executor whose buffers are the device's (DeviceExec's side of the memory check).
struct DeviceSide : HostExec {
  static constexpr bool device_memory = true;
};

TEST(CudaMoeEpBodies, RefusesWhatItCannotRun) {
  auto none = [](MoeWeights&, MoeExpertGroup&, const int32_t*&) {};
  EXPECT_NE(refusal(3, 4, none).find("4 experts do not split over 3 ranks"), std::string::npos);
  EXPECT_NE(refusal(2, 4, [](MoeWeights&, MoeExpertGroup& g, const int32_t*&) { g.weights_first_expert = 1; })
                .find("weights starting at expert 1 on the rank that owns experts from 0"),
            std::string::npos);
  EXPECT_NE(refusal(2, 4, none, true).find("the group's exchange moves device memory"), std::string::npos);
  static const int32_t route[2] = {1, 0};
  EXPECT_NE(refusal(2, 4, [](MoeWeights&, MoeExpertGroup&, const int32_t*& r) { r = route; })
                .find("routing replay (recorded experts) is not implemented on CUDA"),
            std::string::npos);
  EXPECT_NE(refusal(2, 4, [](MoeWeights& w, MoeExpertGroup&, const int32_t*&) { w.lora.r = 2; })
                .find("adapters on the routed experts"),
            std::string::npos);
  // The device executor's side of the memory check: a host exchange (the learners' MPI one).
  ThreadGroup one(1);
  ThreadExchange host_xc(one, 0);
  MoeEpState st;
  const MoeConfig c = config(8, 4, 2, 1, true, 0);
  const Status s = moe_ep_layer_check<DeviceSide>(c, MoeWeights{}, {&host_xc, &st, 0});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("moves host memory"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("join_expert_exchange"), std::string::npos) << s.error().message;
}

TEST(CudaMoeEpBodies, BackwardWithoutItsForwardIsAnError) {
  const MoeConfig c = config(8, 4, 2, 1, true, 0);
  const Tensors w(c, c.E, 3, 0.3f);
  Tensors g(c, c.E, 0, 0.0f);
  ThreadGroup one(1);
  ThreadExchange xc(one, 0);
  MoeEpState st;
  HostExec ex;
  const Status s = moe_layer_ep_serve_backward(ex, g.grads(), w.weights(0, c), c, {&xc, &st, 0});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("no forward of this layer kept its rows"), std::string::npos) << s.error().message;
}

// A failed exchange (a peer's counts that disagree) comes back as the exchange's Status.
TEST(CudaMoeEpBodies, AFailedExchangeIsTheLayersError) {
  class Broken final : public MoeExchange {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    Status alltoall_ints(const int32_t*, int32_t*, int) override {
      return make_error(ErrorCode::peer_failed, "rank 1 is gone");
    }
    Status alltoallv(const float*, const size_t*, float*, const size_t*) override { return {}; }
  } broken;
  const MoeConfig c = config(8, 4, 2, 1, true, 0);
  const Tensors w(c, c.E, 3, 0.3f);
  MoeEpState st;
  HostExec ex;
  const Status s = moe_layer_ep_serve_forward(ex, w.weights(0, c), c, {&broken, &st, 0});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "rank 1 is gone");
}

}  // namespace
}  // namespace troupe::kernels::cuda
