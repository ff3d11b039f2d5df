// Experiment YAML: the schema (every key with its type, default, range, allowed values and
// description — the single source of truth for loading, --set, config.resolved.yaml and
// configs/README.md) and the loader. Every problem is reported as FILE:LINE:COL: error: key: ...
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/result.h"

namespace troupe::launch {

enum class KeyType { boolean, integer, number, string, int_list, string_list, mapping };

// An enum field (loss.kl_type, ...), seen through its YAML names: the key's choices.
struct EnumRef {
  std::string name;                             // the current value's name
  std::function<void(const std::string&)> set;  // assigns the value of a name among the choices
};

// A list of enum values (policy.lora.targets), seen through their YAML names.
struct EnumListRef {
  std::vector<std::string> names;                             // the current values' names
  std::function<void(const std::vector<std::string>&)> set;   // assigns the values of names among the choices
};

// Where a key's value lives in the typed struct.
using FieldRef = std::variant<bool*, int*, float*, double*, std::string*, std::vector<int>*,
                              std::vector<std::string>*, nlohmann::json*, EnumRef, EnumListRef>;

template <class Root>
struct KeySpec {
  std::string path;  // "rollout.temperature"; for env entries relative to the entry ("weight")
  KeyType type = KeyType::string;
  std::optional<double> min, max;    // inclusive; every numeric key has both
  std::vector<std::string> choices;  // allowed values of a string or enum key (empty = any)
  std::string description;
  std::function<FieldRef(Root&)> field;
};

// The top-level keys and the keys of one `envs` entry.
const std::vector<KeySpec<actors::ExperimentConfig>>& config_schema();
const std::vector<KeySpec<actors::EnvSpec>>& env_entry_schema();
// Deprecated spellings still accepted (old key, the key it now is); each use is a warning.
const std::vector<std::pair<std::string, std::string>>& config_key_aliases();

// A value of a key rendered as YAML (defaults in the README, config.resolved.yaml).
std::string render_value(const FieldRef& f);
std::string type_name(KeyType t);

// One diagnostic: where (file, 1-based line and column) and what.
struct ConfigError {
  std::string file;
  int line = 0, column = 0;
  std::string key;  // key path, e.g. "rollout.temperature" or "envs[1].weight"
  std::string message;
  std::string format() const;  // "FILE:LINE:COL: error: key: message"
};

struct LoadedConfig {
  actors::ExperimentConfig config;
  std::string file;
  // Marks of every key seen, so later checks (e.g. placement under MPI) can point at the line.
  std::vector<std::pair<std::string, std::pair<int, int>>> marks;
  // FILE:LINE:COL: warning: ... lines (deprecated spellings); the commands print them to stderr.
  std::vector<std::string> warnings;
  std::pair<int, int> mark_of(const std::string& key) const;
};

// Loads and validates FILE with `--set path=value` overrides applied after the file. On failure
// the Error (invalid_input) carries every diagnostic, one per line.
Result<LoadedConfig> load_config(const std::string& file, const std::vector<std::string>& overrides = {});
// Same, from text (tests); `file` only names it in messages.
Result<LoadedConfig> load_config_text(const std::string& text, const std::string& file,
                                      const std::vector<std::string>& overrides = {});

// The whole config as YAML with every key (the resolved config written to the run directory;
// it loads back to the same config).
std::string resolved_yaml(const actors::ExperimentConfig& cfg);

// A --resume continues the experiment its run directory holds: every key that changes what is
// trained must equal the run's config.resolved.yaml. One difference, values rendered as YAML.
struct ResumeConflict {
  std::string key, before, now;
};
std::vector<ResumeConflict> resume_conflicts(const actors::ExperimentConfig& before, const actors::ExperimentConfig& now);
// The keys a --resume may change, for messages and docs.
std::string resume_may_change_summary();

// configs/README.md generated from the schema.
std::string render_config_readme();

// Levenshtein distance, for near-miss suggestions.
int edit_distance(const std::string& a, const std::string& b);

}  // namespace troupe::launch
