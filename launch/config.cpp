// Loading an experiment YAML against the schema: a text pre-pass (tabs), yaml-cpp parse, a
// duplicate-key pass (yaml-cpp keeps both entries silently), a typed walk, --set overrides, then
// cross-key checks. Every problem becomes a ConfigError with FILE:LINE:COL; all are reported at once.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "troupe/launch/config.h"

#include "config_checks.h"

namespace troupe::launch {

using actors::EnvSpec;
using actors::ExperimentConfig;

std::string ConfigError::format() const {
  std::ostringstream o;
  if (line > 0)
    o << file << ":" << line << ":" << column << ": error: ";
  else
    o << file << ": error: ";
  if (!key.empty()) o << key << ": ";
  o << message;
  return o.str();
}

std::pair<int, int> LoadedConfig::mark_of(const std::string& key) const {
  for (const auto& [k, m] : marks)
    if (k == key) return m;
  return {0, 0};
}

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The closest of `candidates` to `word`, if it is close enough to be a likely typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = 1 << 30;
  for (const auto& c : candidates) {
    int d = edit_distance(lower(word), lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  int allowed = std::max<int>(2, static_cast<int>(word.size()) / 3);
  return best_d <= allowed ? best : std::string();
}

// The offset of the first byte that does not begin or continue a well-formed UTF-8 sequence
// (no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t first_invalid_utf8(const std::string& t) {
  const auto* u = reinterpret_cast<const unsigned char*>(t.data());
  const size_t n = t.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = u[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned b = u[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += len;
  }
  return std::string::npos;
}

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing (null)";
    default: return "'" + n.Scalar() + "'";
  }
}

bool quoted(const YAML::Node& n) { return n.Tag() == "!"; }

class Loader {
 public:
  Loader(std::string file) : file_(std::move(file)) {}

  std::vector<ConfigError> errors;
  std::vector<std::pair<std::string, std::pair<int, int>>> marks;

  std::vector<std::string> warnings;
  std::vector<std::string> architecture_keys_set;  // policy.model.* keys the YAML or --set gave

  void error(const YAML::Mark& m, std::string key, std::string message) {
    errors.push_back({file_, m.is_null() ? 0 : m.line + 1, m.is_null() ? 0 : m.column + 1, std::move(key),
                      std::move(message)});
  }

  // A deprecated spelling: the key it now is, with a warning naming both; other keys as they are.
  std::string resolve_alias(const YAML::Mark& m, const std::string& key) {
    for (const auto& [old_key, new_key] : config_key_aliases()) {
      if (key != old_key) continue;
      std::string where = file_;
      if (!m.is_null()) where += ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
      warnings.push_back(where + ": warning: " + old_key + " is deprecated; use " + new_key +
                         " (execution options apply to fresh and loaded models alike)");
      return new_key;
    }
    if (key.rfind("policy.model.", 0) == 0) architecture_keys_set.push_back(key);
    return key;
  }

  // Tabs anywhere in indentation are errors (YAML forbids them; yaml-cpp's message is cryptic).
  bool check_tabs(const std::string& text) {
    int line = 1;
    size_t i = 0;
    bool ok = true;
    while (i <= text.size()) {
      size_t end = text.find('\n', i);
      if (end == std::string::npos) end = text.size();
      for (size_t j = i; j < end; ++j) {
        char c = text[j];
        if (c == ' ' || c == '-') continue;  // "- " list markers are part of the indentation
        if (c == '\t') {
          errors.push_back({file_, line, static_cast<int>(j - i) + 1, "",
                            "tab character in indentation; YAML indents with spaces only"});
          ok = false;
        }
        break;
      }
      ++line;
      i = end + 1;
    }
    return ok;
  }

