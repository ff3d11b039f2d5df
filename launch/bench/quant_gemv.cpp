// `troupe bench kernels` quant_gemv_smollm2_q4_1: one token's matvecs against SmolLM2-135M-shaped
// weights in Q4_1 blocks (kernels::quant_matmul_forward, what its GGUF stores) vs fp32 weights
// (kernels::matmul_forward). Every layer has its own weights, as in the model, so the weights
// stream from memory rather than sit in cache; the row also times a whole token's projections
// (7 per layer, 30 layers, and the tied LM head: Q8_0 as the GGUF stores it vs fp32).
#include "quant_gemv.h"

#include <random>
#include <string>
#include <vector>

#include "smollm2_shape.h"
#include "troupe/kernels/ops.h"
#include "troupe/kernels/quant_matrix.h"

namespace troupe::bench {
namespace {

constexpr const char* kSuite = "kernels";

// One projection: fp32 weights and the same weights in blocks.
struct Proj {
  int out = 0, in = 0;
  std::vector<float> w;
  kernels::QuantMatrix q;
};

Proj make_proj(int out, int in, kernels::QuantFormat f, unsigned seed) {
  Proj p{out, in, std::vector<float>(static_cast<size_t>(out) * in), {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& v : p.w) v = nd(rng);
  p.q = kernels::quantize_rows(f, p.w.data(), out, in).value();
  return p;
}

// The model's projections: per layer q, k, v, o, gate, up, down; then the LM head.
struct Smollm2Weights {
  std::vector<std::vector<Proj>> layers;
  Proj head;
  std::vector<float> x, y;
  explicit Smollm2Weights(bool with_all) {
    const auto a = smollm2_135m_architecture();
    const int C = a.hidden_size, I = a.intermediate_size, KV = a.num_key_value_heads * a.head_dim;
    const auto q41 = kernels::QuantFormat::q4_1;
    unsigned seed = 1;
    for (int l = 0; l < a.num_hidden_layers; ++l) {
      std::vector<Proj> layer;
      layer.push_back(make_proj(I, C, q41, seed++));  // gate: 576 -> 1536
      layer.push_back(make_proj(C, I, q41, seed++));  // down: 1536 -> 576
      if (with_all)
        for (auto [out, in] : {std::pair{C, C}, {KV, C}, {KV, C}, {C, C}, {I, C}})  // q, k, v, o, up
          layer.push_back(make_proj(out, in, q41, seed++));
      layers.push_back(std::move(layer));
    }
    if (with_all) head = make_proj(a.vocab_size, C, kernels::QuantFormat::q8_0, seed++);
    x.assign(static_cast<size_t>(I), 0.5f);
    y.assign(static_cast<size_t>(a.vocab_size), 0.0f);
  }
  void run(const Proj& p, bool quant) {
    if (quant)
      kernels::quant_matmul_forward(y.data(), x.data(), p.q.view(), 1);
    else
      kernels::matmul_forward(y.data(), x.data(), p.w.data(), 1, p.in, p.out);
  }
  // Microseconds per layer for the gate and down matvecs, over every layer.
  double pair_us(bool quant) {
    const double s = time_s([&] {
      for (auto& layer : layers) run(layer[0], quant), run(layer[1], quant);
    });
    return s * 1e6 / static_cast<double>(layers.size());
  }
  // Milliseconds for one token's projections: every layer's seven and the LM head.
  double token_ms(bool quant) {
    return time_s([&] {
             for (auto& layer : layers)
               for (auto& p : layer) run(p, quant);
             run(head, quant);
           }) *
           1e3;
  }
};

}  // namespace

void quant_gemv_cases(const BenchOptions& opt, int reps) {
  const std::string name = "quant_gemv_smollm2_q4_1";
  if (!opt.wants(name)) return;
  Smollm2Weights m(true);
  m.pair_us(true), m.pair_us(false), m.token_ms(true), m.token_ms(false);  // warm up: page in every weight
  const Paired pair = interleaved(reps, [&] { return m.pair_us(true); }, [&] { return m.pair_us(false); });
  const Paired token = interleaved(reps, [&] { return m.token_ms(true); }, [&] { return m.token_ms(false); });
  nlohmann::json extra = {
      {"what", "one token: the 576->1536 and 1536->576 matvecs of a layer (each of 30 layers its own weights), Q4_1 "
               "blocks dequantized on the fly vs fp32"},
      {"token_projections_ms_ours", token.ours},
      {"token_projections_ms_baseline", token.baseline},
      {"token_projections", "30 layers x (q, k, v, o, gate, up, down) in Q4_1 + the LM head in Q8_0, vs fp32"},
      {"q4_1_bytes_per_value", 20.0 / 32.0}};
  emit(make_row(kSuite, name, {"us_per_layer", "us", Better::lower}, pair, "fp32", extra));
}

}  // namespace troupe::bench
