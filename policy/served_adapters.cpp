// Adapters served beside the base weights (Model::add_served_adapter): several LoRA adapters over one
// model, chosen per row of a DecodeSlots pass. Invariant: the base GEMM runs once over all rows, and
// a row of adapter a gets exactly the low-rank delta the model's own LoRA path (lora.cpp) would add
// with a's weights, computed by the same backend op over the run of rows that share a.
#include <algorithm>
#include <string>

#include "model_impl.h"

namespace troupe::policy {

const LoraSlot* Model::Impl::ServedAdapter::find(size_t w) const {
  auto it = std::lower_bound(slots.begin(), slots.end(), w, [](const auto& e, size_t x) { return e.first < x; });
  return it != slots.end() && it->first == w ? &it->second : nullptr;
}

void Model::Impl::served_lora_forward(float* out, const float* in, size_t w, const Acts& acts, int T, int IN,
                                      int OUT) const {
  for (int r0 = 0, r1 = 0; r0 < T; r0 = r1) {
    const int id = row_adapter[r0];
    r1 = r0 + 1;
    while (r1 < T && row_adapter[r1] == id) ++r1;
    if (id <= 0 || id > static_cast<int>(served.size())) continue;
    const ServedAdapter& a = served[static_cast<size_t>(id - 1)];
    const LoraSlot* s = a.find(w);
    if (s == nullptr) continue;
    const float* P = a.params.floats();
    be->lora_forward(out + static_cast<size_t>(r0) * OUT, in + static_cast<size_t>(r0) * IN, P + s->a, P + s->b,
                     acts.lora_scratch, r1 - r0, IN, OUT, a.r, a.scale);
  }
}

namespace {

// The base offsets of every weight the layers run through linear_forward, by tensor name.
std::vector<std::pair<std::string, size_t>> linear_weights(const Model::Impl& m) {
  std::vector<size_t> offs;
  for (const LayerW& w : m.layers) {
    offs.insert(offs.end(), {w.wq, w.wk, w.wv, w.wo});
    if (!w.moe) offs.insert(offs.end(), {w.wg, w.wu, w.wd});
    else if (m.HS_gated > 0) offs.insert(offs.end(), {w.sg, w.su, w.sd});
  }
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& t : m.table)
    if (t.shape.size() == 2 && std::find(offs.begin(), offs.end(), t.offset) != offs.end() && t.offset != m.wte &&
        t.offset != m.wlm)
      out.emplace_back(t.name, t.offset);
  return out;
}

}  // namespace

Result<int> Model::add_served_adapter(const ServedAdapterWeights& adapter) {
  Impl& m = *impl_;
  if (adapter.rank < 1) return invalid_input("served adapter: rank must be >= 1, got " + std::to_string(adapter.rank));
  if (adapter.pairs.empty()) return invalid_input("served adapter: adapts no weight");
  const auto linear = linear_weights(m);
  Impl::ServedAdapter a;
  a.r = adapter.rank;
  a.scale = adapter.scale;
  std::vector<float> host;
  const size_t r = static_cast<size_t>(adapter.rank);
  for (const auto& p : adapter.pairs) {
    auto it = std::find_if(linear.begin(), linear.end(), [&](const auto& e) { return e.first == p.weight; });
    if (it == linear.end())
      return invalid_input("served adapter: " + p.weight +
                           " is not a linear layer LoRA can adapt (attention q k v o, the dense MLP's or the gated "
                           "shared expert's gate up down)");
    const TensorSpec* t = find_base_tensor(p.weight);
    const size_t out = static_cast<size_t>(t->shape[0]), in = static_cast<size_t>(t->shape[1]);
    if (r > std::min(in, out))
      return invalid_input("served adapter: rank " + std::to_string(r) + " exceeds min(in, out) = " +
                           std::to_string(std::min(in, out)) + " of " + p.weight);
    if (p.a.size() != r * in || p.b.size() != out * r)
      return invalid_input("served adapter: " + p.weight + " needs A (" + std::to_string(r) + ", " + std::to_string(in) +
                           ") and B (" + std::to_string(out) + ", " + std::to_string(r) + ")");
    if (a.find(it->second) != nullptr) return invalid_input("served adapter: " + p.weight + " is adapted twice");
    LoraSlot s;
    s.on = true;
    s.a = host.size();
    host.insert(host.end(), p.a.begin(), p.a.end());
    s.b = host.size();
    host.insert(host.end(), p.b.begin(), p.b.end());
    a.slots.emplace_back(it->second, s);
    std::sort(a.slots.begin(), a.slots.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  TROUPE_ASSIGN_OR_RETURN(a.params, m.be->alloc(host.size() * sizeof(float)));
  m.be->copy_host_to_device(a.params.data(), host.data(), host.size() * sizeof(float));
  m.served_max_r = std::max(m.served_max_r, a.r);
  m.served.push_back(std::move(a));
  return static_cast<int>(m.served.size());
}

int Model::served_adapters() const { return static_cast<int>(impl_->served.size()); }

}  // namespace troupe::policy
