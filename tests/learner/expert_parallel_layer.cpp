// policy.expert_parallel_layer (mpirun -np 2): the MoE layer with its experts split over the ranks
// (kernels::moe_ep_forward/backward over the learners' MPI all-to-all) equals the unsplit layer
// (kernels::moe_forward/backward) on each rank's own tokens, bit for bit: outputs, input gradients,
// router and shared-expert gradients; an owned expert's weight gradient equals the sum over the
// ranks of their unsplit gradients, a block this rank does not own gets none. Cases: top-1 and
// top-2, a shared expert, ranks with different token counts, a rank with no tokens at all.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/learner/expert_parallel.h"

using namespace troupe;
namespace k = troupe::kernels;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

struct Params {  // one flat buffer per tensor, in MoeWeights' layout
  std::vector<float> router, gate, up, down, sgate, sup, sdown;
  Params(const k::MoeConfig& c, uint64_t seed, float scale) {
    const size_t E = c.E, H = c.H, C = c.C, S = c.H_shared;
    router = randn(E * C, seed + 1, scale), gate = randn(E * H * C, seed + 2, scale);
    up = randn(E * H * C, seed + 3, scale), down = randn(E * C * H, seed + 4, scale);
    sgate = randn(S * C, seed + 5, scale), sup = randn(S * C, seed + 6, scale), sdown = randn(C * S, seed + 7, scale);
  }
  std::vector<std::vector<float>*> all() { return {&router, &gate, &up, &down, &sgate, &sup, &sdown}; }
  k::MoeWeights weights() const {
    k::MoeWeights w;
    w.w_router = router.data(), w.w_gate = gate.data(), w.w_up = up.data(), w.w_down = down.data();
    if (!sgate.empty()) w.ws_gate = sgate.data(), w.ws_up = sup.data(), w.ws_down = sdown.data();
    return w;
  }
  k::MoeGrads grads() {
    k::MoeGrads g;
    g.w_router = router.data(), g.w_gate = gate.data(), g.w_up = up.data(), g.w_down = down.data();
    if (!sgate.empty()) g.ws_gate = sgate.data(), g.ws_up = sup.data(), g.ws_down = sdown.data();
    return g;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One case; returns the number of mismatches on this rank (named on stderr).
int run_case(learner::Communicator& world, kernels::MoeExchange& ex, const char* name, k::MoeConfig c, int n0, int n1) {
  const int rank = world.rank(), N = rank == 0 ? n0 : n1;
  const Params w(c, 7, 0.3f);
  const auto x = randn(static_cast<size_t>(N) * c.C, 100 + rank, 1.0f);
  const auto dout = randn(static_cast<size_t>(N) * c.C, 200 + rank, 1.0f);
  const float daux = 0.01f;
  struct Out {
    std::vector<float> y, dx;
    Params g;
  };
  auto run = [&](bool split) {
    Out o{std::vector<float>(static_cast<size_t>(N) * c.C), std::vector<float>(static_cast<size_t>(N) * c.C),
          Params(c, 0, 0.0f)};
    std::vector<float> saved(k::moe_saved_floats(c, N)), scratch(k::moe_scratch_floats(c, N));
    k::MoeEpState state;
    const k::MoeExpertGroup grp{&ex, &state};
    k::MoeStats stats;
    if (split) {
      Status st = k::moe_ep_forward(o.y.data(), saved.data(), &stats, x.data(), w.weights(), c, N, scratch.data(),
                                    nullptr, grp);
      if (st.ok())
        st = k::moe_ep_backward(o.dx.data(), o.g.grads(), dout.data(), daux, x.data(), saved.data(), w.weights(), c,
                                N, scratch.data(), grp);
      if (!st.ok()) std::fprintf(stderr, "rank %d %s: %s\n", rank, name, st.error().message.c_str());
    } else {
      k::moe_forward(o.y.data(), saved.data(), &stats, x.data(), w.weights(), c, N, scratch.data());
      k::moe_backward(o.dx.data(), o.g.grads(), dout.data(), daux, x.data(), saved.data(), w.weights(), c, N,
                      scratch.data());
    }
    return o;
  };
  Out ref = run(false), ep = run(true);
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) std::fprintf(stderr, "rank %d %s: %s differs from the unsplit layer\n", rank, name, what.c_str());
    bad += ok ? 0 : 1;
  };
  expect(same_bits(ref.y, ep.y), "the output");
  expect(same_bits(ref.dx, ep.dx), "d input");
  expect(same_bits(ref.g.router, ep.g.router), "d router");
  expect(same_bits(ref.g.sgate, ep.g.sgate) && same_bits(ref.g.sup, ep.g.sup) && same_bits(ref.g.sdown, ep.g.sdown),
         "the shared expert's gradient");
  // The experts: the ranks' unsplit gradients summed (2 ranks: one addition, exact in either order)
  // on the owner's block, nothing elsewhere.
  const int P = ex.size(), per = c.E / P;
  const size_t HC = static_cast<size_t>(c.H) * c.C;
  for (auto [r, e, name_t] : {std::tuple{&ref.g.gate, &ep.g.gate, "gate"}, std::tuple{&ref.g.up, &ep.g.up, "up"},
                              std::tuple{&ref.g.down, &ep.g.down, "down"}}) {
    if (!world.allreduce_sum(std::span<float>(*r)).ok()) ++bad;
    std::vector<float> want(r->size(), 0.0f);
    std::copy_n(r->data() + ex.rank() * per * HC, per * HC, want.data() + ex.rank() * per * HC);
    expect(same_bits(want, *e), std::string("d experts ") + name_t);
  }
  if (rank == 0) std::printf("%s: %d + %d tokens, %d experts over %d ranks -> %s\n", name, n0, n1, c.E, P, bad ? "MISMATCH" : "ok");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto comm = learner::make_mpi_communicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "%s\n", comm.error().message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    auto ep = learner::ExpertParallel::join(**comm, (*comm)->size(), k::cpu_backend());
    if (!ep.ok()) {
      std::fprintf(stderr, "%s\n", ep.error().message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    k::MoeConfig c;
    c.C = 16, c.H = 8, c.E = 4, c.K = 2;
    bad += run_case(**comm, (*ep)->exchange(), "top-2", c, 9, 6);
    c.K = 1;
    bad += run_case(**comm, (*ep)->exchange(), "top-1", c, 5, 11);
    c.K = 2, c.E = 8, c.H_shared = 12, c.renormalize = false;
    bad += run_case(**comm, (*ep)->exchange(), "top-2 of 8, shared expert", c, 13, 4);
    bad += run_case(**comm, (*ep)->exchange(), "a rank with no tokens", c, 7, 0);
    // E not a multiple of the group: refused, naming both numbers.
    c.E = 3, c.K = 1, c.H_shared = 0;
    k::MoeEpState state;
    std::vector<float> saved(k::moe_saved_floats(c, 1)), scratch(k::moe_scratch_floats(c, 1)), y(16), xin(16, 0.5f);
    const Params w(c, 1, 0.1f);
    Status st = k::moe_ep_forward(y.data(), saved.data(), nullptr, xin.data(), w.weights(), c, 1, scratch.data(),
                                  nullptr, {&(*ep)->exchange(), &state});
    if (st.ok() || st.error().message.find("3 experts do not split over 2 ranks") == std::string::npos) {
      std::fprintf(stderr, "3 experts over 2 ranks: %s\n", st.ok() ? "accepted" : st.error().message.c_str());
      ++bad;
    }
    int any = bad;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bad = any;
  }
  MPI_Finalize();
  return bad;
}
