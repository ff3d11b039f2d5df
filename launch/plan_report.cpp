// How a memory plan is shown and enforced: the table, the JSON, byte sizes ("4GiB") both ways,
// and the budget check troupe run / validate make. Invariant: the table, the JSON and the refusal
// read the same MemoryPlan rows, so what is refused is what the table shows.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "troupe/launch/plan.h"

namespace troupe::launch {
namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

bool row_fits(const MemoryPlan& p, const PlanRow& r) { return !p.capacity || r.device <= *p.capacity; }

std::string cell(uint64_t b) { return b == 0 ? "-" : format_bytes(b); }

// Columns: role/rank, then one per kind, the device total, the host total (device backends), fits.
std::vector<std::vector<std::string>> table_cells(const MemoryPlan& p, bool host_column) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"role (rank)", "weights", "grads", "optimizer", "activations", "kv cache",
                                   "sync",        "collect.", "other", "total (" + p.device + ")"};
  if (host_column) head.push_back("host");
  if (p.capacity) head.push_back("fits");
  rows.push_back(head);
  for (const auto& r : p.rows) {
    std::vector<std::string> c = {r.role + " " + std::to_string(r.index) + " (" + std::to_string(r.rank) + ")",
                                  cell(r.weights), cell(r.gradients), cell(r.optimizer), cell(r.activations),
                                  cell(r.kv_cache), cell(r.sync), cell(r.collectives), cell(r.other),
                                  cell(r.device)};
    if (host_column) c.push_back(cell(r.host));
    if (p.capacity) c.push_back(row_fits(p, r) ? "yes" : "NO");
    rows.push_back(std::move(c));
  }
  return rows;
}

