// kernels.cuda_sample_rows: the one-launch sampling body (bodies/sample_rows.h: one block per row,
// radix select for top-k / top-p and the draw, no sort) on the host grid against the CPU op
// sample_token on fixed uniforms (each row's RNG state): the same token for every row, log-probs
// within 1e-5, for greedy, plain, top-k, top-p and both, temperatures, ties (logits on a grid of
// 0.25 with a tie at the top), vocabularies of 1 to 5003 and 1 to 32 lanes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bodies/host_grid.h"
#include "bodies/sample_rows.h"
#include "troupe/kernels/random.h"

namespace troupe::kernels::cuda {
namespace {

std::vector<float> logits_for(int V, uint64_t seed, bool grid) {
  std::vector<float> z(static_cast<size_t>(V));
  uint64_t s = seed;
  fill_normal(z.data(), z.size(), 2.0, &s);
  if (grid)
    for (float& x : z) x = static_cast<float>(static_cast<int>(x * 4.0f)) / 4.0f;  // many ties
  if (V > 8) z[3] = z[5] = 9.0f;  // a tie at the top
  return z;
}

// Runs the body over `rows` rows (row r: params[r % n], RNG state seeds[r]) and compares with the CPU op.
int compare(int V, int rows, bool grid, const std::vector<SampleParams>& params, int lanes) {
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    const auto z = logits_for(V, 100 + static_cast<uint64_t>(r), grid);
    logits.insert(logits.end(), z.begin(), z.end());
  }
  std::vector<RowSampling> rs(static_cast<size_t>(rows));
  std::vector<int32_t> want(rs.size());
  std::vector<float> want_lp(rs.size());
  std::vector<unsigned char> scratch(sample_scratch_bytes(V) + 16);
  for (int r = 0; r < rows; ++r) {
    const SampleParams& sp = params[static_cast<size_t>(r) % params.size()];
    const uint64_t seed = 7 + 13 * static_cast<uint64_t>(r);
    uint64_t cpu_rng = seed, body_rng = seed;
    const bool greedy = sp.temperature <= 0.0f;
    rs[static_cast<size_t>(r)] = {greedy ? 1.0 : 1.0 / sp.temperature, greedy ? 0.0 : uniform01(body_rng), sp.top_k,
                                  sp.top_p, greedy ? 1 : 0};
    want[static_cast<size_t>(r)] = sample_token(&want_lp[static_cast<size_t>(r)],
                                                logits.data() + static_cast<size_t>(r) * V, V, sp, &cpu_rng,
                                                scratch.data());
    EXPECT_EQ(cpu_rng, body_rng);  // the launcher advances each row's state as the CPU op does
  }
  std::vector<int32_t> tokens(rs.size(), -1);
  std::vector<float> lps(rs.size());
  std::vector<double> prob(static_cast<size_t>(rows) * V), part(static_cast<size_t>(rows) * kRowLanes);
  std::vector<uint32_t> keys(prob.size());
  host_for_rows(SampleRowsBody{tokens.data(), lps.data(), logits.data(), rs.data(), prob.data(), keys.data(),
                               part.data(), V},
                rows, lanes);
  int mismatches = 0;
  for (size_t r = 0; r < rs.size(); ++r) {
    const SampleParams& sp = params[r % params.size()];
    if (tokens[r] != want[r]) ++mismatches;
    EXPECT_EQ(tokens[r], want[r]) << "V " << V << " row " << r << " temperature " << sp.temperature << " top_k "
                                  << sp.top_k << " top_p " << sp.top_p << " lanes " << lanes;
    EXPECT_NEAR(lps[r], want_lp[r], 1e-5) << "row " << r;
  }
  return mismatches;
}

const std::vector<SampleParams> kParams = {{0.0f, 0, 1.0f},  {1.0f, 0, 1.0f},  {0.7f, 5, 1.0f}, {1.3f, 0, 0.8f},
                                           {1.0f, 3, 0.5f},  {1.0f, 1, 1.0f},  {1.0f, 0, 0.05f}, {0.9f, 50, 0.95f},
                                           {1.0f, 40, 1.0f}, {2.0f, 0, 0.999f}};

// (Host lanes meet at a barrier for every block reduction, ~100 per selected position, and on a
// loaded machine each meeting costs a scheduling round: most cases run on one lane, which takes
// the same code path; a few rows run on 3 and 32 lanes.)
TEST(CudaSampleRows, MatchesSampleTokenOnFixedUniforms) {
  EXPECT_EQ(compare(41, 10, false, kParams, 1), 0);
  EXPECT_EQ(compare(41, 10, true, kParams, 1), 0);
  EXPECT_EQ(compare(41, 5, true, kParams, 3), 0);  // greedy, plain, top-k, top-p, both
}

TEST(CudaSampleRows, ManyLanes) { EXPECT_EQ(compare(41, 3, true, {{1.0f, 3, 0.5f}}, 32), 0); }

TEST(CudaSampleRows, LargeAndTinyVocabularies) {
  EXPECT_EQ(compare(5003, 10, false, kParams, 1), 0);
  EXPECT_EQ(compare(5003, 10, true, kParams, 1), 0);
  EXPECT_EQ(compare(1, 10, false, kParams, 1), 0);
  EXPECT_EQ(compare(2, 10, true, kParams, 2), 0);
}

TEST(CudaSampleRows, LogitKeyKeepsTheOrder) {
  const float xs[] = {-__builtin_huge_valf(), -3.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, __builtin_huge_valf()};
  for (size_t i = 0; i + 1 < sizeof xs / sizeof xs[0]; ++i)
    if (xs[i] < xs[i + 1]) {
      EXPECT_LT(logit_key(xs[i]), logit_key(xs[i + 1])) << xs[i];
    } else {
      EXPECT_EQ(logit_key(xs[i]), logit_key(xs[i + 1])) << xs[i];  // -0 and +0
    }
}

}  // namespace
}  // namespace troupe::kernels::cuda