  // yaml-cpp keeps every entry of a mapping with a repeated key and returns the first on lookup.
  // Each node once: an alias names a node already checked (nested aliases would otherwise make the
  // walk exponential); nodes are told apart by where they start in the text.
  std::set<std::size_t> checked_;
  // Duplicate keys, and text that is not UTF-8 (in a key or a value, also by an escape such as
  // "\uD800"): the resolved config is written as UTF-8 JSON/YAML, which cannot hold such bytes.
  void check_duplicates(const YAML::Node& n, const std::string& path) {
    if ((n.IsMap() || n.IsSequence()) && !n.Mark().is_null() && !checked_.insert(n.Mark().pos).second) return;
    if (n.IsScalar()) check_utf8(n, path);
    if (n.IsMap()) {
      std::map<std::string, YAML::Mark> seen;
      for (auto it = n.begin(); it != n.end(); ++it) {
        std::string k = it->first.IsScalar() ? it->first.Scalar() : "?";
        std::string full = path.empty() ? k : path + "." + k;
        if (it->first.IsScalar()) check_utf8(it->first, full);
        auto [pos, fresh] = seen.emplace(k, it->first.Mark());
        if (!fresh)
          error(it->first.Mark(), full,
                "duplicate key (first defined at line " + std::to_string(pos->second.line + 1) + ")");
        check_duplicates(it->second, full);
      }
    } else if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i) check_duplicates(n[i], path + "[" + std::to_string(i) + "]");
    }
  }

  void check_utf8(const YAML::Node& scalar, const std::string& key) {
    const std::string& t = scalar.Scalar();
    const size_t bad = first_invalid_utf8(t);
    if (bad == std::string::npos) return;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(t[bad])));
    error(scalar.Mark(), key, std::string("not valid UTF-8 text (byte ") + hex + " at offset " + std::to_string(bad) +
                                  " of the text); the config must be UTF-8");
  }

  // Parses a scalar into the field, checking type, range and allowed values.
  template <class Root>
  void assign(const KeySpec<Root>& spec, Root& root, const YAML::Node& v, const YAML::Mark& m,
              const std::string& key) {
    FieldRef f = spec.field(root);
    auto expect = [&](const std::string& what) { error(m, key, "expected " + what + ", got " + node_kind(v)); };
    switch (spec.type) {
      case KeyType::boolean: {
        if (!v.IsScalar() || quoted(v)) return expect("true or false");
        std::string s = lower(v.Scalar());
        if (s == "true" || s == "yes" || s == "on")
          *std::get<bool*>(f) = true;
        else if (s == "false" || s == "no" || s == "off")
          *std::get<bool*>(f) = false;
        else
          expect("true or false");
        return;
      }
      case KeyType::integer: {
        long long x = 0;
        if (!parse_int(v, x)) return expect("an integer");
        if (!in_range(spec, static_cast<double>(x), m, key)) return;
        *std::get<int*>(f) = static_cast<int>(x);
        return;
      }
      case KeyType::number: {
        double x = 0;
        if (!parse_number(v, x)) return expect("a number");
        if (!in_range(spec, x, m, key)) return;
        if (auto* p = std::get_if<float*>(&f))
          **p = static_cast<float>(x);
        else
          *std::get<double*>(f) = x;
        return;
      }
      case KeyType::string: {
        std::string s;
        if (v.IsNull())
          s = "";
        else if (v.IsScalar())
          s = v.Scalar();
        else
          return expect("a string");
        if (!spec.choices.empty() &&
            std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
          std::string all;
          for (const auto& c : spec.choices) all += (all.empty() ? "" : ", ") + c;
          std::string near = nearest(s, spec.choices);
          error(m, key, "'" + s + "' is not one of: " + all + (near.empty() ? "" : "; did you mean '" + near + "'?"));
          return;
        }
        if (auto* e = std::get_if<EnumRef>(&f))
          e->set(s);
        else
          *std::get<std::string*>(f) = s;
        return;
      }
      case KeyType::int_list: {
        if (!v.IsSequence() && !v.IsNull()) return expect("a list of integers");
        std::vector<int> out;
        for (size_t i = 0; v.IsSequence() && i < v.size(); ++i) {
          long long x = 0;
          std::string ik = key + "[" + std::to_string(i) + "]";
          if (!parse_int(v[i], x)) {
            error(v[i].Mark(), ik, "expected an integer, got " + node_kind(v[i]));
            return;
          }
          if (!in_range(spec, static_cast<double>(x), v[i].Mark(), ik)) return;
          out.push_back(static_cast<int>(x));
        }
        *std::get<std::vector<int>*>(f) = out;
        return;
      }
      case KeyType::string_list: {
        auto* names = std::get_if<EnumListRef>(&f);
        if (names && v.IsScalar()) {  // one enum name alone: a one-element list
          if (!list_choice(spec, v.Scalar(), m, key)) return;
          names->set({v.Scalar()});
          return;
        }
        if (!v.IsSequence() && !v.IsNull()) return expect("a list of strings");
        std::vector<std::string> out;
        for (size_t i = 0; v.IsSequence() && i < v.size(); ++i) {
          if (!v[i].IsScalar()) {
            error(v[i].Mark(), key + "[" + std::to_string(i) + "]", "expected a string, got " + node_kind(v[i]));
            return;
          }
          if (!list_choice(spec, v[i].Scalar(), v[i].Mark(), key + "[" + std::to_string(i) + "]")) return;
          out.push_back(v[i].Scalar());
        }
        if (names)
          names->set(out);
        else
          *std::get<std::vector<std::string>*>(f) = out;
        return;
      }
      case KeyType::mapping: {
        if (!v.IsMap() && !v.IsNull()) return expect("a mapping");
        *std::get<nlohmann::json*>(f) = v.IsNull() ? nlohmann::json::object() : bounded_json(v, m, key);
        return;
      }
    }
  }

  // A list element among the key's choices (when it has any), else an error naming them.
  template <class Root>
  bool list_choice(const KeySpec<Root>& spec, const std::string& s, const YAML::Mark& m, const std::string& key) {
    if (spec.choices.empty() || std::find(spec.choices.begin(), spec.choices.end(), s) != spec.choices.end())
      return true;
    std::string all;
    for (const auto& c : spec.choices) all += (all.empty() ? "" : ", ") + c;
    std::string near = nearest(s, spec.choices);
    error(m, key, "'" + s + "' is not one of: " + all + (near.empty() ? "" : "; did you mean '" + near + "'?"));
    return false;
  }

  static bool parse_int(const YAML::Node& v, long long& out) {
    if (!v.IsScalar() || quoted(v)) return false;
    const std::string& s = v.Scalar();
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    auto [p, ec] = std::from_chars(b, e, out);
    return ec == std::errc() && p == e && b != e;
  }

  static bool parse_number(const YAML::Node& v, double& out) {
    if (!v.IsScalar() || quoted(v)) return false;
    const std::string& s = v.Scalar();
    if (s.empty()) return false;
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() && std::isfinite(out);
  }

  template <class Root>
  bool in_range(const KeySpec<Root>& spec, double x, const YAML::Mark& m, const std::string& key) {
    if (spec.min && (x < *spec.min || x > *spec.max)) {
      std::ostringstream o;
      o << "value " << x << " is outside the documented range " << *spec.min << " .. " << *spec.max;
      error(m, key, o.str());
      return false;
    }
    return true;
  }

  // A YAML value as JSON. Aliases are expanded, so the size is bounded (a few lines of aliases can
  // stand for billions of values): past kMaxJsonValues values or kMaxJsonDepth levels, an error.
  static constexpr size_t kMaxJsonValues = 100000;
  static constexpr int kMaxJsonDepth = 100;
  struct TooLarge {};
  nlohmann::json bounded_json(const YAML::Node& v, const YAML::Mark& m, const std::string& key) {
    size_t values = 0;
    try {
      return to_json(v, values, 0);
    } catch (const TooLarge&) {
      error(m, key, "the value is larger than " + std::to_string(kMaxJsonValues) + " values or nested deeper than " +
                        std::to_string(kMaxJsonDepth) + " levels (aliases expanded)");
      return nullptr;
    }
  }
  static nlohmann::json to_json(const YAML::Node& n, size_t& values, int depth) {
    if (++values > kMaxJsonValues || depth > kMaxJsonDepth) throw TooLarge{};
    if (n.IsMap()) {
      nlohmann::json j = nlohmann::json::object();
      for (auto it = n.begin(); it != n.end(); ++it) j[it->first.Scalar()] = to_json(it->second, values, depth + 1);
      return j;
    }
    if (n.IsSequence()) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& e : n) j.push_back(to_json(e, values, depth + 1));
      return j;
    }
    if (n.IsNull()) return nullptr;
    if (quoted(n)) return n.Scalar();
    long long i = 0;
    double d = 0;
    if (parse_int(n, i)) return i;
    if (parse_number(n, d)) return d;
    std::string s = lower(n.Scalar());
    if (s == "true") return true;
    if (s == "false") return false;
    return n.Scalar();
  }

  // Sibling names under `prefix` (for suggestions) and whether `path` is a section.
  static std::vector<std::string> children(const std::string& prefix) {
    std::set<std::string> out;
    for (const auto& k : config_schema()) {
      if (prefix.empty() || k.path.rfind(prefix + ".", 0) == 0) {
        std::string rest = prefix.empty() ? k.path : k.path.substr(prefix.size() + 1);
        out.insert(rest.substr(0, rest.find('.')));
      }
    }
    return {out.begin(), out.end()};
  }

  void unknown_key(const YAML::Mark& m, const std::string& prefix, const std::string& name,
                   const std::vector<std::string>& siblings) {
    std::string full = prefix.empty() ? name : prefix + "." + name;
    std::string near = nearest(name, siblings);
    std::string msg = "unknown key";
    if (!near.empty()) {
      msg += "; did you mean '" + (prefix.empty() ? near : prefix + "." + near) + "'?";
    } else {
      // the right name in the wrong section, e.g. grpo.temperature
      for (const auto& k : config_schema()) {
        if (k.path.size() > name.size() && k.path.compare(k.path.size() - name.size(), name.size(), name) == 0 &&
            k.path[k.path.size() - name.size() - 1] == '.') {
          msg += "; '" + name + "' is a key of '" + k.path + "'";
          break;
        }
      }
      if (msg == "unknown key") {
        std::string all;
        for (const auto& s : siblings) all += (all.empty() ? "" : ", ") + s;
        msg += (prefix.empty() ? "; sections are: " : "; keys here are: ") + all;
      }
    }
    error(m, full, msg);
  }

  void walk_map(const YAML::Node& n, const std::string& prefix, ExperimentConfig& cfg) {
    auto sibs = children(prefix);
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node kn = it->first;  // copies: handles to the node, not to the iterator's temporary
      const YAML::Node vn = it->second;
      if (!kn.IsScalar()) {
        error(kn.Mark(), prefix, "keys must be plain names");
        continue;
      }
      std::string name = kn.Scalar();
      std::string full = resolve_alias(kn.Mark(), prefix.empty() ? name : prefix + "." + name);
      marks.push_back({full, {kn.Mark().line + 1, kn.Mark().column + 1}});
      if (full == "envs") {
        walk_envs(vn, cfg);
        continue;
      }
      const KeySpec<ExperimentConfig>* leaf = nullptr;
      for (const auto& k : config_schema())
        if (k.path == full) leaf = &k;
      if (leaf) {
        assign(*leaf, cfg, vn, vn.Mark().is_null() ? kn.Mark() : vn.Mark(), full);
        continue;
      }
      if (std::find(sibs.begin(), sibs.end(), name) != sibs.end()) {  // a section
        if (vn.IsNull()) continue;
        if (!vn.IsMap()) {
          error(vn.Mark(), full, "expected a mapping (a section), got " + node_kind(vn));
          continue;
        }
        walk_map(vn, full, cfg);
        continue;
      }
      unknown_key(kn.Mark(), prefix, name, sibs);
    }
  }

  // An entry without `type`: a `path` ending in .so is a plugin, a `url` (or `addresses` of
  // http://...) a nemo_gym server, a `command`, `address` or `addresses` a remote env
  // (envs/PROTOCOL.md); anything else stays builtin.
  static void infer_env_type(EnvSpec& spec) {
    const auto& p = spec.path;
    if (p.size() > 3 && p.compare(p.size() - 3, 3, ".so") == 0) spec.type = actors::EnvType::plugin;
    else if (!spec.url.empty()) spec.type = actors::EnvType::nemo_gym;
    else if (!spec.addresses.empty() && spec.addresses[0].rfind("http://", 0) == 0) spec.type = actors::EnvType::nemo_gym;
    else if (!spec.command.empty() || !spec.address.empty() || !spec.addresses.empty()) spec.type = actors::EnvType::remote;
  }

  void walk_envs(const YAML::Node& n, ExperimentConfig& cfg) {
    if (n.IsNull()) return;
    if (!n.IsSequence()) {
      error(n.Mark(), "envs", "expected a list of env entries (- name: ...), got " + node_kind(n));
      return;
    }
    cfg.envs.clear();
    std::vector<std::string> names;
    for (const auto& k : env_entry_schema()) names.push_back(k.path);
    for (size_t i = 0; i < n.size(); ++i) {
      YAML::Node e = n[i];
      std::string pre = "envs[" + std::to_string(i) + "]";
      EnvSpec spec;
      if (!e.IsMap()) {
        error(e.Mark(), pre, "expected a mapping with name, type, ..., got " + node_kind(e));
        continue;
      }
      marks.push_back({pre, {e.Mark().line + 1, e.Mark().column + 1}});
      for (auto it = e.begin(); it != e.end(); ++it) {
        std::string name = it->first.Scalar();
        std::string full = pre + "." + name;
        marks.push_back({full, {it->first.Mark().line + 1, it->first.Mark().column + 1}});
        const KeySpec<EnvSpec>* leaf = nullptr;
        for (const auto& k : env_entry_schema())
          if (k.path == name) leaf = &k;
        if (!leaf) {
          std::string near = nearest(name, names);
          std::string all;
          for (const auto& s : names) all += (all.empty() ? "" : ", ") + s;
          error(it->first.Mark(), full,
                "unknown key" + (near.empty() ? "; env entries take: " + all : "; did you mean '" + pre + "." + near + "'?"));
          continue;
        }
        assign(*leaf, spec, it->second, it->second.Mark().is_null() ? it->first.Mark() : it->second.Mark(), full);
        if (name == "addresses" && (it->second.IsNull() || (it->second.IsSequence() && it->second.size() == 0)))
          error(it->second.Mark().is_null() ? it->first.Mark() : it->second.Mark(), full,
                "an empty pool: list the running env servers (e.g. [tcp://10.0.0.1:5555, tcp://10.0.0.2:5555])");
      }
      if (!e["type"]) infer_env_type(spec);
      cfg.envs.push_back(std::move(spec));
    }
  }

  // --set PATH=VALUE, typed by the schema. PATH may index envs: envs[0].weight or envs.0.weight.
  void apply_override(const std::string& text, ExperimentConfig& cfg) {
    std::string file_before = file_;
    file_ = "--set " + text;
    apply_override_inner(text, cfg);
    file_ = file_before;
  }

  void apply_override_inner(const std::string& text, ExperimentConfig& cfg) {
    YAML::Mark none = YAML::Mark::null_mark();
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      error(none, "", "expected --set key.path=value");
      return;
    }
    std::string path = resolve_alias(none, text.substr(0, eq));
    std::string value = text.substr(eq + 1);
    YAML::Node v;
    try {
      v = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      error(none, path, "cannot parse the value '" + value + "': " + e.msg);
      return;
    }
    if (value.empty()) v = YAML::Node(YAML::NodeType::Null);
    checked_.clear();  // the file's nodes are checked; marks here count in this value's text
    const size_t before = errors.size();
    check_duplicates(v, path);
    if (errors.size() != before) return;
    // normalize envs.N.key -> envs[N].key
    if (path.rfind("envs.", 0) == 0) {
      auto dot = path.find('.', 5);
      path = "envs[" + path.substr(5, dot == std::string::npos ? std::string::npos : dot - 5) + "]" +
             (dot == std::string::npos ? "" : path.substr(dot));
    }
    if (path.rfind("envs[", 0) == 0) {
      auto close = path.find(']');
      long long idx = -1;
      std::string digits = close == std::string::npos ? "" : path.substr(5, close - 5);
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), idx);
      if (ec != std::errc() || p != digits.data() + digits.size() || idx < 0 || close + 1 >= path.size() ||
          path[close + 1] != '.') {
        error(none, path, "expected envs[N].key (N an index)");
        return;
      }
      if (static_cast<size_t>(idx) > cfg.envs.size()) {
        error(none, path, "there are only " + std::to_string(cfg.envs.size()) + " envs (index " +
                              std::to_string(idx) + " would leave a gap)");
        return;
      }
      if (static_cast<size_t>(idx) == cfg.envs.size()) cfg.envs.emplace_back();
      EnvSpec& spec = cfg.envs[idx];
      std::string rest = path.substr(close + 2);
      std::string head = rest.substr(0, rest.find('.'));
      if (head == "config" && rest.size() > 6) {  // envs[0].config.difficulty=3
        nlohmann::json* j = &spec.config;
        std::stringstream ss(rest.substr(7));
        for (std::string part; std::getline(ss, part, '.');) {
          if (!j->is_object() && !j->is_null()) {
            error(none, path, "'" + part + "' cannot be set inside a " + std::string(j->type_name()) + " value");
            return;
          }
          j = &(*j)[part];
        }
        *j = v.IsNull() ? nlohmann::json(nullptr) : bounded_json(v, none, path);
        return;
      }
      for (const auto& k : env_entry_schema()) {
        if (k.path == rest) {
          assign(k, spec, v, none, path);
          return;
        }
      }
      std::vector<std::string> names;
      for (const auto& k : env_entry_schema()) names.push_back(k.path);
      std::string near = nearest(rest, names);
      error(none, path, "unknown key" + (near.empty() ? "" : "; did you mean 'envs[" + std::to_string(idx) + "]." + near + "'?"));
      return;
    }
    for (const auto& k : config_schema()) {
      if (k.path == path && path != "envs") {
        assign(k, cfg, v, none, path);
        return;
      }
    }
    std::vector<std::string> all;
    for (const auto& k : config_schema()) all.push_back(k.path);
    std::string near = nearest(path, all);
    error(none, path, "unknown key" + (near.empty() ? "" : "; did you mean '" + near + "'?"));
  }

  // Checks that need several keys (config_checks.cpp), each error at its key's line and column.
  void check_consistency(const ExperimentConfig& c) {
    auto at = [&](const std::string& key) {
      for (auto it = marks.rbegin(); it != marks.rend(); ++it)
        if (it->first == key) {
          YAML::Mark m;
          m.line = it->second.first - 1;
          m.column = it->second.second - 1;
          return m;
        }
      return YAML::Mark::null_mark();
    };
    check_config(c, architecture_keys_set, [&](const std::string& mark_key, const std::string& key,
                                               const std::string& message) { error(at(mark_key), key, message); });
  }

 private:
  std::string file_;
};