std::string render_cells(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::ostringstream o;
  for (size_t k = 0; k < rows.size(); ++k) {
    for (size_t i = 0; i < rows[k].size(); ++i) {
      const std::string& s = rows[k][i];
      if (i == 0) o << s << std::string(w[i] - s.size(), ' ');
      else o << "  " << std::string(w[i] - s.size(), ' ') << s;
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace

std::string format_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : (v >= 10 ? "%.1f %s" : "%.2f %s"), v, units[u]);
  return buf;
}

Result<uint64_t> parse_byte_size(std::string_view text, std::string_view what) {
  auto bad = [&]() {
    return invalid_input(std::string(what) + ": \"" + std::string(text) +
                         "\" is not a memory size (e.g. 80GiB, 80GB, 512MiB, 1073741824: binary KiB/MiB/GiB/TiB, "
                         "decimal kB/MB/GB/TB, or bytes)");
  };
  const std::string s = lower(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad();
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(s.substr(0, i), &used);
    if (used != i) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  size_t j = i;
  while (j < s.size() && s[j] == ' ') ++j;
  const std::string unit = s.substr(j);
  static const std::pair<const char*, double> units[] = {
      {"", 1},         {"b", 1},           {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6},       {"gb", 1e9},        {"tb", 1e12}};
  for (const auto& [name, scale] : units) {
    if (unit != name) continue;
    const double bytes = std::floor(v * scale);
    if (!(bytes >= 1) || bytes > 1.8e19) return bad();
    return static_cast<uint64_t>(bytes);
  }
  return bad();
}

namespace {

// Rank 0 hosts learner 0 and the coordinator: what both rows need on its device together.
uint64_t rank0_bytes(const MemoryPlan& p) {
  uint64_t sum = 0;
  for (const auto& r : p.rows)
    if (r.rank == 0 && (r.role == "coordinator" || (r.role == "learner" && r.index == 0))) sum += r.device;
  return sum;
}

}  // namespace

std::optional<std::string> plan_overflow(const MemoryPlan& p) {
  if (!p.capacity) return std::nullopt;
  for (const auto& r : p.rows) {
    if (row_fits(p, r)) continue;
    return r.name() + " needs " + format_bytes(r.device) + " on " + p.device + ", " + format_bytes(r.device - *p.capacity) +
           " over " + p.capacity_from;
  }
  if (const uint64_t r0 = rank0_bytes(p); r0 > *p.capacity)
    return "rank 0 (learner 0 and the coordinator) needs " + format_bytes(r0) + " on " + p.device + ", " +
           format_bytes(r0 - *p.capacity) + " over " + p.capacity_from;
  return std::nullopt;
}

std::string plan_table(const MemoryPlan& p) {
  std::ostringstream o;
  o << "memory plan of " << p.config_file << " on " << p.device << "\n";
  o << "model: " << p.model << "; " << p.params << " parameters, " << p.trainable << " trainable ("
    << (p.trainable != p.params ? "LoRA adapters" : "the whole model") << "), weights/grads/optimizer " << p.dtype
    << ", GEMMs " << p.compute_dtype << "\n";
  o << "learners: " << p.learners << ", shard " << enum_name(p.shard) << "; a learner trains " << p.train_sequences
    << " sequences per step, micro-batches of at most " << p.train_tokens << " tokens; a generator's KV cache: "
    << p.kv_slots << " sequences x " << p.kv_context << " tokens\n\n";
  const bool host = p.device != "cpu";
  o << render_cells(table_cells(p, host));
  uint64_t one = 0;
  for (const auto& r : p.rows) one += r.device + r.host;
  if (host) o << "\ntotal = memory on the " << p.device << " device; host = the rank's host memory besides it\n";
  else o << "\none process (every role as a thread, no mpirun): " << format_bytes(one) << "\n";
  o << "rank 0 (learner 0 and the coordinator): " << format_bytes(rank0_bytes(p)) << (host ? " on the device" : "")
    << "\n";
  for (const auto& r : p.rows)
    for (const auto& n : r.notes) o << r.name() << ": " << n << "\n";
  for (const auto& n : p.notes) o << "note: " << n << "\n";
  if (p.capacity) {
    if (auto over = plan_overflow(p)) o << "does not fit: " << *over << "\n";
    else o << "fits " << p.capacity_from << "\n";
  }
  return o.str();
}

nlohmann::json plan_json(const MemoryPlan& p) {
  nlohmann::json rows = nlohmann::json::array();
  uint64_t one = 0;
  for (const auto& r : p.rows) {
    one += r.device + r.host;
    rows.push_back({{"role", r.role},
                    {"index", r.index},
                    {"rank", r.rank},
                    {"weights_bytes", r.weights},
                    {"gradients_bytes", r.gradients},
                    {"optimizer_bytes", r.optimizer},
                    {"activations_bytes", r.activations},
                    {"kv_cache_bytes", r.kv_cache},
                    {"sync_bytes", r.sync},
                    {"collectives_bytes", r.collectives},
                    {"other_bytes", r.other},
                    {"device_bytes", r.device},
                    {"host_bytes", r.host},
                    {"fits", row_fits(p, r)},
                    {"notes", r.notes}});
  }
  nlohmann::json j = {{"config", p.config_file},      {"device", p.device},
                      {"model", p.model},             {"parameters", p.params},
                      {"trainable_parameters", p.trainable}, {"dtype", p.dtype},
                      {"compute_dtype", p.compute_dtype}, {"shard", enum_name(p.shard)},
                      {"learners", p.learners},       {"train_sequences_per_learner", p.train_sequences},
                      {"micro_batch_tokens", p.train_tokens}, {"kv_slots", p.kv_slots},
                      {"kv_context", p.kv_context},   {"one_process_bytes", one},
                      {"rows", rows},                 {"notes", p.notes}};
  j["capacity_bytes"] = p.capacity ? nlohmann::json(*p.capacity) : nlohmann::json(nullptr);
  j["capacity_from"] = p.capacity_from;
  auto over = plan_overflow(p);
  j["fits"] = !over.has_value();
  j["overflow"] = over ? nlohmann::json(*over) : nlohmann::json(nullptr);
  return j;
}

int check_memory_budget(const actors::ExperimentConfig& cfg, const std::string& config_file,
                        std::optional<uint64_t> device_memory) {
  if (cfg.learner.memory_budget.empty() && !device_memory) return 0;
  PlanOptions o;
  o.device_memory = device_memory;
  auto plan = plan_memory(cfg, config_file, o);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: error: memory plan: %s\n", config_file.c_str(), plan.error().message.c_str());
    return 2;
  }
  auto over = plan_overflow(*plan);
  if (!over) return 0;
  std::fprintf(stderr, "%s", plan_table(*plan).c_str());
  std::fprintf(stderr, "%s: error: the memory plan does not fit: %s (troupe plan %s shows it; lower the batch, "
               "shard the learners, turn on activation checkpointing or LoRA, or raise the budget)\n",
               config_file.c_str(), over->c_str(), config_file.c_str());
  return 2;
}

}  // namespace troupe::launch
