// The random-op kernel family: normal initialization from the splitmix64 stream, one-token
// sampling (max / argmax / sum block, CUB's stable descending sort when top-k/top-p truncate, the
// finishing thread; bodies/sampling.h), and the rows of a decode step in one launch, one block per
// row, top-k/top-p by radix select without a sort (bodies/sample_rows.h).
#include <cub/device/device_radix_sort.cuh>

#include <vector>

#include "bodies/sample_rows.h"
#include "bodies/sampling.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {
namespace {

struct SampleTmp {
  size_t prob, keys_out, order, sorted, stats, arg, tok, lp, cub, total;
};
SampleTmp sample_tmp(int V) {
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t sort = 0;
  TROUPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, sort, static_cast<const double*>(nullptr),
                                                              static_cast<double*>(nullptr),
                                                              static_cast<const int32_t*>(nullptr),
                                                              static_cast<int32_t*>(nullptr), V));
  SampleTmp t{};
  size_t at = 0;
  auto put = [&](size_t& f, size_t bytes) { f = at, at += round(bytes); };
  const size_t v = static_cast<size_t>(V);
  put(t.prob, sizeof(double) * v), put(t.keys_out, sizeof(double) * v), put(t.order, sizeof(int32_t) * v);
  put(t.sorted, sizeof(int32_t) * v), put(t.stats, 2 * sizeof(double)), put(t.arg, sizeof(int32_t));
  put(t.tok, sizeof(int32_t)), put(t.lp, sizeof(float)), put(t.cub, sort);
  t.total = at;
  return t;
}

}  // namespace

void launch_fill_normal(const Queue& q, float* x, size_t n, double stddev, uint64_t* host_rng) {
  const size_t pairs = (n + 1) / 2;
  launch_elements(FillNormalBody{x, n, stddev, *host_rng}, pairs, q.stream);
  *host_rng += 2 * pairs * kSplitmixGamma;  // the state after the CPU op's 2 * pairs draws
}

size_t sample_device_scratch_bytes(int V) { return V > 0 ? sample_tmp(V).total : 0; }

namespace {

// One row's kernels: the stats pass, the sort when top-k/top-p truncate, the finishing thread
// (which writes *tok and *lp on the device).
void queue_sample_row(const Queue& q, int32_t* tok, float* lp, const float* logits, int V, const SampleParams& sp,
                      uint64_t* host_rng, char* base, const SampleTmp& t) {
  auto at = [base](size_t off) { return static_cast<void*>(base + off); };
  double* prob = static_cast<double*>(at(t.prob));
  double* keys_out = static_cast<double*>(at(t.keys_out));
  int32_t* order = static_cast<int32_t*>(at(t.order));
  int32_t* sorted = static_cast<int32_t*>(at(t.sorted));
  double* stats = static_cast<double*>(at(t.stats));
  int32_t* arg = static_cast<int32_t*>(at(t.arg));
  const bool greedy = sp.temperature <= 0.0f;
  const double inv_t = greedy ? 1.0 : 1.0 / sp.temperature;
  launch_rows(SampleStatsBody{stats, arg, prob, order, logits, inv_t, V}, 1, q.stream);
  const bool truncate = (sp.top_k > 0 && sp.top_k < V) || sp.top_p < 1.0f;
  if (!greedy && truncate) {
    size_t cub_size = t.total - t.cub;
    TROUPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(at(t.cub), cub_size, prob, keys_out, order, sorted, V,
                                                                0, static_cast<int>(sizeof(double) * 8), q.stream));
  }
  const double u01 = greedy ? 0.0 : uniform01(*host_rng);
  launch_elements(SampleFinishBody{tok, lp, stats, arg, prob, (!greedy && truncate) ? sorted : nullptr, logits, inv_t,
                                   u01, V, sp.top_k, sp.top_p, greedy},
                  1, q.stream);
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

int32_t launch_sample_token(const Queue& q, float* host_logprob, const float* logits, int V, const SampleParams& sp,
                            uint64_t* host_rng, void* scratch) {
  const SampleTmp t = sample_tmp(V);
  char* base = static_cast<char*>(scratch);
  int32_t* tok = reinterpret_cast<int32_t*>(base + t.tok);
  float* lp = reinterpret_cast<float*>(base + t.lp);
  queue_sample_row(q, tok, lp, logits, V, sp, host_rng, base, t);
  int32_t token = 0;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(&token, tok, sizeof(token), cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host_logprob, lp, sizeof(float), cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  return token;
}

// Layout: the rows' tokens, their log-probs, their RowSampling, then (rows, V) probabilities and
// keys and (rows, kRowLanes) lane partials (bodies/sample_rows.h).
namespace {
struct RowsTmp {
  size_t toks, lps, params, prob, keys, part, total;
};
RowsTmp rows_tmp(int rows, int V) {
  const size_t r = static_cast<size_t>(rows), v = static_cast<size_t>(V);
  RowsTmp t{};
  size_t at = 0;
  auto put = [&](size_t& f, size_t bytes) { f = at, at += round256(bytes); };
  put(t.toks, sizeof(int32_t) * r), put(t.lps, sizeof(float) * r), put(t.params, sizeof(RowSampling) * r);
  put(t.prob, sizeof(double) * r * v), put(t.keys, sizeof(uint32_t) * r * v);
  put(t.part, sizeof(double) * r * kRowLanes);
  t.total = at;
  return t;
}
}  // namespace

size_t sample_rows_device_scratch_bytes(int rows, int V) {
  if (rows <= 0 || V <= 0) return 0;
  return rows_tmp(rows, V).total;
}

// Every row in one launch: the rows' settings and uniforms (drawn here from each row's stream, as
// the CPU op draws them) go up in one copy, one block per row samples, one copy each brings the
// tokens and log-probs back.
void launch_sample_tokens(const Queue& q, int32_t* host_tokens, float* host_logprobs, const float* logits, int rows,
                          int V, const SampleParams* sp, uint64_t* host_rng, void* scratch) {
  if (rows <= 0) return;
  const RowsTmp t = rows_tmp(rows, V);
  char* base = static_cast<char*>(scratch);
  std::vector<RowSampling> rs(static_cast<size_t>(rows));
  for (size_t i = 0; i < rs.size(); ++i) {
    const bool greedy = sp[i].temperature <= 0.0f;
    rs[i] = {greedy ? 1.0 : 1.0 / sp[i].temperature, greedy ? 0.0 : uniform01(host_rng[i]), sp[i].top_k,
             sp[i].top_p, greedy ? 1 : 0};
  }
  auto* dev_rs = reinterpret_cast<RowSampling*>(base + t.params);
  // (from pageable memory: the copy has taken rs by the time it returns)
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dev_rs, rs.data(), sizeof(RowSampling) * rs.size(), cudaMemcpyHostToDevice,
                                    q.stream));
  auto* toks = reinterpret_cast<int32_t*>(base + t.toks);
  auto* lps = reinterpret_cast<float*>(base + t.lps);
  launch_rows(SampleRowsBody{toks, lps, logits, dev_rs, reinterpret_cast<double*>(base + t.prob),
                             reinterpret_cast<uint32_t*>(base + t.keys), reinterpret_cast<double*>(base + t.part), V},
              rows, q.stream);
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host_tokens, toks, sizeof(int32_t) * rs.size(), cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host_logprobs, lps, sizeof(float) * rs.size(), cudaMemcpyDeviceToHost, q.stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(q.stream));
}

}  // namespace troupe::kernels::cuda