// A leading "~/" (or a lone "~") stands for $HOME, as in a shell.
std::string expand_home(const std::string& path) {
  if (path != "~" && path.rfind("~/", 0) != 0) return path;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return path;
  return std::string(home) + path.substr(1);
}

Result<LoadedConfig> finish(Loader& l, LoadedConfig out) {
  if (!l.errors.empty()) {
    std::string msg;
    for (const auto& e : l.errors) {
      if (!msg.empty()) msg += '\n';
      msg += e.format();
    }
    return invalid_input(msg);
  }
  out.marks = std::move(l.marks);
  out.warnings = std::move(l.warnings);
  return out;
}

}  // namespace

Result<LoadedConfig> load_config_text(const std::string& text, const std::string& file,
                                      const std::vector<std::string>& overrides) {
  Loader l(file);
  LoadedConfig out;
  out.file = file;
  if (!l.check_tabs(text)) return finish(l, out);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    l.error(e.mark, "", "YAML syntax: " + e.msg);
    return finish(l, out);
  }
  l.check_duplicates(root, "");
  if (!l.errors.empty()) return finish(l, out);
  if (root.IsMap())
    l.walk_map(root, "", out.config);
  else if (!root.IsNull())
    l.error(root.Mark(), "", "the top level must be a mapping of sections (run:, policy:, grpo:, ...)");
  for (const auto& o : overrides) l.apply_override(o, out.config);
  out.config.policy.path = expand_home(out.config.policy.path);
  out.config.distill.teacher = expand_home(out.config.distill.teacher);
  out.config.run.dir = expand_home(out.config.run.dir);
  // a reward model's directory is named relative to the YAML file; the env workers and the scorers
  // load it by the same (absolute) name
  for (auto& e : out.config.envs)
    if (e.type == actors::EnvType::reward_model && !e.path.empty()) {
      const std::filesystem::path p = expand_home(e.path);
      if (p.is_relative())
        e.path = (std::filesystem::absolute(std::filesystem::path(file).parent_path()) / p).lexically_normal().string();
    }
  if (l.errors.empty()) l.check_consistency(out.config);
  return finish(l, out);
}

Result<LoadedConfig> load_config(const std::string& file, const std::vector<std::string>& overrides) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid_input(file + ": error: cannot read the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_config_text(ss.str(), file, overrides);
}

}  // namespace troupe::launch
